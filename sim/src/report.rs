//! What a run produced: one record per read, origin traffic, per-node counters, block sources over
//! time, the first invariant violation if any, and the trace hash.

use crate::fault::FaultPlan;
use crate::origin::OriginStats;
use dart_core::breaker::{BreakerCounters, BreakerEvent, CircuitState};
use dart_core::engine::EngineStats;
use dart_core::time::Instant;
use std::fmt;

/// Which phase a read belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// With faults.
    Safety,
    /// After healing; must complete.
    Liveness,
}

/// How a read ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Not started or still running when the run ended.
    Pending,
    /// Complete and correct.
    Finished,
    /// The core failed it (before or after committing the head).
    Failed {
        /// Status answered when not committed.
        status: u16,
        /// The head had been sent: the body was truncated.
        committed: bool,
        /// The cause.
        error: String,
    },
    /// Proxied verbatim to a Range-blind origin, which answered `status`.
    Passthrough {
        /// The origin's status.
        status: u16,
    },
    /// Proxied, but the exchange failed.
    PassthroughFailed {
        /// The cause.
        error: String,
    },
    /// The node's process died under it.
    Aborted,
    /// The node was down when the client connected.
    Refused,
}

impl ReadOutcome {
    /// Whether the client got a complete answer.
    pub fn is_complete(&self) -> bool {
        matches!(self, ReadOutcome::Finished | ReadOutcome::Passthrough { .. })
    }
}

/// One read's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRecord {
    /// Phase.
    pub phase: Phase,
    /// Index in its phase's list.
    pub index: usize,
    /// Node.
    pub node: usize,
    /// Object.
    pub object: usize,
    /// When the client sent it.
    pub started: Option<Instant>,
    /// When the head was sent.
    pub head_at: Option<Instant>,
    /// When the first body byte was sent.
    pub first_byte_at: Option<Instant>,
    /// When it ended.
    pub done_at: Option<Instant>,
    /// Body bytes delivered by the last attempt (all checked).
    pub bytes: u64,
    /// Attempts made (liveness clients retry a failed read).
    pub attempts: u32,
    /// How it ended.
    pub outcome: ReadOutcome,
    /// The version of the object its last attempt's head named (its validators), if any; every
    /// byte it delivered is of that version.
    pub version: Option<usize>,
}

impl ReadRecord {
    /// Time from request to end, if it ended.
    pub fn latency(&self) -> Option<std::time::Duration> {
        Some(self.done_at?.saturating_duration_since(self.started?))
    }
}

/// Where one block a read served came from: the node machine's own
/// [`Event::Block`](dart_core::node::Event::Block) source.
pub use dart_core::node::BlockSource;

/// A block served at a time by a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockEvent {
    /// When.
    pub at: Instant,
    /// Which node.
    pub node: usize,
    /// From where.
    pub source: BlockSource,
}

/// The first invariant that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// When.
    pub at: Instant,
    /// Where, if one node.
    pub node: Option<usize>,
    /// What.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.node {
            Some(n) => write!(f, "at {} on n{n}: {}", self.at, self.what),
            None => write!(f, "at {}: {}", self.at, self.what),
        }
    }
}

/// Per-node summary.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReport {
    /// The engine's counters (of its last incarnation).
    pub engine: EngineStats,
    /// Blocks cached at the end.
    pub cached_blocks: usize,
    /// Blocks evicted at capacity.
    pub evictions: u64,
    /// Borrowed blocks refused by TinyLFU admission (core's verdict).
    pub admit_rejected: u64,
    /// Crashes.
    pub crashes: u32,
    /// Every breaker transition, across incarnations.
    pub circuit_events: Vec<BreakerEvent<String>>,
    /// The breaker's counters (of its last incarnation).
    pub breaker: Option<BreakerCounters>,
    /// Peers whose circuit is not closed at the end, with their state.
    pub unclosed: Vec<(String, CircuitState)>,
    /// The final view (`None` while down or without a peer path): a clone that shares the
    /// node's member list, so a report of N nodes costs no N² copies of ids.
    pub view: Option<dart_core::membership::View>,
    /// Every view the node moved to under discovery, with when, across incarnations.
    pub view_changes: Vec<(Instant, Vec<String>)>,
    /// This incarnation's member id.
    pub member_id: String,
    /// The node machine's counters (of its last incarnation; zero while down).
    pub counters: dart_core::node::NodeCounters,
}

/// Everything a run produced.
#[derive(Clone, Debug)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// The plan that ran.
    pub plan: FaultPlan,
    /// Hash of the trace.
    pub trace_hash: u64,
    /// Events processed.
    pub events: u64,
    /// Trace lines written.
    pub trace_lines: u64,
    /// Simulated time reached.
    pub end: Instant,
    /// When faults healed.
    pub heal_at: Instant,
    /// Every read, safety phase first.
    pub reads: Vec<ReadRecord>,
    /// Origin traffic.
    pub origin: OriginStats,
    /// Per node.
    pub nodes: Vec<NodeReport>,
    /// Block sources over time.
    pub blocks: Vec<BlockEvent>,
    /// The first invariant violation.
    pub violation: Option<Violation>,
    /// Origin block fetches a node sent while its cache held the block (not right after a
    /// look-up that found it, which is a violation): wasted, but explained by a race.
    pub stale_refetches: u64,
    /// Peer answers by (answering node, how they ended: `Block` or an observation).
    pub peer_answers: std::collections::BTreeMap<(usize, String), u64>,
    /// Peer requests that timed out, by (asking node, answering node).
    pub peer_timeouts: std::collections::BTreeMap<(usize, usize), u64>,
    /// Liveness reads that did not complete in time, described.
    pub liveness_failures: Vec<String>,
    /// Every object's versions, oldest first (the last is the one the origin served at the end).
    pub versions: Vec<Vec<crate::origin::Version>>,
    /// The trace lines, when recorded.
    pub trace: Option<Vec<String>>,
}

impl NodeReport {
    /// The member ids of the final view (empty while down or without a peer path).
    pub fn view_ids(&self) -> Vec<String> {
        self.view
            .as_ref()
            .map_or(Vec::new(), |v| v.members().iter().map(|m| m.id.clone()).collect())
    }
}

impl RunReport {
    /// No invariant failed and every liveness read completed.
    pub fn passed(&self) -> bool {
        self.violation.is_none() && self.liveness_failures.is_empty()
    }

    /// Reads of one phase.
    pub fn phase(&self, phase: Phase) -> impl Iterator<Item = &ReadRecord> {
        self.reads.iter().filter(move |r| r.phase == phase)
    }

    /// A one-line summary.
    pub fn summary(&self) -> String {
        let done = self.reads.iter().filter(|r| r.outcome.is_complete()).count();
        format!(
            "seed {} trace {:016x}: {} events, {} simulated, {done}/{} reads complete, origin {} requests {} bytes{}",
            self.seed,
            self.trace_hash,
            self.events,
            self.end,
            self.reads.len(),
            self.origin.requests,
            self.origin.body_bytes,
            match (&self.violation, self.liveness_failures.first()) {
                (Some(v), _) => format!(", VIOLATION {v}"),
                (None, Some(l)) => format!(", LIVENESS {l}"),
                (None, None) => String::new(),
            }
        )
    }
}
