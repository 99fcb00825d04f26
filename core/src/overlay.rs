//! Overlay client scoring: per-neighbour reliability stats and the weighted choice of neighbours
//! (spec/overlay.md §1 and §2), as pure values and functions.
//!
//! A neighbour is a peer this node asks for blocks when no tree ancestor is usable. Each one has a
//! [`NeighbourStats`]: a score in `0..=128` moved by the outcomes of requests to it, a short failure
//! history and a moving average of its round-trips. From the stats comes a selection weight
//! ([`NeighbourStats::selection_weight`]); a [`SelectionIndex`] draws one neighbour or several
//! distinct ones with probability proportional to weight. A [`ScoreBook`] keeps the stats of the
//! current neighbours and remembers, for a bounded time and number, the stats of departed ones
//! that did worse than a newcomer, so leaving the set does not wipe a punishment.
//!
//! Set maintenance (which peers are neighbours, §3) is [`set`]; broadcast targets (§4) are
//! [`targets`]; wiring into the node (§5) is not built.
//!
//! # Driving contract
//!
//! The driver owns one [`ScoreBook`] (behind `&mut self`; nothing here locks, reads a clock or
//! draws ambient randomness):
//!
//! 1. When a peer becomes a neighbour call [`ScoreBook::admit`] with `now`; when it stops being
//!    one call [`ScoreBook::depart`] with `now`. A peer that departed with a score below
//!    [`SCORE_INITIAL`] less than [`REMEMBER_FOR`] ago is readmitted with its old stats.
//! 2. To pick a target call [`ScoreBook::choose_one`] or [`ScoreBook::choose_many`] with the
//!    driver's seeded RNG. Weights are computed from the live stats on every call, so there is no
//!    rebuild timer to drive. `None` (or fewer targets than asked) means no more neighbours have a
//!    weight: the caller falls back to the origin, and the ping of §3 lets excluded ones earn their
//!    way back.
//! 3. Every request sent to a neighbour ends in exactly one report on its stats
//!    ([`ScoreBook::get_mut`]): a transport error goes to [`NeighbourStats::transport_error`]; a
//!    delivered response gets a [`Verdict`] through [`NeighbourStats::verdict`]. A shell that hands
//!    the response to application code keeps it in a guard whose `Drop` reports
//!    [`Verdict::Ignore`] when nobody decided, so an undecided response still counts as a request
//!    and a round-trip sample; the core itself has no drop side effects.
//! 4. Punishments outside a request (a peer caught lying elsewhere) go to
//!    [`NeighbourStats::punish`].
//! 5. The simulator may call `check_invariants` on the book and on any stats after every step.
//!
//! # Where this differs from upstream, and why (spec §6)
//!
//! - **Punishments survive departure (§6.5).** Upstream forgets stats on eviction or expiry, so a
//!   peer zeroed as malicious is back at 64 two minutes later. The book remembers up to
//!   [`REMEMBERED_MAX`] departed peers whose score was below [`SCORE_INITIAL`], each for
//!   [`REMEMBER_FOR`] (one overlay-entry lifetime); past either bound the oldest is forgotten.
//! - **No stale weights (§6.7).** Upstream copies weights into an index every 10 s, so a neighbour
//!   zeroed in between is still drawn at its old weight, and single choice never rechecks
//!   reliability. Here the book computes weights from live stats on every choice: with at most
//!   [`NEIGHBOURS_MAX`] neighbours that is cheap, and it also removes the rebuild race that
//!   upstream guards with compare-and-swap (there is no concurrent rebuild to lose).
//! - **Filter before sampling (§6.7).** Upstream samples n and then drops unreliable ones, so
//!   fewer than n come back while reliable neighbours are left over. [`SelectionIndex::choose_many`]
//!   applies the caller's filter first and returns `min(n, eligible)` targets. The upstream
//!   "reliable only" filter is implied by the weight floor against the stats the index was built
//!   from (weight >= 16 needs score >= 16), so it is needed only against a cached index, as
//!   `|peer| book.get(peer).is_some_and(NeighbourStats::is_reliable)`.
//! - **Empty index (§6.7).** Upstream has no fallback; here an empty choice is a typed `None`
//!   and the fallback (origin) belongs to the caller, as §5 says.
//! - **Undecided responses and `dumb` (§6.8).** [`Verdict::Reject`] carries a [`Fault`]: a
//!   meaningless answer is a failure plus the minor ("dumb") punishment, an invalid one a failure
//!   plus the malicious punishment. The drop guard of step 3 is to score undecided responses as ignore (no shell drives the book yet: the guard is not built).
//! - **Kept as upstream:** the score arithmetic, the history, the moving average, the streak
//!   penalty, the speed bonus and the weight floor, with the spec's numbers. A transport error that
//!   is not a timeout records no round-trip sample: a refused dial returns fast, and counting it
//!   would make a dead peer look quick.
//! - **Left out:** upstream's later per-request-type fines (an LRU of fines subtracted from the
//!   weight, floor 1) and the 10 s apply-score timer, which live weights make unnecessary.

