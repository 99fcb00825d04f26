//! The event queue: one ordered map keyed by `(time, sequence)`, so events at the same instant
//! run in the order they were scheduled and a run replays exactly from its seed.

use dart_core::time::Instant;
use std::collections::BTreeMap;

/// Most events pending at once; a run past it is a runaway (a timer storm or a message loop).
pub const EVENTS_PENDING_MAX: usize = 1 << 22;

/// A time-ordered queue of `E`.
#[derive(Debug)]
pub struct Queue<E> {
    events: BTreeMap<(Instant, u64), E>,
    next_seq: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Queue { events: BTreeMap::new(), next_seq: 0 }
    }
}

impl<E> Queue<E> {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Instant, event: E) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.events.insert((at, seq), event);
        assert!(self.events.len() <= EVENTS_PENDING_MAX, "event queue above its bound");
    }

    /// The earliest event, removed.
    pub fn pop(&mut self) -> Option<(Instant, E)> {
        self.events.pop_first().map(|((at, _), e)| (at, e))
    }

    /// When the earliest event is due.
    pub fn peek_time(&self) -> Option<Instant> {
        self.events.first_key_value().map(|(&(at, _), _)| at)
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
