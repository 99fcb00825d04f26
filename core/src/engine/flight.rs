//! Singleflight table for origin fetches (spec/fetch.md §5): who leads a fetch, who joins it, when
//! a stuck flight is replaced, and what a joiner does with the result.
//!
//! # Driving contract
//!
//! A caller about to fetch key `k` calls [`FlightTable::begin`]. With [`Role::Lead`] it performs
//! the fetch and then calls [`FlightTable::finish`] with the flight id **before** publishing the
//! result to joiners (issue #69: a call that starts after a flight returned must never join it).
//! With [`Role::Join`] it waits for the leader's published result (the shell's job) and then asks
//! [`joiner_action`] whether to use it or retry alone. A flight older than `max_flight + grace` is
//! stale: the next caller replaces it, and the stale leader's late `finish` removes nothing
//! because its id no longer matches.
//!
//! # Invariants
//! - At most one live flight per key; at most [`FLIGHTS_MAX`] flights tracked.
//! - Flight ids are never reused.

use crate::time::Instant;
use std::collections::BTreeMap;
use std::time::Duration;

use super::origin::OriginError;

/// Most flights tracked at once; past it callers fetch uncoalesced rather than grow the table.
pub const FLIGHTS_MAX: usize = 65_536;
/// Default bound on one flight's lifetime (the shell cancels the fetch at this age).
pub const DEFAULT_MAX_FLIGHT: Duration = Duration::from_secs(600);
/// Extra age past `max_flight` before a flight is considered stale and replaceable.
pub const STALE_GRACE: Duration = Duration::from_secs(1);

/// What an origin flight fetches, keyed by object identity (never by URL: a presigned query
/// differs per caller while the bytes do not).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FlightKey {
    /// The size probe of an object.
    Probe(String),
    /// The inclusive window `start..=end` of an object.
    Block(String, u64, u64),
}

/// Compact trace form (the identity is the same for every window of an object).
impl std::fmt::Display for FlightKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FlightKey::Probe(_) => f.write_str("probe"),
            FlightKey::Block(_, s, e) => write!(f, "{s}-{e}"),
        }
    }
}

/// Identifies one flight; never reused within a table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlightId(pub u64);

/// A caller's part in a flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Perform the fetch, then [`FlightTable::finish`] before publishing.
    Lead(FlightId),
    /// Wait for this flight's result.
    Join(FlightId),
    /// The table is full: fetch alone, uncoalesced, and do not call `finish`.
    Alone,
}

#[derive(Clone, Copy, Debug)]
struct Flight {
    id: FlightId,
    started: Instant,
}

/// The flight table; see the module doc for the driving contract.
#[derive(Debug)]
pub struct FlightTable<K: Ord + Clone> {
    flights: BTreeMap<K, Flight>,
    next_id: u64,
    max_flight: Duration,
}

impl<K: Ord + Clone> FlightTable<K> {
    /// An empty table whose flights live at most `max_flight`.
    pub fn new(max_flight: Duration) -> Self {
        assert!(max_flight > Duration::ZERO, "max_flight must be positive");
        FlightTable { flights: BTreeMap::new(), next_id: 0, max_flight }
    }

    /// The per-flight lifetime bound the shell must enforce on the fetch itself.
    pub fn max_flight(&self) -> Duration {
        self.max_flight
    }

    /// Leads or joins the flight for `key` at `now`.
    pub fn begin(&mut self, key: &K, now: Instant) -> Role {
        if let Some(f) = self.flights.get(key) {
            let age = now.saturating_duration_since(f.started);
            if age <= self.max_flight + STALE_GRACE {
                return Role::Join(f.id);
            }
            self.flights.remove(key);
        }
        if self.flights.len() >= FLIGHTS_MAX {
            return Role::Alone;
        }
        let id = FlightId(self.next_id);
        self.next_id += 1;
        self.flights.insert(key.clone(), Flight { id, started: now });
        debug_assert!(self.flights.len() <= FLIGHTS_MAX);
        Role::Lead(id)
    }