pub mod set;
pub mod targets;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::Rng;

use crate::time::Instant;

/// Highest score.
pub const SCORE_MAX: u8 = 128;
/// Score of a neighbour that nothing is known about.
pub const SCORE_INITIAL: u8 = 64;
/// Lowest score at which a neighbour counts as reliable.
pub const RELIABLE_SCORE_MIN: u8 = 16;
/// Points a success adds and a failure subtracts.
pub const SCORE_STEP: u8 = 8;
/// Scored outcomes the failure history keeps.
pub const HISTORY_LEN: u32 = 4;
/// Round-trip samples in the moving average (the default round-trip is the first one).
pub const ROUND_TRIP_WINDOW: usize = 4;
/// Default round-trip: the first sample of every fresh neighbour's average.
pub const DEFAULT_ROUND_TRIP: Duration = Duration::from_millis(300);
/// Largest round-trip sample kept, in milliseconds; longer ones are clamped to it.
pub const ROUND_TRIP_SAMPLE_MAX_MS: u16 = u16::MAX;
/// Subtracted from the weight when the last [`HISTORY_LEN`] scored outcomes all failed.
pub const STREAK_PENALTY: u8 = 16;
/// Lowest score that earns a speed bonus.
pub const BONUS_SCORE_MIN: u8 = 120;
/// Slowest average round-trip, in milliseconds, that earns a speed bonus.
pub const BONUS_ROUND_TRIP_MAX_MS: u16 = 160;
/// Largest speed bonus (at an average round-trip of 0 ms).
pub const BONUS_MAX: u8 = 16;
/// Lowest selection weight; a neighbour below it is left out of the index.
pub const WEIGHT_MIN: u16 = 16;
/// Highest selection weight: the top score plus the largest speed bonus.
pub const WEIGHT_MAX: u16 = SCORE_MAX as u16 + BONUS_MAX as u16;
/// Most neighbours a [`ScoreBook`] or a [`SelectionIndex`] holds.
pub const NEIGHBOURS_MAX: usize = 256;
/// Most departed neighbours a [`ScoreBook`] remembers.
pub const REMEMBERED_MAX: usize = 1024;
/// How long a [`ScoreBook`] remembers a departed neighbour (the overlay entry TTL).
pub const REMEMBER_FOR: Duration = Duration::from_secs(3600);

const HISTORY_MASK: u8 = (1 << HISTORY_LEN) - 1;
const _: () = assert!(WEIGHT_MIN == RELIABLE_SCORE_MIN as u16, "weight floor implies reliable");
const _: () = assert!(SCORE_INITIAL <= SCORE_MAX && BONUS_SCORE_MIN <= SCORE_MAX);

/// A one-off subtraction from the score for a recognised fault; it does not touch the history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Punishment {
    /// A meaningless answer ("dumb" upstream): 4 points.
    Minor,
    /// A timeout or a slow connection: 8 points.
    Slow,
    /// An invalid address, certificate or block, or a peer unknown to the transport: 128 points.
    Malicious,
}

