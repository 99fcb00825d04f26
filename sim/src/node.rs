//! One simulated node: the real core [`Engine`] and its [`Read`]s, a block cache, and the shell
//! state production keeps beside them (the origin flight table and who waits on which flight).
//! The behaviour that drives these lives in `shell.rs`; this module is the state and its bounds.

use crate::cache::SimCache;
use crate::calls::CallId;
use crate::fault::Lie;
use crate::workload::Expected;
use bytes::Bytes;
use dart_core::breaker::{Breaker, BreakerConfig, BreakerEvent, Permit};
use dart_core::engine::flight::{FlightId, FlightTable, DEFAULT_MAX_FLIGHT};
use dart_core::engine::route::Placement;
use dart_core::engine::{BlockClass, Engine, EngineConfig, Method, P2p, Read, ResponseHead};
use dart_core::hash::BlockKey;
use dart_core::membership::{Member, View};
use dart_core::rng::{self, Rng};
use dart_core::time::Instant;
use std::collections::BTreeMap;

/// Most reads one node drives at once.
pub const READS_PER_NODE_MAX: usize = 1 << 16;

/// A read's id, unique in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReadId(pub u64);

impl std::fmt::Display for ReadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// What a coalesced origin flight fetches (the shell's flight key: object identity, not URL).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FlightKey {
    /// The size probe of an object.
    Probe(String),
    /// A block window of an object.
    Block(String, u64, u64),
}

/// Compact trace form (the identity is the same for every window of an object).
impl std::fmt::Display for FlightKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlightKey::Probe(_) => f.write_str("probe"),
            FlightKey::Block(_, s, e) => write!(f, "{s}-{e}"),
        }
    }
}

/// How the leader of a block flight fills the cache before the flight ends.
#[derive(Clone, Copy, Debug)]
pub struct Fill {
    /// The block.
    pub key: BlockKey,
    /// Its geometry length.
    pub expected_len: u64,
    /// The object size the read knew.
    pub object_size: u64,
    /// Budget.
    pub class: BlockClass,
}

/// A caller waiting on a flight: its read and its own URL (for a refusal retry).
#[derive(Clone, Debug)]
pub struct Waiter {
    /// The read.
    pub read: ReadId,
    /// The read's own upstream URL.
    pub url: String,
}

/// A flight in progress.
#[derive(Clone, Debug)]
pub struct FlightState {
    /// Its key.
    pub key: FlightKey,
    /// Leader first, then joiners in arrival order.
    pub waiters: Vec<Waiter>,
    /// The leader's cache fill.
    pub fill: Option<Fill>,
}

/// The question a read waits on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// A size probe.
    Probe,
    /// An origin block fetch.
    Fetch,
    /// A peer block fetch.
    Peer,
    /// The verbatim passthrough exchange.
    Passthrough,
}

/// Whom a read answers.
#[derive(Debug)]
pub enum ReadKind {
    /// A local client.
    Client {
        /// Index of its record.
        record: usize,
        /// GET or HEAD.
        method: Method,
        /// What it must answer.
        expected: Expected,
        /// Absolute offset of the next byte to emit.
        next_offset: u64,
    },
    /// A peer's block request (call `call`), served by a relay read.
    Relay {
        /// The inbound call to answer.
        call: CallId,
        /// The block.
        key: BlockKey,
        /// The head, once emitted.
        head: Option<ResponseHead>,
        /// The body, once emitted.
        body: Option<Bytes>,
        /// The head went out ahead of the body (cut-through from an upstream peer).
        streaming: bool,
        /// The copy a cut-through relay kept of the block it streamed.
        copy: Option<Bytes>,
    },
}

/// One read in progress on a node.
pub struct ActiveRead {
    /// The core state machine.
    pub read: Read,
    /// Client or relay.
    pub kind: ReadKind,
    /// The object index.
    pub object: usize,
    /// The question outstanding.
    pub waiting: Option<Waiting>,
    /// The breaker permit of the peer request outstanding.
    pub permit: Option<Permit<String>>,
    /// The last fetched block was sliced from a Range-ignoring 200 (it must not be stored).
    pub last_range_ignored: bool,
    /// The last question answered was a cache look-up (no time has passed since).
    pub just_looked_up: bool,
}

