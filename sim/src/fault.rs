//! Fault plans as values: what goes wrong, where, when and for how long. A plan is generated from
//! a seed (swarm testing: every seed draws its own mix of fault kinds and intensities) or by a
//! proptest strategy, printed in replay output, and shrunk to a minimal failing plan.

use dart_core::rng::Rng;
use rand::Rng as _;
use std::fmt;
use std::time::Duration;

/// A transient misbehaviour of the origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OriginFault {
    /// `percent` % of requests get `status` (5xx) instead of an answer.
    Errors {
        /// The status returned.
        status: u16,
        /// Share of requests affected.
        percent: u8,
    },
    /// `percent` % of 206 bodies end early (the connection closes mid-body).
    Truncates {
        /// Share of bodies affected.
        percent: u8,
    },
    /// Content-Range totals are `*`.
    HidesTotal,
    /// Range is ignored: every answer is a whole-object 200.
    RangeBlind,
    /// Requests are accepted and never answered.
    Stall,
    /// Every answer is delayed.
    Slow {
        /// Added time to first byte in milliseconds.
        extra_ms: u16,
    },
}

/// How a hostile peer lies when it answers a block request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lie {
    /// A complete body one byte short.
    WrongLength,
    /// A body of the right length with flipped bytes.
    Corrupt,
    /// An answer that is not a block at all (malformed status or body).
    Garbage,
    /// It answers honestly, but names the object one block and a half larger than it is in
    /// the relay requests it sends (`X-DART-Object-Size`).
    ToldSize,
    /// It answers honestly, but names another version of the object (`X-DART-Object-ETag`)
    /// in the relay requests it sends.
    ToldVersion,
}

impl Lie {
    /// Whether this lie is told in the node's answers to block requests.
    pub fn in_answers(self) -> bool {
        matches!(self, Lie::WrongLength | Lie::Corrupt | Lie::Garbage)
    }
}

/// One kind of fault with its target and parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Packets from node `a` to node `b` vanish (and back too unless `one_way`).
    Partition {
        /// One side.
        a: usize,
        /// The other side.
        b: usize,
        /// Only `a → b` is cut.
        one_way: bool,
    },
    /// Packets between `node` and the origin vanish (only node → origin if `one_way`).
    CutOrigin {
        /// The node.
        node: usize,
        /// Only `node → origin` is cut.
        one_way: bool,
    },
    /// The node's own network blips: nothing in or out.
    Isolate {
        /// The node.
        node: usize,
    },
    /// The node is stopped gracefully (SIGTERM): at the start it announces its departure to its
    /// broadcast targets ([`dart_core::node::Input::Drain`]); at the end its process exits (its
    /// cache is lost). It starts again, empty, only when the faults heal (a redeployed pod).
    Drain {
        /// The node.
        node: usize,
    },
    /// The node's machine vanishes: dials to it never complete, pooled connections go silent.
    BlackHole {
        /// The node.
        node: usize,
    },
    /// The node's process dies (connections are refused) and restarts when the fault ends.
    Crash {
        /// The node.
        node: usize,
        /// The restarted process finds its block cache (warm start) or an empty one.
        keep_cache: bool,
    },
    /// Every block the node's store holds when the fault starts has one byte changed in place
    /// (disk or memory rot); blocks stored later are intact. Never drawn by swarm plans: the
    /// node's own client reads are not checked against the digests (docs/peer-plane.md).
    Rot {
        /// The node.
        node: usize,
    },
    /// The node's peer plane accepts requests and never answers them.
    Stall {
        /// The node.
        node: usize,
    },
    /// The node's uplink gets slower.
    Slow {
        /// The node.
        node: usize,
        /// Added latency per message in milliseconds.
        extra_ms: u16,
        /// Bandwidth divisor.
        divisor: u8,
    },
    /// Segments between `a` and `b` are lost (in both directions).
    Loss {
        /// One side (`usize::MAX` is the origin).
        a: usize,
        /// The other side.
        b: usize,
        /// Loss probability per traversal in percent.
        percent: u8,
    },
    /// The node's peer plane lies.
    Lies {
        /// The node.
        node: usize,
        /// How.
        lie: Lie,
    },
    /// The origin misbehaves.
    Origin(OriginFault),
    /// The origin replaces object `object` by a new version when the fault starts: new bytes,
    /// new validators (and a new size when `size` says so). Permanent: the fault's end and the
    /// heal change nothing, the new version stays.
    ReplaceObject {
        /// The object's index.
        object: usize,
        /// The new version's size (`None`: the current size).
        size: Option<u64>,
    },
}

