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
///
/// A block read a second time while held ([`SEAL_AFTER`] hits) is due to be sealed: copied into a
/// sealed memory file ([`crate::sealed`]) whose pages a socket can take without a copy. The tier
/// only names the blocks due ([`MemTier::take_due`]); the store copies them outside its lock and
/// swaps each in where the slab still holds the same buffer ([`MemTier::replace`]).
#[derive(Debug)]
pub(crate) struct MemTier {
    block_bytes: usize,
    /// Whether blocks read often are sealed ([`MemTier::stop_sealing`] turns it off for good).
    sealing: bool,
    /// Most slabs sealed at once (each is a descriptor: [`MemTier::set_sealed_max`]).
    sealed_max: usize,
    /// Which slabs hold a sealed block, and how many do.
    sealed: Vec<bool>,
    sealed_count: usize,
    /// Hits of each slab's block since it was put, up to [`SEAL_AFTER`].
    hits: Vec<u8>,
    /// Keys due to be sealed, at most [`DUE_MAX`].
    due: Vec<BlockKey>,
    slabs: Vec<Bytes>,
    keys: Vec<Option<BlockKey>>,
    index: HashMap<BlockKey, u32>,
    lru: SlotList,
    free: Vec<u32>,
    /// Set by [`MemTier::close`]; a closed tier keeps nothing.
    closed: bool,
}

/// Hits after which a held block is due to be sealed: a block read again is likely read more.
pub(crate) const SEAL_AFTER: u8 = 2;

/// Most blocks sealed at once unless [`MemTier::set_sealed_max`] says otherwise.
pub const SEALED_MAX_DEFAULT: usize = 256;

/// Most keys due to be sealed at once; a hit that finds the list full leaves its block as it is
/// (its next hits do not ask again: it is sealed only if a later put brings it back).
const DUE_MAX: usize = 16;

