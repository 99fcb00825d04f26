//! A response body gathered in order without copying when it arrives in one part.
//!
//! Transports hand a body over in parts. Most drivers' parts are small (a socket's reads) and are
//! copied into one buffer from [`crate::bufpool`] (reused once the block it held is dropped), but a body that arrives whole in one part (an in-memory transport, the
//! simulator, a large read) is kept as the handle it came in: a block fetched whole is then stored
//! and served without a copy, and blocks that alias one buffer stay shared.

use crate::bufpool::Buf;
use crate::integrity::{BlockDigest, DigestStream};
use bytes::Bytes;
use std::ops::Range;

/// Body bytes so far; see the module doc.
#[derive(Debug, Default)]
pub(super) struct BodyBuf {
    /// The bytes, while they came in at most one part.
    one: Option<Bytes>,
    /// The bytes, once a second part came: a pooled buffer ([`crate::bufpool`]) and how much of
    /// it is written.
    many: Option<(Buf, usize)>,
    /// Bytes to reserve when a second part makes a buffer necessary (a hint, held in 32 bits so
    /// that the digest flag below costs the buffer no room: callers cap it at a few MiB).
    reserve: u32,
    /// Whether [`BodyBuf::digesting`] asked for the digest of a gathered body.
    wants_digest: bool,
    /// The digest of the bytes copied into `many` so far: made with `many`, when a body that
    /// wants one comes in a second part (a body kept as its one part never needs it).
    digest: Option<DigestStream>,
}

impl BodyBuf {
    /// An empty body that reserves `reserve` bytes if it ever needs a buffer.
    pub fn with_reserve(reserve: usize) -> Self {
        BodyBuf { one: None, many: None, reserve: hint(reserve), wants_digest: false, digest: None }
    }

    /// Hashes the body's bytes as they are copied into one buffer, so that
    /// [`BodyBuf::take_digested`] has their digest without reading them again (a body kept as
    /// the one part it came in is not hashed here: the node's hasher may know its digest). For a
    /// body whose digest will be needed: a block to store or to check. Call before the first part.
    pub fn digesting(&mut self) {
        debug_assert_eq!(self.len(), 0, "digesting starts before the first part");
        self.wants_digest = true;
    }

    /// Sets how much a buffer reserves, if one is ever needed.
    pub fn reserve(&mut self, reserve: usize) {
        self.reserve = hint(reserve);
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        match (&self.one, &self.many) {
            (_, Some((_, filled))) => *filled,
            (Some(b), None) => b.len(),
            (None, None) => 0,
        }
    }

    /// The bytes held, in order.
    fn held(&self) -> &[u8] {
        match (&self.one, &self.many) {
            (_, Some((buf, filled))) => &buf.as_ref()[..*filled],
            (Some(b), None) => b,
            (None, None) => &[],
        }
    }

    /// Appends `data`.
    pub fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        if self.many.is_none() {
            let Some(first) = self.one.take() else {
                self.one = Some(data);
                return;
            };
            let buf = Buf::take((self.reserve as usize).max(first.len() + data.len()));
            self.many = Some((buf, 0));
            if self.wants_digest {
                self.digest = Some(DigestStream::new());
            }
            self.append(&first);
        }
        self.append(&data);
    }

    /// Copies `data` after the bytes written, into a larger buffer if it does not fit.
    fn append(&mut self, data: &[u8]) {
        let (buf, filled) = self.many.as_mut().expect("a buffer once a second part came");
        let end = *filled + data.len();
        if end > buf.len() {
            let mut larger = Buf::take(end.max(2 * buf.len()));
            larger.as_mut_slice()[..*filled].copy_from_slice(&buf.as_ref()[..*filled]);
            *buf = larger;
        }
        buf.as_mut_slice()[*filled..end].copy_from_slice(data);
        *filled = end;
        if let Some(digest) = &mut self.digest {
            // The part was just read: hashed from the cache, not from memory.
            digest.update(data);
        }
    }

    /// Bytes `range` (a handle on the part when there is one, a copy otherwise).
    pub fn slice(&self, range: Range<usize>) -> Bytes {
        match &self.one {
            Some(b) if self.many.is_none() => b.slice(range),
            _ => Bytes::copy_from_slice(&self.held()[range]),
        }
    }

    /// Whether the first `len` bytes held are the first `len` bytes of `other` (false when
    /// either holds fewer).
    pub fn starts_like(&self, len: usize, other: &[u8]) -> bool {
        let held = self.held();
        held.len() >= len && other.len() >= len && held[..len] == other[..len]
    }

    /// Every byte, leaving the body empty.
    #[cfg(test)]
    pub fn take(&mut self) -> Bytes {
        self.take_digested().0
    }

    /// Every byte, leaving the body empty, and their digest when it was computed as they were
    /// gathered ([`BodyBuf::digesting`], a body that came in more than one part).
    pub fn take_digested(&mut self) -> (Bytes, Option<BlockDigest>) {
        let digest = self.digest.take().map(|d| d.finish());
        let data = match (self.one.take(), self.many.take()) {
            (_, Some((mut buf, filled))) => {
                buf.truncate(filled);
                buf.freeze()
            }
            (Some(b), None) => b,
            (None, None) => Bytes::new(),
        };
        (data, digest)
    }
}

