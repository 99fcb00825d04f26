//! Object identity from a URL (spec/geometry.md §2) and the chunk-key namespace.
//!
//! [`object_id`] maps a blob URL to the identity its chunk keys are derived from: a digest
//! (`content_addressed == true`) when one is recoverable from the path, otherwise a canonical URL
//! (lower-cased scheme and host, percent-decoded path, never the query or fragment). The query is
//! left out because a presigned signature changes on every request and is a credential.
//!
//! # The algorithm
//!
//! 1. If the URL parses (see below), the first of these that applies:
//!    - the first segment of the percent-decoded path that passes [`is_digest`], lower-cased;
//!    - with [`IdLayout::Distribution`] only, a segment `blobs` followed by `<algo>/<p>/<hex>`
//!      with `algo` ∈ {`sha256` (64 hex), `sha512` (128 hex)} (any case), `p` exactly the first
//!      two characters of `hex` (case-insensitively): `algo:hex`, lower-cased;
//!    - if the scheme or host is non-empty: `lower(scheme) + "://" + lower(host) + path`.
//! 2. Otherwise (no parse, or neither scheme nor host) the raw text before the first `?` or `#`
//!    is used: its first `/`-segment passing [`is_digest`], lower-cased, or else the text itself.
//!
//! Every derived id has the 0x1F field separator ([`FIELD_SEP`]) removed: it would make chunk
//! keys ambiguous, and a URL can smuggle one in as `%1F`.
//!
//! # Parsing, and where it knowingly differs from Go's `net/url.Parse`
//!
//! The parser is a small model of Go 1.22's `url.Parse`, which DART uses: a scheme
//! `[A-Za-z][A-Za-z0-9+.-]*:` (a leading `:` is an error; any other stray byte means "no
//! scheme"), a scheme-less first segment containing `:` is an error, `//authority` with the
//! userinfo dropped and the port kept, Go's host character set, numeric ports, `%`-escapes in the
//! host only for non-ASCII bytes (or `%25`), bracketed IPv6 with an optional zone, and a path
//! whose `%`-escapes must all be well formed. Control bytes (below 0x20, and 0x7F) fail a parse.
//! Deliberate differences, each costing at most a duplicate cache entry against a Go node:
//!
//! - The query and fragment are cut off *before* parsing, so nothing in them can change the
//!   identity. Go rejects control bytes in the query and bad escapes in the fragment, which would
//!   switch such a URL to the raw fallback (with its un-lower-cased host).
//! - Opaque forms (`scheme:rest` with `rest` not starting with `/`) count as unparseable and take
//!   the fallback. Go parses them with an empty path, so every `urn:…` would collapse into the
//!   one id `urn://`, and `sha256:<hex>` itself would not be recognised as a digest.
//! - Percent-decoding can produce bytes that are not UTF-8, but an id is a `String`: each such
//!   byte is written back as `%XX` (upper-case hex), which keeps distinct byte values distinct.
//!   Go keeps the raw bytes in the path, and writes U+FFFD for them in the host (its
//!   `strings.ToLower`) and in a path that also contained 0x1F (spec §2 step 3).
//! - IPv6 literals are not validated beyond Go 1.22's rules; later Go releases reject more
//!   malformed bracketed hosts.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::hash::FIELD_SEP;

/// The namespace used when none is configured.
pub const DEFAULT_NAMESPACE: &str = "dart";

/// Which URL shapes count as content-addressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IdLayout {
    /// OCI `…/blobs/<algo>:<hex>` paths and Docker Distribution's object-store layout
    /// `…/blobs/<algo>/<hex[0..2]>/<hex>/…` (presigned bucket URLs). The default.
    #[default]
    Distribution,
    /// Only `<algo>:<hex>` path segments (`-oci-digest-only`), for non-standard backing stores.
    OciOnly,
}

/// The caching identity of an object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    /// A lower-case digest `algo:hex`, or a canonical URL; never contains 0x1F.
    pub id: String,
    /// Whether `id` is a digest (the object is immutable and deduplicated across origins).
    pub content_addressed: bool,
}

