//! Monotonic time as the core sees it: a value handed in by the caller, never read from a clock.
//!
//! `Instant` is a newtype over nanoseconds since an arbitrary origin chosen by the driver (the
//! simulator starts at zero; the tokio shell maps its own clock onto an origin taken at start-up).
//! We chose a newtype over `std::time::Instant` because the core must print times in traces that
//! are byte-identical across runs of one seed, must be constructible at any value in tests
//! (including "earlier than before"), and must never be able to reach the wall clock.

use std::fmt;
use std::ops::{Add, AddAssign};
use std::time::Duration;

/// A point on the driver's monotonic clock, in nanoseconds since the driver's origin.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The driver's origin.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant; used as "never" by timer tables.
    pub const MAX: Instant = Instant(u64::MAX);

    /// An instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// An instant `millis` milliseconds after the origin (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Instant(millis.saturating_mul(1_000_000))
    }

    /// An instant `secs` seconds after the origin (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Instant(secs.saturating_mul(1_000_000_000))
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero when `earlier` is later (time may go backwards
    /// in a test; that must never panic).
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, saturating at [`Instant::MAX`].
    pub fn saturating_add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        self.saturating_add(d)
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, d: Duration) {
        *self = self.saturating_add(d);
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Prints seconds with millisecond precision followed by `s`, e.g. `12.345s`: stable across runs.
impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0 / 1_000_000;
        write!(f, "{}.{:03}s", millis / 1000, millis % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_now_saturates_to_zero_instead_of_panicking() {
        let a = Instant::from_secs(5);
        let b = Instant::from_secs(3);
        assert_eq!(b.saturating_duration_since(a), Duration::ZERO);
        assert_eq!(a.saturating_duration_since(b), Duration::from_secs(2));
    }

    #[test]
    fn addition_saturates_at_max() {
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO + Duration::MAX, Instant::MAX);
    }

    #[test]
    fn display_is_stable_milliseconds() {
        assert_eq!(Instant::from_nanos(12_345_678_901).to_string(), "12.345s");
        assert_eq!(Instant::ZERO.to_string(), "0.000s");
    }
}