impl Punishment {
    /// Points this punishment subtracts.
    pub const fn points(self) -> u8 {
        match self {
            Punishment::Minor => 4,
            Punishment::Slow => 8,
            Punishment::Malicious => 128,
        }
    }
}

/// Why the caller rejected a delivered response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A wrong answer with nothing more to blame: a plain failure.
    Wrong,
    /// A meaningless answer: a failure plus [`Punishment::Minor`].
    Meaningless,
    /// An invalid answer (e.g. a block of the wrong length): a failure plus
    /// [`Punishment::Malicious`].
    Invalid,
}

/// The caller's decision on a delivered response (the transport cannot judge meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A good answer: a success.
    Accept,
    /// A bad answer: a failure, punished by its [`Fault`].
    Reject(Fault),
    /// An answer neither good nor bad (e.g. "I do not hold it"): not scored, but counted as a
    /// request and a round-trip sample.
    Ignore,
}

/// A request that got no response, as the transport reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportError {
    /// No response within the query timeout: a failure plus [`Punishment::Slow`].
    QueryTimeout,
    /// The request could not be sent within the send timeout: a failure plus
    /// [`Punishment::Slow`].
    SendTimeout,
    /// The connection could not be set up in time: a failure plus [`Punishment::Slow`].
    ConnectTimeout,
    /// The peer's address is invalid: a failure plus [`Punishment::Malicious`].
    InvalidAddress,
    /// The peer's certificate is invalid: a failure plus [`Punishment::Malicious`].
    InvalidCertificate,
    /// The transport does not know the peer: a failure plus [`Punishment::Malicious`].
    UnknownPeer,
    /// Any other transport error: a plain failure.
    Other,
}

impl TransportError {
    /// The punishment added to the failure, if any.
    pub const fn punishment(self) -> Option<Punishment> {
        match self {
            TransportError::QueryTimeout
            | TransportError::SendTimeout
            | TransportError::ConnectTimeout => Some(Punishment::Slow),
            TransportError::InvalidAddress
            | TransportError::InvalidCertificate
            | TransportError::UnknownPeer => Some(Punishment::Malicious),
            TransportError::Other => None,
        }
    }

    /// Whether the time waited is a round-trip sample (a lower bound on it, for a timeout).
    pub const fn times_the_peer(self) -> bool {
        matches!(self.punishment(), Some(Punishment::Slow))
    }
}

/// Reliability stats of one neighbour (spec §1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighbourStats {
    score: u8,
    /// Bit 0 is the newest scored outcome, set on failure; only [`HISTORY_LEN`] bits are kept.
    failure_history: u8,
    /// Ring of the last samples in ms; the first `round_trip_len` slots are filled.
    round_trips_ms: [u16; ROUND_TRIP_WINDOW],
    round_trip_len: usize,
    round_trip_next: usize,
    requests: u64,
    failures: u64,
}

impl Default for NeighbourStats {
    fn default() -> Self {
        NeighbourStats::new(DEFAULT_ROUND_TRIP)
    }
}

impl NeighbourStats {
    /// Fresh stats: score [`SCORE_INITIAL`], no history, `default_round_trip` as the first sample.
    pub fn new(default_round_trip: Duration) -> Self {
        let mut round_trips_ms = [0; ROUND_TRIP_WINDOW];
        round_trips_ms[0] = clamp_ms(default_round_trip);
        let stats = NeighbourStats {
            score: SCORE_INITIAL,
            failure_history: 0,
            round_trips_ms,
            round_trip_len: 1,
            round_trip_next: 1,
            requests: 0,
            failures: 0,
        };
        stats.check_invariants();
        stats
    }

    /// The score, `0..=128`.
    pub fn score(&self) -> u8 {
        self.score
    }

    /// Whether the score is at least [`RELIABLE_SCORE_MIN`].
    pub fn is_reliable(&self) -> bool {
        self.score >= RELIABLE_SCORE_MIN
    }

