//! One simulated node: the core's node machine ([`dart_core::node::Node`]) and a block cache,
//! plus what a driver keeps beside them: the inbound requests it handed the machine (local client
//! reads and peers' requests, each with what the oracle needs to judge its answer), the map from
//! the machine's exchanges to simulated calls, and the faults its peer plane is under.
//!
//! The machine makes every decision; this module is state and bounds only. `sim/` drives it.

use crate::cache::SimCache;
use crate::calls::CallId;
use crate::config::ClusterConfig;
use crate::fault::Lie;
use crate::workload::Expected;
use dart_core::breaker::{Breaker, BreakerEvent};
use dart_core::discovery::Seeds;
use dart_core::engine::resolve::UpstreamMode;
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig, EngineStats, Method, P2p};
use dart_core::hash::BlockKey;
use dart_core::membership::{Member, View};
use dart_core::node::{Bounds, Head, IoId, Node, NodeConfig, RequestId, REQUESTS_MAX};
use dart_core::rng::{self, Rng};
use dart_core::time::Instant;
use std::collections::BTreeMap;

pub use crate::config::PeerConfig;

/// The seed name of [`crate::config::SimSeeds::Dns`].
pub const DNS_NAME: &str = "dart.sim";

/// Most inbound requests (client and peer) a simulated node tracks at once.
pub const INBOUND_MAX: usize = REQUESTS_MAX;

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
pub fn tree_order(cluster: &ClusterConfig, object: usize, block: u64) -> Vec<usize> {
    let engine = Engine::new(cluster.engine());
    let key = engine.block_key(&engine.identify(&cluster.object_url(object, "x", 0)), block);
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

impl PeerFaults {
    /// The lie told in answers to block requests now, if any (the latest in force).
    pub fn answer_lie(&self) -> Option<Lie> {
        self.lies.iter().rev().copied().find(|l| l.in_answers())
    }
}

/// What the head of a client read turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientHead {
    /// No head yet.
    None,
    /// A block-path head the oracle accepted.
    Block,
    /// The origin's own head, proxied (the machine sent a passthrough exchange for this read).
    Passthrough {
        /// The origin's status.
        status: u16,
        /// The exchange whose body is piped, once the machine said so.
        piped: Option<IoId>,
    },
    /// An error answer (the machine's text reply).
    Error {
        /// Its status.
        status: u16,
        /// Its body so far.
        text: Vec<u8>,
    },
}

/// A local client's read handed to the machine.
#[derive(Clone, Debug)]
pub struct ClientRequest {
    /// Index of its record.
    pub record: usize,
    /// The object index.
    pub object: usize,
    /// GET or HEAD.
    pub method: Method,
    /// What it must answer.
    pub expected: Expected,
    /// The head, once sent.
    pub head: ClientHead,
    /// Absolute offset of the next body byte.
    pub next_offset: u64,
    /// Body bytes delivered (block path or piped).
    pub bytes: u64,
    /// The machine's [`dart_core::node::Event::Failed`] for it, if any.
    pub failure: Option<(u16, String)>,
    /// The machine sent a passthrough exchange for it (its head is then the origin's).
    pub passthrough: bool,
    /// The version of the object its head named; every body byte must be of it.
    pub version: Option<usize>,
    /// The digest of its body so far, when the machine asked the transport to hash it
    /// ([`dart_core::node::Output::Hash`]). The simulator checks every byte itself, so it
    /// delivers parts at once instead of holding the last back.
    pub hasher: Option<crate::content::BodyHash>,
}

/// A peer's request (simulated call `call`) handed to this node's machine, and its answer so far.
#[derive(Clone, Debug)]
pub struct PeerRequest {
    /// The call it arrived on.
    pub call: CallId,
    /// The block asked for, if the path named one.
    pub key: Option<BlockKey>,
    /// The head, once the machine sent it.
    pub head: Option<Head>,
    /// Body parts so far.
    pub body: Vec<bytes::Bytes>,
    /// Body bytes so far.
    pub body_len: u64,
    /// The head was put on the wire (the caller's call carries it).
    pub head_sent: bool,
    /// How the answer ended: `Some(true)` complete, `Some(false)` aborted.
    pub ended: Option<bool>,
    /// The lie told in the head of a stream, told again in its body.
    pub lie: Option<Lie>,
}

