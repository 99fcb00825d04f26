//! Simulated exchanges: one per [`dart_core::node::Output::Send`], from a node to the origin or
//! to another node's peer listener, and where each is on its way.
//!
//! A call is a small state machine over the network: the dial (a round trip, or nothing on a warm
//! pooled connection), the request leg, the callee's work (the origin's answer, or the callee
//! node's machine), the response leg. What the caller's machine learns is reported as
//! [`dart_core::node::IoEvent`]s at simulated times.
//!
//! A path that goes silent mid-exchange stalls the call, as TCP would: segments are retransmitted
//! with exponential backoff, so when the path heals the exchange resumes at the next
//! retransmission (a SYN's schedule starts at 1 s, a data segment's at 200 ms). Calls have no
//! deadlines of their own: the caller's machine gives up on its own timers and cancels. A process
//! that is down refuses at once (a reset after one round trip).

use crate::net::Endpoint;
use bytes::Bytes;
use dart_core::node::{Headers, IoError, IoId, RequestId};
use dart_core::time::Instant;
use std::fmt;
use std::time::Duration;

/// First SYN retransmission (Linux: 1 s, doubling).
pub const SYN_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Most doublings of a retransmission schedule that are modelled.
const BACKOFF_STEPS_MAX: u32 = 16;

/// A call's id, unique in a run (never reused, unlike the machine's exchange ids, which a
/// restarted node counts afresh).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CallId(pub u64);

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// What a call asks, as the driver reads the machine's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// An origin size probe (`Range: bytes=0-0`).
    Probe {
        /// The object.
        object: usize,
    },
    /// An origin block window (`Range: bytes=start-end`).
    Window {
        /// The object.
        object: usize,
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: u64,
    },
    /// A verbatim passthrough carrying the client's own `Range` (if any).
    Passthrough {
        /// The object.
        object: usize,
    },
    /// A request to another node's peer listener.
    Peer {
        /// The callee.
        node: usize,
    },
}

impl fmt::Display for CallKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallKind::Probe { object } => write!(f, "probe o{object}"),
            CallKind::Window { object, start, end } => write!(f, "range o{object} {start}-{end}"),
            CallKind::Passthrough { object } => write!(f, "passthrough o{object}"),
            CallKind::Peer { node } => write!(f, "peer n{node}"),
        }
    }
}

/// Which way a stalled exchange was travelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// Connecting (no `Connected` reported yet).
    Dial,
    /// The request.
    Request,
    /// The response.
    Response,
}

/// Where a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The request travels: connected at `connect_at` (if a dial is still under way), it reaches
    /// the callee at `arrive_at`.
    Request {
        /// When the handshake completes (`None`: already connected).
        connect_at: Option<Instant>,
        /// Arrival at the callee.
        arrive_at: Instant,
    },
    /// The callee holds it (a node's machine working on it, a stalled peer plane, a stalled
    /// origin): nothing moves until the callee answers or the caller cancels.
    Serving,
    /// The whole response travels: its head arrives at `head_at`, its last byte at `done_at`.
    Response {
        /// First byte at the caller.
        head_at: Instant,
        /// Last byte at the caller.
        done_at: Instant,
    },
    /// A cut-through relay sent its head (arriving at `head_at`) and streams the body as its own
    /// upstream delivers it: the body cannot arrive before `floor` (the link's own transfer time)
    /// nor before the relay's end plus one latency.
    Streaming {
        /// The head's arrival at the caller.
        head_at: Instant,
        /// Earliest arrival of the last byte.
        floor: Instant,
    },
    /// A silent path holds it until the path heals.
    Stalled {
        /// When the path went silent.
        since: Instant,
        /// Which way it was going.
        leg: Leg,
        /// The response's times before the stall (response leg only).
        head_at: Instant,
        /// See `head_at` (for a stream, its floor).
        done_at: Instant,
    },
    /// It failed; the caller learns at `at`.
    Failing {
        /// When the caller learns.
        at: Instant,
    },
}

/// Compact, stable trace form: times in nanoseconds.
impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Stage::Request { connect_at: Some(c), arrive_at } => {
                write!(f, "connects {} arrives {}", c.as_nanos(), arrive_at.as_nanos())
            }
            Stage::Request { connect_at: None, arrive_at } => {
                write!(f, "arrives {}", arrive_at.as_nanos())
            }
            Stage::Serving => f.write_str("serving"),
            Stage::Response { head_at, done_at } => {
                write!(f, "response {}-{}", head_at.as_nanos(), done_at.as_nanos())
            }
            Stage::Streaming { head_at, floor } => {
                write!(f, "streaming {}-{}", head_at.as_nanos(), floor.as_nanos())
            }
            Stage::Stalled { leg, .. } => write!(f, "stalled {leg:?}"),
            Stage::Failing { at } => write!(f, "failing at {}", at.as_nanos()),
        }
    }
}

/// A response body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// Object bytes `start..start + len` (an origin answer; generated when delivered).
    Window {
        /// The object.
        object: usize,
        /// The version answered.
        version: usize,
        /// First object offset.
        start: u64,
        /// Bytes sent.
        len: u64,
    },
    /// The parts a node's machine wrote (a peer answer).
    Parts(Vec<Bytes>),
}

impl Body {
    /// Body bytes.
    pub fn len(&self) -> u64 {
        match self {
            Body::Window { len, .. } => *len,
            Body::Parts(parts) => parts.iter().map(|p| p.len() as u64).sum(),
        }
    }