impl MemTier {
    /// An empty tier of `slots >= 1` slabs.
    pub(crate) fn new(slots: u32, block_bytes: usize) -> Self {
        assert!(slots >= 1 && block_bytes >= 1);
        MemTier {
            block_bytes,
            // madsim's sockets are simulated: nothing there could send from a sealed block.
            sealing: cfg!(not(madsim)),
            sealed_max: SEALED_MAX_DEFAULT,
            sealed: vec![false; slots as usize],
            sealed_count: 0,
            hits: vec![0; slots as usize],
            due: Vec::new(),
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
        let hits = &mut self.hits[slot as usize];
        if *hits < SEAL_AFTER {
            *hits += 1;
            let room = self.sealed_count + self.due.len() < self.sealed_max;
            if *hits == SEAL_AFTER && self.sealing && room && self.due.len() < DUE_MAX {
                self.due.push(*key);
            }
        }
        Some(self.slabs[slot as usize].clone())
    }

    /// Whether a block is due to be sealed.
    pub(crate) fn has_due(&self) -> bool {
        !self.due.is_empty()
    }

    /// The blocks due to be sealed that are still held and not sealed yet, leaving none due.
    pub(crate) fn take_due(&mut self) -> Vec<(BlockKey, Bytes)> {
        let due = std::mem::take(&mut self.due);
        due.into_iter()
            .filter_map(|key| {
                let slab = &self.slabs[*self.index.get(&key)? as usize];
                (!crate::sealed::is_sealed(slab)).then(|| (key, slab.clone()))
            })
            .collect()
    }

    /// Puts `sealed`, a copy of `old` (the caller's to check), in `key`'s slab if it still holds
    /// `old` (the same buffer): readers holding `old` keep it. Returns whether it did.
    pub(crate) fn replace(&mut self, key: &BlockKey, old: &Bytes, sealed: Bytes) -> bool {
        let Some(&slot) = self.index.get(key) else { return false };
        let slab = &mut self.slabs[slot as usize];
        if slab.as_ptr() != old.as_ptr() || slab.len() != old.len() || sealed.len() != old.len() {
            return false;
        }
        *slab = sealed;
        if !std::mem::replace(&mut self.sealed[slot as usize], true) {
            self.sealed_count += 1;
        }
        true
    }

    /// Seals at most `max` slabs at once: each sealed block holds a descriptor, which the node
    /// budgets against its open-file limit. 0 seals none.
    pub(crate) fn set_sealed_max(&mut self, max: usize) {
        self.sealed_max = max;
    }

    /// Slabs holding a sealed block.
    pub(crate) fn sealed_count(&self) -> usize {
        self.sealed_count
    }

    /// Slot `slot` no longer holds its block: it is not sealed any more.
    fn unseal(&mut self, slot: u32) {
        if std::mem::replace(&mut self.sealed[slot as usize], false) {
            self.sealed_count -= 1;
        }
    }

    /// Seals no more blocks (the system refused a memory file); drops the keys due.
    pub(crate) fn stop_sealing(&mut self) {
        self.sealing = false;
        self.due.clear();
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
        self.unseal(slot);
        self.keys[slot as usize] = Some(key);
        self.hits[slot as usize] = 0;
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
        self.unseal(slot);
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
        self.due.clear();
        self.sealed.fill(false);
        self.sealed_count = 0;
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
            assert!(!self.sealed[slot as usize], "a free slab holds no sealed block");
        }
        let sealed = self.sealed.iter().filter(|&&s| s).count();
        assert_eq!(sealed, self.sealed_count);
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
    fn a_block_read_twice_is_due_to_be_sealed_once_and_swapped_only_while_still_held() {
        // Blocks of at least half a slab are kept as the caller's handles.
        let mut m = MemTier::new(2, 6);
        let one = Bytes::from(b"one".to_vec());
        m.put(key(1), &one);
        m.put(key(2), &Bytes::from(b"two".to_vec()));
        assert!(m.get(&key(1)).is_some() && !m.has_due(), "one hit is not enough");
        assert!(m.get(&key(1)).is_some() && m.has_due(), "the second hit makes it due");
        m.get(&key(1));
        let due = m.take_due();
        assert_eq!(due.len(), 1, "due once, however often it is read");
        assert!(!m.has_due() && m.take_due().is_empty());
        let (k, old) = &due[0];
        assert_eq!((*k, old.as_ptr()), (key(1), one.as_ptr()));
        let sealed = crate::sealed::seal(old).expect("memfd");
        assert!(!m.replace(k, &Bytes::from(b"one".to_vec()), sealed.clone()), "another buffer");
        assert!(m.replace(k, old, sealed.clone()));
        assert_eq!(m.get(&key(1)).map(|b| b.as_ptr()), Some(sealed.as_ptr()));
        assert!(!m.replace(k, old, sealed.clone()), "it no longer holds the old buffer");
        m.check_invariants();

        // A key put again after an eviction is a new block: its hits start again, and a block
        // due whose slab was reused meanwhile is not sealed.
        m.get(&key(2));
        m.get(&key(2));
        m.put(key(3), &Bytes::from(b"three".to_vec()));
        m.put(key(4), &Bytes::from(b"four".to_vec()));
        assert!(m.take_due().is_empty(), "key 2 left before its turn");
        m.get(&key(4));
        assert!(!m.has_due());
        m.stop_sealing();
        m.get(&key(4));
        assert!(!m.has_due(), "a tier that stopped sealing names nothing");
    }

    #[test]
    fn sealed_blocks_stay_within_their_cap_and_leave_it_with_their_slab() {
        let mut m = MemTier::new(3, 4);
        m.set_sealed_max(1);
        let blocks: Vec<Bytes> = (0..3).map(|i| Bytes::from(vec![i as u8; 4])).collect();
        for (i, b) in blocks.iter().enumerate() {
            m.put(key(i as u64), b);
            m.get(&key(i as u64));
            m.get(&key(i as u64));
        }
        let due = m.take_due();
        assert_eq!(due.len(), 1, "the cap leaves room for one");
        let (k, old) = &due[0];
        assert!(m.replace(k, old, crate::sealed::seal(old).expect("memfd")));
        assert_eq!(m.sealed_count(), 1);
        m.check_invariants();
        m.get(&key(1));
        m.get(&key(2));
        assert!(!m.has_due(), "full: nothing more is due");
        assert!(m.remove(k));
        assert_eq!(m.sealed_count(), 0, "its slab let it go");
        m.put(key(7), &Bytes::from_static(b"new!"));
        m.get(&key(7));
        m.get(&key(7));
        assert!(m.has_due(), "room again");
        m.check_invariants();
        m.close();
        assert_eq!(m.sealed_count(), 0);
        m.check_invariants();
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
