//! The node's scored neighbours (spec/overlay.md §3 and §5): a [`NeighbourSet`] over the
//! members of the view, kept up to date from membership, scored by the outcomes of every peer
//! exchange with them, pinged with a roster exchange, and asked for a block the node would
//! otherwise read from the origin.
//!
//! # Driving contract
//!
//! The engine owns one [`Neighbours`] once [`super::Engine::enable_neighbours`] was called; the
//! node machine drives it (every call takes `now`; the seeded RNG is inside):
//!
//! 1. At [`Neighbours::poll_timeout`] call [`Neighbours::handle_timeout`] with the current view:
//!    it runs the set's update when due ([`UPDATE_INTERVAL`], and at once after
//!    [`Neighbours::on_view`] found the set short) and answers the neighbour to ping when a ping
//!    is due ([`PING_INTERVAL`]); the node pings with a roster fetch and reports the outcome with
//!    [`Neighbours::observe`].
//! 2. When membership publishes a new view call [`Neighbours::on_view`]: members gone from it
//!    leave the set (their punishments are remembered), the others' entries are refreshed.
//! 3. Every ended peer exchange with a member (block fetch or roster ping) is reported with
//!    [`Neighbours::observe`]; the outcomes of non-neighbours are dropped.
//! 4. A read about to pay the origin asks `Engine::neighbour_relay` for one reliable
//!    neighbour to ask first.
//!
//! # Decisions
//!
//! - **Keys are member ids,** never addresses (pod IPs are reused); the address is looked up in
//!   the view when the neighbour is asked.
//! - **An entry lives as long as membership keeps it.** The roster has no entry TTL: a member in
//!   the view is refreshed to `now + ENTRY_TTL` on every view and update, and a member that left
//!   the view is removed at once (spec §5: "an entry expires when the membership layer forgets
//!   it"). So a healthy neighbour is never rotated out (§6.6).
//! - **What the data plane teaches** (spec §5, [`report`]): a block = accept; a 404, a relay's
//!   upstream refusal, a relay's "upstream slow", another version = ignore (the peer did its
//!   job); a wrong-length or invalid block = malicious; a timeout = failure + slow; a dial
//!   failure, a broken body = failure; any other status = failure; an undecodable body = failure
//!   + minor. A race the node itself cancelled is not a response and is not scored.
//! - **The neighbour relay is cache-only.** Spec §5 has the neighbour fetch through its own tree;
//!   here it is asked without `X-DART-Origin`, so it serves only what it holds. Its own tree may
//!   name this node as its ancestor (a substitute root is the best-ranked usable member for the
//!   others too), and a fetching neighbour would ask this node back: a wait cycle that only the
//!   hop bound ends. What a neighbour can save is a block the cluster already holds, which is
//!   what a dead root leaves behind.

use super::route::PeerRef;
use crate::breaker::Observation;
use crate::membership::{MemberState, View};
use crate::overlay::set::{Candidate, Config, NeighbourSet, Update, ENTRY_TTL};
use crate::overlay::{Fault, NeighbourStats, TransportError};
use crate::rng::Rng;
use crate::time::Instant;
use rand::seq::index::sample;
use rand::Rng as _;
use std::time::Duration;

pub use crate::overlay::set::{PING_INTERVAL, UPDATE_INTERVAL};

/// Views of at most this many Ready members are sampled exactly; larger ones by drawing indices.
pub const EXACT_SAMPLE_MAX: usize = 256;
/// Index draws per wanted candidate in a large view before an update gives up looking.
const SAMPLE_TRIES_PER_WANTED: usize = 8;

/// Counters of the neighbour set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NeighbourCounters {
    /// Set updates run.
    pub updates: u64,
    /// Peers that joined the set.
    pub joined: u64,
    /// Members that left it (unreliable, expired, evicted or gone from the view).
    pub departed: u64,
    /// Pings asked for.
    pub pings: u64,
    /// Outcomes scored.
    pub scored: u64,
}