    /// True when there are no body bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A callee's answer as it travels back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Status.
    pub status: u16,
    /// Header fields.
    pub headers: Headers,
    /// The body (for a stream still under way: the parts so far).
    pub body: Body,
    /// How the body ends: `None` while a stream is under way, `Some(None)` cleanly, `Some(Some
    /// (why))` broken (a truncated body, a relay that aborted).
    pub ending: Option<Option<String>>,
}

/// An exchange in flight.
#[derive(Clone, Debug)]
pub struct Call {
    /// The caller.
    pub node: usize,
    /// The caller machine's exchange.
    pub io: IoId,
    /// The callee.
    pub to: Endpoint,
    /// The URL asked.
    pub url: String,
    /// The request's header fields.
    pub headers: Headers,
    /// The method (`GET`, or `POST` with a body).
    pub method: &'static str,
    /// The request body (a tracker JOIN's; empty for a `GET`).
    pub body: bytes::Bytes,
    /// What it asks.
    pub kind: CallKind,
    /// When it was sent.
    pub sent: Instant,
    /// Where it is.
    pub stage: Stage,
    /// Bumped at every change of stage; an event of an older generation is stale.
    pub gen: u32,
    /// The caller was told `Connected`.
    pub connected: bool,
    /// It dialed a new connection (which joins the pool when the request arrives).
    pub dialed: bool,
    /// The caller was told the head.
    pub head_delivered: bool,
    /// Body groups delivered so far.
    pub parts_delivered: usize,
    /// The answer, once the callee gave one (a stream's grows).
    pub answer: Option<Answer>,
    /// How it fails when `stage` is `Failing`.
    pub error: Option<IoError>,
    /// The client request its body is piped to (a passthrough).
    pub pipe_to: Option<RequestId>,
    /// The request the callee node's machine serves it as.
    pub callee_request: Option<RequestId>,
    /// The origin window it counts against (at most one per node and window).
    pub window: Option<(usize, usize, u64, u64)>,
    /// The sender's egress reservation of its response: (sender, start, end).
    pub egress: Option<(Endpoint, Instant, Instant)>,
}

impl Call {
    /// Whether the callee is a node.
    pub fn to_node(&self) -> Option<usize> {
        match self.to {
            Endpoint::Node(j) => Some(j),
            Endpoint::Origin => None,
        }
    }
}

/// Absolute byte offsets (exclusive ends, relative to the body start) at which the body of `body`
/// is delivered in groups: an origin window at every block boundary of the object, a peer answer
/// all at once.
pub fn group_ends(body: &Body, block_bytes: u64) -> Vec<u64> {
    match body {
        Body::Parts(_) => vec![body.len()],
        Body::Window { start, len, .. } => {
            let mut ends = Vec::new();
            let end = start + len;
            let mut at = *start;
            while at < end {
                let next = ((at / block_bytes) + 1) * block_bytes;
                at = next.min(end);
                ends.push(at - start);
            }
            if ends.is_empty() {
                ends.push(0);
            }
            ends
        }
    }
}

/// When group `i` of `ends` arrives on a response whose first byte arrives at `head_at` and last
/// at `done_at` (proportional to the bytes before its end).
pub fn group_at(ends: &[u64], i: usize, head_at: Instant, done_at: Instant) -> Instant {
    let total = *ends.last().expect("at least one group");
    if i + 1 >= ends.len() || total == 0 {
        return done_at;
    }
    let span = done_at.saturating_duration_since(head_at).as_nanos();
    let offset = span * u128::from(ends[i]) / u128::from(total);
    head_at + Duration::from_nanos(u64::try_from(offset).unwrap_or(u64::MAX))
}

/// The first retransmission at or after `now` of a schedule that began at `since` with `first`.
pub fn next_retransmission(since: Instant, first: Duration, now: Instant) -> Instant {
    let mut at = since + first;
    let mut step = first;
    for _ in 0..BACKOFF_STEPS_MAX {
        if at >= now {
            return at;
        }
        step *= 2;
        at += step;
    }
    at.max(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retransmissions_back_off_exponentially_from_the_stall() {
        let t = |ms| Instant::from_millis(ms);
        let d = Duration::from_millis(200);
        assert_eq!(next_retransmission(t(0), d, t(0)), t(200));
        assert_eq!(next_retransmission(t(0), d, t(201)), t(600));
        assert_eq!(next_retransmission(t(0), d, t(1000)), t(1400));
        assert_eq!(next_retransmission(t(0), SYN_RETRY_DELAY, t(2000)), t(3000));
    }

    #[test]
    fn origin_bodies_arrive_in_block_aligned_groups_in_proportion() {
        let body = Body::Window { object: 0, version: 0, start: 100, len: 250 };
        assert_eq!(group_ends(&body, 128), vec![28, 156, 250]);
        let one = Body::Window { object: 0, version: 0, start: 128, len: 128 };
        assert_eq!(group_ends(&one, 128), vec![128]);
        let ends = group_ends(&body, 128);
        let (h, d) = (Instant::from_millis(0), Instant::from_millis(250));
        assert_eq!(group_at(&ends, 1, h, d), Instant::from_millis(156));
        assert_eq!(group_at(&ends, 2, h, d), d);
        assert_eq!(group_ends(&Body::Parts(vec![]), 128), vec![0]);
    }
}
