//! The disk tiers: an owned arena that always admits and a borrowed arena behind TinyLFU admission,
//! each under its own mutex (store.md §3, §4).
//!
//! No operation holds both arena locks at once, so there is no lock order to get wrong. Cross-budget
//! steps (promotion, the owned check of a borrowed put) are sequences of single-arena steps ordered
//! so that concurrent callers converge on one copy: an owned insert deletes the borrowed copy after
//! it, and a borrowed insert re-checks owned after it. The health lock is a leaf: it is taken
//! inside an arena lock, briefly, and nothing is locked while it is held.
//!
//! Every disk write of a block asks the health machine first (`health.rs`): a degraded store skips
//! the write (bar one probe per interval), and every failed read or write is reported to it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use bytes::Bytes;
use dart_core::hash::BlockKey;

use super::arena::{slot_checksum, Arena, LoadReport, ReadCounts, SlotRead, SlotWrite};
use super::config::Budgets;
use super::health::{DegradedReason, Gate, Health, StoreHealth, Ticket, PROBE_INTERVAL};
use super::io::StoreIo;
use super::{BlockClass, StoreError, WarmStart};
use dart_core::admission::{admits, Sketch};

/// Owned arena file name inside the cache directory.
pub(crate) const OWNED_FILE: &str = "blocks.owned";
/// Borrowed arena file name inside the cache directory.
pub(crate) const BORROWED_FILE: &str = "blocks.borrowed";
/// Superblock class tags.
const OWNED_TAG: u64 = 1;
const BORROWED_TAG: u64 = 2;

/// Takes a store mutex; a poisoned one means a thread panicked mid-operation, which is a bug.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("block store lock poisoned: a thread panicked inside the store")
}

/// What a disk put did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PutOutcome {
    /// The bytes were written under the key.
    Inserted,
    /// The key was already present; its bytes were kept and its recency refreshed.
    Refreshed,
    /// A borrowed copy moved into the owned arena (its bytes, not the caller's).
    Promoted,
    /// TinyLFU refused the key: it is less popular than the borrowed LRU victim.
    Refused,
    /// The disk is degraded and no probe was due: nothing was written.
    Skipped,
}

/// The borrowed arena and its estimator, which share one lock so that the admission compare, the
/// eviction and the new block's reservation of its slot are one critical section (issue #34 S4).
#[derive(Debug)]
pub(crate) struct Borrowed {
    arena: Arena,
    sketch: Sketch,
}

impl Borrowed {
    /// Borrowed admission: counts the access, then answers a put at once (`Some`: refreshed, the
    /// key being held or written already, or refused by TinyLFU), or lets it insert (`None`).
    fn admit(&mut self, key: &BlockKey) -> Option<PutOutcome> {
        // An insertion is an access, or write-only traffic leaves every estimate at 0 (#34 S5).
        self.sketch.increment(key);
        if self.arena.touch_or_writing(key) {
            return Some(PutOutcome::Refreshed);
        }
        if self.arena.is_full() {
            // No victim while reads pin every slot: the insert then finds no room and skips.
            if let Some(victim) = self.arena.lru_key() {
                if !admits(&self.sketch, key, &victim) {
                    return Some(PutOutcome::Refused);
                }
            }
        }
        None
    }
}

/// An insert begun under an arena's lock ([`Tiered::begin_gated`]), written outside it.
struct Begun {
    write: SlotWrite,
    ticket: Ticket,
    now: std::time::Instant,
}

/// The owned and borrowed arenas.
#[derive(Debug)]
pub(crate) struct Tiered {
    owned: Mutex<Arena>,
    borrowed: Mutex<Borrowed>,
    /// The arenas' published keys ([`Arena::published`]): presence without the arenas' locks.
    owned_keys: Arc<Mutex<std::collections::HashSet<BlockKey>>>,
    borrowed_keys: Arc<Mutex<std::collections::HashSet<BlockKey>>>,
    /// Whether slot headers (and so checksums) are kept.
    verify: bool,
    /// File I/O and the probe clock.
    io: Arc<dyn StoreIo>,
    /// Degraded mode; a leaf lock.
    health: Mutex<Health>,
    /// The owned and the borrowed arena's read counts ([`Arena::read_counts`]).
    reads: [Arc<ReadCounts>; 2],
}