    /// The last [`HISTORY_LEN`] scored outcomes, newest in bit 0, a failure as 1.
    pub fn failure_history(&self) -> u8 {
        self.failure_history
    }

    /// Whether the last [`HISTORY_LEN`] scored outcomes were all failures.
    pub fn failed_streak(&self) -> bool {
        self.failure_history == HISTORY_MASK
    }

    /// Integer mean of the last [`ROUND_TRIP_WINDOW`] round-trip samples, in milliseconds.
    pub fn average_round_trip_ms(&self) -> u16 {
        let filled = &self.round_trips_ms[..self.round_trip_len];
        let sum: u32 = filled.iter().map(|&ms| u32::from(ms)).sum();
        let mean = sum / self.round_trip_len as u32;
        u16::try_from(mean).expect("a mean of u16 samples fits in u16")
    }

    /// Requests counted so far (scored, ignored and failed in transport).
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests that failed so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Scores a delivered response that took `round_trip`.
    pub fn verdict(&mut self, verdict: Verdict, round_trip: Duration) {
        self.requests = self.requests.saturating_add(1);
        self.record_round_trip(round_trip);
        match verdict {
            Verdict::Accept => self.record_outcome(false),
            Verdict::Reject(Fault::Wrong) => self.record_outcome(true),
            Verdict::Reject(Fault::Meaningless) => {
                self.record_outcome(true);
                self.punish(Punishment::Minor);
            }
            Verdict::Reject(Fault::Invalid) => {
                self.record_outcome(true);
                self.punish(Punishment::Malicious);
            }
            Verdict::Ignore => {}
        }
        self.check_invariants();
    }

    /// A success: `+8` (saturating), history shifted with a 0.
    pub fn accept(&mut self, round_trip: Duration) {
        self.verdict(Verdict::Accept, round_trip);
    }

    /// A failure judged by the caller: `-8` (saturating), history shifted with a 1, plus the
    /// fault's punishment.
    pub fn reject(&mut self, fault: Fault, round_trip: Duration) {
        self.verdict(Verdict::Reject(fault), round_trip);
    }

    /// Neither good nor bad: score and history unchanged, request and round-trip recorded.
    pub fn ignore(&mut self, round_trip: Duration) {
        self.verdict(Verdict::Ignore, round_trip);
    }

    /// A request that got no response after waiting `elapsed`: a failure plus the error's
    /// punishment; `elapsed` is a round-trip sample only for timeouts.
    pub fn transport_error(&mut self, error: TransportError, elapsed: Duration) {
        self.requests = self.requests.saturating_add(1);
        if error.times_the_peer() {
            self.record_round_trip(elapsed);
        }
        self.record_outcome(true);
        if let Some(punishment) = error.punishment() {
            self.punish(punishment);
        }
        self.check_invariants();
    }

    /// Subtracts the punishment's points (saturating at 0); the history is untouched.
    pub fn punish(&mut self, punishment: Punishment) {
        self.score = self.score.saturating_sub(punishment.points());
        self.check_invariants();
    }

    /// Selection weight: 0 (left out of the index) or `16..=144` (spec §2).
    pub fn selection_weight(&self) -> u16 {
        let score = u16::from(self.score);
        let average_ms = self.average_round_trip_ms();
        let weight = if self.failed_streak() {
            score.saturating_sub(u16::from(STREAK_PENALTY))
        } else if self.score >= BONUS_SCORE_MIN && average_ms <= BONUS_ROUND_TRIP_MAX_MS {
            score + speed_bonus(average_ms)
        } else {
            score
        };
        let weight = if weight < WEIGHT_MIN { 0 } else { weight };
        assert!(weight == 0 || (WEIGHT_MIN..=WEIGHT_MAX).contains(&weight));
        assert!(weight == 0 || self.is_reliable(), "an indexed neighbour is reliable");
        weight
    }

