//! Block store: a RAM hot set in front of two disk arenas (owned and borrowed budgets) holding
//! fixed-size blocks of immutable objects (spec/store.md).
//!
//! # Shape
//!
//! - Two physically separate arena files, `<cache-dir>/blocks.owned` and
//!   `<cache-dir>/blocks.borrowed`, each a preallocated file of equal slots with an in-memory index,
//!   LRU list and free list (see `arena.rs`). Borrowed churn can never evict an owned block.
//! - The owned budget always admits; the borrowed budget admits by TinyLFU once full (`sketch.rs`):
//!   a candidate enters only if its estimated popularity is at least the LRU victim's. The compare,
//!   the eviction and the new block's reservation of the slot are one critical section on the
//!   borrowed arena's lock (its bytes are written after it: see Concurrency).
//! - A RAM tier of recycled slabs with plain LRU, write-through: a put goes to disk first and is
//!   then mirrored into RAM; a get prefers RAM and promotes a disk hit into RAM. It is off when
//!   the RAM budget is below one block.
//! - Write-once per key across all tiers: re-putting a key keeps the first bytes and refreshes
//!   recency. Blocks are immutable content, so two *concurrent* first puts of one key with
//!   different bytes are a caller bug; sequentially the first bytes always win.
//!
//! # Crash safety: both options, chosen by [`WarmStart`]
//!
//! A torn or partial write is never served. Within a process, a slot's key is published in the
//! index only after its write completed, and a slot is unpublished before it is rewritten, so a
//! recycled slot is never readable under its old key; [`BlockStore::get`] returns a copy.
//! Across a restart:
//!
//! - [`WarmStart::Cold`] (default, like DART): both arenas are truncated on open and the store
//!   starts empty; no slot headers are written and no checksum is computed.
//! - [`WarmStart::Verify`]: every slot carries a header (key, length, write sequence, FNV-1a 64 of
//!   key + length + the bytes' XXH3-128 digest, and a checksum of the header itself), zeroed
//!   before the slot is reused.
//!   An open keeps the slots that verify, in their write order, and drops the rest; a changed
//!   geometry or a foreign file rebuilds the arena empty. Costs: one checksum pass per put (outside
//!   the locks) and a full read of the arenas at start-up. Note that verified blocks, including
//!   bytes fetched with credentials, survive a restart.
//!
//! # Concurrency
//!
//! [`BlockStore`] is `Sync` and meant to be shared as `Arc<BlockStore>`. Each tier has its own
//! `std::sync::Mutex` and no operation holds two of them at once. No disk wait of a block happens
//! under an arena's lock: a read that may wait for the disk ([`BlockStore::get`],
//! [`BlockStore::get_window`]) pins its slot under the lock and reads outside it (an insert never
//! takes a pinned slot, so no slot is recycled mid-read), and a put reserves a slot under the lock
//! (a reserved slot is neither free nor published: no read or other insert touches it), writes the
//! bytes outside it, and publishes the key under it again; a delete of a key being written wins
//! (the write is then not published). So reads and writes of one arena overlap. Block writes into
//! one arena's file are one at a time, behind a leaf lock of their own (the file system serializes
//! buffered writes of a file anyway, and a writer waiting there spins on a CPU); block data goes
//! to the disk around the page cache (`O_DIRECT`) unless [`StoreConfig::direct_writes`] is off or
//! the file system refuses it, headers through it (the arena's `Writer`). Inside the lock
//! stay the bookkeeping, a read answered from the page cache (`preadv2` with `RWF_NOWAIT`, bounded
//! by a copy) and a 64-byte header invalidation (the read of a borrowed block that an owned put
//! moves over is pinned too). Whether a key is held can be asked without the arena's lock: each
//! arena keeps its published keys in a set of their own, a leaf lock taken only for a set
//! operation (inside the arena's when the index changes, alone when asked), so
//! [`BlockStore::get_from_ram`], which the driver calls under the node's lock, never waits for an
//! arena's lock. The store never blocks on anything but its own locks and the file system; it
//! does not depend on tokio.
//!
//! # Degraded mode
//!
//! A disk that fills up, turns read-only or fails at run time never fails a read and never
//! panics. A failed write drops that put (the arena frees the slot, so nothing half-written is ever
//! readable) and the store becomes [`HealthState::Degraded`] with the reason. While degraded it
//! writes no new blocks to disk except one probe every [`PROBE_INTERVAL`] (a deadline it keeps,
//! looked at when a put comes; no thread), keeps serving the RAM tier and every disk block that
//! still reads, and still mirrors puts into RAM. The first successful probe ends degraded mode. A
//! read that fails is a miss that drops its slot. A deleted cache directory fails no call (the
//! open files live on, unlinked), so a write checks once per interval that the files are still
//! linked; if not, the store stays degraded until a restart recreates them. All file I/O of the
//! arenas goes through the [`StoreIo`] seam, which tests replace with [`FaultyIo`].
//!
//! One process per cache directory: [`BlockStore::open`] takes an exclusive lock on
//! `<cache-dir>/.dart.lock` before touching either arena. Foreign files in the directory are
//! neither read nor removed.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod arena;
mod config;
mod dirlock;
mod error;
mod faults;
mod health;
mod io;
mod lru;
mod mem;
mod tiered;

