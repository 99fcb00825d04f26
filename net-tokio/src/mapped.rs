//! Read-only shared mappings of the store's arena files: with `memory` (one call into the C
//! library), the workspace's only `unsafe` code.
//!
//! A disk-tier hit whose bytes the page cache holds can be answered with a [`bytes::Bytes`] that
//! points into the arena file's mapping, so the client's socket write copies the page cache's
//! pages once (kernel to socket) instead of twice (`pread` into a buffer, then the buffer to the
//! socket). The store decides when (`crate::store`'s arena, `SlotRead::try_map`); this module only
//! maps, checks residency and unmaps.
//!
//! # The contract that makes the slices sound
//! [`Mapping::slice`] hands out `&[u8]` over file bytes. They must not change while a slice
//! lives, and the file must not shrink under the mapping (a read past its end is `SIGBUS`):
//! - the store writes a slot's bytes only into a slot no read pins, and every slice is owned by a
//!   pinned read (the arena's `SlotRead`), so a slot being read is never rewritten;
//! - an arena file is never truncated or resized while mapped: a cold open makes a new file
//!   (`Arena::reset`), so even an answer that outlives its closed store keeps the old file's
//!   pages; the cache directory's lock keeps a second `dart` out of the files.
//!
//! Not covered: a warm (`Verify`) reopen of the same directory in the same process while an
//! answer of the closed store is still alive reuses the file and may rewrite that answer's slot.
//! The node opens its store once per process; an embedder that reopens one must let the old
//! store's answers go first.
//!
//! What no contract covers: another process truncating or writing the arena file (an operator's
//! mistake) can then show torn bytes or kill the process with `SIGBUS`, and a page the kernel
//! evicts between [`Mapping::resident`] and the socket write (a slow client's response waits in
//! its connection's queue) is read back from the disk inside that write, on the async worker, as
//! nginx's `sendfile` does without its thread pool; a failing disk then fails the write with
//! `EFAULT`, while a reader in user space, such as a peer response's signature, would take
//! `SIGBUS`. `pread` turns all of these into errors before the answer exists; the residency check
//! before a mapped answer keeps the window for the last two short (the store takes a window
//! found resident as still so for at most 10 ms, `RESIDENT_FOR` in `crate::store`'s arena, so
//! that a hot window is not checked at every answer).
//!
//! # Why the bytes are copied into the socket, not sent with `sendfile`
//! `sendfile` from the arena file would skip the copy into the socket (measured: hot 64 KiB
//! disk-tier hits +48 % req/s), but the socket then holds references to the page cache's pages,
//! not a copy, until the receiver has read them (on loopback) or the peer acknowledged them:
//! after the answer's pin is released the slot may be rewritten in place, and the bytes still
//! queued change under the socket. The bounded soak served 11 MB of wrong bytes that way (CI,
//! 2026-12-05). A `write` copies at the time of the call, while the pin holds; test
//! `crate::guard`'s `bytes_written_from_a_mapping_are_the_bytes_at_write_time`. Punching the slot
//! out of the file before its rewrite would not make `sendfile` safe: the kernel zeroes in place
//! the part of a page-cache folio that straddles the punched range's edge (docs/benchmarks.md,
//! "Where the rest of the gap is").
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// A whole file mapped read-only and shared: the page cache's own pages, no copy. Only this crate
/// makes one (a [`crate::store::StoreIo`] other than [`crate::store::OsIo`] can only hand on
/// `OsIo`'s or none), since its soundness rests on how the store writes its files.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value until `Drop` unmaps it; reading it
// from any thread is as safe as reading an immutable buffer (module contract above).
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: `&Mapping` only reads.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` from its start, read-only and shared. `len` must not exceed
    /// the file's size while the mapping lives (module contract).
    pub(crate) fn map(file: &File, len: u64) -> io::Result<Mapping> {
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        // SAFETY: a fresh read-only mapping at an address the kernel chooses; it aliases no Rust
        // memory. The file descriptor may be closed afterwards: the mapping keeps the file open.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Mapping { ptr, len })
    }

    /// Bytes `offset..offset + len` of the file. Panics if they reach past the mapping.
    pub(crate) fn slice(&self, offset: u64, len: u64) -> &[u8] {
        let (start, len) = self.span(offset, len);
        // SAFETY: in bounds (checked by `span`), readable for the mapping's life, which `&self`
        // outlives; the bytes do not change while the slice lives (module contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(start), len) }
    }

    /// Whether every page of `offset..offset + len` is in the page cache now (`mincore`), so
    /// that reading the slice will not wait for the disk. An error answers `false`.
    pub(crate) fn resident(&self, offset: u64, len: u64) -> bool {
        let (start, len) = self.span(offset, len);
        if len == 0 {
            return true;
        }
        let page = page_size();
        let first = start / page * page;
        let end = start + len;
        let pages = (end - first).div_ceil(page);
        let mut flags = [0u8; 256];
        let mut owned;
        let flags: &mut [u8] = if pages <= flags.len() {
            &mut flags[..pages]
        } else {
            owned = vec![0u8; pages];
            &mut owned
        };
        // SAFETY: `first` is page-aligned and `first..end` lies within the mapping; `flags` has
        // one byte per page of that range, as `mincore` writes.
        let rc = unsafe {
            libc::mincore(
                self.ptr.as_ptr().add(first).cast(),
                end - first,
                flags.as_mut_ptr().cast(),
            )
        };
        rc == 0 && flags.iter().all(|&f| f & 1 == 1)
    }

    fn span(&self, offset: u64, len: u64) -> (usize, usize) {
        let end = offset.checked_add(len).expect("span overflows");
        assert!(end <= self.len as u64, "span {offset}+{len} past a mapping of {}", self.len);
        (offset as usize, len as usize)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped; no slice outlives `self` (they borrow it).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// An empty file `f` in a fresh directory of the temp dir (the caller removes the directory).
#[cfg(test)]
pub(crate) fn temp_file(name: &str) -> (std::path::PathBuf, File) {
    let dir = std::env::temp_dir().join(format!("dart-mapped-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("f");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .expect("open");
    (dir, file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn a_mapping_shows_what_was_written_and_knows_which_pages_are_cached() {
        let (dir, file) = temp_file("basic");
        let len = 64 << 20;
        file.set_len(len).expect("sparse file");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all_at(&data, 8192 + 7).expect("write");
        let map = Mapping::map(&file, len).expect("map");
        assert_eq!(map.slice(8192 + 7, data.len() as u64), &data[..]);
        assert!(map.resident(8192 + 7, data.len() as u64), "just-written pages are cached");
        // A hole far from the write was never read or written: no page of it is cached.
        assert!(!map.resident(48 << 20, 1 << 20), "a sparse hole is not cached");
        // More pages than the stack array holds, part cached, part not.
        assert!(!map.resident(0, 32 << 20));
        assert!(map.resident(0, 0));
        std::fs::remove_dir_all(dir).expect("clean up");
    }

    #[test]
    #[should_panic(expected = "past a mapping")]
    fn a_slice_past_the_end_panics() {
        let (dir, file) = temp_file("end");
        file.set_len(4096).expect("size");
        let map = Mapping::map(&file, 4096).expect("map");
        std::fs::remove_dir_all(dir).expect("clean up");
        let _ = map.slice(4000, 200);
    }

    #[test]
    fn an_empty_mapping_is_refused() {
        let (dir, file) = temp_file("empty");
        assert!(Mapping::map(&file, 0).is_err());
        std::fs::remove_dir_all(dir).expect("clean up");
    }
}