    /// Panics if an internal invariant is broken.
    pub fn check_invariants(&self) {
        assert!(self.score <= SCORE_MAX, "score {} above {SCORE_MAX}", self.score);
        assert!(self.failure_history <= HISTORY_MASK, "history keeps {HISTORY_LEN} bits");
        assert!((1..=ROUND_TRIP_WINDOW).contains(&self.round_trip_len));
        assert!(self.round_trip_next < ROUND_TRIP_WINDOW);
        assert!(
            self.round_trip_len == ROUND_TRIP_WINDOW || self.round_trip_next == self.round_trip_len
        );
        assert!(self.failures <= self.requests);
    }

    fn record_outcome(&mut self, failed: bool) {
        self.failure_history = ((self.failure_history << 1) | u8::from(failed)) & HISTORY_MASK;
        if failed {
            self.failures = self.failures.saturating_add(1);
            self.score = self.score.saturating_sub(SCORE_STEP);
        } else {
            self.score = self.score.saturating_add(SCORE_STEP).min(SCORE_MAX);
        }
    }

    fn record_round_trip(&mut self, round_trip: Duration) {
        self.round_trips_ms[self.round_trip_next] = clamp_ms(round_trip);
        self.round_trip_next = (self.round_trip_next + 1) % ROUND_TRIP_WINDOW;
        self.round_trip_len = (self.round_trip_len + 1).min(ROUND_TRIP_WINDOW);
    }
}

/// Speed bonus at an average round-trip of `average_ms` (at most 160):
/// `max((160 - average_ms) * 16 / 160, 1)`, in `1..=16`.
pub fn speed_bonus(average_ms: u16) -> u16 {
    assert!(average_ms <= BONUS_ROUND_TRIP_MAX_MS, "no bonus above 160 ms");
    let max_ms = BONUS_ROUND_TRIP_MAX_MS;
    let bonus = ((max_ms - average_ms) * u16::from(BONUS_MAX) / max_ms).max(1);
    assert!((1..=u16::from(BONUS_MAX)).contains(&bonus));
    bonus
}

fn clamp_ms(d: Duration) -> u16 {
    u16::try_from(d.as_millis()).unwrap_or(ROUND_TRIP_SAMPLE_MAX_MS)
}

/// Neighbours with a positive weight, for weighted random choice (spec §2).
#[derive(Clone, Debug)]
pub struct SelectionIndex<K> {
    /// Entries in the order given, each with its weight (`1..=WEIGHT_MAX`).
    entries: Vec<(K, u16)>,
    /// `cumulative[i]` is the sum of the weights of entries `0..=i`.
    cumulative: Vec<u32>,
}

