//! Single-node engine properties (seeds/engine.md §7), driven by a tiny in-test driver with a fake
//! origin that speaks status codes and headers through the same classification the shell uses.

use super::origin::{classify_probe, finish_range_body, plan_range_response, OriginError};
use super::*;
use crate::geometry::Geometry;
use crate::time::Instant;
use bytes::Bytes;
use proptest::prelude::*;

fn byte_at(offset: u64) -> u8 {
    (offset.wrapping_mul(31) ^ (offset >> 8)) as u8
}

fn content(size: u64) -> Vec<u8> {
    (0..size).map(byte_at).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    Honours,
    IgnoresRange,
    /// Honours the probe but answers block requests with a whole-object 200.
    IgnoresRangeAfterProbe,
    HidesTotal,
    NotFound,
    ServerError,
    /// Answers 206 but sends one byte less than the window.
    Truncates,
    /// Honours the probe but refuses every block fetch with 403 (an expired signature).
    RefusesBlocks,
}

pub(super) struct FakeOrigin {
    pub(super) data: Vec<u8>,
    pub(super) mode: Mode,
    pub(super) probes: usize,
    pub(super) fetches: Vec<(u64, u64)>,
}

impl FakeOrigin {
    pub(super) fn new(size: u64, mode: Mode) -> Self {
        FakeOrigin { data: content(size), mode, probes: 0, fetches: Vec::new() }
    }

    fn size(&self) -> u64 {
        self.data.len() as u64
    }

    pub(super) fn probe(&mut self) -> Result<origin::ProbeOutcome, OriginError> {
        self.probes += 1;
        let size = self.size();
        let (status, cr, cl): (u16, Option<String>, Option<u64>) = match self.mode {
            Mode::NotFound => (404, None, None),
            Mode::ServerError => (500, None, None),
            Mode::IgnoresRange => (200, None, Some(size)),
            Mode::HidesTotal => (206, Some("bytes 0-0/*".into()), Some(1)),
            Mode::Honours
            | Mode::IgnoresRangeAfterProbe
            | Mode::Truncates
            | Mode::RefusesBlocks
                if size == 0 =>
            {
                (416, Some("bytes */0".into()), None)
            }
            Mode::Honours
            | Mode::IgnoresRangeAfterProbe
            | Mode::Truncates
            | Mode::RefusesBlocks => (206, Some(format!("bytes 0-0/{size}")), Some(1)),
        };
        classify_probe(status, cr.as_deref().map(str::as_bytes), cl)
    }

    pub(super) fn fetch(&mut self, start: u64, end: u64) -> Result<FetchedBlock, OriginError> {
        self.fetches.push((start, end));
        let size = self.size();
        let (status, cr, body): (u16, Option<String>, Vec<u8>) = match self.mode {
            Mode::NotFound => (404, None, Vec::new()),
            Mode::ServerError => (500, None, Vec::new()),
            Mode::RefusesBlocks => (403, None, Vec::new()),
            Mode::IgnoresRange | Mode::IgnoresRangeAfterProbe => (200, None, self.data.clone()),
            Mode::Honours | Mode::HidesTotal | Mode::Truncates => {
                let last = end.min(size - 1);
                let mut body = self.data[start as usize..=last as usize].to_vec();
                if self.mode == Mode::Truncates {
                    body.pop();
                }
                let total =
                    if self.mode == Mode::HidesTotal { "*".into() } else { size.to_string() };
                (206, Some(format!("bytes {start}-{last}/{total}")), body)
            }
        };
        let cl = Some(body.len() as u64);
        let plan = plan_range_response(start, end, status, cr.as_deref().map(str::as_bytes), cl)?;
        let skip = plan.skip.min(body.len() as u64) as usize;
        let skipped_all = plan.skip <= body.len() as u64;
        let take = (body.len() - skip).min(plan.read_max as usize);
        let data = Bytes::copy_from_slice(&body[skip..skip + take]);
        let judged = finish_range_body(&plan, skipped_all, data.len() as u64)?;
        Ok(FetchedBlock { data, body: judged, coalesced: false })
    }
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    Finish,
    Passthrough,
    Fail(ReadFailure),
}

#[derive(Debug)]
struct Outcome {
    head: Option<ResponseHead>,
    body: Vec<u8>,
    end: End,
}

struct World {
    engine: Engine,
    origin: FakeOrigin,
    cache: BTreeMap<BlockKey, Bytes>,
    stores: usize,
}

impl World {
    fn new(geometry: Geometry, size: u64, mode: Mode) -> Self {
        let config = EngineConfig { geometry, ..EngineConfig::default() };
        World {
            engine: Engine::new(config),
            origin: FakeOrigin::new(size, mode),
            cache: BTreeMap::new(),
            stores: 0,
        }
    }

