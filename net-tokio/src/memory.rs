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
//! which take no pointer. `malloc_trim` locks each arena itself (glibc documents it MT-Safe);
//! `mallopt` is made while the process has one thread (glibc documents it MT-Unsafe).
#![allow(unsafe_code)]

/// The variable with which glibc's users set the arena limit themselves; when it is set (or
/// `GLIBC_TUNABLES` names [`ARENA_TUNABLE`]), [`limit_arenas`] leaves the limit to it.
pub const ARENA_ENV: &str = "MALLOC_ARENA_MAX";
/// The arena limit's name in `GLIBC_TUNABLES`, glibc's other way to set it.
pub const ARENA_TUNABLE: &str = "glibc.malloc.arena_max";

/// What [`limit_arenas`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArenaCap {
    /// The cap is set to this many arenas.
    Set(usize),
    /// Left to the environment, which sets [`ARENA_ENV`] or [`ARENA_TUNABLE`].
    FromEnvironment,
    /// Not set: the process already runs other threads, or `/proc` could not say (glibc
    /// documents `mallopt` as unsafe to call while other threads may allocate).
    OtherThreads,
    /// Not set: the C library is not glibc (or refused the value).
    Unsupported,
}

/// Caps glibc's malloc arenas at `arenas` (at least 1) unless the environment sets the cap
/// ([`ARENA_ENV`], [`ARENA_TUNABLE`]). Only while the calling thread is the process's only one (checked): call it
/// first thing in `main`, before the runtime starts its threads (arenas already made stay).
pub fn limit_arenas(arenas: usize) -> ArenaCap {
    if arena_cap_in_environment() {
        return ArenaCap::FromEnvironment;
    }
    let arenas = arenas.clamp(1, i32::MAX as usize);
    set_arena_max(arenas as i32)
}

/// Whether the environment sets the arena cap itself.
fn arena_cap_in_environment() -> bool {
    std::env::var_os(ARENA_ENV).is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains(ARENA_TUNABLE))
}

/// How many threads the process runs (`/proc/self/status`), if it can tell.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_arena_max(arenas: i32) -> ArenaCap {
    // Only the calling thread runs, and only it can start another: nothing allocates beside
    // the call below.
    if threads() != Some(1) {
        return ArenaCap::OtherThreads;
    }
    // SAFETY: `mallopt` takes two integers and reads no memory of ours. glibc documents it
    // MT-Unsafe (other allocator calls read the parameters it writes without a lock); the process
    // has no other thread (checked just above), so no allocator call runs beside it.
    match unsafe { libc::mallopt(libc::M_ARENA_MAX, arenas) } {
        1 => ArenaCap::Set(arenas as usize),
        _ => ArenaCap::Unsupported,
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_arenas: i32) -> ArenaCap {
    ArenaCap::Unsupported
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

    /// In a process with other threads (this test harness) the cap is not set, and the
    /// environment's choice is left alone; the binary's start-up sets it (node/tests/binary.rs).
    #[test]
    fn the_arena_cap_is_never_set_beside_other_threads_nor_over_the_environment() {
        let got = limit_arenas(2);
        match arena_cap_in_environment() {
            true => assert_eq!(got, ArenaCap::FromEnvironment),
            false if cfg!(all(target_os = "linux", target_env = "gnu")) => {
                assert_eq!(got, ArenaCap::OtherThreads)
            }
            false => assert_eq!(got, ArenaCap::Unsupported),
        }
    }
}
