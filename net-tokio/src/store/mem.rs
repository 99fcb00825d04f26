//! The RAM tier: a fixed set of recycled slabs under plain LRU (store.md §5).

use std::collections::HashMap;

use bytes::Bytes;
use dart_core::hash::BlockKey;

use super::lru::SlotList;

/// RAM hot set of `slots` blocks of at most `block_bytes`.
///
/// Each slot holds one immutable, reference-counted block: a put makes one copy, and a hit hands
/// out another reference to it (no copy, whatever the slice the reader needs; measured: a 64 KiB
/// hit on a 4 MiB block used to copy all 4 MiB). A reader's reference stays valid after its slot
/// is reused, because reuse replaces the slot's buffer instead of writing into it.
/// [`MemTier::len`] is the index length: O(1) and exact on every path by construction
/// (issue #18 A1).
#[derive(Debug)]
pub(crate) struct MemTier {
    block_bytes: usize,
    slabs: Vec<Bytes>,
    keys: Vec<Option<BlockKey>>,
    index: HashMap<BlockKey, u32>,
    lru: SlotList,
    free: Vec<u32>,
    /// Set by [`MemTier::close`]; a closed tier keeps nothing.
    closed: bool,
}

impl MemTier {
    /// An empty tier of `slots >= 1` slabs.
    pub(crate) fn new(slots: u32, block_bytes: usize) -> Self {
        assert!(slots >= 1 && block_bytes >= 1);
        MemTier {
            block_bytes,
            slabs: vec![Bytes::new(); slots as usize],
            keys: vec![None; slots as usize],
            index: HashMap::with_capacity(slots as usize),
            lru: SlotList::new(slots),
            free: (0..slots).rev().collect(),
            closed: false,
        }
    }

    /// Number of slabs.
    pub(crate) fn slots(&self) -> u32 {
        self.keys.len() as u32
    }

    /// Number of blocks held; O(1).
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether `key` is held, without touching recency.
    pub(crate) fn contains(&self, key: &BlockKey) -> bool {
        self.index.contains_key(key)
    }

    /// `key`'s bytes (a shared reference to an immutable buffer), refreshing its recency.
    pub(crate) fn get(&mut self, key: &BlockKey) -> Option<Bytes> {
        let slot = *self.index.get(key)?;
        self.lru.touch(slot);
        Some(self.slabs[slot as usize].clone())
    }

    /// Stores `data` under `key`, evicting the LRU slab if full. Write-once: a held key keeps its
    /// bytes and only has its recency refreshed. Returns whether the tier holds `key` afterwards
    /// (always, unless closed).
    ///
    /// A block of at least half a slab is kept as a handle on the caller's buffer, not a copy:
    /// such buffers are allocated for one block (a joined body, a disk read), so a slab still holds
    /// at most about a block. A smaller block is copied, so that it cannot pin a larger buffer it
    /// is a slice of (one part of an HTTP read buffer).
    pub(crate) fn put(&mut self, key: BlockKey, data: &Bytes) -> bool {
        assert!(!data.is_empty() && data.len() <= self.block_bytes);
        if self.closed {
            return false;
        }
        if let Some(&slot) = self.index.get(&key) {
            self.lru.touch(slot);
            return true;
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let victim = self.lru.back().expect("a full tier has an LRU slab");
                self.unlink(victim);
                victim
            }
        };
        self.slabs[slot as usize] = if data.len() >= self.block_bytes / 2 {
            data.clone()
        } else {
            Bytes::copy_from_slice(data)
        };
        self.keys[slot as usize] = Some(key);
        self.index.insert(key, slot);
        self.lru.push_front(slot);
        true
    }

    /// Drops `key`; returns whether it was held.
    pub(crate) fn remove(&mut self, key: &BlockKey) -> bool {
        let Some(&slot) = self.index.get(key) else {
            return false;
        };
        self.unlink(slot);
        self.slabs[slot as usize] = Bytes::new();
        self.free.push(slot);
        true
    }

    /// Held keys, most recently used first.
    pub(crate) fn keys(&self) -> Vec<BlockKey> {
        self.lru.iter().map(|s| self.keys[s as usize].expect("linked slab has a key")).collect()
    }

    /// Drops every block, releases the slabs' memory and refuses later puts; idempotent.
    pub(crate) fn close(&mut self) {
        self.closed = true;
        self.index.clear();
        self.lru.clear();
        self.keys.fill(None);
        self.slabs.iter_mut().for_each(|s| *s = Bytes::new());
        self.free = (0..self.slots()).rev().collect();
    }

    /// Unlinks a held slab from the index and the list, leaving it on neither list.
    fn unlink(&mut self, slot: u32) {
        let key = self.keys[slot as usize].take().expect("held slab has a key");
        self.index.remove(&key);
        self.lru.unlink(slot);
    }

    /// Asserts that index, keys, list and free list partition the slabs.
    pub(crate) fn check_invariants(&self) {
        self.lru.check_invariants();
        assert_eq!(self.index.len(), self.lru.len());
        assert_eq!(self.index.len() + self.free.len(), self.keys.len());
        for (key, &slot) in &self.index {
            assert_eq!(self.keys[slot as usize], Some(*key));
            assert!(self.lru.contains(slot));
        }
        for &slot in &self.free {
            assert!(self.keys[slot as usize].is_none() && !self.lru.contains(slot));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dart_core::hash::ChunkKey;

    fn key(i: u64) -> BlockKey {
        BlockKey { chunk: ChunkKey(i), block: i }
    }

    #[test]
    fn mem_len_counter_is_exact_across_put_refresh_evict_delete_and_close() {
        let mut m = MemTier::new(3, 8);
        let mut expected = 0;
        let check = |m: &MemTier, want: usize| {
            m.check_invariants();
            assert_eq!(m.len(), want);
            assert_eq!(m.len(), m.keys().len());
        };
        for i in 0..3 {
            m.put(key(i), &Bytes::from_static(b"abc"));
            expected += 1;
            check(&m, expected);
        }
        m.put(key(1), &Bytes::from_static(b"refresh"));
        check(&m, 3);
        m.put(key(9), &Bytes::from_static(b"evicts 0"));
        check(&m, 3);
        assert!(!m.contains(&key(0)));
        assert!(m.remove(&key(1)));
        check(&m, 2);
        assert!(!m.remove(&key(1)));
        check(&m, 2);
        m.close();
        check(&m, 0);
        m.close();
        check(&m, 0);
        assert!(!m.put(key(4), &Bytes::from_static(b"late")), "a closed tier keeps nothing");
        check(&m, 0);
    }

    #[test]
    fn mem_put_is_write_once_and_refreshes_recency() {
        let mut m = MemTier::new(2, 8);
        m.put(key(1), &Bytes::from_static(b"first"));
        m.put(key(2), &Bytes::from_static(b"two"));
        m.put(key(1), &Bytes::from_static(b"second"));
        m.put(key(3), &Bytes::from_static(b"three"));
        assert_eq!(m.get(&key(1)).unwrap(), &b"first"[..]);
        assert!(!m.contains(&key(2)), "2 was the LRU after 1's refresh");
    }

    #[test]
    fn mem_get_returns_a_copy_that_survives_slab_recycling() {
        let mut m = MemTier::new(1, 8);
        m.put(key(1), &Bytes::from_static(b"one"));
        let got = m.get(&key(1)).unwrap();
        m.put(key(2), &Bytes::from_static(b"TWO!"));
        assert_eq!(got, &b"one"[..]);
        assert_eq!(m.get(&key(2)).unwrap(), &b"TWO!"[..]);
        assert_eq!(m.get(&key(1)), None);
    }
}
