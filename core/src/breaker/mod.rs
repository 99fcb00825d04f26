//! Per-peer circuit breaker with generations and half-open probes (seeds/peer.md §3.5).
//!
//! A pure state machine: no locks, no clock, no ambient randomness. The shell wraps one
//! [`Breaker`] in a mutex; the simulator drives it directly.

mod classify;
mod config;
mod entry;
mod event;
mod permit;
mod table;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};

pub use classify::Observation;
pub use config::{
    BackoffPolicy, BreakerConfig, BreakerConfigError, COOLDOWN_MAX, DEFAULT_COOLDOWN,
    DEFAULT_COOLDOWN_CAP, DEFAULT_FAILURE_THRESHOLD, DEFAULT_HALF_OPEN_PROBES,
    DEFAULT_PROBE_DEADLINE, EVENTS_MAX, HALF_OPEN_PROBES_MAX, PROBE_DEADLINE_MAX,
    TRACKED_PEERS_MAX,
};
pub use event::{BreakerCounters, BreakerEvent, CircuitState, TransitionReason};
pub use permit::{Admission, Disposition, HardReason, Outcome, Permit, PermitKind};

use entry::{Change, Circuit, Ctx, Entry, Probe};
use table::PeerTable;

use crate::rng::{self, Rng};
use crate::time::Instant;
use crate::walk_gate::WalkGate;

/// Per-peer circuit breaker: remembers which peers are failing so that requests to them fail
/// fast instead of paying a dial timeout each, while probing so a recovered peer is used again
/// without operator action.
///
/// # Driving contract
///
/// The breaker is a sans-IO state machine keyed by peer address `K`; every input takes the
/// driver's `now` last. The shell owns one breaker behind one mutex and, for each peer request:
///
/// 1. Block fetch: call [`begin_data`](Self::begin_data). [`Admission::Rejected`] means do not
///    dial (the shell's `ErrCircuitOpen`); [`Admission::Admitted`] hands out a [`Permit`].
///    Roster fetch: call [`begin_roster`](Self::begin_roster), which never rejects.
/// 2. When the request ends, classify it (see [`Observation::outcome`]) and call
///    [`complete`](Self::complete) with the permit, exactly once; the permit is consumed, so a
///    second report cannot compile. The shell keeps the permit in a guard whose `Drop` calls
///    `complete(permit, Outcome::Abandoned, now)` under the mutex when nobody reported; the core
///    itself has no drop side effects.
/// 3. Timers: after any input, [`poll_timeout`](Self::poll_timeout) is the earliest probe
///    deadline; at or after it call [`handle_timeout`](Self::handle_timeout). A probe still
///    unreported at its deadline is reclaimed as a soft failure, and its late completion is then
///    stale. After `handle_timeout(now)`, `poll_timeout()` is `None` or later than `now`.
/// 4. Events: drain [`poll_event`](Self::poll_event) until `None` for metrics and traces; at most
///    [`EVENTS_MAX`] are queued, older ones are dropped and counted.
/// 5. Routing reads [`healthy`](Self::healthy), metrics [`state`](Self::state) and
///    [`open_count`](Self::open_count): observers take `&self`, never create an entry and never
///    count as activity.
///
/// # Semantics
///
/// - Closed → open after `failure_threshold` consecutive soft failures, or at once on a hard
///   failure. An answer (including caller cancellation) clears the count.
/// - Open → half-open once the cooldown has elapsed; half-open admits `half_open_probes` probes.
///   After the first success admission pauses until every admitted probe has reported; all must
///   succeed to close, any failure reopens with a fresh (backed-off) cooldown. An abandoned probe
///   gives its slot back without counting as a success.
/// - The cooldown is stamped only by closed → open and by a failed recovery check (half-open →
///   open); a failure arriving while open changes nothing.
/// - Every permit is bound to its entry's incarnation and generation. Every transition except
///   open → half-open bumps the generation, so a report from before an opening or a recovery is
///   ignored ([`Disposition::Superseded`]), and a report for an evicted entry is ignored without
///   recreating it ([`Disposition::Forgotten`]).
/// - Roster permits bypass admission but record outcomes under the same generation rule; while
///   open or half-open a roster success closes, and a half-open roster failure reopens, only when
///   no data probe is in flight.
/// - `failure_threshold == 0` disables the breaker: everything is admitted, nothing is tracked.
///
/// # Invariants ([`check_invariants`](Self::check_invariants))
///
/// - At most `tracked_peers_max` (≤ [`TRACKED_PEERS_MAX`]) entries; past the cap a new peer first
///   sweeps clean entries (closed, no failures), else evicts the least recently active one.
///   Activity is a logical tick (never the clock, which may go backwards) stamped by `begin_*`
///   and by completions reaching a live entry, never by observers or timers.
/// - A closed circuit holds fewer than `failure_threshold` failures and no backoff; a half-open
///   one holds at most `half_open_probes` probes in flight plus successes, and has a probe in
///   flight whenever it has a success; an open one's cooldown is at most the policy's maximum.
/// - The probe deadline index holds exactly the probes in flight; the activity list exactly the
///   entries, oldest first; the clean count exactly the clean entries; the event queue at most
///   [`EVENTS_MAX`].
#[derive(Debug)]
pub struct Breaker<K> {
    config: BreakerConfig,
    rng: Rng,
    peers: PeerTable<K>,
    /// (deadline, probe id) → slot, for every probe in flight.
    deadlines: BTreeMap<(Instant, u64), usize>,
    /// Entries that are clean (sweepable); lets a full map of dirty entries skip the sweep.
    clean: usize,
    next_tick: u64,
    next_incarnation: u64,
    next_permit: u64,
    events: VecDeque<BreakerEvent<K>>,
    counters: BreakerCounters,
    /// Counts calls of the writers (`begin_data`, `begin_roster`, `complete`, `handle_timeout`,
    /// the only `&mut self` methods besides `poll_event`, which only pops an event): the peer
    /// walk of [`Breaker::check_invariants`] runs again only after one.
    walk_gate: WalkGate,
}