/// Which kind of disk call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

impl Tiered {
    /// Opens both arena files in `dir` (the caller holds the directory lock), doing their I/O
    /// through `io`, their block data written around the page cache if `direct` and the file
    /// system takes it.
    pub(crate) fn open(
        dir: &Path,
        budgets: &Budgets,
        warm: WarmStart,
        direct: bool,
        io: Arc<dyn StoreIo>,
    ) -> Result<(Tiered, [LoadReport; 2]), StoreError> {
        let block = budgets.block_bytes;
        let (mut owned, owned_report) = Arena::open(
            dir.join(OWNED_FILE),
            OWNED_TAG,
            block,
            budgets.owned_slots,
            warm,
            direct,
            io.clone(),
        )?;
        let (mut borrowed, borrowed_report) = Arena::open(
            dir.join(BORROWED_FILE),
            BORROWED_TAG,
            block,
            budgets.borrowed_slots,
            warm,
            direct,
            io.clone(),
        )?;
        if budgets.mem_slots == 0 {
            // No RAM tier to keep a whole block after its read: whole blocks may be mapped too.
            owned.map_whole_blocks();
            borrowed.map_whole_blocks();
        }
        // A crash between a promotion's owned insert and its borrowed delete leaves two copies.
        for key in owned.keys() {
            // A failed header invalidation only costs the next warm start a duplicate to drop.
            let _ = borrowed.remove(&key);
        }
        let sketch = Sketch::new(u64::from(budgets.borrowed_slots));
        let health = Mutex::new(Health::new(io.now()));
        let (owned_keys, borrowed_keys) = (owned.published(), borrowed.published());
        let reads = [owned.read_counts(), borrowed.read_counts()];
        let tiered = Tiered {
            reads,
            owned_keys,
            borrowed_keys,
            owned: Mutex::new(owned),
            borrowed: Mutex::new(Borrowed { arena: borrowed, sketch }),
            verify: warm == WarmStart::Verify,
            io,
            health,
        };
        Ok((tiered, [owned_report, borrowed_report]))
    }

    /// The disk tiers' health and failure counts.
    pub(crate) fn health(&self) -> StoreHealth {
        lock(&self.health).report()
    }

    /// Reports a failed disk call to the health machine (a closed arena is not a failure).
    fn record_failure(&self, op: Op, error: &StoreError) {
        let StoreError::Io { path, cause } = error else {
            return;
        };
        let reason = match op {
            Op::Read => DegradedReason::of_read(cause),
            Op::Write => DegradedReason::of_write(cause),
        };
        let now = self.io.now();
        let wall = SystemTime::now();
        let mut health = lock(&self.health);
        let was_degraded = health.is_degraded();
        match op {
            Op::Read => health.read_failed(reason.clone(), now, wall),
            Op::Write => health.write_failed(reason.clone(), now, wall),
        }
        drop(health);
        if !was_degraded {
            tracing::error!(
                path = %path.display(),
                %reason,
                probe_every_secs = PROBE_INTERVAL.as_secs(),
                "cache disk degraded: new blocks are not written to disk (bar one probe write per \
                 interval); RAM, readable disk blocks, peers and the origin still serve",
            );
        }
    }

    /// Under `arena`'s lock: reserves a slot for `key` (`len` bytes) if the health machine lets a
    /// write go now and a slot no read pins is left; `Ok(None)` when not.
    fn begin_gated(
        &self,
        arena: &mut Arena,
        key: BlockKey,
        len: u64,
        data_sum: Option<u64>,
    ) -> Result<Option<Begun>, StoreError> {
        if !arena.has_room() {
            // Reads in progress pin every slot: this block is not cached, as when degraded.
            return Ok(None);
        }
        let now = self.io.now();
        let gate = lock(&self.health).gate(now);
        let ticket = match gate {
            Gate::Skip => return Ok(None),
            Gate::Write(ticket) => ticket,
            Gate::CheckThenWrite(ticket) if !arena.is_unlinked() => ticket,
            Gate::CheckThenWrite(_) => {
                let mut health = lock(&self.health);
                let was_degraded = health.is_degraded();
                health.files_removed(now, SystemTime::now());
                drop(health);
                if !was_degraded {
                    tracing::error!(
                        "cache disk degraded: the arena files were unlinked (cache directory \
                         deleted?); no more disk writes until a restart recreates them",
                    );
                }
                return Ok(None);
            }
        };
        let write = arena.begin_insert(key, len, data_sum)?;
        Ok(Some(Begun { write, ticket, now }))
    }

