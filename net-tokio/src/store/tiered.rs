//! The disk tiers: an owned arena that always admits and a borrowed arena behind TinyLFU admission,
//! each under its own mutex (store.md §3, §4).
//!
//! No operation holds both locks at once, so there is no lock order to get wrong. Cross-budget
//! steps (promotion, the owned check of a borrowed put) are sequences of single-arena steps ordered
//! so that concurrent callers converge on one copy: an owned insert deletes the borrowed copy after
//! it, and a borrowed insert re-checks owned after it.

use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use dart_core::hash::BlockKey;

use super::arena::{slot_checksum, Arena, LoadReport};
use super::config::Budgets;
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
}

/// The borrowed arena and its estimator, which share one lock so that the admission compare, the
/// eviction and the insert are one critical section (issue #34 S4).
#[derive(Debug)]
pub(crate) struct Borrowed {
    arena: Arena,
    sketch: Sketch,
}

impl Borrowed {
    /// Borrowed put: counts the access, then refreshes, inserts or refuses.
    fn put(
        &mut self,
        key: BlockKey,
        data: &[u8],
        data_sum: Option<u64>,
    ) -> Result<PutOutcome, StoreError> {
        // An insertion is an access, or write-only traffic leaves every estimate at 0 (#34 S5).
        self.sketch.increment(&key);
        if self.arena.touch(&key) {
            return Ok(PutOutcome::Refreshed);
        }
        if self.arena.is_full() {
            let victim = self.arena.lru_key().expect("a full arena has a victim");
            if !admits(&self.sketch, &key, &victim) {
                return Ok(PutOutcome::Refused);
            }
        }
        self.arena.insert(key, data, data_sum)?;
        Ok(PutOutcome::Inserted)
    }
}

/// The owned and borrowed arenas.
#[derive(Debug)]
pub(crate) struct Tiered {
    owned: Mutex<Arena>,
    borrowed: Mutex<Borrowed>,
    /// Whether slot headers (and so checksums) are kept.
    verify: bool,
}

/// Reads `key` from `arena` (refreshing recency if `touch`); an unreadable slot is dropped and
/// reported as a miss.
fn read_or_drop(arena: &mut Arena, key: &BlockKey, touch: bool) -> Option<Bytes> {
    let read = arena.read(key, touch);
    found_or_drop(arena, key, read)
}

/// The result of a read of `key` from `arena`; an unreadable slot is dropped and reported as a
/// miss.
fn found_or_drop(
    arena: &mut Arena,
    key: &BlockKey,
    read: Result<Option<Bytes>, StoreError>,
) -> Option<Bytes> {
    match read {
        Ok(found) => found,
        Err(StoreError::Closed) => None,
        Err(e) => {
            tracing::warn!(%key, error = %e, "dropping an unreadable cached block");
            arena.remove(key);
            None
        }
    }
}

impl Tiered {
    /// Opens both arena files in `dir` (the caller holds the directory lock).
    pub(crate) fn open(
        dir: &Path,
        budgets: &Budgets,
        warm: WarmStart,
    ) -> Result<(Tiered, [LoadReport; 2]), StoreError> {
        let block = budgets.block_bytes;
        let (owned, owned_report) =
            Arena::open(dir.join(OWNED_FILE), OWNED_TAG, block, budgets.owned_slots, warm)?;
        let (mut borrowed, borrowed_report) = Arena::open(
            dir.join(BORROWED_FILE),
            BORROWED_TAG,
            block,
            budgets.borrowed_slots,
            warm,
        )?;
        // A crash between a promotion's owned insert and its borrowed delete leaves two copies.
        for key in owned.keys() {
            borrowed.remove(&key);
        }
        let sketch = Sketch::new(u64::from(budgets.borrowed_slots));
        let tiered = Tiered {
            owned: Mutex::new(owned),
            borrowed: Mutex::new(Borrowed { arena: borrowed, sketch }),
            verify: warm == WarmStart::Verify,
        };
        Ok((tiered, [owned_report, borrowed_report]))
    }

