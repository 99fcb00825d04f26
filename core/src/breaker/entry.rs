//! One peer's circuit: the states, and what each report does to them.
//!
//! An entry knows nothing of maps, indexes or events: each input returns a [`Change`] that the
//! breaker mirrors into its deadline index, counters and event queue.

use std::mem;

use super::config::BackoffPolicy;
use super::event::{CircuitState, TransitionReason};
use super::permit::{Outcome, PermitKind};
use crate::rng::Rng;
use crate::time::Instant;

/// A half-open probe in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Probe {
    /// The probe permit's id.
    pub(super) id: u64,
    /// When it is reclaimed as a soft failure if still unreported.
    pub(super) deadline: Instant,
}

/// A circuit's state and the data only that state has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Circuit {
    /// Passing requests; `failures < failure_threshold` consecutive soft failures so far.
    Closed { failures: u32 },
    /// Rejecting requests. `opened_at` is stamped only by closed → open and half-open → open,
    /// never by a late failure; the circuit turns half-open at `until`.
    Open { opened_at: Instant, until: Instant },
    /// Testing recovery: `probes` in flight and `succeeded` probes that answered. Admission
    /// pauses once one has succeeded; the circuit closes when none is left in flight.
    HalfOpen { probes: Vec<Probe>, succeeded: u32 },
}

/// A state change, before the breaker adds the peer's address to make it an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Transition {
    pub(super) from: CircuitState,
    pub(super) to: CircuitState,
    pub(super) reason: TransitionReason,
    pub(super) generation: u64,
    pub(super) reopen_at: Option<Instant>,
}

/// What one applied input did: a transition, if any, and the probes whose deadlines must go.
#[derive(Debug, Default)]
pub(super) struct Change {
    pub(super) transition: Option<Transition>,
    pub(super) released: Vec<Probe>,
}

/// Settings and randomness a transition may need.
pub(super) struct Ctx<'a> {
    pub(super) threshold: u32,
    pub(super) backoff: BackoffPolicy,
    pub(super) rng: &'a mut Rng,
    pub(super) now: Instant,
}

/// What a report decides, computed while the state's fields are borrowed and applied after.
enum Verdict {
    Stay,
    Open(TransitionReason),
    Close(TransitionReason),
    Superseded,
}

/// One tracked peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    /// Breaker-unique id of this entry; an evicted-and-recreated peer gets a new one.
    pub(super) incarnation: u64,
    /// Bumped by every transition except open → half-open; results of older generations are
    /// ignored.
    pub(super) generation: u64,
    pub(super) circuit: Circuit,
    /// Consecutive failed recovery checks since the circuit last closed: the backoff exponent.
    pub(super) failed_checks: u32,
    /// Activity tick of the last request path that touched this entry (LRU key).
    pub(super) last_active: u64,
}

impl Entry {
    /// A fresh, closed, information-free entry.
    pub(super) fn new(incarnation: u64, tick: u64) -> Self {
        Entry {
            incarnation,
            generation: 0,
            circuit: Circuit::Closed { failures: 0 },
            failed_checks: 0,
            last_active: tick,
        }
    }

    /// The state as observed at `now`: an open circuit whose cooldown has elapsed is half-open
    /// even before a request path materialises it.
    pub(super) fn state(&self, now: Instant) -> CircuitState {
        match self.circuit {
            Circuit::Closed { .. } => CircuitState::Closed,
            Circuit::Open { until, .. } if now >= until => CircuitState::HalfOpen,
            Circuit::Open { .. } => CircuitState::Open,
            Circuit::HalfOpen { .. } => CircuitState::HalfOpen,
        }
    }

    /// Behaviourally identical to an untracked peer: closed with no failures.
    pub(super) fn is_clean(&self) -> bool {
        match self.circuit {
            Circuit::Closed { failures } => failures == 0,
            Circuit::Open { .. } | Circuit::HalfOpen { .. } => false,
        }
    }

    /// Whether a data request at `now` would be admitted, without reserving anything.
    pub(super) fn would_admit(&self, now: Instant, probe_limit: u32) -> bool {
        match &self.circuit {
            Circuit::Closed { .. } => true,
            Circuit::Open { until, .. } => now >= *until,
            Circuit::HalfOpen { probes, succeeded } => {
                *succeeded == 0 && probes.len() < probe_limit as usize
            }
        }
    }