    /// Writes `data` into the slot `begun` reserved in `class`'s arena, outside the arena's lock
    /// (reads and look-ups of the arena go on meanwhile; other block writes into the same file
    /// wait for this one, [`SlotWrite::write`]), then publishes it under the lock.
    /// `Ok(false)` when `key` was removed (or the store closed) during the write. A failed write
    /// is recorded, and returned unless the key was removed meanwhile (the arena has freed the
    /// slot either way).
    fn write_begun(
        &self,
        class: BlockClass,
        key: BlockKey,
        data: &[u8],
        begun: Begun,
    ) -> Result<bool, StoreError> {
        let Begun { write, ticket, now } = begun;
        let written = write.write(data);
        match &written {
            // Recorded even if the key was removed meanwhile: the disk failed all the same.
            Err(e) => self.record_failure(Op::Write, e),
            Ok(()) => {
                if lock(&self.health).written(ticket, now) {
                    tracing::info!("cache disk healthy again: a probe write succeeded");
                }
            }
        }
        let len = data.len() as u64;
        self.with_arena_mut(class, |arena| arena.finish_insert(key, len, write, written))
    }

    /// Drops `key` from `arena`; returns whether it held it. A failed header invalidation is
    /// recorded as a failed write.
    fn drop_from(&self, arena: &mut Arena, key: &BlockKey) -> bool {
        match arena.remove(key) {
            None => false,
            Some(Ok(())) => true,
            Some(Err(e)) => {
                self.record_failure(Op::Write, &e);
                true
            }
        }
    }

    /// A copy of `key`'s bytes: owned first, then borrowed (a borrowed hit or miss feeds the
    /// estimator, an owned hit never does). The disk read happens outside the arena's lock, on a
    /// pinned slot ([`Arena::begin_read`]): reads of one arena overlap, and a look-up or a put
    /// waits for none of them.
    pub(crate) fn get(&self, key: &BlockKey) -> Option<Bytes> {
        self.read(key, None)
    }

    /// Bytes `start..start + len` of `key`, if held with exactly `block_len` bytes: owned first,
    /// then borrowed (which feeds the estimator), reading only those bytes, outside the arena's
    /// lock as [`Tiered::get`] does.
    pub(crate) fn get_window(
        &self,
        key: &BlockKey,
        start: u64,
        len: u64,
        block_len: u64,
    ) -> Option<Bytes> {
        self.read(key, Some((start, len, block_len)))
    }

    /// [`Tiered::get`] (`window` `None`) or [`Tiered::get_window`]: the owned budget's answer
    /// when it holds `key` (even a window that does not fit), except that a whole block it could
    /// not read is looked for in the borrowed budget too; else the borrowed budget's.
    fn read(&self, key: &BlockKey, window: Option<(u64, u64, u64)>) -> Option<Bytes> {
        let begun = {
            let mut owned = lock(&self.owned);
            owned.contains(key).then(|| owned.begin_read(key, window, true))
        };
        if let Some(begun) = begun {
            let found = self.read_pinned(BlockClass::Owned, key, begun);
            if found.is_some() || window.is_some() {
                return found;
            }
        }
        let begun = {
            let mut borrowed = lock(&self.borrowed);
            borrowed.sketch.increment(key);
            borrowed.arena.begin_read(key, window, true)
        };
        self.read_pinned(BlockClass::Borrowed, key, begun)
    }