/// The endpoint index standing for the origin in [`FaultKind::Loss`].
pub const ORIGIN_SIDE: usize = usize::MAX;

/// One fault: it starts `at` after the run begins and heals `lasts` later (at the latest when the
/// safety phase ends).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fault {
    /// Start, from the beginning of the run.
    pub at: Duration,
    /// Duration.
    pub lasts: Duration,
    /// What happens.
    pub kind: FaultKind,
}

/// A fault plan.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultPlan {
    /// The faults, in any order.
    pub faults: Vec<Fault>,
}

/// Fault kinds a swarm draw may enable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultClass {
    /// [`FaultKind::Partition`].
    Partition,
    /// [`FaultKind::CutOrigin`].
    CutOrigin,
    /// [`FaultKind::Isolate`].
    Isolate,
    /// [`FaultKind::BlackHole`].
    BlackHole,
    /// [`FaultKind::Crash`].
    Crash,
    /// [`FaultKind::Stall`].
    Stall,
    /// [`FaultKind::Slow`].
    Slow,
    /// [`FaultKind::Loss`].
    Loss,
    /// [`FaultKind::Lies`].
    Lies,
    /// [`OriginFault::Errors`].
    OriginErrors,
    /// [`OriginFault::Truncates`].
    OriginTruncates,
    /// [`OriginFault::HidesTotal`].
    OriginHidesTotal,
    /// [`OriginFault::RangeBlind`].
    OriginRangeBlind,
    /// [`OriginFault::Stall`].
    OriginStall,
    /// [`OriginFault::Slow`].
    OriginSlow,
}

impl FaultClass {
    /// Every class.
    pub const ALL: [FaultClass; 15] = [
        FaultClass::Partition,
        FaultClass::CutOrigin,
        FaultClass::Isolate,
        FaultClass::BlackHole,
        FaultClass::Crash,
        FaultClass::Stall,
        FaultClass::Slow,
        FaultClass::Loss,
        FaultClass::Lies,
        FaultClass::OriginErrors,
        FaultClass::OriginTruncates,
        FaultClass::OriginHidesTotal,
        FaultClass::OriginRangeBlind,
        FaultClass::OriginStall,
        FaultClass::OriginSlow,
    ];
}

/// Where and when a swarm draw may put faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwarmSpace {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Faults start within `0..window`.
    pub window: Duration,
    /// Classes a seed may enable (each seed enables a random non-empty subset).
    pub classes: Vec<FaultClass>,
    /// Most faults in one plan.
    pub faults_max: usize,
}

impl FaultPlan {
    /// No faults.
    pub fn none() -> Self {
        FaultPlan::default()
    }

    /// A swarm draw: this seed's own subset of `space.classes`, then up to `faults_max` faults
    /// drawn from that subset with random targets, times and intensities.
    pub fn swarm(rng: &mut Rng, space: &SwarmSpace) -> Self {
        assert!(space.nodes > 0 && !space.window.is_zero());
        if space.classes.is_empty() || space.faults_max == 0 {
            return FaultPlan::none();
        }
        let mut enabled: Vec<FaultClass> =
            space.classes.iter().copied().filter(|_| rng.random_bool(0.5)).collect();
        if enabled.is_empty() {
            enabled.push(space.classes[rng.random_range(0..space.classes.len())]);
        }
        let count = rng.random_range(1..=space.faults_max);
        let window = nanos(space.window);
        let faults = (0..count)
            .map(|_| {
                let class = enabled[rng.random_range(0..enabled.len())];
                let at = Duration::from_nanos(rng.random_range(0..window));
                let lasts = Duration::from_nanos(rng.random_range(window / 50..=window / 2).max(1));
                Fault { at, lasts, kind: draw_kind(rng, class, space.nodes) }
            })
            .collect();
        FaultPlan { faults }
    }

