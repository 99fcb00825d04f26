//! The simulated origin: objects whose bytes come from [`Contents`](crate::content::Contents),
//! answered as HTTP status, header fields and a body window, which the node machine judges
//! itself. Its misbehaviours are properties of an object (Range-blind, hidden total) or
//! transient faults (errors, truncation, stalls, slowness); presigned URLs expire.
//!
//! An object can be replaced ([`Origin::replace`]): version `k` has its own bytes (its own salt,
//! and its own size if the replacement says so) and its own validators, `ETag: "o<object>v<k>"`
//! and a `Last-Modified` that grows with the version. Every answer is of the version current
//! when the origin answers it, so a window fetched before a replacement and one fetched after
//! differ, and the answer's whole body is that one version.

use crate::content::ObjectShape;
use crate::fault::OriginFault;
use crate::workload::RangeSpec;
use dart_core::hash::fmix64;
use dart_core::rng::Rng;
use dart_core::time::Instant;
use rand::Rng as _;
use std::collections::BTreeMap;
use std::time::Duration;

/// Host part of every simulated object URL.
pub const ORIGIN_HOST: &str = "origin.sim";
/// Bytes of a response head on the wire (status line and headers).
pub const HEAD_BYTES: u64 = 400;

/// One object the origin serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectDef {
    /// Size in bytes.
    pub size: u64,
    /// Salt of its bytes.
    pub salt: u64,
    /// The origin ignores Range for this object (answers 200 with the whole body).
    pub range_blind: bool,
    /// The origin hides the total in every Content-Range (`bytes a-b/*`).
    pub hides_total: bool,
    /// The origin sends an `ETag` (else only `Last-Modified`, which then tells versions apart).
    pub etag: bool,
}

impl ObjectDef {
    /// A well-behaved object.
    pub fn plain(size: u64, salt: u64) -> Self {
        ObjectDef { size, salt, range_blind: false, hides_total: false, etag: true }
    }

    /// Its shape for the content generator (of its first version).
    pub fn shape(&self) -> ObjectShape {
        ObjectShape { size: self.size, salt: self.salt }
    }
}

/// One version of an object: its bytes and its validators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Its number (0: the object as the run starts).
    pub index: usize,
    /// When the origin started serving it.
    pub since: Instant,
    /// Its bytes.
    pub shape: ObjectShape,
    /// Its `ETag` (sent when the object's [`ObjectDef::etag`] says so).
    pub etag: String,
    /// Its `Last-Modified`.
    pub last_modified: String,
}

/// The salt of version `k` of an object salted `salt`: version 0 keeps the object's own salt, a
/// later version gets bytes unlike every other version's and every other object's.
pub fn version_salt(salt: u64, k: usize) -> u64 {
    if k == 0 {
        salt
    } else {
        fmix64(salt ^ fmix64((k as u64).wrapping_mul(0xA24B_AED4_963E_E407)))
    }
}

/// The `ETag` of version `k` of object `object`.
pub fn version_etag(object: usize, k: usize) -> String {
    format!("\"o{object}v{k}\"")
}

/// Seconds since the Unix epoch of the first version's `Last-Modified` (2000-01-01).
const LAST_MODIFIED_BASE: u64 = 946_684_800;

/// The `Last-Modified` of version `k` first served at `since`: it grows with the version (two
/// versions in one second still differ).
pub fn version_last_modified(k: usize, since: Instant) -> String {
    http_date(LAST_MODIFIED_BASE + since.as_nanos() / 1_000_000_000 + k as u64)
}

/// An IMF-fixdate (RFC 9110 §5.6.7) of `secs` since the Unix epoch.
pub fn http_date(secs: u64) -> String {
    dart_core::codec::conditional::format_http_date(secs)
}
/// The URL of object `index` signed by `signer`, valid until `expires` (milliseconds of
/// simulated time; `u64::MAX` never expires).
pub fn object_url(index: usize, signer: &str, expires_ms: u64) -> String {
    format!("http://{ORIGIN_HOST}/o/{index}?sig={signer}&exp={expires_ms}")
}

/// The registry blob URL of object `index`, named by `digest` (registry-mirror mode).
pub fn blob_url(index: usize, digest: &str) -> String {
    format!("http://{ORIGIN_HOST}/v2/sim/o{index}/blobs/{digest}")
}