/// One simulated node.
pub struct SimNode {
    /// Index in the cluster.
    pub index: usize,
    /// Bumped at every crash; events of an older incarnation are void.
    pub incarnation: u32,
    /// The node machine; `None` while the process is down.
    pub machine: Option<Node>,
    /// The block cache.
    pub cache: SimCache,
    /// Peer-plane faults.
    pub peer_faults: PeerFaults,
    /// When the node's timer event is scheduled.
    pub timer_at: Option<Instant>,
    /// Breaker transitions seen so far, across incarnations.
    pub circuit_events: Vec<BreakerEvent<String>>,
    /// Membership views the machine moved to (discovery), with when, across incarnations.
    pub view_changes: Vec<(Instant, Vec<String>)>,
    /// Client reads in progress.
    pub clients: BTreeMap<RequestId, Box<ClientRequest>>,
    /// Peers' requests in progress.
    pub peers: BTreeMap<RequestId, PeerRequest>,
    /// The machine's exchanges in flight and the calls that carry them.
    pub exchanges: BTreeMap<IoId, CallId>,
    next_request: u64,
    engine: EngineConfig,
    bounds: Bounds,
    access: dart_core::node::Access,
    peer: Option<(PeerConfig, View)>,
    rng: Rng,
    /// How the client plane maps requests (the prefix API, or a registry mirror of the origin).
    mode: UpstreamMode,
    /// Computes block digests for every incarnation's machine.
    hasher: std::sync::Arc<dyn dart_core::integrity::BlockHasher>,
}

impl SimNode {
    /// A running node; with `peer` its engine takes the peer path over the view.
    pub fn new(
        index: usize,
        engine: EngineConfig,
        bounds: Bounds,
        access: dart_core::node::Access,
        cache_blocks: usize,
        peer: Option<(PeerConfig, View)>,
        rng: Rng,
    ) -> Self {
        let mut node = SimNode {
            index,
            incarnation: 0,
            machine: None,
            cache: SimCache::new(cache_blocks),
            peer_faults: PeerFaults::default(),
            timer_at: None,
            circuit_events: Vec::new(),
            view_changes: Vec::new(),
            clients: BTreeMap::new(),
            peers: BTreeMap::new(),
            exchanges: BTreeMap::new(),
            next_request: 0,
            engine,
            bounds,
            access,
            peer,
            rng,
            mode: UpstreamMode::prefix("dart"),
            hasher: std::sync::Arc::new(dart_core::integrity::Xxh3),
        };
        node.machine = Some(node.fresh_machine(Instant::ZERO));
        node
    }

    /// The same node hashing blocks with `hasher` (same digests, less work).
    pub fn with_hasher(
        mut self,
        hasher: std::sync::Arc<dyn dart_core::integrity::BlockHasher>,
    ) -> Self {
        if let Some(machine) = &mut self.machine {
            machine.set_block_hasher(hasher.clone());
        }
        self.hasher = hasher;
        self
    }

    /// The same node as a registry mirror of the origin (`--registry http://origin.sim`).
    pub fn registry_mode(mut self) -> Self {
        let upstream = format!("http://{}", crate::origin::ORIGIN_HOST);
        let registry = dart_core::registry::Registry::new(&upstream).expect("the origin's URL");
        self.mode = UpstreamMode::Registry { registry, prefix: "dart".into() };
        self.machine = Some(self.fresh_machine(Instant::ZERO));
        self
    }

    /// A machine as the process starts it: a fresh engine whose breaker's jitter descends from
    /// the node's RNG.
    fn fresh_machine(&mut self, now: Instant) -> Node {
        let mut engine = Engine::new(self.engine.clone());
        if let Some((peer, view)) = &self.peer {
            let placement =
                Placement::new(view.clone(), &member_id(self.index), peer.fanout, peer.replicas);
            let rng = rng::child(&mut self.rng, "breaker");
            let breaker =
                Breaker::with_rng(peer.breaker.clone(), rng).expect("valid breaker config");
            engine.enable_p2p(P2p { placement, breaker });
        }
        let config = NodeConfig {
            mode: self.mode.clone(),
            bounds: self.bounds,
            self_id: self.member_id(),
            advertise: member_addr(self.index),
            access: self.access.clone(),
        };
        let mut node = Node::new(engine, config).expect("valid bounds");
        node.set_block_hasher(self.hasher.clone());
        if let Some(d) = self.peer.as_ref().and_then(|(p, _)| p.discovery.as_ref()) {
            let seeds = match d.seeds {
                crate::config::SimSeeds::Ring => {
                    let nodes = self.peer.as_ref().map_or(1, |(_, v)| v.members().len());
                    Seeds::Static(vec![member_addr((self.index + 1) % nodes)])
                }
                crate::config::SimSeeds::Dns => Seeds::Dns { name: DNS_NAME.into(), port: 9000 },
            };
            node.enable_discovery(seeds, d.timing, now).expect("a peer path, an id, an address");
            let rng = rng::child(&mut self.rng, "broadcast");
            assert!(node.enable_broadcast_targets(rng, now), "a peer path and an id");
        }
        if let Some(config) = self.peer.as_ref().and_then(|(p, _)| p.neighbours) {
            let rng = rng::child(&mut self.rng, "neighbours");
            assert!(node.enable_neighbours(config, rng, now), "a peer path");
        }
        if let Some(tick) = self.peer.as_ref().and_then(|(p, _)| p.reader_tree) {
            assert!(node.enable_reader_tree(tick), "a peer path and an id");
        }
        // The wall clock every node reads (peer MACs carry it): the simulated epoch plus the
        // simulated time.
        let unix_ms = crate::config::SIM_EPOCH_MS + now.as_nanos() / 1_000_000;
        node.handle_input(dart_core::node::Input::WallClock { unix_ms }, now);
        node
    }