    /// Carries out a read begun under the lock of `class`'s arena, outside it. An unreadable slot
    /// is recorded, dropped (if `key` is still published in it) and reported as a miss.
    fn read_pinned(
        &self,
        class: BlockClass,
        key: &BlockKey,
        begun: Option<SlotRead>,
    ) -> Option<Bytes> {
        let read = match begun?.try_map() {
            Ok(mapped) => return Some(mapped),
            Err(read) => read,
        };
        let e = match read.read() {
            Ok(bytes) => return Some(bytes),
            Err(e) => e,
        };
        let slot = read.slot();
        drop(read);
        tracing::warn!(%key, error = %e, "dropping an unreadable cached block");
        self.record_failure(Op::Read, &e);
        self.with_arena_mut(class, |arena| {
            if arena.slot_of(key) == Some(slot) {
                self.drop_from(arena, key);
            }
        });
        None
    }

    /// [`Tiered::get`] (`window` `None`) or [`Tiered::get_window`] (`window` =
    /// `(start, len, block_len)`) answered without waiting: `None` when an arena's lock is held
    /// (by another operation of the arena) or the bytes are not all in the page cache; then the
    /// blocking read answers. The estimator counts an answered borrowed look-up once, as the
    /// blocking read does.
    pub(crate) fn get_cached(
        &self,
        key: &BlockKey,
        window: Option<(u64, u64, u64)>,
    ) -> Option<Option<Bytes>> {
        {
            let mut owned = self.owned.try_lock().ok()?;
            if owned.contains(key) {
                return owned.read_cached(key, window);
            }
        }
        let mut borrowed = self.borrowed.try_lock().ok()?;
        let found = borrowed.arena.read_cached(key, window)?;
        borrowed.sketch.increment(key);
        Some(found)
    }

    /// Records a RAM-tier hit: refreshes the disk copy's recency and, unless the key is owned,
    /// feeds the estimator (issue #11 S1).
    pub(crate) fn touch(&self, key: &BlockKey) {
        if lock(&self.owned).touch(key) {
            return;
        }
        let mut borrowed = lock(&self.borrowed);
        borrowed.sketch.increment(key);
        borrowed.arena.touch(key);
    }

    /// [`Tiered::touch`] if neither arena's lock is held now (by another operation of the
    /// arena); otherwise nothing, and `false`. For callers that must not wait on the disk: a
    /// skipped touch leaves the disk copy's recency (and the estimator's count) as it was.
    pub(crate) fn try_touch(&self, key: &BlockKey) -> bool {
        let Ok(mut owned) = self.owned.try_lock() else { return false };
        if owned.touch(key) {
            return true;
        }
        drop(owned);
        let Ok(mut borrowed) = self.borrowed.try_lock() else { return false };
        borrowed.sketch.increment(key);
        borrowed.arena.touch(key);
        true
    }

    /// Whether either arena has published `key`, without waiting for a write in progress (from
    /// the published-key sets, [`Arena::published`]); touches nothing.
    pub(crate) fn contains_now(&self, key: &BlockKey) -> bool {
        let owned = lock(&self.owned_keys).contains(key);
        owned || lock(&self.borrowed_keys).contains(key)
    }

    /// Whether either arena holds `key`; touches nothing.
    pub(crate) fn contains(&self, key: &BlockKey) -> bool {
        // Two statements: `a || b` would keep the owned guard alive while taking the borrowed one.
        let owned = lock(&self.owned).contains(key);
        owned || lock(&self.borrowed).arena.contains(key)
    }

    /// Puts `data` (with `data_sum` iff headers are kept) into the budget of `class`.
    pub(crate) fn put(
        &self,
        key: BlockKey,
        data: &[u8],
        data_sum: Option<u64>,
        class: BlockClass,
    ) -> Result<PutOutcome, StoreError> {
        match class {
            BlockClass::Owned => self.put_owned(key, data, data_sum),
            BlockClass::Borrowed => self.put_borrowed(key, data, data_sum),
        }
    }

