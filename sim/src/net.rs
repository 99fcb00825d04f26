//! The simulated network: per-link latency distributions and bandwidth, sender-side serialisation,
//! loss as retransmission delay, two-way and one-way partitions, black holes, isolated nodes and
//! dead processes, plus the pool of warm connections that decides whether a request pays a dial.
//!
//! The model is message-level, not packet-level. A message of `n` bytes sent at `t` from `a` to
//! `b` starts leaving `a` when `a`'s egress is free (bulk messages only: small ones interleave at
//! packet level in reality, so they skip the queue), takes `n / bandwidth` to leave, and arrives
//! one latency draw later. Loss on a TCP path shows up as delay: each lost traversal adds a
//! retransmission timeout. What a cut does to a conversation is the caller's business
//! ([`PathState`]): the network only says whether a path is open, refused or silent.

use dart_core::rng::Rng;
use dart_core::time::Instant;
use rand::Rng as _;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Messages at least this large queue on the sender's egress; smaller ones interleave.
pub const BULK_BYTES_MIN: u64 = 64 << 10;
/// Retransmission timeout added per lost traversal (Linux's minimum RTO).
pub const RETRANSMIT_DELAY: Duration = Duration::from_millis(200);
/// Most consecutive losses drawn for one traversal (the backoff doubles each time).
pub const LOSSES_PER_TRAVERSAL_MAX: u32 = 6;

/// A point in the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Endpoint {
    /// The origin server.
    Origin,
    /// Node `i`.
    Node(usize),
}

impl Endpoint {
    fn index(self) -> usize {
        match self {
            Endpoint::Origin => 0,
            Endpoint::Node(i) => i + 1,
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Origin => f.write_str("origin"),
            Endpoint::Node(i) => write!(f, "n{i}"),
        }
    }
}

/// A one-way latency distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Uniform in `lo..=hi`.
    Uniform {
        /// Shortest.
        lo: Duration,
        /// Longest.
        hi: Duration,
    },
    /// `base` plus an exponential tail of mean `mean_extra`, capped at 20 means.
    Exponential {
        /// Floor.
        base: Duration,
        /// Mean of the tail.
        mean_extra: Duration,
    },
}

impl Latency {
    /// One draw.
    pub fn draw(&self, rng: &mut Rng) -> Duration {
        match *self {
            Latency::Fixed(d) => d,
            Latency::Uniform { lo, hi } => {
                let (lo, hi) = (nanos(lo), nanos(hi.max(lo)));
                Duration::from_nanos(rng.random_range(lo..=hi))
            }
            Latency::Exponential { base, mean_extra } => {
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                let extra = (-u.ln()).min(20.0) * nanos(mean_extra) as f64;
                base + Duration::from_nanos(extra as u64)
            }
        }
    }

    /// The smallest value a draw can take.
    pub fn floor(&self) -> Duration {
        match *self {
            Latency::Fixed(d) => d,
            Latency::Uniform { lo, .. } => lo,
            Latency::Exponential { base, .. } => base,
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// One direction of a link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// Latency distribution.
    pub latency: Latency,
    /// Bandwidth cap of the link in bytes per second.
    pub bandwidth: u64,
    /// Probability that one traversal loses a segment (adds [`RETRANSMIT_DELAY`], doubling).
    pub loss: f64,
}

/// The network's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConfig {
    /// Node-to-node links.
    pub peer_link: LinkSpec,
    /// Node-to-origin and origin-to-node links.
    pub origin_link: LinkSpec,
    /// Each node's uplink in bytes per second.
    pub node_egress: u64,
    /// The origin's uplink in bytes per second.
    pub origin_egress: u64,
    /// Per-direction overrides `(from, to)`.
    pub overrides: BTreeMap<(Endpoint, Endpoint), LinkSpec>,
}

impl NetConfig {
    /// A data-centre network: 0.2 ms ± jitter between nodes, 10 ms to the origin, 10 Gbit/s
    /// node uplinks, a 10 Gbit/s origin.
    pub fn datacenter() -> Self {
        NetConfig {
            peer_link: LinkSpec {
                latency: Latency::Exponential {
                    base: Duration::from_micros(150),
                    mean_extra: Duration::from_micros(50),
                },
                bandwidth: 1_250_000_000,
                loss: 0.0,
            },
            origin_link: LinkSpec {
                latency: Latency::Uniform {
                    lo: Duration::from_millis(8),
                    hi: Duration::from_millis(12),
                },
                bandwidth: 1_250_000_000,
                loss: 0.0,
            },
            node_egress: 1_250_000_000,
            origin_egress: 1_250_000_000,
            overrides: BTreeMap::new(),
        }
    }
}

/// Whether a message from `a` can reach `b` right now, as `a` would experience it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathState {
    /// Delivered after a delay.
    Open,
    /// `b`'s machine answers but nothing listens (process down): a reset after one round trip.
    Refused,
    /// Packets vanish (partition, black hole, isolated sender or receiver): only timeouts tell.
    Silent,
}

