//! Sealed memory files: immutable blocks the kernel can send without a copy.
//!
//! A RAM-tier block read often is copied once into a memory file (`memfd_create`) that is then
//! sealed against every change (`F_SEAL_WRITE`, `F_SEAL_SHRINK`, `F_SEAL_GROW`, `F_SEAL_SEAL`),
//! and mapped read-only: [`seal`] returns it as a [`Bytes`] over that mapping. A response body
//! slice that lies inside such a block is written to a TCP socket with `sendfile` from the memory
//! file ([`send_sealed`], called by [`crate::seam::TcpConn`]): the socket takes references to the
//! file's pages instead of a copy of the bytes, which is the copy nginx's `sendfile` saves (a
//! RAM-tier hit's one copy, into the socket, was 21 % of the node's CPU on hot 64 KiB answers and
//! about 40 % on 1 MiB ones).
//!
//! # Why this is safe where `sendfile` from the disk tier's arena file is not
//! A socket keeps the pages `sendfile` gave it until the receiver has read them (on loopback) or
//! the peer acknowledged them, long after the call returned and the answer's handle was dropped;
//! bytes written into those pages meanwhile would reach the client in place of the ones served
//! (`crate::mapped`'s doc: the arena's slots are rewritten in place, and that served wrong bytes).
//! A sealed memory file can never be written again, by this process or any other: the kernel
//! refuses `write`, a writable mapping, truncation and growth once the seals are set, and the
//! seals cannot be removed. When the block leaves the RAM tier its file is closed and unmapped;
//! pages still in a socket stay alive, unchanged, until the socket lets them go. So no contract
//! of the store's is needed: the bytes a socket holds are the bytes served.
//!
//! # What it costs
//! One copy of the block and its memory file's pages (the tier's heap buffer goes back to the
//! pool when the last answer holding it ends), made off the node's lock by the driver's blocking
//! pool, once per block the tier keeps ([`crate::store`]'s RAM tier decides which: a block read a
//! second time while held). A memory file is a descriptor while it lives: at most one per RAM-tier
//! slot plus answers still in flight.
#![allow(unsafe_code)]

use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// Live sealed blocks by the address their mapping starts at: (length, memory file).
static LIVE: RwLock<BTreeMap<usize, (usize, RawFd)>> = RwLock::new(BTreeMap::new());

/// Body bytes written with `sendfile` from sealed blocks since the process started.
static SENT_BYTES: AtomicU64 = AtomicU64::new(0);
/// `sendfile` calls that wrote bytes of sealed blocks since the process started.
static SENT_CALLS: AtomicU64 = AtomicU64::new(0);

/// The smallest slice worth a `sendfile` of its own: below it a copy costs less than the call.
pub const SEND_MIN: usize = 16 << 10;

/// Bytes and calls sent from sealed blocks without a copy so far, in this process (for the
/// metrics).
pub fn sent() -> (u64, u64) {
    (SENT_BYTES.load(Ordering::Relaxed), SENT_CALLS.load(Ordering::Relaxed))
}

/// Sealed blocks alive now in this process: those a RAM tier holds and those only answers in
/// flight still hold.
pub fn live() -> usize {
    LIVE.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
}

/// A sealed memory file and its read-only mapping; see the module doc.
struct Sealed {
    file: File,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only over sealed bytes that never change; reading it from any
// thread is as safe as reading an immutable buffer, and only `Drop` unmaps it.
unsafe impl Send for Sealed {}
// SAFETY: as for `Send`: `&Sealed` only reads.
unsafe impl Sync for Sealed {}

impl AsRef<[u8]> for Sealed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is this value's mapping, readable until `Drop`, which `&self`
        // outlives; the file is sealed, so the bytes never change (module doc).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Sealed {
    fn drop(&mut self) {
        // Out of the table before the address can be mapped again by anyone.
        LIVE.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&self.addr());
        // SAFETY: unmaps exactly what `seal` mapped; no slice outlives `self` (a `Bytes` over it
        // owns it). The file closes after, with `self.file`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl Sealed {
    fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }
}

