//! The read-through engine: the sans-IO state machines that turn a client read into size probes,
//! cache look-ups and block fetches, and decide what may be cached.
//!
//! [`Engine`] is the per-node state shared by all reads: configuration, the object table (sizes
//! and Range-blind marks learnt by probes) and counters. A shell keeps one `Engine` behind a lock
//! and drives one [`Read`] per client request; see [`Read`] for the driving contract.

pub mod flight;
pub mod origin;
mod read;
pub mod resolve;
pub mod route;

#[cfg(test)]
mod p2p_tests;
#[cfg(test)]
mod tests;

pub use read::{
    block_verdict, Action, FetchedBlock, Method, PeerAnswer, Read, ReadError, ReadFailure,
    ReadRequest, ResponseHead, Verdict, Window,
};

use crate::breaker::{Admission, Breaker, Outcome, Permit};
use crate::geometry::Geometry;
use crate::hash::{BlockKey, ChunkKey};
use crate::identity::{object_id, IdLayout, Namespace, ObjectId};
use crate::time::Instant;
use origin::ProbeOutcome;
use route::{PeerRef, Placement};
use std::collections::BTreeMap;

/// Most objects whose probe result is remembered; past it the oldest entry is forgotten (a later
/// read probes again: one extra 1-byte request, never a wrong byte).
pub const OBJECTS_MAX: usize = 65_536;

/// Which budget a cached block is charged to (spec/store.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockClass {
    /// This node is an authoritative holder of the block's chunk.
    Owned,
    /// A copy made for a local client or a peer.
    Borrowed,
}

/// What the engine knows of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectInfo {
    /// The origin honours Range; the object has this many bytes.
    Sized(u64),
    /// The origin ignores Range: every read is proxied verbatim and nothing is cached.
    RangeBlind,
}

/// Engine configuration.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Chunk and block sizes (identical on every node of a cluster).
    pub geometry: Geometry,
    /// Chunk-key namespace.
    pub namespace: Namespace,
    /// Object-identity layout.
    pub layout: IdLayout,
    /// Relays stream a block from their upstream peer while receiving it (cut-through); off,
    /// they store and forward whole blocks (kept for comparison benchmarks).
    pub cut_through: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            geometry: Geometry::default(),
            namespace: Namespace::default(),
            layout: IdLayout::default(),
            cut_through: true,
        }
    }
}

/// Counters of what the engine decided; the shell exports them as metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Blocks served from the local cache.
    pub block_source_cache: u64,
    /// Blocks served from a peer.
    pub block_source_peer: u64,
    /// Blocks served from the origin (coalesced reads count).
    pub block_source_origin: u64,
    /// Bytes sent to clients on the block path.
    pub client_bytes: u64,
    /// Bytes received from the origin on the block path, coalesced results excluded.
    pub origin_bytes: u64,
    /// Size probes whose answer was used.
    pub probes: u64,
    /// Reads proxied verbatim to a Range-blind origin.
    pub passthrough: u64,
    /// Fetched blocks served but refused by the cache (Range-ignored bytes).
    pub uncacheable: u64,
    /// Cached blocks found with the wrong length (treated as misses).
    pub cache_corrupt: u64,
    /// Bytes received from peers on the block path.
    pub peer_bytes: u64,
    /// Peer blocks refused for their length (the peer's circuit opened).
    pub peer_wrong_length: u64,
    /// Escalations past a peer that failed (not counting 404s).
    pub peer_failover: u64,
    /// Upstream peers skipped because the breaker refused admission.
    pub peer_skipped_open: u64,
    /// Relay requests answered with a block.
    pub relay_served: u64,
    /// Relay requests declined (404).
    pub relay_declined: u64,
}

/// The peer half of an engine: where this node sits and which peers are failing.
pub struct P2p {
    /// Membership view, self id and tree parameters.
    pub placement: Placement,
    /// Per-peer circuits, keyed by peer address.
    pub breaker: Breaker<String>,
}

struct ObjectEntry {
    info: ObjectInfo,
    seq: u64,
}

/// Per-node engine state; see the module doc.
pub struct Engine {
    config: EngineConfig,
    objects: BTreeMap<String, ObjectEntry>,
    object_order: BTreeMap<u64, String>,
    next_seq: u64,
    stats: EngineStats,
    p2p: Option<P2p>,
}

impl Engine {
    /// A fresh engine.
    pub fn new(config: EngineConfig) -> Self {
        Engine {
            config,
            objects: BTreeMap::new(),
            object_order: BTreeMap::new(),
            next_seq: 0,
            stats: EngineStats::default(),
            p2p: None,
        }
    }

    /// Turns on the peer path: misses go to this node's tree ancestors before the origin.
    pub fn enable_p2p(&mut self, p2p: P2p) {
        self.p2p = Some(p2p);
    }

