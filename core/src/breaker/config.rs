//! Breaker configuration, its limits and the cooldown (backoff) policy.

use std::time::Duration;

use rand::Rng as _;
use thiserror::Error;

use crate::rng::Rng;

/// Consecutive soft failures that open a closed circuit (peer.md `DefaultFailureThreshold`).
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;
/// First cooldown after opening (peer.md `DefaultBreakerCooldown`).
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(5);
/// Largest cooldown repeated failed probes can grow to under the default backoff.
pub const DEFAULT_COOLDOWN_CAP: Duration = Duration::from_secs(60);
/// Probes a half-open circuit admits (peer.md `DefaultHalfOpenProbes`).
pub const DEFAULT_HALF_OPEN_PROBES: u32 = 1;
/// How long a probe may stay unreported before it is reclaimed as a soft failure. Longer than the
/// transport's 30 s request bound, so a probe the shell is still timing out itself is never
/// reclaimed first: the deadline only catches permits that never come back at all.
pub const DEFAULT_PROBE_DEADLINE: Duration = Duration::from_secs(45);

/// Hard bound on tracked peers (peer.md §3.5): the map never holds more entries than this.
pub const TRACKED_PEERS_MAX: usize = 4096;
/// Upper bound on `half_open_probes`, so probes in flight are bounded by
/// `TRACKED_PEERS_MAX * HALF_OPEN_PROBES_MAX`.
pub const HALF_OPEN_PROBES_MAX: u32 = 64;
/// Upper bound on any configured cooldown, base or cap: beyond an hour a circuit is simply
/// forgotten, and the bound keeps every cooldown representable in nanoseconds.
pub const COOLDOWN_MAX: Duration = Duration::from_secs(3600);
/// Upper bound on the probe deadline.
pub const PROBE_DEADLINE_MAX: Duration = Duration::from_secs(3600);
/// Transition events kept for [`super::Breaker::poll_event`]; past it the oldest are dropped and
/// counted in [`super::BreakerCounters::events_dropped`].
pub const EVENTS_MAX: usize = 1024;

/// How long a circuit stays open before it turns half-open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackoffPolicy {
    /// Every opening waits exactly `cooldown`; draws no randomness. `Fixed { cooldown:
    /// DEFAULT_COOLDOWN }` reproduces peer.md's fixed 5 s cooldown exactly.
    Fixed {
        /// The one cooldown.
        cooldown: Duration,
    },
    /// After `n` consecutive failed recovery checks (0 when opening from closed) the nominal
    /// cooldown is `min(cap, base * 2^n)` and the cooldown drawn is uniform in
    /// `[nominal / 2, nominal]` nanoseconds ("equal jitter"), so a fleet that saw one peer die
    /// does not re-probe it in lockstep and no cooldown ever exceeds `cap`. Closing resets `n`.
    Exponential {
        /// Nominal cooldown of the first opening.
        base: Duration,
        /// Largest nominal cooldown.
        cap: Duration,
    },
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy::Exponential { base: DEFAULT_COOLDOWN, cap: DEFAULT_COOLDOWN_CAP }
    }
}

impl BackoffPolicy {
    /// The cooldown after `failed_checks` consecutive failed recovery checks, drawing jitter from
    /// `rng` (the fixed policy draws nothing).
    pub(super) fn cooldown(&self, failed_checks: u32, rng: &mut Rng) -> Duration {
        match *self {
            BackoffPolicy::Fixed { cooldown } => cooldown,
            BackoffPolicy::Exponential { base, cap } => {
                let nominal = nominal_cooldown(base, cap, failed_checks);
                let hi = duration_nanos(nominal);
                let lo = hi.div_ceil(2);
                let drawn = Duration::from_nanos(rng.random_range(lo..=hi));
                debug_assert!(drawn <= cap && drawn * 2 >= nominal);
                drawn
            }
        }
    }

    /// The longest cooldown this policy can produce.
    pub fn max_cooldown(&self) -> Duration {
        match *self {
            BackoffPolicy::Fixed { cooldown } => cooldown,
            BackoffPolicy::Exponential { cap, .. } => cap,
        }
    }
}

