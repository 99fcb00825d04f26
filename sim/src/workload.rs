//! Workloads as values: which client reads what, through which node, when, with which credential;
//! and the independent oracle for what each read must answer.

use dart_core::engine::Method;
use dart_core::rng::Rng;
use rand::Rng as _;
use std::time::Duration;

/// The `Range` header a client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RangeSpec {
    /// No header: the whole object.
    Whole,
    /// `bytes=a-b`.
    Bounded(u64, u64),
    /// `bytes=a-`.
    From(u64),
    /// `bytes=-n`.
    Suffix(u64),
}

impl RangeSpec {
    /// The header value, if any.
    pub fn header(&self) -> Option<Vec<u8>> {
        match *self {
            RangeSpec::Whole => None,
            RangeSpec::Bounded(a, b) => Some(format!("bytes={a}-{b}").into_bytes()),
            RangeSpec::From(a) => Some(format!("bytes={a}-").into_bytes()),
            RangeSpec::Suffix(n) => Some(format!("bytes=-{n}").into_bytes()),
        }
    }

    /// Parses a `Range` header value as a client of this simulator sends it (`None`: absent or
    /// not a single byte range, which an origin ignores).
    pub fn parse(header: Option<&[u8]>) -> Option<RangeSpec> {
        let Some(value) = header else { return Some(RangeSpec::Whole) };
        let spec = std::str::from_utf8(value).ok()?.strip_prefix("bytes=")?;
        let (a, b) = spec.split_once('-')?;
        match (a.is_empty(), b.is_empty()) {
            (true, false) => Some(RangeSpec::Suffix(b.parse().ok()?)),
            (false, true) => Some(RangeSpec::From(a.parse().ok()?)),
            (false, false) => Some(RangeSpec::Bounded(a.parse().ok()?, b.parse().ok()?)),
            (true, true) => None,
        }
    }

    /// The inclusive window this range selects in an object of `size` bytes, if satisfiable.
    pub fn window(&self, size: u64) -> Option<(u64, u64)> {
        if size == 0 {
            return None;
        }
        match *self {
            RangeSpec::Whole => Some((0, size - 1)),
            RangeSpec::Bounded(a, b) => (a <= b && a < size).then(|| (a, b.min(size - 1))),
            RangeSpec::From(a) => (a < size).then_some((a, size - 1)),
            RangeSpec::Suffix(n) => (n > 0).then(|| (size - n.min(size), size - 1)),
        }
    }
}

/// The response a read must produce: the oracle, computed without the core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    /// 200, 206 or 416.
    pub status: u16,
    /// Exact `Content-Length`.
    pub content_length: u64,
    /// `Content-Range`, for 206 and 416.
    pub content_range: Option<String>,
    /// First byte of the body (meaningful when `content_length > 0`).
    pub start: u64,
}

/// What a read of `range` of a `size`-byte object must answer (RFC 9110; an empty object's plain
/// GET is a 200 with no body and every range on it is 416).
pub fn expected(range: RangeSpec, size: u64) -> Expected {
    if range == RangeSpec::Whole {
        return Expected { status: 200, content_length: size, content_range: None, start: 0 };
    }
    match range.window(size) {
        Some((a, b)) => Expected {
            status: 206,
            content_length: b - a + 1,
            content_range: Some(format!("bytes {a}-{b}/{size}")),
            start: a,
        },
        None => Expected {
            status: 416,
            content_length: 0,
            content_range: Some(format!("bytes */{size}")),
            start: 0,
        },
    }
}

/// One client read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadSpec {
    /// When the client sends it (from the start of its phase).
    pub at: Duration,
    /// The node the client talks to.
    pub node: usize,
    /// The object.
    pub object: usize,
    /// The range.
    pub range: RangeSpec,
    /// GET or HEAD.
    pub method: Method,
    /// The presigned URL expires this long after the run starts (`None`: never).
    pub expires: Option<Duration>,
    /// Whose credential signs the URL: `Some(k)` is client k's, the same URL on every read (a
    /// client re-reading); `None` a new signature per read.
    pub signer: Option<u32>,
}

impl ReadSpec {
    /// A GET of the whole of `object` through `node` at `at`.
    pub fn whole(at: Duration, node: usize, object: usize) -> Self {
        ReadSpec {
            at,
            node,
            object,
            range: RangeSpec::Whole,
            method: Method::Get,
            expires: None,
            signer: None,
        }
    }
}

/// The reads of a run: a safety phase (with faults) and a liveness phase (after healing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Workload {
    /// Reads during the safety phase; `at` counts from the start of the run.
    pub safety: Vec<ReadSpec>,
    /// Reads after every fault healed; `at` counts from the heal. Each must complete.
    pub liveness: Vec<ReadSpec>,
}

impl Workload {
    /// Every node reads every object whole, starting within `spread` of the phase start.
    pub fn everyone_reads_everything(
        rng: &mut Rng,
        nodes: usize,
        objects: usize,
        spread: Duration,
    ) -> Vec<ReadSpec> {
        let spread = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity(nodes * objects);
        for node in 0..nodes {
            for object in 0..objects {
                let at =
                    Duration::from_nanos(if spread == 0 { 0 } else { rng.random_range(0..spread) });
                out.push(ReadSpec::whole(at, node, object));
            }
        }
        out
    }

    /// `count` random reads (random nodes, objects, range forms, some HEADs) within `spread`.
    pub fn random_reads(
        rng: &mut Rng,
        nodes: usize,
        sizes: &[u64],
        count: usize,
        spread: Duration,
    ) -> Vec<ReadSpec> {
        let spread = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX).max(1);
        (0..count)
            .map(|_| {
                let object = rng.random_range(0..sizes.len());
                let size = sizes[object].max(1);
                let a = rng.random_range(0..size + size / 8 + 1);
                let range = match rng.random_range(0..5) {
                    0 => RangeSpec::Whole,
                    1 => RangeSpec::From(a),
                    2 => RangeSpec::Suffix(rng.random_range(0..size + 2)),
                    _ => RangeSpec::Bounded(a, a + rng.random_range(0..size)),
                };
                let method = if rng.random_bool(0.1) { Method::Head } else { Method::Get };
                ReadSpec {
                    at: Duration::from_nanos(rng.random_range(0..spread)),
                    node: rng.random_range(0..nodes),
                    object,
                    range,
                    method,
                    expires: None,
                    signer: None,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_follows_rfc_9110_and_the_empty_object_rules() {
        let e = expected(RangeSpec::Bounded(90, 500), 100);
        assert_eq!((e.status, e.content_length, e.start), (206, 10, 90));
        assert_eq!(e.content_range.as_deref(), Some("bytes 90-99/100"));
        assert_eq!(expected(RangeSpec::From(100), 100).status, 416);
        assert_eq!(expected(RangeSpec::Suffix(0), 100).status, 416);
        assert_eq!(expected(RangeSpec::Suffix(500), 100).content_length, 100);
        assert_eq!(expected(RangeSpec::Whole, 0).status, 200);
        let e = expected(RangeSpec::Suffix(3), 0);
        assert_eq!((e.status, e.content_range.as_deref()), (416, Some("bytes */0")));
        assert_eq!(RangeSpec::Suffix(3).header().as_deref(), Some(&b"bytes=-3"[..]));
        for r in
            [RangeSpec::Whole, RangeSpec::Bounded(3, 9), RangeSpec::From(4), RangeSpec::Suffix(2)]
        {
            assert_eq!(RangeSpec::parse(r.header().as_deref()), Some(r));
        }
        assert_eq!(RangeSpec::parse(Some(b"items=1-2")), None);
    }
}
