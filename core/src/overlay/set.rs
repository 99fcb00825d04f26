//! Neighbour set maintenance (spec/overlay.md §3): which peers are neighbours, as a sans-IO state
//! machine over a [`ScoreBook`].
//!
//! A [`NeighbourSet`] holds at most `keep` neighbours, each with the expiry of the overlay entry it
//! came from, and owns the [`ScoreBook`] of their stats. It never reads a clock or draws ambient
//! randomness: `now` and a seeded RNG come in as arguments.
//!
//! # Driving contract
//!
//! The driver owns one [`NeighbourSet`] (behind `&mut self`):
//!
//! 1. Every [`UPDATE_INTERVAL`] (and once at start, on the empty set, for the initial fill) ask the
//!    overlay for [`NeighbourSet::candidates_wanted`] random members and pass them, each with its
//!    entry's expiry (creation + overlay TTL, [`ENTRY_TTL`] by default), to
//!    [`NeighbourSet::update`]. When [`Update::no_candidates`] is true the overlay offered nobody
//!    outside the set: if the set is below `keep`, wait for the overlay's "entries added" signal
//!    before the next update instead of re-polling.
//! 2. When an overlay entry of a neighbour is refreshed, pass its later expiry to
//!    [`NeighbourSet::refresh`] (or offer the peer again as a candidate: that refreshes it too).
//! 3. Every [`PING_INTERVAL`] ping [`NeighbourSet::ping_target`] and report the outcome on its
//!    stats ([`NeighbourSet::stats_mut`]): a correct answer is [`Verdict::Accept`](super::Verdict::Accept), anything else a
//!    rejection or a [`TransportError`](super::TransportError) (spec §1).
//! 4. When the membership layer removes a peer, call [`NeighbourSet::remove`]: the peer leaves and
//!    a punishment it carried is remembered by the book.
//! 5. To pick targets call [`NeighbourSet::choose_one`] / [`NeighbourSet::choose_many`] (live
//!    weights). A caller that computed something from the membership and applies it later takes
//!    [`NeighbourSet::generation`] first and drops its result unless
//!    [`NeighbourSet::is_current`] still holds (the compare-and-swap guard of §2).
//! 6. The simulator may call [`NeighbourSet::check_invariants`] after every step.
//!
//! # Where this differs from upstream, and why (spec §6)
//!
//! - **No churn of a healthy set (§6.4).** Upstream evicts the worst neighbour on every update, so
//!   a healthy set is churned and, with no spare candidates, oscillates between `keep` and
//!   `keep - 1`. Here the worst member (lowest raw score) is evicted only when a *better
//!   candidate* exists: a candidate the book does not remember (it starts at [`SCORE_INITIAL`])
//!   while the worst member's score is at most `SCORE_INITIAL - EVICT_MARGIN` (32). A member at
//!   33..=128 is never evicted for a newcomer; a remembered candidate (known to score below a
//!   newcomer) never evicts anyone and only fills free slots after fresh candidates. At most
//!   [`EVICTIONS_PER_UPDATE`] per update. Unreliable and expired members are removed whatever the
//!   candidates.
//! - **Expiry follows the entry (§6.6).** A member's expiry is replaced by any later one the
//!   caller reports, and re-read on every update, so a refreshed healthy neighbour is not rotated
//!   out.
//! - **Punishments survive removal (§6.5, §6.9).** Every departure (unreliable, expired, evicted,
//!   removed) goes through [`ScoreBook::depart`], which remembers a low score; a remembered peer
//!   offered again comes back with its old stats. One that would come back unreliable is refused
//!   at once (admitted and departed in the same update), which also restarts its memory.
//! - **Every knob is used (§6.1).** [`Config`] has `keep` and `default_round_trip`; both are
//!   tested.
//! - **Ping covers the whole set.** [`NeighbourSet::ping_target`] is uniform over all members,
//!   including those with weight 0, so an excluded neighbour can earn its way back.

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::Rng;

use super::{NeighbourStats, ScoreBook, DEFAULT_ROUND_TRIP, NEIGHBOURS_MAX, SCORE_INITIAL};
use crate::time::Instant;
use crate::walk_gate::WalkGate;