    fn small(size: u64, mode: Mode) -> Self {
        Self::new(Geometry::new(16, 4).expect("geometry"), size, mode)
    }

    fn read(&mut self, method: Method, range: Option<&str>) -> Outcome {
        let request = ReadRequest {
            url: "https://origin.example/obj?sig=secret".into(),
            method,
            range: range.map(|r| r.as_bytes().to_vec()),
            conditions: Default::default(),
        };
        let mut read = self.engine.begin_read(request, Instant::ZERO);
        let mut out = Outcome { head: None, body: Vec::new(), end: End::Finish };
        loop {
            let Some(action) = read.poll_action() else {
                panic!("read stalled without a terminal action");
            };
            match action {
                Action::Probe { .. } => {
                    let answer = self.origin.probe();
                    read.handle_probe(&mut self.engine, answer, Instant::ZERO);
                }
                Action::Passthrough { .. } => {
                    out.end = End::Passthrough;
                    break;
                }
                Action::Respond(head) => out.head = Some(*head),
                Action::Lookup { key, window } => {
                    let whole = self.cache.get(&key).cloned();
                    let hit = match window {
                        Some(w) => whole.and_then(|b| w.slice(&b)),
                        None => whole,
                    };
                    read.handle_lookup(&mut self.engine, hit, Instant::ZERO);
                }
                Action::FetchOrigin { start, end, .. } => {
                    let got = self.origin.fetch(start, end);
                    read.handle_fetch(&mut self.engine, got);
                }
                Action::FetchPeer(_)
                | Action::CancelPeer { .. }
                | Action::FillFromOrigin { .. }
                | Action::Learn { .. }
                | Action::StoreWhenConfirmed { .. } => {
                    panic!("single node never asks a peer")
                }
                Action::Store { key, data, .. } => {
                    self.stores += 1;
                    self.cache.entry(key).or_insert(data);
                }
                Action::Emit(bytes) => out.body.extend_from_slice(&bytes),
                Action::Finish => break,
                Action::Fail(f) => {
                    out.end = End::Fail(f);
                    break;
                }
            }
        }
        assert!(read.poll_action().is_none(), "actions after a terminal action");
        assert!(read.is_done());
        self.engine.check_invariants();
        out
    }

    fn expected(&self, start: u64, end: u64) -> Vec<u8> {
        self.origin.data[start as usize..=end as usize].to_vec()
    }
}

#[test]
fn full_read_returns_every_byte_with_200() {
    let mut w = World::small(50, Mode::Honours);
    let out = w.read(Method::Get, None);
    assert_eq!(out.end, End::Finish);
    assert_eq!(
        out.head,
        Some(ResponseHead {
            status: 200,
            content_length: 50,
            content_range: None,
            meta: Default::default()
        })
    );
    assert_eq!(out.body, w.expected(0, 49));
}

#[test]
fn sub_range_returns_exact_bytes_with_206() {
    let mut w = World::small(50, Mode::Honours);
    let out = w.read(Method::Get, Some("bytes=5-9"));
    let head = out.head.expect("head");
    assert_eq!((head.status, head.content_length), (206, 5));
    assert_eq!(head.content_range.as_deref(), Some("bytes 5-9/50"));
    assert_eq!(out.body, w.expected(5, 9));
}

#[test]
fn a_range_across_block_and_chunk_boundaries_is_assembled_in_order() {
    let mut w = World::small(50, Mode::Honours);
    let out = w.read(Method::Get, Some("bytes=14-33"));
    assert_eq!(out.body, w.expected(14, 33));
    // Blocks 3..=8 were each fetched once with their exact windows.
    let want: Vec<(u64, u64)> = (3..=8).map(|b| (b * 4, b * 4 + 3)).collect();
    assert_eq!(w.origin.fetches, want);
}

#[test]
fn the_end_is_clamped_to_the_last_byte_and_a_start_past_the_end_is_416() {
    let mut w = World::small(10, Mode::Honours);
    let out = w.read(Method::Get, Some("bytes=8-1000"));
    assert_eq!(
        out.head.as_ref().map(|h| h.content_range.clone()),
        Some(Some("bytes 8-9/10".into()))
    );
    assert_eq!(out.body, w.expected(8, 9));
    let out = w.read(Method::Get, Some("bytes=10-20"));
    let head = out.head.expect("head");
    assert_eq!((head.status, head.content_range.as_deref()), (416, Some("bytes */10")));
    assert!(out.body.is_empty());
}

