//! One process per cache directory: an exclusive advisory lock on `<cache-dir>/.dart.lock`.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use super::StoreError;

/// Lock file name inside the cache directory.
pub(crate) const LOCK_FILE: &str = ".dart.lock";

/// Creates `dir` if missing and takes the exclusive lock on its lock file without blocking.
///
/// The lock must be held before any arena is opened, because a cold open truncates the arenas: a
/// second instance has to fail before it can wipe the first one's cache. The kernel releases the
/// lock when the returned file is dropped or the process dies.
pub(crate) fn acquire(dir: &Path) -> Result<File, StoreError> {
    let dir_error = |cause| StoreError::Dir { dir: dir.to_owned(), cause };
    std::fs::create_dir_all(dir).map_err(dir_error)?;
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(dir_error)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            Err(StoreError::Locked { dir: dir.to_owned(), lock: path })
        }
        Err(TryLockError::Error(cause)) => Err(StoreError::Dir { dir: dir.to_owned(), cause }),
    }
}