#[cfg(test)]
mod degraded_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use dart_core::hash::BlockKey;

pub use config::{StoreConfig, WarmStart, DEFAULT_OWNED_FRACTION, MAX_BLOCK_BYTES, MAX_SLOTS};
pub use error::StoreError;
pub use faults::{Fault, FaultyIo};
pub use health::{DegradedReason, HealthState, StoreHealth, PROBE_INTERVAL};
pub use io::{OsIo, StoreIo};

use arena::{checksum_of_digest, slot_checksum};
use config::Budgets;
use mem::MemTier;
use tiered::{lock, PutOutcome, Tiered};

/// Which disk budget a block is put into; the core decides (`Engine::class_of`).
pub use dart_core::engine::BlockClass;

/// The largest window the driver reads from the page cache under the node's lock
/// ([`BlockStore::get_window_now`]); larger reads leave the lock first.
pub const WINDOW_NOW_MAX: u64 = 256 << 10;

/// Occupancy and admission counters, cheap to sample at scrape time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Blocks in the owned arena.
    pub owned_blocks: u64,
    /// Slots of the owned arena.
    pub owned_slots: u64,
    /// Blocks in the borrowed arena.
    pub borrowed_blocks: u64,
    /// Slots of the borrowed arena.
    pub borrowed_slots: u64,
    /// Blocks in the RAM tier.
    pub mem_blocks: u64,
    /// Slots of the RAM tier (0 when it is off).
    pub mem_slots: u64,
    /// Borrowed puts refused by TinyLFU admission since open.
    pub admit_rejected: u64,
    /// Disk-tier reads of block bytes since open answered from an arena file's mapping, without
    /// a copy (windows, and whole blocks when there is no RAM tier, whose pages were cached).
    pub disk_reads_mapped: u64,
    /// Disk-tier reads since open copied from the page cache without waiting for the disk.
    pub disk_reads_page_cache: u64,
    /// Disk-tier reads since open made the way that may wait for the disk (the blocking pool).
    pub disk_reads_blocking: u64,
}

/// The block store: RAM hot set, owned arena and borrowed arena behind one `&self` API.
#[derive(Debug)]
pub struct BlockStore {
    dir: PathBuf,
    block_bytes: u64,
    /// Whether puts compute checksums for slot headers ([`WarmStart::Verify`]).
    verify: bool,
    disk: Tiered,
    /// `None` when the RAM budget is below one block.
    mem: Option<Mutex<MemTier>>,
    mem_slots: u32,
    admit_rejected: AtomicU64,
    closed: AtomicBool,
    /// The held directory lock; dropped by [`BlockStore::close`].
    dir_lock: Mutex<Option<File>>,
}

impl BlockStore {
    /// Validates `config`, creates and locks the cache directory, then opens both arenas.
    ///
    /// Every configuration error is reported before any file is touched, and the directory lock is
    /// taken before either arena is opened (a cold open truncates them).
    pub fn open(config: StoreConfig) -> Result<BlockStore, StoreError> {
        BlockStore::open_with_io(config, Arc::new(OsIo))
    }