    /// A copy of `key`'s bytes: owned first, then borrowed (a borrowed hit or miss feeds the
    /// estimator, an owned hit never does).
    pub(crate) fn get(&self, key: &BlockKey) -> Option<Bytes> {
        if let Some(bytes) = read_or_drop(&mut lock(&self.owned), key, true) {
            return Some(bytes);
        }
        // The 4 MiB read happens under the borrowed lock: simple and correct (no slot can be
        // recycled mid-read), at the cost of serialising borrowed disk reads.
        let mut borrowed = lock(&self.borrowed);
        borrowed.sketch.increment(key);
        read_or_drop(&mut borrowed.arena, key, true)
    }

    /// Bytes `start..start + len` of `key`, if held with exactly `block_len` bytes: owned first,
    /// then borrowed (which feeds the estimator), reading only those bytes.
    pub(crate) fn get_window(
        &self,
        key: &BlockKey,
        start: u64,
        len: u64,
        block_len: u64,
    ) -> Option<Bytes> {
        let read = |arena: &mut Arena| {
            let read = arena.read_window(key, start, len, block_len);
            found_or_drop(arena, key, read)
        };
        {
            let mut owned = lock(&self.owned);
            if owned.contains(key) {
                return read(&mut owned);
            }
        }
        let mut borrowed = lock(&self.borrowed);
        borrowed.sketch.increment(key);
        read(&mut borrowed.arena)
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

    /// Owned put: refresh, or move the borrowed copy over (#34 S2), or insert.
    fn put_owned(
        &self,
        key: BlockKey,
        data: &[u8],
        data_sum: Option<u64>,
    ) -> Result<PutOutcome, StoreError> {
        if lock(&self.owned).touch(&key) {
            return Ok(PutOutcome::Refreshed);
        }
        // Write-once across budgets: a promoted block keeps the bytes it was first stored with.
        let moved = read_or_drop(&mut lock(&self.borrowed).arena, &key, false);
        let (bytes, sum) = match &moved {
            Some(b) => (&b[..], self.verify.then(|| slot_checksum(&key, b))),
            None => (data, data_sum),
        };
        {
            let mut owned = lock(&self.owned);
            if owned.touch(&key) {
                return Ok(PutOutcome::Refreshed);
            }
            owned.insert(key, bytes, sum)?;
        }
        lock(&self.borrowed).arena.remove(&key);
        Ok(if moved.is_some() { PutOutcome::Promoted } else { PutOutcome::Inserted })
    }

    /// Borrowed put: an owned key only has its recency refreshed (#34 S3); otherwise TinyLFU.
    fn put_borrowed(
        &self,
        key: BlockKey,
        data: &[u8],
        data_sum: Option<u64>,
    ) -> Result<PutOutcome, StoreError> {
        if lock(&self.owned).touch(&key) {
            return Ok(PutOutcome::Refreshed);
        }
        let outcome = lock(&self.borrowed).put(key, data, data_sum)?;
        if outcome == PutOutcome::Inserted && lock(&self.owned).contains(&key) {
            // A concurrent owned put won the race; a block lives in one budget only.
            lock(&self.borrowed).arena.remove(&key);
            return Ok(PutOutcome::Refreshed);
        }
        Ok(outcome)
    }

    /// Drops `key` from both arenas; returns whether either held it.
    pub(crate) fn remove(&self, key: &BlockKey) -> bool {
        let owned = lock(&self.owned).remove(key);
        let borrowed = lock(&self.borrowed).arena.remove(key);
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

    /// Runs `f` on the arena of `class`.
    #[cfg(test)]
    pub(crate) fn with_arena<R>(&self, class: BlockClass, f: impl FnOnce(&Arena) -> R) -> R {
        match class {
            BlockClass::Owned => f(&lock(&self.owned)),
            BlockClass::Borrowed => f(&lock(&self.borrowed).arena),
        }
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
        for key in owned_keys {
            assert!(!borrowed.arena.contains(&key), "{key} lives in both budgets");
        }
    }
}