impl ActiveRead {
    /// The client record, for a client read.
    pub fn record(&self) -> Option<usize> {
        match self.kind {
            ReadKind::Client { record, .. } => Some(record),
            ReadKind::Relay { .. } => None,
        }
    }
}

/// The peer path's settings (`None` in [`crate::ClusterConfig`]: every node reads the origin).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// Distribution-tree fanout.
    pub fanout: usize,
    /// HRW owners per chunk.
    pub replicas: usize,
    /// Breaker settings (the seed is replaced by one drawn from the node's RNG).
    pub breaker: BreakerConfig,
}

impl Default for PeerConfig {
    fn default() -> Self {
        PeerConfig { fanout: 2, replicas: 1, breaker: BreakerConfig::default() }
    }
}

/// Member id of node `i`.
pub fn member_id(i: usize) -> String {
    format!("n{i}")
}

/// Peer-plane address of node `i`.
pub fn member_addr(i: usize) -> String {
    format!("n{i}:9000")
}

/// The node index of a peer-plane address.
pub fn node_of_addr(addr: &str) -> Option<usize> {
    addr.strip_prefix('n')?.strip_suffix(":9000")?.parse().ok()
}

/// Node indices in the order the distribution tree of block `block` of object `object` (by
/// index) ranks them: position 0 is the root that fetches from the origin.
pub fn tree_order(cluster: &crate::ClusterConfig, object: usize, block: u64) -> Vec<usize> {
    let engine = Engine::new(cluster.engine());
    let key = engine.block_key(&engine.identify(&crate::origin::object_url(object, "x", 0)), block);
    let placement = Placement::new(static_view(cluster.nodes), &member_id(0), 2, 1);
    placement
        .ranked(key.chunk)
        .into_iter()
        .map(|id| id.trim_start_matches('n').parse().expect("member ids are n<index>"))
        .collect()
}

/// The static member list of `nodes` nodes.
pub fn static_view(nodes: usize) -> View {
    View::new((0..nodes).map(|i| Member::ready(&member_id(i), &member_addr(i))).collect())
}

/// Faults the node's peer plane is under (they take effect when the peer path exists).
#[derive(Clone, Debug, Default)]
pub struct PeerFaults {
    /// Stall faults in force.
    pub stalls: u32,
    /// Lies in force.
    pub lies: Vec<Lie>,
}

/// One node.
pub struct Node {
    /// Index in the cluster.
    pub index: usize,
    /// Bumped at every crash; calls of an older incarnation are void.
    pub incarnation: u32,
    /// The process is running.
    pub up: bool,
    /// The core engine.
    pub engine: Engine,
    /// The block cache.
    pub cache: SimCache,
    /// The origin flight table (the shell's coalescing).
    pub flights: FlightTable<FlightKey>,
    /// Waiters and fills of the flights in progress.
    pub flight_state: BTreeMap<FlightId, FlightState>,
    /// Leader calls in flight per block window (must never exceed one).
    pub leading: BTreeMap<FlightKey, u32>,
    /// Reads in progress.
    pub reads: BTreeMap<ReadId, ActiveRead>,
    /// Peer-plane faults.
    pub peer_faults: PeerFaults,
    /// When the node's timer event is scheduled.
    pub timer_at: Option<Instant>,
    /// Breaker transitions drained so far.
    pub circuit_events: Vec<BreakerEvent<String>>,
    config: EngineConfig,
    peer: Option<(PeerConfig, View)>,
    rng: Rng,
}

