//! Every time and size bound of a node, in one value that the flags, the shells and the simulator
//! all read (seeds/peer.md §3.3, spec/fetch.md §5, spec/node.md §5). The exchange bounds are core
//! timers; the inbound transport limits act in the shell's server before the machine sees a
//! request; the pool settings shape the shell's connection reuse.

use std::time::Duration;
use thiserror::Error;

/// Longest any configured bound may be: beyond a day a bound is a mistake, and the cap keeps every
/// deadline representable in nanoseconds.
pub const BOUND_MAX: Duration = Duration::from_secs(86_400);

/// The bounds of one node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// A peer whose machine is gone sends no RST: give up connecting after this long.
    pub peer_dial: Duration,
    /// A peer that accepted but never answers: give up on its response head after this long
    /// (counted from the request). The longest head wait; with an estimate of recent peer fetch
    /// times the wait is four times their p99, but at least [`Self::peer_head_floor`]; without
    /// one, one and a half times the floor (within this cap). A relay waits on its own upstream a little
    /// less than its requester waits on it.
    pub peer_head: Duration,
    /// The shortest response-head wait on a peer.
    pub peer_head_floor: Duration,
    /// Bounds a whole peer exchange, body included.
    pub peer_request: Duration,
    /// A peer body that stops moving is cut off after the estimated p99 block fetch time plus
    /// this margin (without an estimate: twice this); a relay's fetch, also a sixteenth (at
    /// least 20 ms) before its requester's bound (`X-DART-Progress-Ms`) when that is shorter.
    pub peer_progress_margin: Duration,
    /// Gives up connecting to an origin after this long.
    pub origin_dial: Duration,
    /// Gives up waiting for an origin's response head after this long.
    pub origin_head: Duration,
    /// Bounds a whole probe or block fetch from an origin, body included (not passthrough bodies,
    /// which may be whole objects).
    pub origin_request: Duration,
    /// Bounds one coalesced origin flight (spec/fetch.md: MaxFlight); a flight older than this
    /// plus a grace is replaced by the next caller.
    pub max_flight: Duration,
    /// How long a requester may leave the response body window full (it stopped reading) before
    /// the node gives up on it: the request is cancelled (its flight, permit and buffers
    /// released) and its connection aborted. A core timer.
    pub write_stall: Duration,
    /// Inbound: how long a client may take to send its request head (shell's server).
    pub inbound_head_read: Duration,
    /// Inbound: most bytes of one request head (shell's server).
    pub inbound_head_bytes: usize,
    /// Inbound: most connections one listener serves at once (shell's server).
    pub inbound_connections: usize,
    /// Outbound pool: idle connections kept per host.
    pub pool_idle_per_host: usize,
    /// Outbound pool: an idle connection is closed after this long.
    pub pool_idle: Duration,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            peer_dial: Duration::from_secs(1),
            peer_head: Duration::from_secs(10),
            peer_head_floor: Duration::from_secs(1),
            peer_request: Duration::from_secs(30),
            peer_progress_margin: Duration::from_secs(1),
            origin_dial: Duration::from_secs(10),
            origin_head: Duration::from_secs(30),
            origin_request: Duration::from_secs(300),
            max_flight: crate::engine::flight::DEFAULT_MAX_FLIGHT,
            write_stall: Duration::from_secs(30),
            inbound_head_read: Duration::from_secs(15),
            inbound_head_bytes: 64 << 10,
            inbound_connections: 4096,
            pool_idle_per_host: 32,
            pool_idle: Duration::from_secs(90),
        }
    }
}

/// Why a set of bounds was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BoundsError {
    /// A duration bound is zero or above [`BOUND_MAX`].
    #[error("bound {name} must be between 1ns and {BOUND_MAX:?}, got {value:?}")]
    Duration {
        /// The bound's field name.
        name: &'static str,
        /// The value given.
        value: Duration,
    },
    /// A count bound is zero.
    #[error("bound {name} must be at least 1")]
    Count {
        /// The bound's field name.
        name: &'static str,
    },
}

impl Bounds {
    /// How long a node without an estimate of peer fetch times waits for a peer's response head:
    /// one and a half times [`Self::peer_head_floor`], within [`Self::peer_head`] (1.5 s by
    /// default).
    pub fn cold_peer_head(&self) -> Duration {
        self.peer_head.min(self.peer_head_floor * 3 / 2)
    }

    /// Checks every bound is usable.
    pub fn validate(&self) -> Result<(), BoundsError> {
        let durations = [
            ("peer_dial", self.peer_dial),
            ("peer_head", self.peer_head),
            ("peer_head_floor", self.peer_head_floor),
            ("peer_request", self.peer_request),
            ("peer_progress_margin", self.peer_progress_margin),
            ("origin_dial", self.origin_dial),
            ("origin_head", self.origin_head),
            ("origin_request", self.origin_request),
            ("max_flight", self.max_flight),
            ("write_stall", self.write_stall),
            ("inbound_head_read", self.inbound_head_read),
            ("pool_idle", self.pool_idle),
        ];
        for (name, value) in durations {
            if value.is_zero() || value > BOUND_MAX {
                return Err(BoundsError::Duration { name, value });
            }
        }
        let counts = [
            ("inbound_head_bytes", self.inbound_head_bytes),
            ("inbound_connections", self.inbound_connections),
            ("pool_idle_per_host", self.pool_idle_per_host),
        ];
        for (name, value) in counts {
            if value == 0 {
                return Err(BoundsError::Count { name });
            }
        }
        Ok(())
    }

    /// The (dial, head, request) bounds of an exchange with a peer or an origin.
    pub fn exchange(&self, peer: bool) -> (Duration, Duration, Duration) {
        if peer {
            (self.peer_dial, self.peer_head, self.peer_request)
        } else {
            (self.origin_dial, self.origin_head, self.origin_request.min(self.max_flight))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_documented_transport_bounds() {
        let b = Bounds::default();
        assert_eq!(
            b.exchange(true),
            (Duration::from_secs(1), Duration::from_secs(10), Duration::from_secs(30))
        );
        assert_eq!(b.validate(), Ok(()));
    }

    #[test]
    fn zero_or_huge_bounds_are_refused_by_name() {
        let b = Bounds { peer_dial: Duration::ZERO, ..Bounds::default() };
        assert!(matches!(b.validate(), Err(BoundsError::Duration { name: "peer_dial", .. })));
        let b = Bounds { origin_head: BOUND_MAX * 2, ..Bounds::default() };
        assert!(matches!(b.validate(), Err(BoundsError::Duration { name: "origin_head", .. })));
        let b = Bounds { pool_idle_per_host: 0, ..Bounds::default() };
        assert_eq!(b.validate(), Err(BoundsError::Count { name: "pool_idle_per_host" }));
    }
}
