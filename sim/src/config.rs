//! A run as a value: the cluster's shape, the nodes' bounds, the phases, the workload and the
//! fault plan. Together with a seed it determines the run exactly.

use dart_core::node::Access;
use dart_core::peer_auth::ClusterSecret;

/// The cluster secret every simulated node shares (its peer requests are signed and checked).
pub const SIM_CLUSTER_SECRET: &[u8] = b"dart-simulated-cluster-secret";
/// The Unix time (ms) every simulated node's wall clock starts at (2026-01-01T00:00:00Z).
pub const SIM_EPOCH_MS: u64 = 1_767_225_600_000;
use crate::fault::FaultPlan;
use crate::net::NetConfig;
use crate::origin::{ObjectDef, OriginConfig};
use crate::workload::Workload;
use dart_core::breaker::BreakerConfig;
use dart_core::engine::EngineConfig;
use dart_core::geometry::Geometry;
use dart_core::node::Bounds;
use std::time::Duration;

/// The peer path's settings (`None` in [`ClusterConfig`]: every node reads the origin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// Distribution-tree fanout (0: automatic, as the node's default; see `auto_fanout`).
    pub fanout: usize,
    /// HRW owners per chunk.
    pub replicas: usize,
    /// Breaker settings (the seed is replaced by one drawn from the node's RNG).
    pub breaker: BreakerConfig,
    /// Live membership (`None`: every node starts with the full static member list).
    pub discovery: Option<SimDiscovery>,
    /// The reader tree's tracker tick (`None`: the reader tree is off and every object's trees
    /// span every Ready member).
    pub reader_tree: Option<Duration>,
    /// The scored neighbours (`None`: off; the node's default is on, keeping 5).
    pub neighbours: Option<dart_core::overlay::set::Config>,
}

/// Live membership in the simulator: each node starts knowing only itself and runs the core's
/// discovery rounds over the simulated network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDiscovery {
    /// Where each node's seed addresses come from.
    pub seeds: SimSeeds,
    /// Refresh interval and forget-after.
    pub timing: dart_core::discovery::Timing,
    /// A node that restarts comes back under a new member id at its old address (a pod IP
    /// reused by another pod).
    pub new_id_on_restart: bool,
}