impl ObjectId {
    fn digest(segment: &[u8]) -> Self {
        debug_assert!(is_digest_bytes(segment));
        let id = String::from_utf8_lossy(segment).to_ascii_lowercase();
        ObjectId { id, content_addressed: true }
    }

    /// The identity whose `id` is `id` (as a flight key carries it): content-addressed exactly
    /// when `id` is a digest.
    pub fn from_id(id: &str) -> Self {
        ObjectId { id: id.to_owned(), content_addressed: is_digest(id) }
    }

    fn located(text: &str) -> Self {
        Self::located_owned(text.to_owned())
    }

    /// [`ObjectId::located`] of a string the caller built (no copy when it holds no 0x1F).
    fn located_owned(mut id: String) -> Self {
        if id.as_bytes().contains(&FIELD_SEP) {
            id.retain(|c| c != char::from(FIELD_SEP));
        }
        ObjectId { id, content_addressed: false }
    }
}

/// Why a namespace was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NamespaceError {
    /// The namespace was the empty string.
    #[error("namespace must not be empty")]
    Empty,
    /// The namespace contains the chunk-key field separator.
    #[error("namespace must not contain the 0x1F field separator byte (found at byte {0})")]
    ContainsSeparator(usize),
}

/// A validated chunk-key namespace: non-empty and free of the 0x1F field separator.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Namespace(String);

impl Namespace {
    /// Validates `name`: it must be non-empty and must not contain 0x1F.
    pub fn new(name: &str) -> Result<Self, NamespaceError> {
        if name.is_empty() {
            return Err(NamespaceError::Empty);
        }
        if let Some(at) = name.bytes().position(|b| b == FIELD_SEP) {
            return Err(NamespaceError::ContainsSeparator(at));
        }
        Ok(Namespace(name.to_owned()))
    }

    /// The namespace text.
    pub fn as_str(&self) -> &str {
        debug_assert!(!self.0.is_empty() && !self.0.as_bytes().contains(&FIELD_SEP));
        &self.0
    }
}