/// Transient link conditions layered on the configuration by faults (counted, so that
/// overlapping faults heal independently).
#[derive(Clone, Debug, Default)]
struct Conditions {
    /// Directed cuts `(from, to)`.
    cuts: BTreeMap<(Endpoint, Endpoint), u32>,
    /// Endpoints whose machine is gone or whose network is down (nothing in, nothing out).
    dark: BTreeMap<Endpoint, u32>,
    /// Extra loss probability per directed link, in percent.
    loss: BTreeMap<(Endpoint, Endpoint), Vec<u8>>,
    /// Extra egress slowness per endpoint: (added latency, bandwidth divisor).
    slow: BTreeMap<Endpoint, Vec<(Duration, u32)>>,
}

/// The network state.
#[derive(Debug)]
pub struct Net {
    config: NetConfig,
    rng: Rng,
    egress_free: Vec<Instant>,
    down: Vec<bool>,
    warm: BTreeSet<(Endpoint, Endpoint)>,
    cond: Conditions,
}

impl Net {
    /// A network over the origin and `nodes` nodes, drawing from `rng`.
    pub fn new(config: NetConfig, nodes: usize, rng: Rng) -> Self {
        Net {
            config,
            rng,
            egress_free: vec![Instant::ZERO; nodes + 1],
            down: vec![false; nodes + 1],
            warm: BTreeSet::new(),
            cond: Conditions::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &NetConfig {
        &self.config
    }

    fn link(&self, from: Endpoint, to: Endpoint) -> LinkSpec {
        if let Some(spec) = self.config.overrides.get(&(from, to)) {
            return *spec;
        }
        match (from, to) {
            (Endpoint::Origin, _) | (_, Endpoint::Origin) => self.config.origin_link,
            (Endpoint::Node(_), Endpoint::Node(_)) => self.config.peer_link,
        }
    }

    fn egress(&self, from: Endpoint) -> u64 {
        match from {
            Endpoint::Origin => self.config.origin_egress,
            Endpoint::Node(_) => self.config.node_egress,
        }
    }

    /// Whether `from` can reach `to` now.
    pub fn path(&self, from: Endpoint, to: Endpoint) -> PathState {
        let dark = |e: Endpoint| self.cond.dark.get(&e).is_some_and(|&n| n > 0);
        if dark(from) || dark(to) || self.cond.cuts.get(&(from, to)).is_some_and(|&n| n > 0) {
            return PathState::Silent;
        }
        if self.down[to.index()] {
            return PathState::Refused;
        }
        PathState::Open
    }

    /// One latency draw from `from` to `to` including loss delays and slowness.
    pub fn latency(&mut self, from: Endpoint, to: Endpoint) -> Duration {
        let spec = self.link(from, to);
        let mut d = spec.latency.draw(&mut self.rng);
        let extra_loss: u32 =
            self.cond.loss.get(&(from, to)).map_or(0, |v| v.iter().map(|&p| u32::from(p)).sum());
        let loss = (spec.loss + f64::from(extra_loss) / 100.0).min(0.95);
        if loss > 0.0 {
            let mut rto = RETRANSMIT_DELAY;
            for _ in 0..LOSSES_PER_TRAVERSAL_MAX {
                if !self.rng.random_bool(loss) {
                    break;
                }
                d += rto;
                rto *= 2;
            }
        }
        if let Some(slow) = self.cond.slow.get(&from) {
            d += slow.iter().map(|s| s.0).sum::<Duration>();
        }
        d
    }

    /// Sends `bytes` from `from` to `to` starting no earlier than `ready`; returns when its first
    /// and its last byte arrive. Bulk messages occupy the sender's egress.
    pub fn transfer(
        &mut self,
        from: Endpoint,
        to: Endpoint,
        bytes: u64,
        ready: Instant,
    ) -> (Instant, Instant) {
        let (first, last, _) = self.transfer_slot(from, to, bytes, ready);
        (first, last)
    }

    /// [`Net::transfer`], also returning the slot `(start, end)` a bulk message took on the
    /// sender's egress (for [`Net::release`]).
    pub fn transfer_slot(
        &mut self,
        from: Endpoint,
        to: Endpoint,
        bytes: u64,
        ready: Instant,
    ) -> (Instant, Instant, Option<(Instant, Instant)>) {
        let spec = self.link(from, to);
        let divisor: u64 = self
            .cond
            .slow
            .get(&from)
            .map_or(1, |v| v.iter().map(|s| u64::from(s.1.max(1))).product());
        let bandwidth = (spec.bandwidth.min(self.egress(from)) / divisor.max(1)).max(1);
        let tx = Duration::from_nanos(
            u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(bandwidth))
                .unwrap_or(u64::MAX),
        );
        let (start, slot) = if bytes >= BULK_BYTES_MIN {
            let free = &mut self.egress_free[from.index()];
            let start = ready.max(*free);
            *free = start + tx;
            (start, Some((start, start + tx)))
        } else {
            (ready, None)
        };
        let latency = self.latency(from, to);
        (start + latency, start + tx + latency, slot)
    }

    /// The receiver dropped a bulk message at `now` that held `slot` on `from`'s egress: the
    /// rest is not sent. Only the last reservation can be given back (later messages were timed
    /// behind it already).
    pub fn release(&mut self, from: Endpoint, slot: (Instant, Instant), now: Instant) {
        let free = &mut self.egress_free[from.index()];
        if *free == slot.1 && now < slot.1 {
            *free = now.max(slot.0);
        }
    }

    /// Whether a pooled connection `from → to` is believed usable by `from`.
    pub fn is_warm(&self, from: Endpoint, to: Endpoint) -> bool {
        self.warm.contains(&(from, to))
    }

    /// Marks the pooled connection `from → to` usable (after a dial) or not (after an error).
    pub fn set_warm(&mut self, from: Endpoint, to: Endpoint, warm: bool) {
        if warm {
            self.warm.insert((from, to));
        } else {
            self.warm.remove(&(from, to));
        }
    }

    /// The process at `e` stops (`down`) or starts listening again. Connections either side held
    /// are reset: they are forgotten by `e` and refused to everybody else on next use.
    pub fn set_down(&mut self, e: Endpoint, down: bool) {
        self.down[e.index()] = down;
        if down {
            self.warm.retain(|&(from, _)| from != e);
        }
    }

    /// Whether the process at `e` is down.
    pub fn is_down(&self, e: Endpoint) -> bool {
        self.down[e.index()]
    }

    /// Adds (`on`) or removes a directed cut `from → to`.
    pub fn cut(&mut self, from: Endpoint, to: Endpoint, on: bool) {
        bump(&mut self.cond.cuts, (from, to), on);
    }

    /// Makes `e` unreachable in both directions (its machine is gone or its network is down).
    pub fn darken(&mut self, e: Endpoint, on: bool) {
        bump(&mut self.cond.dark, e, on);
    }

    /// Adds or removes `percent` extra loss on `from → to`.
    pub fn add_loss(&mut self, from: Endpoint, to: Endpoint, percent: u8, on: bool) {
        let v = self.cond.loss.entry((from, to)).or_default();
        toggle(v, percent, on);
        if v.is_empty() {
            self.cond.loss.remove(&(from, to));
        }
    }

    /// Adds or removes slowness on `e`'s egress.
    pub fn add_slow(&mut self, e: Endpoint, extra: Duration, divisor: u32, on: bool) {
        let v = self.cond.slow.entry(e).or_default();
        toggle(v, (extra, divisor), on);
        if v.is_empty() {
            self.cond.slow.remove(&e);
        }
    }

    /// True when no fault condition is in force.
    pub fn is_healed(&self) -> bool {
        self.cond.cuts.is_empty()
            && self.cond.dark.is_empty()
            && self.cond.loss.is_empty()
            && self.cond.slow.is_empty()
    }

    /// Asserts the network's bounds.
    pub fn check_invariants(&self) {
        let n = self.egress_free.len();
        assert!(self.warm.len() <= n * n, "warm pool above endpoints squared");
        assert!(self.cond.cuts.values().all(|&c| c > 0), "healed cuts are removed");
        assert!(self.cond.dark.values().all(|&c| c > 0), "healed darkness is removed");
    }
}

fn bump<K: Ord>(map: &mut BTreeMap<K, u32>, key: K, on: bool) {
    if on {
        *map.entry(key).or_default() += 1;
    } else if let Some(c) = map.get_mut(&key) {
        *c -= 1;
        if *c == 0 {
            map.remove(&key);
        }
    }
}

fn toggle<T: PartialEq>(v: &mut Vec<T>, item: T, on: bool) {
    if on {
        v.push(item);
    } else if let Some(i) = v.iter().position(|x| *x == item) {
        v.remove(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dart_core::rng;

    fn net() -> Net {
        let mut c = NetConfig::datacenter();
        c.peer_link.latency = Latency::Fixed(Duration::from_millis(1));
        c.peer_link.bandwidth = 1_000_000;
        c.node_egress = 1_000_000;
        Net::new(c, 3, rng::from_seed(1))
    }

    #[test]
    fn bulk_messages_serialise_on_the_sender_and_small_ones_do_not() {
        let mut n = net();
        let (a, b) = (Endpoint::Node(0), Endpoint::Node(1));
        let t0 = Instant::ZERO;
        let (_, first) = n.transfer(a, b, 100_000, t0);
        assert_eq!(first, Instant::from_millis(101));
        let (_, second) = n.transfer(a, b, 100_000, t0);
        assert_eq!(second, Instant::from_millis(201), "waits for the first to leave");
        let (_, small) = n.transfer(a, b, 1_000, t0);
        assert_eq!(small, Instant::from_millis(2));
    }

    #[test]
    fn cuts_and_darkness_silence_paths_and_heal_by_count() {
        let mut n = net();
        let (a, b) = (Endpoint::Node(0), Endpoint::Node(1));
        n.cut(a, b, true);
        n.cut(a, b, true);
        assert_eq!(n.path(a, b), PathState::Silent);
        assert_eq!(n.path(b, a), PathState::Open, "one-way");
        n.cut(a, b, false);
        assert_eq!(n.path(a, b), PathState::Silent, "one of two overlapping cuts remains");
        n.cut(a, b, false);
        assert_eq!(n.path(a, b), PathState::Open);
        n.darken(b, true);
        assert_eq!((n.path(a, b), n.path(b, a)), (PathState::Silent, PathState::Silent));
        n.darken(b, false);
        n.set_down(b, true);
        assert_eq!(n.path(a, b), PathState::Refused);
        assert!(n.is_healed());
        n.check_invariants();
    }

    #[test]
    fn loss_adds_retransmission_delays() {
        let mut n = net();
        let (a, b) = (Endpoint::Node(0), Endpoint::Node(1));
        n.add_loss(a, b, 90, true);
        let total: Duration = (0..50).map(|_| n.latency(a, b)).sum();
        assert!(total > Duration::from_secs(5), "{total:?}");
        n.add_loss(a, b, 90, false);
        assert_eq!(n.latency(a, b), Duration::from_millis(1));
    }
}