/// Default number of neighbours kept.
pub const KEEP_DEFAULT: usize = 5;
/// Most neighbours a set may be configured to keep.
pub const KEEP_MAX: usize = 64;
/// How often the driver calls [`NeighbourSet::update`].
pub const UPDATE_INTERVAL: Duration = Duration::from_secs(120);
/// How often the driver pings [`NeighbourSet::ping_target`].
pub const PING_INTERVAL: Duration = Duration::from_secs(30);
/// Default overlay entry lifetime: an entry expires this long after its creation.
pub const ENTRY_TTL: Duration = Duration::from_secs(3600);
/// Most candidates one update looks at; further ones in the caller's list are ignored.
pub const CANDIDATES_MAX: usize = 4 * KEEP_MAX;
/// A member is replaceable by a newcomer only at a score of `SCORE_INITIAL - EVICT_MARGIN` or less.
pub const EVICT_MARGIN: u8 = 32;
/// Most members evicted for a better candidate in one update.
pub const EVICTIONS_PER_UPDATE: usize = 1;

const _: () = assert!(KEEP_MAX < NEIGHBOURS_MAX, "a full set never fills the book");
const _: () = assert!(KEEP_DEFAULT <= KEEP_MAX && EVICT_MARGIN < SCORE_INITIAL);

/// Settings of a [`NeighbourSet`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Most neighbours held, `1..=KEEP_MAX`.
    pub keep: usize,
    /// First round-trip sample of every fresh neighbour.
    pub default_round_trip: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { keep: KEEP_DEFAULT, default_round_trip: DEFAULT_ROUND_TRIP }
    }
}

/// A member of the overlay offered as a neighbour, with its entry's expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate<K> {
    /// The peer.
    pub peer: K,
    /// When its overlay entry expires (entry creation + overlay TTL).
    pub expires_at: Instant,
}

/// Why a member left the set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Departure {
    /// Its score fell below the reliability threshold.
    Unreliable,
    /// Its overlay entry expired.
    Expired,
    /// It was the worst member and a better candidate replaced it.
    Evicted,
    /// The membership layer removed it.
    Removed,
}

/// What one [`NeighbourSet::update`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update<K> {
    /// Members that left, with the reason, in the order they left.
    pub departed: Vec<(K, Departure)>,
    /// Peers that joined, in the order they joined.
    pub added: Vec<K>,
    /// The caller offered no live peer outside the set: below `keep`, wait for "entries added".
    pub no_candidates: bool,
}

/// At most `keep` neighbours, their entry expiries and their stats (spec §3).
#[derive(Clone, Debug)]
pub struct NeighbourSet<K> {
    config: Config,
    /// Members and the expiry of the overlay entry each came from; the book holds the same keys.
    members: BTreeMap<K, Instant>,
    book: ScoreBook<K>,
    /// Incremented on every single join or departure.
    generation: u64,
    /// Gates [`NeighbourSet::check_invariants`]' walk of the members and the book
    /// ([`crate::walk_gate`]): counted by every `&mut self` method that can change them
    /// ([`NeighbourSet::stats_mut`], [`NeighbourSet::refresh`], [`NeighbourSet::remove`],
    /// [`NeighbourSet::update`]; the private helpers run only under those).
    walk_gate: WalkGate,
}

impl<K: Ord + Clone> NeighbourSet<K> {
    /// An empty set; panics unless `config.keep` is in `1..=KEEP_MAX` (a caller's bug).
    pub fn new(config: Config) -> Self {
        assert!(
            (1..=KEEP_MAX).contains(&config.keep),
            "keep {} not in 1..={KEEP_MAX}",
            config.keep
        );
        let set = NeighbourSet {
            config,
            members: BTreeMap::new(),
            book: ScoreBook::new(config.default_round_trip),
            generation: 0,
            walk_gate: WalkGate::default(),
        };
        set.check_invariants();
        set
    }

    /// The settings.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Number of neighbours.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are no neighbours.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `peer` is a neighbour.
    pub fn contains(&self, peer: &K) -> bool {
        self.members.contains_key(peer)
    }

    /// The neighbours and their entry expiries, ordered by peer.
    pub fn members(&self) -> impl Iterator<Item = (&K, Instant)> {
        self.members.iter().map(|(k, e)| (k, *e))
    }

