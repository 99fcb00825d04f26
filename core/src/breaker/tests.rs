//! Unit tests: every breaker, roster-outcome and classification property of seeds/peer.md §7 (the
//! Go test each one replaces is named in its doc line), the known bugs of
//! spec/known-bugs.md "Peer transport and breaker", and the improvements over the seed.

use std::fmt::Write as _;
use std::time::Duration;

use super::*;

type Addr = &'static str;

const A: Addr = "10.0.0.1:7070";
const B: Addr = "10.0.0.2:7070";

fn at(millis: u64) -> Instant {
    Instant::from_millis(millis)
}

/// peer.md's breaker exactly: threshold 5, one probe, fixed 5 s cooldown.
fn seed_config() -> BreakerConfig {
    BreakerConfig {
        backoff: BackoffPolicy::Fixed { cooldown: DEFAULT_COOLDOWN },
        ..BreakerConfig::default()
    }
}

fn with_threshold(failure_threshold: u32) -> BreakerConfig {
    BreakerConfig { failure_threshold, ..seed_config() }
}

fn breaker(config: BreakerConfig) -> Breaker<Addr> {
    let b = Breaker::new(config).expect("valid config");
    b.check_invariants();
    b
}

fn admit(b: &mut Breaker<Addr>, addr: Addr, now: Instant) -> Permit<Addr> {
    match b.begin_data(&addr, now) {
        Admission::Admitted(permit) => permit,
        Admission::Rejected => panic!("{addr} rejected at {now}"),
    }
}

/// One whole data request: admit, then report `outcome`.
fn request(b: &mut Breaker<Addr>, addr: Addr, outcome: Outcome, now: Instant) -> Disposition {
    let permit = admit(b, addr, now);
    let disposition = b.complete(permit, outcome, now);
    b.check_invariants();
    disposition
}

fn roster(b: &mut Breaker<Addr>, addr: Addr, outcome: Outcome, now: Instant) -> Disposition {
    let permit = b.begin_roster(&addr, now);
    let disposition = b.complete(permit, outcome, now);
    b.check_invariants();
    disposition
}

fn drain(b: &mut Breaker<Addr>) -> Vec<BreakerEvent<Addr>> {
    std::iter::from_fn(|| b.poll_event()).collect()
}

const DIAL: Outcome = Outcome::HardFailure(HardReason::Dial);
const VALIDATION: Outcome = Outcome::HardFailure(HardReason::Validation);

/// Opens `addr` with one dial failure at `now`.
fn open(b: &mut Breaker<Addr>, addr: Addr, now: Instant) {
    assert_eq!(request(b, addr, DIAL, now), Disposition::Applied);
    assert_eq!(b.state(&addr, now), CircuitState::Open);
}

// ---------------------------------------------------------------------------------------------
// Defaults, configuration, state names

/// TestBreakerDefaultsAndStateNames.
#[test]
fn defaults_match_peer_md_and_states_print_their_names() {
    let config = BreakerConfig::default();
    assert_eq!(config.failure_threshold, 5);
    assert_eq!(config.half_open_probes, 1);
    assert_eq!(config.tracked_peers_max, 4096);
    assert_eq!(TRACKED_PEERS_MAX, 4096);
    assert_eq!(
        config.backoff,
        BackoffPolicy::Exponential { base: Duration::from_secs(5), cap: Duration::from_secs(60) }
    );
    assert!(config.probe_deadline > Duration::from_secs(30), "longer than the request bound");
    assert_eq!(CircuitState::Closed.to_string(), "closed");
    assert_eq!(CircuitState::Open.to_string(), "open");
    assert_eq!(CircuitState::HalfOpen.to_string(), "half-open");
    let b = breaker(config);
    assert_eq!(b.state(&A, at(0)), CircuitState::Closed);
    assert!(b.healthy(&A, at(0)));
    assert_eq!(b.open_count(at(0)), 0);
}

#[test]
fn invalid_configs_are_refused_with_typed_errors() {
    let base = BreakerConfig::default();
    let cases = [
        (
            BreakerConfig { half_open_probes: 0, ..base.clone() },
            BreakerConfigError::HalfOpenProbes(0),
        ),
        (
            BreakerConfig { half_open_probes: HALF_OPEN_PROBES_MAX + 1, ..base.clone() },
            BreakerConfigError::HalfOpenProbes(HALF_OPEN_PROBES_MAX + 1),
        ),
        (
            BreakerConfig {
                backoff: BackoffPolicy::Fixed { cooldown: Duration::ZERO },
                ..base.clone()
            },
            BreakerConfigError::ZeroCooldown,
        ),
        (
            BreakerConfig {
                backoff: BackoffPolicy::Exponential {
                    base: Duration::from_secs(10),
                    cap: Duration::from_secs(5),
                },
                ..base.clone()
            },
            BreakerConfigError::CapBelowBase {
                base: Duration::from_secs(10),
                cap: Duration::from_secs(5),
            },
        ),
        (
            BreakerConfig {
                backoff: BackoffPolicy::Fixed { cooldown: COOLDOWN_MAX + Duration::from_nanos(1) },
                ..base.clone()
            },
            BreakerConfigError::CooldownTooLong(COOLDOWN_MAX + Duration::from_nanos(1)),
        ),
        (
            BreakerConfig { probe_deadline: Duration::ZERO, ..base.clone() },
            BreakerConfigError::ProbeDeadline(Duration::ZERO),
        ),
        (
            BreakerConfig { tracked_peers_max: 0, ..base.clone() },
            BreakerConfigError::TrackedPeers(0),
        ),
        (
            BreakerConfig { tracked_peers_max: TRACKED_PEERS_MAX + 1, ..base.clone() },
            BreakerConfigError::TrackedPeers(TRACKED_PEERS_MAX + 1),
        ),
    ];
    for (config, expected) in cases {
        assert_eq!(Breaker::<Addr>::new(config).unwrap_err(), expected);
    }
    assert!(BreakerConfigError::TrackedPeers(0).to_string().contains("4096"));
}

