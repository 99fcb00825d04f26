//! Model-based test ("fuzz breaker/roster interleavings"): proptest generates arbitrary
//! interleavings of data and roster begins and completions across several peers, abandoned and
//! leaked permits, clock jumps (including backwards), timer firings and churn past a small cap.
//! Each step is applied to the breaker and to a small reference model written independently
//! below (flat fields, linear scans, its own cooldown arithmetic); after every step the two must
//! agree on every observable (admissions, dispositions, states, health, open count, tracked
//! count, probes in flight, the timer, the event stream, counters) and the invariants must hold:
//! the map never exceeds its cap, probes in flight never exceed the limit, and a failure never
//! restamps the cooldown of a circuit that is open.
//!
//! Cases default to proptest's 256 and follow `PROPTEST_CASES` for long runs:
//! `PROPTEST_CASES=100000 cargo test -p dart-core --lib breaker::model_tests --release`.

use std::time::Duration;

use proptest::prelude::*;
use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;

/// Addresses drawn by the ops; more than any generated cap, so the map churns.
const PEERS: u16 = 8;
/// The model's clock starts here so rewinds can go below earlier stamps without saturating.
const START: Instant = Instant::from_secs(1_000);

// ---------------------------------------------------------------------------------------------
// The reference model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MKind {
    Data,
    Probe,
    Roster,
}

#[derive(Clone, Copy, Debug)]
struct MPermit {
    addr: u16,
    incarnation: u64,
    generation: u64,
    kind: MKind,
    id: u64,
}

#[derive(Clone, Debug)]
struct MPeer {
    addr: u16,
    incarnation: u64,
    generation: u64,
    mode: Mode,
    failures: u32,
    opened_at: Instant,
    until: Instant,
    /// (probe id, deadline) in flight.
    probes: Vec<(u64, Instant)>,
    successes: u32,
    failed_checks: u32,
    touched: u64,
}

/// What the model expects an event to say.
type MEvent = (Instant, u16, CircuitState, CircuitState, TransitionReason, Option<Instant>);

struct Model {
    config: BreakerConfig,
    rng: ChaCha8Rng,
    peers: Vec<MPeer>,
    tick: u64,
    incarnations: u64,
    permits: u64,
    events: Vec<MEvent>,
    stale: u64,
    opened: u64,
    recovered: u64,
}

fn mode_state(mode: Mode) -> CircuitState {
    match mode {
        Mode::Closed => CircuitState::Closed,
        Mode::Open => CircuitState::Open,
        Mode::HalfOpen => CircuitState::HalfOpen,
    }
}

fn is_success(outcome: Outcome) -> bool {
    outcome == Outcome::Answered || outcome == Outcome::Cancelled
}

fn is_failure(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::SoftFailure | Outcome::HardFailure(_))
}

impl Model {
    fn new(config: BreakerConfig) -> Self {
        Model {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            config,
            peers: Vec::new(),
            tick: 0,
            incarnations: 0,
            permits: 0,
            events: Vec::new(),
            stale: 0,
            opened: 0,
            recovered: 0,
        }
    }

    fn find(&self, addr: u16) -> Option<usize> {
        self.peers.iter().position(|p| p.addr == addr)
    }

    fn effective(p: &MPeer, now: Instant) -> Mode {
        if p.mode == Mode::Open && now >= p.until {
            Mode::HalfOpen
        } else {
            p.mode
        }
    }

    fn state(&self, addr: u16, now: Instant) -> CircuitState {
        self.find(addr)
            .map_or(CircuitState::Closed, |i| mode_state(Self::effective(&self.peers[i], now)))
    }

    fn healthy(&self, addr: u16, now: Instant) -> bool {
        let Some(i) = self.find(addr) else {
            return true;
        };
        let p = &self.peers[i];
        match Self::effective(p, now) {
            Mode::Closed => true,
            Mode::Open => false,
            Mode::HalfOpen => {
                p.successes == 0 && p.probes.len() < self.config.half_open_probes as usize
            }
        }
    }

    fn open_count(&self, now: Instant) -> usize {
        self.peers.iter().filter(|p| Self::effective(p, now) == Mode::Open).count()
    }

