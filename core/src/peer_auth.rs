//! Peer-plane authentication with a cluster secret: every peer request carries
//! `X-DART-Auth: v1 <unix-seconds> <hex HMAC-SHA256>` over the request's method, path (with its
//! query), `X-DART-Hop`, `X-DART-Origin`, `X-DART-Node`, `X-DART-Peer-Addr`, the timestamp and,
//! for a request with a body (a tracker `POST`), the body's SHA-256. A
//! receiver with the same secret recomputes it and compares in constant time
//! (`ring::hmac::verify`), and refuses a timestamp further than the allowed skew from its own
//! wall clock.
//!
//! What it guarantees: a caller without the secret can neither make a node fetch for it (relay),
//! nor be learned as a member, nor read blocks through the peer plane; a captured request cannot
//! be altered (any covered field) or replayed after the skew window. What it does not: it does
//! not encrypt (block bytes cross the network in the clear: encrypt at the network layer), and a
//! captured request can be replayed verbatim within the skew window (it is an idempotent `GET`
//! that gains the replayer the same block the original caller got).
//!
//! Wall-clock time is an input like every other time: the caller passes the Unix time in
//! seconds.

use ring::hmac;
use std::fmt;
use std::time::Duration;

/// The header carrying the MAC.
pub const HEADER_AUTH: &str = "x-dart-auth";
/// The scheme tag of the current MAC format.
const VERSION: &str = "v1";
/// Shortest secret accepted, in bytes.
pub const SECRET_MIN: usize = 16;
/// Default largest difference between the sender's and the receiver's wall clocks.
pub const DEFAULT_SKEW: Duration = Duration::from_secs(30);

/// The cluster secret, as an HMAC-SHA256 key. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct ClusterSecret {
    key: hmac::Key,
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

/// Why a secret was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// Fewer than [`SECRET_MIN`] bytes after trimming surrounding whitespace.
    #[error("the cluster secret must have at least {SECRET_MIN} bytes, got {0}")]
    TooShort(usize),
}

impl ClusterSecret {
    /// A secret from the contents of a secret file: surrounding ASCII whitespace (a trailing
    /// newline) is not part of it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SecretError> {
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < SECRET_MIN {
            return Err(SecretError::TooShort(trimmed.len()));
        }
        Ok(ClusterSecret { key: hmac::Key::new(hmac::HMAC_SHA256, trimmed) })
    }
}

/// The fields of a peer request that the MAC covers. An absent header and an empty one are the
/// same.
#[derive(Clone, Copy, Debug, Default)]
pub struct Covered<'a> {
    /// `GET`.
    pub method: &'a str,
    /// The request-target: path and query.
    pub target: &'a str,
    /// `X-DART-Hop`.
    pub hop: &'a [u8],
    /// `X-DART-Origin`.
    pub origin: &'a [u8],
    /// `X-DART-Node`.
    pub node: &'a [u8],
    /// `X-DART-Peer-Addr`.
    pub peer_addr: &'a [u8],
    /// The request body (empty for a `GET`; then it adds nothing to the MAC, so the MAC of a
    /// body-less request is what it was before bodies were covered).
    pub body: &'a [u8],
}

