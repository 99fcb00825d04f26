//! The block cache as the client plane sees it: the disk-backed [`crate::store::BlockStore`] in
//! production, a small in-memory map in simulations (turmoil stalls on blocking file I/O).

use bytes::Bytes;
use dart_core::engine::{BlockClass, Window};
use dart_core::hash::BlockKey;
use dart_core::integrity::BlockDigest;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Occupancy figures exported as `dart_store_*` metrics (the store's own figures).
pub use crate::store::StoreStats as CacheStats;
/// Disk health exported by `/healthz`, `/admin/stats` and the `dart_store_degraded` and
/// `dart_store_errors_total` metrics.
pub use crate::store::{HealthState, StoreHealth as CacheHealth};

/// A write-once block cache.
pub trait BlockCache: Send + Sync + 'static {
    /// A copy of the block's bytes, if held. May read the disk: call it off the async workers
    /// when [`BlockCache::blocking`].
    fn get(&self, key: &BlockKey) -> Option<Bytes>;
    /// The bytes of `window` of the block, if it is held with exactly `window.block_len` bytes;
    /// a store may read just those bytes. May read the disk, as [`BlockCache::get`].
    fn get_window(&self, key: &BlockKey, window: Window) -> Option<Bytes> {
        self.get(key).and_then(|b| window.slice(&b))
    }
    /// The answer to a look-up (of `window`, or of the whole block) when it needs no wait on the
    /// disk (a RAM hit, a key the index does not hold, and for the disk store a window of at most
    /// [`crate::store::WINDOW_NOW_MAX`] bytes the page cache holds); `None` when only a disk read
    /// can tell. Called under the node's lock.
    fn try_get_now(&self, key: &BlockKey, window: Option<Window>) -> Option<Option<Bytes>> {
        Some(match window {
            Some(w) => self.get_window(key, w),
            None => self.get(key),
        })
    }
    /// The answer to a look-up (of `window`, or of the whole block) when it needs no wait on the
    /// disk (a RAM hit, a miss, a disk hit the page cache holds); `None` when only a blocking
    /// read can tell. Called outside the node's lock, on an async worker.
    fn get_cached(&self, key: &BlockKey, window: Option<Window>) -> Option<Option<Bytes>> {
        let _ = (key, window);
        None
    }
    /// Whether `get` and `put` may block on the disk (the driver then runs them on the blocking
    /// pool).
    fn blocking(&self) -> bool {
        false
    }
    /// Offers a validated block; best effort (a refusal or an I/O error never fails a read).
    fn put(&self, key: BlockKey, data: &Bytes, class: BlockClass);
    /// [`BlockCache::put`] with the block's digest when the node has it
    /// ([`dart_core::node::Output::StorePut`]): a store that checksums what it writes uses it
    /// instead of hashing the bytes again. By default the digest is not used.
    fn put_digested(
        &self,
        key: BlockKey,
        data: &Bytes,
        class: BlockClass,
        digest: Option<BlockDigest>,
    ) {
        let _ = digest;
        self.put(key, data, class);
    }
    /// Drops a block (its object changed); no disk read or write, so callers may do it inline.
    fn delete(&self, key: &BlockKey);
    /// Occupancy.
    fn stats(&self) -> CacheStats;
    /// Whether the backing disk takes writes, and its I/O failure counts; a cache without a disk
    /// is always healthy.
    fn health(&self) -> CacheHealth {
        CacheHealth::default()
    }
    /// Releases what the store holds (files, the directory lock); later gets miss and puts are
    /// refused. Idempotent.
    fn close(&self) {}
    /// The blocks held before this process wrote any: called once at start, so that the node
    /// machine knows which blocks carry no version it can vouch for
    /// (`dart_core::node::Node::recovered_blocks`).
    fn kept_keys(&self) -> Vec<BlockKey>;

    /// The digests of the blocks [`BlockCache::kept_keys`] names, as far as the store knows
    /// them (`dart_core::node::Node::recovered_digests`).
    fn kept_digests(&self) -> Vec<(BlockKey, dart_core::integrity::BlockDigest)> {
        Vec::new()
    }
}

/// An unbounded-by-design in-memory cache for tests and simulations, write-once per key.
#[derive(Debug, Default)]
pub struct MemCache {
    blocks: Mutex<BTreeMap<BlockKey, Bytes>>,
}