    fn probes_in_flight(&self) -> usize {
        self.peers.iter().map(|p| p.probes.len()).sum()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.peers.iter().flat_map(|p| p.probes.iter().map(|&(_, d)| d)).min()
    }

    fn cooldown(&mut self, failed_checks: u32) -> Duration {
        match self.config.backoff {
            BackoffPolicy::Fixed { cooldown } => cooldown,
            BackoffPolicy::Exponential { base, cap } => {
                let doubled = base.as_nanos() << failed_checks.min(40);
                let nominal = doubled.min(cap.as_nanos()) as u64;
                let half_up = nominal / 2 + nominal % 2;
                Duration::from_nanos(self.rng.random_range(half_up..=nominal))
            }
        }
    }

    /// A request path reached `addr`: create (making room), stamp, turn half-open if due.
    fn reach(&mut self, addr: u16, now: Instant) -> usize {
        self.tick += 1;
        if let Some(i) = self.find(addr) {
            self.peers[i].touched = self.tick;
        } else {
            self.make_room(now);
            self.incarnations += 1;
            self.peers.push(MPeer {
                addr,
                incarnation: self.incarnations,
                generation: 0,
                mode: Mode::Closed,
                failures: 0,
                opened_at: Instant::ZERO,
                until: Instant::ZERO,
                probes: Vec::new(),
                successes: 0,
                failed_checks: 0,
                touched: self.tick,
            });
        }
        let i = self.find(addr).unwrap();
        let p = &mut self.peers[i];
        if p.mode == Mode::Open && now >= p.until {
            p.mode = Mode::HalfOpen;
            self.events.push((
                now,
                addr,
                CircuitState::Open,
                CircuitState::HalfOpen,
                TransitionReason::CooldownElapsed,
                None,
            ));
        }
        i
    }

    fn make_room(&mut self, now: Instant) {
        if self.peers.len() < self.config.tracked_peers_max {
            return;
        }
        let clean = |p: &MPeer| p.mode == Mode::Closed && p.failures == 0;
        if self.peers.iter().any(clean) {
            self.peers.retain(|p| !clean(p));
            return;
        }
        let victim = (0..self.peers.len()).min_by_key(|&i| self.peers[i].touched).unwrap();
        let p = self.peers.remove(victim);
        let from = mode_state(Self::effective(&p, now));
        self.events.push((
            now,
            p.addr,
            from,
            CircuitState::Closed,
            TransitionReason::Evicted,
            None,
        ));
    }

    fn open(&mut self, i: usize, reason: TransitionReason, now: Instant) {
        let from = self.peers[i].mode;
        assert_ne!(from, Mode::Open);
        if from == Mode::HalfOpen {
            self.peers[i].failed_checks += 1;
        }
        let cooldown = self.cooldown(self.peers[i].failed_checks);
        let p = &mut self.peers[i];
        p.mode = Mode::Open;
        p.opened_at = now;
        p.until = now + cooldown;
        p.probes.clear();
        p.successes = 0;
        p.failures = 0;
        p.generation += 1;
        self.opened += 1;
        self.events.push((
            now,
            p.addr,
            mode_state(from),
            CircuitState::Open,
            reason,
            Some(p.until),
        ));
    }

    fn close(&mut self, i: usize, reason: TransitionReason, now: Instant) {
        let p = &mut self.peers[i];
        let from = p.mode;
        assert_ne!(from, Mode::Closed);
        p.mode = Mode::Closed;
        p.failures = 0;
        p.failed_checks = 0;
        p.probes.clear();
        p.successes = 0;
        p.generation += 1;
        self.recovered += 1;
        self.events.push((now, p.addr, mode_state(from), CircuitState::Closed, reason, None));
    }

    fn begin_data(&mut self, addr: u16, now: Instant) -> Option<MPermit> {
        let i = self.reach(addr, now);
        let limit = self.config.half_open_probes as usize;
        let deadline = now + self.config.probe_deadline;
        let id = self.permits;
        let p = &mut self.peers[i];
        let kind = match p.mode {
            Mode::Closed => MKind::Data,
            Mode::Open => return None,
            Mode::HalfOpen if p.successes == 0 && p.probes.len() < limit => {
                p.probes.push((id, deadline));
                MKind::Probe
            }
            Mode::HalfOpen => return None,
        };
        self.permits += 1;
        Some(MPermit { addr, incarnation: p.incarnation, generation: p.generation, kind, id })
    }