    /// Plans one step simpler than this one (a fault removed, shortened, started earlier or made
    /// milder), most aggressive first: the shrinker keeps the first that still fails.
    pub fn simpler(&self) -> Vec<FaultPlan> {
        let mut out = Vec::new();
        for i in 0..self.faults.len() {
            let mut p = self.clone();
            p.faults.remove(i);
            out.push(p);
        }
        for i in 0..self.faults.len() {
            let f = self.faults[i];
            let mut variants = Vec::new();
            if f.lasts > Duration::from_millis(10) {
                variants.push(Fault { lasts: f.lasts / 2, ..f });
            }
            if f.at > Duration::from_millis(10) {
                variants.push(Fault { at: f.at / 2, ..f });
            }
            variants.extend(milder(f.kind).into_iter().map(|kind| Fault { kind, ..f }));
            for v in variants {
                let mut p = self.clone();
                p.faults[i] = v;
                out.push(p);
            }
        }
        out
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn draw_kind(rng: &mut Rng, class: FaultClass, nodes: usize) -> FaultKind {
    let node = rng.random_range(0..nodes);
    let other = if nodes > 1 { (node + rng.random_range(1..nodes)) % nodes } else { node };
    match class {
        FaultClass::Partition => FaultKind::Partition { a: node, b: other, one_way: rng.random() },
        FaultClass::CutOrigin => FaultKind::CutOrigin { node, one_way: rng.random() },
        FaultClass::Isolate => FaultKind::Isolate { node },
        FaultClass::BlackHole => FaultKind::BlackHole { node },
        FaultClass::Crash => FaultKind::Crash { node, keep_cache: rng.random() },
        FaultClass::Stall => FaultKind::Stall { node },
        FaultClass::Slow => FaultKind::Slow {
            node,
            extra_ms: rng.random_range(1..500),
            divisor: rng.random_range(1..20),
        },
        FaultClass::Loss => {
            let b = if rng.random_bool(0.3) { ORIGIN_SIDE } else { other };
            FaultKind::Loss { a: node, b, percent: rng.random_range(1..60) }
        }
        FaultClass::Lies => {
            let lie = [Lie::WrongLength, Lie::Corrupt, Lie::Garbage][rng.random_range(0..3)];
            FaultKind::Lies { node, lie }
        }
        FaultClass::OriginErrors => FaultKind::Origin(OriginFault::Errors {
            status: [500, 502, 503][rng.random_range(0..3)],
            percent: rng.random_range(1..=100),
        }),
        FaultClass::OriginTruncates => {
            FaultKind::Origin(OriginFault::Truncates { percent: rng.random_range(1..=100) })
        }
        FaultClass::OriginHidesTotal => FaultKind::Origin(OriginFault::HidesTotal),
        FaultClass::OriginRangeBlind => FaultKind::Origin(OriginFault::RangeBlind),
        FaultClass::OriginStall => FaultKind::Origin(OriginFault::Stall),
        FaultClass::OriginSlow => {
            FaultKind::Origin(OriginFault::Slow { extra_ms: rng.random_range(1..2000) })
        }
    }
}

/// Milder versions of one fault kind (for shrinking).
fn milder(kind: FaultKind) -> Vec<FaultKind> {
    match kind {
        FaultKind::Partition { a, b, one_way: false } => {
            vec![FaultKind::Partition { a, b, one_way: true }]
        }
        FaultKind::CutOrigin { node, one_way: false } => {
            vec![FaultKind::CutOrigin { node, one_way: true }]
        }
        FaultKind::Slow { node, extra_ms, divisor } if extra_ms > 1 || divisor > 1 => {
            vec![FaultKind::Slow { node, extra_ms: extra_ms / 2, divisor: divisor.div_ceil(2) }]
        }
        FaultKind::Loss { a, b, percent } if percent > 1 => {
            vec![FaultKind::Loss { a, b, percent: percent / 2 }]
        }
        FaultKind::Origin(OriginFault::Errors { status, percent }) if percent > 1 => {
            vec![FaultKind::Origin(OriginFault::Errors { status, percent: percent / 2 })]
        }
        FaultKind::Origin(OriginFault::Truncates { percent }) if percent > 1 => {
            vec![FaultKind::Origin(OriginFault::Truncates { percent: percent / 2 })]
        }
        FaultKind::Origin(OriginFault::Slow { extra_ms }) if extra_ms > 1 => {
            vec![FaultKind::Origin(OriginFault::Slow { extra_ms: extra_ms / 2 })]
        }
        FaultKind::Partition { .. }
        | FaultKind::CutOrigin { .. }
        | FaultKind::Isolate { .. }
        | FaultKind::BlackHole { .. }
        | FaultKind::Drain { .. }
        | FaultKind::Crash { .. }
        | FaultKind::Stall { .. }
        | FaultKind::Rot { .. }
        | FaultKind::Slow { .. }
        | FaultKind::Loss { .. }
        | FaultKind::Lies { .. }
        | FaultKind::Origin(_)
        | FaultKind::ReplaceObject { .. } => Vec::new(),
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = |i: usize| if i == ORIGIN_SIDE { "origin".to_owned() } else { format!("n{i}") };
        match *self {
            FaultKind::Partition { a, b, one_way } => {
                write!(f, "partition n{a} {} n{b}", if one_way { "->" } else { "<->" })
            }
            FaultKind::CutOrigin { node, one_way } => {
                write!(f, "cut n{node} {} origin", if one_way { "->" } else { "<->" })
            }
            FaultKind::Isolate { node } => write!(f, "isolate n{node}"),
            FaultKind::BlackHole { node } => write!(f, "black-hole n{node}"),
            FaultKind::Drain { node } => write!(f, "drain n{node} (announce, then exit)"),
            FaultKind::Crash { node, keep_cache } => {
                write!(
                    f,
                    "crash n{node} ({})",
                    if keep_cache { "cache kept" } else { "cache lost" }
                )
            }
            FaultKind::Stall { node } => write!(f, "stall n{node}"),
            FaultKind::Slow { node, extra_ms, divisor } => {
                write!(f, "slow n{node} +{extra_ms}ms bw/{divisor}")
            }
            FaultKind::Loss { a, b, percent } => {
                write!(f, "loss {} <-> {} {percent}%", side(a), side(b))
            }
            FaultKind::Lies { node, lie } => write!(f, "n{node} lies ({lie:?})"),
            FaultKind::Rot { node } => write!(f, "n{node}'s store rots"),
            FaultKind::Origin(o) => write!(f, "origin {o:?}"),
            FaultKind::ReplaceObject { object, size: None } => write!(f, "replace o{object}"),
            FaultKind::ReplaceObject { object, size: Some(size) } => {
                write!(f, "replace o{object} ({size} bytes)")
            }
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at {:?} for {:?}: {}", self.at, self.lasts, self.kind)
    }
}

impl fmt::Display for FaultPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.faults.is_empty() {
            return f.write_str("no faults");
        }
        for (i, fault) in self.faults.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{fault}")?;
        }
        Ok(())
    }
}

