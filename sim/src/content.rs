//! Object contents as a pure function of `(object, offset)`, backed by one shared noise buffer so
//! that every block is a zero-copy [`Bytes`] slice of it.
//!
//! Block `b` of object `o` is the window of the noise buffer that starts at `base(o, b)`, a hash of
//! the object's salt and the block index. Distinct blocks start at distinct places with
//! overwhelming probability, so a block delivered for the wrong index or object does not compare
//! equal. A 100-node cluster reading a 1 GiB object therefore holds one small buffer, not 100 GiB,
//! and checking a delivered slice is O(1) when it aliases the buffer at the expected address (it
//! is then the generator's bytes by construction) and a `memcmp` against the generator otherwise.

use bytes::Bytes;
use dart_core::hash::fmix64;
use dart_core::integrity::{xxh3_128, BlockDigest, BlockHasher};
use dart_core::registry::{DigestAlgorithm, Hasher};
use std::collections::BTreeMap;

/// Block sizes whose noise [`Contents::new`] keeps for the next run.
const NOISES_MAX: usize = 8;

/// Distinct block start positions in the noise buffer; a prime so that consecutive blocks spread.
const NOISE_SPAN: u64 = (1 << 20) + 7;

/// A simulated object: its size and the salt that makes its bytes its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectShape {
    /// Size in bytes.
    pub size: u64,
    /// Distinguishes the bytes of different objects.
    pub salt: u64,
}

/// The simulator's block hasher: the digests [`dart_core::integrity::xxh3_128`] gives, but a
/// block that is a slice of the generator's buffer is hashed once per process and looked up after
/// (every block of a run is such a slice unless it was copied, so a block relayed down a tree of
/// 100 nodes is hashed once, not at every hop, and a sweep of many runs hashes each slice once,
/// not once per run). Any other block is hashed in full.
#[derive(Debug)]
pub struct SimHasher {
    noise: Bytes,
}

/// Digests of noise slices by offset and length, shared by every [`SimHasher`] of the process:
/// byte `i` of the noise is the same whatever the buffer's length ([`Contents::new`] extends one
/// fixed sequence), so a slice's bytes, and its digest, depend on its offset and length alone.
static MEMO: std::sync::Mutex<BTreeMap<(usize, usize), BlockDigest>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Slices remembered before the memo starts again ([`remembered`]).
const MEMO_MAX: usize = 1 << 20;

impl SimHasher {
    /// A hasher for the blocks `contents` generates.
    pub fn new(contents: &Contents) -> Self {
        SimHasher { noise: contents.noise.clone() }
    }
}

impl BlockHasher for SimHasher {
    fn digest(&self, block: &Bytes) -> BlockDigest {
        let base = self.noise.as_ptr() as usize;
        let at = block.as_ptr() as usize;
        if block.is_empty() || at < base || at + block.len() > base + self.noise.len() {
            return xxh3_128(block);
        }
        remembered(&MEMO, MEMO_MAX, (at - base, block.len()), || xxh3_128(block))
    }
}

/// `memo`'s value for `key`, computed by `make` (outside the lock: runs on other threads look up
/// their own keys meanwhile) and remembered when absent; past `max` entries the memo starts
/// again, which bounds its memory in a long sweep.
fn remembered<K: Ord, V: Clone>(
    memo: &std::sync::Mutex<BTreeMap<K, V>>,
    max: usize,
    key: K,
    make: impl FnOnce() -> V,
) -> V {
    let lock = || memo.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(value) = lock().get(&key) {
        return value.clone();
    }
    let value = make();
    let mut memo = lock();
    if memo.len() >= max {
        memo.clear();
    }
    memo.insert(key, value.clone());
    value
}

/// Where a delivered slice first differs from the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// Absolute offset of the first wrong byte (or of the first byte past the object).
    pub offset: u64,
}

/// The generator and checker of object bytes for one block size.
#[derive(Clone, Debug)]
pub struct Contents {
    noise: Bytes,
    block_bytes: u64,
}