    fn begin_roster(&mut self, addr: u16, now: Instant) -> MPermit {
        let i = self.reach(addr, now);
        let id = self.permits;
        self.permits += 1;
        let p = &self.peers[i];
        MPermit {
            addr,
            incarnation: p.incarnation,
            generation: p.generation,
            kind: MKind::Roster,
            id,
        }
    }

    fn complete(&mut self, permit: MPermit, outcome: Outcome, now: Instant) -> Disposition {
        let live =
            self.find(permit.addr).is_some_and(|i| self.peers[i].incarnation == permit.incarnation);
        if !live {
            self.stale += 1;
            return Disposition::Forgotten;
        }
        let i = self.reach(permit.addr, now);
        if self.peers[i].generation != permit.generation {
            self.stale += 1;
            return Disposition::Superseded;
        }
        let applied = match (self.peers[i].mode, permit.kind) {
            (Mode::Closed, MKind::Data | MKind::Roster) => {
                self.closed_outcome(i, outcome, now);
                true
            }
            (Mode::Open, MKind::Roster) => {
                if is_success(outcome) {
                    self.close(i, TransitionReason::RosterAnswered, now);
                }
                true
            }
            (Mode::HalfOpen, MKind::Probe) => self.probe_outcome(i, permit.id, outcome, now),
            (Mode::HalfOpen, MKind::Roster) => {
                if self.peers[i].probes.is_empty() {
                    if is_success(outcome) {
                        self.close(i, TransitionReason::RosterAnswered, now);
                    } else if is_failure(outcome) {
                        self.open(i, TransitionReason::RosterFailed, now);
                    }
                }
                true
            }
            (Mode::Closed, MKind::Probe)
            | (Mode::Open, MKind::Data | MKind::Probe)
            | (Mode::HalfOpen, MKind::Data) => false,
        };
        if applied {
            Disposition::Applied
        } else {
            self.stale += 1;
            Disposition::Superseded
        }
    }

    fn closed_outcome(&mut self, i: usize, outcome: Outcome, now: Instant) {
        match outcome {
            Outcome::Answered | Outcome::Cancelled => self.peers[i].failures = 0,
            Outcome::SoftFailure => {
                self.peers[i].failures += 1;
                if self.peers[i].failures >= self.config.failure_threshold {
                    self.open(i, TransitionReason::FailureThreshold, now);
                }
            }
            Outcome::HardFailure(reason) => {
                self.open(i, TransitionReason::HardFailure(reason), now)
            }
            Outcome::Abandoned => {}
        }
    }

    fn probe_outcome(&mut self, i: usize, id: u64, outcome: Outcome, now: Instant) -> bool {
        let Some(at) = self.peers[i].probes.iter().position(|&(p, _)| p == id) else {
            return false;
        };
        self.peers[i].probes.remove(at);
        let none_left = self.peers[i].probes.is_empty();
        if is_success(outcome) {
            self.peers[i].successes += 1;
            if none_left {
                self.close(i, TransitionReason::ProbesSucceeded, now);
            }
        } else if is_failure(outcome) {
            self.open(i, TransitionReason::ProbeFailed, now);
        } else if none_left && self.peers[i].successes > 0 {
            self.close(i, TransitionReason::ProbesSucceeded, now);
        }
        true
    }