impl<K> SelectionIndex<K> {
    /// An index of the neighbours with a non-zero [`NeighbourStats::selection_weight`].
    pub fn build<'a>(neighbours: impl IntoIterator<Item = (K, &'a NeighbourStats)>) -> Self {
        Self::from_weights(neighbours.into_iter().map(|(k, s)| (k, s.selection_weight())))
    }

    /// An index of `weighted`, leaving out weight 0. Panics on a weight above [`WEIGHT_MAX`] or
    /// more than [`NEIGHBOURS_MAX`] entries (the caller's bug, not a peer's input).
    pub fn from_weights(weighted: impl IntoIterator<Item = (K, u16)>) -> Self {
        let entries: Vec<(K, u16)> = weighted.into_iter().filter(|(_, w)| *w > 0).collect();
        assert!(entries.len() <= NEIGHBOURS_MAX, "at most {NEIGHBOURS_MAX} neighbours");
        let mut total = 0u32;
        let cumulative = entries
            .iter()
            .map(|(_, w)| {
                assert!(*w <= WEIGHT_MAX, "weight {w} above {WEIGHT_MAX}");
                total += u32::from(*w);
                total
            })
            .collect();
        SelectionIndex { entries, cumulative }
    }

    /// Number of neighbours in the index.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no neighbour has a weight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Sum of the weights.
    pub fn total_weight(&self) -> u32 {
        self.cumulative.last().copied().unwrap_or(0)
    }

    /// The neighbours and their weights, in index order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, u16)> {
        self.entries.iter().map(|(k, w)| (k, *w))
    }

    /// One neighbour with probability `weight / total` (a uniform draw in `0..total`, then a
    /// binary search of the cumulative weights); `None` when the index is empty.
    pub fn choose_one<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<&K> {
        let total = self.total_weight();
        if total == 0 {
            return None;
        }
        let draw = rng.random_range(0..total);
        let at = self.cumulative.partition_point(|&c| c <= draw);
        assert!(at < self.entries.len(), "a draw below the total lands on an entry");
        Some(&self.entries[at].0)
    }

    /// Up to `n` distinct neighbours among those `eligible` accepts, drawn without replacement in
    /// proportion to weight (Efraimidis–Spirakis A-Res: key `u^(1/w)`, the `n` largest win),
    /// best key first. The filter runs before sampling, so `min(n, eligible)` come back.
    pub fn choose_many<R: Rng + ?Sized>(
        &self,
        n: usize,
        rng: &mut R,
        mut eligible: impl FnMut(&K) -> bool,
    ) -> Vec<&K> {
        // ln(u) / w orders like u^(1/w) and does not underflow for small u and large w.
        let mut keyed: Vec<(f64, usize)> = Vec::with_capacity(self.entries.len());
        for (i, (k, w)) in self.entries.iter().enumerate() {
            if eligible(k) {
                let u = 1.0 - rng.random::<f64>(); // in (0, 1]
                keyed.push((u.ln() / f64::from(*w), i));
            }
        }
        keyed.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        keyed.truncate(n);
        let chosen: Vec<&K> = keyed.iter().map(|&(_, i)| &self.entries[i].0).collect();
        assert!(chosen.len() <= n);
        chosen
    }
}

/// The book is full: [`NEIGHBOURS_MAX`] neighbours are held and the admitted peer is new.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the score book holds the most neighbours it may ({NEIGHBOURS_MAX})")]
pub struct BookFull;

#[derive(Clone, Debug)]
struct Remembered {
    departed_at: Instant,
    stats: NeighbourStats,
}

/// Stats of the current neighbours, plus a bounded memory of departed neighbours that did worse
/// than a newcomer.
#[derive(Clone, Debug)]
pub struct ScoreBook<K> {
    default_round_trip: Duration,
    neighbours: BTreeMap<K, NeighbourStats>,
    remembered: BTreeMap<K, Remembered>,
    /// The latest `now` seen; an earlier `now` counts as this one.
    clock: Instant,
}

impl<K: Ord + Clone> ScoreBook<K> {
    /// An empty book whose fresh neighbours start with `default_round_trip` as first sample.
    pub fn new(default_round_trip: Duration) -> Self {
        ScoreBook {
            default_round_trip,
            neighbours: BTreeMap::new(),
            remembered: BTreeMap::new(),
            clock: Instant::ZERO,
        }
    }

    /// Makes `peer` a neighbour: its remembered stats if it departed with a low score less than
    /// [`REMEMBER_FOR`] ago, fresh ones otherwise; a current neighbour is left as it is.
    pub fn admit(&mut self, peer: K, now: Instant) -> Result<&mut NeighbourStats, BookFull> {
        self.tick(now);
        if !self.neighbours.contains_key(&peer) {
            if self.neighbours.len() >= NEIGHBOURS_MAX {
                return Err(BookFull);
            }
            let stats = match self.remembered.remove(&peer) {
                Some(r) => r.stats,
                None => NeighbourStats::new(self.default_round_trip),
            };
            self.neighbours.insert(peer.clone(), stats);
        }
        Ok(self.neighbours.get_mut(&peer).expect("admitted above"))
    }

