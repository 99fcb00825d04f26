//! Block-sized buffers, reused: the disk tier reads into them, and a node gathers a block that
//! arrives in parts into one. A fresh buffer pays for zeroing it and, for large ones, for fresh
//! pages from the kernel (a page fault per 4 KiB page on first write: about a tenth of a node's
//! CPU on cold whole reads); a pooled buffer was zeroed once and is overwritten. Buffers come in power-of-two classes from 64 KiB to 8 MiB
//! (smaller and larger reads use a plain buffer); a buffer goes back to its class when the last
//! [`Bytes`] handle on it is dropped. The pool keeps at most [`IDLE_BYTES_MAX`] idle: a buffer
//! that would pass it makes room by dropping an idle buffer of the class that holds the most idle
//! bytes, or is dropped itself if that class is its own. So one class cannot hold the whole budget
//! for good: after a cold read filled the pool with 4 MiB buffers, 64 KiB range reads still get
//! their buffers back (they were allocated and zeroed afresh per read before, 1-2 % of a node's CPU
//! on hot 64 KiB disk hits).

use std::sync::Mutex;

use bytes::Bytes;

/// The smallest class: 2^16 bytes. Reads below half of it take a plain buffer.
const MIN_SHIFT: u32 = 16;
/// The largest class: 2^23 bytes (8 MiB). Larger reads take a plain buffer.
const MAX_SHIFT: u32 = 23;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// Most bytes the pool keeps in idle buffers.
pub const IDLE_BYTES_MAX: usize = 64 << 20;

struct Pool {
    free: [Vec<Vec<u8>>; CLASSES],
    idle_bytes: usize,
}

impl Pool {
    /// Keeps `data` idle in `class`, within [`IDLE_BYTES_MAX`] (see the module's doc).
    fn give_back(&mut self, class: usize, data: Vec<u8>) {
        while self.idle_bytes + data.len() > IDLE_BYTES_MAX {
            // Every buffer of class `c` is 2^(c + MIN_SHIFT) bytes long.
            let fullest = (0..CLASSES)
                .max_by_key(|&c| self.free[c].len() << (c as u32 + MIN_SHIFT))
                .expect("there are classes");
            if fullest == class {
                return;
            }
            let Some(dropped) = self.free[fullest].pop() else { return };
            self.idle_bytes -= dropped.len();
        }
        self.idle_bytes += data.len();
        self.free[class].push(data);
    }

    /// Drops every idle buffer; the bytes they held.
    fn release(&mut self) -> usize {
        self.free = [const { Vec::new() }; CLASSES];
        std::mem::take(&mut self.idle_bytes)
    }
}

static POOL: Mutex<Pool> =
    Mutex::new(Pool { free: [const { Vec::new() }; CLASSES], idle_bytes: 0 });

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    // The pool holds no invariant a panic could break halfway: keep using it.
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Drops every idle buffer, returning how many bytes they held: for a node that went idle
/// ([`crate::node::Output::ReleaseMemory`]), so that a burst's buffers are not kept for good.
/// The next reads allocate (and zero) theirs afresh.
pub fn release_idle() -> usize {
    pool().release()
}

/// The class of a read of `len` bytes, if it takes a pooled buffer.
fn class_of(len: usize) -> Option<usize> {
    if !((1 << MIN_SHIFT) / 2..=1 << MAX_SHIFT).contains(&len) {
        return None;
    }
    let shift = len.next_power_of_two().trailing_zeros().max(MIN_SHIFT);
    Some((shift - MIN_SHIFT) as usize)
}

/// Where a pooled buffer's bytes start: on this boundary (the page size), so that a block gathered
/// into one can be written to the disk around the page cache (`O_DIRECT`) without a copy into an
/// aligned buffer first. A pooled buffer is allocated this much longer than its class.
pub const ALIGN: usize = 4096;

/// A buffer of `len` bytes to write into; its contents before the write are unspecified. A pooled
/// one (a class's) starts on an [`ALIGN`] boundary.
#[derive(Debug)]
pub struct Buf {
    data: Vec<u8>,
    /// Where the bytes start in `data` (0 for a plain buffer but one of [`Buf::take_aligned`]).
    start: usize,
    len: usize,
    class: Option<usize>,
}

impl Buf {
    /// A buffer for `len` bytes: an idle one of its class, else a new one.
    pub fn take(len: usize) -> Buf {
        let class = class_of(len);
        let reused = class.and_then(|c| {
            let mut pool = pool();
            let data = pool.free[c].pop()?;
            pool.idle_bytes -= data.len();
            Some(data)
        });
        let data = reused.unwrap_or_else(|| match class {
            Some(c) => vec![0; (1 << (c as u32 + MIN_SHIFT)) + ALIGN],
            None => vec![0; len],
        });
        // A `Vec` never moves its bytes while it is not grown: the offset holds for its life.
        let start = if class.is_some() { data.as_ptr().align_offset(ALIGN) } else { 0 };
        debug_assert!(data.len() >= start + len);
        Buf { data, start, len, class }
    }

