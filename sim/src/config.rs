//! A run as a value: the cluster's shape, the shell's bounds, the phases, the workload and the
//! fault plan. Together with a seed it determines the run exactly.

use crate::fault::FaultPlan;
use crate::net::NetConfig;
use crate::origin::{ObjectDef, OriginConfig};
use crate::workload::Workload;
use dart_core::engine::EngineConfig;
use dart_core::geometry::Geometry;
use std::time::Duration;

/// The shell's bounds on every exchange (the values `net-tokio` uses, and seeds/peer.md §3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShellBounds {
    /// Origin dial bound.
    pub origin_dial: Duration,
    /// Origin response-head bound.
    pub origin_header: Duration,
    /// Origin whole-request bound.
    pub origin_request: Duration,
    /// Peer dial bound.
    pub peer_dial: Duration,
    /// Peer response-head bound.
    pub peer_header: Duration,
    /// Peer whole-request bound.
    pub peer_request: Duration,
}

impl Default for ShellBounds {
    fn default() -> Self {
        ShellBounds {
            origin_dial: Duration::from_secs(10),
            origin_header: Duration::from_secs(30),
            origin_request: Duration::from_secs(300),
            peer_dial: Duration::from_secs(1),
            peer_header: Duration::from_secs(10),
            peer_request: Duration::from_secs(30),
        }
    }
}

/// The cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterConfig {
    /// Number of nodes (a static member list).
    pub nodes: usize,
    /// Chunk and block sizes.
    pub geometry: Geometry,
    /// The origin's objects.
    pub objects: Vec<ObjectDef>,
    /// The network.
    pub net: NetConfig,
    /// The origin's timing.
    pub origin: OriginConfig,
    /// The shell's exchange bounds.
    pub bounds: ShellBounds,
    /// Blocks each node's cache holds.
    pub cache_blocks: usize,
    /// The peer path (`None`: every node reads the origin itself).
    pub peer: Option<crate::node::PeerConfig>,
    /// Relays stream blocks through as they arrive (the engine's `cut_through`); off, they
    /// store and forward whole blocks.
    pub cut_through: bool,
}

impl ClusterConfig {
    /// `nodes` nodes with the peer path (fanout 2, default breaker) on a data-centre network
    /// reading `objects`, with blocks of `block_bytes` and chunks of 64 blocks.
    pub fn new(nodes: usize, block_bytes: u64, objects: Vec<ObjectDef>) -> Self {
        let geometry = Geometry::new(block_bytes * 64, block_bytes).expect("valid geometry");
        ClusterConfig {
            nodes,
            geometry,
            objects,
            net: NetConfig::datacenter(),
            origin: OriginConfig::default(),
            bounds: ShellBounds::default(),
            cache_blocks: 1 << 20,
            peer: Some(crate::node::PeerConfig::default()),
            cut_through: true,
        }
    }

    /// The same cluster without the peer path: every node reads the origin itself.
    pub fn origin_only(mut self) -> Self {
        self.peer = None;
        self
    }

    /// The engine configuration every node runs.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            geometry: self.geometry,
            cut_through: self.cut_through,
            ..EngineConfig::default()
        }
    }
}

/// How thoroughly invariants are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckLevel {
    /// After every event, every state machine the event touched, plus all of them every
    /// [`FULL_CHECK_EVERY`] events and at the end.
    Touched,
    /// After every event, every state machine of every node.
    Full,
    /// The touched node's state machines every `every` events, all of them every
    /// [`FULL_CHECK_EVERY`] events and at the end (for speed runs; the other checks — every
    /// delivered and cached byte, heads, coalescing, timers — still run on every step).
    Sampled {
        /// Events between checks of the touched node.
        every: u64,
    },
}

/// Events between full sweeps at [`CheckLevel::Touched`].
pub const FULL_CHECK_EVERY: u64 = 4096;

/// The phases of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phases {
    /// Length of the safety phase: faults act within it and all heal at its end.
    pub safety: Duration,
    /// After healing, every liveness read must complete within this bound.
    pub liveness: Duration,
}

/// A whole run but its seed.
#[derive(Clone, Debug, PartialEq)]
pub struct SimSpec {
    /// The cluster.
    pub cluster: ClusterConfig,
    /// The reads.
    pub workload: Workload,
    /// The faults.
    pub plan: FaultPlan,
    /// The phases.
    pub phases: Phases,
    /// Invariant checking.
    pub check: CheckLevel,
    /// Keep the trace lines (not only their hash).
    pub record_trace: bool,
}
