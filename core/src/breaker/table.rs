//! The tracked peers: an index-ordered slab of entries, an address index into it and an
//! intrusive least-recently-active list through it.
//!
//! A permit names its slot, so completing one costs no address comparison; the list makes both
//! stamping activity and finding the eviction victim O(1).

use std::collections::BTreeMap;

use super::entry::Entry;

/// "No slot" in the intrusive list.
const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Slot<K> {
    key: K,
    entry: Entry,
    /// Next less recently active slot, or `NIL`.
    older: usize,
    /// Next more recently active slot, or `NIL`.
    newer: usize,
}

/// Entries keyed by address, stored in reusable slots, ordered by activity.
#[derive(Debug)]
pub(super) struct PeerTable<K> {
    index: BTreeMap<K, usize>,
    slots: Vec<Option<Slot<K>>>,
    /// Vacant slots, reused last-freed first (deterministic).
    free: Vec<usize>,
    /// Least recently active slot, or `NIL` when empty.
    oldest: usize,
    /// Most recently active slot, or `NIL` when empty.
    newest: usize,
}

impl<K: Ord + Clone> PeerTable<K> {
    pub(super) fn new() -> Self {
        PeerTable {
            index: BTreeMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            oldest: NIL,
            newest: NIL,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    /// The slot holding `key`.
    pub(super) fn find(&self, key: &K) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// The entry in slot `i`, if occupied (a permit's slot may have been freed or reused).
    pub(super) fn get(&self, i: usize) -> Option<&Entry> {
        self.slots.get(i)?.as_ref().map(|slot| &slot.entry)
    }

    pub(super) fn entry(&self, i: usize) -> &Entry {
        &self.slot(i).entry
    }

    pub(super) fn entry_mut(&mut self, i: usize) -> &mut Entry {
        &mut self.slots[i].as_mut().expect("occupied slot").entry
    }

    pub(super) fn key(&self, i: usize) -> &K {
        &self.slot(i).key
    }

    fn slot(&self, i: usize) -> &Slot<K> {
        self.slots[i].as_ref().expect("occupied slot")
    }

    fn slot_mut(&mut self, i: usize) -> &mut Slot<K> {
        self.slots[i].as_mut().expect("occupied slot")
    }

    /// Adds `key` as the most recently active entry; returns its slot.
    pub(super) fn insert(&mut self, key: K, entry: Entry) -> usize {
        let slot = Slot { key: key.clone(), entry, older: NIL, newer: NIL };
        let i = match self.free.pop() {
            Some(i) => {
                debug_assert!(self.slots[i].is_none());
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        let previous = self.index.insert(key, i);
        assert!(previous.is_none(), "key already tracked");
        self.link_newest(i);
        i
    }

    /// Removes slot `i`, returning its key and entry.
    pub(super) fn remove(&mut self, i: usize) -> (K, Entry) {
        self.unlink(i);
        let slot = self.slots[i].take().expect("occupied slot");
        self.index.remove(&slot.key).expect("index mirrors slots");
        self.free.push(i);
        (slot.key, slot.entry)
    }

    /// Marks slot `i` most recently active.
    pub(super) fn make_newest(&mut self, i: usize) {
        if self.newest != i {
            self.unlink(i);
            self.link_newest(i);
        }
    }

    /// The least recently active slot.
    pub(super) fn oldest(&self) -> Option<usize> {
        (self.oldest != NIL).then_some(self.oldest)
    }

    /// Occupied slots in slot order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (usize, &K, &Entry)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| slot.as_ref().map(|s| (i, &s.key, &s.entry)))
    }

    fn link_newest(&mut self, i: usize) {
        let newest = self.newest;
        {
            let slot = self.slot_mut(i);
            slot.older = newest;
            slot.newer = NIL;
        }
        if newest == NIL {
            self.oldest = i;
        } else {
            self.slot_mut(newest).newer = i;
        }
        self.newest = i;
    }

    fn unlink(&mut self, i: usize) {
        let (older, newer) = {
            let slot = self.slot(i);
            (slot.older, slot.newer)
        };
        if older == NIL {
            self.oldest = newer;
        } else {
            self.slot_mut(older).newer = newer;
        }
        if newer == NIL {
            self.newest = older;
        } else {
            self.slot_mut(newer).older = older;
        }
    }

    /// Asserts the slab, index and list agree, and activity ticks rise from oldest to newest.
    pub(super) fn check(&self, capacity: usize) {
        assert!(self.slots.len() <= capacity, "slab above its cap");
        assert_eq!(self.index.len() + self.free.len(), self.slots.len());
        for (key, &i) in &self.index {
            assert!(self.slot(i).key == *key);
        }
        for &i in &self.free {
            assert!(self.slots[i].is_none());
        }
        let (mut walked, mut at, mut last_tick) = (0, self.oldest, None);
        let mut previous = NIL;
        while at != NIL {
            let slot = self.slot(at);
            assert_eq!(slot.older, previous);
            assert!(last_tick < Some(slot.entry.last_active), "list out of activity order");
            last_tick = Some(slot.entry.last_active);
            previous = at;
            at = slot.newer;
            walked += 1;
            assert!(walked <= self.index.len(), "cycle in the activity list");
        }
        assert_eq!(previous, self.newest);
        assert_eq!(walked, self.index.len());
    }
}
