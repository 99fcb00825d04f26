//! A [`StoreIo`] that fails reads or writes on demand and whose clock moves only when told: for
//! tests and fault drills of degraded mode (no root, no mounts, no sleeps).

use std::fs::File;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::io::{OsIo, StoreIo};

/// A disk failure to inject, as the kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `ENOSPC`: the file system is full.
    NoSpace,
    /// `EROFS`: the file system was remounted read-only.
    ReadOnly,
    /// `EACCES`: permission denied.
    PermissionDenied,
    /// `EIO`: the device failed.
    Io,
    /// A short transfer: a write stores only the first half of its bytes before failing (as
    /// `write_all_at` does when the kernel accepts 0 bytes); a read hits an unexpected end of file.
    Short,
}

impl Fault {
    fn error(self, write: bool) -> io::Error {
        match self {
            Fault::NoSpace => io::Error::from_raw_os_error(28),
            Fault::ReadOnly => io::Error::from_raw_os_error(30),
            Fault::PermissionDenied => io::Error::from_raw_os_error(13),
            Fault::Io => io::Error::from_raw_os_error(5),
            Fault::Short if write => io::Error::from(io::ErrorKind::WriteZero),
            Fault::Short => io::Error::from(io::ErrorKind::UnexpectedEof),
        }
    }
}

/// Real file I/O ([`OsIo`]) unless a fault is set, and a clock that starts at creation and moves
/// only by [`FaultyIo::advance`].
#[derive(Debug)]
pub struct FaultyIo {
    write_fault: Mutex<Option<Fault>>,
    read_fault: Mutex<Option<Fault>>,
    write_calls: AtomicU64,
    read_calls: AtomicU64,
    start: Instant,
    elapsed_ms: AtomicU64,
}

impl Default for FaultyIo {
    fn default() -> Self {
        FaultyIo::new()
    }
}

impl FaultyIo {
    /// No faults, clock at creation time.
    pub fn new() -> Self {
        FaultyIo {
            write_fault: Mutex::new(None),
            read_fault: Mutex::new(None),
            write_calls: AtomicU64::new(0),
            read_calls: AtomicU64::new(0),
            start: Instant::now(),
            elapsed_ms: AtomicU64::new(0),
        }
    }

    /// Makes every later write fail with `fault` (`None`: writes succeed again).
    pub fn fail_writes(&self, fault: Option<Fault>) {
        *self.write_fault.lock().expect("fault lock") = fault;
    }

    /// Makes every later read fail with `fault` (`None`: reads succeed again).
    pub fn fail_reads(&self, fault: Option<Fault>) {
        *self.read_fault.lock().expect("fault lock") = fault;
    }

    /// Moves the clock forward by `by` (whole milliseconds).
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.elapsed_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Writes attempted since creation, failed ones included.
    pub fn write_calls(&self) -> u64 {
        self.write_calls.load(Ordering::Relaxed)
    }

    /// Reads attempted since creation, failed ones included.
    pub fn read_calls(&self) -> u64 {
        self.read_calls.load(Ordering::Relaxed)
    }
}

impl StoreIo for FaultyIo {
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_calls.fetch_add(1, Ordering::Relaxed);
        match *self.read_fault.lock().expect("fault lock") {
            Some(fault) => Err(fault.error(false)),
            None => OsIo.read_exact_at(file, buf, offset),
        }
    }

    fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_calls.fetch_add(1, Ordering::Relaxed);
        match *self.write_fault.lock().expect("fault lock") {
            Some(Fault::Short) => {
                OsIo.write_all_at(file, &buf[..buf.len() / 2], offset)?;
                Err(Fault::Short.error(true))
            }
            Some(fault) => Err(fault.error(true)),
            None => OsIo.write_all_at(file, buf, offset),
        }
    }

    fn now(&self) -> Instant {
        let elapsed = Duration::from_millis(self.elapsed_ms.load(Ordering::Relaxed));
        self.start.checked_add(elapsed).unwrap_or(self.start)
    }
}
