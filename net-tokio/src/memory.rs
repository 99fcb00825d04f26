//! Memory kept for reuse, given back when the node goes idle
//! ([`dart_core::node::Output::ReleaseMemory`], decided by the node machine).
//!
//! Two things keep memory after a burst of reads: the block-buffer pool (at most
//! [`dart_core::bufpool::IDLE_BYTES_MAX`] idle) and the allocator. glibc's `malloc` keeps freed
//! memory in its arenas for reuse and gives back only the free top of a heap; after mixed work a
//! node held a few hundred MiB of free heap (docs/benchmarks.md, "The allocator"). On glibc,
//! `malloc_trim(0)` returns every whole free page of every arena to the kernel (`madvise`); the
//! next burst faults fresh pages in again, which is why this runs only after the node has been
//! idle ([`dart_core::node::IDLE_RELEASE_AFTER`]), not after every read.
//!
//! This module and `mapped` are the workspace's only unsafe code: one call into the C library,
//! which takes no pointer and locks each arena itself (glibc documents it MT-Safe).
#![allow(unsafe_code)]

/// What one release gave back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// Bytes of idle pooled buffers dropped.
    pub pooled: usize,
    /// Whether the allocator returned any memory to the kernel (`false` where there is no
    /// `malloc_trim`: another C library or allocator).
    pub trimmed: bool,
}

/// Drops the pool's idle buffers, then asks the allocator to return its free pages.
pub fn release() -> Released {
    let pooled = dart_core::bufpool::release_idle();
    Released { pooled, trimmed: trim_allocator() }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_allocator() -> bool {
    // SAFETY: `malloc_trim` reads no memory of ours (its argument is a byte count) and takes each
    // arena's lock while it works, so it is sound at any time from any thread.
    unsafe { libc::malloc_trim(0) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_allocator() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_empties_the_pool_and_the_next_read_still_gets_a_buffer() {
        drop(dart_core::bufpool::Buf::take(1 << 20));
        let released = release();
        assert!(released.pooled <= dart_core::bufpool::IDLE_BYTES_MAX);
        // Nothing idle is left (other tests may give buffers back meanwhile: only the bound is
        // certain), and a buffer taken now is a whole one.
        let mut buf = dart_core::bufpool::Buf::take(1 << 20);
        buf.as_mut_slice().fill(7);
        assert_eq!(buf.freeze().len(), 1 << 20);
        println!("released {released:?}");
    }
}
