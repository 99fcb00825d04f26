//! Read buffers for the arenas, reused. A disk read into a fresh buffer pays for zeroing it and,
//! for large ones, for fresh pages from the kernel; a pooled buffer was zeroed once and the read
//! overwrites the bytes it hands out. Buffers come in power-of-two classes from 64 KiB to 8 MiB
//! (smaller and larger reads use a plain buffer); a buffer goes back to its class when the last
//! [`Bytes`] handle on it is dropped, unless the pool already keeps [`IDLE_BYTES_MAX`] idle.

use std::sync::Mutex;

use bytes::Bytes;

/// The smallest class: 2^16 bytes. Reads below half of it take a plain buffer.
const MIN_SHIFT: u32 = 16;
/// The largest class: 2^23 bytes (8 MiB). Larger reads take a plain buffer.
const MAX_SHIFT: u32 = 23;
const CLASSES: usize = (MAX_SHIFT - MIN_SHIFT + 1) as usize;
/// Most bytes the pool keeps in idle buffers.
pub(crate) const IDLE_BYTES_MAX: usize = 64 << 20;

struct Pool {
    free: [Vec<Vec<u8>>; CLASSES],
    idle_bytes: usize,
}

static POOL: Mutex<Pool> =
    Mutex::new(Pool { free: [const { Vec::new() }; CLASSES], idle_bytes: 0 });

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    // The pool holds no invariant a panic could break halfway: keep using it.
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The class of a read of `len` bytes, if it takes a pooled buffer.
fn class_of(len: usize) -> Option<usize> {
    if !((1 << MIN_SHIFT) / 2..=1 << MAX_SHIFT).contains(&len) {
        return None;
    }
    let shift = len.next_power_of_two().trailing_zeros().max(MIN_SHIFT);
    Some((shift - MIN_SHIFT) as usize)
}

/// A buffer of `len` bytes to read into; its contents before the read are unspecified.
pub(crate) struct Buf {
    data: Vec<u8>,
    len: usize,
    class: Option<usize>,
}

impl Buf {
    /// A buffer for `len` bytes: an idle one of its class, else a new one.
    pub(crate) fn take(len: usize) -> Buf {
        let class = class_of(len);
        let reused = class.and_then(|c| {
            let mut pool = pool();
            let data = pool.free[c].pop()?;
            pool.idle_bytes -= data.len();
            Some(data)
        });
        let data = reused.unwrap_or_else(|| match class {
            Some(c) => vec![0; 1 << (c as u32 + MIN_SHIFT)],
            None => vec![0; len],
        });
        debug_assert!(data.len() >= len);
        Buf { data, len, class }
    }

    /// The `len` bytes to read into.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.data[..self.len]
    }

    /// The read bytes as a shared handle; the buffer returns to the pool with the last handle.
    pub(crate) fn freeze(mut self) -> Bytes {
        if self.class.is_none() {
            // A plain buffer of exactly `len` bytes: its own allocation, nothing to give back.
            return Bytes::from(std::mem::take(&mut self.data));
        }
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.data[..self.len]
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let Some(class) = self.class else { return };
        let data = std::mem::take(&mut self.data);
        let mut pool = pool();
        if pool.idle_bytes + data.len() <= IDLE_BYTES_MAX {
            pool.idle_bytes += data.len();
            pool.free[class].push(data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_buffer_hands_out_exactly_its_bytes_and_is_reused_after_its_last_handle() {
        let mut buf = Buf::take(100_000);
        buf.as_mut_slice().fill(7);
        let bytes = buf.freeze();
        assert_eq!(bytes.len(), 100_000);
        assert!(bytes.iter().all(|&b| b == 7));
        let ptr = bytes.as_ptr();
        let slice = bytes.slice(10..20);
        drop(bytes);
        // Still held by `slice`: a new buffer of the class is another one.
        let other = Buf::take(100_000);
        assert_ne!(other.as_ref().as_ptr(), ptr);
        drop(other);
        assert_eq!(&slice[..], &[7; 10]);
        drop(slice);
        // The class's idle buffers now include ours; one of them comes back.
        let mut seen = false;
        let mut held = Vec::new();
        for _ in 0..4 {
            let b = Buf::take(100_000);
            seen |= b.as_ref().as_ptr() == ptr;
            held.push(b);
        }
        assert!(seen, "the buffer went back to its class");
        let plain = Buf::take(10).freeze();
        assert_eq!(plain.len(), 10);
    }
}
