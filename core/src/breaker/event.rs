//! What the breaker reports outward: circuit states, transition events and counters.

use std::fmt;

use super::permit::HardReason;
use crate::time::Instant;

/// A peer's circuit as routing sees it. Prints `closed`, `open` or `half-open`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CircuitState {
    /// Requests pass; consecutive soft failures are counted.
    Closed,
    /// Requests are rejected until the cooldown elapses.
    Open,
    /// A limited number of probes test recovery.
    HalfOpen,
}

impl fmt::Display for CircuitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half-open",
        })
    }
}

/// Why a circuit changed state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TransitionReason {
    /// Closed → open: `failure_threshold` consecutive soft failures.
    FailureThreshold,
    /// Closed → open at once on a definitive failure.
    HardFailure(HardReason),
    /// Open → half-open: the cooldown elapsed (observed by a request path).
    CooldownElapsed,
    /// Half-open → closed: every admitted probe that reported succeeded.
    ProbesSucceeded,
    /// Half-open → open: a data probe failed.
    ProbeFailed,
    /// Half-open → open: a probe passed its deadline unreported and was reclaimed.
    ProbeExpired,
    /// Open or half-open → closed: a current-generation roster fetch succeeded with no data
    /// probe outstanding.
    RosterAnswered,
    /// Half-open → open: a current-generation roster fetch failed with no data probe outstanding.
    RosterFailed,
    /// A dirty entry was evicted at the cap; the peer is forgotten, i.e. closed.
    Evicted,
}

impl fmt::Display for TransitionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransitionReason::FailureThreshold => f.write_str("failure threshold"),
            TransitionReason::HardFailure(reason) => write!(f, "hard failure: {reason}"),
            TransitionReason::CooldownElapsed => f.write_str("cooldown elapsed"),
            TransitionReason::ProbesSucceeded => f.write_str("probes succeeded"),
            TransitionReason::ProbeFailed => f.write_str("probe failed"),
            TransitionReason::ProbeExpired => f.write_str("probe expired"),
            TransitionReason::RosterAnswered => f.write_str("roster answered"),
            TransitionReason::RosterFailed => f.write_str("roster failed"),
            TransitionReason::Evicted => f.write_str("evicted"),
        }
    }
}

/// One state transition of one peer's circuit, for metrics and traces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerEvent<K> {
    /// When the transition happened (the `now` of the input that caused it).
    pub at: Instant,
    /// The peer.
    pub addr: K,
    /// State before.
    pub from: CircuitState,
    /// State after.
    pub to: CircuitState,
    /// Why.
    pub reason: TransitionReason,
    /// The entry's generation after the transition (for an eviction, the evicted entry's last).
    pub generation: u64,
    /// When an opened circuit turns half-open; `Some` exactly when `to` is open.
    pub reopen_at: Option<Instant>,
}

/// One line, stable across runs: `5.000s peer-a closed -> open (hard failure: dial) gen 1 until
/// 9.132s`.
impl<K: fmt::Display> fmt::Display for BreakerEvent<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} -> {} ({}) gen {}",
            self.at, self.addr, self.from, self.to, self.reason, self.generation
        )?;
        match self.reopen_at {
            Some(until) => write!(f, " until {until}"),
            None => Ok(()),
        }
    }
}

/// Monotonic counters for metrics. Outcome counters count applied (current-generation) reports
/// only; a failure is counted under exactly one of `soft`, `hard` and `validation`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BreakerCounters {
    /// Answered reports (200, 404, upstream-credential refusal).
    pub answered: u64,
    /// Caller-cancelled reports (recorded as answered).
    pub cancelled: u64,
    /// Soft failures, including probes reclaimed at their deadline.
    pub soft: u64,
    /// Hard failures of reason [`HardReason::Dial`].
    pub hard: u64,
    /// Hard failures of reason [`HardReason::Validation`].
    pub validation: u64,
    /// Abandoned permits.
    pub abandoned: u64,
    /// Failed recovery checks: half-open → open transitions of any reason.
    pub probe_failed: u64,
    /// Probes reclaimed at their deadline (also counted in `probe_failed` and `soft`).
    pub probe_expired: u64,
    /// Reports ignored because their generation or entry was gone.
    pub stale: u64,
    /// Data requests rejected by an open circuit.
    pub rejected: u64,
    /// Transitions to open.
    pub opened: u64,
    /// Transitions to closed by recovery.
    pub recovered: u64,
    /// Clean entries swept at the cap.
    pub swept: u64,
    /// Dirty entries evicted at the cap.
    pub evicted: u64,
    /// Events dropped because the caller did not drain them ([`super::EVENTS_MAX`]).
    pub events_dropped: u64,
}