    /// The peer half, if enabled (the shell drives the breaker's timers and events through it).
    pub fn p2p_mut(&mut self) -> Option<&mut P2p> {
        self.p2p.as_mut()
    }

    /// The peer half, if enabled.
    pub fn p2p(&self) -> Option<&P2p> {
        self.p2p.as_ref()
    }

    /// Starts serving a peer's request for `key` after [`route::relay_check`] accepted it:
    /// `url` is `Some` for fetch-on-behalf (with the hop to send upstream), `None` for cache-only.
    pub fn begin_relay(&mut self, key: BlockKey, url: Option<String>, next_hop: u64) -> Read {
        Read::relay(self, key, url, next_hop)
    }

    /// Counts a relay request declined by [`route::relay_check`] before any work.
    pub fn note_relay_declined(&mut self) {
        self.stats.relay_declined += 1;
    }

    /// Reports a peer request whose task went away without an answer.
    pub fn abandon(&mut self, permit: Permit<String>, now: Instant) {
        self.complete(permit, Outcome::Abandoned, now);
    }

    pub(crate) fn admit(&mut self, addr: &String, now: Instant) -> Option<Permit<String>> {
        let p2p = self.p2p.as_mut()?;
        match p2p.breaker.begin_data(addr, now) {
            Admission::Admitted(permit) => Some(permit),
            Admission::Rejected => None,
        }
    }

    fn complete(&mut self, permit: Permit<String>, outcome: Outcome, now: Instant) {
        match self.p2p.as_mut() {
            Some(p2p) => {
                p2p.breaker.complete(permit, outcome, now);
            }
            None => unreachable!("permits exist only with the peer path"),
        }
    }

    fn upstreams(&self, key: BlockKey, now: Instant) -> Vec<PeerRef> {
        match &self.p2p {
            Some(p2p) => p2p
                .placement
                .upstreams(key.chunk, |addr| p2p.breaker.healthy(&addr.to_owned(), now)),
            None => Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// The identity of the object at `url`.
    pub fn identify(&self, url: &str) -> ObjectId {
        object_id(url, self.config.layout)
    }

    /// The key of global block `block` of object `id`.
    pub fn block_key(&self, id: &ObjectId, block: u64) -> BlockKey {
        let chunk = self.config.geometry.chunk_of_block(block);
        let chunk = i64::try_from(chunk).expect("chunk index of a legal block fits i64");
        BlockKey { chunk: ChunkKey::new(self.config.namespace.as_str(), &id.id, chunk), block }
    }

    /// What is known of object `id`.
    pub fn object(&self, id: &ObjectId) -> Option<ObjectInfo> {
        self.objects.get(&id.id).map(|e| e.info)
    }

    /// Which budget a block fetched by this node is charged to: owned iff this node is among the
    /// chunk's HRW owners; a single node owns everything.
    pub fn class_of(&self, key: &BlockKey) -> BlockClass {
        match &self.p2p {
            Some(p2p) => p2p.placement.class_of(key.chunk),
            None => BlockClass::Owned,
        }
    }

    /// Starts a read; drive it with [`Read::poll_action`].
    pub fn begin_read(&mut self, request: ReadRequest) -> Read {
        Read::new(self, request)
    }

    /// Records what a probe of object `id` established, as a read's own probe answer does. The
    /// shell's probe flight calls this before the flight ends, so that a read arriving after the
    /// flight finds the size instead of probing again.
    pub fn record_probe(&mut self, id: &ObjectId, outcome: ProbeOutcome) {
        self.learn(id, outcome);
    }

    fn learn(&mut self, id: &ObjectId, outcome: ProbeOutcome) {
        let info = match outcome {
            ProbeOutcome::Size(n) => ObjectInfo::Sized(n),
            ProbeOutcome::RangeBlind { .. } => ObjectInfo::RangeBlind,
        };
        if let Some(old) = self.objects.remove(&id.id) {
            self.object_order.remove(&old.seq);
        }
        if self.objects.len() >= OBJECTS_MAX {
            if let Some((_, oldest)) = self.object_order.pop_first() {
                self.objects.remove(&oldest);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.objects.insert(id.id.clone(), ObjectEntry { info, seq });
        self.object_order.insert(seq, id.id.clone());
    }

    /// Asserts the engine's invariants.
    pub fn check_invariants(&self) {
        if let Some(p2p) = &self.p2p {
            // The view is immutable and checked when built (`View::new`).
            p2p.breaker.check_invariants();
        }
        assert!(self.objects.len() <= OBJECTS_MAX);
        assert_eq!(self.objects.len(), self.object_order.len());
        for (seq, id) in &self.object_order {
            assert_eq!(self.objects.get(id).map(|e| e.seq), Some(*seq));
        }
    }
}