    /// When `peer`'s overlay entry expires, if it is a neighbour.
    pub fn expires_at(&self, peer: &K) -> Option<Instant> {
        self.members.get(peer).copied()
    }

    /// The score book (stats of the members and remembered departures).
    pub fn book(&self) -> &ScoreBook<K> {
        &self.book
    }

    /// Stats of a neighbour, to report a request's or a ping's outcome on.
    pub fn stats_mut(&mut self, peer: &K) -> Option<&mut NeighbourStats> {
        self.walk_gate.changed();
        self.book.get_mut(peer)
    }

    /// The membership generation: it changes on every join and departure.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether nothing joined or left since `generation` was read.
    pub fn is_current(&self, generation: u64) -> bool {
        self.generation == generation
    }

    /// How many candidates to ask the overlay for: `keep + (keep - len)` (spec §3).
    pub fn candidates_wanted(&self) -> usize {
        let wanted = self.config.keep + (self.config.keep - self.members.len());
        assert!(wanted <= 2 * self.config.keep && wanted <= CANDIDATES_MAX);
        wanted
    }

    /// Extends `peer`'s expiry to `expires_at` if it is a neighbour and that is later; returns
    /// whether it is a neighbour. An earlier expiry is ignored (never moves state backwards).
    pub fn refresh(&mut self, peer: &K, expires_at: Instant) -> bool {
        self.walk_gate.changed();
        match self.members.get_mut(peer) {
            Some(at) => {
                *at = (*at).max(expires_at);
                true
            }
            None => false,
        }
    }

    /// The membership layer removed `peer`: it leaves the set and a low score is remembered.
    /// Returns whether it was a neighbour.
    pub fn remove(&mut self, peer: &K, now: Instant) -> bool {
        self.walk_gate.changed();
        let was = self.depart(peer, now);
        self.check_invariants();
        was
    }

    /// One neighbour drawn uniformly from the whole set (weight 0 included); `None` when empty.
    pub fn ping_target<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<K> {
        if self.members.is_empty() {
            return None;
        }
        let at = rng.random_range(0..self.members.len());
        self.members.keys().nth(at).cloned()
    }

    /// One neighbour drawn by live weight ([`ScoreBook::choose_one`]).
    pub fn choose_one<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<K> {
        self.book.choose_one(rng)
    }

    /// Up to `n` distinct neighbours drawn by live weight ([`ScoreBook::choose_many`]).
    pub fn choose_many<R: Rng + ?Sized>(&self, n: usize, rng: &mut R) -> Vec<K> {
        self.book.choose_many(n, rng)
    }

    /// One maintenance round (spec §3, with the §6.4 and §6.6 fixes described in the module doc):
    /// refresh members' expiries from `candidates`, remove unreliable and expired members, evict
    /// the worst member if a better candidate exists, then fill up to `keep` with candidates
    /// drawn at random (fresh ones before remembered ones).
    pub fn update<R: Rng + ?Sized>(
        &mut self,
        candidates: impl IntoIterator<Item = Candidate<K>>,
        now: Instant,
        rng: &mut R,
    ) -> Update<K> {
        self.walk_gate.changed();
        let offered = self.take_candidates(candidates, now);
        let no_candidates = offered.is_empty();
        let mut departed = self.remove_unfit(now);
        let (mut fresh, mut remembered): (Vec<_>, Vec<_>) =
            offered.into_iter().partition(|(peer, _)| !self.book.remembers(peer));
        if !fresh.is_empty() {
            departed.extend(self.evict_worst(now));
        }
        fresh.shuffle(rng);
        remembered.shuffle(rng);
        let added = self.fill(fresh.into_iter().chain(remembered), now);
        assert!(self.members.len() <= self.config.keep);
        self.check_invariants();
        Update { departed, added, no_candidates }
    }

    /// Panics if an internal invariant is broken.
    pub fn check_invariants(&self) {
        assert!((1..=KEEP_MAX).contains(&self.config.keep));
        assert!(self.members.len() <= self.config.keep, "at most keep members");
        assert_eq!(self.members.len(), self.book.len(), "every member has stats, and only they");
        // The walk: only after a writer ran (the simulator checks after every event, most of
        // which change no neighbour).
        self.walk_gate.walk(|| {
            for peer in self.members.keys() {
                assert!(self.book.get(peer).is_some(), "a member has stats in the book");
                assert!(!self.book.remembers(peer), "a member is not also remembered");
            }
            self.book.check_invariants();
        });
    }