    /// Owned put: refresh, or move the borrowed copy over (#34 S2), or insert. While the disk is
    /// degraded a borrowed copy stays where it is (and counts as a refresh). The bytes are written
    /// outside the owned arena's lock ([`Tiered::write_begun`]).
    fn put_owned(
        &self,
        key: BlockKey,
        data: &[u8],
        data_sum: Option<u64>,
    ) -> Result<PutOutcome, StoreError> {
        if self.owned_has(&key) {
            return Ok(PutOutcome::Refreshed);
        }
        // Write-once across budgets: a promoted block keeps the bytes it was first stored with.
        let begun = lock(&self.borrowed).arena.begin_read(&key, None, false);
        let moved = self.read_pinned(BlockClass::Borrowed, &key, begun);
        let (bytes, sum) = match &moved {
            Some(b) => (&b[..], self.verify.then(|| slot_checksum(&key, b))),
            None => (data, data_sum),
        };
        let not_written = if moved.is_some() { PutOutcome::Refreshed } else { PutOutcome::Skipped };
        let begun = {
            let mut owned = lock(&self.owned);
            if owned.touch_or_writing(&key) {
                return Ok(PutOutcome::Refreshed);
            }
            match self.begin_gated(&mut owned, key, bytes.len() as u64, sum)? {
                Some(begun) => begun,
                None => return Ok(not_written),
            }
        };
        if !self.write_begun(BlockClass::Owned, key, bytes, begun)? {
            // Deleted (from both budgets) or closed while it was written: not cached.
            return Ok(PutOutcome::Skipped);
        }
        self.drop_from(&mut lock(&self.borrowed).arena, &key);
        Ok(if moved.is_some() { PutOutcome::Promoted } else { PutOutcome::Inserted })
    }

    /// Whether the owned arena holds `key` (refreshing its recency) or is writing it.
    fn owned_has(&self, key: &BlockKey) -> bool {
        lock(&self.owned).touch_or_writing(key)
    }

    /// Borrowed put: an owned key (or one the owned arena is writing) only has its recency
    /// refreshed (#34 S3); otherwise TinyLFU, whose compare and eviction are one critical section
    /// with the slot's reservation; the bytes are written outside the lock.
    fn put_borrowed(
        &self,
        key: BlockKey,
        data: &[u8],
        data_sum: Option<u64>,
    ) -> Result<PutOutcome, StoreError> {
        if self.owned_has(&key) {
            return Ok(PutOutcome::Refreshed);
        }
        let begun = {
            let mut borrowed = lock(&self.borrowed);
            if let Some(outcome) = borrowed.admit(&key) {
                return Ok(outcome);
            }
            match self.begin_gated(&mut borrowed.arena, key, data.len() as u64, data_sum)? {
                Some(begun) => begun,
                None => return Ok(PutOutcome::Skipped),
            }
        };
        if !self.write_begun(BlockClass::Borrowed, key, data, begun)? {
            // Removed while it was written: by a delete, or by an owned put of the key that
            // published first (then the block is cached, in the owned budget).
            let owned = lock(&self.owned).contains(&key);
            return Ok(if owned { PutOutcome::Refreshed } else { PutOutcome::Skipped });
        }
        if lock(&self.owned).contains(&key) {
            // A concurrent owned put won the race; a block lives in one budget only.
            self.drop_from(&mut lock(&self.borrowed).arena, &key);
            return Ok(PutOutcome::Refreshed);
        }
        Ok(PutOutcome::Inserted)
    }

    /// Drops `key` from both arenas; returns whether either held it.
    pub(crate) fn remove(&self, key: &BlockKey) -> bool {
        let owned = self.drop_from(&mut lock(&self.owned), key);
        let borrowed = self.drop_from(&mut lock(&self.borrowed).arena, key);
        owned || borrowed
    }

    /// `(owned_blocks, owned_slots, borrowed_blocks, borrowed_slots)`.
    pub(crate) fn counts(&self) -> (usize, u32, usize, u32) {
        let (owned_blocks, owned_slots) = {
            let owned = lock(&self.owned);
            (owned.len(), owned.slots())
        };
        let borrowed = lock(&self.borrowed);
        (owned_blocks, owned_slots, borrowed.arena.len(), borrowed.arena.slots())
    }

    /// Reads of block bytes since open, both arenas: (mapped, copied from the page cache,
    /// blocking), as [`super::arena::ReadCounts`] counts them.
    pub(crate) fn read_counts(&self) -> (u64, u64, u64) {
        let sum = |f: fn(&ReadCounts) -> &AtomicU64| {
            self.reads.iter().map(|r| f(r).load(Ordering::Relaxed)).sum()
        };
        (sum(|r| &r.mapped), sum(|r| &r.page_cache), sum(|r| &r.blocking))
    }