/// `--breaker-failures 0`.
#[test]
fn zero_threshold_disables_the_breaker() {
    let mut b = breaker(with_threshold(0));
    for i in 0..100 {
        let permit = admit(&mut b, A, at(i));
        assert_eq!(permit.kind(), PermitKind::Untracked);
        assert_eq!(b.complete(permit, DIAL, at(i)), Disposition::Untracked);
        let permit = b.begin_roster(&A, at(i));
        assert_eq!(b.complete(permit, DIAL, at(i)), Disposition::Untracked);
    }
    assert_eq!(b.state(&A, at(100)), CircuitState::Closed);
    assert!(b.healthy(&A, at(100)));
    assert_eq!(b.tracked(), 0);
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.poll_event(), None);
    assert_eq!(b.counters(), &BreakerCounters::default());
    b.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Closed → open

/// TestBreakerOpensAfterThreshold.
#[test]
fn opens_only_at_the_consecutive_soft_failure_threshold() {
    let mut b = breaker(seed_config());
    for i in 0..4 {
        request(&mut b, A, Outcome::SoftFailure, at(i));
        assert_eq!(b.state(&A, at(i)), CircuitState::Closed, "after {} failures", i + 1);
    }
    request(&mut b, A, Outcome::SoftFailure, at(4));
    assert_eq!(b.state(&A, at(4)), CircuitState::Open);
    assert_eq!(b.begin_data(&A, at(5)), Admission::Rejected);
    let events = drain(&mut b);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason, TransitionReason::FailureThreshold);
    assert_eq!(events[0].reopen_at, Some(at(4) + DEFAULT_COOLDOWN));
}

/// TestBreakerSuccessResetsFailures.
#[test]
fn an_answer_clears_the_count_so_intermittent_failures_never_open() {
    let mut b = breaker(seed_config());
    let mut now = 0;
    for _ in 0..20 {
        for _ in 0..4 {
            request(&mut b, A, Outcome::SoftFailure, at(now));
            now += 1;
        }
        request(&mut b, A, Outcome::Answered, at(now));
        now += 1;
    }
    assert_eq!(b.state(&A, at(now)), CircuitState::Closed);
    assert_eq!(b.counters().opened, 0);
}

/// TestSoftFailureStillNeedsThreshold.
#[test]
fn one_soft_failure_does_not_eject_a_reachable_peer() {
    let mut b = breaker(seed_config());
    request(&mut b, A, Observation::UnexpectedStatus(500).outcome(), at(0));
    assert_eq!(b.state(&A, at(0)), CircuitState::Closed);
    assert!(b.healthy(&A, at(0)));
    assert!(b.begin_data(&A, at(0)).is_admitted());
}

/// TestBreakerOpensOnFirstHardFailure; known bug "a dead host cost five dial timeouts".
#[test]
fn a_dial_failure_opens_at_once() {
    let mut b = breaker(seed_config());
    request(&mut b, A, Observation::DialFailed.outcome(), at(0));
    assert_eq!(b.state(&A, at(0)), CircuitState::Open);
    assert!(!b.healthy(&A, at(0)));
    let events = drain(&mut b);
    assert_eq!(events[0].reason, TransitionReason::HardFailure(HardReason::Dial));
}

/// GetValidated (§3.4): a validated protocol violation opens the current generation before a
/// concurrent request of that generation can record success.
#[test]
fn validation_failure_opens_at_once_and_a_concurrent_success_cannot_undo_it() {
    let mut b = breaker(seed_config());
    let concurrent = admit(&mut b, A, at(0));
    request(&mut b, A, Observation::WrongLength.outcome(), at(1));
    assert_eq!(b.state(&A, at(1)), CircuitState::Open);
    assert_eq!(b.complete(concurrent, Outcome::Answered, at(2)), Disposition::Superseded);
    assert_eq!(b.state(&A, at(2)), CircuitState::Open);
    assert_eq!(b.counters().validation, 1);
}

/// TestClientBreakerShortCircuits.
#[test]
fn open_circuit_rejects_admission_so_no_dial_happens() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    for i in 0..10 {
        assert_eq!(b.begin_data(&A, at(i * 100)), Admission::Rejected);
    }
    assert_eq!(b.counters().rejected, 10);
    assert_eq!(b.probes_in_flight(), 0);
}

/// TestDeadPeerRoutedAroundQuickly: 200 further attempts cost no dial at all.
#[test]
fn two_hundred_attempts_at_a_dead_peer_are_rejected_without_dialing() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    let admitted = (0..200).filter(|i| b.begin_data(&A, at(1 + i * 10)).is_admitted()).count();
    assert_eq!(admitted, 0);
}

/// TestClientBreakerIgnores404; known bug "404s would trip healthy peers".
#[test]
fn twenty_misses_leave_the_circuit_closed() {
    let mut b = breaker(seed_config());
    for i in 0..20 {
        request(&mut b, A, Observation::Miss.outcome(), at(i));
    }
    assert_eq!(b.state(&A, at(20)), CircuitState::Closed);
    assert_eq!(b.counters().answered, 20);
}

/// TestBreakerIsolatesPeers.
#[test]
fn one_sick_peer_does_not_affect_others() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    for i in 0..10 {
        request(&mut b, B, Outcome::Answered, at(i));
    }
    assert_eq!(b.state(&B, at(10)), CircuitState::Closed);
    assert_eq!(b.state(&A, at(10)), CircuitState::Open);
    assert_eq!(b.open_count(at(10)), 1);
}

// ---------------------------------------------------------------------------------------------
// Open → half-open → closed / open

/// TestBreakerHalfOpenRecovery.
#[test]
fn cooldown_turns_half_open_which_admits_one_probe_whose_success_closes() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    assert_eq!(b.state(&A, at(4_999)), CircuitState::Open);
    assert_eq!(b.state(&A, at(5_000)), CircuitState::HalfOpen);
    let probe = admit(&mut b, A, at(5_000));
    assert!(probe.is_probe());
    assert_eq!(b.begin_data(&A, at(5_001)), Admission::Rejected, "one probe only");
    assert!(!b.healthy(&A, at(5_001)), "the only slot is taken");
    assert_eq!(b.complete(probe, Outcome::Answered, at(5_100)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_100)), CircuitState::Closed);
    let reasons: Vec<_> = drain(&mut b).into_iter().map(|e| e.reason).collect();
    assert_eq!(
        reasons,
        [
            TransitionReason::HardFailure(HardReason::Dial),
            TransitionReason::CooldownElapsed,
            TransitionReason::ProbesSucceeded
        ]
    );
}