/// The default namespace, [`DEFAULT_NAMESPACE`].
impl Default for Namespace {
    fn default() -> Self {
        Namespace(DEFAULT_NAMESPACE.to_owned())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Namespace {
    type Err = NamespaceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Namespace::new(s)
    }
}

/// Whether `s` has the digest shape `algo:hex`: `algo` non-empty `[a-z0-9]`, `hex` at least 32
/// characters of `[0-9a-fA-F]`.
pub fn is_digest(s: &str) -> bool {
    is_digest_bytes(s.as_bytes())
}

/// Minimum number of hex characters in a digest.
const DIGEST_HEX_MIN: usize = 32;

fn is_digest_bytes(s: &[u8]) -> bool {
    let Some(colon) = s.iter().position(|&b| b == b':') else {
        return false;
    };
    let (algo, hex) = (&s[..colon], &s[colon + 1..]);
    !algo.is_empty()
        && algo.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && hex.len() >= DIGEST_HEX_MIN
        && hex.iter().all(u8::is_ascii_hexdigit)
}

/// The identity of the object at `url` under `layout`; see the module docs for the rules.
///
/// Never panics, whatever the input; the id never contains 0x1F, and a content-addressed id
/// always passes [`is_digest`].
pub fn object_id(url: &str, layout: IdLayout) -> ObjectId {
    let base = &url[..url.find(['?', '#']).unwrap_or(url.len())];
    let object = match parse(base) {
        Some(parsed) => from_parsed(&parsed, layout).unwrap_or_else(|| fallback(base)),
        None => fallback(base),
    };
    debug_assert!(!object.id.as_bytes().contains(&FIELD_SEP), "0x1F in {:?}", object.id);
    debug_assert!(!object.content_addressed || is_digest(&object.id));
    debug_assert!(!object.content_addressed || object.id == object.id.to_ascii_lowercase());
    object
}

/// Step 1 on a parsed URL; `None` sends it to the fallback.
fn from_parsed(parsed: &Parsed<'_>, layout: IdLayout) -> Option<ObjectId> {
    let segments: Vec<&[u8]> = parsed.path.split(|&b| b == b'/').collect();
    if let Some(digest) = segments.iter().find(|s| is_digest_bytes(s)) {
        return Some(ObjectId::digest(digest));
    }
    if layout == IdLayout::Distribution {
        if let Some(id) = distribution_digest(&segments) {
            return Some(id);
        }
    }
    if parsed.scheme.is_empty() && parsed.host.is_empty() {
        return None;
    }
    let len = parsed.scheme.len() + 3 + parsed.host.len() + parsed.path.len();
    let mut canonical = String::with_capacity(len);
    canonical.extend(parsed.scheme.chars().map(|c| c.to_ascii_lowercase()));
    canonical.push_str("://");
    push_text(&mut canonical, &parsed.host, true);
    push_text(&mut canonical, &parsed.path, false);
    let object = ObjectId::located_owned(canonical);
    debug_assert!(object.id.contains("://"));
    Some(object)
}

/// Step 2: the raw text before the query, with a raw digest segment if it has one.
fn fallback(base: &str) -> ObjectId {
    let object = match base.split('/').find(|s| is_digest(s)) {
        Some(digest) => ObjectId::digest(digest.as_bytes()),
        None => ObjectId::located(base),
    };
    debug_assert!(!object.id.contains(['?', '#']), "the query never reaches the identity");
    object
}

/// Docker Distribution's object-store layout: `blobs/<algo>/<hex[0..2]>/<hex>` anywhere in the
/// path (every `blobs` segment is tried, first match wins).
fn distribution_digest(segments: &[&[u8]]) -> Option<ObjectId> {
    segments
        .iter()
        .enumerate()
        .filter(|(_, segment)| **segment == b"blobs")
        .find_map(|(i, _)| layout_digest(segments.get(i + 1..i + 4)?))
}

/// `<algo>/<p>/<hex>` → `algo:hex` when the algorithm's length, the hex and the two-character
/// fan-out prefix all agree.
fn layout_digest(tail: &[&[u8]]) -> Option<ObjectId> {
    let [algo, prefix, hex] = tail else {
        return None;
    };
    let algo = algo.to_ascii_lowercase();
    let algo_len = algo.len();
    let hex_len = match algo.as_slice() {
        b"sha256" => 64,
        b"sha512" => 128,
        _ => return None,
    };
    if hex.len() != hex_len || !hex.iter().all(u8::is_ascii_hexdigit) || prefix.len() != 2 {
        return None;
    }
    if !hex[..2].eq_ignore_ascii_case(prefix) {
        return None;
    }
    let mut digest = algo;
    digest.push(b':');
    digest.extend_from_slice(hex);
    debug_assert_eq!(digest.len(), algo_len + 1 + hex_len);
    Some(ObjectId::digest(&digest))
}

/// Appends decoded URL bytes as text: UTF-8 runs as they are (lower-cased like Go's
/// `strings.ToLower` when `lower`), every byte that is not part of valid UTF-8 as `%XX`.
fn push_text(out: &mut String, mut bytes: &[u8], lower: bool) {
    while !bytes.is_empty() {
        let (valid, invalid) = match std::str::from_utf8(bytes) {
            Ok(all) => (all, None),
            Err(e) => {
                let (head, tail) = bytes.split_at(e.valid_up_to());
                let head = std::str::from_utf8(head).expect("valid up to here");
                (head, tail.first().copied())
            }
        };
        if lower {
            out.extend(valid.chars().map(go_simple_lowercase));
        } else {
            out.push_str(valid);
        }
        bytes = &bytes[valid.len()..];
        if let Some(byte) = invalid {
            out.push_str(&format!("%{byte:02X}"));
            bytes = &bytes[1..];
        }
    }
}

/// Go's `unicode.ToLower`: the simple (one-to-one) case mapping.
fn go_simple_lowercase(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    // The one character whose full lowercase mapping is longer than one character.
    if c == '\u{130}' {
        return 'i';
    }
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(single), None) => single,
        _ => c,
    }
}

