//! An intrusive recency list over slot indices: O(1) push, unlink, touch and LRU lookup, with no
//! allocation after construction.

/// "No slot" marker in the link arrays.
const NIL: u32 = u32::MAX;

/// The slots from `first` on, following `links` (`next` or `prev`) to [`NIL`].
fn walk(first: u32, links: &[u32]) -> impl Iterator<Item = u32> + '_ {
    let mut cur = first;
    std::iter::from_fn(move || {
        (cur != NIL).then(|| {
            let slot = cur;
            cur = links[slot as usize];
            slot
        })
    })
}

/// Doubly linked list of slot indices `0..slots`, most recently used first.
#[derive(Debug)]
pub(crate) struct SlotList {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    /// Most recently used slot.
    head: u32,
    /// Least recently used slot: the eviction victim.
    tail: u32,
    len: usize,
}

impl SlotList {
    /// An empty list over `slots` slot indices.
    pub(crate) fn new(slots: u32) -> Self {
        assert!(slots < NIL, "slot count {slots} collides with the NIL marker");
        let n = slots as usize;
        SlotList {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            linked: vec![false; n],
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    /// Number of linked slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `slot` is linked.
    pub(crate) fn contains(&self, slot: u32) -> bool {
        self.linked[slot as usize]
    }

    /// Links an unlinked `slot` as the most recently used.
    pub(crate) fn push_front(&mut self, slot: u32) {
        let i = slot as usize;
        assert!(!self.linked[i], "slot {slot} is already linked");
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head == NIL {
            self.tail = slot;
        } else {
            self.prev[self.head as usize] = slot;
        }
        self.head = slot;
        self.linked[i] = true;
        self.len += 1;
    }

    /// Unlinks a linked `slot`.
    pub(crate) fn unlink(&mut self, slot: u32) {
        let i = slot as usize;
        assert!(self.linked[i], "slot {slot} is not linked");
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.linked[i] = false;
        self.len -= 1;
    }

    /// Makes a linked `slot` the most recently used.
    pub(crate) fn touch(&mut self, slot: u32) {
        if self.head != slot {
            self.unlink(slot);
            self.push_front(slot);
        }
    }

    /// The least recently used slot.
    pub(crate) fn back(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }

    /// Linked slots, most recently used first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        walk(self.head, &self.next)
    }

    /// Linked slots, least recently used first.
    pub(crate) fn iter_from_back(&self) -> impl Iterator<Item = u32> + '_ {
        walk(self.tail, &self.prev)
    }

    /// Unlinks every slot.
    pub(crate) fn clear(&mut self) {
        self.prev.fill(NIL);
        self.next.fill(NIL);
        self.linked.fill(false);
        self.head = NIL;
        self.tail = NIL;
        self.len = 0;
    }

    /// Asserts that the links, the linked flags and the length agree.
    pub(crate) fn check_invariants(&self) {
        let forward: Vec<u32> = self.iter().collect();
        assert_eq!(forward.len(), self.len);
        assert_eq!(self.linked.iter().filter(|&&l| l).count(), self.len);
        assert!(forward.iter().all(|&s| self.linked[s as usize]));
        assert_eq!(forward.last().copied(), self.back());
        let mut backward = Vec::with_capacity(self.len);
        let mut cur = self.tail;
        while cur != NIL {
            backward.push(cur);
            cur = self.prev[cur as usize];
        }
        backward.reverse();
        assert_eq!(forward, backward);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_moves_a_slot_to_the_front_and_back_is_the_least_recent() {
        let mut l = SlotList::new(4);
        assert_eq!(l.back(), None);
        for s in 0..4 {
            l.push_front(s);
        }
        assert_eq!(l.iter().collect::<Vec<_>>(), [3, 2, 1, 0]);
        l.touch(0);
        l.touch(2);
        assert_eq!(l.iter().collect::<Vec<_>>(), [2, 0, 3, 1]);
        assert_eq!(l.iter_from_back().collect::<Vec<_>>(), [1, 3, 0, 2]);
        assert_eq!(l.back(), Some(1));
        l.unlink(1);
        l.unlink(2);
        assert_eq!(l.iter().collect::<Vec<_>>(), [0, 3]);
        assert_eq!(l.iter_from_back().collect::<Vec<_>>(), [3, 0]);
        assert_eq!((l.len(), l.back()), (2, Some(3)));
        assert!(l.contains(0) && !l.contains(1));
        l.check_invariants();
        l.clear();
        assert_eq!((l.len(), l.back()), (0, None));
        l.check_invariants();
    }
}
