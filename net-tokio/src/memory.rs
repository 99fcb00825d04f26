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
//! A third thing is how many arenas glibc makes: by default up to eight per core, each thread
//! that meets a locked arena taking another, and each keeping its own free memory. The runtime's
//! workers, the threads that take their place during a blocking disk read and the blocking pool
//! spread a node's allocations over a dozen arenas, and a node under steady load kept the free
//! memory of all of them: [`limit_arenas`] caps them at one per core before any thread starts.
//!
//! This module and `mapped` are the workspace's only unsafe code: two calls into the C library,
//! which take no pointer and lock what they change themselves (glibc documents both MT-Safe).
#![allow(unsafe_code)]

/// The variable with which glibc's users set the arena limit themselves; when it is set,
/// [`limit_arenas`] leaves the limit to it.
pub const ARENA_ENV: &str = "MALLOC_ARENA_MAX";

/// Caps glibc's malloc arenas at `arenas` (at least 1) unless the environment sets
/// [`ARENA_ENV`], and returns the cap it set (`None`: left to the environment, or not glibc).
/// Call it before the runtime starts its threads: arenas already made stay.
pub fn limit_arenas(arenas: usize) -> Option<usize> {
    if std::env::var_os(ARENA_ENV).is_some() {
        return None;
    }
    let arenas = arenas.clamp(1, i32::MAX as usize);
    set_arena_max(arenas as i32).then_some(arenas)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(arenas: i32) -> bool {
    // SAFETY: `mallopt` takes two integers and reads no memory of ours; it takes the main
    // arena's lock while it changes the parameter, so it is sound at any time from any thread.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_arenas: i32) -> bool {
    false
}

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

    /// The cap is at least one arena, set on glibc, and left to the environment when it names
    /// one (the process's allocator works on either way).
    #[test]
    fn the_arena_cap_is_set_unless_the_environment_names_one() {
        let set = limit_arenas(0);
        match std::env::var_os(ARENA_ENV) {
            Some(_) => assert_eq!(set, None),
            None if cfg!(all(target_os = "linux", target_env = "gnu")) => {
                assert_eq!(set, Some(1))
            }
            None => assert_eq!(set, None),
        }
        assert_eq!(limit_arenas(usize::MAX).is_some(), set.is_some());
        let threads: Vec<_> =
            (0..4).map(|i| std::thread::spawn(move || vec![i as u8; 1 << 16])).collect();
        for t in threads {
            assert_eq!(t.join().expect("a thread").len(), 1 << 16);
        }
    }
}