impl Covered<'_> {
    /// The bytes the MAC is computed over: a domain tag, then every field length-prefixed (so no
    /// two field lists share an encoding), the timestamp last.
    fn message(&self, unix_secs: u64) -> Vec<u8> {
        let ts = unix_secs.to_string();
        let fields: [&[u8]; 7] = [
            self.method.as_bytes(),
            self.target.as_bytes(),
            self.hop,
            self.origin,
            self.node,
            self.peer_addr,
            ts.as_bytes(),
        ];
        let digest;
        let body: &[&[u8]] = if self.body.is_empty() {
            &[]
        } else {
            digest = ring::digest::digest(&ring::digest::SHA256, self.body);
            &[digest.as_ref()]
        };
        const TAG: &[u8] = b"dart-peer-auth-v1";
        // Sized at once: this runs for every peer request sent and received.
        let len = fields.iter().chain(body).map(|f| 8 + f.len()).sum::<usize>();
        let mut message = Vec::with_capacity(TAG.len() + len);
        message.extend_from_slice(TAG);
        for field in fields.iter().chain(body) {
            message.extend_from_slice(&(field.len() as u64).to_be_bytes());
            message.extend_from_slice(field);
        }
        message
    }

    /// The `X-DART-Auth` value for these fields at `unix_secs`.
    pub fn sign(&self, secret: &ClusterSecret, unix_secs: u64) -> String {
        let tag = hmac::sign(&secret.key, &self.message(unix_secs));
        let mut out = format!("{VERSION} {unix_secs} ");
        for b in tag.as_ref() {
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
        }
        out
    }

    /// Checks `header` (the request's `X-DART-Auth`) against these fields at the receiver's
    /// `now_unix_secs`, allowing `skew` either way. The MAC is compared in constant time.
    pub fn verify(
        &self,
        secret: &ClusterSecret,
        header: Option<&[u8]>,
        now_unix_secs: u64,
        skew: Duration,
    ) -> Result<(), AuthRefusal> {
        let header = header.ok_or(AuthRefusal::Missing)?;
        let text = std::str::from_utf8(header).map_err(|_| AuthRefusal::Malformed)?;
        let mut parts = text.split(' ');
        let (Some(VERSION), Some(ts), Some(mac), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(AuthRefusal::Malformed);
        };
        let ts: u64 = ts.parse().map_err(|_| AuthRefusal::Malformed)?;
        let mac = decode_hex(mac).ok_or(AuthRefusal::Malformed)?;
        if ts.abs_diff(now_unix_secs) > skew.as_secs() {
            return Err(AuthRefusal::Expired);
        }
        hmac::verify(&secret.key, &self.message(ts), &mac).map_err(|_| AuthRefusal::BadMac)
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

/// Why a peer request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AuthRefusal {
    /// No `X-DART-Auth`.
    Missing,
    /// Not `v1 <seconds> <64 hex digits>`.
    Malformed,
    /// The timestamp is further than the skew from this node's clock (a replay, or clocks
    /// apart).
    Expired,
    /// The MAC does not match the request (another secret, or an altered request).
    BadMac,
}

impl AuthRefusal {
    /// Every reason, in label order.
    pub const ALL: [AuthRefusal; 4] =
        [AuthRefusal::Missing, AuthRefusal::Malformed, AuthRefusal::Expired, AuthRefusal::BadMac];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            AuthRefusal::Missing => "missing",
            AuthRefusal::Malformed => "malformed",
            AuthRefusal::Expired => "expired",
            AuthRefusal::BadMac => "bad_mac",
        }
    }
}