    /// [`BlockStore::open`] with the arenas' file I/O and probe clock going through `io` (tests
    /// inject faults with [`FaultyIo`]; production uses [`OsIo`]).
    pub fn open_with_io(
        config: StoreConfig,
        io: Arc<dyn StoreIo>,
    ) -> Result<BlockStore, StoreError> {
        let budgets = Budgets::from_config(&config)?;
        let dir_lock = dirlock::acquire(&config.dir)?;
        let (disk, [owned, borrowed]) =
            Tiered::open(&config.dir, &budgets, config.warm_start, config.direct_writes, io)?;
        let block_bytes = usize::try_from(budgets.block_bytes).expect("block size fits in memory");
        let mem = (budgets.mem_slots >= 1)
            .then(|| Mutex::new(MemTier::new(budgets.mem_slots, block_bytes)));
        tracing::info!(
            dir = %config.dir.display(),
            block_bytes = budgets.block_bytes,
            owned_slots = budgets.owned_slots,
            borrowed_slots = budgets.borrowed_slots,
            mem_slots = budgets.mem_slots,
            warm_start = ?config.warm_start,
            kept = owned.kept + borrowed.kept,
            dropped = owned.dropped + borrowed.dropped,
            rebuilt = owned.rebuilt || borrowed.rebuilt,
            direct_writes = disk.writes_direct(),
            "block store open",
        );
        Ok(BlockStore {
            dir: config.dir,
            block_bytes: budgets.block_bytes,
            verify: config.warm_start == WarmStart::Verify,
            disk,
            mem,
            mem_slots: budgets.mem_slots,
            admit_rejected: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            dir_lock: Mutex::new(Some(dir_lock)),
        })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The block (slot) size in bytes.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// A copy of `key`'s bytes, or `None` if absent (or closed). Prefers RAM; a disk hit is
    /// promoted into RAM. The copy is the caller's: no later eviction can change it.
    pub fn get(&self, key: &BlockKey) -> Option<Bytes> {
        if self.is_closed() {
            return None;
        }
        if let Some(bytes) = self.ram_hit(key) {
            return Some(bytes);
        }
        let bytes = self.disk.get(key)?;
        if let Some(mem) = &self.mem {
            lock(mem).put(*key, &bytes);
        }
        Some(bytes)
    }

    /// A look-up answered without reading the disk and without waiting for a disk write in
    /// progress (the driver asks it under the node's lock): `Some(Some(bytes))` for a RAM hit,
    /// `Some(None)` when no tier holds `key`, `None` when only a disk read ([`BlockStore::get`])
    /// can answer. A RAM hit refreshes the disk copy's recency only if nothing holds its arena's
    /// lock now (`Tiered::try_touch`); a block being written is not yet held (the driver answers it
    /// from its pending puts).
    pub fn get_from_ram(&self, key: &BlockKey) -> Option<Option<Bytes>> {
        if self.is_closed() {
            return Some(None);
        }
        if let Some(bytes) = self.mem.as_ref().and_then(|mem| lock(mem).get(key)) {
            self.disk.try_touch(key);
            return Some(Some(bytes));
        }
        if self.disk.contains_now(key) {
            None
        } else {
            Some(None)
        }
    }

    /// [`BlockStore::get_from_ram`] for a window of `key`'s block (`(start, len, block_len)`),
    /// answering a disk hit too when the page cache holds its bytes (`preadv2` with `RWF_NOWAIT`)
    /// and nothing holds its arena's lock: like `get_from_ram` it never waits for the disk, and the
    /// driver asks it under the node's lock for windows up to [`WINDOW_NOW_MAX`] bytes, so that a
    /// small disk hit is answered in the step that asked (the hop out of the lock and back in
    /// cost more than the copy: with this, 7 % more hot 64 KiB disk-tier hits per second, faster
    /// in 10 of 10 side-by-side pairs, and 8 % more random ones, 9 of 10). `None` when only a
    /// blocking read can answer.
    pub fn get_window_now(
        &self,
        key: &BlockKey,
        (start, len, block_len): (u64, u64, u64),
    ) -> Option<Option<Bytes>> {
        if !window_valid(start, len, block_len) {
            return Some(None);
        }
        match self.get_from_ram(key) {
            Some(Some(bytes)) => Some(window_of(&bytes, start, len, block_len)),
            Some(None) => Some(None),
            None => self.disk.get_cached(key, Some((start, len, block_len))),
        }
    }

    /// [`BlockStore::get`] (`window` `None`) or [`BlockStore::get_window`] (`window` =
    /// `(start, len, block_len)`) when it needs no wait: a RAM hit, a miss, or a disk hit whose
    /// bytes the page cache holds (read at once, `preadv2` with `RWF_NOWAIT`). `None` when only a
    /// blocking read can answer: the bytes are not cached, or another operation holds the arena's
    /// lock. A whole block read so is promoted into RAM, as by `get`.
    pub fn get_cached(
        &self,
        key: &BlockKey,
        window: Option<(u64, u64, u64)>,
    ) -> Option<Option<Bytes>> {
        if self.is_closed() {
            return Some(None);
        }
        if window.is_some_and(|(start, len, block_len)| !window_valid(start, len, block_len)) {
            return Some(None);
        }
        if let Some(bytes) = self.ram_hit(key) {
            return Some(match window {
                None => Some(bytes),
                Some((start, len, block_len)) => window_of(&bytes, start, len, block_len),
            });
        }
        let found = self.disk.get_cached(key, window)?;
        if let (None, Some(bytes), Some(mem)) = (window, &found, &self.mem) {
            lock(mem).put(*key, bytes);
        }
        Some(found)
    }

    /// Bytes `start..start + len` of `key`'s block, if it is held with exactly `block_len` bytes.
    /// A RAM hit is a slice of the held block; a disk hit reads only those bytes (and, unlike
    /// [`BlockStore::get`], is not promoted into RAM: only whole-block reads are).
    pub fn get_window(
        &self,
        key: &BlockKey,
        start: u64,
        len: u64,
        block_len: u64,
    ) -> Option<Bytes> {
        if self.is_closed() || !window_valid(start, len, block_len) {
            return None;
        }
        if let Some(bytes) = self.ram_hit(key) {
            return window_of(&bytes, start, len, block_len);
        }
        self.disk.get_window(key, start, len, block_len)
    }

    /// A RAM-tier hit of `key`, refreshing the disk copy's recency; `None` when the tier is off
    /// or does not hold it.
    fn ram_hit(&self, key: &BlockKey) -> Option<Bytes> {
        // The tier's lock is released before the disk's is taken.
        let bytes = lock(self.mem.as_ref()?).get(key)?;
        self.disk.touch(key);
        Some(bytes)
    }

    /// Stores `data` under `key` in the budget of `class`, and mirrors it into RAM.
    ///
    /// Returns whether the block is now cached (`false` only when TinyLFU refused a borrowed block,
    /// or the disk is degraded, and the RAM tier is off). A present key keeps its bytes and only
    /// has its recency refreshed. Errors: an empty block, a block larger than a slot, a closed
    /// store, or a failed disk write (the block is then neither on disk nor newly in RAM, and the
    /// store is degraded).
    pub fn put(&self, key: BlockKey, data: &[u8], class: BlockClass) -> Result<bool, StoreError> {
        self.put_bytes(key, &Bytes::copy_from_slice(data), class, None)
    }

    /// [`BlockStore::put`] of a shared buffer: the RAM tier keeps a handle on a block-sized
    /// `data` instead of a copy (the read path's blocks arrive so). `digest`, when given, must be
    /// [`dart_core::integrity::xxh3_128`] of `data` (the node's, `Output::StorePut`): under
    /// `--warm-start` the slot checksum is made from it instead of hashing the bytes again.
    pub fn put_bytes(
        &self,
        key: BlockKey,
        data: &Bytes,
        class: BlockClass,
        digest: Option<dart_core::integrity::BlockDigest>,
    ) -> Result<bool, StoreError> {
        if self.is_closed() {
            return Err(StoreError::Closed);
        }
        if data.is_empty() {
            return Err(StoreError::EmptyBlock);
        }
        let len = data.len() as u64;
        if len > self.block_bytes {
            return Err(StoreError::BlockTooLarge { len, slot_bytes: self.block_bytes });
        }
        // Write-once across tiers: a RAM-only copy's bytes are the ones the disk gets.
        let in_ram = self.mem.as_ref().and_then(|mem| lock(mem).get(&key));
        let data = in_ram.as_ref().unwrap_or(data);
        // The node's digest is of `data` as given, not of a RAM-tier copy put in its place.
        let data_sum = self.verify.then(|| match digest.filter(|_| in_ram.is_none()) {
            Some(digest) => {
                debug_assert_eq!(digest, dart_core::integrity::xxh3_128(data), "a put's digest");
                checksum_of_digest(&key, len, digest)
            }
            None => slot_checksum(&key, data),
        });
        let outcome = self.disk.put(key, data, data_sum, class)?;
        if outcome == PutOutcome::Refused {
            self.admit_rejected.fetch_add(1, Ordering::Relaxed);
        }
        let in_ram_now = match outcome {
            PutOutcome::Inserted | PutOutcome::Refused | PutOutcome::Skipped => {
                self.mem.as_ref().is_some_and(|mem| lock(mem).put(key, data))
            }
            PutOutcome::Refreshed | PutOutcome::Promoted => false,
        };
        let on_disk = match outcome {
            PutOutcome::Inserted | PutOutcome::Refreshed | PutOutcome::Promoted => true,
            PutOutcome::Refused | PutOutcome::Skipped => false,
        };
        Ok(on_disk || in_ram_now)
    }

    /// Whether `key` is cached in any tier; touches neither recency nor the estimator.
    pub fn has(&self, key: &BlockKey) -> bool {
        if self.is_closed() {
            return false;
        }
        self.mem.as_ref().is_some_and(|mem| lock(mem).contains(key)) || self.disk.contains(key)
    }

    /// Drops `key` from every tier; returns whether any tier held it.
    pub fn delete(&self, key: &BlockKey) -> bool {
        if self.is_closed() {
            return false;
        }
        let in_mem = self.mem.as_ref().is_some_and(|mem| lock(mem).remove(key));
        let on_disk = self.disk.remove(key);
        in_mem || on_disk
    }

    /// The keys held on disk. Right after a warm open these are the blocks kept from an earlier
    /// process, which the node must be told about (`Node::recovered_blocks`).
    pub fn disk_keys(&self) -> Vec<BlockKey> {
        if self.is_closed() {
            return Vec::new();
        }
        self.disk.keys()
    }

    /// The block digests (`dart_core::integrity`) of the blocks a warm open kept, hashed from
    /// the bytes that passed their slot checksum (`Node::recovered_digests`); empty after a cold
    /// open.
    pub fn loaded_digests(&self) -> Vec<(BlockKey, dart_core::integrity::BlockDigest)> {
        if self.is_closed() {
            return Vec::new();
        }
        self.disk.loaded_digests()
    }

    /// Distinct cached keys: disk blocks plus RAM-only blocks (diagnostic; O(RAM slots)).
    pub fn len(&self) -> usize {
        if self.is_closed() {
            return 0;
        }
        let (owned, _, borrowed, _) = self.disk.counts();
        let ram_keys = self.mem.as_ref().map(|mem| lock(mem).keys()).unwrap_or_default();
        owned + borrowed + self.disk.count_absent(&ram_keys)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks and slots per tier, and the admission refusals.
    pub fn stats(&self) -> StoreStats {
        let (owned_blocks, owned_slots, borrowed_blocks, borrowed_slots) = self.disk.counts();
        let mem_blocks = self.mem.as_ref().map_or(0, |mem| lock(mem).len());
        let (disk_reads_mapped, disk_reads_page_cache, disk_reads_blocking) =
            self.disk.read_counts();
        StoreStats {
            disk_reads_mapped,
            disk_reads_page_cache,
            disk_reads_blocking,
            owned_blocks: owned_blocks as u64,
            owned_slots: u64::from(owned_slots),
            borrowed_blocks: borrowed_blocks as u64,
            borrowed_slots: u64::from(borrowed_slots),
            mem_blocks: mem_blocks as u64,
            mem_slots: u64::from(self.mem_slots),
            admit_rejected: self.admit_rejected.load(Ordering::Relaxed),
        }
    }

    /// Whether the disk tiers are healthy or degraded (and why), with their I/O failure counts.
    pub fn health(&self) -> StoreHealth {
        self.disk.health()
    }

    /// Empties every tier, closes the arena files and releases the directory lock; idempotent.
    /// Afterwards gets miss and puts fail with [`StoreError::Closed`].
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.disk.close();
        if let Some(mem) = &self.mem {
            lock(mem).close();
        }
        drop(lock(&self.dir_lock).take());
        tracing::info!(dir = %self.dir.display(), "block store closed");
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether the RAM tier holds `key`.
    #[cfg(test)]
    pub(crate) fn in_ram(&self, key: &BlockKey) -> bool {
        self.mem.as_ref().is_some_and(|mem| lock(mem).contains(key))
    }

    /// Asserts every tier's internal invariants; panics on a violation. For tests and debugging:
    /// call it while no other thread is using the store (transient cross-budget states are legal
    /// mid-operation).
    pub fn check_invariants(&self) {
        self.disk.check_invariants();
        if let Some(mem) = &self.mem {
            lock(mem).check_invariants();
        }
        let stats = self.stats();
        assert!(stats.owned_blocks <= stats.owned_slots);
        assert!(stats.borrowed_blocks <= stats.borrowed_slots);
        assert!(stats.mem_blocks <= stats.mem_slots);
    }
}

/// Whether `start..start + len` is a readable window of a block of `block_len` bytes.
fn window_valid(start: u64, len: u64, block_len: u64) -> bool {
    len > 0 && start.checked_add(len).is_some_and(|end| end <= block_len)
}

/// Window `start..start + len` of a held block, if the block has exactly `block_len` bytes (a
/// block of another length is a miss: the reader would refuse it).
fn window_of(bytes: &Bytes, start: u64, len: u64, block_len: u64) -> Option<Bytes> {
    (bytes.len() as u64 == block_len).then(|| bytes.slice(start as usize..(start + len) as usize))
}