    /// The distinct live candidates outside the set (the latest expiry of each), after refreshing
    /// the members among them; at most [`CANDIDATES_MAX`] are looked at.
    fn take_candidates(
        &mut self,
        candidates: impl IntoIterator<Item = Candidate<K>>,
        now: Instant,
    ) -> Vec<(K, Instant)> {
        let mut outside: BTreeMap<K, Instant> = BTreeMap::new();
        for c in candidates.into_iter().take(CANDIDATES_MAX) {
            if self.refresh(&c.peer, c.expires_at) || c.expires_at <= now {
                continue;
            }
            let at = outside.entry(c.peer).or_insert(c.expires_at);
            *at = (*at).max(c.expires_at);
        }
        assert!(outside.len() <= CANDIDATES_MAX);
        outside.into_iter().collect()
    }

    fn remove_unfit(&mut self, now: Instant) -> Vec<(K, Departure)> {
        let unfit: Vec<(K, Departure)> = self
            .members
            .iter()
            .filter_map(|(peer, &expires_at)| {
                let stats = self.book.get(peer).expect("a member has stats");
                if !stats.is_reliable() {
                    Some((peer.clone(), Departure::Unreliable))
                } else if expires_at <= now {
                    Some((peer.clone(), Departure::Expired))
                } else {
                    None
                }
            })
            .collect();
        for (peer, _) in &unfit {
            assert!(self.depart(peer, now));
        }
        unfit
    }

    /// Evicts the lowest-scored member (ties: the smallest peer) when the set is full and that
    /// score is at most `SCORE_INITIAL - EVICT_MARGIN`; the caller has a fresh candidate.
    fn evict_worst(&mut self, now: Instant) -> Option<(K, Departure)> {
        if self.members.len() < self.config.keep {
            return None;
        }
        let (worst, score) = self
            .members
            .keys()
            .map(|peer| (peer, self.book.get(peer).expect("a member has stats").score()))
            .min_by_key(|&(peer, score)| (score, peer))?;
        if score > SCORE_INITIAL - EVICT_MARGIN {
            return None;
        }
        let worst = worst.clone();
        assert!(self.depart(&worst, now));
        const _: () = assert!(EVICTIONS_PER_UPDATE == 1, "evict_worst evicts one");
        Some((worst, Departure::Evicted))
    }

    /// Admits `ordered` candidates until the set holds `keep`; a remembered one that comes back
    /// unreliable is departed again at once and not counted.
    fn fill(&mut self, ordered: impl Iterator<Item = (K, Instant)>, now: Instant) -> Vec<K> {
        let mut added = Vec::new();
        for (peer, expires_at) in ordered {
            if self.members.len() >= self.config.keep {
                break;
            }
            assert!(!self.members.contains_key(&peer), "candidates outside the set only");
            // A remembered peer that would come back unreliable is refused without being
            // admitted: admitting and departing it again would restart its memory, and a peer
            // the overlay keeps offering would then stay banned for ever.
            if self.book.remembered(&peer, now).is_some_and(|s| !s.is_reliable()) {
                continue;
            }
            let stats = self.book.admit(peer.clone(), now).expect("keep is below the book's bound");
            debug_assert!(stats.is_reliable(), "fresh or remembered reliable");
            self.members.insert(peer.clone(), expires_at);
            self.generation += 1;
            added.push(peer);
        }
        added
    }

    /// Takes `peer` out of the members and the book; returns whether it was a member.
    fn depart(&mut self, peer: &K, now: Instant) -> bool {
        if self.members.remove(peer).is_none() {
            return false;
        }
        self.book.depart(peer, now).expect("a member has stats");
        self.generation += 1;
        true
    }
}

/// The expiry of an overlay entry created at `created_at` with lifetime `ttl` (saturating).
pub fn entry_expiry(created_at: Instant, ttl: Duration) -> Instant {
    created_at.saturating_add(ttl)
}