impl<K: Ord + Clone> Breaker<K> {
    /// A breaker whose jitter RNG is seeded from `config.seed`.
    pub fn new(config: BreakerConfig) -> Result<Self, BreakerConfigError> {
        let rng = rng::from_seed(config.seed);
        Self::with_rng(config, rng)
    }

    /// A breaker drawing jitter from `rng` (e.g. a child of the node's RNG); `config.seed` is
    /// not used.
    pub fn with_rng(config: BreakerConfig, rng: Rng) -> Result<Self, BreakerConfigError> {
        config.validate()?;
        Ok(Breaker {
            config,
            rng,
            peers: PeerTable::new(),
            deadlines: BTreeMap::new(),
            clean: 0,
            next_tick: 0,
            next_incarnation: 1,
            next_permit: 0,
            events: VecDeque::new(),
            counters: BreakerCounters::default(),
            walk_gate: WalkGate::default(),
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Asks to send a block request to `addr`. Stamps activity (even when rejected) and may turn
    /// an open circuit whose cooldown elapsed half-open; a half-open admission reserves a probe
    /// slot until the permit is completed or reclaimed at its deadline.
    pub fn begin_data(&mut self, addr: &K, now: Instant) -> Admission<K> {
        self.walk_gate.changed();
        if !self.config.enabled() {
            return Admission::Admitted(self.untracked(addr));
        }
        let slot = self.reach(addr, now);
        // Ids count admitted permits only: a rejection leaves the id sequence alone.
        let id = self.next_permit;
        let probe = Probe { id, deadline: now + self.config.probe_deadline };
        let limit = self.config.half_open_probes;
        let entry = self.peers.entry_mut(slot);
        let Some(kind) = entry.admit(probe, limit) else {
            self.counters.rejected += 1;
            return Admission::Rejected;
        };
        self.next_permit += 1;
        let permit = Permit {
            addr: addr.clone(),
            slot,
            incarnation: entry.incarnation,
            generation: entry.generation,
            kind,
            id,
        };
        if permit.is_probe() {
            let previous = self.deadlines.insert((probe.deadline, id), slot);
            assert!(previous.is_none(), "probe ids are unique");
        }
        Admission::Admitted(permit)
    }

    /// Starts a roster fetch to `addr`: never rejected (discovery has no alternative source) and
    /// never holds a probe slot, but its outcome is recorded like any other.
    pub fn begin_roster(&mut self, addr: &K, now: Instant) -> Permit<K> {
        self.walk_gate.changed();
        if !self.config.enabled() {
            return self.untracked(addr);
        }
        let slot = self.reach(addr, now);
        let id = self.permit_id();
        let entry = self.peers.entry(slot);
        Permit {
            addr: addr.clone(),
            slot,
            incarnation: entry.incarnation,
            generation: entry.generation,
            kind: PermitKind::Roster,
            id,
        }
    }

    /// Reports how the request behind `permit` ended. Applied only if the permit's entry and
    /// generation are still current; a stale report changes nothing and never recreates an
    /// evicted entry.
    pub fn complete(&mut self, permit: Permit<K>, outcome: Outcome, now: Instant) -> Disposition {
        self.walk_gate.changed();
        let Permit { slot, incarnation, generation, kind, id, .. } = permit;
        match kind {
            PermitKind::Untracked => return Disposition::Untracked,
            PermitKind::Data | PermitKind::Probe | PermitKind::Roster => {}
        }
        // Incarnations are never reused, so a matching one is this permit's entry even if the
        // slot was freed and refilled in between.
        let live = self.peers.get(slot).is_some_and(|e| e.incarnation == incarnation);
        if !live {
            self.counters.stale += 1;
            return Disposition::Forgotten;
        }
        self.stamp(slot, now);
        let change =
            self.update(slot, now, |entry, ctx| entry.record(generation, kind, id, outcome, ctx));
        let Some(change) = change else {
            self.counters.stale += 1;
            return Disposition::Superseded;
        };
        self.count_outcome(outcome);
        self.apply(slot, change, now);
        Disposition::Applied
    }

    /// The earliest probe deadline, if any probe is in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.first_key_value().map(|(&(deadline, _), _)| deadline)
    }

    /// Reclaims every probe whose deadline is at or before `now` as a soft failure (which
    /// reopens its circuit). Afterwards `poll_timeout()` is `None` or later than `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.walk_gate.changed();
        let budget = self.config.tracked_peers_max * HALF_OPEN_PROBES_MAX as usize;
        for _ in 0..budget {
            let Some((&(deadline, id), &slot)) = self.deadlines.first_key_value() else {
                break;
            };
            if deadline > now {
                break;
            }
            let change = self
                .update(slot, now, |entry, ctx| entry.expire_probe(id, ctx))
                .expect("the deadline index mirrors the probes in flight");
            self.counters.soft += 1;
            self.counters.probe_expired += 1;
            self.apply(slot, change, now);
        }
        assert!(self.poll_timeout().is_none_or(|t| t > now), "handle_timeout must move the timer");
    }

    /// The next transition event, oldest first.
    pub fn poll_event(&mut self) -> Option<BreakerEvent<K>> {
        self.events.pop_front()
    }

    /// `addr`'s circuit state at `now` (closed for an untracked peer). Read-only.
    pub fn state(&self, addr: &K, now: Instant) -> CircuitState {
        self.peers.find(addr).map_or(CircuitState::Closed, |i| self.peers.entry(i).state(now))
    }

    /// Whether a block request to `addr` would be admitted at `now`: closed, or half-open with a
    /// free probe slot. Reserves nothing; safe for routing. Read-only.
    pub fn healthy(&self, addr: &K, now: Instant) -> bool {
        let limit = self.config.half_open_probes;
        self.peers.find(addr).is_none_or(|i| self.peers.entry(i).would_admit(now, limit))
    }

    /// The tracked peers a block request would not be admitted to at `now` (those for which
    /// [`Breaker::healthy`] is false), in no particular order. Read-only: routing takes them once
    /// per decision instead of looking every candidate up.
    pub fn unhealthy(&self, now: Instant) -> impl Iterator<Item = &K> + '_ {
        let limit = self.config.half_open_probes;
        self.peers.iter().filter(move |(_, _, e)| !e.would_admit(now, limit)).map(|(_, k, _)| k)
    }