/// TestBreakerHalfOpenFailureReopens.
#[test]
fn failed_probe_reopens_and_restarts_the_cooldown() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    request(&mut b, A, Outcome::SoftFailure, at(6_000));
    assert_eq!(b.state(&A, at(6_000)), CircuitState::Open);
    assert_eq!(b.state(&A, at(10_999)), CircuitState::Open);
    assert_eq!(b.state(&A, at(11_000)), CircuitState::HalfOpen);
    assert_eq!(b.counters().probe_failed, 1);
}

/// TestLateFailureDoesNotExtendCooldown; known bug "a late failure while open restamped the
/// cooldown".
#[test]
fn late_failure_while_open_does_not_extend_the_cooldown_but_a_failed_probe_does() {
    let mut b = breaker(seed_config());
    let late_data = admit(&mut b, A, at(0));
    let current_roster = {
        open(&mut b, A, at(0));
        b.begin_roster(&A, at(1_000))
    };
    // A data request from before the opening dies late: stale, nothing restamped.
    assert_eq!(b.complete(late_data, Outcome::SoftFailure, at(3_000)), Disposition::Superseded);
    // A roster fetch begun while open fails: applied, but the circuit is already open.
    assert_eq!(b.complete(current_roster, DIAL, at(4_000)), Disposition::Applied);
    assert_eq!(b.opened_at(&A), Some(at(0)));
    assert_eq!(b.state(&A, at(5_000)), CircuitState::HalfOpen, "cooldown counts from opening");
    // A failed probe does restamp.
    request(&mut b, A, Outcome::SoftFailure, at(7_000));
    assert_eq!(b.opened_at(&A), Some(at(7_000)));
    assert_eq!(b.state(&A, at(11_999)), CircuitState::Open);
    assert_eq!(b.state(&A, at(12_000)), CircuitState::HalfOpen);
}

/// TestClientBreakerRecovers.
#[test]
fn recovered_peer_is_used_again_after_the_cooldown() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    assert_eq!(b.begin_data(&A, at(1_000)), Admission::Rejected);
    request(&mut b, A, Outcome::Answered, at(5_000));
    for i in 0..5 {
        let permit = admit(&mut b, A, at(5_001 + i));
        assert_eq!(permit.kind(), PermitKind::Data, "closed again: no probe needed");
        assert_eq!(b.complete(permit, Outcome::Answered, at(5_001 + i)), Disposition::Applied);
    }
}

/// TestBreakerHardFailureRecovers.
#[test]
fn opening_on_a_hard_failure_is_reversible_by_cooldown_and_probe() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    let probe = admit(&mut b, A, at(5_000));
    assert!(probe.is_probe());
    b.complete(probe, Outcome::Answered, at(5_010));
    assert_eq!(b.state(&A, at(5_010)), CircuitState::Closed);
    // And the budget is whole again: one soft failure does not reopen.
    request(&mut b, A, Outcome::SoftFailure, at(5_020));
    assert_eq!(b.state(&A, at(5_020)), CircuitState::Closed);
}

/// TestHalfOpenProbesWaitForSiblingOutcome: concurrent recovery.
#[test]
fn half_open_waits_for_every_admitted_probe_before_closing() {
    let mut b = breaker(BreakerConfig { half_open_probes: 2, ..seed_config() });
    open(&mut b, A, at(0));
    let first = admit(&mut b, A, at(5_000));
    let second = admit(&mut b, A, at(5_001));
    assert_eq!(b.begin_data(&A, at(5_002)), Admission::Rejected, "both slots taken");
    b.complete(first, Outcome::Answered, at(5_010));
    assert_eq!(b.state(&A, at(5_010)), CircuitState::HalfOpen, "a sibling is outstanding");
    assert_eq!(b.begin_data(&A, at(5_011)), Admission::Rejected, "paused after a success");
    b.complete(second, Outcome::Answered, at(5_020));
    assert_eq!(b.state(&A, at(5_020)), CircuitState::Closed);
}

/// TestHalfOpenProbesWaitForSiblingOutcome: a sibling's hard failure vetoes recovery.
#[test]
fn a_sibling_probe_failure_vetoes_recovery_after_a_success() {
    let mut b = breaker(BreakerConfig { half_open_probes: 2, ..seed_config() });
    open(&mut b, A, at(0));
    let first = admit(&mut b, A, at(5_000));
    let second = admit(&mut b, A, at(5_001));
    b.complete(first, Outcome::Answered, at(5_010));
    assert_eq!(b.complete(second, DIAL, at(5_020)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_020)), CircuitState::Open);
    assert_eq!(b.opened_at(&A), Some(at(5_020)));
}

/// A single success with more slots free pauses admission, and closing needs nobody else.
#[test]
fn first_probe_success_closes_when_no_sibling_was_admitted() {
    let mut b = breaker(BreakerConfig { half_open_probes: 3, ..seed_config() });
    open(&mut b, A, at(0));
    request(&mut b, A, Outcome::Answered, at(5_000));
    assert_eq!(b.state(&A, at(5_000)), CircuitState::Closed);
}

/// TestClientLateFailureCannotUndoRecovery.
#[test]
fn late_failure_from_before_recovery_cannot_reopen_the_circuit() {
    let mut b = breaker(seed_config());
    let old = admit(&mut b, A, at(0));
    let old_roster = b.begin_roster(&A, at(0));
    open(&mut b, A, at(1));
    request(&mut b, A, Outcome::Answered, at(5_001));
    assert_eq!(b.state(&A, at(5_001)), CircuitState::Closed);
    assert_eq!(b.complete(old, DIAL, at(5_002)), Disposition::Superseded);
    assert_eq!(b.complete(old_roster, DIAL, at(5_002)), Disposition::Superseded);
    assert_eq!(b.state(&A, at(5_002)), CircuitState::Closed);
    assert_eq!(b.counters().stale, 2);
}