impl MemCache {
    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.lock().expect("cache lock").len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl BlockCache for MemCache {
    fn get(&self, key: &BlockKey) -> Option<Bytes> {
        self.blocks.lock().expect("cache lock").get(key).cloned()
    }

    fn kept_keys(&self) -> Vec<BlockKey> {
        self.blocks.lock().expect("cache lock").keys().copied().collect()
    }

    fn put(&self, key: BlockKey, data: &Bytes, _class: BlockClass) {
        self.blocks.lock().expect("cache lock").entry(key).or_insert_with(|| data.clone());
    }

    fn delete(&self, key: &BlockKey) {
        self.blocks.lock().expect("cache lock").remove(key);
    }

    fn stats(&self) -> CacheStats {
        let n = self.len() as u64;
        CacheStats { owned_blocks: n, ..CacheStats::default() }
    }
}

impl BlockCache for crate::store::BlockStore {
    fn get(&self, key: &BlockKey) -> Option<Bytes> {
        crate::store::BlockStore::get(self, key)
    }

    fn kept_keys(&self) -> Vec<BlockKey> {
        self.disk_keys()
    }

    fn kept_digests(&self) -> Vec<(BlockKey, dart_core::integrity::BlockDigest)> {
        self.loaded_digests()
    }

    fn get_window(&self, key: &BlockKey, window: Window) -> Option<Bytes> {
        crate::store::BlockStore::get_window(
            self,
            key,
            window.start,
            window.len(),
            window.block_len,
        )
    }

    fn get_cached(&self, key: &BlockKey, window: Option<Window>) -> Option<Option<Bytes>> {
        let window = window.map(|w| (w.start, w.len(), w.block_len));
        crate::store::BlockStore::get_cached(self, key, window)
    }

    fn try_get_now(&self, key: &BlockKey, window: Option<Window>) -> Option<Option<Bytes>> {
        if let Some(w) = window.filter(|w| w.len() <= crate::store::WINDOW_NOW_MAX) {
            let w = (w.start, w.len(), w.block_len);
            return crate::store::BlockStore::get_window_now(self, key, w);
        }
        let held = crate::store::BlockStore::get_from_ram(self, key)?;
        Some(match window {
            Some(w) => held.and_then(|b| w.slice(&b)),
            None => held,
        })
    }

    fn blocking(&self) -> bool {
        true
    }

    fn put(&self, key: BlockKey, data: &Bytes, class: BlockClass) {
        self.put_digested(key, data, class, None);
    }

    fn put_digested(
        &self,
        key: BlockKey,
        data: &Bytes,
        class: BlockClass,
        digest: Option<BlockDigest>,
    ) {
        if let Err(e) = crate::store::BlockStore::put_bytes(self, key, data, class, digest) {
            // Best effort: the read already has its bytes.
            tracing::warn!(error = %e, block = %key, "cache insert failed");
        }
    }

    fn stats(&self) -> CacheStats {
        crate::store::BlockStore::stats(self)
    }

    fn health(&self) -> CacheHealth {
        crate::store::BlockStore::health(self)
    }

    fn delete(&self, key: &BlockKey) {
        crate::store::BlockStore::delete(self, key);
    }

    fn close(&self) {
        crate::store::BlockStore::close(self)
    }
}

/// Opens the disk-backed store for a node: cold (arenas truncated) unless `warm_start`, which
/// keeps verified blocks and drops torn ones (see [`crate::store`]); block data written around the
/// page cache unless `buffered_writes` ([`crate::store::StoreConfig::direct_writes`]).
pub fn open_disk_cache(
    dir: &std::path::Path,
    cache_bytes: u64,
    mem_bytes: u64,
    block_bytes: u64,
    owned_fraction: Option<f64>,
    warm_start: bool,
    buffered_writes: bool,
) -> Result<std::sync::Arc<crate::store::BlockStore>, crate::store::StoreError> {
    let mut config = crate::store::StoreConfig::new(dir, cache_bytes, mem_bytes, block_bytes);
    config.owned_fraction = owned_fraction;
    config.direct_writes = !buffered_writes;
    if warm_start {
        config.warm_start = crate::store::WarmStart::Verify;
    }
    crate::store::BlockStore::open(config).map(std::sync::Arc::new)
}