/// A copy of `data` in a sealed memory file, as a [`Bytes`] over its read-only mapping; see the
/// module doc. Fails where the system has no sealed memory files (then the caller keeps `data`).
pub fn seal(data: &[u8]) -> io::Result<Bytes> {
    if data.is_empty() {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    // SAFETY: a NUL-terminated name and flags; the call creates a new descriptor or fails.
    let fd = unsafe {
        libc::memfd_create(c"dart-block".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let mut file = unsafe { File::from_raw_fd(fd) };
    file.set_len(data.len() as u64)?;
    file.write_all(data)?;
    let seals = libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: `fcntl` on a descriptor this function owns; no writable mapping of it exists.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh read-only shared mapping of the whole sealed file at an address the kernel
    // chooses; it aliases no Rust memory.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data.len(),
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
    let sealed = Sealed { file, ptr, len: data.len() };
    LIVE.write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .insert(sealed.addr(), (sealed.len, sealed.file.as_raw_fd()));
    Ok(Bytes::from_owner(sealed))
}

/// Whether `data` lies inside a live sealed block.
pub fn is_sealed(data: &[u8]) -> bool {
    find(data).is_some()
}

/// The memory file and offset of `data`, if it lies inside a live sealed block. The descriptor
/// is valid while the caller's borrow of `data` lasts: `data` borrows a [`Bytes`] that owns the
/// block.
fn find(data: &[u8]) -> Option<(RawFd, u64)> {
    let at = data.as_ptr() as usize;
    let live = LIVE.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (&start, &(len, fd)) = live.range(..=at).next_back()?;
    (at + data.len() <= start + len).then_some((fd, (at - start) as u64))
}

/// Writes `data` to socket `socket` with `sendfile` from its sealed block, when it lies inside
/// one and is at least [`SEND_MIN`] long: `None` when it does not (the caller writes it as usual),
/// else what `sendfile` did (bytes written, or the error, `WouldBlock` included).
pub fn send_sealed(socket: RawFd, data: &[u8]) -> Option<io::Result<usize>> {
    if data.len() < SEND_MIN {
        return None;
    }
    let (fd, offset) = find(data)?;
    let mut offset = i64::try_from(offset).ok()?;
    // SAFETY: `socket` is the caller's open socket; `fd` stays open while `data` is borrowed
    // (`find`); the kernel writes only `offset`, a local.
    let n = unsafe { libc::sendfile(socket, fd, &mut offset, data.len()) };
    Some(if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        SENT_BYTES.fetch_add(n as u64, Ordering::Relaxed);
        SENT_CALLS.fetch_add(1, Ordering::Relaxed);
        Ok(n as usize)
    })
}

/// Writes `bufs` to socket `socket` with `MSG_MORE` (the bytes that follow, a sealed block's,
/// join them in the socket's next packet instead of leaving alone): bytes written, or the error.
pub fn send_more(socket: RawFd, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: `msghdr` is plain data; every field the call reads is set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
    // SAFETY: `IoSlice` is ABI-compatible with `iovec` (std's guarantee); the kernel only reads
    // the slices, which outlive the call.
    let n = unsafe { libc::sendmsg(socket, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::os::unix::fs::FileExt;

    fn pattern(len: usize, salt: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31) ^ salt).collect()
    }

    #[test]
    fn a_sealed_block_holds_its_bytes_refuses_every_change_and_leaves_the_table_when_dropped() {
        let data = pattern(200_000, 7);
        let block = seal(&data).expect("memfd");
        assert_eq!(&block[..], &data[..]);
        let inner = block.slice(1000..100_000);
        assert!(is_sealed(&inner) && is_sealed(&block));
        assert!(!is_sealed(&data), "a heap buffer is not");
        let (fd, offset) = find(&inner).expect("found");
        assert_eq!(offset, 1000);
        // The kernel refuses a write, a resize, and removing the seals.
        // SAFETY (test): `fd` is open while `block` lives; the `File` is forgotten, not closed.
        let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
        assert!(file.write_all_at(b"x", 5).is_err(), "sealed against writes");
        assert!(file.set_len(10).is_err(), "sealed against shrinking");
        assert!(file.set_len(300_000).is_err(), "sealed against growing");
        // SAFETY (test): reads the seals of an open descriptor.
        let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
        assert_eq!(seals & libc::F_SEAL_SEAL, libc::F_SEAL_SEAL, "and the seals are final");
        assert!(seal(&[]).is_err(), "an empty block is refused");
        let addr = block.as_ptr() as usize;
        drop((block, inner));
        assert!(!LIVE.read().expect("table").contains_key(&addr), "dropped, out of the table");
    }

    #[test]
    fn bytes_sent_from_a_sealed_block_are_the_block_after_it_is_dropped() {
        let data = pattern(96 << 10, 3);
        let block = seal(&data).expect("memfd");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let tx = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("dial");
        let (mut rx, _) = listener.accept().expect("accept");
        // Room for the whole block in the sockets' buffers, so that nothing waits for the reader.
        for fd in [tx.as_raw_fd(), rx.as_raw_fd()] {
            for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
                let size: libc::c_int = 1 << 20;
                // SAFETY (test): sets an int option of an open socket from a local.
                let rc = unsafe {
                    libc::setsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        opt,
                        (&size as *const libc::c_int).cast(),
                        std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                    )
                };
                assert_eq!(rc, 0);
            }
        }
        let head = b"HEAD";
        let n = send_more(tx.as_raw_fd(), &[io::IoSlice::new(head)]).expect("head");
        assert_eq!(n, head.len());
        let (bytes0, calls0) = sent();
        let mut at = 0;
        while at < block.len() {
            // A blocking socket: the call waits for room, never `WouldBlock`.
            at += send_sealed(tx.as_raw_fd(), &block[at..]).expect("sealed").expect("sendfile");
        }
        assert!(send_sealed(tx.as_raw_fd(), &block[..100]).is_none(), "short: left to a copy");
        let (bytes1, calls1) = sent();
        assert!(bytes1 - bytes0 >= block.len() as u64 && calls1 > calls0);
        // The socket holds the block's pages, not a copy: the block is dropped (its file closed,
        // unmapped) before the receiver reads a byte, and the bytes are still the block's.
        drop(block);
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).expect("read");
        assert_eq!(&got[..4], head);
        assert!(got[4..] == data[..], "the bytes sent are the block's");
    }
}
