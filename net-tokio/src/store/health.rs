//! Disk health: the degraded-mode state machine of the disk tiers and the report it gives.
//!
//! The machine reads no clock and does no I/O: the tiers feed it what happened (a write or read
//! failed, the arena files were found unlinked, a write succeeded) with the time, and ask it
//! before each disk write whether to write ([`Health::gate`]).
//!
//! - `Healthy`: every write goes ahead. Once per [`PROBE_INTERVAL`] a write is preceded by a
//!   check that the arena file is still linked (a deleted cache directory fails no write: the
//!   open files live on, unlinked, holding space nobody can see).
//! - `Degraded`: writes are skipped, except one probe at most every [`PROBE_INTERVAL`]. The
//!   probe's success ends degraded mode. The deadline is a field, looked at when a put asks: no
//!   thread, no timer task, no loop.
//!
//! A write that started before the store degraded cannot end degraded mode by succeeding late:
//! each degraded episode has a generation, and only a write gated inside it (the probe) counts.

use std::fmt;
use std::io;
use std::time::{Duration, Instant, SystemTime};

/// How long a degraded store waits between probe writes, and a healthy one between checks that
/// its files are still linked.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(30);

/// Why the disk tiers are degraded; the `Display` form is what `/healthz` shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DegradedReason {
    /// A write failed with `ENOSPC`.
    NoSpace,
    /// A write failed with `EROFS`.
    ReadOnly,
    /// A write failed with `EACCES` or `EPERM`.
    PermissionDenied,
    /// A write failed with `EDQUOT`.
    QuotaExceeded,
    /// An arena file has no name left (the cache directory or the file was deleted).
    FilesRemoved,
    /// A write failed otherwise (`EIO`, a short write, ...); the error's text.
    WriteError(String),
    /// A read failed; the error's text.
    ReadError(String),
}

impl DegradedReason {
    /// The reason a failed write gives.
    pub fn of_write(e: &io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::StorageFull => DegradedReason::NoSpace,
            io::ErrorKind::ReadOnlyFilesystem => DegradedReason::ReadOnly,
            io::ErrorKind::PermissionDenied => DegradedReason::PermissionDenied,
            io::ErrorKind::QuotaExceeded => DegradedReason::QuotaExceeded,
            _ => DegradedReason::WriteError(e.to_string()),
        }
    }

    /// The reason a failed read gives.
    pub fn of_read(e: &io::Error) -> Self {
        DegradedReason::ReadError(e.to_string())
    }
}

impl fmt::Display for DegradedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DegradedReason::NoSpace => f.write_str("no space left on device"),
            DegradedReason::ReadOnly => f.write_str("read-only file system"),
            DegradedReason::PermissionDenied => f.write_str("permission denied"),
            DegradedReason::QuotaExceeded => f.write_str("disk quota exceeded"),
            DegradedReason::FilesRemoved => {
                f.write_str("files removed (cache directory deleted?); restart to recreate")
            }
            DegradedReason::WriteError(e) => write!(f, "io error: {e}"),
            DegradedReason::ReadError(e) => write!(f, "read error: {e}"),
        }
    }
}

/// Whether the disk tiers are taking writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum HealthState {
    /// Writes go to disk.
    #[default]
    Healthy,
    /// Disk writes are skipped (bar one probe per [`PROBE_INTERVAL`]); RAM and readable disk
    /// blocks are still served.
    Degraded {
        /// The latest failure.
        reason: DegradedReason,
        /// When this degraded episode began (wall clock, for people).
        since: SystemTime,
    },
}

/// The disk tiers' health and their I/O failure counts since open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreHealth {
    /// Healthy or degraded.
    pub state: HealthState,
    /// Disk writes that failed.
    pub write_failures: u64,
    /// Disk reads that failed (each a miss that dropped its slot).
    pub read_failures: u64,
}

impl StoreHealth {
    /// Whether the store is degraded.
    pub fn is_degraded(&self) -> bool {
        matches!(self.state, HealthState::Degraded { .. })
    }
}

/// Permission for one disk write, from [`Health::gate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    generation: u64,
}

/// What [`Health::gate`] says about a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Write.
    Write(Ticket),
    /// Check that the arena file is still linked; write if it is, else report
    /// [`Health::files_removed`].
    CheckThenWrite(Ticket),
    /// Do not touch the disk: degraded, and the next probe is not due.
    Skip,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Healthy {
        /// When the next write first checks that the files are linked.
        check_at: Instant,
    },
    Degraded {
        reason: DegradedReason,
        since: SystemTime,
        /// When the next probe write may go.
        retry_at: Instant,
    },
}

/// The degraded-mode machine (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Health {
    state: State,
    /// Bumped on every entry into `Degraded`; tickets carry the value they were issued under.
    generation: u64,
    write_failures: u64,
    read_failures: u64,
}

/// `now + PROBE_INTERVAL`, or `now` in the (theoretical) case the clock cannot go that far.
fn after_interval(now: Instant) -> Instant {
    now.checked_add(PROBE_INTERVAL).unwrap_or(now)
}

