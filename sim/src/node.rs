//! One simulated node: the real core [`Engine`] and its [`Read`]s, a block cache, and the shell
//! state production keeps beside them (the origin flight table and who waits on which flight).
//! The behaviour that drives these lives in `shell.rs`; this module is the state and its bounds.

use crate::cache::SimCache;
use crate::fault::Lie;
use crate::workload::Expected;
use dart_core::engine::flight::{FlightId, FlightTable, DEFAULT_MAX_FLIGHT};
use dart_core::engine::{BlockClass, Engine, EngineConfig, Method, Read};
use dart_core::hash::BlockKey;
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
    /// The verbatim passthrough exchange.
    Passthrough,
}

/// One client read in progress on a node.
pub struct ActiveRead {
    /// The core state machine.
    pub read: Read,
    /// Index of its record.
    pub record: usize,
    /// The object index.
    pub object: usize,
    /// The read's upstream URL.
    pub url: String,
    /// GET or HEAD.
    pub method: Method,
    /// What it must answer.
    pub expected: Expected,
    /// Absolute offset of the next byte to emit.
    pub next_offset: u64,
    /// The question outstanding.
    pub waiting: Option<Waiting>,
    /// The last fetched block was sliced from a Range-ignoring 200 (it must not be stored).
    pub last_range_ignored: bool,
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
}

impl Node {
    /// A fresh node.
    pub fn new(index: usize, config: EngineConfig, cache_blocks: usize) -> Self {
        Node {
            index,
            incarnation: 0,
            up: true,
            engine: Engine::new(config),
            cache: SimCache::new(cache_blocks),
            flights: FlightTable::new(DEFAULT_MAX_FLIGHT),
            flight_state: BTreeMap::new(),
            leading: BTreeMap::new(),
            reads: BTreeMap::new(),
            peer_faults: PeerFaults::default(),
            timer_at: None,
        }
    }

    /// The earliest deadline of the node's state machines (none has timers yet: the breaker's
    /// probe deadlines join here with the peer path).
    pub fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    /// Fires the node's timers due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        debug_assert!(self.poll_timeout().is_none_or(|t| t > now));
    }

    /// The process dies: reads, flights and the engine's memory are gone; the cache survives only
    /// if `keep_cache`. Returns the records of the reads that were cut off.
    pub fn crash(&mut self, keep_cache: bool, config: EngineConfig) -> Vec<usize> {
        let cut: Vec<usize> = self.reads.values().map(|r| r.record).collect();
        self.up = false;
        self.incarnation += 1;
        self.reads.clear();
        self.flights = FlightTable::new(DEFAULT_MAX_FLIGHT);
        self.flight_state.clear();
        self.leading.clear();
        self.engine = Engine::new(config);
        if !keep_cache {
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
        for r in self.reads.values() {
            match r.waiting {
                Some(Waiting::Passthrough) => assert!(r.read.is_done()),
                Some(Waiting::Probe | Waiting::Fetch) => assert!(!r.read.is_done()),
                None => panic!("read {} waits for nothing", r.record),
            }
        }
    }
}