/// A reserve as [`BodyBuf`] holds it (a larger one only reserves less: the buffer still grows).
fn hint(reserve: usize) -> u32 {
    u32::try_from(reserve).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_part_is_kept_as_it_came_and_more_are_joined_in_order() {
        let whole = Bytes::from_static(b"abcdef");
        let mut one = BodyBuf::with_reserve(6);
        one.push(whole.clone());
        assert_eq!(one.len(), 6);
        assert_eq!(one.slice(1..3).as_ptr(), whole[1..].as_ptr(), "a handle, not a copy");
        let got = one.take();
        assert_eq!(got.as_ptr(), whole.as_ptr());
        assert_eq!(one.len(), 0);
        let mut many = BodyBuf::default();
        for part in [&b"ab"[..], b"", b"cd", b"ef"] {
            many.push(Bytes::copy_from_slice(part));
        }
        assert_eq!((many.len(), &many.slice(1..5)[..]), (6, &b"bcde"[..]));
        assert_eq!(&many.take()[..], b"abcdef");
    }

    #[test]
    fn a_gathered_body_is_digested_as_it_comes_in_and_a_body_in_one_part_is_not() {
        let parts = [&b"abc"[..], b"", b"defgh", b"ijklmnopqrstuvwxyz"];
        let mut gathered = BodyBuf::with_reserve(4);
        gathered.digesting();
        for part in parts {
            gathered.push(Bytes::copy_from_slice(part));
        }
        let (data, digest) = gathered.take_digested();
        assert_eq!(&data[..], b"abcdefghijklmnopqrstuvwxyz");
        assert_eq!(digest, Some(crate::integrity::xxh3_128(&data)), "across a larger buffer too");
        let mut one = BodyBuf::default();
        one.digesting();
        one.push(Bytes::from_static(b"whole"));
        assert_eq!(one.take_digested(), (Bytes::from_static(b"whole"), None), "left to the hasher");
        let mut plain = BodyBuf::default();
        plain.push(Bytes::from_static(b"ab"));
        plain.push(Bytes::from_static(b"cd"));
        assert_eq!(plain.take_digested(), (Bytes::from_static(b"abcd"), None), "not asked for");
    }

    #[test]
    fn a_body_longer_than_its_reserve_moves_to_a_larger_buffer_in_order() {
        let seed = 0xb0d7_u64;
        println!("seed {seed}");
        let mut x = seed;
        let mut want = Vec::new();
        let mut body = BodyBuf::with_reserve(70_000);
        for _ in 0..40 {
            x = crate::hash::fmix64(x);
            let part: Vec<u8> = (0..(x % 9_000) as usize).map(|i| (x as usize + i) as u8).collect();
            want.extend_from_slice(&part);
            body.push(Bytes::from(part));
            assert_eq!(body.len(), want.len());
            assert!(body.starts_like(want.len(), &want));
        }
        assert!(want.len() > 70_000, "the parts outgrew the reserve");
        assert_eq!(&body.slice(5..want.len() - 5)[..], &want[5..want.len() - 5]);
        let mut other = want.clone();
        other[want.len() / 2] ^= 1;
        assert!(!body.starts_like(want.len(), &other));
        assert_eq!(&body.take()[..], &want[..]);
        assert_eq!(body.len(), 0);
    }
}