impl Contents {
    /// Generator for blocks of `block_bytes` bytes; the noise is fixed (seed-independent), so the
    /// bytes of an object depend on its salt alone.
    ///
    /// The noise of a block size is made once per process and shared by every run that uses it
    /// (at most [`NOISES_MAX`] sizes are kept): it is a fixed sequence, and a run of 4 MiB blocks
    /// spent a few milliseconds making its 5 MiB again.
    pub fn new(block_bytes: u64) -> Self {
        assert!(block_bytes > 0);
        static NOISES: std::sync::Mutex<BTreeMap<u64, Bytes>> =
            std::sync::Mutex::new(BTreeMap::new());
        let mut noises = NOISES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(noise) = noises.get(&block_bytes) {
            return Contents { noise: noise.clone(), block_bytes };
        }
        let len = usize::try_from(NOISE_SPAN + block_bytes).expect("noise fits memory");
        let mut noise = Vec::with_capacity(len + 8);
        let mut word = 0u64;
        while noise.len() < len {
            word = word.wrapping_add(0x9E37_79B9_7F4A_7C15);
            noise.extend_from_slice(&fmix64(word).to_le_bytes());
        }
        noise.truncate(len);
        let noise = Bytes::from(noise);
        if noises.len() >= NOISES_MAX {
            noises.clear();
        }
        noises.insert(block_bytes, noise.clone());
        Contents { noise, block_bytes }
    }

    /// The block size this generator slices by.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    fn base(&self, object: ObjectShape, block: u64) -> usize {
        let h = fmix64(object.salt ^ block.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        usize::try_from(h % NOISE_SPAN).expect("span fits usize")
    }

    /// The byte at `offset` of `object` (the specification every check compares against).
    pub fn byte_at(&self, object: ObjectShape, offset: u64) -> u8 {
        let block = offset / self.block_bytes;
        let within = usize::try_from(offset % self.block_bytes).expect("block fits usize");
        self.noise[self.base(object, block) + within]
    }

    /// Bytes `start..start + len` of `object`, clamped to the object: a zero-copy slice when the
    /// window lies in one block, else a fresh buffer.
    pub fn window(&self, object: ObjectShape, start: u64, len: u64) -> Bytes {
        let end = start.saturating_add(len).min(object.size);
        if start >= end {
            return Bytes::new();
        }
        let block = start / self.block_bytes;
        if (end - 1) / self.block_bytes == block {
            let from = self.base(object, block) + (start % self.block_bytes) as usize;
            return self.noise.slice(from..from + (end - start) as usize);
        }
        let mut out = Vec::with_capacity((end - start) as usize);
        let mut at = start;
        while at < end {
            let block_end = ((at / self.block_bytes) + 1) * self.block_bytes;
            let piece = self.window(object, at, block_end.min(end) - at);
            out.extend_from_slice(&piece);
            at += piece.len() as u64;
        }
        Bytes::from(out)
    }

    /// Whether `data` is the generator's own handle on bytes `start..start + data.len()` of
    /// `object` (within one block; a pointer comparison, no byte is read).
    pub fn aliases(&self, object: ObjectShape, start: u64, data: &[u8]) -> bool {
        let len = data.len() as u64;
        if len == 0 || start.saturating_add(len) > object.size {
            return false;
        }
        let block = start / self.block_bytes;
        if (start + len - 1) / self.block_bytes != block {
            return false;
        }
        let from = self.base(object, block) + (start % self.block_bytes) as usize;
        data.as_ptr() as usize == self.noise.as_ptr() as usize + from
    }

    /// Checks that `data` is exactly bytes `start..start + data.len()` of `object`.
    pub fn check(&self, object: ObjectShape, start: u64, data: &Bytes) -> Result<(), Mismatch> {
        let len = data.len() as u64;
        if start.saturating_add(len) > object.size {
            return Err(Mismatch { offset: object.size.max(start) });
        }
        if len == 0 {
            return Ok(());
        }
        let block = start / self.block_bytes;
        if (start + len - 1) / self.block_bytes == block {
            let from = self.base(object, block) + (start % self.block_bytes) as usize;
            // Aliasing the generator's buffer at the expected place proves the bytes.
            if data.as_ptr() as usize == self.noise.as_ptr() as usize + from {
                return Ok(());
            }
            let want = &self.noise[from..from + data.len()];
            return match want.iter().zip(data.iter()).position(|(a, b)| a != b) {
                None => Ok(()),
                Some(i) => Err(Mismatch { offset: start + i as u64 }),
            };
        }
        let mut at = 0usize;
        while at < data.len() {
            let abs = start + at as u64;
            let block_end = ((abs / self.block_bytes) + 1) * self.block_bytes;
            let n = ((block_end - abs) as usize).min(data.len() - at);
            self.check(object, abs, &data.slice(at..at + n))?;
            at += n;
        }
        Ok(())
    }
}