    /// Ends flight `id` for `key`; returns false (and removes nothing) when the entry now belongs
    /// to a replacement flight or is already gone.
    pub fn finish(&mut self, key: &K, id: FlightId) -> bool {
        match self.flights.get(key) {
            Some(f) if f.id == id => {
                self.flights.remove(key);
                true
            }
            Some(_) | None => false,
        }
    }

    /// Flights currently tracked.
    pub fn len(&self) -> usize {
        self.flights.len()
    }

    /// True when no flight is tracked.
    pub fn is_empty(&self) -> bool {
        self.flights.is_empty()
    }

    /// Asserts the table's invariants.
    pub fn check_invariants(&self) {
        assert!(self.flights.len() <= FLIGHTS_MAX);
        for f in self.flights.values() {
            assert!(f.id.0 < self.next_id, "flight id from the future");
        }
    }
}

/// What a joiner does with the leader's published result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinerAction {
    /// Use the shared result (success, or an error that is not about credentials).
    Use,
    /// The leader's credential was refused (401/403): retry once, alone, with the joiner's own
    /// URL, if the joiner is still waiting.
    RetryAlone,
}

/// The joiner's decision given the leader's error (or `None` on success) and whether the joiner's
/// own caller is still live.
pub fn joiner_action(leader_error: Option<&OriginError>, caller_live: bool) -> JoinerAction {
    match leader_error {
        Some(e) if e.is_refusal() && caller_live => JoinerAction::RetryAlone,
        Some(_) | None => JoinerAction::Use,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: u64) -> Instant {
        Instant::from_secs(s)
    }

    #[test]
    fn concurrent_callers_of_one_key_share_one_flight() {
        let mut ft = FlightTable::new(DEFAULT_MAX_FLIGHT);
        let lead = ft.begin(&"k", t(0));
        let Role::Lead(id) = lead else { panic!("first caller must lead") };
        assert_eq!(ft.begin(&"k", t(1)), Role::Join(id));
        assert!(matches!(ft.begin(&"other", t(1)), Role::Lead(_)));
        ft.check_invariants();
    }

    #[test]
    fn a_call_after_the_flight_finished_never_joins_it() {
        let mut ft = FlightTable::new(DEFAULT_MAX_FLIGHT);
        let Role::Lead(id) = ft.begin(&"k", t(0)) else { panic!() };
        assert!(ft.finish(&"k", id));
        let Role::Lead(id2) = ft.begin(&"k", t(0)) else { panic!("must lead a fresh flight") };
        assert_ne!(id, id2);
    }

    #[test]
    fn a_stale_flight_is_replaced_and_its_late_leader_keeps_the_replacement() {
        let max = Duration::from_secs(10);
        let mut ft = FlightTable::new(max);
        let Role::Lead(old) = ft.begin(&"k", t(0)) else { panic!() };
        assert_eq!(ft.begin(&"k", t(11)), Role::Join(old), "within grace it still joins");
        let Role::Lead(new) = ft.begin(&"k", t(12)) else { panic!("stale flight replaced") };
        assert!(!ft.finish(&"k", old), "late stale leader must not delete the replacement");
        assert_eq!(ft.begin(&"k", t(12)), Role::Join(new));
        assert!(ft.finish(&"k", new));
        assert!(ft.is_empty());
    }

    #[test]
    fn time_going_backwards_does_not_make_a_flight_stale() {
        let mut ft = FlightTable::new(Duration::from_secs(10));
        let Role::Lead(id) = ft.begin(&"k", t(100)) else { panic!() };
        assert_eq!(ft.begin(&"k", t(0)), Role::Join(id));
    }

    #[test]
    fn joiners_retry_alone_only_on_refusals_and_only_while_waiting() {
        let refused = OriginError::Status { status: 403, challenge: None };
        let failed = OriginError::Status { status: 500, challenge: None };
        assert_eq!(joiner_action(Some(&refused), true), JoinerAction::RetryAlone);
        assert_eq!(joiner_action(Some(&refused), false), JoinerAction::Use);
        assert_eq!(joiner_action(Some(&failed), true), JoinerAction::Use);
        assert_eq!(joiner_action(None, true), JoinerAction::Use);
    }
}