/// Proptest strategies for fault plans (feature `proptest`): failing plans shrink to minimal ones.
#[cfg(feature = "proptest")]
pub mod strategy {
    use super::*;
    use proptest::prelude::*;

    /// Origin faults.
    pub fn origin_fault() -> impl Strategy<Value = OriginFault> {
        prop_oneof![
            (prop::sample::select(vec![500u16, 502, 503]), 1u8..=100)
                .prop_map(|(status, percent)| OriginFault::Errors { status, percent }),
            (1u8..=100).prop_map(|percent| OriginFault::Truncates { percent }),
            Just(OriginFault::HidesTotal),
            Just(OriginFault::RangeBlind),
            Just(OriginFault::Stall),
            (1u16..2000).prop_map(|extra_ms| OriginFault::Slow { extra_ms }),
        ]
    }

    /// Fault kinds over `nodes` nodes.
    pub fn fault_kind(nodes: usize) -> impl Strategy<Value = FaultKind> {
        let n = 0..nodes.max(1);
        prop_oneof![
            (n.clone(), n.clone(), any::<bool>())
                .prop_map(|(a, b, one_way)| FaultKind::Partition { a, b, one_way }),
            (n.clone(), any::<bool>())
                .prop_map(|(node, one_way)| FaultKind::CutOrigin { node, one_way }),
            n.clone().prop_map(|node| FaultKind::Isolate { node }),
            n.clone().prop_map(|node| FaultKind::BlackHole { node }),
            (n.clone(), any::<bool>())
                .prop_map(|(node, keep_cache)| FaultKind::Crash { node, keep_cache }),
            (n.clone(), 1u16..500, 1u8..20).prop_map(|(node, extra_ms, divisor)| FaultKind::Slow {
                node,
                extra_ms,
                divisor
            }),
            (n.clone(), n, 1u8..60).prop_map(|(a, b, percent)| FaultKind::Loss { a, b, percent }),
            origin_fault().prop_map(FaultKind::Origin),
        ]
    }