impl Health {
    /// A healthy disk whose first link check is one interval after `now`.
    pub(crate) fn new(now: Instant) -> Self {
        Health {
            state: State::Healthy { check_at: after_interval(now) },
            generation: 0,
            write_failures: 0,
            read_failures: 0,
        }
    }

    /// Whether a disk write may go now. A probe or a link check moves its deadline one interval
    /// on, so concurrent puts do not all probe; an earlier `now` only ever says skip or write.
    pub(crate) fn gate(&mut self, now: Instant) -> Gate {
        let ticket = Ticket { generation: self.generation };
        match &mut self.state {
            State::Healthy { check_at } if now >= *check_at => {
                *check_at = after_interval(now);
                Gate::CheckThenWrite(ticket)
            }
            State::Healthy { .. } => Gate::Write(ticket),
            State::Degraded { retry_at, .. } if now >= *retry_at => {
                *retry_at = after_interval(now);
                Gate::CheckThenWrite(ticket)
            }
            State::Degraded { .. } => Gate::Skip,
        }
    }

    /// A write gated by `ticket` succeeded; returns whether that ended degraded mode (only the
    /// probe of the current episode can).
    pub(crate) fn written(&mut self, ticket: Ticket, now: Instant) -> bool {
        match self.state {
            State::Degraded { .. } if ticket.generation == self.generation => {
                self.state = State::Healthy { check_at: after_interval(now) };
                true
            }
            State::Degraded { .. } | State::Healthy { .. } => false,
        }
    }

    /// A disk write failed: degraded (again), next probe one interval from `now`.
    pub(crate) fn write_failed(&mut self, reason: DegradedReason, now: Instant, wall: SystemTime) {
        self.write_failures = self.write_failures.saturating_add(1);
        self.degrade(reason, now, wall, true);
    }

    /// A disk read failed: degraded; an episode already under way keeps its probe deadline.
    pub(crate) fn read_failed(&mut self, reason: DegradedReason, now: Instant, wall: SystemTime) {
        self.read_failures = self.read_failures.saturating_add(1);
        self.degrade(reason, now, wall, false);
    }

    /// A link check found an arena file unlinked: degraded, next check one interval from `now`.
    pub(crate) fn files_removed(&mut self, now: Instant, wall: SystemTime) {
        self.degrade(DegradedReason::FilesRemoved, now, wall, true);
    }

    fn degrade(&mut self, reason: DegradedReason, now: Instant, wall: SystemTime, defer: bool) {
        match &mut self.state {
            State::Healthy { .. } => {
                self.generation += 1;
                self.state = State::Degraded { reason, since: wall, retry_at: after_interval(now) };
            }
            State::Degraded { reason: latest, retry_at, .. } => {
                *latest = reason;
                if defer {
                    *retry_at = (*retry_at).max(after_interval(now));
                }
            }
        }
    }

    /// Whether writes are being skipped.
    pub(crate) fn is_degraded(&self) -> bool {
        match self.state {
            State::Healthy { .. } => false,
            State::Degraded { .. } => true,
        }
    }

    /// The public report.
    pub(crate) fn report(&self) -> StoreHealth {
        let state = match &self.state {
            State::Healthy { .. } => HealthState::Healthy,
            State::Degraded { reason, since, .. } => {
                HealthState::Degraded { reason: reason.clone(), since: *since }
            }
        };
        StoreHealth {
            state,
            write_failures: self.write_failures,
            read_failures: self.read_failures,
        }
    }

    /// Asserts the machine's invariants.
    pub(crate) fn check_invariants(&self) {
        match self.state {
            State::Healthy { .. } => {}
            State::Degraded { .. } => assert!(self.generation >= 1, "degraded without an episode"),
        }
    }

    /// The deadline of the next link check or probe.
    #[cfg(test)]
    pub(crate) fn deadline(&self) -> Instant {
        match self.state {
            State::Healthy { check_at } => check_at,
            State::Degraded { retry_at, .. } => retry_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wall() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    fn ticket(gate: Gate) -> Ticket {
        match gate {
            Gate::Write(t) | Gate::CheckThenWrite(t) => t,
            Gate::Skip => panic!("expected a write, got a skip"),
        }
    }

    #[test]
    fn a_healthy_disk_writes_and_checks_its_files_once_per_interval() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        assert!(matches!(h.gate(t0), Gate::Write(_)));
        assert!(matches!(h.gate(t0 + PROBE_INTERVAL - Duration::from_millis(1)), Gate::Write(_)));
        assert!(matches!(h.gate(t0 + PROBE_INTERVAL), Gate::CheckThenWrite(_)));
        assert_eq!(h.deadline(), t0 + 2 * PROBE_INTERVAL);
        assert!(matches!(h.gate(t0 + PROBE_INTERVAL), Gate::Write(_)), "one check per interval");
        assert_eq!(h.report(), StoreHealth::default());
        h.check_invariants();
    }

    #[test]
    fn degraded_skips_writes_until_the_probe_is_due_and_allows_one_probe_per_interval() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        let t = ticket(h.gate(t0));
        h.write_failed(DegradedReason::NoSpace, t0, wall());
        let report = h.report();
        assert_eq!(
            report.state,
            HealthState::Degraded { reason: DegradedReason::NoSpace, since: wall() }
        );
        assert_eq!((report.write_failures, report.read_failures), (1, 0));
        assert!(!h.written(t, t0), "a write gated before the failure cannot end the episode");
        assert_eq!(h.gate(t0 + PROBE_INTERVAL - Duration::from_millis(1)), Gate::Skip);
        let probe = h.gate(t0 + PROBE_INTERVAL);
        assert!(matches!(probe, Gate::CheckThenWrite(_)));
        assert_eq!(h.gate(t0 + PROBE_INTERVAL), Gate::Skip, "one probe at a time");
        h.write_failed(DegradedReason::NoSpace, t0 + PROBE_INTERVAL, wall());
        assert_eq!(h.deadline(), t0 + 2 * PROBE_INTERVAL);
        let probe = ticket(h.gate(t0 + 2 * PROBE_INTERVAL));
        assert!(h.written(probe, t0 + 2 * PROBE_INTERVAL));
        assert_eq!(h.report().state, HealthState::Healthy);
        assert_eq!(h.report().write_failures, 2);
        assert_eq!(h.deadline(), t0 + 3 * PROBE_INTERVAL);
        h.check_invariants();
    }