/// Parses a URL made by [`object_url`] (the object index and expiry) or by [`blob_url`] (the
/// index; a blob URL never expires).
pub fn parse_url(url: &str) -> Option<(usize, u64)> {
    let path = url.strip_prefix("http://")?.strip_prefix(ORIGIN_HOST)?;
    if let Some(blob) = path.strip_prefix("/v2/sim/o") {
        let (index, _digest) = blob.split_once("/blobs/")?;
        return Some((index.parse().ok()?, u64::MAX));
    }
    let rest = path.strip_prefix("/o/")?;
    let (index, query) = rest.split_once('?').unwrap_or((rest, ""));
    let exp = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("exp="))
        .map_or(Some(u64::MAX), |v| v.parse().ok())?;
    Some((index.parse().ok()?, exp))
}

/// What the client asked the origin for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OriginRequest {
    /// `GET` with `Range: bytes=0-0`.
    Probe,
    /// `GET` with `Range: bytes=start-end`.
    Range {
        /// First byte.
        start: u64,
        /// Last byte, inclusive.
        end: u64,
    },
    /// A verbatim passthrough `GET` with the client's own `Range` header.
    Passthrough {
        /// The client's range.
        range: RangeSpec,
    },
}

/// The body that follows a response head: object bytes `start..start + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyWindow {
    /// First object offset.
    pub start: u64,
    /// Bytes actually sent (a truncated body is shorter than announced).
    pub len: u64,
}

/// An origin response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OriginAnswer {
    /// HTTP status.
    pub status: u16,
    /// `Content-Range`, if sent.
    pub content_range: Option<String>,
    /// `Content-Length`, if sent.
    pub content_length: Option<u64>,
    /// The body.
    pub body: BodyWindow,
    /// Extra time before the head leaves (slowness).
    pub delay: Duration,
    /// The origin never answers (a stall): only the client's timeout ends the exchange.
    pub stalled: bool,
    /// The version answered (its bytes make the body).
    pub version: usize,
    /// `ETag`, if sent.
    pub etag: Option<String>,
    /// `Last-Modified`, if sent.
    pub last_modified: Option<String>,
}

impl OriginAnswer {
    /// The header fields sent: `content-length` and `content-range` when known, and the
    /// version's validators (`etag`, `last-modified`) on an answer about the object, as real
    /// origins send (a passthrough copies them to the client).
    pub fn headers(&self) -> dart_core::node::Headers {
        let mut h = dart_core::node::Headers::new();
        if let Some(n) = self.content_length {
            h.push("content-length", n.to_string());
        }
        if let Some(cr) = &self.content_range {
            h.push("content-range", cr.as_str());
        }
        if let Some(etag) = &self.etag {
            h.push("etag", etag.as_str());
        }
        if let Some(lm) = &self.last_modified {
            h.push("last-modified", lm.as_str());
        }
        h
    }

    fn status(status: u16) -> Self {
        OriginAnswer {
            status,
            content_range: None,
            content_length: Some(0),
            body: BodyWindow { start: 0, len: 0 },
            delay: Duration::ZERO,
            stalled: false,
            version: 0,
            etag: None,
            last_modified: None,
        }
    }
}

/// Origin behaviour settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OriginConfig {
    /// Time to first byte.
    pub ttfb: crate::net::Latency,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            ttfb: crate::net::Latency::Uniform {
                lo: Duration::from_millis(5),
                hi: Duration::from_millis(25),
            },
        }
    }
}

/// What the origin served, for expectations and plots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginStats {
    /// Requests received.
    pub requests: u64,
    /// Probes received.
    pub probes: u64,
    /// Block-window requests received.
    pub range_requests: u64,
    /// Passthrough requests received.
    pub passthrough: u64,
    /// Body bytes sent (what the clients read, aborted remainders excluded).
    pub body_bytes: u64,
    /// Range requests per `(object, start)`.
    pub per_window: BTreeMap<(usize, u64), u64>,
    /// Answers by status.
    pub by_status: BTreeMap<u16, u64>,
    /// Cumulative body bytes over time, one sample per answer.
    pub bytes_timeline: Vec<(Instant, u64)>,
}

/// The origin server.
#[derive(Debug)]
pub struct Origin {
    objects: Vec<ObjectDef>,
    /// Every version of every object so far; the last is the one served.
    versions: Vec<Vec<Version>>,
    config: OriginConfig,
    faults: Vec<OriginFault>,
    rng: Rng,
    stats: OriginStats,
}