    /// Removes `peer` from the neighbours and returns its stats; remembers them when its score is
    /// below [`SCORE_INITIAL`], forgetting the oldest departure if [`REMEMBERED_MAX`] are held.
    pub fn depart(&mut self, peer: &K, now: Instant) -> Option<NeighbourStats> {
        self.tick(now);
        let stats = self.neighbours.remove(peer)?;
        if stats.score() < SCORE_INITIAL {
            if self.remembered.len() >= REMEMBERED_MAX {
                let oldest = self
                    .remembered
                    .iter()
                    .min_by_key(|(_, r)| r.departed_at)
                    .map(|(k, _)| k.clone())
                    .expect("a full memory is not empty");
                self.remembered.remove(&oldest);
            }
            let departed_at = self.clock;
            let remembered = Remembered { departed_at, stats: stats.clone() };
            self.remembered.insert(peer.clone(), remembered);
        }
        self.check_invariants();
        Some(stats)
    }

    /// Stats of a current neighbour.
    pub fn get(&self, peer: &K) -> Option<&NeighbourStats> {
        self.neighbours.get(peer)
    }

    /// Stats of a current neighbour, to report outcomes on.
    pub fn get_mut(&mut self, peer: &K) -> Option<&mut NeighbourStats> {
        self.neighbours.get_mut(peer)
    }

    /// Whether `peer` departed with a low score and is still remembered.
    pub fn remembers(&self, peer: &K) -> bool {
        self.remembered.contains_key(peer)
    }

    /// The stats `peer` departed with, while they are remembered at `now` (what [`Self::admit`]
    /// would give it back), without admitting it.
    pub fn remembered(&self, peer: &K, now: Instant) -> Option<&NeighbourStats> {
        let clock = self.clock.max(now);
        let r = self.remembered.get(peer)?;
        (clock.saturating_duration_since(r.departed_at) < REMEMBER_FOR).then_some(&r.stats)
    }

    /// Number of current neighbours.
    pub fn len(&self) -> usize {
        self.neighbours.len()
    }

    /// Whether there are no current neighbours.
    pub fn is_empty(&self) -> bool {
        self.neighbours.is_empty()
    }

    /// Number of remembered departed neighbours.
    pub fn remembered_len(&self) -> usize {
        self.remembered.len()
    }

    /// The current neighbours and their stats, ordered by peer.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &NeighbourStats)> {
        self.neighbours.iter()
    }

    /// An index built from the live stats, ordered by peer.
    pub fn index(&self) -> SelectionIndex<&K> {
        SelectionIndex::build(self.neighbours.iter())
    }

    /// One neighbour drawn by weight from the live stats; `None` when none has a weight.
    pub fn choose_one<R: Rng + ?Sized>(&self, rng: &mut R) -> Option<K> {
        self.index().choose_one(rng).map(|k| (*k).clone())
    }

    /// Up to `n` distinct neighbours drawn by weight from the live stats (all reliable).
    pub fn choose_many<R: Rng + ?Sized>(&self, n: usize, rng: &mut R) -> Vec<K> {
        let index = self.index();
        let chosen: Vec<K> =
            index.choose_many(n, rng, |_| true).into_iter().map(|k| (*k).clone()).collect();
        assert!(chosen.len() == n.min(index.len()));
        chosen
    }

    /// Panics if an internal invariant is broken.
    pub fn check_invariants(&self) {
        assert!(self.neighbours.len() <= NEIGHBOURS_MAX);
        assert!(self.remembered.len() <= REMEMBERED_MAX);
        for stats in self.neighbours.values() {
            stats.check_invariants();
        }
        for (peer, r) in &self.remembered {
            assert!(!self.neighbours.contains_key(peer), "a neighbour is not also remembered");
            assert!(r.departed_at <= self.clock);
            assert!(r.stats.score() < SCORE_INITIAL, "only worse than a newcomer is kept");
            r.stats.check_invariants();
        }
    }

    /// Moves the clock to `now` (never backwards) and forgets departures older than
    /// [`REMEMBER_FOR`].
    fn tick(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        let clock = self.clock;
        self.remembered
            .retain(|_, r| clock.saturating_duration_since(r.departed_at) < REMEMBER_FOR);
    }
}