/// Seed addresses of simulated nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimSeeds {
    /// Node `i` is seeded with node `i + 1` only (the last with node 0): a cyclic list.
    Ring,
    /// A DNS name that resolves to the nodes running at that moment (a headless Service).
    Dns,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig {
            fanout: dart_core::engine::route::AUTO_FANOUT,
            replicas: 1,
            breaker: BreakerConfig::default(),
            discovery: None,
            reader_tree: Some(Duration::ZERO),
            neighbours: Some(dart_core::overlay::set::Config::default()),
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
    /// Every node's bounds (the node machine's exchange timers); the defaults are core's.
    pub bounds: Bounds,
    /// Blocks each node's cache holds.
    pub cache_blocks: usize,
    /// The peer path (`None`: every node reads the origin itself).
    pub peer: Option<PeerConfig>,
    /// Relays stream blocks through as they arrive (the engine's `cut_through`); off, they
    /// store and forward whole blocks.
    pub cut_through: bool,
    /// A cold client read deep in a block it leads the window of asks for its own span beside
    /// it (the engine's `lead_in`).
    pub lead_in: bool,
    /// How long a node trusts an object's size and validators before a revalidating probe (the
    /// engine's `revalidate_after`; the origin sends no `Cache-Control`).
    pub revalidate_after: Duration,
    /// The origin is declared public (`--public-upstream`): reads skip the credential check.
    /// Off by default, so every scenario runs the check of the node machine's access rules.
    pub public_origin: bool,
    /// How long a node trusts the origin's acceptance of a credential (`--credential-ttl`).
    pub credential_ttl: Duration,
    /// Longest share of peer fetches that may be hedged (`--hedge-ratio`; 0 disables hedging).
    pub hedge_ratio: f64,
    /// Every object is declared immutable (`--immutable` over the whole origin): never
    /// revalidated, and blocks a warm start kept are served.
    pub immutable: bool,
    /// Blocks a client read keeps in flight ahead of the one it serves when a miss goes to a
    /// peer (`--read-ahead`).
    pub read_ahead: usize,
    /// The same when a miss goes to the origin (`--origin-read-ahead`).
    pub origin_read_ahead: usize,
    /// Registry-mirror mode (`--registry http://origin.sim`): each object is a blob named by the
    /// SHA-256 of its bytes (one per object, in order), clients read
    /// `/v2/sim/o<index>/blobs/<digest>`, and whole reads are checked against the digest
    /// ([`ClusterConfig::registry`] sets it).
    pub blobs: Option<Vec<String>>,
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
            bounds: Bounds::default(),
            cache_blocks: 1 << 20,
            peer: Some(PeerConfig::default()),
            cut_through: true,
            lead_in: true,
            revalidate_after: dart_core::engine::DEFAULT_REVALIDATE_AFTER,
            public_origin: false,
            credential_ttl: dart_core::node::DEFAULT_CHECK_TTL,
            hedge_ratio: dart_core::engine::hedge::DEFAULT_HEDGE_RATIO,
            immutable: false,
            read_ahead: dart_core::engine::DEFAULT_READ_AHEAD,
            origin_read_ahead: dart_core::engine::DEFAULT_ORIGIN_READ_AHEAD,
            blobs: None,
        }
    }

    /// The same cluster as a registry mirror of the origin: every object becomes a blob named by
    /// the digest of its bytes (computed here, once: keep registry objects small).
    pub fn registry(mut self) -> Self {
        let contents = crate::content::Contents::new(self.geometry.block_bytes());
        let block = self.geometry.block_bytes();
        let digests = self
            .objects
            .iter()
            .map(|o| {
                let shape = o.shape();
                let blocks = o.size.div_ceil(block);
                let parts: Vec<bytes::Bytes> =
                    (0..blocks).map(|b| contents.window(shape, b * block, block)).collect();
                dart_core::registry::sha256_digest_parts(parts.iter().map(|p| &p[..]))
            })
            .collect();
        self.blobs = Some(digests);
        self
    }

    /// The upstream URL a client read of object `index` names: the registry blob URL in
    /// registry mode, else [`crate::origin::object_url`] signed by `signer` until `expires_ms`.
    pub fn object_url(&self, index: usize, signer: &str, expires_ms: u64) -> String {
        match &self.blobs {
            Some(digests) => crate::origin::blob_url(index, &digests[index]),
            None => crate::origin::object_url(index, signer, expires_ms),
        }
    }

    /// The client-plane request-target of a read of `url` (an [`Self::object_url`]).
    pub fn client_target(&self, url: &str) -> String {
        match &self.blobs {
            Some(_) => {
                let host = format!("http://{}", crate::origin::ORIGIN_HOST);
                url.strip_prefix(&host).expect("a blob URL of the origin").to_owned()
            }
            None => format!("/dart/{url}"),
        }
    }

    /// The same cluster without the peer path: every node reads the origin itself.
    pub fn origin_only(mut self) -> Self {
        self.peer = None;
        self
    }

    /// The access rules every node runs: the default policy and credential checks (the origin
    /// public if [`Self::public_origin`]), and a cluster secret on the peer plane.
    pub fn access(&self) -> Access {
        let public = if self.public_origin {
            vec![crate::origin::ORIGIN_HOST.parse().expect("a host pattern")]
        } else {
            Vec::new()
        };
        let peer_secret = ClusterSecret::from_bytes(SIM_CLUSTER_SECRET).expect("a valid secret");
        Access {
            public,
            peer_secret: Some(peer_secret),
            check_ttl: self.credential_ttl,
            ..Access::default()
        }
    }

    /// The engine configuration every node runs.
    pub fn engine(&self) -> EngineConfig {
        EngineConfig {
            geometry: self.geometry,
            cut_through: self.cut_through,
            lead_in: self.lead_in,
            revalidate_after: self.revalidate_after,
            hedge: self.hedge_ratio > 0.0,
            hedge_ratio: self.hedge_ratio,
            // The empty prefix: every object identity starts with it.
            immutable_prefixes: if self.immutable { vec![String::new()] } else { Vec::new() },
            read_ahead: self.read_ahead,
            origin_read_ahead: self.origin_read_ahead,
            ..EngineConfig::default()
        }
    }
}

/// How thoroughly invariants are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckLevel {
    /// After every event, every state machine the event touched, plus all of them every
    /// [`full_check_every`] events and at the end.
    Touched,
    /// After every event, every state machine of every node.
    Full,
    /// The touched node's state machines every `every` events, all of them every
    /// [`full_check_every`] events and at the end (for speed runs; the other checks — every
    /// delivered and cached byte, heads, coalescing, timers — still run on every step).
    Sampled {
        /// Events between checks of the touched node.
        every: u64,
    },
}

/// Events between full sweeps at [`CheckLevel::Touched`] and [`CheckLevel::Sampled`], for
/// clusters of up to [`FULL_CHECK_NODES`] nodes ([`full_check_every`]).
pub const FULL_CHECK_EVERY: u64 = 4096;

/// Cluster size per [`FULL_CHECK_EVERY`]: a sweep checks every node, so a larger cluster sweeps
/// proportionally less often and a sweep's cost per event stays flat with the cluster's size
/// (at 10,000 nodes a sweep every 4,096 events was a quarter of the run).
pub const FULL_CHECK_NODES: usize = 128;

/// Events between full sweeps for a cluster of `nodes`: [`FULL_CHECK_EVERY`] for every
/// [`FULL_CHECK_NODES`] nodes begun.
pub fn full_check_every(nodes: usize) -> u64 {
    FULL_CHECK_EVERY * nodes.div_ceil(FULL_CHECK_NODES).max(1) as u64
}

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