/// The transport's digest of a response body ([`dart_core::node::Output::Hash`]), as the
/// simulator computes it: while every part is the generator's bytes of one object, in order (the
/// simulator checks each delivered part against the generator before it counts it), only the
/// span is kept, and the seal hashes the span from the generator, once per process for each span
/// (a registry herd seals the same blob at every node); any other part makes it hash the bytes
/// as they come. Either way the digest is that of exactly the bytes delivered.
#[derive(Clone, Debug)]
pub enum BodyHash {
    /// Every part so far was the generator's: bytes `from..from + len` of `shape` (`None`: no
    /// part yet).
    Span {
        /// The algorithm.
        algorithm: DigestAlgorithm,
        /// The object and the bytes of it delivered.
        span: Option<(ObjectShape, u64, u64)>,
    },
    /// Hashing every byte as it comes.
    Bytes(Hasher),
}

/// Digests of generated spans by algorithm, block size, object and span: the bytes of a span
/// depend on these alone ([`Contents::new`]'s noise is fixed), so runs share them.
type SpanKey = (bool, u64, ObjectShape, u64, u64);
static SPAN_DIGESTS: std::sync::Mutex<BTreeMap<SpanKey, Vec<u8>>> =
    std::sync::Mutex::new(BTreeMap::new());

/// Spans remembered before the memo starts again.
const SPAN_DIGESTS_MAX: usize = 4096;

impl BodyHash {
    /// A digest of no byte yet.
    pub fn new(algorithm: DigestAlgorithm) -> Self {
        BodyHash::Span { algorithm, span: None }
    }

    /// The next part is `len` bytes of `shape` from `start`, checked against `contents`.
    pub fn generated(&mut self, contents: &Contents, shape: ObjectShape, start: u64, data: &[u8]) {
        let len = data.len() as u64;
        if let BodyHash::Span { span, .. } = self {
            match span {
                None => {
                    *span = Some((shape, start, len));
                    return;
                }
                Some((s, from, n)) if *s == shape && *from + *n == start => {
                    *n += len;
                    return;
                }
                Some(_) => {}
            }
        }
        self.bytes(contents, data);
    }

    /// The next part is `data`, whatever it is.
    pub fn bytes(&mut self, contents: &Contents, data: &[u8]) {
        if let BodyHash::Span { algorithm, span } = self {
            let mut hasher = Hasher::new(*algorithm);
            if let Some((shape, from, len)) = *span {
                hasher.update(&contents.window(shape, from, len));
            }
            *self = BodyHash::Bytes(hasher);
        }
        let BodyHash::Bytes(hasher) = self else { unreachable!("hashing bytes now") };
        hasher.update(data);
    }

