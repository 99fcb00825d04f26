//! The store's seam to the operating system at run time: positioned reads and writes of the arena
//! files, and the clock of the degraded-mode retry timer.
//!
//! Production uses [`OsIo`], whose methods are the plain `std` calls. Tests substitute an
//! implementation that fails on demand and moves its clock by hand ([`super::FaultyIo`]), so every
//! disk error path runs through exactly the code production runs.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

/// What the store asks of the operating system once its files are open.
///
/// Every positional read and write of an arena file goes through [`StoreIo::read_exact_at`] and
/// [`StoreIo::write_all_at`]; resizing and `fstat` do not. [`StoreIo::now`] is read only to decide
/// whether a degraded store's next probe write is due.
pub trait StoreIo: Send + Sync + fmt::Debug + 'static {
    /// Fills `buf` from `file` at `offset` (`FileExt::read_exact_at`).
    fn read_exact_at(&self, file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(file, buf, offset)
    }

    /// Fills `buf` from `file` at `offset` only if the page cache holds every byte, never waiting
    /// for the disk (`preadv2` with `RWF_NOWAIT`, Linux 4.14+). `false` means "read it with
    /// [`StoreIo::read_exact_at`]": not all cached, an error, or no such call here. The default is
    /// always `false`, so a test double that injects faults keeps every read on `read_exact_at`.
    fn read_cached_at(&self, file: &File, buf: &mut [u8], offset: u64) -> bool {
        let _ = (file, buf, offset);
        false
    }

    /// A read-only shared mapping of `file`'s first `len` bytes, for hits answered straight from
    /// the page cache (`crate::mapped`); `None` means "no mapping, read with
    /// [`StoreIo::read_exact_at`]". The default is `None`, so a test double that injects faults
    /// keeps every read on its own calls.
    fn map(&self, file: &File, len: u64) -> Option<crate::mapped::Mapping> {
        let _ = (file, len);
        None
    }

    /// A second handle on the arena file at `path` that writes around the page cache
    /// (`O_DIRECT`), for block data (`super::arena`'s writer); `None` means "write block data
    /// through `file` with [`StoreIo::write_all_at`]", as every write did before. The default is
    /// `None`, so a test double that injects faults sees every write on its own calls.
    fn open_direct(&self, path: &Path) -> Option<File> {
        let _ = path;
        None
    }

    /// Writes all of `buf` to `file` at `offset` (`FileExt::write_all_at`); a short write that
    /// cannot be completed is an error, with an unknown prefix of `buf` written.
    fn write_all_at(&self, file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(file, buf, offset)
    }

    /// The monotonic clock of the probe timer.
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The operating system itself: the production [`StoreIo`].
#[derive(Clone, Copy, Debug, Default)]
pub struct OsIo;

impl StoreIo for OsIo {
    #[cfg(target_os = "linux")]
    fn read_cached_at(&self, file: &File, buf: &mut [u8], offset: u64) -> bool {
        use rustix::io::{preadv2, ReadWriteFlags};
        let want = buf.len();
        // A short read means part of the range is not cached: the caller reads it all again the
        // blocking way, which is rare enough not to be worth continuing here.
        let read = preadv2(file, &mut [io::IoSliceMut::new(buf)], offset, ReadWriteFlags::NOWAIT);
        matches!(read, Ok(n) if n == want)
    }

    #[cfg(target_os = "linux")]
    fn open_direct(&self, path: &Path) -> Option<File> {
        use std::os::unix::fs::OpenOptionsExt;
        // A file system without O_DIRECT (tmpfs before Linux 6.6, some FUSE ones) refuses the
        // open: block data then goes through the page cache as before.
        match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(file) => Some(file),
            Err(e) => {
                tracing::info!(
                    path = %path.display(),
                    error = %e,
                    "arena file without O_DIRECT: block data written through the page cache"
                );
                None
            }
        }
    }

    fn map(&self, file: &File, len: u64) -> Option<crate::mapped::Mapping> {
        match crate::mapped::Mapping::map(file, len) {
            Ok(mapping) => Some(mapping),
            Err(e) => {
                tracing::warn!(error = %e, "arena file not mapped: disk-tier hits copy with pread");
                None
            }
        }
    }
}