/// TestClientLateSuccessCannotClearProtocolQuarantine.
#[test]
fn stale_successes_cannot_clear_quarantine_only_a_current_probe_can() {
    let mut b = breaker(BreakerConfig { half_open_probes: 2, ..seed_config() });
    let (d1, d2) = (admit(&mut b, A, at(0)), admit(&mut b, A, at(0)));
    let (r1, r2) = (b.begin_roster(&A, at(0)), b.begin_roster(&A, at(0)));
    request(&mut b, A, VALIDATION, at(1));
    // While open.
    assert_eq!(b.complete(d1, Outcome::Answered, at(2)), Disposition::Superseded);
    assert_eq!(b.complete(r1, Outcome::Answered, at(2)), Disposition::Superseded);
    assert_eq!(b.state(&A, at(2)), CircuitState::Open);
    // While half-open, with a current probe outstanding.
    let probe = admit(&mut b, A, at(5_001));
    assert_eq!(b.complete(d2, Outcome::Answered, at(5_002)), Disposition::Superseded);
    assert_eq!(b.complete(r2, Outcome::Answered, at(5_002)), Disposition::Superseded);
    assert_eq!(b.state(&A, at(5_002)), CircuitState::HalfOpen);
    assert_eq!(b.complete(probe, Outcome::Answered, at(5_003)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_003)), CircuitState::Closed);
}

/// A probe of a superseded half-open phase cannot take a newer phase's slot or close it.
#[test]
fn stale_probe_cannot_take_a_newer_probe_slot() {
    let mut b = breaker(BreakerConfig { half_open_probes: 2, ..seed_config() });
    open(&mut b, A, at(0));
    let old_probe = admit(&mut b, A, at(5_000));
    request(&mut b, A, Outcome::SoftFailure, at(5_001)); // sibling fails: reopen
    let new_probe = admit(&mut b, A, at(10_001));
    assert_eq!(b.complete(old_probe, Outcome::Answered, at(10_002)), Disposition::Superseded);
    assert_eq!(b.state(&A, at(10_002)), CircuitState::HalfOpen);
    assert_eq!(b.probes_in_flight(), 1);
    assert_eq!(b.complete(new_probe, Outcome::Answered, at(10_003)), Disposition::Applied);
    assert_eq!(b.state(&A, at(10_003)), CircuitState::Closed);
}

// ---------------------------------------------------------------------------------------------
// Caller cancellation, abandoned permits, probe deadlines

/// TestCallerCancelNotChargedToPeer; known bug "caller cancellation counted as a peer failure".
#[test]
fn caller_cancellation_is_not_charged_and_releases_the_probe_slot() {
    let mut b = breaker(seed_config());
    for i in 0..4 {
        request(&mut b, A, Outcome::SoftFailure, at(i));
    }
    for i in 4..20 {
        request(&mut b, A, Observation::CallerCancelled.outcome(), at(i));
    }
    request(&mut b, A, Outcome::SoftFailure, at(20));
    assert_eq!(b.state(&A, at(20)), CircuitState::Closed, "cancellation cleared the count");
    // A cancelled probe releases its slot by counting as answered.
    open(&mut b, B, at(100));
    let probe = admit(&mut b, B, at(5_100));
    assert_eq!(b.complete(probe, Outcome::Cancelled, at(5_101)), Disposition::Applied);
    assert_eq!(b.state(&B, at(5_101)), CircuitState::Closed);
    assert_eq!(b.probes_in_flight(), 0);
    assert_eq!(b.counters().cancelled, 17);
}

#[test]
fn abandoned_probe_gives_its_slot_back_without_counting_as_success() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    let probe = admit(&mut b, A, at(5_000));
    assert_eq!(b.complete(probe, Outcome::Abandoned, at(5_001)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_001)), CircuitState::HalfOpen, "neither closed nor reopened");
    assert!(b.healthy(&A, at(5_001)), "the slot is free again");
    assert_eq!(b.poll_timeout(), None, "its deadline went with it");
    let next = admit(&mut b, A, at(5_002));
    assert!(next.is_probe());
    b.complete(next, Outcome::Answered, at(5_003));
    assert_eq!(b.state(&A, at(5_003)), CircuitState::Closed);
    assert_eq!(b.counters().abandoned, 1);
}

#[test]
fn abandoned_probe_after_a_sibling_success_closes() {
    let mut b = breaker(BreakerConfig { half_open_probes: 2, ..seed_config() });
    open(&mut b, A, at(0));
    let first = admit(&mut b, A, at(5_000));
    let second = admit(&mut b, A, at(5_000));
    b.complete(first, Outcome::Answered, at(5_001));
    assert_eq!(b.complete(second, Outcome::Abandoned, at(5_002)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_002)), CircuitState::Closed, "every reported probe succeeded");
}

#[test]
fn abandoned_data_and_roster_requests_record_nothing() {
    let mut b = breaker(with_threshold(2));
    request(&mut b, A, Outcome::SoftFailure, at(0));
    request(&mut b, A, Outcome::Abandoned, at(1));
    roster(&mut b, A, Outcome::Abandoned, at(2));
    request(&mut b, A, Outcome::SoftFailure, at(3));
    assert_eq!(b.state(&A, at(3)), CircuitState::Open, "abandoning did not clear the count");
    assert_eq!(roster(&mut b, A, Outcome::Abandoned, at(4)), Disposition::Applied);
    assert_eq!(b.state(&A, at(4)), CircuitState::Open);
}

/// A probe that never reports cannot wedge its peer.
#[test]
fn unreported_probe_is_reclaimed_at_its_deadline_as_a_soft_failure() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    let lost = admit(&mut b, A, at(5_000));
    let deadline = at(5_000) + DEFAULT_PROBE_DEADLINE;
    assert_eq!(b.poll_timeout(), Some(deadline));
    b.handle_timeout(Instant::from_nanos(deadline.as_nanos() - 1_000_000));
    assert_eq!(b.state(&A, deadline), CircuitState::HalfOpen, "not yet");
    b.handle_timeout(deadline);
    b.check_invariants();
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.state(&A, deadline), CircuitState::Open);
    assert_eq!(b.opened_at(&A), Some(deadline));
    assert_eq!((b.counters().probe_expired, b.counters().soft), (1, 1));
    // Its eventual report is stale.
    assert_eq!(b.complete(lost, Outcome::Answered, deadline), Disposition::Superseded);
    assert_eq!(b.state(&A, deadline), CircuitState::Open);
    let last = drain(&mut b).pop().expect("events");
    assert_eq!(last.reason, TransitionReason::ProbeExpired);
}

