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
mod tests;

pub use read::{
    block_verdict, Action, FetchedBlock, Method, Read, ReadError, ReadFailure, ReadRequest,
    ResponseHead, Verdict,
};

use crate::geometry::Geometry;
use crate::hash::{BlockKey, ChunkKey};
use crate::identity::{object_id, IdLayout, Namespace, ObjectId};
use origin::ProbeOutcome;
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
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    /// Chunk and block sizes (identical on every node of a cluster).
    pub geometry: Geometry,
    /// Chunk-key namespace.
    pub namespace: Namespace,
    /// Object-identity layout.
    pub layout: IdLayout,
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

    /// Which budget a block fetched by this node is charged to. A single node owns everything.
    pub fn class_of(&self, _key: &BlockKey) -> BlockClass {
        BlockClass::Owned
    }

    /// Starts a read; drive it with [`Read::poll_action`].
    pub fn begin_read(&mut self, request: ReadRequest) -> Read {
        Read::new(self, request)
    }

    fn learn(&mut self, id: &ObjectId, outcome: ProbeOutcome) {
        let info = match outcome {
            ProbeOutcome::Size(n) => ObjectInfo::Sized(n),
            ProbeOutcome::RangeBlind { .. } => ObjectInfo::RangeBlind,
        };
        self.stats.probes += 1;
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
        assert!(self.objects.len() <= OBJECTS_MAX);
        assert_eq!(self.objects.len(), self.object_order.len());
        for (seq, id) in &self.object_order {
            assert_eq!(self.objects.get(id).map(|e| e.seq), Some(*seq));
        }
    }
}