/// The parts of a URL that identity needs.
#[derive(Debug)]
struct Parsed<'a> {
    /// The scheme as written (not lower-cased), empty when absent.
    scheme: &'a str,
    /// The percent-decoded host including any port, empty when absent.
    host: Vec<u8>,
    /// The percent-decoded path.
    path: Vec<u8>,
}

/// Parses the text before the query and fragment; `None` where Go's `url.Parse` fails and for
/// opaque URLs (see the module docs).
fn parse(base: &str) -> Option<Parsed<'_>> {
    debug_assert!(!base.contains(['?', '#']));
    if base.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return None;
    }
    let (scheme, rest) = split_scheme(base)?;
    if !rest.starts_with('/') {
        // Opaque (`scheme:rest`): deliberately unparsed. Scheme-less: Go refuses a colon in the
        // first segment of a relative reference.
        let first_segment = rest.split('/').next().unwrap_or_default();
        if !scheme.is_empty() || first_segment.contains(':') {
            return None;
        }
    }
    let has_authority = rest.starts_with("//") && (!scheme.is_empty() || !rest.starts_with("///"));
    let (host, path) = if has_authority {
        let after = &rest[2..];
        let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
        (parse_authority(authority)?, path)
    } else {
        (Vec::new(), rest)
    };
    let path = percent_decode(path, Escapes::Any)?;
    Some(Parsed { scheme, host, path })
}

/// Go's `getScheme`: `Some(("", s))` when there is no scheme, `None` for a leading `:`.
fn split_scheme(s: &str) -> Option<(&str, &str)> {
    let end = s.bytes().enumerate().find_map(|(i, b)| match b {
        b'a'..=b'z' | b'A'..=b'Z' => None,
        b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => None,
        b':' => Some(Some(i)),
        _ => Some(None),
    });
    let (scheme, rest) = match end {
        Some(Some(0)) => return None,
        Some(Some(colon)) => (&s[..colon], &s[colon + 1..]),
        Some(None) | None => ("", s),
    };
    debug_assert!(scheme.is_empty() || scheme.as_bytes()[0].is_ascii_alphabetic());
    debug_assert_eq!(scheme.len() + usize::from(!scheme.is_empty()) + rest.len(), s.len());
    Some((scheme, rest))
}

/// The decoded host of `[userinfo@]host[:port]`; the userinfo is validated, then dropped.
fn parse_authority(authority: &str) -> Option<Vec<u8>> {
    let (userinfo, host) = match authority.rfind('@') {
        Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
        None => (None, authority),
    };
    let host = parse_host(host)?;
    if let Some(userinfo) = userinfo {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&b);
        if !userinfo.bytes().all(allowed) {
            return None;
        }
        percent_decode(userinfo, Escapes::Any)?;
    }
    Some(host)
}

/// Go's `parseHost`: bracketed IPv6 with optional `%25` zone, a numeric port, host escapes.
fn parse_host(host: &str) -> Option<Vec<u8>> {
    let valid_port = |port: &str| {
        port.is_empty() || (port.starts_with(':') && port[1..].bytes().all(|b| b.is_ascii_digit()))
    };
    if host.starts_with('[') {
        let close = host.rfind(']')?;
        if !valid_port(&host[close + 1..]) {
            return None;
        }
        if let Some(zone) = host[..close].find("%25") {
            let mut decoded = percent_decode(&host[..zone], Escapes::Host)?;
            decoded.extend(percent_decode(&host[zone..close], Escapes::Zone)?);
            decoded.extend(percent_decode(&host[close..], Escapes::Host)?);
            return Some(decoded);
        }
    } else if let Some(colon) = host.rfind(':') {
        if !valid_port(&host[colon..]) {
            return None;
        }
    }
    percent_decode(host, Escapes::Host)
}

