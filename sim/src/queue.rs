//! The event queue: a binary heap ordered by `(time, sequence)`, so events at the same instant
//! run in the order they were scheduled and a run replays exactly from its seed. (A heap in one
//! array, not an ordered map of nodes: a 10,000-node herd keeps hundreds of thousands of events
//! pending, and the map's pointer walks missed the cache at every push and pop.)

use dart_core::time::Instant;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// Most events pending at once; a run past it is a runaway (a timer storm or a message loop).
pub const EVENTS_PENDING_MAX: usize = 1 << 22;

/// A time-ordered queue of `E`.
#[derive(Debug)]
pub struct Queue<E> {
    events: BinaryHeap<Reverse<Entry<E>>>,
    next_seq: u64,
}

/// A pending event, ordered by when it is due and then by when it was scheduled (the pair is
/// unique, so the order is total and the event itself is never compared).
#[derive(Debug)]
struct Entry<E> {
    at: Instant,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl<E> Eq for Entry<E> {}

impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue { events: BinaryHeap::new(), next_seq: 0 }
    }
}

impl<E> Queue<E> {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Instant, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.events.push(Reverse(Entry { at, seq, event }));
        assert!(self.events.len() <= EVENTS_PENDING_MAX, "event queue above its bound");
    }

    /// The earliest event, removed.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        self.events.pop().map(|Reverse(e)| (e.at, e.event))
    }

    /// When the earliest event is due.
    pub fn peek_time(&self) -> Option<Instant> {
        self.events.peek().map(|Reverse(e)| e.at)
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_pop_in_time_order_and_fifo_within_an_instant() {
        let mut q = Queue::default();
        q.push(Instant::from_millis(5), "late");
        q.push(Instant::from_millis(1), "first");
        q.push(Instant::from_millis(1), "second");
        assert_eq!(q.pop(), Some((Instant::from_millis(1), "first")));
        assert_eq!(q.pop(), Some((Instant::from_millis(1), "second")));
        assert_eq!(q.peek_time(), Some(Instant::from_millis(5)));
        assert_eq!(q.len(), 1);
    }
}