#[test]
fn poll_timeout_is_none_or_later_than_now_after_handle_timeout() {
    let mut b = breaker(BreakerConfig { half_open_probes: 3, ..seed_config() });
    let peers = ["p0", "p1", "p2", "p3", "p4"];
    let mut permits = Vec::new();
    for (i, peer) in peers.iter().enumerate() {
        open(&mut b, peer, at(i as u64 * 700));
        for j in 0..3 {
            permits.push(admit(&mut b, peer, at(10_000 + i as u64 * 300 + j * 100)));
        }
    }
    assert_eq!(b.probes_in_flight(), 15);
    let mut now = at(0);
    while let Some(deadline) = b.poll_timeout() {
        assert!(deadline >= now);
        now = deadline;
        b.handle_timeout(now);
        b.check_invariants();
        assert!(b.poll_timeout().is_none_or(|t| t > now));
    }
    for peer in peers {
        assert_eq!(b.state(&peer, now), CircuitState::Open);
    }
    assert_eq!(b.counters().probe_expired, 5, "one reclaim per peer; siblings went stale");
    for permit in permits {
        assert_eq!(b.complete(permit, Outcome::Answered, now), Disposition::Superseded);
    }
}

// ---------------------------------------------------------------------------------------------
// Roster

/// TestRosterFetchIgnoresOpenCircuit; known bug "roster fetch gated by open circuits stalled a
/// booting cluster".
#[test]
fn roster_bypasses_an_open_circuit_and_closes_it_on_success() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    let permit = b.begin_roster(&A, at(100));
    assert_eq!(permit.kind(), PermitKind::Roster);
    assert_eq!(b.complete(permit, Outcome::Answered, at(200)), Disposition::Applied);
    assert_eq!(b.state(&A, at(200)), CircuitState::Closed);
    assert!(b.healthy(&A, at(200)));
    assert_eq!(drain(&mut b).pop().map(|e| e.reason), Some(TransitionReason::RosterAnswered));
}

/// TestRosterFetchRecordsFailure.
#[test]
fn failed_roster_dial_opens_the_circuit_for_the_data_path() {
    let mut b = breaker(seed_config());
    roster(&mut b, A, DIAL, at(0));
    assert_eq!(b.state(&A, at(0)), CircuitState::Open);
    assert_eq!(b.begin_data(&A, at(1)), Admission::Rejected);
    // Soft roster failures spend the shared budget too.
    for i in 0..5 {
        roster(&mut b, B, Outcome::SoftFailure, at(i));
    }
    assert_eq!(b.state(&B, at(5)), CircuitState::Open);
}

/// TestHalfOpenRosterSuccessCannotConsumeDataProbe.
#[test]
fn roster_success_never_consumes_or_overrides_an_outstanding_data_probe() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    let probe = admit(&mut b, A, at(5_000));
    assert_eq!(roster(&mut b, A, Outcome::Answered, at(5_001)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_001)), CircuitState::HalfOpen, "the probe decides");
    assert_eq!(b.probes_in_flight(), 1, "the slot is still the probe's");
    assert_eq!(b.begin_data(&A, at(5_002)), Admission::Rejected);
    // The data probe's failure is not hidden by the roster success.
    assert_eq!(b.complete(probe, Outcome::SoftFailure, at(5_003)), Disposition::Applied);
    assert_eq!(b.state(&A, at(5_003)), CircuitState::Open);
}

#[test]
fn roster_outcome_decides_half_open_only_when_no_data_probe_is_in_flight() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(0));
    // With a probe in flight a roster failure changes nothing either.
    let probe = admit(&mut b, A, at(5_000));
    roster(&mut b, A, DIAL, at(5_001));
    assert_eq!(b.state(&A, at(5_001)), CircuitState::HalfOpen);
    b.complete(probe, Outcome::Abandoned, at(5_002));
    // With none in flight, a roster failure is a failed recovery check: reopen and restamp.
    roster(&mut b, A, DIAL, at(5_003));
    assert_eq!(b.state(&A, at(5_003)), CircuitState::Open);
    assert_eq!(b.opened_at(&A), Some(at(5_003)));
    // And a roster success after the next cooldown closes.
    roster(&mut b, A, Outcome::Answered, at(10_003));
    assert_eq!(b.state(&A, at(10_003)), CircuitState::Closed);
}

// ---------------------------------------------------------------------------------------------
// Classification (§3.5 table, §3.4, §3.6)

/// TestClassifyDialFailureIsHard.
#[test]
fn dial_failure_classifies_hard_a_500_soft_and_an_answer_answered() {
    assert_eq!(Observation::DialFailed.outcome(), DIAL);
    assert_eq!(Observation::UnexpectedStatus(500).outcome(), Outcome::SoftFailure);
    assert_eq!(Observation::Served.outcome(), Outcome::Answered);
}

#[test]
fn every_observation_classifies_as_peer_md_says() {
    let table = [
        (Observation::Served, Outcome::Answered),
        (Observation::Miss, Outcome::Answered),
        (Observation::UpstreamRefused { status: 403 }, Outcome::Answered),
        (Observation::CallerCancelled, Outcome::Cancelled),
        (Observation::DialFailed, DIAL),
        (Observation::TimedOut, Outcome::SoftFailure),
        (Observation::UnexpectedStatus(502), Outcome::SoftFailure),
        (Observation::BodyInterrupted, Outcome::SoftFailure),
        (Observation::MalformedBody, Outcome::SoftFailure),
        (Observation::WrongLength, VALIDATION),
        (Observation::ValidationFailed, VALIDATION),
    ];
    for (observation, outcome) in table {
        assert_eq!(observation.outcome(), outcome, "{observation:?}");
    }
}

/// TestRelayUpstreamRefusalDoesNotBlamePeer; known bug "a relay's origin refusal of the
/// requester's expired signature opened the relay's circuit".
#[test]
fn five_upstream_refusals_leave_the_relay_closed_at_threshold_three() {
    let mut b = breaker(with_threshold(3));
    for i in 0..5 {
        request(&mut b, A, Observation::UpstreamRefused { status: 403 }.outcome(), at(i));
    }
    assert_eq!(b.state(&A, at(5)), CircuitState::Closed);
}

/// TestRelayGenuineFailureStillBlamesPeer: the control.
#[test]
fn three_genuine_relay_failures_open_at_threshold_three() {
    let mut b = breaker(with_threshold(3));
    for i in 0..3 {
        request(&mut b, A, Observation::UnexpectedStatus(500).outcome(), at(i));
    }
    assert_eq!(b.state(&A, at(3)), CircuitState::Open);
}