/// `min(cap, base * 2^n)` without overflow.
fn nominal_cooldown(base: Duration, cap: Duration, n: u32) -> Duration {
    let factor = 1u32.checked_shl(n).unwrap_or(u32::MAX);
    base.checked_mul(factor).map_or(cap, |d| d.min(cap))
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Breaker settings. `BreakerConfig::default()` is peer.md's defaults plus the jittered backoff;
/// set `backoff` to [`BackoffPolicy::Fixed`] with [`DEFAULT_COOLDOWN`] for the seed's exact
/// behaviour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive soft failures that open a closed circuit. Zero disables the breaker:
    /// everything is admitted and nothing is recorded (the node's `--breaker-failures 0`).
    pub failure_threshold: u32,
    /// Probes a half-open circuit admits, `1..=HALF_OPEN_PROBES_MAX`.
    pub half_open_probes: u32,
    /// Cooldown policy for open circuits.
    pub backoff: BackoffPolicy,
    /// How long an admitted probe may stay unreported before it is reclaimed as a soft failure.
    pub probe_deadline: Duration,
    /// Cap on tracked peers, `1..=TRACKED_PEERS_MAX` (tests shrink it to exercise churn).
    pub tracked_peers_max: usize,
    /// Seed of the jitter RNG.
    pub seed: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            half_open_probes: DEFAULT_HALF_OPEN_PROBES,
            backoff: BackoffPolicy::default(),
            probe_deadline: DEFAULT_PROBE_DEADLINE,
            tracked_peers_max: TRACKED_PEERS_MAX,
            seed: 0,
        }
    }
}

/// Why a breaker configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BreakerConfigError {
    /// `half_open_probes` was zero or above [`HALF_OPEN_PROBES_MAX`].
    #[error("half-open probes must be in 1..={HALF_OPEN_PROBES_MAX}, got {0}")]
    HalfOpenProbes(u32),
    /// A cooldown (fixed, base or cap) was zero.
    #[error("cooldown must be greater than zero")]
    ZeroCooldown,
    /// A cooldown exceeded [`COOLDOWN_MAX`].
    #[error("cooldown {0:?} exceeds the maximum of {COOLDOWN_MAX:?}")]
    CooldownTooLong(Duration),
    /// The exponential backoff's cap was below its base.
    #[error("cooldown cap {cap:?} is below the base cooldown {base:?}")]
    CapBelowBase {
        /// Configured base cooldown.
        base: Duration,
        /// Configured cap.
        cap: Duration,
    },
    /// The probe deadline was zero or above [`PROBE_DEADLINE_MAX`].
    #[error("probe deadline must be in (0, {PROBE_DEADLINE_MAX:?}], got {0:?}")]
    ProbeDeadline(Duration),
    /// `tracked_peers_max` was zero or above [`TRACKED_PEERS_MAX`].
    #[error("tracked peers must be in 1..={TRACKED_PEERS_MAX}, got {0}")]
    TrackedPeers(usize),
}

impl BreakerConfig {
    /// Checks every field against its limit.
    pub fn validate(&self) -> Result<(), BreakerConfigError> {
        if self.half_open_probes == 0 || self.half_open_probes > HALF_OPEN_PROBES_MAX {
            return Err(BreakerConfigError::HalfOpenProbes(self.half_open_probes));
        }
        match self.backoff {
            BackoffPolicy::Fixed { cooldown } => check_cooldown(cooldown)?,
            BackoffPolicy::Exponential { base, cap } => {
                check_cooldown(base)?;
                check_cooldown(cap)?;
                if cap < base {
                    return Err(BreakerConfigError::CapBelowBase { base, cap });
                }
            }
        }
        if self.probe_deadline.is_zero() || self.probe_deadline > PROBE_DEADLINE_MAX {
            return Err(BreakerConfigError::ProbeDeadline(self.probe_deadline));
        }
        if self.tracked_peers_max == 0 || self.tracked_peers_max > TRACKED_PEERS_MAX {
            return Err(BreakerConfigError::TrackedPeers(self.tracked_peers_max));
        }
        Ok(())
    }

    /// Whether the breaker is on (`failure_threshold > 0`).
    pub fn enabled(&self) -> bool {
        self.failure_threshold > 0
    }
}

fn check_cooldown(d: Duration) -> Result<(), BreakerConfigError> {
    if d.is_zero() {
        return Err(BreakerConfigError::ZeroCooldown);
    }
    if d > COOLDOWN_MAX {
        return Err(BreakerConfigError::CooldownTooLong(d));
    }
    Ok(())
}