    /// A buffer for `len` bytes that starts on an [`ALIGN`] boundary whatever its length: a
    /// pooled one as [`Buf::take`] gives, else a plain buffer allocated `ALIGN` longer (for a
    /// write around the page cache of a length outside the pool's classes).
    pub fn take_aligned(len: usize) -> Buf {
        if class_of(len).is_some() {
            return Buf::take(len);
        }
        let data = vec![0; len + ALIGN];
        let start = data.as_ptr().align_offset(ALIGN);
        Buf { data, start, len, class: None }
    }

    /// The `len` bytes to write into.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.start + self.len]
    }

    /// The bytes it hands out: `len` at first.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it hands out no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Hands out only the first `len` bytes (no effect if it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The read bytes as a shared handle; the buffer returns to the pool with the last handle.
    pub fn freeze(mut self) -> Bytes {
        if self.class.is_none() {
            // A plain buffer: its own allocation, nothing to give back.
            let mut data = std::mem::take(&mut self.data);
            data.truncate(self.start + self.len);
            data.drain(..self.start);
            return Bytes::from(data);
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.data[self.start..self.start + self.len]
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let Some(class) = self.class else { return };
        let data = std::mem::take(&mut self.data);
        pool().give_back(class, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_aligned_buffer_starts_on_the_boundary_at_every_length_and_freezes_to_its_bytes() {
        for len in [1, 4096, 12_288, (32 << 10) - 1, 64 << 10, (8 << 20) + 4096] {
            let mut buf = Buf::take_aligned(len);
            assert_eq!(buf.len(), len);
            let bytes = buf.as_mut_slice();
            assert_eq!(bytes.as_ptr().align_offset(ALIGN), 0, "{len} bytes start aligned");
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = i as u8;
            }
            let frozen = buf.freeze();
            assert_eq!(frozen.len(), len);
            assert!(frozen.iter().enumerate().all(|(i, &b)| b == i as u8), "{len} bytes kept");
        }
    }

    #[test]
    fn classes_cover_64_kib_to_8_mib_in_powers_of_two() {
        assert_eq!(class_of(1000), None, "small reads take a plain buffer");
        assert_eq!(class_of(32 << 10), Some(0));
        assert_eq!(class_of(64 << 10), Some(0));
        assert_eq!(class_of((64 << 10) + 1), Some(1));
        assert_eq!(class_of(4 << 20), Some(6));
        assert_eq!(class_of(8 << 20), Some(7));
        assert_eq!(class_of((8 << 20) + 1), None, "large reads take a plain buffer");
    }

    fn held(pool: &Pool, class: usize) -> usize {
        pool.free[class].len()
    }

    #[test]
    fn a_pool_full_of_large_buffers_still_keeps_small_ones() {
        let mut pool = Pool { free: [const { Vec::new() }; CLASSES], idle_bytes: 0 };
        let big = class_of(4 << 20).expect("a class");
        let small = class_of(64 << 10).expect("a class");
        for _ in 0..IDLE_BYTES_MAX / (4 << 20) {
            pool.give_back(big, vec![0; 4 << 20]);
        }
        assert_eq!(pool.idle_bytes, IDLE_BYTES_MAX, "the budget is full of 4 MiB buffers");
        let full = held(&pool, big);

        pool.give_back(small, vec![0; 64 << 10]);
        assert_eq!(held(&pool, small), 1, "a small buffer is kept");
        assert_eq!(held(&pool, big), full - 1, "by dropping one idle large buffer");
        assert!(pool.idle_bytes <= IDLE_BYTES_MAX);

        // The fullest class is the large one still: a large buffer given back now is dropped.
        pool.give_back(big, vec![0; 4 << 20]);
        assert_eq!(held(&pool, big), full - 1);
        // Small buffers fill the room the dropped large one left before any other goes.
        for _ in 1..(4 << 20) / (64 << 10) {
            pool.give_back(small, vec![0; 64 << 10]);
        }
        assert_eq!(held(&pool, big), full - 1);
        assert_eq!(pool.idle_bytes, IDLE_BYTES_MAX);
        let total: usize = pool.free.iter().flatten().map(Vec::len).sum();
        assert_eq!(total, pool.idle_bytes, "idle bytes are counted exactly");

        assert_eq!(pool.release(), IDLE_BYTES_MAX, "releasing drops every idle buffer");
        assert_eq!((held(&pool, big), held(&pool, small), pool.idle_bytes), (0, 0, 0));
        pool.give_back(small, vec![0; 64 << 10]);
        assert_eq!((held(&pool, small), pool.idle_bytes), (1, 64 << 10), "and fills again");
    }
}