#[test]
fn interrupted_body_stays_soft_while_a_wrong_length_opens_at_once() {
    let mut b = breaker(seed_config());
    request(&mut b, A, Observation::BodyInterrupted.outcome(), at(0));
    assert_eq!(b.state(&A, at(0)), CircuitState::Closed);
    request(&mut b, A, Observation::ValidationFailed.outcome(), at(1));
    assert_eq!(b.state(&A, at(1)), CircuitState::Open);
}

// ---------------------------------------------------------------------------------------------
// The bounded map

fn peer(i: usize) -> Addr {
    Box::leak(format!("10.1.{}.{}:7070", i / 256, i % 256).into_boxed_str())
}

/// TestBreakerSweepsCleanEntries; known bug "breaker map unbounded".
#[test]
fn clean_entries_are_swept_past_the_cap_and_dirty_ones_kept() {
    let mut b = breaker(with_threshold(2));
    let peers: Vec<Addr> = (0..=TRACKED_PEERS_MAX).map(peer).collect();
    for (i, &p) in peers[..TRACKED_PEERS_MAX].iter().enumerate() {
        let outcome = if i % 512 == 0 { Outcome::SoftFailure } else { Outcome::Answered };
        request(&mut b, p, outcome, at(i as u64));
    }
    assert_eq!(b.tracked(), TRACKED_PEERS_MAX);
    request(&mut b, peers[TRACKED_PEERS_MAX], Outcome::Answered, at(5_000));
    assert_eq!(b.tracked(), 9, "8 dirty entries kept plus the new one");
    assert_eq!(b.counters().swept, TRACKED_PEERS_MAX as u64 - 8);
    assert_eq!(b.counters().evicted, 0);
    // The kept entries still remember their failure: one more opens them.
    request(&mut b, peers[512], Outcome::SoftFailure, at(5_001));
    assert_eq!(b.state(&peers[512], at(5_001)), CircuitState::Open);
}

/// TestBreakerCapHardUnderFailedChurn; known bug #58 "under failed-address churn the sweep
/// freed nothing".
#[test]
fn cap_is_hard_even_when_every_churned_address_carries_failure_state() {
    let cap = 64;
    let mut b = breaker(BreakerConfig { tracked_peers_max: cap, ..with_threshold(3) });
    let mut now = 0;
    for i in 0..cap * 10 {
        let p = peer(i);
        match i % 3 {
            0 => {
                request(&mut b, p, Outcome::SoftFailure, at(now));
            }
            1 => open(&mut b, p, at(now)),
            _ => {
                open(&mut b, p, at(now));
                let probe = admit(&mut b, p, at(now + 5_000));
                drop(probe); // never reported: stays half-open with a probe in flight
            }
        }
        now += 1;
        assert!(b.tracked() <= cap);
        b.check_invariants();
    }
    assert_eq!(b.tracked(), cap);
    assert_eq!(b.counters().swept, 0, "nothing was clean");
    assert!(b.counters().evicted >= (cap * 9) as u64);
    // The most recently touched addresses keep their behaviour.
    let last = |kind: usize| peer((cap * 10 - 3..cap * 10).find(|i| i % 3 == kind).unwrap());
    let (below, open_peer, half_open) = (last(0), last(1), last(2));
    assert_eq!(b.state(&open_peer, at(now)), CircuitState::Open);
    assert_eq!(b.state(&half_open, at(now)), CircuitState::HalfOpen);
    assert_eq!(b.probes_in_flight(), cap / 3, "every kept half-open entry holds its probe");
    request(&mut b, below, Outcome::SoftFailure, at(now));
    request(&mut b, below, Outcome::SoftFailure, at(now));
    assert_eq!(b.state(&below, at(now)), CircuitState::Open, "kept its first failure");
}

/// TestBreakerEvictionDropsStalest: least recently active goes first; observers are not
/// activity.
#[test]
fn eviction_drops_the_least_recently_active_entry_and_observers_do_not_count() {
    let mut b = breaker(BreakerConfig { tracked_peers_max: 3, ..seed_config() });
    for (i, p) in ["a", "b", "c"].into_iter().enumerate() {
        open(&mut b, p, at(i as u64));
    }
    // Scrapes of "a" everywhere; a real request to "b".
    for _ in 0..10 {
        let _ = (b.state(&"a", at(10)), b.healthy(&"a", at(10)), b.open_count(at(10)));
    }
    assert_eq!(b.begin_data(&"b", at(11)), Admission::Rejected);
    drain(&mut b);
    open(&mut b, "d", at(12));
    assert_eq!(b.state(&"a", at(12)), CircuitState::Closed, "a was the stalest");
    assert_eq!(b.state(&"b", at(12)), CircuitState::Open);
    assert_eq!(b.state(&"c", at(12)), CircuitState::Open);
    let evicted = drain(&mut b).into_iter().find(|e| e.reason == TransitionReason::Evicted);
    let evicted = evicted.expect("an eviction event");
    assert_eq!(
        (evicted.addr, evicted.from, evicted.to),
        ("a", CircuitState::Open, CircuitState::Closed)
    );
}

/// TestBreakerEvictionDropsStalest: an actively routed-to sick peer never loses its circuit.
#[test]
fn actively_routed_sick_peer_keeps_its_open_circuit_under_churn() {
    let cap = 16;
    let mut b = breaker(BreakerConfig { tracked_peers_max: cap, ..seed_config() });
    open(&mut b, A, at(0));
    for i in 0..cap * 20 {
        open(&mut b, peer(i), at(1));
        assert_eq!(b.begin_data(&A, at(2)), Admission::Rejected, "still open at churn {i}");
    }
    assert_eq!(b.state(&A, at(2)), CircuitState::Open);
}

#[test]
fn evicted_entry_is_not_recreated_by_its_old_requests() {
    let mut b = breaker(BreakerConfig { tracked_peers_max: 2, ..seed_config() });
    let old = admit(&mut b, "a", at(0));
    let old_roster = b.begin_roster(&"a", at(0));
    open(&mut b, "a", at(1));
    open(&mut b, "b", at(2));
    open(&mut b, "c", at(3)); // evicts "a"
    assert_eq!(b.complete(old, DIAL, at(4)), Disposition::Forgotten);
    assert_eq!(b.complete(old_roster, Outcome::Answered, at(4)), Disposition::Forgotten);
    assert_eq!(b.tracked(), 2);
    assert_eq!(b.state(&"a", at(4)), CircuitState::Closed);
    assert_eq!(b.state(&"b", at(4)), CircuitState::Open, "nothing else was evicted");
    // A fresh request recreates it with a new incarnation, unaffected by old permits.
    let fresh = admit(&mut b, "a", at(5));
    assert_eq!(fresh.kind(), PermitKind::Data);
    b.complete(fresh, Outcome::Answered, at(5));
}