/// One neighbour as the metrics show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighbourReport {
    /// Member id.
    pub id: String,
    /// Score, `0..=128`.
    pub score: u8,
    /// Selection weight (0: left out of the choice).
    pub weight: u16,
    /// Requests scored.
    pub requests: u64,
    /// Of which failed.
    pub failures: u64,
    /// Moving average round-trip, milliseconds.
    pub round_trip_ms: u16,
}

/// The scored neighbours of one node; see the module doc.
#[derive(Debug)]
pub struct Neighbours {
    set: NeighbourSet<String>,
    rng: Rng,
    next_update: Instant,
    next_ping: Instant,
    counters: NeighbourCounters,
}

impl Neighbours {
    /// An empty set of `config.keep` neighbours; the first update is due at `now`, the first
    /// ping one [`PING_INTERVAL`] later. Panics if `config.keep` is out of range (a caller's
    /// bug: the flag parser refuses it).
    pub fn new(config: Config, rng: Rng, now: Instant) -> Self {
        Neighbours {
            set: NeighbourSet::new(config),
            rng,
            next_update: now,
            next_ping: now + PING_INTERVAL,
            counters: NeighbourCounters::default(),
        }
    }

    /// The set.
    pub fn set(&self) -> &NeighbourSet<String> {
        &self.set
    }

    /// The counters.
    pub fn counters(&self) -> NeighbourCounters {
        self.counters
    }

    /// The next update or ping.
    pub fn poll_timeout(&self) -> Instant {
        self.next_update.min(self.next_ping)
    }

    /// Runs what is due at `now` over `view` (self is `self_id`): the update, then the ping.
    /// Returns the neighbour to ping (id and address), if a ping is due and one has an address.
    /// Afterwards [`Neighbours::poll_timeout`] is later than `now`.
    pub fn handle_timeout(&mut self, view: &View, self_id: &str, now: Instant) -> Option<PeerRef> {
        if self.next_update <= now {
            self.update(view, self_id, now);
        }
        let mut ping = None;
        if self.next_ping <= now {
            self.next_ping = now + PING_INTERVAL;
            if let Some(id) = self.set.ping_target(&mut self.rng) {
                let addr = view.get(&id).map(|m| m.addr.clone()).filter(|a| !a.is_empty());
                if let Some(addr) = addr {
                    self.counters.pings += 1;
                    ping = Some(PeerRef { id, addr });
                }
            }
        }
        assert!(self.poll_timeout() > now, "handle_timeout moves both timers past now");
        ping
    }