impl fmt::Display for AuthRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::from_bytes(s.as_bytes()).expect("secret")
    }

    fn request() -> Covered<'static> {
        Covered {
            method: "GET",
            target: "/peer/v1/block/00ab/3",
            hop: b"1",
            origin: b"http://origin/o?sig=1",
            node: b"node-a",
            peer_addr: b"10.0.0.1:9000",
            body: b"",
        }
    }

    const NOW: u64 = 1_800_000_000;

    #[test]
    fn a_signed_request_verifies_and_its_debug_hides_the_key() {
        let s = secret("0123456789abcdef-cluster");
        let header = request().sign(&s, NOW);
        assert!(header.starts_with("v1 1800000000 "), "{header}");
        assert_eq!(header.len(), "v1 1800000000 ".len() + 64);
        assert_eq!(request().verify(&s, Some(header.as_bytes()), NOW + 29, DEFAULT_SKEW), Ok(()));
        assert_eq!(request().verify(&s, Some(header.as_bytes()), NOW - 30, DEFAULT_SKEW), Ok(()));
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }

    #[test]
    fn a_missing_malformed_stale_or_foreign_mac_is_refused() {
        let s = secret("0123456789abcdef-cluster");
        let header = request().sign(&s, NOW);
        let verify = |h: Option<&[u8]>, now| request().verify(&s, h, now, DEFAULT_SKEW);
        assert_eq!(verify(None, NOW), Err(AuthRefusal::Missing));
        for bad in ["", "v1", "v2 1 00", "v1 x 00", "v1 1 zz", "v1 1800000000 abcd"] {
            assert_eq!(verify(Some(bad.as_bytes()), NOW), Err(AuthRefusal::Malformed), "{bad}");
        }
        assert_eq!(verify(Some(header.as_bytes()), NOW + 31), Err(AuthRefusal::Expired));
        assert_eq!(verify(Some(header.as_bytes()), NOW - 31), Err(AuthRefusal::Expired));
        let other = request().sign(&secret("another-secret-of-16+"), NOW);
        assert_eq!(verify(Some(other.as_bytes()), NOW), Err(AuthRefusal::BadMac));
        let mut flipped = header.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(verify(Some(&flipped), NOW), Err(AuthRefusal::BadMac));
        // A later timestamp with the old MAC.
        let moved = header.replace("1800000000", "1800000001");
        assert_eq!(verify(Some(moved.as_bytes()), NOW), Err(AuthRefusal::BadMac));
    }

    #[test]
    fn every_covered_field_is_bound_by_the_mac() {
        let s = secret("0123456789abcdef-cluster");
        let header = request().sign(&s, NOW);
        let mutations: [Covered<'static>; 7] = [
            Covered { method: "HEAD", ..request() },
            Covered { target: "/peer/v1/block/00ab/4", ..request() },
            Covered { hop: b"0", ..request() },
            Covered { origin: b"http://169.254.169.254/", ..request() },
            Covered { node: b"node-b", ..request() },
            Covered { peer_addr: b"10.0.0.9:9000", ..request() },
            Covered { body: b"{}", ..request() },
        ];
        for m in mutations {
            let r = m.verify(&s, Some(header.as_bytes()), NOW, DEFAULT_SKEW);
            assert_eq!(r, Err(AuthRefusal::BadMac), "{m:?}");
        }
        // Field boundaries are unambiguous: moving bytes between fields changes the MAC.
        let a = Covered { hop: b"1", origin: b"2", ..request() }.sign(&s, NOW);
        let b = Covered { hop: b"12", origin: b"", ..request() }.sign(&s, NOW);
        assert_ne!(a, b);
        // A body is bound too: another body under the same MAC is refused.
        let post = Covered { method: "POST", body: br#"{"file":"a"}"#, ..request() };
        let signed = post.sign(&s, NOW);
        assert_eq!(post.verify(&s, Some(signed.as_bytes()), NOW, DEFAULT_SKEW), Ok(()));
        let other = Covered { body: br#"{"file":"b"}"#, ..post };
        let r = other.verify(&s, Some(signed.as_bytes()), NOW, DEFAULT_SKEW);
        assert_eq!(r, Err(AuthRefusal::BadMac));
    }

    #[test]
    fn an_empty_body_leaves_the_mac_of_a_get_as_it_was() {
        // The v1 value of `request()` before bodies were covered: old and new nodes agree on
        // every body-less request.
        let s = secret("0123456789abcdef-cluster");
        insta::assert_snapshot!(request().sign(&s, NOW));
    }

    #[test]
    fn a_short_secret_is_refused_and_whitespace_is_trimmed() {
        assert_eq!(
            ClusterSecret::from_bytes(b"short\n").map(|_| ()),
            Err(SecretError::TooShort(5))
        );
        let a = secret("0123456789abcdef");
        let b = ClusterSecret::from_bytes(b"  0123456789abcdef\n").expect("secret");
        assert_eq!(request().sign(&a, NOW), request().sign(&b, NOW));
    }
}
