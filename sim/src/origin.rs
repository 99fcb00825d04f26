//! The simulated origin: objects whose bytes come from [`Contents`](crate::content::Contents),
//! answered as HTTP status, header fields and a body window, which the node machine judges
//! itself. Its misbehaviours are properties of an object (Range-blind, hidden total) or
//! transient faults (errors, truncation, stalls, slowness); presigned URLs expire.

use crate::content::ObjectShape;
use crate::fault::OriginFault;
use crate::workload::RangeSpec;
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
}

impl ObjectDef {
    /// A well-behaved object.
    pub fn plain(size: u64, salt: u64) -> Self {
        ObjectDef { size, salt, range_blind: false, hides_total: false }
    }

    /// Its shape for the content generator.
    pub fn shape(&self) -> ObjectShape {
        ObjectShape { size: self.size, salt: self.salt }
    }
}

/// The URL of object `index` signed by `signer`, valid until `expires` (milliseconds of
/// simulated time; `u64::MAX` never expires).
pub fn object_url(index: usize, signer: &str, expires_ms: u64) -> String {
    format!("http://{ORIGIN_HOST}/o/{index}?sig={signer}&exp={expires_ms}")
}

/// Parses a URL made by [`object_url`]: the object index and expiry.
pub fn parse_url(url: &str) -> Option<(usize, u64)> {
    let rest = url.strip_prefix("http://")?.strip_prefix(ORIGIN_HOST)?.strip_prefix("/o/")?;
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
}

impl OriginAnswer {
    /// The header fields sent: `content-length` and `content-range` when known, and the object's
    /// validator (`etag`), as real origins send (a passthrough copies it to the client).
    pub fn headers(&self, object: usize) -> dart_core::node::Headers {
        let mut h = dart_core::node::Headers::new();
        if let Some(n) = self.content_length {
            h.push("content-length", n.to_string());
        }
        if let Some(cr) = &self.content_range {
            h.push("content-range", cr.as_str());
        }
        h.push("etag", format!("\"o{object}\""));
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
    config: OriginConfig,
    faults: Vec<OriginFault>,
    rng: Rng,
    stats: OriginStats,
}

impl Origin {
    /// An origin serving `objects`.
    pub fn new(objects: Vec<ObjectDef>, config: OriginConfig, rng: Rng) -> Self {
        Origin { objects, config, faults: Vec::new(), rng, stats: OriginStats::default() }
    }

    /// The objects.
    pub fn objects(&self) -> &[ObjectDef] {
        &self.objects
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
        let mut answer = shape_answer(object, request, range_blind, hides_total);
        if truncate && answer.body.len > 1 && answer.status == 206 {
            let cut = 1 + self.rng.random_range(0..answer.body.len / 2);
            answer.body.len -= cut;
        }
        answer.delay += delay;
        answer
    }
}

/// The well-formed answer to `request` for `object` (RFC 9110 semantics, or the Range-blind and
/// hidden-total variants).
fn shape_answer(
    object: ObjectDef,
    request: &OriginRequest,
    range_blind: bool,
    hides_total: bool,
) -> OriginAnswer {
    let size = object.size;
    let total = if hides_total { "*".to_owned() } else { size.to_string() };
    let whole = OriginAnswer {
        status: 200,
        content_range: None,
        content_length: Some(size),
        body: BodyWindow { start: 0, len: size },
        delay: Duration::ZERO,
        stalled: false,
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
        delay: Duration::ZERO,
        stalled: false,
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
}