    #[test]
    fn a_late_success_from_an_earlier_episode_does_not_end_the_next_one() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        let early = ticket(h.gate(t0));
        h.write_failed(DegradedReason::ReadOnly, t0, wall());
        let probe = ticket(h.gate(t0 + PROBE_INTERVAL));
        assert!(h.written(probe, t0 + PROBE_INTERVAL));
        let healthy_write = ticket(h.gate(t0 + PROBE_INTERVAL));
        h.write_failed(DegradedReason::NoSpace, t0 + PROBE_INTERVAL, wall());
        assert!(!h.written(early, t0 + PROBE_INTERVAL));
        assert!(!h.written(healthy_write, t0 + PROBE_INTERVAL));
        assert!(h.report().is_degraded());
    }

    #[test]
    fn a_read_failure_degrades_but_does_not_push_back_a_pending_probe() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        h.read_failed(DegradedReason::ReadError("boom".into()), t0, wall());
        assert_eq!(h.deadline(), t0 + PROBE_INTERVAL);
        h.read_failed(DegradedReason::ReadError("again".into()), t0 + PROBE_INTERVAL / 2, wall());
        assert_eq!(h.deadline(), t0 + PROBE_INTERVAL);
        let report = h.report();
        assert_eq!((report.write_failures, report.read_failures), (0, 2));
        let HealthState::Degraded { reason, .. } = report.state else { panic!("degraded") };
        assert_eq!(reason.to_string(), "read error: again", "the latest failure is reported");
    }

    #[test]
    fn removed_files_keep_the_store_degraded_at_every_probe_and_count_no_io_failure() {
        let t0 = Instant::now();
        let mut h = Health::new(t0);
        assert!(matches!(h.gate(t0 + PROBE_INTERVAL), Gate::CheckThenWrite(_)));
        h.files_removed(t0 + PROBE_INTERVAL, wall());
        assert_eq!(h.gate(t0 + PROBE_INTERVAL), Gate::Skip);
        assert!(matches!(h.gate(t0 + 2 * PROBE_INTERVAL), Gate::CheckThenWrite(_)));
        h.files_removed(t0 + 2 * PROBE_INTERVAL, wall());
        let report = h.report();
        assert_eq!((report.write_failures, report.read_failures), (0, 0));
        assert_eq!(
            report.state,
            HealthState::Degraded { reason: DegradedReason::FilesRemoved, since: wall() }
        );
    }

    #[test]
    fn time_going_backwards_never_probes_early_or_panics() {
        let t0 = Instant::now() + Duration::from_secs(3600);
        let mut h = Health::new(t0);
        h.write_failed(DegradedReason::NoSpace, t0, wall());
        assert_eq!(h.gate(t0 - Duration::from_secs(60)), Gate::Skip);
        h.write_failed(DegradedReason::NoSpace, t0 - Duration::from_secs(60), wall());
        assert_eq!(h.deadline(), t0 + PROBE_INTERVAL, "an earlier failure never pulls it in");
    }

    #[test]
    fn errors_map_to_the_reasons_healthz_shows() {
        let os = io::Error::from_raw_os_error;
        assert_eq!(DegradedReason::of_write(&os(28)).to_string(), "no space left on device");
        assert_eq!(DegradedReason::of_write(&os(30)).to_string(), "read-only file system");
        assert_eq!(DegradedReason::of_write(&os(13)).to_string(), "permission denied");
        assert_eq!(DegradedReason::of_write(&os(122)).to_string(), "disk quota exceeded");
        let eio = DegradedReason::of_write(&os(5)).to_string();
        assert!(eio.starts_with("io error: Input/output error"), "{eio}");
        let short = DegradedReason::of_write(&io::Error::from(io::ErrorKind::WriteZero));
        assert!(short.to_string().starts_with("io error: "), "{short}");
        let read = DegradedReason::of_read(&os(5)).to_string();
        assert!(read.starts_with("read error: Input/output error"), "{read}");
    }
}