/// Which bytes and escapes a URL component admits (Go's `unescape` modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Escapes {
    /// Path and userinfo: any byte, escapes only need to be well formed.
    Any,
    /// Host: Go's host bytes; escapes only for non-ASCII bytes, or `%25`.
    Host,
    /// IPv6 zone: Go's host bytes; escapes of host bytes, space or `%`.
    Zone,
}

/// Whether Go refuses `b` unescaped in a host (its `shouldEscape(b, encodeHost)`).
fn host_needs_escape(b: u8) -> bool {
    !(b.is_ascii_alphanumeric() || b"-_.~!$&'()*+,;=:[]<>\"".contains(&b))
}

/// Percent-decodes a URL path (any byte, escapes well formed); `None` for a malformed escape.
pub(crate) fn percent_decode_path(s: &str) -> Option<Vec<u8>> {
    percent_decode(s, Escapes::Any)
}

/// Percent-decodes `s`; `None` for a malformed escape or a byte `mode` refuses.
fn percent_decode(s: &str, mode: Escapes) -> Option<Vec<u8>> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            if mode != Escapes::Any && b < 0x80 && host_needs_escape(b) {
                return None;
            }
            out.push(b);
            i += 1;
            continue;
        }
        let hex = |at: usize| bytes.get(at).and_then(|d| char::from(*d).to_digit(16));
        let (high, low) = (hex(i + 1)?, hex(i + 2)?);
        let value = u8::try_from(high << 4 | low).expect("two hex digits fit a byte");
        let percent = value == b'%';
        let refused = match mode {
            Escapes::Any => false,
            Escapes::Host => value < 0x80 && !percent,
            Escapes::Zone => !percent && value != b' ' && host_needs_escape(value),
        };
        if refused {
            return None;
        }
        out.push(value);
        i += 3;
    }
    debug_assert!(out.len() <= bytes.len());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const H: &str = "ab3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a";

    fn d() -> String {
        format!("sha256:{}", "ab".repeat(32))
    }

    fn id(url: &str) -> ObjectId {
        object_id(url, IdLayout::Distribution)
    }

    fn digest(id: &str) -> ObjectId {
        ObjectId { id: id.to_owned(), content_addressed: true }
    }

    fn located(id: &str) -> ObjectId {
        ObjectId { id: id.to_owned(), content_addressed: false }
    }

    /// B from spec §2: a Distribution object-store path for H.
    fn layout_path() -> String {
        format!("/docker/registry/v2/blobs/sha256/ab/{H}/data")
    }

    #[test]
    fn digest_shapes_are_recognised() {
        assert!(is_digest(&format!("sha256:{}", "a".repeat(64))));
        assert!(is_digest(&format!("sha512:{}", "f".repeat(128))));
        assert!(is_digest(&format!("md5x:{}", "0".repeat(32))));
        assert!(is_digest(&format!("sha256:{}", "AB".repeat(32))), "upper-case hex is accepted");
    }

    #[test]
    fn near_digest_shapes_are_rejected() {
        let rejects = [
            String::new(),
            "sha256:".to_owned(),
            format!(":{}", "a".repeat(32)),
            "sha256:xyz".to_owned(),
            "localhost:5000".to_owned(),
            format!("sha256:{}", "a".repeat(31)),
            format!("SHA256:{}", "a".repeat(64)),
        ];
        for s in rejects {
            assert!(!is_digest(&s), "{s:?} is not a digest");
        }
    }

    #[test]
    fn spec_table_vectors_give_the_listed_identity() {
        let d = d();
        let cases = [
            (format!("https://reg.example.com/v2/lib/nginx/blobs/{d}"), digest(&d)),
            (format!("https://reg.example.com/v2/x/blobs/sha256:{}", "AB".repeat(32)), digest(&d)),
            (
                "https://reg.example.com/v2/x/manifests/latest?token=abc".to_owned(),
                located("https://reg.example.com/v2/x/manifests/latest"),
            ),
            ("HTTPS://Reg.Example.COM/v2/x".to_owned(), located("https://reg.example.com/v2/x")),
            (
                "http://localhost:5000/v2/x/blobs/latest".to_owned(),
                located("http://localhost:5000/v2/x/blobs/latest"),
            ),
            ("/v2/x/manifests/latest".to_owned(), located("/v2/x/manifests/latest")),
            (":nope".to_owned(), located(":nope")),
            (format!(":x/blobs/{d}"), digest(&d)),
            ("/v2/x/blobs/latest?token=abc#frag".to_owned(), located("/v2/x/blobs/latest")),
        ];
        for (url, want) in cases {
            assert_eq!(id(&url), want, "{url}");
        }
    }

    #[test]
    fn percent_encoded_separators_never_reach_the_identity() {
        for url in ["http://example.com/rel%1F1", "/rel%1F1", "http://example.com/a%1Fb/c?x=%1F"] {
            let got = id(url);
            assert!(!got.id.contains('\u{1f}'), "{url} gave {:?}", got.id);
            assert!(!got.content_addressed);
        }
        assert_eq!(id("http://example.com/a%1Fb/c?x=%1F"), located("http://example.com/ab/c"));
        assert_eq!(id("http://example.com/rel%1F1"), located("http://example.com/rel1"));
        assert_eq!(id("/rel%1F1"), located("/rel%1F1"), "scheme-less: the raw text is the id");
    }

    #[test]
    fn raw_separators_are_stripped_on_the_fallback() {
        assert_eq!(id("/a\u{1f}b?q"), located("/ab"));
        assert_eq!(id("HTTP://H/\u{1f}x"), located("HTTP://H/x"), "a control byte fails the parse");
    }

    #[test]
    fn one_layer_through_presigned_buckets_mirrors_and_oci_has_one_identity() {
        let b = layout_path();
        let oss = "https://bkt.oss-cn-hangzhou.aliyuncs.com";
        let urls = [
            format!("{oss}{b}?OSSAccessKeyId=k1&Expires=1&Signature=aaa"),
            format!("{oss}{b}?OSSAccessKeyId=k1&Expires=2&Signature=bbb"),
            format!("https://other-bkt.s3.us-east-1.amazonaws.com{b}?X-Amz-Signature=ccc"),
            format!("https://internal.mirror.example{b}"),
            format!("https://registry.example.com/v2/lib/nginx/blobs/sha256:{H}"),
        ];
        for url in urls {
            assert_eq!(id(&url), digest(&format!("sha256:{H}")), "{url}");
        }
    }

    #[test]
    fn upper_case_layout_paths_are_recognised_and_lower_cased() {
        let upper = H.to_ascii_uppercase();
        let url = format!("HTTPS://BKT.Example.COM/blobs/SHA256/AB/{upper}/data");
        assert_eq!(id(&url), digest(&format!("sha256:{H}")));
    }

    #[test]
    fn sha512_layout_paths_are_recognised() {
        let hex = "9f".repeat(64);
        let url = format!("https://h/docker/registry/v2/blobs/sha512/9f/{hex}/data");
        assert_eq!(id(&url), digest(&format!("sha512:{hex}")));
    }

    #[test]
    fn oci_only_layout_falls_back_to_the_canonical_url_without_the_query() {
        let path = format!("/docker/registry/v2/blobs/sha256/ab/{H}/data");
        let url = format!("https://bkt.example.com{path}?Signature=xyz");
        let want = located(&format!("https://bkt.example.com{path}"));
        assert_eq!(object_id(&url, IdLayout::OciOnly), want);
        let oci = format!("https://registry.example.com/v2/lib/nginx/blobs/sha256:{H}");
        for layout in [IdLayout::Distribution, IdLayout::OciOnly] {
            assert_eq!(object_id(&oci, layout), digest(&format!("sha256:{H}")), "{layout:?}");
        }
        assert_eq!(IdLayout::default(), IdLayout::Distribution);
    }

    #[test]
    fn twelve_near_miss_layout_paths_never_fabricate_a_digest() {
        let paths = [
            format!("/blobs/sha256/zz/{H}/data"),
            format!("/blobs/sha256/00/{H}/data"),
            "/blobs/sha256/ab/abcdef/data".to_owned(),
            format!("/blobs/sha256/ab/{H}cd/data"),
            format!("/blobs/md5/ab/{H}/data"),
            format!("/blobs/sha1/ab/{H}/data"),
            format!("/blobs/sha256/gg/{}/data", "g".repeat(64)),
            format!("/objects/sha256/ab/{H}/data"),
            format!("/blobs/sha256/a/{H}/data"),
            format!("/blobs/sha256/abc/{H}/data"),
            "/blobs/sha256".to_owned(),
            "/blobs/sha256/ab".to_owned(),
        ];
        for path in paths {
            let url = format!("https://h{path}");
            assert_eq!(id(&url), located(&url), "{url}");
        }
    }

    #[test]
    fn a_later_blobs_segment_can_still_match_the_layout() {
        let url = format!("https://h/blobs/x/blobs/sha256/ab/{H}");
        assert_eq!(id(&url), digest(&format!("sha256:{H}")), "three segments suffice");
    }

    #[test]
    fn scheme_less_layout_paths_are_recognised_when_they_parse() {
        assert_eq!(id(&layout_path()), digest(&format!("sha256:{H}")));
        let raw = format!(":x{}", layout_path());
        assert_eq!(id(&raw), located(&raw), "the fallback does not try the layout");
    }

    #[test]
    fn userinfo_is_dropped_and_the_port_kept() {
        assert_eq!(id("http://user:pa%20ss@Host:8080/p"), located("http://host:8080/p"));
        assert_eq!(id("http://a@b@Host/p"), located("http://host/p"), "split at the last @");
    }

    #[test]
    fn the_path_is_decoded_but_never_lower_cased() {
        assert_eq!(id("http://H/A%20B/%41"), located("http://h/A B/A"));
        assert_eq!(id("http://H/a%2Fb"), located("http://h/a/b"));
        assert_eq!(id("http://H/a+b"), located("http://h/a+b"), "+ is not a space in a path");
    }

    #[test]
    fn unparseable_urls_keep_their_raw_text_before_the_query() {
        for (url, want) in [
            ("HTTP://H/a%zz?q", "HTTP://H/a%zz"),
            ("HTTP://H/a%4", "HTTP://H/a%4"),
            ("http://ho st/p", "http://ho st/p"),
            ("http://h:abc/p", "http://h:abc/p"),
            ("http://h%41/p", "http://h%41/p"),
            ("http://[::1/p", "http://[::1/p"),
            ("http://us\"er@h/p", "http://us\"er@h/p"),
            ("1a:b/c", "1a:b/c"),
            ("a_b:c", "a_b:c"),
        ] {
            assert_eq!(id(url), located(want), "{url}");
        }
    }

    #[test]
    fn hosts_follow_go_validation() {
        assert_eq!(id("http://[::1]:80/p"), located("http://[::1]:80/p"));
        assert_eq!(id("http://[FE80::1%25EN0]/p"), located("http://[fe80::1%en0]/p"));
        assert_eq!(id("http://h:/p"), located("http://h:/p"), "an empty port is allowed");
        assert_eq!(id("http://%C3%89T%C3%89.example/p"), located("http://été.example/p"));
        assert_eq!(id("http://ÉTÉ.example/p"), located("http://été.example/p"));
        assert_eq!(id("http://h/p%FFq"), located("http://h/p%FFq"), "non-UTF-8 byte re-escaped");
        assert_eq!(id("http://h%FF/p"), located("http://h%FF/p"));
    }

    #[test]
    fn go_lower_cases_hosts_with_the_simple_mapping() {
        assert_eq!(id("http://İ.example/p"), located("http://i.example/p"));
        assert_eq!(id("http://ΣΑΣ/p"), located("http://σασ/p"), "no final-sigma rule");
    }

    #[test]
    fn opaque_and_odd_forms_take_the_fallback_or_keep_their_shape() {
        let d = d();
        assert_eq!(id(&d), digest(&d), "a bare digest is its own identity");
        assert_eq!(id("urn:a"), located("urn:a"));
        assert_eq!(id("urn:b"), located("urn:b"), "opaque URLs do not collapse to urn://");
        assert_eq!(id("//Host/p"), located("://host/p"), "scheme-less authority");
        assert_eq!(id("///p"), located("///p"));
        assert_eq!(id("http:/p"), located("http:///p"));
        assert_eq!(id(""), located(""));
        assert_eq!(id("*"), located("*"));
    }

    #[test]
    fn namespaces_refuse_empty_and_separator_names() {
        assert_eq!(Namespace::new(""), Err(NamespaceError::Empty));
        let err = Namespace::new("a\u{1f}b").expect_err("0x1F refused");
        assert_eq!(err, NamespaceError::ContainsSeparator(1));
        assert!(err.to_string().contains("0x1F"), "message names the separator: {err}");
        assert_eq!(Namespace::new("ns2").map(|n| n.as_str().to_owned()), Ok("ns2".to_owned()));
        assert_eq!(Namespace::default().as_str(), "dart");
        assert_eq!("ns2".parse::<Namespace>(), Namespace::new("ns2"));
        assert_eq!(Namespace::default().to_string(), DEFAULT_NAMESPACE);
    }

    fn url_like() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("http://".to_owned()),
            Just("HTTPS://".to_owned()),
            Just("//".to_owned()),
            Just(":".to_owned()),
            Just("/blobs/".to_owned()),
            Just("sha256/ab/".to_owned()),
            Just(H.to_owned()),
            Just("sha256:".to_owned()),
            Just("?q=1".to_owned()),
            Just("#f".to_owned()),
            Just("@".to_owned()),
            Just("[::1]".to_owned()),
            "%[0-9A-Fa-fg]{0,2}",
            "[a-zA-Z0-9./:@\\[\\]%?#\u{1f}\u{130}É]{0,6}",
        ];
        proptest::collection::vec(piece, 0..10).prop_map(|p| p.concat())
    }

    fn any_layout() -> impl Strategy<Value = IdLayout> {
        prop_oneof![Just(IdLayout::Distribution), Just(IdLayout::OciOnly)]
    }

    proptest! {
        #[test]
        fn arbitrary_strings_never_panic_or_leak_the_separator(
            url in prop_oneof![any::<String>(), url_like()], layout in any_layout(),
        ) {
            let got = object_id(&url, layout);
            prop_assert!(!got.id.as_bytes().contains(&FIELD_SEP), "0x1F in {:?}", got.id);
            if got.content_addressed {
                prop_assert!(is_digest(&got.id), "{:?} from {:?}", got.id, url);
            }
        }

        #[test]
        fn the_query_and_fragment_never_change_the_identity(
            base in url_like(), tail in "[?#][ -~\u{1}\u{1f}%]{0,12}", layout in any_layout(),
        ) {
            let base = &base[..base.find(['?', '#']).unwrap_or(base.len())];
            let with_tail = format!("{base}{tail}");
            prop_assert_eq!(object_id(&with_tail, layout), object_id(base, layout));
        }

        #[test]
        fn a_digest_segment_is_found_whatever_surrounds_it(
            prefix in "(https?://[a-z]{1,5}(:[0-9]{1,4})?)?(/[a-z]{1,5}){0,3}",
            hex in "[0-9a-fA-F]{32,70}", algo in "[a-z0-9]{1,8}", layout in any_layout(),
        ) {
            let url = format!("{prefix}/{algo}:{hex}/tail?sig=1");
            let want = format!("{algo}:{}", hex.to_ascii_lowercase());
            prop_assert_eq!(object_id(&url, layout), digest(&want));
        }
    }
}