impl Origin {
    /// An origin serving `objects`.
    pub fn new(objects: Vec<ObjectDef>, config: OriginConfig, rng: Rng) -> Self {
        let versions = objects
            .iter()
            .enumerate()
            .map(|(i, o)| vec![make_version(i, o.shape(), 0, Instant::ZERO)])
            .collect();
        Origin { objects, versions, config, faults: Vec::new(), rng, stats: OriginStats::default() }
    }

    /// The objects.
    pub fn objects(&self) -> &[ObjectDef] {
        &self.objects
    }

    /// Every version of object `object` so far, oldest first (the last is served).
    pub fn versions(&self, object: usize) -> &[Version] {
        &self.versions[object]
    }

    /// Version `k` of object `object`, if it exists yet.
    pub fn version(&self, object: usize, k: usize) -> Option<&Version> {
        self.versions.get(object)?.get(k)
    }

    /// The version of object `object` served now.
    pub fn current(&self, object: usize) -> &Version {
        self.versions[object].last().expect("every object has a version")
    }

    /// Replaces object `object` at `now` by a new version (of `size` bytes, else the current
    /// size) and returns it: every answer from now on is of the new version.
    pub fn replace(&mut self, object: usize, now: Instant, size: Option<u64>) -> &Version {
        let list = &mut self.versions[object];
        let k = list.len();
        let size = size.unwrap_or(list[k - 1].shape.size);
        let shape = ObjectShape { size, salt: version_salt(self.objects[object].salt, k) };
        list.push(make_version(object, shape, k, now));
        &list[k]
    }

    /// Statistics so far.
    pub fn stats(&self) -> &OriginStats {
        &self.stats
    }

    /// Starts (`on`) or ends one transient fault.
    pub fn set_fault(&mut self, fault: OriginFault, on: bool) {
        if on {
            self.faults.push(fault);
        } else if let Some(i) = self.faults.iter().position(|f| *f == fault) {
            self.faults.remove(i);
        }
    }

    /// True when no transient fault is in force.
    pub fn is_healed(&self) -> bool {
        self.faults.is_empty()
    }

    /// Records `bytes` of body actually read by a client at `at`.
    pub fn account(&mut self, at: Instant, bytes: u64) {
        self.stats.body_bytes += bytes;
        self.stats.bytes_timeline.push((at, self.stats.body_bytes));
    }

    /// Answers `request` for `url` arriving at `now`.
    pub fn answer(&mut self, now: Instant, url: &str, request: &OriginRequest) -> OriginAnswer {
        self.stats.requests += 1;
        let mut answer = self.judge(now, url, request);
        answer.delay += self.config.ttfb.draw(&mut self.rng);
        *self.stats.by_status.entry(answer.status).or_default() += 1;
        answer
    }

    fn judge(&mut self, now: Instant, url: &str, request: &OriginRequest) -> OriginAnswer {
        let Some((index, expires_ms)) = parse_url(url) else {
            return OriginAnswer::status(404);
        };
        let Some(object) = self.objects.get(index).copied() else {
            return OriginAnswer::status(404);
        };
        let version = self.current(index).clone();
        match request {
            OriginRequest::Probe => self.stats.probes += 1,
            OriginRequest::Range { start, .. } => {
                self.stats.range_requests += 1;
                *self.stats.per_window.entry((index, *start)).or_default() += 1;
            }
            OriginRequest::Passthrough { .. } => self.stats.passthrough += 1,
        }
        let mut delay = Duration::ZERO;
        let mut range_blind = object.range_blind;
        let mut hides_total = object.hides_total;
        let mut truncate = false;
        for fault in self.faults.clone() {
            match fault {
                OriginFault::Errors { status, percent } => {
                    if self.rng.random_range(0..100u8) < percent {
                        return OriginAnswer::status(status);
                    }
                }
                OriginFault::Truncates { percent } => {
                    truncate |= self.rng.random_range(0..100u8) < percent;
                }
                OriginFault::HidesTotal => hides_total = true,
                OriginFault::RangeBlind => range_blind = true,
                OriginFault::Stall => {
                    let mut a = OriginAnswer::status(200);
                    a.stalled = true;
                    return a;
                }
                OriginFault::Slow { extra_ms } => delay += Duration::from_millis(extra_ms.into()),
            }
        }
        if now.as_nanos() / 1_000_000 > expires_ms {
            return OriginAnswer { delay, ..OriginAnswer::status(403) };
        }
        let mut answer = shape_answer(version.shape.size, request, range_blind, hides_total);
        answer.version = version.index;
        answer.etag = object.etag.then_some(version.etag);
        answer.last_modified = Some(version.last_modified);
        if truncate && answer.body.len > 1 && answer.status == 206 {
            let cut = 1 + self.rng.random_range(0..answer.body.len / 2);
            answer.body.len -= cut;
        }
        answer.delay += delay;
        answer
    }
}