    /// A new view: members that left it leave the set; the others' entries are refreshed. When
    /// the set is short of `keep` and the view has members outside it, the next update is due
    /// at once (the overlay's "entries added" signal).
    pub fn on_view(&mut self, view: &View, self_id: &str, now: Instant) {
        let gone: Vec<String> = self
            .set
            .members()
            .filter(|(id, _)| !usable_member(view, self_id, id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            self.set.remove(id, now);
            self.counters.departed += 1;
        }
        self.refresh(view, now);
        let short = self.set.len() < self.set.config().keep;
        if short && self.outside(view, self_id) > 0 {
            self.next_update = self.next_update.min(now);
        }
    }

    /// Scores one ended exchange with member `id` that took `elapsed` ([`report`]); a
    /// non-neighbour's outcome is dropped.
    pub fn observe(&mut self, id: &str, observation: Observation, elapsed: Duration) {
        if let Some(stats) = self.set.stats_mut(&id.to_owned()) {
            if report(stats, observation, elapsed) {
                self.counters.scored += 1;
            }
        }
    }

    /// One reliable neighbour drawn by weight among those `eligible` (by id and address), with
    /// its address in `view`.
    pub(crate) fn choose(
        &mut self,
        view: &View,
        eligible: impl Fn(&str, &str) -> bool,
    ) -> Option<PeerRef> {
        let index = self.set.book().index();
        let addr_of = |id: &str| view.get(id).map(|m| m.addr.as_str()).filter(|a| !a.is_empty());
        let chosen = index.choose_many(1, &mut self.rng, |id| {
            let reliable = self.set.book().get(*id).is_some_and(NeighbourStats::is_reliable);
            reliable && addr_of(id).is_some_and(|addr| eligible(id, addr))
        });
        let id = (**chosen.first()?).clone();
        let addr = addr_of(&id).expect("chosen only with an address").to_owned();
        Some(PeerRef { id, addr })
    }

    /// The neighbours with their stats, by id.
    pub fn report(&self) -> Vec<NeighbourReport> {
        self.set
            .members()
            .filter_map(|(id, _)| {
                let s = self.set.book().get(id)?;
                Some(NeighbourReport {
                    id: id.clone(),
                    score: s.score(),
                    weight: s.selection_weight(),
                    requests: s.requests(),
                    failures: s.failures(),
                    round_trip_ms: s.average_round_trip_ms(),
                })
            })
            .collect()
    }

    /// Panics if an internal invariant is broken.
    pub fn check_invariants(&self) {
        self.set.check_invariants();
        assert!(self.next_update.min(self.next_ping) == self.poll_timeout());
    }

    /// The set's update over `view`: candidates are up to `candidates_wanted` members drawn at
    /// random among the Ready ones with an address, outside the set.
    fn update(&mut self, view: &View, self_id: &str, now: Instant) {
        self.next_update = now + UPDATE_INTERVAL;
        self.refresh(view, now);
        let members: Vec<String> = self.set.members().map(|(id, _)| id.clone()).collect();
        let eligible = |m: &crate::membership::Member| {
            !m.addr.is_empty() && m.id != self_id && !members.contains(&m.id)
        };
        let ready = view.ready().len();
        let wanted = self.set.candidates_wanted();
        let picked: Vec<usize> = if ready <= EXACT_SAMPLE_MAX {
            // A small view: an exact sample of the members outside the set.
            let outside: Vec<usize> =
                (0..ready).filter(|&i| eligible(view.ready_member(i))).collect();
            let k = wanted.min(outside.len());
            sample(&mut self.rng, outside.len(), k).into_iter().map(|j| outside[j]).collect()
        } else {
            // A large view: draw indices and keep the eligible ones, a bounded number of tries,
            // so an update costs O(wanted), not O(members) (10,000 nodes each scanning 10,000
            // members at start was most of a simulated herd's time).
            let mut seen = std::collections::BTreeSet::new();
            let mut picked = Vec::with_capacity(wanted);
            let mut tries = 0;
            while picked.len() < wanted && tries < SAMPLE_TRIES_PER_WANTED * wanted {
                tries += 1;
                let i = self.rng.random_range(0..ready);
                if seen.insert(i) && eligible(view.ready_member(i)) {
                    picked.push(i);
                }
            }
            picked
        };
        assert!(picked.len() <= wanted);
        let expires_at = now + ENTRY_TTL;
        let candidates: Vec<Candidate<String>> = picked
            .into_iter()
            .map(|i| Candidate { peer: view.ready_member(i).id.clone(), expires_at })
            .collect();
        let Update { departed, added, .. } = self.set.update(candidates, now, &mut self.rng);
        self.counters.updates += 1;
        self.counters.joined += added.len() as u64;
        self.counters.departed += departed.len() as u64;
    }

    /// Extends the entry of every member still in `view`.
    fn refresh(&mut self, view: &View, now: Instant) {
        let ids: Vec<String> = self.set.members().map(|(id, _)| id.clone()).collect();
        for id in ids {
            if view.get(&id).is_some() {
                self.set.refresh(&id, now + ENTRY_TTL);
            }
        }
    }

    /// How many usable members of `view` are outside the set.
    fn outside(&self, view: &View, self_id: &str) -> usize {
        view.ready()
            .filter(|m| !m.addr.is_empty() && m.id != self_id && !self.set.contains(&m.id))
            .count()
    }
}

/// Whether `id` is a Ready member of `view` with an address, other than `self_id`.
fn usable_member(view: &View, self_id: &str, id: &str) -> bool {
    id != self_id
        && view.get(id).is_some_and(|m| m.state == MemberState::Ready && !m.addr.is_empty())
}

/// Scores one ended exchange on `stats` (spec/overlay.md §5); false when the outcome is not a
/// response to score (a race this node cancelled).
pub fn report(stats: &mut NeighbourStats, observation: Observation, elapsed: Duration) -> bool {
    match observation {
        Observation::Served => stats.accept(elapsed),
        Observation::Miss
        | Observation::UpstreamRefused { .. }
        | Observation::UpstreamSlow
        | Observation::VersionMismatch => stats.ignore(elapsed),
        Observation::CallerCancelled => return false,
        Observation::TimedOut => stats.transport_error(TransportError::QueryTimeout, elapsed),
        Observation::DialFailed | Observation::BodyInterrupted => {
            stats.transport_error(TransportError::Other, elapsed)
        }
        Observation::UnexpectedStatus(_) => stats.reject(Fault::Wrong, elapsed),
        Observation::MalformedBody => stats.reject(Fault::Meaningless, elapsed),
        Observation::WrongLength | Observation::ValidationFailed => {
            stats.reject(Fault::Invalid, elapsed)
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::Member;
    use crate::overlay::SCORE_INITIAL;

    fn view(n: usize) -> View {
        View::new((0..n).map(|i| Member::ready(&format!("n{i}"), &format!("h{i}:9000"))).collect())
    }

    fn neighbours(keep: usize, seed: u64) -> Neighbours {
        let config = Config { keep, ..Config::default() };
        Neighbours::new(config, crate::rng::from_seed(seed), Instant::ZERO)
    }

    fn stats() -> NeighbourStats {
        NeighbourStats::new(crate::overlay::DEFAULT_ROUND_TRIP)
    }

    #[test]
    fn the_first_update_fills_keep_members_never_self_and_the_ping_comes_an_interval_later() {
        for seed in 0..20 {
            let mut n = neighbours(5, seed);
            let v = view(12);
            assert_eq!(n.poll_timeout(), Instant::ZERO);
            assert!(n.handle_timeout(&v, "n0", Instant::ZERO).is_none());
            assert_eq!(n.set().len(), 5, "seed {seed}");
            assert!(!n.set().contains(&"n0".to_owned()), "seed {seed}: never self");
            assert_eq!(n.poll_timeout(), Instant::ZERO + PING_INTERVAL);
            let ping = n.handle_timeout(&v, "n0", Instant::ZERO + PING_INTERVAL).expect("a ping");
            assert!(n.set().contains(&ping.id), "seed {seed}: pings a neighbour");
            assert_eq!(v.get(&ping.id).map(|m| m.addr.as_str()), Some(ping.addr.as_str()));
            n.check_invariants();
        }
    }

    #[test]
    fn a_large_view_is_sampled_by_index_and_still_fills_keep_distinct_members_never_self() {
        for seed in 0..10 {
            let mut n = neighbours(5, seed);
            let v = view(EXACT_SAMPLE_MAX * 4);
            n.handle_timeout(&v, "n7", Instant::ZERO);
            let ids: Vec<String> = n.set().members().map(|(id, _)| id.clone()).collect();
            assert_eq!(ids.len(), 5, "seed {seed}: {ids:?}");
            assert!(!ids.contains(&"n7".to_owned()), "seed {seed}: never self");
            n.check_invariants();
        }
    }

    #[test]
    fn a_member_gone_from_the_view_leaves_and_the_short_set_refills_at_once() {
        let mut n = neighbours(3, 1);
        let all = view(6);
        n.handle_timeout(&all, "n0", Instant::ZERO);
        let gone = n.set().members().next().map(|(id, _)| id.clone()).expect("a member");
        let rest =
            View::new(all.members().iter().filter(|m| m.id != gone).cloned().collect::<Vec<_>>());
        let t = Instant::from_secs(5);
        n.on_view(&rest, "n0", t);
        assert!(!n.set().contains(&gone));
        assert_eq!(n.poll_timeout(), t, "short of keep with members outside: update now");
        n.handle_timeout(&rest, "n0", t);
        assert_eq!(n.set().len(), 3);
        assert!(n.poll_timeout() > t);
    }

    #[test]
    fn a_full_set_is_not_rescheduled_by_a_view_that_changes_nothing() {
        let mut n = neighbours(3, 2);
        let v = view(6);
        n.handle_timeout(&v, "n0", Instant::ZERO);
        let before: Vec<String> = n.set().members().map(|(id, _)| id.clone()).collect();
        n.on_view(&v, "n0", Instant::from_secs(1));
        assert_eq!(n.poll_timeout(), Instant::ZERO + PING_INTERVAL);
        let after: Vec<String> = n.set().members().map(|(id, _)| id.clone()).collect();
        assert_eq!(before, after);
    }

    #[test]
    fn data_plane_outcomes_score_as_spec_section_5_maps_them() {
        let ms = Duration::from_millis(20);
        let score_after = |o: Observation| {
            let mut s = stats();
            let counted = report(&mut s, o, ms);
            (s.score(), s.requests(), counted)
        };
        assert_eq!(score_after(Observation::Served), (SCORE_INITIAL + 8, 1, true));
        for ignored in [
            Observation::Miss,
            Observation::UpstreamRefused { status: 403 },
            Observation::UpstreamSlow,
            Observation::VersionMismatch,
        ] {
            assert_eq!(score_after(ignored), (SCORE_INITIAL, 1, true), "{ignored:?}");
        }
        assert_eq!(score_after(Observation::CallerCancelled), (SCORE_INITIAL, 0, false));
        assert_eq!(score_after(Observation::TimedOut), (SCORE_INITIAL - 16, 1, true));
        assert_eq!(score_after(Observation::DialFailed), (SCORE_INITIAL - 8, 1, true));
        assert_eq!(score_after(Observation::BodyInterrupted), (SCORE_INITIAL - 8, 1, true));
        assert_eq!(score_after(Observation::UnexpectedStatus(500)), (SCORE_INITIAL - 8, 1, true));
        assert_eq!(score_after(Observation::MalformedBody), (SCORE_INITIAL - 12, 1, true));
        assert_eq!(score_after(Observation::WrongLength), (0, 1, true));
        assert_eq!(score_after(Observation::ValidationFailed), (0, 1, true));
        // Four timeouts take a neighbour from 64 to 0 (spec's worked numbers).
        let mut s = stats();
        for _ in 0..4 {
            report(&mut s, Observation::TimedOut, Duration::from_secs(1));
        }
        assert_eq!(s.score(), 0);
    }

    #[test]
    fn only_neighbours_are_scored_and_a_lying_one_is_never_chosen_again() {
        let mut n = neighbours(4, 3);
        let v = view(5);
        n.handle_timeout(&v, "n0", Instant::ZERO);
        assert_eq!(n.set().len(), 4);
        n.observe("n0", Observation::WrongLength, Duration::ZERO);
        n.observe("stranger", Observation::Served, Duration::ZERO);
        assert_eq!(n.counters().scored, 0, "self and strangers are not neighbours");
        n.observe("n2", Observation::WrongLength, Duration::from_millis(5));
        assert_eq!(n.counters().scored, 1);
        for _ in 0..1000 {
            let chosen = n.choose(&v, |_, _| true).expect("three reliable neighbours");
            assert_ne!(chosen.id, "n2");
        }
        let refused = n.choose(&v, |id, _| id == "n2");
        assert!(refused.is_none(), "the only eligible one is unreliable");
    }

    #[test]
    fn timers_never_go_backwards_with_an_earlier_now() {
        let mut n = neighbours(2, 4);
        let v = view(4);
        let t = Instant::from_secs(100);
        n.handle_timeout(&v, "n0", t);
        let next = n.poll_timeout();
        n.on_view(&v, "n0", Instant::from_secs(1));
        assert_eq!(n.poll_timeout(), next, "nothing due; an earlier now moves nothing");
        n.check_invariants();
    }
}