    fn handle_timeout(&mut self, now: Instant) {
        loop {
            let due = self
                .peers
                .iter()
                .enumerate()
                .flat_map(|(i, p)| p.probes.iter().map(move |&(id, d)| (d, id, i)))
                .filter(|&(d, _, _)| d <= now)
                .min();
            let Some((_, id, i)) = due else { break };
            self.peers[i].probes.retain(|&(p, _)| p != id);
            self.open(i, TransitionReason::ProbeExpired, now);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Operations

#[derive(Clone, Debug)]
enum Op {
    Data(u16),
    Roster(u16),
    /// Complete the `n % len`-th outstanding permit.
    Complete(usize, Outcome),
    /// Drop the `n % len`-th outstanding permit unreported (only its deadline can reclaim it).
    Leak(usize),
    Advance(u64),
    Rewind(u64),
    Timeout,
    JumpToTimeout,
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        4 => Just(Outcome::Answered),
        1 => Just(Outcome::Cancelled),
        4 => Just(Outcome::SoftFailure),
        2 => Just(Outcome::HardFailure(HardReason::Dial)),
        1 => Just(Outcome::HardFailure(HardReason::Validation)),
        2 => Just(Outcome::Abandoned),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (0..PEERS).prop_map(Op::Data),
        10 => (0..PEERS).prop_map(Op::Roster),
        30 => (any::<usize>(), outcome()).prop_map(|(n, o)| Op::Complete(n, o)),
        2 => any::<usize>().prop_map(Op::Leak),
        15 => (0..12_000u64).prop_map(Op::Advance),
        3 => (0..20_000u64).prop_map(Op::Rewind),
        4 => Just(Op::Timeout),
        4 => Just(Op::JumpToTimeout),
    ]
}

fn backoff() -> impl Strategy<Value = BackoffPolicy> {
    prop_oneof![
        (1..8_000u64).prop_map(|ms| BackoffPolicy::Fixed { cooldown: Duration::from_millis(ms) }),
        (1..4_000u64, 1..16u64).prop_map(|(ms, k)| BackoffPolicy::Exponential {
            base: Duration::from_millis(ms),
            cap: Duration::from_millis(ms * k),
        }),
    ]
}

fn config() -> impl Strategy<Value = BreakerConfig> {
    (1..5u32, 1..4u32, backoff(), 1..30_000u64, 1..7usize, any::<u64>()).prop_map(
        |(failure_threshold, half_open_probes, backoff, deadline_ms, tracked_peers_max, seed)| {
            BreakerConfig {
                failure_threshold,
                half_open_probes,
                backoff,
                probe_deadline: Duration::from_millis(deadline_ms),
                tracked_peers_max,
                seed,
            }
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The harness

struct Harness {
    breaker: Breaker<u16>,
    model: Model,
    permits: Vec<(Permit<u16>, MPermit)>,
    now: Instant,
}

impl Harness {
    fn new(config: BreakerConfig) -> Self {
        Harness {
            breaker: Breaker::new(config.clone()).expect("generated configs are valid"),
            model: Model::new(config),
            permits: Vec::new(),
            now: START,
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let open_before = self.open_stamps();
        match *op {
            Op::Data(addr) => self.data(addr)?,
            Op::Roster(addr) => {
                let permit = self.breaker.begin_roster(&addr, self.now);
                let expected = self.model.begin_roster(addr, self.now);
                check_permit(&permit, &expected)?;
                self.permits.push((permit, expected));
            }
            Op::Complete(n, outcome) => self.complete(n, outcome)?,
            Op::Leak(n) => {
                if !self.permits.is_empty() {
                    let n = n % self.permits.len();
                    drop(self.permits.swap_remove(n));
                }
            }
            Op::Advance(ms) => self.now += Duration::from_millis(ms),
            Op::Rewind(ms) => {
                let back = self.now.as_nanos().saturating_sub(ms * 1_000_000);
                self.now = Instant::from_nanos(back);
            }
            Op::Timeout => self.timeout(),
            Op::JumpToTimeout => {
                if let Some(deadline) = self.breaker.poll_timeout() {
                    self.now = self.now.max(deadline);
                }
                self.timeout();
            }
        }
        self.check_cooldowns_not_restamped(&open_before)?;
        self.compare()
    }

    fn data(&mut self, addr: u16) -> Result<(), TestCaseError> {
        let admission = self.breaker.begin_data(&addr, self.now);
        let expected = self.model.begin_data(addr, self.now);
        match (admission, expected) {
            (Admission::Admitted(permit), Some(expected)) => {
                check_permit(&permit, &expected)?;
                self.permits.push((permit, expected));
            }
            (Admission::Rejected, None) => {}
            (admission, expected) => {
                return Err(TestCaseError::fail(format!("{admission:?} vs model {expected:?}")))
            }
        }
        Ok(())
    }

    fn complete(&mut self, n: usize, outcome: Outcome) -> Result<(), TestCaseError> {
        if self.permits.is_empty() {
            return Ok(());
        }
        let (permit, expected) = self.permits.swap_remove(n % self.permits.len());
        let got = self.breaker.complete(permit, outcome, self.now);
        let want = self.model.complete(expected, outcome, self.now);
        prop_assert_eq!(got, want, "complete {:?} {:?}", expected, outcome);
        Ok(())
    }

    fn timeout(&mut self) {
        self.breaker.handle_timeout(self.now);
        self.model.handle_timeout(self.now);
        assert!(self.breaker.poll_timeout().is_none_or(|t| t > self.now));
    }

    /// Every peer effectively open at `now`, with its opened-at stamp.
    fn open_stamps(&self) -> Vec<(u16, Instant)> {
        (0..PEERS)
            .filter(|a| self.breaker.state(a, self.now) == CircuitState::Open)
            .map(|a| (a, self.breaker.opened_at(&a).expect("open has a stamp")))
            .collect()
    }

    /// A circuit open before a step at the same `now` is, after it, still open with the same
    /// stamp, closed by a roster, or evicted: nothing restamps an open circuit.
    fn check_cooldowns_not_restamped(
        &self,
        before: &[(u16, Instant)],
    ) -> Result<(), TestCaseError> {
        for &(addr, stamp) in before {
            if let Some(after) = self.breaker.opened_at(&addr) {
                prop_assert_eq!(after, stamp, "cooldown of open peer {} restamped", addr);
            }
        }
        Ok(())
    }

    fn compare(&mut self) -> Result<(), TestCaseError> {
        let (b, m, now) = (&mut self.breaker, &self.model, self.now);
        b.check_invariants();
        prop_assert!(b.tracked() <= b.config().tracked_peers_max);
        prop_assert_eq!(b.tracked(), m.peers.len());
        for p in &m.peers {
            prop_assert!(
                p.probes.len() + p.successes as usize <= m.config.half_open_probes as usize
            );
        }
        for addr in 0..PEERS {
            prop_assert_eq!(b.state(&addr, now), m.state(addr, now), "state of {}", addr);
            prop_assert_eq!(b.healthy(&addr, now), m.healthy(addr, now), "health of {}", addr);
            let refused = b.unhealthy(now).any(|a| *a == addr);
            prop_assert_eq!(refused, !m.healthy(addr, now), "unhealthy lists {}", addr);
            let unclosed: Vec<CircuitState> =
                b.unclosed(now).filter(|(a, _)| **a == addr).map(|(_, s)| s).collect();
            let want = m.state(addr, now);
            let want: Vec<CircuitState> =
                if want == CircuitState::Closed { vec![] } else { vec![want] };
            prop_assert_eq!(unclosed, want, "unclosed lists {}", addr);
        }
        prop_assert_eq!(b.open_count(now), m.open_count(now));
        prop_assert_eq!(b.probes_in_flight(), m.probes_in_flight());
        prop_assert_eq!(b.poll_timeout(), m.poll_timeout());
        let events: Vec<MEvent> = std::iter::from_fn(|| b.poll_event())
            .map(|e| (e.at, e.addr, e.from, e.to, e.reason, e.reopen_at))
            .collect();
        prop_assert_eq!(&events, &m.events);
        let c = b.counters();
        prop_assert_eq!((c.stale, c.opened, c.recovered), (m.stale, m.opened, m.recovered));
        self.model.events.clear();
        Ok(())
    }
}

fn check_permit(permit: &Permit<u16>, expected: &MPermit) -> Result<(), TestCaseError> {
    let kind = match expected.kind {
        MKind::Data => PermitKind::Data,
        MKind::Probe => PermitKind::Probe,
        MKind::Roster => PermitKind::Roster,
    };
    prop_assert_eq!(permit.kind(), kind);
    prop_assert_eq!(*permit.addr(), expected.addr);
    prop_assert_eq!(permit.generation(), expected.generation);
    prop_assert_eq!(permit.id(), expected.id);
    Ok(())
}

proptest! {
    // ProptestConfig::default() reads PROPTEST_CASES (256 when unset).
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn breaker_matches_the_reference_model_under_arbitrary_interleavings(
        config in config(),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let mut harness = Harness::new(config);
        for op in &ops {
            harness.step(op)?;
        }
    }
}