#[test]
fn evicting_a_half_open_entry_drops_its_probe_deadlines() {
    let mut b = breaker(BreakerConfig { tracked_peers_max: 1, ..seed_config() });
    open(&mut b, "a", at(0));
    let probe = admit(&mut b, "a", at(5_000));
    assert!(b.poll_timeout().is_some());
    open(&mut b, "b", at(5_001));
    assert_eq!(b.poll_timeout(), None);
    assert_eq!(b.complete(probe, Outcome::Answered, at(5_002)), Disposition::Forgotten);
    b.check_invariants();
}

#[test]
fn observers_never_create_entries_or_stamp_activity() {
    let mut b = breaker(seed_config());
    for p in ["x", "y", "z"] {
        let _ = (b.state(&p, at(0)), b.healthy(&p, at(0)));
    }
    assert_eq!(b.tracked(), 0);
    assert_eq!(b.open_count(at(0)), 0);
    // And an observer never materialises open → half-open: no event until a request path.
    open(&mut b, A, at(0));
    drain(&mut b);
    assert_eq!(b.state(&A, at(6_000)), CircuitState::HalfOpen);
    assert_eq!(b.poll_event(), None);
    b.check_invariants();
}

/// `healthy` is "a data request would be admitted now", reserving nothing.
#[test]
fn healthy_means_a_request_would_be_admitted_now() {
    let mut b = breaker(BreakerConfig { half_open_probes: 2, ..seed_config() });
    open(&mut b, A, at(0));
    let cases = [at(0), at(4_999), at(5_000)];
    for now in cases {
        assert_eq!(b.healthy(&A, now), b.state(&A, now) == CircuitState::HalfOpen);
    }
    let first = admit(&mut b, A, at(5_000));
    assert!(b.healthy(&A, at(5_000)), "one slot left");
    let second = admit(&mut b, A, at(5_000));
    assert!(!b.healthy(&A, at(5_000)));
    b.complete(first, Outcome::Answered, at(5_001));
    assert!(!b.healthy(&A, at(5_001)), "paused after a success");
    b.complete(second, Outcome::Answered, at(5_002));
    assert!(b.healthy(&A, at(5_002)));
}

// ---------------------------------------------------------------------------------------------
// Backoff

fn cooldowns(events: &[BreakerEvent<Addr>]) -> Vec<Duration> {
    events
        .iter()
        .filter_map(|e| e.reopen_at.map(|until| until.saturating_duration_since(e.at)))
        .collect()
}

/// Opens A, then fails `n` probes in a row, each as soon as the circuit turns half-open.
fn fail_probes(b: &mut Breaker<Addr>, n: usize, mut now: Instant) -> Instant {
    open(b, A, now);
    for _ in 0..n {
        now = until_half_open(b, A, now);
        request(b, A, Outcome::SoftFailure, now);
    }
    now
}

fn until_half_open(b: &Breaker<Addr>, addr: Addr, mut now: Instant) -> Instant {
    while b.state(&addr, now) == CircuitState::Open {
        now += Duration::from_millis(1);
    }
    now
}

#[test]
fn failed_probes_back_off_up_to_the_cap_with_jitter() {
    let mut b = breaker(BreakerConfig { seed: 42, ..BreakerConfig::default() });
    fail_probes(&mut b, 7, at(0));
    let drawn = cooldowns(&drain(&mut b));
    let nominal = [5u64, 10, 20, 40, 60, 60, 60, 60].map(Duration::from_secs);
    assert_eq!(drawn.len(), nominal.len());
    for (d, n) in drawn.iter().zip(nominal) {
        assert!(*d <= n && *d * 2 >= n, "{d:?} outside [{:?}, {n:?}]", n / 2);
    }
    assert!(drawn.windows(2).any(|w| w[0] != w[1]), "jitter varies the draws");
}

#[test]
fn closing_resets_the_backoff() {
    let mut b = breaker(BreakerConfig { seed: 3, ..BreakerConfig::default() });
    let now = fail_probes(&mut b, 4, at(0));
    let now = until_half_open(&b, A, now);
    request(&mut b, A, Outcome::Answered, now);
    drain(&mut b);
    open(&mut b, A, now);
    let drawn = cooldowns(&drain(&mut b));
    assert!(drawn[0] <= DEFAULT_COOLDOWN, "back to the base: {drawn:?}");
}

#[test]
fn fixed_backoff_reproduces_the_seed_cooldown_exactly() {
    let mut b = breaker(seed_config());
    fail_probes(&mut b, 10, at(0));
    let drawn = cooldowns(&drain(&mut b));
    assert_eq!(drawn, vec![DEFAULT_COOLDOWN; 11]);
}