    /// The digest of every byte.
    pub fn finish(self, contents: &Contents) -> Vec<u8> {
        match self {
            BodyHash::Bytes(hasher) => hasher.finish(),
            BodyHash::Span { algorithm, span: None } => Hasher::new(algorithm).finish(),
            BodyHash::Span { algorithm, span: Some((shape, from, len)) } => {
                let key =
                    (algorithm == DigestAlgorithm::Sha256, contents.block_bytes, shape, from, len);
                remembered(&SPAN_DIGESTS, SPAN_DIGESTS_MAX, key, || {
                    let mut hasher = Hasher::new(algorithm);
                    hasher.update(&contents.window(shape, from, len));
                    hasher.finish()
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJ: ObjectShape = ObjectShape { size: 1000, salt: 7 };

    #[test]
    fn a_body_hash_is_the_digest_of_the_bytes_delivered_however_they_came() {
        let contents = Contents::new(64);
        let shape = ObjectShape { size: 1000, salt: 99 };
        let sha = |parts: &[&[u8]]| {
            let mut h = Hasher::new(DigestAlgorithm::Sha256);
            parts.iter().for_each(|p| h.update(p));
            h.finish()
        };
        let part = |from: u64, len: u64| contents.window(shape, from, len);
        let (a, b, c) = (part(0, 100), part(100, 250), part(350, 650));
        // The generator's bytes in order: a span, hashed at the seal (twice: the memo).
        for _ in 0..2 {
            let mut h = BodyHash::new(DigestAlgorithm::Sha256);
            for (at, p) in [(0, &a), (100, &b), (350, &c)] {
                h.generated(&contents, shape, at, p);
            }
            assert!(matches!(h, BodyHash::Span { .. }));
            assert_eq!(h.finish(&contents), sha(&[&a, &b, &c]));
        }
        // A gap, another object, or bytes of no span: hashed as they come, the same digest.
        let mut gap = BodyHash::new(DigestAlgorithm::Sha256);
        gap.generated(&contents, shape, 0, &a);
        gap.generated(&contents, shape, 350, &c);
        assert!(matches!(gap, BodyHash::Bytes(_)));
        assert_eq!(gap.finish(&contents), sha(&[&a, &c]));
        let other = ObjectShape { size: 1000, salt: 100 };
        let d = contents.window(other, 100, 250);
        let mut mixed = BodyHash::new(DigestAlgorithm::Sha512);
        mixed.generated(&contents, shape, 0, &a);
        mixed.generated(&contents, other, 100, &d);
        mixed.bytes(&contents, b"error text");
        let mut want = Hasher::new(DigestAlgorithm::Sha512);
        [&a[..], &d[..], b"error text"].iter().for_each(|p| want.update(p));
        assert_eq!(mixed.finish(&contents), want.finish());
        assert_eq!(BodyHash::new(DigestAlgorithm::Sha256).finish(&contents), sha(&[]));
    }

    #[test]
    fn windows_inside_one_block_alias_the_noise_and_check_in_constant_time() {
        let c = Contents::new(64);
        let w = c.window(OBJ, 130, 20);
        assert_eq!(w.len(), 20);
        for (i, b) in w.iter().enumerate() {
            assert_eq!(*b, c.byte_at(OBJ, 130 + i as u64));
        }
        assert_eq!(c.check(OBJ, 130, &w), Ok(()));
        assert_eq!(c.check(OBJ, 130, &Bytes::copy_from_slice(&w)), Ok(()), "copies compare");
        assert!(c.aliases(OBJ, 130, &w) && c.aliases(OBJ, 135, &w.slice(5..)));
        assert!(!c.aliases(OBJ, 130, &Bytes::copy_from_slice(&w)) && !c.aliases(OBJ, 131, &w));
    }

    #[test]
    fn the_sim_hasher_gives_the_digests_of_the_bytes_for_slices_and_copies_alike() {
        let c = Contents::new(64);
        let hasher = SimHasher::new(&c);
        let w = c.window(OBJ, 130, 20);
        let copy = Bytes::copy_from_slice(&w);
        assert_eq!(hasher.digest(&w), xxh3_128(&w));
        assert_eq!(hasher.digest(&w), hasher.digest(&copy), "remembered or not, the same");
        let mut flipped = copy.to_vec();
        flipped[3] ^= 1;
        assert_ne!(hasher.digest(&Bytes::from(flipped)), hasher.digest(&w));
        assert_eq!(hasher.digest(&w.slice(1..)), xxh3_128(&w[1..]), "another slice, its own");
    }

    #[test]
    fn noise_slices_are_the_same_bytes_whatever_the_block_size_so_one_memo_serves_every_run() {
        let small = Contents::new(64);
        let big = Contents::new(1 << 20);
        let n = small.noise.len();
        assert_eq!(small.noise[..], big.noise[..n], "one sequence, extended");
        let (a, b) = (SimHasher::new(&small), SimHasher::new(&big));
        for (at, len) in [(0, 64), (4096, 64), (n - 64, 64), (17, 1000)] {
            let (x, y) = (small.noise.slice(at..at + len), big.noise.slice(at..at + len));
            assert_eq!(a.digest(&x), xxh3_128(&x));
            assert_eq!(b.digest(&y), xxh3_128(&y), "remembered from the other run, still right");
        }
        let past = big.noise.slice(n..n + 64);
        assert_eq!(b.digest(&past), xxh3_128(&past));
    }

    #[test]
    fn a_block_delivered_at_the_wrong_index_or_object_is_caught() {
        let c = Contents::new(64);
        let b3 = c.window(OBJ, 3 * 64, 64);
        assert!(c.check(OBJ, 4 * 64, &b3).is_err());
        let other = ObjectShape { size: 1000, salt: 8 };
        assert!(c.check(other, 3 * 64, &b3).is_err());
    }

    #[test]
    fn a_corrupted_byte_is_located() {
        let c = Contents::new(64);
        let mut v = c.window(OBJ, 0, 64).to_vec();
        v[17] ^= 1;
        assert_eq!(c.check(OBJ, 0, &Bytes::from(v)), Err(Mismatch { offset: 17 }));
    }

    #[test]
    fn windows_across_blocks_are_assembled_and_clamped_to_the_object() {
        let c = Contents::new(64);
        let w = c.window(OBJ, 60, 2000);
        assert_eq!(w.len(), 940);
        assert_eq!(c.check(OBJ, 60, &w), Ok(()));
        assert!(c.check(OBJ, 61, &w).is_err());
        assert!(c.check(OBJ, 990, &Bytes::from(vec![0u8; 20])).is_err(), "past the end");
    }
}