impl Node {
    /// A fresh node; with `peer` its engine takes the peer path over `view`.
    pub fn new(
        index: usize,
        config: EngineConfig,
        cache_blocks: usize,
        peer: Option<(PeerConfig, View)>,
        rng: Rng,
    ) -> Self {
        let mut node = Node {
            index,
            incarnation: 0,
            up: true,
            engine: Engine::new(config.clone()),
            cache: SimCache::new(cache_blocks),
            flights: FlightTable::new(DEFAULT_MAX_FLIGHT),
            flight_state: BTreeMap::new(),
            leading: BTreeMap::new(),
            reads: BTreeMap::new(),
            peer_faults: PeerFaults::default(),
            timer_at: None,
            circuit_events: Vec::new(),
            config,
            peer,
            rng,
        };
        node.engine = node.fresh_engine();
        node
    }

    /// An engine as the process starts it; its breaker's jitter descends from the node's RNG.
    fn fresh_engine(&mut self) -> Engine {
        let mut engine = Engine::new(self.config.clone());
        if let Some((peer, view)) = &self.peer {
            let placement =
                Placement::new(view.clone(), &member_id(self.index), peer.fanout, peer.replicas);
            let rng = rng::child(&mut self.rng, "breaker");
            let breaker =
                Breaker::with_rng(peer.breaker.clone(), rng).expect("valid breaker config");
            engine.enable_p2p(P2p { placement, breaker });
        }
        engine
    }

    /// The earliest deadline of the node's state machines (the breaker's probe deadlines).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.engine.p2p().and_then(|p| p.breaker.poll_timeout())
    }

    /// Fires the node's timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(p) = self.engine.p2p_mut() {
            if p.breaker.poll_timeout().is_some_and(|t| t <= now) {
                p.breaker.handle_timeout(now);
            }
        }
    }

    /// Drains the breaker's transition events into the node's history; returns how many.
    pub fn drain_events(&mut self) -> usize {
        let Some(p) = self.engine.p2p_mut() else { return 0 };
        let mut n = 0;
        while let Some(e) = p.breaker.poll_event() {
            self.circuit_events.push(e);
            n += 1;
        }
        n
    }

    /// Restarts the process with a fresh engine (its object table and breaker are gone).
    pub fn restart(&mut self) {
        self.cache.drop_torn();
        self.up = true;
        self.engine = self.fresh_engine();
    }

    /// The process dies: reads, flights and the engine's memory are gone; the cache survives only
    /// if `keep_cache`. Returns the records of the reads that were cut off.
    pub fn crash(&mut self, keep_cache: bool) -> Vec<usize> {
        let cut: Vec<usize> = self.reads.values().filter_map(ActiveRead::record).collect();
        self.up = false;
        self.incarnation += 1;
        self.reads.clear();
        self.flights = FlightTable::new(DEFAULT_MAX_FLIGHT);
        self.flight_state.clear();
        self.leading.clear();
        self.engine = Engine::new(self.config.clone());
        if keep_cache {
            self.cache.tear_newest();
        } else {
            self.cache.clear();
        }
        cut
    }

    /// Asserts the node's invariants and those of every core state machine it holds.
    pub fn check_invariants(&self) {
        self.engine.check_invariants();
        self.flights.check_invariants();
        self.cache.check_invariants();
        assert!(self.reads.len() <= READS_PER_NODE_MAX, "reads above their bound");
        assert_eq!(self.flights.len(), self.flight_state.len(), "a flight without waiters");
        assert!(self.leading.values().all(|&n| n == 1), "two leaders for one window");
        if !self.up {
            assert!(self.reads.is_empty() && self.flight_state.is_empty());
        }
        if self.up {
            self.cache.check_no_torn();
        }
        for r in self.reads.values() {
            match r.waiting {
                Some(Waiting::Passthrough) => assert!(r.read.is_done()),
                Some(Waiting::Probe | Waiting::Fetch | Waiting::Peer) => assert!(!r.read.is_done()),
                None => panic!("a read waits for nothing: {:?}", r.kind),
            }
            assert_eq!(
                r.permit.is_some(),
                r.waiting == Some(Waiting::Peer),
                "permit held iff asking a peer"
            );
        }
    }
}