#[test]
fn same_seed_replays_the_same_cooldowns_and_other_seeds_desynchronise() {
    let run = |seed| {
        let mut b = breaker(BreakerConfig { seed, ..BreakerConfig::default() });
        fail_probes(&mut b, 5, at(0));
        cooldowns(&drain(&mut b))
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
    let mut b = Breaker::with_rng(BreakerConfig::default(), crate::rng::from_seed(1)).unwrap();
    fail_probes(&mut b, 5, at(0));
    assert_eq!(cooldowns(&drain(&mut b)), run(1), "with_rng(from_seed(s)) == seed s");
}

// ---------------------------------------------------------------------------------------------
// Counters, events, time

#[test]
fn counters_split_failures_by_reason() {
    let mut b = breaker(with_threshold(100));
    request(&mut b, A, Outcome::SoftFailure, at(0));
    request(&mut b, A, Outcome::SoftFailure, at(1));
    request(&mut b, A, Outcome::Answered, at(2));
    request(&mut b, B, VALIDATION, at(3));
    open(&mut b, "c", at(4));
    request(&mut b, "c", Outcome::SoftFailure, at(5_004)); // failed probe
    let c = b.counters().clone();
    assert_eq!((c.soft, c.hard, c.validation, c.probe_failed), (3, 1, 1, 1));
    assert_eq!((c.answered, c.opened, c.recovered, c.stale), (1, 3, 0, 0));
}

#[test]
fn event_queue_is_bounded_and_drops_are_counted() {
    let mut b = breaker(seed_config());
    for i in 0..EVENTS_MAX + 10 {
        roster(&mut b, A, DIAL, at(i as u64));
        roster(&mut b, A, Outcome::Answered, at(i as u64));
    }
    let events = drain(&mut b);
    assert_eq!(events.len(), EVENTS_MAX);
    assert_eq!(b.counters().events_dropped, (2 * (EVENTS_MAX + 10) - EVENTS_MAX) as u64);
    assert_eq!(events.last().map(|e| e.to), Some(CircuitState::Closed), "newest kept");
}

/// Time may go backwards in a test: never a panic, never a state moved back.
#[test]
fn time_going_backwards_never_panics_or_moves_state_back() {
    let mut b = breaker(seed_config());
    open(&mut b, A, at(10_000));
    assert_eq!(b.state(&A, at(0)), CircuitState::Open);
    let probe = admit(&mut b, A, at(15_000));
    // Back before the opening: still half-open with the probe in flight.
    assert_eq!(b.begin_data(&A, at(1_000)), Admission::Rejected);
    assert_eq!(b.state(&A, at(1_000)), CircuitState::HalfOpen);
    b.handle_timeout(at(0));
    assert_eq!(b.probes_in_flight(), 1);
    assert_eq!(b.complete(probe, Outcome::SoftFailure, at(2_000)), Disposition::Applied);
    assert_eq!(b.state(&A, at(2_000)), CircuitState::Open);
    assert_eq!(b.state(&A, at(7_000)), CircuitState::HalfOpen, "cooldown from the stamp");
    b.check_invariants();
}

/// The sans-IO stand-in for TestBreakerConcurrent: many interleaved permits across peers,
/// completed out of order, keep every invariant (the model test does this exhaustively).
#[test]
fn many_interleaved_permits_keep_the_invariants() {
    use rand::Rng as _;
    let mut rng = crate::rng::from_seed(9);
    let mut b =
        breaker(BreakerConfig { half_open_probes: 2, tracked_peers_max: 8, ..with_threshold(3) });
    let mut permits = Vec::new();
    let mut now = at(0);
    for _ in 0..5_000 {
        now += Duration::from_millis(rng.random_range(0..400));
        let p = peer(rng.random_range(0..12));
        let choice = rng.random_range(0..4u8);
        if choice == 0 {
            permits.push(b.begin_roster(&p, now));
        } else if choice < 3 {
            permits.extend(b.begin_data(&p, now).permit());
        } else if permits.is_empty() {
            b.handle_timeout(now);
        } else {
            let permit = permits.swap_remove(rng.random_range(0..permits.len()));
            let outcome = [Outcome::Answered, Outcome::SoftFailure, DIAL, Outcome::Abandoned]
                [rng.random_range(0..4)];
            let _ = b.complete(permit, outcome, now);
        }
        b.check_invariants();
    }
}

// ---------------------------------------------------------------------------------------------
// Canonical traces (insta)

/// Records inputs and the events they caused, one line each.
struct Trace {
    b: Breaker<Addr>,
    out: String,
}

impl Trace {
    fn new(config: BreakerConfig) -> Self {
        Trace { b: breaker(config), out: String::new() }
    }

    fn data(&mut self, now: Instant, outcome: Outcome) {
        match self.b.begin_data(&A, now) {
            Admission::Rejected => self.line(now, "begin_data -> rejected"),
            Admission::Admitted(permit) => {
                let what = format!("begin_data -> {:?} gen {}", permit.kind(), permit.generation());
                self.line(now, &what);
                let disposition = self.b.complete(permit, outcome, now);
                self.line(now, &format!("complete {outcome:?} -> {disposition:?}"));
            }
        }
        self.events();
    }

    fn line(&mut self, now: Instant, what: &str) {
        writeln!(self.out, "{:>9} {what}", now.to_string()).unwrap();
    }

    fn events(&mut self) {
        while let Some(event) = self.b.poll_event() {
            writeln!(self.out, "          event {event}").unwrap();
        }
        self.b.check_invariants();
    }
}

/// A peer dies: one dial failure opens it, requests are rejected without dials, probes fail
/// with a growing cooldown, and once it is back the next probe closes it. Requests arrive every
/// 2 s; the trace ends two requests after recovery.
#[test]
fn trace_of_a_dead_peer_recovering() {
    let mut t = Trace::new(BreakerConfig { seed: 7, ..BreakerConfig::default() });
    let back_at = at(30_000);
    let mut after_recovery = 0;
    for step in 0..100 {
        let now = at(step * 2_000);
        let outcome = if now < back_at { DIAL } else { Outcome::Answered };
        t.data(now, outcome);
        if t.b.state(&A, now) == CircuitState::Closed && now >= back_at {
            after_recovery += 1;
        }
        if after_recovery == 3 {
            break;
        }
    }
    assert_eq!(after_recovery, 3, "recovered within the trace");
    insta::assert_snapshot!("dead_peer_recovering", t.out);
}

/// A peer that answers the probe's dial and then fails again, over and over: the cooldown grows
/// to its cap with jitter; one clean recovery resets it. A request every second.
#[test]
fn trace_of_a_flapping_peer_backing_off() {
    let mut t = Trace::new(BreakerConfig { seed: 11, ..BreakerConfig::default() });
    let mut now = at(0);
    t.data(now, Outcome::HardFailure(HardReason::Validation));
    let end = at(240_000);
    while now < end {
        now += Duration::from_secs(1);
        if !t.b.healthy(&A, now) {
            continue; // routed elsewhere: not even traced
        }
        let recovered = now >= at(200_000);
        let probe_outcome = if recovered { Outcome::Answered } else { Outcome::SoftFailure };
        t.data(now, probe_outcome);
        if recovered && t.b.state(&A, now) == CircuitState::Closed {
            break;
        }
    }
    // Flaps once more after recovering: back to the base cooldown.
    now += Duration::from_secs(1);
    t.data(now, VALIDATION);
    insta::assert_snapshot!("flapping_peer_backing_off", t.out);
}
