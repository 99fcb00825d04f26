//! A node's block cache in the simulator, mirroring the store's contract (spec/store.md §1, §3):
//! write-once per key, exact length, owned and borrowed budgets, a crash keeps it (warm start with
//! verification) or loses it (cold start). The capacity splits as the disk store's default does
//! ([`OWNED_FRACTION`] owned), and each budget evicts its least recently used block (a look-up
//! that finds a block, or a put of one held, refreshes it); once the borrowed budget is full a
//! borrowed block is admitted only if the core's TinyLFU verdict
//! ([`dart_core::admission::admits`], the one the disk store applies) finds it at least as popular
//! as the block it would evict. The estimator starts counting when the borrowed
//! budget first fills (so that caches that never fill cost nothing). Blocks are `Bytes` handles,
//! usually slices of the one shared content buffer, so a large cluster costs pointers, not copies.

use bytes::Bytes;
use dart_core::admission::{admits, Sketch};
use dart_core::engine::BlockClass;
use dart_core::hash::BlockKey;
use std::collections::BTreeMap;

/// Most blocks one simulated cache holds.
pub const CACHE_BLOCKS_MAX: usize = 1 << 20;
/// Most keys the admission estimator is sized for (its memory is per node).
pub const SKETCH_KEYS_MAX: usize = 1 << 16;
/// The owned share of a cache's blocks: the disk store's default `--owned-fraction`.
pub use dart_core::admission::DEFAULT_OWNED_FRACTION as OWNED_FRACTION;

/// The owned and borrowed budgets of `capacity` blocks, split as the disk store splits its slots
/// ([`dart_core::admission::split_slots`]); a hand-made capacity of 1 gets one block each (the
/// store refuses fewer than two slots).
fn budgets(capacity: usize) -> (usize, usize) {
    if capacity < 2 {
        return (1, 1);
    }
    let (owned, borrowed) = dart_core::admission::split_slots(capacity as u64, OWNED_FRACTION);
    (owned as usize, borrowed as usize)
}

#[derive(Clone, Debug)]
struct Slot {
    data: Bytes,
    class: BlockClass,
    /// Its place in the recency order (insertion, refreshed by a look-up or a put).
    seq: u64,
    /// When it was written, in puts: the crash tears the newest write.
    written: u64,
}

/// One node's cache.
#[derive(Clone, Debug)]
pub struct SimCache {
    blocks: BTreeMap<BlockKey, Slot>,
    order: BTreeMap<u64, BlockKey>,
    next_seq: u64,
    capacity: usize,
    /// Blocks each budget holds at most, and holds now.
    owned_cap: usize,
    borrowed_cap: usize,
    owned_len: usize,
    borrowed_len: usize,
    torn: std::collections::BTreeSet<BlockKey>,
    /// Blocks whose bytes rotted in place ([`SimCache::rot`]), until dropped.
    rotten: std::collections::BTreeSet<BlockKey>,
    /// Puts refused because the key was already held (write-once).
    pub duplicate_puts: u64,
    /// Blocks evicted at capacity.
    pub evictions: u64,
    /// Borrowed blocks refused by TinyLFU admission.
    pub admit_rejected: u64,
    /// The admission estimator, from the first time the borrowed budget is full.
    sketch: Option<Sketch>,
}

