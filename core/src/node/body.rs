//! A response body gathered in order without copying when it arrives in one part.
//!
//! Transports hand a body over in parts. Most drivers' parts are small (a socket's reads) and are
//! copied into one buffer, but a body that arrives whole in one part (an in-memory transport, the
//! simulator, a large read) is kept as the handle it came in: a block fetched whole is then stored
//! and served without a copy, and blocks that alias one buffer stay shared.

use bytes::{Bytes, BytesMut};
use std::ops::Range;

/// Body bytes so far; see the module doc.
#[derive(Debug, Default)]
pub(super) struct BodyBuf {
    /// The bytes, while they came in at most one part.
    one: Option<Bytes>,
    /// The bytes, once a second part came.
    many: Option<BytesMut>,
    /// Bytes to reserve when a second part makes a buffer necessary.
    reserve: usize,
}

impl BodyBuf {
    /// An empty body that reserves `reserve` bytes if it ever needs a buffer.
    pub fn with_reserve(reserve: usize) -> Self {
        BodyBuf { one: None, many: None, reserve }
    }

    /// Sets how much a buffer reserves, if one is ever needed.
    pub fn reserve(&mut self, reserve: usize) {
        self.reserve = reserve;
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        match (&self.one, &self.many) {
            (_, Some(m)) => m.len(),
            (Some(b), None) => b.len(),
            (None, None) => 0,
        }
    }

    /// Appends `data`.
    pub fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        if let Some(m) = &mut self.many {
            m.extend_from_slice(&data);
            return;
        }
        match self.one.take() {
            None => self.one = Some(data),
            Some(first) => {
                let mut m = BytesMut::with_capacity(self.reserve.max(first.len() + data.len()));
                m.extend_from_slice(&first);
                m.extend_from_slice(&data);
                self.many = Some(m);
            }
        }
    }

    /// Bytes `range` (a handle on the part when there is one, a copy otherwise).
    pub fn slice(&self, range: Range<usize>) -> Bytes {
        match (&self.one, &self.many) {
            (_, Some(m)) => Bytes::copy_from_slice(&m[range]),
            (Some(b), None) => b.slice(range),
            (None, None) => Bytes::new().slice(range),
        }
    }

    /// Whether the first `len` bytes held are the first `len` bytes of `other` (false when
    /// either holds fewer).
    pub fn starts_like(&self, len: usize, other: &[u8]) -> bool {
        let held: &[u8] = match (&self.one, &self.many) {
            (_, Some(m)) => m,
            (Some(b), None) => b,
            (None, None) => &[],
        };
        held.len() >= len && other.len() >= len && held[..len] == other[..len]
    }

    /// Every byte, leaving the body empty.
    pub fn take(&mut self) -> Bytes {
        match (self.one.take(), self.many.take()) {
            (_, Some(m)) => m.freeze(),
            (Some(b), None) => b,
            (None, None) => Bytes::new(),
        }
    }
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
}