    /// The probes in flight.
    pub(super) fn probes(&self) -> &[Probe] {
        match &self.circuit {
            Circuit::HalfOpen { probes, .. } => probes,
            Circuit::Closed { .. } | Circuit::Open { .. } => &[],
        }
    }

    /// Applies a due open → half-open transition (request paths only; it never bumps the
    /// generation, so rosters begun while open stay current).
    pub(super) fn materialize(&mut self, now: Instant) -> Option<Transition> {
        match self.circuit {
            Circuit::Open { until, .. } if now >= until => {
                self.circuit = Circuit::HalfOpen { probes: Vec::new(), succeeded: 0 };
                Some(Transition {
                    from: CircuitState::Open,
                    to: CircuitState::HalfOpen,
                    reason: TransitionReason::CooldownElapsed,
                    generation: self.generation,
                    reopen_at: None,
                })
            }
            Circuit::Open { .. } | Circuit::Closed { .. } | Circuit::HalfOpen { .. } => None,
        }
    }

    /// Reserves a probe slot if half-open admission allows it; `Some(kind)` admits.
    pub(super) fn admit(&mut self, probe: Probe, probe_limit: u32) -> Option<PermitKind> {
        match &mut self.circuit {
            Circuit::Closed { .. } => Some(PermitKind::Data),
            Circuit::Open { .. } => None,
            Circuit::HalfOpen { probes, succeeded } => {
                if *succeeded > 0 || probes.len() >= probe_limit as usize {
                    return None;
                }
                debug_assert!(probes.iter().all(|p| p.id != probe.id));
                probes.push(probe);
                Some(PermitKind::Probe)
            }
        }
    }

    /// Applies a current-generation report; `None` when the permit is superseded.
    pub(super) fn record(
        &mut self,
        generation: u64,
        kind: PermitKind,
        id: u64,
        outcome: Outcome,
        ctx: &mut Ctx<'_>,
    ) -> Option<Change> {
        if generation != self.generation {
            return None;
        }
        let mut released = Vec::new();
        let verdict = match (&mut self.circuit, kind) {
            (Circuit::Closed { failures }, PermitKind::Data | PermitKind::Roster) => {
                closed_verdict(failures, outcome, ctx.threshold)
            }
            (Circuit::Open { .. }, PermitKind::Roster) => open_roster_verdict(outcome),
            (Circuit::HalfOpen { probes, succeeded }, PermitKind::Probe) => {
                probe_verdict(probes, succeeded, id, outcome, &mut released)
            }
            (Circuit::HalfOpen { probes, .. }, PermitKind::Roster) => {
                half_open_roster_verdict(probes, outcome)
            }
            // No current-generation permit has these: data permits come only from closed and
            // probes only from half-open, and leaving either bumps the generation. Only a permit
            // from another breaker gets here; it is ignored like any stale one.
            (Circuit::Closed { .. }, PermitKind::Probe | PermitKind::Untracked)
            | (
                Circuit::Open { .. },
                PermitKind::Data | PermitKind::Probe | PermitKind::Untracked,
            )
            | (Circuit::HalfOpen { .. }, PermitKind::Data | PermitKind::Untracked) => {
                Verdict::Superseded
            }
        };
        let mut change = match verdict {
            Verdict::Stay => Change::default(),
            Verdict::Open(reason) => self.open(reason, ctx),
            Verdict::Close(reason) => self.close(reason),
            Verdict::Superseded => return None,
        };
        change.released.append(&mut released);
        Some(change)
    }

    /// Reclaims probe `id` past its deadline as a soft failure, reopening the circuit. `None`
    /// when no such probe is in flight.
    pub(super) fn expire_probe(&mut self, id: u64, ctx: &mut Ctx<'_>) -> Option<Change> {
        let probe = match &mut self.circuit {
            Circuit::HalfOpen { probes, .. } => {
                let at = probes.iter().position(|p| p.id == id)?;
                probes.swap_remove(at)
            }
            Circuit::Closed { .. } | Circuit::Open { .. } => return None,
        };
        debug_assert!(probe.deadline <= ctx.now);
        let mut change = self.open(TransitionReason::ProbeExpired, ctx);
        change.released.push(probe);
        Some(change)
    }