impl SimCache {
    /// An empty cache of `capacity` blocks (clamped to [`CACHE_BLOCKS_MAX`]), split into the
    /// owned and borrowed budgets (at least one block each).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, CACHE_BLOCKS_MAX);
        let (owned_cap, borrowed_cap) = budgets(capacity);
        SimCache {
            blocks: BTreeMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            capacity,
            owned_cap,
            borrowed_cap,
            owned_len: 0,
            borrowed_len: 0,
            torn: std::collections::BTreeSet::new(),
            rotten: std::collections::BTreeSet::new(),
            duplicate_puts: 0,
            evictions: 0,
            admit_rejected: 0,
            sketch: None,
        }
    }

    /// A look-up by a read: the block, if held, counted as an access by the admission estimator
    /// unless it is owned (as the disk store counts them).
    pub fn lookup(&mut self, key: &BlockKey) -> Option<Bytes> {
        let slot = self.blocks.get(key);
        if slot.is_none_or(|s| s.class == BlockClass::Borrowed) {
            if let Some(sketch) = &mut self.sketch {
                sketch.increment(key);
            }
        }
        let data = slot.map(|s| s.data.clone());
        if data.is_some() {
            self.touch(key);
        }
        data
    }

    /// Makes `key` the most recently used block of its budget (the store's arenas evict the
    /// least recently used).
    fn touch(&mut self, key: &BlockKey) {
        let seq = self.next_seq;
        let Some(slot) = self.blocks.get_mut(key) else { return };
        self.next_seq += 1;
        self.order.remove(&slot.seq);
        slot.seq = seq;
        self.order.insert(seq, *key);
    }

    /// The block, if held (a handle: blocks are immutable).
    pub fn get(&self, key: &BlockKey) -> Option<Bytes> {
        self.blocks.get(key).map(|s| s.data.clone())
    }

    /// Drops `key` (its object changed); returns whether it was held.
    pub fn remove(&mut self, key: &BlockKey) -> bool {
        let Some(slot) = self.blocks.remove(key) else { return false };
        self.uncount(slot.class);
        self.order.remove(&slot.seq);
        self.torn.remove(key);
        self.rotten.remove(key);
        true
    }

    /// Every block held now has one byte changed in place (disk or memory rot), at an offset
    /// that depends on the block; blocks put later are intact. Returns how many rotted.
    pub fn rot(&mut self) -> usize {
        for (key, slot) in self.blocks.iter_mut() {
            let mut bytes = slot.data.to_vec();
            let i = (key.block as usize).wrapping_mul(7919) % bytes.len();
            bytes[i] ^= 0x24;
            slot.data = Bytes::from(bytes);
            self.rotten.insert(*key);
        }
        self.blocks.len()
    }

    /// Whether `key`'s bytes rotted in place.
    pub fn is_rotten(&self, key: &BlockKey) -> bool {
        self.rotten.contains(key)
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.blocks.contains_key(key)
    }

    /// Offers a block; the first bytes for a key win; a full owned budget evicts its least
    /// recently used block, and a borrowed block may be refused once the borrowed budget is full. Returns
    /// whether it was inserted.
    pub fn put(&mut self, key: BlockKey, data: Bytes, class: BlockClass) -> bool {
        assert!(!data.is_empty(), "the store rejects empty blocks");
        if class == BlockClass::Borrowed {
            if let Some(sketch) = &mut self.sketch {
                // An insertion is an access (as in the store).
                sketch.increment(&key);
            }
        }
        if self.blocks.contains_key(&key) {
            // Re-putting a key refreshes its recency (the store's rule).
            self.duplicate_puts += 1;
            self.touch(&key);
            return false;
        }
        let full = match class {
            BlockClass::Owned => self.owned_len >= self.owned_cap,
            BlockClass::Borrowed => self.borrowed_len >= self.borrowed_cap,
        };
        if full {
            if class == BlockClass::Borrowed {
                let keys = self.borrowed_cap.clamp(256, SKETCH_KEYS_MAX) as u64;
                let sketch = self.sketch.get_or_insert_with(|| Sketch::new(keys));
                let victim = self.order.values().find(|k| self.blocks[*k].class == class);
                if victim.is_some_and(|v| !admits(sketch, &key, v)) {
                    self.admit_rejected += 1;
                    return false;
                }
            }
            self.evict_oldest(class);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.blocks.insert(key, Slot { data, class, seq, written: seq });
        self.order.insert(seq, key);
        match class {
            BlockClass::Owned => self.owned_len += 1,
            BlockClass::Borrowed => self.borrowed_len += 1,
        }
        true
    }

    fn uncount(&mut self, class: BlockClass) {
        match class {
            BlockClass::Owned => self.owned_len -= 1,
            BlockClass::Borrowed => self.borrowed_len -= 1,
        }
    }

    /// Evicts the least recently used block of budget `class`.
    fn evict_oldest(&mut self, class: BlockClass) {
        let victim = self
            .order
            .iter()
            .find(|(_, k)| self.blocks[*k].class == class)
            .map(|(&seq, &key)| (seq, key));
        if let Some((seq, key)) = victim {
            self.order.remove(&seq);
            self.blocks.remove(&key);
            self.rotten.remove(&key);
            self.uncount(class);
            self.evictions += 1;
        }
    }

    /// The crash tore the newest write: its slot now holds a prefix. Returns the block's key.
    pub fn tear_newest(&mut self) -> Option<BlockKey> {
        let (&key, _) = self.blocks.iter().max_by_key(|(_, s)| s.written)?;
        let slot = self.blocks.get_mut(&key).expect("a held key");
        if slot.data.len() < 2 {
            return None;
        }
        slot.data = slot.data.slice(..slot.data.len() / 2);
        self.torn.insert(key);
        Some(key)
    }

    /// A warm start that verifies every slot (the store's `WarmStart::Verify`): torn writes and
    /// blocks that rotted in place are dropped. Returns how many.
    pub fn drop_torn(&mut self) -> usize {
        // A block that rotted in place fails its slot checksum at a warm open too.
        let mut torn = std::mem::take(&mut self.torn);
        torn.append(&mut self.rotten);
        for key in &torn {
            if let Some(slot) = self.blocks.remove(key) {
                self.uncount(slot.class);
            }
        }
        self.order.retain(|_, k| !torn.contains(k));
        torn.len()
    }

    /// Empties the cache (a cold restart).
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.order.clear();
        self.torn.clear();
        (self.owned_len, self.borrowed_len) = (0, 0);
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// The keys held.
    pub fn keys(&self) -> Vec<BlockKey> {
        self.blocks.keys().copied().collect()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Every held block, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&BlockKey, &Bytes, BlockClass)> {
        self.blocks.iter().map(|(k, s)| (k, &s.data, s.class))
    }

    /// Asserts that no torn write is readable (a running process only sees verified slots).
    pub fn check_no_torn(&self) {
        assert!(self.torn.is_empty(), "a torn write survived the restart");
    }

    /// Asserts the cache's structural invariants (content is checked by the simulator, which
    /// knows the objects).
    pub fn check_invariants(&self) {
        assert!(self.owned_len <= self.owned_cap, "owned budget above its capacity");
        assert!(self.borrowed_len <= self.borrowed_cap, "borrowed budget above its capacity");
        assert!(
            self.owned_cap + self.borrowed_cap <= self.capacity.max(2),
            "budgets above capacity"
        );
        assert_eq!(self.blocks.len(), self.owned_len + self.borrowed_len, "budget counts drifted");
        assert_eq!(self.blocks.len(), self.order.len(), "order index drifted");
        assert!(self.torn.iter().all(|k| self.blocks.contains_key(k)), "torn keys are held");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dart_core::hash::ChunkKey;

    fn key(b: u64) -> BlockKey {
        BlockKey { chunk: ChunkKey(1), block: b }
    }

    #[test]
    fn the_first_bytes_for_a_key_win() {
        let mut c = SimCache::new(10);
        assert!(c.put(key(1), Bytes::from_static(b"aa"), BlockClass::Owned));
        assert!(!c.put(key(1), Bytes::from_static(b"bb"), BlockClass::Owned));
        assert_eq!(c.get(&key(1)).as_deref(), Some(&b"aa"[..]));
        assert_eq!(c.duplicate_puts, 1);
    }

    #[test]
    fn a_full_borrowed_budget_refuses_a_block_less_popular_than_its_victim() {
        // Ten blocks: eight owned, two borrowed.
        let mut c = SimCache::new(10);
        c.put(key(1), Bytes::from_static(b"a"), BlockClass::Borrowed);
        c.put(key(2), Bytes::from_static(b"b"), BlockClass::Borrowed);
        assert!(c.put(key(3), Bytes::from_static(b"c"), BlockClass::Borrowed), "cold: ties admit");
        assert!(!c.contains(&key(1)), "the least recently used borrowed block went");
        for _ in 0..4 {
            c.lookup(&key(2));
        }
        // Block 3 read since: block 2 is the least recently used, and the more popular.
        c.lookup(&key(3));
        assert!(!c.put(key(4), Bytes::from_static(b"d"), BlockClass::Borrowed));
        assert_eq!(c.admit_rejected, 1);
        assert!(c.put(key(5), Bytes::from_static(b"e"), BlockClass::Owned), "owned always admits");
        c.check_invariants();
    }

    #[test]
    fn each_budget_evicts_its_own_oldest_block() {
        let mut c = SimCache::new(10);
        for b in 0..8 {
            assert!(c.put(key(b), Bytes::from_static(b"o"), BlockClass::Owned));
        }
        c.put(key(100), Bytes::from_static(b"b"), BlockClass::Borrowed);
        c.put(key(101), Bytes::from_static(b"b"), BlockClass::Borrowed);
        assert_eq!(c.len(), 10);
        // A ninth owned block evicts the oldest owned one, never a borrowed one.
        assert!(c.put(key(8), Bytes::from_static(b"o"), BlockClass::Owned));
        assert!(!c.contains(&key(0)) && c.contains(&key(100)) && c.contains(&key(101)));
        // A third borrowed block evicts the oldest borrowed one, never an owned one.
        assert!(c.put(key(102), Bytes::from_static(b"b"), BlockClass::Borrowed));
        assert!(!c.contains(&key(100)) && c.contains(&key(1)));
        assert_eq!(c.evictions, 2);
        c.check_invariants();
    }

    #[test]
    fn a_block_looked_up_is_evicted_after_the_blocks_that_were_not() {
        let mut c = SimCache::new(10);
        for b in 0..8 {
            c.put(key(b), Bytes::from_static(b"oo"), BlockClass::Owned);
        }
        assert!(c.lookup(&key(0)).is_some());
        c.put(key(8), Bytes::from_static(b"oo"), BlockClass::Owned);
        assert!(c.contains(&key(0)) && !c.contains(&key(1)), "block 1 was the least recently used");
        // A crash tears the newest write, not the block read last.
        assert!(c.lookup(&key(3)).is_some());
        assert_eq!(c.tear_newest(), Some(key(8)));
        c.check_invariants();
    }

    #[test]
    fn budgets_split_as_the_disk_store_splits_its_slots() {
        assert_eq!(budgets(10), (8, 2));
        assert_eq!(budgets(24), (19, 5));
        assert_eq!(budgets(2), (1, 1));
        assert_eq!(budgets(1), (1, 1));
    }
}