fn make_version(object: usize, shape: ObjectShape, k: usize, since: Instant) -> Version {
    Version {
        index: k,
        since,
        shape,
        etag: version_etag(object, k),
        last_modified: version_last_modified(k, since),
    }
}

/// The well-formed answer to `request` for an object of `size` bytes (RFC 9110 semantics, or the
/// Range-blind and hidden-total variants).
fn shape_answer(
    size: u64,
    request: &OriginRequest,
    range_blind: bool,
    hides_total: bool,
) -> OriginAnswer {
    let total = if hides_total { "*".to_owned() } else { size.to_string() };
    let whole = OriginAnswer {
        status: 200,
        content_range: None,
        content_length: Some(size),
        body: BodyWindow { start: 0, len: size },
        ..OriginAnswer::status(200)
    };
    let (start, end) = match request {
        OriginRequest::Probe => (0, 0),
        OriginRequest::Range { start, end } => (*start, *end),
        OriginRequest::Passthrough { range: RangeSpec::Whole } => return whole,
        OriginRequest::Passthrough { range } => range.window(size).unwrap_or((size, size)),
    };
    if range_blind {
        return whole;
    }
    if start >= size {
        return OriginAnswer {
            content_range: Some(format!("bytes */{size}")),
            ..OriginAnswer::status(416)
        };
    }
    let last = end.min(size - 1);
    let len = last - start + 1;
    OriginAnswer {
        status: 206,
        content_range: Some(format!("bytes {start}-{last}/{total}")),
        content_length: Some(len),
        body: BodyWindow { start, len },
        ..OriginAnswer::status(206)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dart_core::rng;

    fn origin(def: ObjectDef) -> Origin {
        Origin::new(vec![def], OriginConfig::default(), rng::from_seed(3))
    }

    #[test]
    fn urls_round_trip_and_expire() {
        let url = object_url(3, "n1", 5000);
        assert_eq!(parse_url(&url), Some((3, 5000)));
        assert_eq!(parse_url("http://origin.sim/o/2"), Some((2, u64::MAX)));
        assert_eq!(parse_url("http://elsewhere/o/2"), None);
        let blob = blob_url(4, "sha256:0123456789abcdef0123456789abcdef");
        assert_eq!(
            blob,
            "http://origin.sim/v2/sim/o4/blobs/sha256:0123456789abcdef0123456789abcdef"
        );
        assert_eq!(parse_url(&blob), Some((4, u64::MAX)));
        assert_eq!(parse_url("http://origin.sim/v2/sim/ox/blobs/d"), None);
        let mut o = origin(ObjectDef::plain(100, 1));
        let fresh =
            o.answer(Instant::from_secs(4), &object_url(0, "a", 5000), &OriginRequest::Probe);
        assert_eq!(fresh.status, 206);
        let late =
            o.answer(Instant::from_secs(6), &object_url(0, "a", 5000), &OriginRequest::Probe);
        assert_eq!(late.status, 403);
    }

    #[test]
    fn ranges_are_clamped_and_described_like_rfc_9110() {
        let mut o = origin(ObjectDef::plain(100, 1));
        let url = object_url(0, "a", u64::MAX);
        let a = o.answer(Instant::ZERO, &url, &OriginRequest::Range { start: 90, end: 199 });
        assert_eq!(a.status, 206);
        assert_eq!(a.content_range.as_deref(), Some("bytes 90-99/100"));
        assert_eq!(a.body, BodyWindow { start: 90, len: 10 });
        let past = o.answer(Instant::ZERO, &url, &OriginRequest::Range { start: 100, end: 120 });
        assert_eq!(past.status, 416);
        assert_eq!(o.stats().per_window.get(&(0, 90)), Some(&1));
    }

    #[test]
    fn range_blind_and_hidden_total_objects_answer_as_such() {
        let mut o = origin(ObjectDef { range_blind: true, ..ObjectDef::plain(100, 1) });
        let url = object_url(0, "a", u64::MAX);
        let a = o.answer(Instant::ZERO, &url, &OriginRequest::Probe);
        assert_eq!((a.status, a.content_length, a.body.len), (200, Some(100), 100));
        let mut o = origin(ObjectDef { hides_total: true, ..ObjectDef::plain(100, 1) });
        let a = o.answer(Instant::ZERO, &url, &OriginRequest::Probe);
        assert_eq!(a.content_range.as_deref(), Some("bytes 0-0/*"));
    }

    #[test]
    fn transient_faults_apply_while_set() {
        let mut o = origin(ObjectDef::plain(100, 1));
        let url = object_url(0, "a", u64::MAX);
        let err = OriginFault::Errors { status: 503, percent: 100 };
        o.set_fault(err, true);
        assert_eq!(o.answer(Instant::ZERO, &url, &OriginRequest::Probe).status, 503);
        o.set_fault(err, false);
        o.set_fault(OriginFault::Truncates { percent: 100 }, true);
        let a = o.answer(Instant::ZERO, &url, &OriginRequest::Range { start: 0, end: 49 });
        assert!(a.body.len < 50 && a.content_length == Some(50));
        o.set_fault(OriginFault::Truncates { percent: 100 }, false);
        assert!(o.is_healed());
    }

    #[test]
    fn a_replaced_object_answers_with_the_new_version_from_then_on() {
        let mut o = origin(ObjectDef::plain(100, 1));
        let url = object_url(0, "a", u64::MAX);
        let before = o.answer(Instant::ZERO, &url, &OriginRequest::Range { start: 0, end: 9 });
        assert_eq!((before.version, before.etag.as_deref()), (0, Some("\"o0v0\"")));
        let v1 = o.replace(0, Instant::from_millis(1500), None).clone();
        assert_eq!((v1.index, v1.shape.size), (1, 100));
        assert_ne!(v1.shape.salt, 1, "the new version has its own bytes");
        assert_ne!(v1.last_modified, o.versions(0)[0].last_modified);
        let after =
            o.answer(Instant::from_secs(2), &url, &OriginRequest::Range { start: 0, end: 9 });
        assert_eq!((after.version, after.etag.as_deref()), (1, Some("\"o0v1\"")));
        let h = after.headers();
        assert_eq!(h.get_str("etag"), Some("\"o0v1\""));
        assert_eq!(h.get_str("last-modified"), Some(v1.last_modified.as_str()));
        // A resized version answers with its own size.
        o.replace(0, Instant::from_secs(3), Some(50));
        let probe = o.answer(Instant::from_secs(4), &url, &OriginRequest::Probe);
        assert_eq!((probe.version, probe.content_range.as_deref()), (2, Some("bytes 0-0/50")));
        assert_eq!(o.current(0).index, 2);
        // Without an ETag, Last-Modified alone names the version.
        let mut o = origin(ObjectDef { etag: false, ..ObjectDef::plain(100, 1) });
        let a = o.answer(Instant::ZERO, &url, &OriginRequest::Probe);
        assert_eq!(a.etag, None);
        assert!(a.headers().get_str("last-modified").is_some());
    }

    #[test]
    fn last_modified_dates_are_imf_fixdates_that_grow_with_the_version() {
        assert_eq!(http_date(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(LAST_MODIFIED_BASE), "Sat, 01 Jan 2000 00:00:00 GMT");
        assert_eq!(http_date(951_782_400), "Tue, 29 Feb 2000 00:00:00 GMT");
        let parse = |s: &str| dart_core::codec::conditional::http_date(s.as_bytes());
        for secs in [0, 68_169_599, 951_868_799, 4_102_444_800, 1_700_000_000] {
            assert_eq!(parse(&http_date(secs)), Some(secs), "{}", http_date(secs));
        }
        let v0 = version_last_modified(0, Instant::ZERO);
        let v1 = version_last_modified(1, Instant::from_millis(300));
        let v2 = version_last_modified(2, Instant::from_millis(600));
        assert!(parse(&v0) < parse(&v1) && parse(&v1) < parse(&v2));
    }
}