    /// How many of `keys` neither arena holds.
    pub(crate) fn count_absent(&self, keys: &[BlockKey]) -> usize {
        let not_owned: Vec<&BlockKey> = {
            let owned = lock(&self.owned);
            keys.iter().filter(|k| !owned.contains(k)).collect()
        };
        let borrowed = lock(&self.borrowed);
        not_owned.into_iter().filter(|k| !borrowed.arena.contains(k)).count()
    }

    /// Closes both arena files.
    pub(crate) fn close(&self) {
        lock(&self.owned).close();
        lock(&self.borrowed).arena.close();
    }

    /// Which budget holds `key` (owned checked first).
    #[cfg(test)]
    pub(crate) fn class_of(&self, key: &BlockKey) -> Option<BlockClass> {
        if lock(&self.owned).contains(key) {
            Some(BlockClass::Owned)
        } else if lock(&self.borrowed).arena.contains(key) {
            Some(BlockClass::Borrowed)
        } else {
            None
        }
    }

    /// The borrowed estimator's estimate for `key`.
    #[cfg(test)]
    pub(crate) fn estimate(&self, key: &BlockKey) -> u64 {
        lock(&self.borrowed).sketch.estimate(key)
    }

    /// Both arenas' locks, held as a put holds one through its write.
    #[cfg(test)]
    pub(crate) fn hold(&self) -> (MutexGuard<'_, Arena>, MutexGuard<'_, Borrowed>) {
        (lock(&self.owned), lock(&self.borrowed))
    }

    /// Runs `f` on the arena of `class`, under its lock.
    fn with_arena_mut<R>(&self, class: BlockClass, f: impl FnOnce(&mut Arena) -> R) -> R {
        match class {
            BlockClass::Owned => f(&mut lock(&self.owned)),
            BlockClass::Borrowed => f(&mut lock(&self.borrowed).arena),
        }
    }

    /// Pins `key`'s slot in `class`'s arena as a read outside the lock does, without touching
    /// its recency.
    #[cfg(test)]
    pub(crate) fn pin(&self, class: BlockClass, key: &BlockKey) -> Option<SlotRead> {
        self.with_arena_mut(class, |arena| arena.begin_read(key, None, false))
    }

    /// Whether both arenas write block data around the page cache (they start alike; one whose
    /// direct write was refused writes buffered from then on).
    pub(crate) fn writes_direct(&self) -> bool {
        let owned = lock(&self.owned).writes_direct();
        owned && lock(&self.borrowed).arena.writes_direct()
    }

    /// Runs `f` on the arena of `class`.
    #[cfg(test)]
    pub(crate) fn with_arena<R>(&self, class: BlockClass, f: impl FnOnce(&Arena) -> R) -> R {
        match class {
            BlockClass::Owned => f(&lock(&self.owned)),
            BlockClass::Borrowed => f(&lock(&self.borrowed).arena),
        }
    }

    /// The block digests of the blocks the last warm open kept, owned then borrowed.
    pub(crate) fn loaded_digests(&self) -> Vec<(BlockKey, dart_core::integrity::BlockDigest)> {
        let mut digests = lock(&self.owned).loaded_digests();
        digests.extend(lock(&self.borrowed).arena.loaded_digests());
        digests
    }

    /// Every key held on disk, owned then borrowed.
    pub(crate) fn keys(&self) -> Vec<BlockKey> {
        let mut keys = lock(&self.owned).keys();
        keys.extend(lock(&self.borrowed).arena.keys());
        keys
    }

    /// Asserts each arena's invariants and that no key lives in both budgets.
    pub(crate) fn check_invariants(&self) {
        let owned_keys = {
            let owned = lock(&self.owned);
            owned.check_invariants();
            owned.keys()
        };
        let borrowed = lock(&self.borrowed);
        borrowed.arena.check_invariants();
        borrowed.sketch.check_invariants();
        drop(borrowed);
        lock(&self.health).check_invariants();
        let borrowed = lock(&self.borrowed);
        for key in owned_keys {
            assert!(!borrowed.arena.contains(&key), "{key} lives in both budgets");
        }
    }
}