    /// This incarnation's member id: `n<index>`, or `n<index>.<incarnation>` when restarts take
    /// a new id.
    pub fn member_id(&self) -> String {
        let renamed = self
            .peer
            .as_ref()
            .and_then(|(p, _)| p.discovery.as_ref())
            .is_some_and(|d| d.new_id_on_restart);
        if renamed && self.incarnation > 0 {
            format!("{}.{}", member_id(self.index), self.incarnation)
        } else {
            member_id(self.index)
        }
    }

    /// The member ids in the machine's view (empty while down or without a peer path).
    pub fn view_ids(&self) -> Vec<String> {
        self.view().map_or(Vec::new(), |v| v.members().iter().map(|m| m.id.clone()).collect())
    }

    /// The current view (a clone sharing the member list), if running with a peer path.
    pub fn view(&self) -> Option<dart_core::membership::View> {
        let p2p = self.machine.as_ref().and_then(|m| m.engine().p2p());
        p2p.map(|p| p.placement.view().clone())
    }

    /// Whether the process is running.
    pub fn is_up(&self) -> bool {
        self.machine.is_some()
    }

    /// The machine. Panics while the process is down (a driver bug).
    pub fn machine(&mut self) -> &mut Node {
        self.machine.as_mut().expect("a running node")
    }

    /// The engine's counters (zero while down: the process's memory is gone).
    pub fn stats(&self) -> EngineStats {
        self.machine.as_ref().map(Node::stats).unwrap_or_default()
    }

    /// A fresh request id (unique per node, across incarnations).
    pub fn next_request_id(&mut self) -> RequestId {
        let id = RequestId(self.next_request);
        self.next_request += 1;
        id
    }

    /// The process dies: its machine (engine, breaker, requests, flights) is gone; the cache
    /// survives only if `keep_cache`. Returns the records of the client reads cut off and the
    /// calls the machine had in flight.
    pub fn crash(&mut self, keep_cache: bool) -> (Vec<usize>, Vec<CallId>) {
        let cut: Vec<usize> = self.clients.values().map(|c| c.record).collect();
        let calls: Vec<CallId> = self.exchanges.values().copied().collect();
        self.machine = None;
        self.incarnation += 1;
        self.clients.clear();
        self.peers.clear();
        self.exchanges.clear();
        self.timer_at = None;
        if keep_cache {
            self.cache.tear_newest();
        } else {
            self.cache.clear();
        }
        (cut, calls)
    }

    /// The process starts again with a fresh machine; a warm start drops torn writes.
    pub fn restart(&mut self, now: Instant) {
        self.cache.drop_torn();
        let mut machine = self.fresh_machine(now);
        // What the cache kept carries no version the new process knows; the store hashed its
        // intact bytes at open (`dart_net_tokio::store`: the digests of the slots it kept).
        let keys = self.cache.keys();
        let digests: Vec<_> = keys
            .iter()
            .filter_map(|k| Some((*k, self.hasher.digest(&self.cache.get(k)?))))
            .collect();
        machine.recovered_blocks(keys);
        machine.recovered_digests(digests);
        self.machine = Some(machine);
    }

    /// Asserts the node's invariants and the machine's own.
    pub fn check_invariants(&self) {
        self.cache.check_invariants();
        assert!(self.clients.len() + self.peers.len() <= INBOUND_MAX, "requests above bound");
        match &self.machine {
            None => {
                assert!(self.clients.is_empty() && self.peers.is_empty(), "requests while down");
                assert!(self.exchanges.is_empty(), "exchanges while down");
            }
            Some(machine) => {
                machine.check_invariants();
                self.cache.check_no_torn();
            }
        }
    }

    /// Asserts that the driver carries exactly the machine's exchanges (a sweep check: it lists
    /// them).
    pub fn check_exchanges(&self) {
        let Some(machine) = &self.machine else { return };
        let live: Vec<IoId> = machine.exchanges().into_iter().map(|(io, _, _)| io).collect();
        assert!(
            live.iter().copied().eq(self.exchanges.keys().copied()),
            "the machine's exchanges {live:?} and the driver's calls {:?} disagree",
            self.exchanges
        );
    }
}