    /// Closed or half-open → open: stamps the cooldown and bumps the generation. From half-open
    /// it is a failed recovery check, which grows the backoff.
    fn open(&mut self, reason: TransitionReason, ctx: &mut Ctx<'_>) -> Change {
        let from = self.state(ctx.now);
        let released = match &mut self.circuit {
            Circuit::Closed { .. } => Vec::new(),
            Circuit::HalfOpen { probes, .. } => {
                self.failed_checks = self.failed_checks.saturating_add(1);
                mem::take(probes)
            }
            Circuit::Open { .. } => unreachable!("an open circuit is never opened again"),
        };
        let cooldown = ctx.backoff.cooldown(self.failed_checks, ctx.rng);
        debug_assert!(!cooldown.is_zero() && cooldown <= ctx.backoff.max_cooldown());
        let until = ctx.now + cooldown;
        self.circuit = Circuit::Open { opened_at: ctx.now, until };
        self.generation += 1;
        let transition = Transition {
            from,
            to: CircuitState::Open,
            reason,
            generation: self.generation,
            reopen_at: Some(until),
        };
        Change { transition: Some(transition), released }
    }

    /// Open or half-open → closed: recovery. Resets the backoff and bumps the generation.
    fn close(&mut self, reason: TransitionReason) -> Change {
        let (from, released) = match &mut self.circuit {
            Circuit::Open { .. } => (CircuitState::Open, Vec::new()),
            Circuit::HalfOpen { probes, .. } => (CircuitState::HalfOpen, mem::take(probes)),
            Circuit::Closed { .. } => unreachable!("a closed circuit is never closed again"),
        };
        self.circuit = Circuit::Closed { failures: 0 };
        self.failed_checks = 0;
        self.generation += 1;
        let transition = Transition {
            from,
            to: CircuitState::Closed,
            reason,
            generation: self.generation,
            reopen_at: None,
        };
        Change { transition: Some(transition), released }
    }
}

fn closed_verdict(failures: &mut u32, outcome: Outcome, threshold: u32) -> Verdict {
    debug_assert!(*failures < threshold);
    match outcome {
        Outcome::Answered | Outcome::Cancelled => {
            *failures = 0;
            Verdict::Stay
        }
        Outcome::SoftFailure => {
            *failures += 1;
            if *failures >= threshold {
                Verdict::Open(TransitionReason::FailureThreshold)
            } else {
                Verdict::Stay
            }
        }
        Outcome::HardFailure(reason) => Verdict::Open(TransitionReason::HardFailure(reason)),
        Outcome::Abandoned => Verdict::Stay,
    }
}

/// A current-generation roster report while open: a success proves the peer back; a failure
/// is late news about an already open circuit and must not restamp its cooldown.
fn open_roster_verdict(outcome: Outcome) -> Verdict {
    match outcome {
        Outcome::Answered | Outcome::Cancelled => Verdict::Close(TransitionReason::RosterAnswered),
        Outcome::SoftFailure | Outcome::HardFailure(_) | Outcome::Abandoned => Verdict::Stay,
    }
}

fn probe_verdict(
    probes: &mut Vec<Probe>,
    succeeded: &mut u32,
    id: u64,
    outcome: Outcome,
    released: &mut Vec<Probe>,
) -> Verdict {
    let Some(at) = probes.iter().position(|p| p.id == id) else {
        return Verdict::Superseded;
    };
    released.push(probes.swap_remove(at));
    match outcome {
        Outcome::Answered | Outcome::Cancelled => {
            *succeeded += 1;
            if probes.is_empty() {
                Verdict::Close(TransitionReason::ProbesSucceeded)
            } else {
                Verdict::Stay
            }
        }
        Outcome::SoftFailure | Outcome::HardFailure(_) => {
            Verdict::Open(TransitionReason::ProbeFailed)
        }
        // The slot goes back; earlier successes still close once nobody else is in flight.
        Outcome::Abandoned => {
            if probes.is_empty() && *succeeded > 0 {
                Verdict::Close(TransitionReason::ProbesSucceeded)
            } else {
                Verdict::Stay
            }
        }
    }
}

/// A roster report while half-open decides recovery only when no data probe is in flight: it
/// never takes a probe's slot nor pre-empts a probe's pending outcome.
fn half_open_roster_verdict(probes: &[Probe], outcome: Outcome) -> Verdict {
    if !probes.is_empty() {
        return Verdict::Stay;
    }
    match outcome {
        Outcome::Answered | Outcome::Cancelled => Verdict::Close(TransitionReason::RosterAnswered),
        Outcome::SoftFailure | Outcome::HardFailure(_) => {
            Verdict::Open(TransitionReason::RosterFailed)
        }
        Outcome::Abandoned => Verdict::Stay,
    }
}