    /// How many tracked peers are open at `now` (cooldown not yet elapsed). Read-only.
    pub fn open_count(&self, now: Instant) -> usize {
        self.peers.iter().filter(|(_, _, e)| e.state(now) == CircuitState::Open).count()
    }

    /// The tracked peers whose circuit is not closed at `now`, with their state, in no particular
    /// order. Read-only; O(tracked peers), not O(members).
    pub fn unclosed(&self, now: Instant) -> impl Iterator<Item = (&K, CircuitState)> + '_ {
        self.peers
            .iter()
            .map(move |(_, k, e)| (k, e.state(now)))
            .filter(|(_, s)| *s != CircuitState::Closed)
    }

    /// How many peers are tracked.
    pub fn tracked(&self) -> usize {
        self.peers.len()
    }

    /// Probes in flight across all peers.
    pub fn probes_in_flight(&self) -> usize {
        self.deadlines.len()
    }

    /// Counters since construction.
    pub fn counters(&self) -> &BreakerCounters {
        &self.counters
    }

    /// Asserts every invariant listed on the type; O(tracked peers). The simulator calls it after
    /// every step.
    pub fn check_invariants(&self) {
        let cfg = &self.config;
        assert!(cfg.tracked_peers_max <= TRACKED_PEERS_MAX);
        assert!(self.peers.len() <= cfg.tracked_peers_max, "map above its cap");
        assert!(self.events.len() <= EVENTS_MAX);
        if !cfg.enabled() {
            assert!(self.peers.len() == 0 && self.deadlines.is_empty());
        }
        // The walk of every peer: only after a writer ran (the simulator checks after every
        // event, most of which touch no breaker).
        self.walk_gate.walk(|| {
            self.peers.check(cfg.tracked_peers_max);
            let mut clean = 0;
            let mut probes = 0;
            for (slot, _, entry) in self.peers.iter() {
                assert!(entry.last_active < self.next_tick);
                assert!(entry.incarnation > 0 && entry.incarnation < self.next_incarnation);
                self.check_entry(entry);
                for probe in entry.probes() {
                    assert!(probe.id < self.next_permit);
                    assert!(self.deadlines.get(&(probe.deadline, probe.id)) == Some(&slot));
                }
                probes += entry.probes().len();
                clean += usize::from(entry.is_clean());
            }
            assert_eq!(clean, self.clean, "clean count drifted");
            assert_eq!(probes, self.deadlines.len(), "deadline index drifted");
        });
    }

    fn check_entry(&self, entry: &Entry) {
        let cfg = &self.config;
        match &entry.circuit {
            Circuit::Closed { failures } => {
                assert!(*failures < cfg.failure_threshold);
                assert_eq!(entry.failed_checks, 0, "closing resets the backoff");
            }
            Circuit::Open { opened_at, until } => {
                assert!(until > opened_at);
                let cooldown = until.saturating_duration_since(*opened_at);
                assert!(cooldown <= cfg.backoff.max_cooldown());
            }
            Circuit::HalfOpen { probes, succeeded } => {
                let admitted = probes.len() + *succeeded as usize;
                assert!(admitted <= cfg.half_open_probes as usize, "probes above the limit");
                assert!(*succeeded == 0 || !probes.is_empty(), "all probes done but not closed");
            }
        }
    }

    /// When `addr`'s circuit last opened, if it is open (for the model test's cooldown check).
    #[cfg(test)]
    pub(crate) fn opened_at(&self, addr: &K) -> Option<Instant> {
        match self.peers.entry(self.peers.find(addr)?).circuit {
            Circuit::Open { opened_at, .. } => Some(opened_at),
            Circuit::Closed { .. } | Circuit::HalfOpen { .. } => None,
        }
    }

    fn untracked(&mut self, addr: &K) -> Permit<K> {
        let id = self.permit_id();
        Permit {
            addr: addr.clone(),
            slot: usize::MAX,
            incarnation: 0,
            generation: 0,
            kind: PermitKind::Untracked,
            id,
        }
    }

    fn permit_id(&mut self) -> u64 {
        let id = self.next_permit;
        self.next_permit += 1;
        id
    }

    /// A `begin_*` reached `addr`: create its entry if needed (making room at the cap), then
    /// stamp it. Returns its slot.
    fn reach(&mut self, addr: &K, now: Instant) -> usize {
        if let Some(slot) = self.peers.find(addr) {
            self.stamp(slot, now);
            return slot;
        }
        self.make_room(now);
        let entry = Entry::new(self.next_incarnation, self.next_tick);
        self.next_incarnation += 1;
        self.next_tick += 1;
        self.clean += 1;
        let slot = self.peers.insert(addr.clone(), entry);
        self.materialize(slot, now);
        debug_assert!(self.peers.len() <= self.config.tracked_peers_max);
        slot
    }

    /// A request path touched slot `slot`: stamp activity and apply a due open → half-open.
    fn stamp(&mut self, slot: usize, now: Instant) {
        self.peers.entry_mut(slot).last_active = self.next_tick;
        self.next_tick += 1;
        self.peers.make_newest(slot);
        self.materialize(slot, now);
    }

    fn materialize(&mut self, slot: usize, now: Instant) {
        if let Some(transition) = self.peers.entry_mut(slot).materialize(now) {
            let change = Change { transition: Some(transition), released: Vec::new() };
            self.apply(slot, change, now);
        }
    }

    /// Frees one slot when the map is at its cap: sweep clean entries, else evict the least
    /// recently active one.
    fn make_room(&mut self, now: Instant) {
        if self.peers.len() < self.config.tracked_peers_max {
            return;
        }
        if self.clean > 0 {
            let clean: Vec<usize> = self
                .peers
                .iter()
                .filter(|(_, _, e)| e.is_clean())
                .map(|(slot, _, _)| slot)
                .collect();
            assert_eq!(clean.len(), self.clean);
            for &slot in &clean {
                self.peers.remove(slot);
            }
            self.counters.swept += clean.len() as u64;
            self.clean = 0;
            return;
        }
        let victim = self.peers.oldest().expect("a full map has entries");
        let (addr, entry) = self.peers.remove(victim);
        for probe in entry.probes() {
            let owner = self.deadlines.remove(&(probe.deadline, probe.id));
            assert_eq!(owner, Some(victim), "probe has a deadline");
        }
        self.counters.evicted += 1;
        self.emit(BreakerEvent {
            at: now,
            addr,
            from: entry.state(now),
            to: CircuitState::Closed,
            reason: TransitionReason::Evicted,
            generation: entry.generation,
            reopen_at: None,
        });
    }

    /// Runs `f` on slot `slot`'s entry with a transition context, keeping the clean count exact.
    fn update<R>(
        &mut self,
        slot: usize,
        now: Instant,
        f: impl FnOnce(&mut Entry, &mut Ctx<'_>) -> R,
    ) -> R {
        let entry = self.peers.entry_mut(slot);
        let was_clean = entry.is_clean();
        let mut ctx = Ctx {
            threshold: self.config.failure_threshold,
            backoff: self.config.backoff,
            rng: &mut self.rng,
            now,
        };
        let result = f(entry, &mut ctx);
        match (was_clean, entry.is_clean()) {
            (true, false) => self.clean -= 1,
            (false, true) => self.clean += 1,
            (true, true) | (false, false) => {}
        }
        result
    }

    /// Mirrors an entry's change into the deadline index, counters and events.
    fn apply(&mut self, slot: usize, change: Change, now: Instant) {
        for probe in &change.released {
            let owner = self.deadlines.remove(&(probe.deadline, probe.id));
            assert_eq!(owner, Some(slot), "probe has a deadline");
        }
        let Some(t) = change.transition else {
            return;
        };
        match (t.from, t.to) {
            (CircuitState::HalfOpen, CircuitState::Open) => {
                self.counters.opened += 1;
                self.counters.probe_failed += 1;
            }
            (CircuitState::Closed, CircuitState::Open) => self.counters.opened += 1,
            (CircuitState::Open | CircuitState::HalfOpen, CircuitState::Closed) => {
                self.counters.recovered += 1;
            }
            (CircuitState::Open, CircuitState::HalfOpen) => {}
            (CircuitState::Closed, CircuitState::Closed | CircuitState::HalfOpen)
            | (CircuitState::Open, CircuitState::Open)
            | (CircuitState::HalfOpen, CircuitState::HalfOpen) => {
                unreachable!("no such transition: {} -> {}", t.from, t.to)
            }
        }
        self.emit(BreakerEvent {
            at: now,
            addr: self.peers.key(slot).clone(),
            from: t.from,
            to: t.to,
            reason: t.reason,
            generation: t.generation,
            reopen_at: t.reopen_at,
        });
    }

    fn count_outcome(&mut self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Answered => &mut self.counters.answered,
            Outcome::Cancelled => &mut self.counters.cancelled,
            Outcome::SoftFailure => &mut self.counters.soft,
            Outcome::HardFailure(HardReason::Dial) => &mut self.counters.hard,
            Outcome::HardFailure(HardReason::Validation) => &mut self.counters.validation,
            Outcome::Abandoned => &mut self.counters.abandoned,
        };
        *counter += 1;
    }

    fn emit(&mut self, event: BreakerEvent<K>) {
        if self.events.len() == EVENTS_MAX {
            self.events.pop_front();
            self.counters.events_dropped += 1;
        }
        self.events.push_back(event);
        debug_assert!(self.events.len() <= EVENTS_MAX);
    }
}