#[test]
fn the_final_short_block_is_fetched_clamped_to_the_object() {
    let mut w = World::small(10, Mode::Honours);
    let out = w.read(Method::Get, Some("bytes=-3"));
    assert_eq!(out.body, w.expected(7, 9));
    assert_eq!(w.origin.fetches, vec![(4, 7), (8, 9)]);
}

#[test]
fn the_size_comes_from_exactly_one_ranged_probe() {
    let mut w = World::small(33, Mode::Honours);
    w.read(Method::Head, None);
    w.read(Method::Get, Some("bytes=0-0"));
    w.read(Method::Get, None);
    assert_eq!(w.origin.probes, 1);
    assert_eq!(
        w.engine.object(&w.engine.identify("https://origin.example/obj")),
        Some(ObjectInfo::Sized(33))
    );
}

#[test]
fn a_hidden_total_fails_the_probe_and_caches_nothing() {
    let mut w = World::small(33, Mode::HidesTotal);
    let out = w.read(Method::Get, None);
    let End::Fail(f) = out.end else { panic!("must fail") };
    assert_eq!((f.committed, f.status), (false, 502));
    assert_eq!(f.error, ReadError::Origin(OriginError::HiddenTotal));
    w.read(Method::Get, None);
    assert_eq!(w.origin.probes, 2, "nothing learnt, so the next read probes again");
    assert!(w.cache.is_empty());
}

#[test]
fn a_repeated_read_is_served_from_cache_without_origin_requests() {
    let mut w = World::small(50, Mode::Honours);
    w.read(Method::Get, None);
    let fetches = w.origin.fetches.len();
    let out = w.read(Method::Get, None);
    assert_eq!(out.body, w.expected(0, 49));
    assert_eq!(w.origin.fetches.len(), fetches);
    assert_eq!(w.origin.probes, 1);
    let s = w.engine.stats();
    assert_eq!((s.block_source_origin, s.block_source_cache), (13, 13));
}

#[test]
fn an_origin_error_is_502_and_an_origin_404_stays_404() {
    let mut w = World::small(50, Mode::ServerError);
    let End::Fail(f) = w.read(Method::Get, None).end else { panic!() };
    assert_eq!((f.status, f.committed), (502, false));
    let mut w = World::small(50, Mode::NotFound);
    let End::Fail(f) = w.read(Method::Get, None).end else { panic!() };
    assert_eq!((f.status, f.committed), (404, false));
}

#[test]
fn head_answers_headers_without_fetching_blocks() {
    let mut w = World::small(50, Mode::Honours);
    let out = w.read(Method::Head, Some("bytes=3-7"));
    assert_eq!(out.head.map(|h| (h.status, h.content_length)), Some((206, 5)));
    assert!(out.body.is_empty());
    assert!(w.origin.fetches.is_empty());
}

#[test]
fn a_range_blind_origin_is_marked_and_proxied_without_caching() {
    let mut w = World::small(50, Mode::IgnoresRange);
    assert_eq!(w.read(Method::Get, Some("bytes=1-2")).end, End::Passthrough);
    assert_eq!(w.read(Method::Head, None).end, End::Passthrough);
    assert_eq!(w.origin.probes, 1, "the mark is remembered");
    assert!(w.origin.fetches.is_empty() && w.cache.is_empty());
    assert_eq!(w.engine.stats().passthrough, 2);
}

#[test]
fn a_range_capable_origin_is_never_marked() {
    let mut w = World::small(50, Mode::Honours);
    assert_eq!(w.read(Method::Get, Some("bytes=1-2")).end, End::Finish);
    assert_eq!(w.engine.stats().passthrough, 0);
}

#[test]
fn bytes_sliced_from_a_range_ignored_200_are_served_but_never_cached() {
    let mut w = World::small(50, Mode::IgnoresRangeAfterProbe);
    let out = w.read(Method::Get, Some("bytes=5-20"));
    assert_eq!(out.end, End::Finish);
    assert_eq!(out.body, w.expected(5, 20));
    assert!(w.cache.is_empty());
    assert_eq!(w.stores, 0);
    assert_eq!(w.engine.stats().uncacheable, 5);
    // The block fetch revealed what the probe did not: later reads are proxied verbatim.
    let id = w.engine.identify("https://origin.example/obj");
    assert_eq!(w.engine.object(&id), Some(ObjectInfo::RangeBlind));
    assert_eq!(w.read(Method::Get, Some("bytes=0-3")).end, End::Passthrough);
    assert_eq!(w.engine.stats().probes, 1, "marking is not probing");
}