    /// Plans of up to `faults_max` faults starting within `window`.
    pub fn fault_plan(
        nodes: usize,
        window: Duration,
        faults_max: usize,
    ) -> impl Strategy<Value = FaultPlan> {
        let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(2);
        let fault = (0..ms, 1..ms, fault_kind(nodes)).prop_map(|(at, lasts, kind)| Fault {
            at: Duration::from_millis(at),
            lasts: Duration::from_millis(lasts),
            kind,
        });
        prop::collection::vec(fault, 0..=faults_max).prop_map(|faults| FaultPlan { faults })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dart_core::rng;

    fn space() -> SwarmSpace {
        SwarmSpace {
            nodes: 5,
            window: Duration::from_secs(10),
            classes: FaultClass::ALL.to_vec(),
            faults_max: 6,
        }
    }

    #[test]
    fn a_seed_draws_the_same_plan_every_time_and_seeds_differ() {
        let a = FaultPlan::swarm(&mut rng::from_seed(9), &space());
        let b = FaultPlan::swarm(&mut rng::from_seed(9), &space());
        assert_eq!(a, b);
        let others: Vec<_> =
            (10..20).map(|s| FaultPlan::swarm(&mut rng::from_seed(s), &space())).collect();
        assert!(others.iter().any(|p| *p != a));
        for p in others.iter().chain([&a]) {
            assert!(!p.faults.is_empty() && p.faults.len() <= 6);
            assert!(p.faults.iter().all(|f| f.at < Duration::from_secs(10)));
        }
    }

    #[test]
    fn every_simpler_plan_is_smaller_or_milder() {
        let plan = FaultPlan::swarm(&mut rng::from_seed(4), &space());
        let simpler = plan.simpler();
        assert!(simpler.len() >= plan.faults.len());
        for p in &simpler[..plan.faults.len()] {
            assert_eq!(p.faults.len(), plan.faults.len() - 1);
        }
        assert!(FaultPlan::none().simpler().is_empty());
    }

    #[test]
    fn plans_print_one_line_each() {
        let plan = FaultPlan {
            faults: vec![Fault {
                at: Duration::from_millis(1500),
                lasts: Duration::from_secs(2),
                kind: FaultKind::Partition { a: 1, b: 4, one_way: true },
            }],
        };
        assert_eq!(plan.to_string(), "at 1.5s for 2s: partition n1 -> n4");
    }
}