#[test]
fn a_short_origin_block_fails_the_read_and_is_never_cached() {
    let mut w = World::small(50, Mode::Truncates);
    let End::Fail(f) = w.read(Method::Get, Some("bytes=0-3")).end else { panic!() };
    assert!(!f.committed, "the head waits for the first block: a clean status");
    assert_eq!(f.status, 502);
    assert!(matches!(f.error, ReadError::Origin(OriginError::BodyLength { want: 4, got: 3 })));
    assert!(w.cache.is_empty());
}

#[test]
fn an_empty_object_is_a_200_with_no_body_and_every_range_is_416() {
    let mut w = World::small(0, Mode::Honours);
    let out = w.read(Method::Get, None);
    assert_eq!(
        out.head,
        Some(ResponseHead {
            status: 200,
            content_length: 0,
            content_range: None,
            meta: Default::default()
        })
    );
    for r in ["bytes=0-0", "bytes=0-", "bytes=-1"] {
        for m in [Method::Get, Method::Head] {
            let head = w.read(m, Some(r)).head.expect("head");
            assert_eq!(
                (head.status, head.content_range.as_deref()),
                (416, Some("bytes */0")),
                "{r}"
            );
        }
    }
}

#[test]
fn a_wrong_length_cached_block_is_treated_as_a_miss() {
    let mut w = World::small(8, Mode::Honours);
    let id = w.engine.identify("https://origin.example/obj");
    w.read(Method::Head, None);
    let key = w.engine.block_key(&id, 0);
    w.cache.insert(key, Bytes::from_static(b"xy"));
    let out = w.read(Method::Get, Some("bytes=0-3"));
    assert_eq!(out.body, w.expected(0, 3));
    assert_eq!(w.engine.stats().cache_corrupt, 1);
}

#[test]
fn presigned_urls_of_one_object_share_identity_and_cache() {
    let mut w = World::small(50, Mode::Honours);
    w.read(Method::Get, None);
    let fetches = w.origin.fetches.len();
    let mut read = w.engine.begin_read(
        ReadRequest {
            url: "https://origin.example/obj?sig=other".into(),
            method: Method::Get,
            range: None,
            conditions: Default::default(),
        },
        Instant::ZERO,
    );
    assert!(
        matches!(read.poll_action(), Some(Action::Lookup { .. })),
        "no probe: the size is known"
    );
    assert_eq!(w.origin.fetches.len(), fetches);
}

proptest! {
    #[test]
    fn any_range_of_any_object_returns_exactly_its_bytes(
        block in 1u64..9, per_chunk in 1u64..4, size in 0u64..200,
        a in 0u64..220, b in 0u64..220, twice in any::<bool>(),
    ) {
        let geometry = Geometry::new(block * per_chunk, block).expect("geometry");
        let mut w = World::new(geometry, size, Mode::Honours);
        let header = format!("bytes={}-{}", a.min(b), a.max(b));
        let rounds = if twice { 2 } else { 1 };
        for _ in 0..rounds {
            let out = w.read(Method::Get, Some(&header));
            let head = out.head.expect("head");
            if a.min(b) < size {
                let end = a.max(b).min(size - 1);
                prop_assert_eq!(head.status, 206);
                prop_assert_eq!(out.body, w.expected(a.min(b), end));
            } else {
                prop_assert_eq!(head.status, 416);
            }
        }
        for (key, data) in &w.cache {
            let len = geometry.block_len(size, key.block);
            prop_assert_eq!(Some(data.len() as u64), len, "cached block has its geometry length");
        }
        prop_assert!(w.origin.fetches.len() as u64 <= geometry.block_count(size));
    }
}

#[test]
fn identify_answers_as_object_id_whichever_urls_came_before() {
    use crate::identity::{object_id, IdLayout};
    use rand::{Rng as _, SeedableRng as _};
    let seed = 0x1d_u64;
    println!("seed {seed}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for layout in [IdLayout::Distribution, IdLayout::OciOnly] {
        let engine = Engine::new(EngineConfig { layout, ..EngineConfig::default() });
        // More URLs than the memo holds, asked in a random order so that they repeat, fall out
        // and come back; some differ only in their query or case.
        let urls: Vec<String> = (0..20)
            .map(|i| match i % 4 {
                0 => format!("http://origin/o{i}"),
                1 => format!("HTTP://Origin/o{}?sig={i}", i - 1),
                2 => format!("https://r/v2/x/blobs/sha256:{i:064x}"),
                _ => format!("/relative/{i}"),
            })
            .collect();
        for step in 0..400 {
            let url = &urls[rng.random_range(0..urls.len())];
            assert_eq!(engine.identify(url), object_id(url, layout), "step {step} {url}");
        }
    }
}
