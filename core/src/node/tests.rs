//! The node machine driven by hand: a scripted origin and peers answer its exchanges, and every
//! test checks the outputs and the machine's invariants after every input.

use super::*;
use crate::breaker::{BackoffPolicy, Breaker, BreakerConfig, CircuitState};
use crate::engine::hedge::{COLD_DELAY, COLD_PROBE_DELAY, DEFAULT_HEDGE_RATIO};
use crate::engine::route::Placement;
use crate::engine::{BlockClass, EngineConfig, P2p};
use crate::geometry::Geometry;
use crate::integrity::{xxh3_128, DIGEST_ALGORITHM, FOOTER_LEN, HEADER_DIGEST};
use crate::membership::{Member, View};
use bytes::Bytes;
use std::time::Duration;

const BLOCK: u64 = 1024;
const SIZE: u64 = 3 * BLOCK + 100;

fn byte_at(i: u64) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 7)) as u8
}

fn content(start: u64, len: u64) -> Bytes {
    content_of(0, start, len)
}

/// The bytes of version `v` of the object (version 0 is [`content`]).
fn content_of(v: u8, start: u64, len: u64) -> Bytes {
    (start..start + len).map(|i| byte_at(i) ^ v).collect::<Vec<u8>>().into()
}

fn engine() -> Engine {
    let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
    // One block at a time: these tests script every exchange (read-ahead has its own tests).
    Engine::new(EngineConfig {
        geometry,
        read_ahead: 0,
        origin_read_ahead: 0,
        ..EngineConfig::default()
    })
}

/// A node whose origin is declared public (no credential checks: the access tests below use
/// [`checked_node_with`]).
fn node_with(engine: Engine, self_id: &str) -> Node {
    let access = Access { public: vec!["origin".parse().expect("pattern")], ..Access::default() };
    node_with_access(engine, self_id, access)
}

fn node_with_access(engine: Engine, self_id: &str, access: Access) -> Node {
    let config = NodeConfig {
        mode: UpstreamMode::prefix("dart"),
        bounds: Bounds::default(),
        self_id: self_id.to_owned(),
        advertise: format!("{self_id}:9000"),
        access,
    };
    Node::new(engine, config).expect("valid bounds")
}

/// A reader outside a one-member view whose every miss goes to `parent`.
/// A reader whose one ancestor is `parent`, hedging off (these tests script one exchange at a
/// time; [`reader_hedging_to_origin`] has the origin backup on).
fn reader_of(parent: &str) -> Node {
    reader_of_hedging(parent, false)
}

fn reader_of_hedging(parent: &str, hedge: bool) -> Node {
    let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
    let mut e = Engine::new(EngineConfig {
        geometry,
        read_ahead: 0,
        origin_read_ahead: 0,
        hedge,
        ..EngineConfig::default()
    });
    let view = View::new(vec![Member::ready("parent", parent)]);
    let placement = Placement::new(view, "reader", 2, 1);
    let breaker = Breaker::new(BreakerConfig {
        failure_threshold: 3,
        backoff: BackoffPolicy::Fixed { cooldown: Duration::from_secs(5) },
        ..BreakerConfig::default()
    })
    .expect("breaker");
    e.enable_p2p(P2p { placement, breaker });
    node_with(e, "reader")
}

const URL: &str = "http://origin/o/obj";

/// What the scripted origin serves: version `version` of the object, named by `etag`, with
/// `extra` header fields on every answer; or `status` instead when set.
#[derive(Default)]
struct Origin {
    version: u8,
    etag: Option<String>,
    extra: Vec<(&'static str, &'static str)>,
    status: Option<u16>,
    /// A private origin: a request passes with `sig=<secret>` in its URL or
    /// `Authorization: Bearer <secret>`; otherwise it gets 403 (401 with a challenge when it
    /// sent an `Authorization`).
    secret: Option<&'static str>,
    /// How long the origin takes to send a block window's head after the request (`.0`) and
    /// its body after the head (`.1`): the harness's clock moves on by each.
    pace: (Duration, Duration),
}

struct Harness {
    node: Node,
    now: Instant,
    outputs: Vec<Output>,
    store: std::collections::BTreeMap<crate::hash::BlockKey, Bytes>,
    origin: Origin,
    /// The transport takes every body part at once (`false`: the requester stopped reading).
    drain: bool,
    /// Responses the transport hashes ([`Output::Hash`]), answered at [`Output::Seal`].
    hashing: std::collections::BTreeMap<RequestId, crate::registry::DigestAlgorithm>,
    /// Peer block fetches sent, and the body of each one answered `200` so far: [`Harness::io`]
    /// plays an honest peer's wire form (the digest header and footer, `crate::integrity`).
    peer_blocks: std::collections::BTreeMap<IoId, Option<Vec<u8>>>,
    /// Requests made on the peer plane.
    peer_requests: std::collections::BTreeSet<u64>,
    /// The store keeps no block put to it (a full borrowed budget refusing, a degraded disk).
    refuse_puts: bool,
}

impl Harness {
    fn new(node: Node) -> Self {
        Harness {
            node,
            now: Instant::ZERO,
            outputs: Vec::new(),
            store: Default::default(),
            origin: Origin::default(),
            drain: true,
            hashing: Default::default(),
            peer_blocks: Default::default(),
            peer_requests: Default::default(),
            refuse_puts: false,
        }
    }

    /// The origin now serves version `v`, named `"v{v}"`.
    fn publish(&mut self, v: u8) {
        self.origin.version = v;
        self.origin.etag = Some(format!("\"v{v}\""));
    }

    /// Feeds `input`, answers store look-ups from the in-test store, and keeps every output.
    fn feed(&mut self, input: Input) {
        self.node.handle_input(input, self.now);
        self.pump();
    }

    /// Drains the node, answering store look-ups and draining body parts at once.
    fn pump(&mut self) {
        self.node.check_invariants();
        let mut queue = Vec::new();
        while let Some(out) = self.node.poll_output() {
            match &out {
                Output::StoreGet { op, key, window } => {
                    let whole = self.store.get(key).cloned();
                    let block = match window {
                        Some(w) => whole.and_then(|b| w.slice(&b)),
                        None => whole,
                    };
                    queue.push(Input::Store { op: *op, block })
                }
                Output::StorePut { key, data, digest, .. } if !self.refuse_puts => {
                    if let Some(digest) = digest {
                        assert_eq!(*digest, crate::integrity::xxh3_128(data), "a put's digest");
                    }
                    self.store.entry(*key).or_insert_with(|| data.clone());
                }
                Output::StoreDrop { keys } => {
                    for key in keys {
                        self.store.remove(key);
                    }
                }
                Output::Send(r)
                    if r.endpoint == Endpoint::Peer
                        && r.url.contains(crate::codec::wire::BLOCK_PATH_PREFIX) =>
                {
                    self.peer_blocks.insert(r.id, None);
                }
                Output::Body { id, .. } if self.drain => queue.push(Input::Drained { id: *id }),
                Output::Hash { id, algorithm } => {
                    self.hashing.insert(*id, *algorithm);
                }
                Output::Seal { id } => {
                    // The transport's digest of every part it was given.
                    let algorithm = self.hashing.remove(id).expect("a seal of a hashed response");
                    let mut hasher = crate::registry::Hasher::new(algorithm);
                    for o in &self.outputs {
                        if let Output::Body { id: rid, data } = o {
                            if rid == id {
                                hasher.update(data);
                            }
                        }
                    }
                    queue.push(Input::Sealed { id: *id, digest: hasher.finish() });
                }
                _ => {}
            }
            self.outputs.push(out);
        }
        for input in queue {
            self.feed(input);
        }
    }

    /// No timer outlives the work (`what` says whose): the only one left, if any, is the idle
    /// release ([`super::IDLE_RELEASE_AFTER`], its own test fires it), and nothing is live.
    fn assert_settled(&self, what: &str) {
        if let Some(at) = self.node.poll_timeout() {
            assert_eq!(self.node.idle_release_at, Some(at), "{what}: a timer outlives the work");
        }
        assert_eq!(self.node.live_requests(), 0, "{what}: a request is live");
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        if self.node.poll_timeout().is_some_and(|t| t <= self.now) {
            self.node.handle_timeout(self.now);
            assert!(self.node.poll_timeout().is_none_or(|t| t > self.now));
            self.pump();
        }
    }

    fn get(&mut self, id: u64, plane: Plane, target: &str, headers: Headers) {
        if plane == Plane::Peer {
            self.peer_requests.insert(id);
        }
        let request =
            Inbound { method: "GET".into(), target: target.into(), headers, body: Bytes::new() };
        self.feed(Input::Request { id: RequestId(id), plane, request });
    }

    fn read(&mut self, id: u64, range: Option<&str>) {
        let headers = range.map_or_else(Headers::new, |r| Headers::new().with("range", r));
        self.get(id, Plane::Client, &format!("/dart/{URL}"), headers);
    }

    /// The exchanges sent and not yet answered by the harness, oldest first.
    fn sends(&self) -> Vec<IoRequest> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::Send(r) => Some(r.clone()),
                _ => None,
            })
            .collect()
    }

    fn take_sends(&mut self) -> Vec<IoRequest> {
        let sends = self.sends();
        self.outputs.retain(|o| !matches!(o, Output::Send(_)));
        sends
    }

    /// Answers exchange `id` with `event`. A peer's block answer is given the wire form an
    /// honest peer sends (`crate::integrity`): a `200` head gains the digest header (and the
    /// footer in its `Content-Length`), and the digest of the body so far goes before its end.
    /// [`Harness::io_raw`] sends events as they are.
    fn io(&mut self, id: IoId, event: IoEvent) {
        let event = match (self.peer_blocks.get_mut(&id), event) {
            (Some(body), IoEvent::Head { status: 200, headers }) => {
                *body = Some(Vec::new());
                let mut wire = Headers::new().with(HEADER_DIGEST, DIGEST_ALGORITHM);
                for (name, value) in headers.iter() {
                    match (name, headers.get_u64("content-length")) {
                        ("content-length", Some(n)) => {
                            wire.push(name, (n + FOOTER_LEN).to_string())
                        }
                        _ => wire.push(name, value),
                    }
                }
                IoEvent::Head { status: 200, headers: wire }
            }
            (Some(Some(body)), IoEvent::Body(data)) => {
                body.extend_from_slice(&data);
                IoEvent::Body(data)
            }
            (Some(Some(body)), IoEvent::End) => {
                let footer = xxh3_128(body).footer();
                self.peer_blocks.remove(&id);
                if self.node.exchanges().iter().any(|(i, _, _)| *i == id) {
                    self.io_raw(id, IoEvent::Body(footer));
                }
                IoEvent::End
            }
            (_, event) => event,
        };
        self.io_raw(id, event);
    }

    /// Answers exchange `id` with exactly `event`.
    fn io_raw(&mut self, id: IoId, event: IoEvent) {
        self.feed(Input::Io { id, event });
    }

    /// What request `id` served: a relay that ended, its block ([`Harness::relay_block_of`]);
    /// else every body byte so far.
    fn served_of(&self, id: u64) -> Vec<u8> {
        let relay = self.peer_requests.contains(&id) && self.ended(id);
        if relay && self.head_of(id).is_some_and(|h| h.status == 200) {
            self.relay_block_of(id)
        } else {
            self.body_of(id)
        }
    }

    /// The block relay request `id` answered: its body without the digest footer, which must
    /// be the digest of the block (`crate::integrity`).
    fn relay_block_of(&self, id: u64) -> Vec<u8> {
        let mut body = self.body_of(id);
        assert!(body.len() as u64 >= FOOTER_LEN, "no room for a footer: {} bytes", body.len());
        let footer = body.split_off(body.len() - FOOTER_LEN as usize);
        assert_eq!(xxh3_128(&body).footer(), footer, "the footer is the block's digest");
        body
    }

    /// Answers an origin GET like an RFC 9110 origin serving [`SIZE`] bytes.
    fn answer_origin(&mut self, req: &IoRequest) {
        let range = req.headers.get_str("range").expect("a ranged GET");
        let (s, e) = range.strip_prefix("bytes=").and_then(|r| r.split_once('-')).expect("range");
        let (s, e): (u64, u64) = (s.parse().expect("start"), e.parse().expect("end"));
        let e = e.min(SIZE - 1);
        self.io(req.id, IoEvent::Connected);
        if let Some(status) = self.origin.status {
            self.io(req.id, IoEvent::Head { status, headers: Headers::new() });
            return;
        }
        if let Some(secret) = self.origin.secret {
            let by_url = req.url.contains(&format!("sig={secret}"));
            let auth = req.headers.get_str("authorization");
            if !(by_url || auth == Some(&format!("Bearer {secret}"))) {
                let (status, headers) = match auth {
                    Some(_) => (401, Headers::new().with("www-authenticate", "Bearer realm=\"o\"")),
                    None => (403, Headers::new()),
                };
                self.io(req.id, IoEvent::Head { status, headers });
                return;
            }
        }
        let mut headers = Headers::new()
            .with("content-range", format!("bytes {s}-{e}/{SIZE}"))
            .with("content-length", (e - s + 1).to_string());
        if let Some(etag) = &self.origin.etag {
            headers = headers.with("etag", etag.clone());
        }
        for (name, value) in &self.origin.extra {
            headers = headers.with(name, *value);
        }
        let (wait, transfer) = self.origin.pace;
        self.advance(wait);
        self.io(req.id, IoEvent::Head { status: 206, headers });
        if self.node.exchanges().iter().any(|(i, _, _)| *i == req.id) {
            self.io(req.id, IoEvent::Body(content_of(self.origin.version, s, e - s + 1)));
        }
        self.advance(transfer);
        if self.node.exchanges().iter().any(|(i, _, _)| *i == req.id) {
            self.io(req.id, IoEvent::End);
        }
    }

    /// Answers every origin exchange until none is left.
    fn serve_origin(&mut self) {
        loop {
            let sends: Vec<IoRequest> =
                self.take_sends().into_iter().filter(|r| r.endpoint == Endpoint::Origin).collect();
            if sends.is_empty() {
                return;
            }
            for r in sends {
                self.answer_origin(&r);
            }
        }
    }

    fn body_of(&self, id: u64) -> Vec<u8> {
        let mut body = Vec::new();
        for o in &self.outputs {
            if let Output::Body { id: rid, data } = o {
                if rid.0 == id {
                    body.extend_from_slice(data);
                }
            }
        }
        body
    }

    fn head_of(&self, id: u64) -> Option<Head> {
        self.outputs.iter().find_map(|o| match o {
            Output::Respond { id: rid, head } if rid.0 == id => Some(head.clone()),
            _ => None,
        })
    }

    fn ended(&self, id: u64) -> bool {
        self.outputs.iter().any(|o| matches!(o, Output::End { id: rid } if rid.0 == id))
    }

    fn aborted(&self, id: u64) -> bool {
        self.outputs.iter().any(|o| matches!(o, Output::Abort { id: rid } if rid.0 == id))
    }

    fn cancelled(&self, io: IoId) -> bool {
        self.outputs.iter().any(|o| matches!(o, Output::Cancel(i) if *i == io))
    }
}

fn releases(h: &Harness) -> usize {
    h.outputs.iter().filter(|o| matches!(o, Output::ReleaseMemory)).count()
}

/// A node that worked and then had no live request for `IDLE_RELEASE_AFTER` asks the shell,
/// once, to give back the memory it kept for reuse; a read inside that time puts it off, and an
/// idle node that did nothing since does not ask again.
#[test]
fn an_idle_node_releases_memory_once_after_its_last_read_and_a_read_puts_it_off() {
    let mut h = Harness::new(node_with(engine(), ""));
    assert_eq!(h.node.poll_timeout(), None, "a node that never worked has nothing to release");
    h.read(1, None);
    h.serve_origin();
    assert!(h.ended(1));
    let first_end = h.now;
    assert_eq!(h.node.poll_timeout(), Some(first_end + super::IDLE_RELEASE_AFTER));
    // A read a second before the release is due puts it off until after that read.
    h.advance(super::IDLE_RELEASE_AFTER - Duration::from_secs(1));
    assert_eq!(releases(&h), 0);
    h.read(2, Some("bytes=0-9"));
    assert!(h.ended(2), "a hit, served at once");
    let second_end = h.now;
    assert_eq!(h.node.poll_timeout(), Some(second_end + super::IDLE_RELEASE_AFTER));
    h.advance(super::IDLE_RELEASE_AFTER - Duration::from_millis(1));
    assert_eq!(releases(&h), 0);
    h.advance(Duration::from_millis(1));
    assert_eq!(releases(&h), 1, "released when due");
    assert_eq!(h.node.counters().memory_releases, 1);
    assert!(h.node.recent_digests.is_empty(), "no block is kept alive to save a hash");
    assert_eq!(h.node.poll_timeout(), None, "nothing left to wake the node");
    h.advance(Duration::from_secs(3600));
    assert_eq!(releases(&h), 1, "an idle node that did nothing since does not ask again");
    // Work again: released again after it.
    h.read(3, Some("bytes=0-9"));
    h.serve_origin();
    assert_eq!(h.body_of(3), content(0, 10).to_vec());
    h.advance(super::IDLE_RELEASE_AFTER);
    assert_eq!(releases(&h), 2);
    h.node.check_invariants();
}

#[test]
fn a_cold_read_probes_fetches_every_block_and_serves_exact_bytes() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    let probe = h.take_sends();
    assert_eq!(probe.len(), 1);
    assert_eq!(probe[0].headers.get_str("range"), Some("bytes=0-0"));
    assert_eq!(probe[0].url, URL);
    h.answer_origin(&probe[0]);
    assert!(h.cancelled(probe[0].id), "a probe's body is never read");
    h.serve_origin();
    let head = h.head_of(1).expect("a head");
    assert_eq!((head.status, head.content_length(), head.body), (200, Some(SIZE), true));
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert!(h.ended(1));
    assert_eq!(h.store.len(), 4, "every block cached");
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("no timer outlives its exchange");
}

// ---- A cold client read passes its origin window on as it arrives ----

/// Starts a client read of `range` (bytes within block 1) on a node whose origin names its
/// version with `etag` (or none), answers the probe and the window's head, and returns the
/// window's exchange and its first byte.
fn cold_window(h: &mut Harness, range: &str, etag: Option<&str>) -> (IoRequest, u64) {
    if let Some(etag) = etag {
        h.origin.etag = Some(etag.to_owned());
    }
    h.read(1, Some(range));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let window = h.take_sends().remove(0);
    assert_eq!(
        window.headers.get_str("range"),
        Some(format!("bytes={BLOCK}-{}", 2 * BLOCK - 1).as_str())
    );
    h.io(window.id, IoEvent::Connected);
    let mut headers = Headers::new()
        .with("content-range", format!("bytes {BLOCK}-{}/{SIZE}", 2 * BLOCK - 1))
        .with("content-length", BLOCK.to_string());
    if let Some(etag) = etag {
        headers = headers.with("etag", etag);
    }
    h.io(window.id, IoEvent::Head { status: 206, headers });
    (window, BLOCK)
}

#[test]
fn a_cold_client_read_passes_its_origin_window_on_as_it_arrives() {
    let mut h = Harness::new(node_with(engine(), ""));
    let range = format!("bytes={}-{}", BLOCK + 100, 2 * BLOCK - 1);
    let (window, start) = cold_window(&mut h, &range, Some("\"v0\""));
    assert!(h.head_of(1).is_none(), "the head waits for the first bytes");
    h.io(window.id, IoEvent::Body(content(start, 300)));
    // The range's first 200 bytes arrived: they go out at once, after the held head.
    assert_eq!(h.head_of(1).map(|x| x.status), Some(206));
    assert_eq!(h.body_of(1), content(BLOCK + 100, 200).to_vec());
    h.io(window.id, IoEvent::Body(content(start + 300, BLOCK - 300)));
    // All but the block's last byte: the end proves the window's length first.
    assert_eq!(h.body_of(1).len() as u64, BLOCK - 100 - 1);
    h.io(window.id, IoEvent::End);
    assert_eq!(h.body_of(1), content(BLOCK + 100, BLOCK - 100).to_vec());
    assert!(h.ended(1));
    assert_eq!(h.store.len(), 1, "the window is cached as before");
    let s = h.node.stats();
    assert_eq!((s.origin_streams, s.origin_streamed_bytes), (1, BLOCK - 100 - 1));
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_range_that_ends_inside_the_window_ends_when_its_bytes_went_out_and_the_window_is_still_cached()
{
    let mut h = Harness::new(node_with(engine(), ""));
    let range = format!("bytes={}-{}", BLOCK + 10, BLOCK + 209);
    let (window, start) = cold_window(&mut h, &range, Some("\"v0\""));
    h.io(window.id, IoEvent::Body(content(start, 300)));
    // Its 200 bytes arrived: the response is over, without waiting for the rest of the window.
    assert_eq!(h.body_of(1), content(BLOCK + 10, 200).to_vec());
    assert!(h.ended(1));
    assert_eq!(h.node.live_requests(), 0);
    assert!(!h.cancelled(window.id), "the window goes on");
    h.io(window.id, IoEvent::Body(content(start + 300, BLOCK - 300)));
    h.io(window.id, IoEvent::End);
    assert_eq!(h.store.len(), 1, "and fills the store");
    let s = h.node.stats();
    assert_eq!((s.origin_bytes, s.block_source_origin, s.client_bytes), (BLOCK, 1, 200));
    // The next read of that block is a hit.
    h.read(2, Some(&range));
    assert_eq!(h.body_of(2), content(BLOCK + 10, 200).to_vec());
    assert!(h.take_sends().is_empty());
}

/// A cold read of block 1's bytes `first..=last` (offsets in the object) as [`cold_window`]
/// starts one: the window and the read's lead-in (`crate::node::lead_in`) both sent, both
/// connected, the window's head in (with `etag`); the lead-in's head is the test's to give.
fn deep_cold_read(h: &mut Harness, first: u64, last: u64, etag: &str) -> (IoRequest, IoRequest) {
    h.origin.etag = Some(etag.to_owned());
    h.read(1, Some(&format!("bytes={first}-{last}")));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let sends = h.take_sends();
    let purposes: Vec<Purpose> = sends.iter().map(|s| s.purpose).collect();
    assert_eq!(purposes, [Purpose::LeadIn, Purpose::Window], "the read's span, then the window");
    let (lead, window) = (sends[0].clone(), sends[1].clone());
    assert_eq!(lead.headers.get_str("range"), Some(format!("bytes={first}-{last}").as_str()));
    assert_eq!(lead.url, window.url, "under the window's URL");
    h.io(window.id, IoEvent::Connected);
    h.io(lead.id, IoEvent::Connected);
    h.io(window.id, span_head(BLOCK, 2 * BLOCK - 1, etag));
    (window, lead)
}

/// The head an origin sends for bytes `first..=last`, version `etag` (block 1's window head:
/// `span_head(BLOCK, 2 * BLOCK - 1, etag)`).
fn span_head(first: u64, last: u64, etag: &str) -> IoEvent {
    let headers = Headers::new()
        .with("content-range", format!("bytes {first}-{last}/{SIZE}"))
        .with("content-length", (last - first + 1).to_string())
        .with("etag", etag);
    IoEvent::Head { status: 206, headers }
}

#[test]
fn a_cold_read_deep_in_a_block_takes_its_bytes_from_a_lead_in_without_waiting_for_the_window() {
    let mut h = Harness::new(node_with(engine(), ""));
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
    h.io(lead.id, span_head(first, last, "\"v0\""));
    h.io(lead.id, IoEvent::Body(content(first, 100)));
    // The window has sent nothing yet: its first 600 bytes are not the read's.
    assert_eq!(h.head_of(1).map(|x| x.status), Some(206));
    assert_eq!(h.body_of(1), content(first, 100).to_vec());
    // The window overtakes it for a while: each byte goes out once, from whichever has it.
    h.io(window.id, IoEvent::Body(content(BLOCK, 750)));
    assert_eq!(h.body_of(1), content(first, 150).to_vec());
    h.io(lead.id, IoEvent::Body(content(first + 100, 100)));
    assert_eq!(h.body_of(1), content(first, 200).to_vec());
    assert!(h.ended(1), "the span went out: the response is over");
    assert!(h.cancelled(lead.id), "the lead-in's rest is not needed");
    assert_eq!(h.node.live_requests(), 0);
    assert!(!h.cancelled(window.id), "the window goes on");
    h.io(window.id, IoEvent::Body(content(BLOCK + 750, BLOCK - 750)));
    h.io(window.id, IoEvent::End);
    assert_eq!(h.store.len(), 1, "and fills the store");
    let s = h.node.stats();
    assert_eq!((s.origin_bytes, s.client_bytes), (BLOCK + 200, 200), "the lead-in's bytes count");
    assert_eq!(h.node.counters().origin_lead_ins, 1);
    // A hit now: no lead-in, no window.
    h.read(2, Some(&format!("bytes={first}-{last}")));
    assert_eq!(h.body_of(2), content(first, 200).to_vec());
    assert!(h.take_sends().is_empty());
}

#[test]
fn a_lead_in_that_answers_before_the_window_starts_the_reads_stream() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.origin.etag = Some("\"v0\"".into());
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    h.read(1, Some(&format!("bytes={first}-{last}")));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let sends = h.take_sends();
    let (lead, window) = (sends[0].clone(), sends[1].clone());
    // The lead-in's whole span comes before the window's head: the response is over.
    h.answer_origin(&lead);
    assert_eq!(h.body_of(1), content(first, 200).to_vec());
    assert!(h.ended(1));
    assert!(h.node.exchanges().iter().all(|(i, _, _)| *i != lead.id), "the lead-in is over");
    h.answer_origin(&window);
    assert_eq!(h.body_of(1), content(first, 200).to_vec(), "nothing more");
    assert_eq!(h.store.len(), 1);
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_lead_in_whose_head_is_not_exactly_the_reads_span_of_its_version_is_dropped() {
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    let heads = [
        ("another version", span_head(first, last, "\"v1\"")),
        ("another range", span_head(first, last + 1, "\"v0\"")),
        ("another size", {
            let headers = Headers::new()
                .with("content-range", format!("bytes {first}-{last}/{}", SIZE + 1))
                .with("etag", "\"v0\"");
            IoEvent::Head { status: 206, headers }
        }),
        ("the whole object", IoEvent::Head { status: 200, headers: Headers::new() }),
        ("a refusal", IoEvent::Head { status: 403, headers: Headers::new() }),
    ];
    for (what, head) in heads {
        let mut h = Harness::new(node_with(engine(), ""));
        let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
        h.io(lead.id, head);
        assert!(h.cancelled(lead.id), "{what}: dropped");
        assert!(h.body_of(1).is_empty(), "{what}: nothing of it went out");
        // The window serves the read as it would have without it.
        h.io(window.id, IoEvent::Body(content(BLOCK, BLOCK)));
        h.io(window.id, IoEvent::End);
        assert_eq!(h.body_of(1), content(first, 200).to_vec(), "{what}");
        assert!(h.ended(1), "{what}");
        assert_eq!(h.store.len(), 1, "{what}");
    }
}

#[test]
fn a_lead_in_that_fails_midway_leaves_the_rest_of_the_span_to_the_window() {
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    for expire in [false, true] {
        let mut h = Harness::new(node_with(engine(), ""));
        let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
        h.io(lead.id, span_head(first, last, "\"v0\""));
        h.io(lead.id, IoEvent::Body(content(first, 50)));
        if expire {
            h.advance(Duration::from_secs(301));
        } else {
            h.io(lead.id, IoEvent::Failed(IoError::Broken("reset".into())));
        }
        assert!(h.node.exchanges().iter().all(|(i, _, _)| *i != lead.id), "expire {expire}");
        if expire {
            // The window had the same bounds: it expired too, and the read's response, begun,
            // is cut short.
            assert!(h.aborted(1));
            continue;
        }
        h.io(window.id, IoEvent::Body(content(BLOCK, BLOCK)));
        h.io(window.id, IoEvent::End);
        assert_eq!(h.body_of(1), content(first, 200).to_vec(), "every byte once, in order");
        assert!(h.ended(1));
    }
}

#[test]
fn a_window_that_fails_while_its_lead_in_streams_cuts_the_response_short() {
    let mut h = Harness::new(node_with(engine(), ""));
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
    h.io(lead.id, span_head(first, last, "\"v0\""));
    h.io(lead.id, IoEvent::Body(content(first, 100)));
    h.io(window.id, IoEvent::Failed(IoError::Broken("reset".into())));
    // The bytes that went out were the origin's, of the read's version; the rest is not
    // waited for on the lead-in alone (the module's documented limit).
    assert_eq!(h.body_of(1), content(first, 100).to_vec());
    assert!(h.aborted(1) && !h.ended(1));
    assert!(h.cancelled(lead.id));
    assert!(h.store.is_empty());
    assert_eq!(h.node.live_requests(), 0);
}

/// One step of [`lead_in_interleavings`]: what the window, the lead-in or the client does next.
#[derive(Clone, Debug)]
enum LeadOp {
    WindowHead,
    WindowBody(u64),
    WindowEnd,
    WindowFail,
    /// The lead-in's head: of the read's version, or of another.
    LeadHead(bool),
    LeadBody(u64),
    LeadEnd,
    LeadFail,
    Cancel,
    /// The client stops reading, or drains what it was sent.
    Stall,
    Drain,
}

fn lead_op() -> impl proptest::strategy::Strategy<Value = LeadOp> {
    use proptest::prelude::*;
    prop_oneof![
        2 => Just(LeadOp::WindowHead),
        4 => prop_oneof![Just(1u64), Just(99), Just(300), Just(1024)].prop_map(LeadOp::WindowBody),
        1 => Just(LeadOp::WindowEnd),
        1 => Just(LeadOp::WindowFail),
        2 => proptest::bool::weighted(0.8).prop_map(LeadOp::LeadHead),
        4 => prop_oneof![Just(1u64), Just(37), Just(100), Just(200)].prop_map(LeadOp::LeadBody),
        1 => Just(LeadOp::LeadEnd),
        1 => Just(LeadOp::LeadFail),
        1 => Just(LeadOp::Cancel),
        1 => Just(LeadOp::Stall),
        1 => Just(LeadOp::Drain),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::default())]

    /// A deep read's bytes come from its window and its lead-in in any interleaving of their
    /// heads, parts, ends and failures, the client's stalls and its going away: every byte it
    /// is sent is the right one, in order, never twice; a read that ends has its whole range;
    /// with neither source failed nor refused and the client staying, it ends.
    #[test]
    fn lead_in_interleavings(ops in proptest::collection::vec(lead_op(), 1..40)) {
        let (first, last) = (BLOCK + 600, BLOCK + 799);
        let want = content(first, last - first + 1);
        let mut h = Harness::new(node_with(engine(), ""));
        h.origin.etag = Some("\"v0\"".into());
        h.read(1, Some(&format!("bytes={first}-{last}")));
        let probe = h.take_sends().remove(0);
        h.answer_origin(&probe);
        let sends = h.take_sends();
        let (lead, window) = (sends[0].id, sends[1].id);
        h.io(lead, IoEvent::Connected);
        h.io(window, IoEvent::Connected);
        let live = |h: &Harness, io: IoId| h.node.exchanges().iter().any(|(i, _, _)| *i == io);
        let (mut window_head, mut window_sent, mut lead_head, mut lead_sent) = (false, 0, false, 0);
        let mut trouble = false;
        for op in ops {
            match op {
                LeadOp::WindowHead if live(&h, window) && !window_head => {
                    window_head = true;
                    h.io(window, span_head(BLOCK, 2 * BLOCK - 1, "\"v0\""));
                }
                LeadOp::WindowBody(n) if live(&h, window) && window_head && window_sent < BLOCK => {
                    let n = n.min(BLOCK - window_sent);
                    h.io(window, IoEvent::Body(content(BLOCK + window_sent, n)));
                    window_sent += n;
                }
                LeadOp::WindowEnd if live(&h, window) && window_head => {
                    trouble |= window_sent < BLOCK;
                    h.io(window, IoEvent::End);
                }
                LeadOp::WindowFail if live(&h, window) => {
                    trouble = true;
                    h.io(window, IoEvent::Failed(IoError::Broken("reset".into())));
                }
                LeadOp::LeadHead(same) if live(&h, lead) && !lead_head => {
                    lead_head = true;
                    let etag = if same { "\"v0\"" } else { "\"v1\"" };
                    h.io(lead, span_head(first, last, etag));
                }
                LeadOp::LeadBody(n) if live(&h, lead) && lead_head && lead_sent < want.len() as u64 => {
                    let n = n.min(want.len() as u64 - lead_sent);
                    h.io(lead, IoEvent::Body(content(first + lead_sent, n)));
                    lead_sent += n;
                }
                LeadOp::LeadEnd if live(&h, lead) && lead_head => h.io(lead, IoEvent::End),
                LeadOp::LeadFail if live(&h, lead) => {
                    h.io(lead, IoEvent::Failed(IoError::Broken("reset".into())));
                }
                LeadOp::Cancel if !h.ended(1) && !h.aborted(1) => {
                    trouble = true;
                    h.feed(Input::Cancel { id: RequestId(1) });
                }
                LeadOp::Stall => h.drain = false,
                LeadOp::Drain => {
                    h.drain = true;
                    for _ in 0..BODY_WINDOW {
                        h.feed(Input::Drained { id: RequestId(1) });
                    }
                }
                _ => {}
            }
            // A read that failed cleanly answered with an error status and its text.
            if h.head_of(1).is_none_or(|x| x.status == 206) {
                let body = h.body_of(1);
                let right = body.len() <= want.len() && body[..] == want[..body.len()];
                proptest::prop_assert!(right, "a wrong byte");
            }
        }
        // The rest: the client reads, the window (if still live) comes whole, and whatever the
        // read asks the origin for after a failure is answered.
        h.drain = true;
        for _ in 0..BODY_WINDOW {
            h.feed(Input::Drained { id: RequestId(1) });
        }
        if live(&h, window) {
            if !window_head {
                h.io(window, span_head(BLOCK, 2 * BLOCK - 1, "\"v0\""));
            }
            if live(&h, window) && window_sent < BLOCK {
                h.io(window, IoEvent::Body(content(BLOCK + window_sent, BLOCK - window_sent)));
            }
            if live(&h, window) {
                h.io(window, IoEvent::End);
            }
        }
        h.serve_origin();
        let body = h.body_of(1);
        let status = h.head_of(1).map(|x| x.status);
        proptest::prop_assert!(!(h.ended(1) && h.aborted(1)));
        if status.is_none_or(|s| s == 206) {
            let right = body.len() <= want.len() && body[..] == want[..body.len()];
            proptest::prop_assert!(right, "a wrong byte");
            if h.ended(1) {
                proptest::prop_assert_eq!(&body[..], &want[..], "an ended read has its whole range");
            }
        } else {
            proptest::prop_assert!(trouble, "an error status ({:?}) with nothing failed", status);
        }
        if !trouble {
            proptest::prop_assert!(h.ended(1) && status == Some(206), "nothing failed: the read ends");
        }
        proptest::prop_assert_eq!(h.node.live_requests(), 0);
        proptest::prop_assert!(h.node.exchanges().is_empty(), "no exchange left behind");
    }
}

#[test]
fn a_deep_read_to_the_blocks_last_byte_has_it_when_its_lead_in_proves_its_length() {
    let mut h = Harness::new(node_with(engine(), ""));
    let (first, last) = (2 * BLOCK - 224, 2 * BLOCK - 1);
    let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
    h.io(lead.id, span_head(first, last, "\"v0\""));
    h.io(lead.id, IoEvent::Body(content(first, 224)));
    assert_eq!(h.body_of(1), content(first, 223).to_vec(), "all but the block's last byte");
    h.io(lead.id, IoEvent::End);
    assert_eq!(h.body_of(1), content(first, 224).to_vec());
    assert!(h.ended(1));
    assert!(!h.cancelled(lead.id), "it ended by itself");
    h.io(window.id, IoEvent::Body(content(BLOCK, BLOCK)));
    h.io(window.id, IoEvent::End);
    assert_eq!(h.store.len(), 1);
}

#[test]
fn a_read_that_leaves_its_flight_ends_its_lead_in() {
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    // It goes away.
    let mut h = Harness::new(node_with(engine(), ""));
    let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
    h.feed(Input::Cancel { id: RequestId(1) });
    assert!(h.cancelled(lead.id));
    assert!(!h.cancelled(window.id), "the window goes on for the store");
    // The window ends first: the read has its bytes from it.
    let mut h = Harness::new(node_with(engine(), ""));
    let (window, lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
    h.io(lead.id, span_head(first, last, "\"v0\""));
    h.io(window.id, IoEvent::Body(content(BLOCK, BLOCK)));
    assert!(h.cancelled(lead.id), "its span went out from the window");
    h.io(window.id, IoEvent::End);
    assert_eq!(h.body_of(1), content(first, 200).to_vec());
    assert!(h.ended(1));
}

#[test]
fn only_a_deep_short_span_far_from_its_window_gets_a_lead_in() {
    let mut h = Harness::new(node_with(engine(), ""));
    // Shallow: 100 bytes in.
    h.read(1, Some(&format!("bytes={}-{}", BLOCK + 100, BLOCK + 199)));
    h.serve_origin();
    assert_eq!(h.node.counters().origin_lead_ins, 0);
    // Deep but longer than the bytes before it (a read to the object's end from 300 in).
    h.read(2, Some(&format!("bytes={}-", 2 * BLOCK + 300)));
    let probe_or_window = h.take_sends();
    assert!(probe_or_window.iter().all(|s| s.purpose == Purpose::Window), "{probe_or_window:?}");
    for s in &probe_or_window {
        h.answer_origin(s);
    }
    h.serve_origin();
    assert_eq!(h.node.counters().origin_lead_ins, 0);
    // A read that joins the window gets one of its own while the window is far from its
    // span (under its own credential), and none once the window is near it.
    let (first, last) = (BLOCK + 600, BLOCK + 799);
    let mut h = Harness::new(node_with(engine(), ""));
    let (window, _lead) = deep_cold_read(&mut h, first, last, "\"v0\"");
    h.read(2, Some(&format!("bytes={}-{}", BLOCK + 900, BLOCK + 999)));
    let joined = h.take_sends();
    let purposes: Vec<Purpose> = joined.iter().map(|s| s.purpose).collect();
    assert_eq!(purposes, [Purpose::LeadIn], "it joins the window and asks for its span");
    h.io(joined[0].id, IoEvent::Connected);
    h.io(joined[0].id, span_head(BLOCK + 900, BLOCK + 999, "\"v0\""));
    h.io(joined[0].id, IoEvent::Body(content(BLOCK + 900, 100)));
    assert_eq!(h.body_of(2), content(BLOCK + 900, 100).to_vec());
    assert!(h.ended(2));
    h.io(window.id, IoEvent::Body(content(BLOCK, 500)));
    h.read(3, Some(&format!("bytes={}-{}", BLOCK + 700, BLOCK + 749)));
    assert!(h.take_sends().is_empty(), "200 bytes from the window's progress: it waits");
    assert_eq!(h.node.counters().origin_lead_ins, 2);
    h.io(window.id, IoEvent::Body(content(BLOCK + 500, BLOCK - 500)));
    h.io(window.id, IoEvent::End);
    assert_eq!(h.body_of(3), content(BLOCK + 700, 50).to_vec());
    assert_eq!(h.body_of(1), content(first, 200).to_vec());
    // Off (`--no-origin-lead-in`): the window alone.
    let config = EngineConfig { lead_in: false, ..engine().config().clone() };
    let mut h = Harness::new(node_with(Engine::new(config), ""));
    h.read(1, Some(&format!("bytes={first}-{last}")));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let sends = h.take_sends();
    assert_eq!(sends.iter().map(|s| s.purpose).collect::<Vec<_>>(), [Purpose::Window]);
    h.answer_origin(&sends[0]);
    assert_eq!(h.body_of(1), content(first, 200).to_vec());
    assert_eq!(h.node.counters().origin_lead_ins, 0);
}

#[test]
fn a_window_whose_version_the_read_cannot_tell_is_held_whole_before_any_byte_goes_out() {
    let mut h = Harness::new(node_with(engine(), ""));
    let range = format!("bytes={}-{}", BLOCK, 2 * BLOCK - 1);
    // No validators anywhere: a change could be found only at the window's end, when a
    // streamed response could no longer start over.
    let (window, start) = cold_window(&mut h, &range, None);
    h.io(window.id, IoEvent::Body(content(start, BLOCK / 2)));
    assert!(h.head_of(1).is_none() && h.body_of(1).is_empty(), "held whole");
    h.io(window.id, IoEvent::Body(content(start + BLOCK / 2, BLOCK / 2)));
    h.io(window.id, IoEvent::End);
    assert_eq!(h.body_of(1), content(BLOCK, BLOCK).to_vec());
    assert_eq!(h.node.stats().origin_streams, 0);
}

#[test]
fn a_streamed_window_cut_short_truncates_the_response_and_caches_nothing() {
    let mut h = Harness::new(node_with(engine(), ""));
    let range = format!("bytes={}-{}", BLOCK, 2 * BLOCK - 1);
    let (window, start) = cold_window(&mut h, &range, Some("\"v0\""));
    h.io(window.id, IoEvent::Body(content(start, BLOCK / 2)));
    assert_eq!(h.body_of(1), content(BLOCK, BLOCK / 2).to_vec());
    h.io(window.id, IoEvent::End);
    // Short: the bytes that went out were the origin's, but the response is cut short, never
    // completed, and the short window is not cached.
    assert!(h.aborted(1) && !h.ended(1));
    assert!(h.store.is_empty());
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_client_that_stops_reading_is_sent_no_more_of_a_streaming_window_until_it_ends() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.drain = false;
    let range = format!("bytes={}-{}", BLOCK, 2 * BLOCK - 1);
    let (window, start) = cold_window(&mut h, &range, Some("\"v0\""));
    let parts = |h: &Harness| {
        h.outputs.iter().filter(|o| matches!(o, Output::Body { id, .. } if id.0 == 1)).count()
    };
    for i in 0..8 {
        h.io(window.id, IoEvent::Body(content(start + i * 100, 100)));
    }
    assert_eq!(
        parts(&h),
        BODY_WINDOW as usize,
        "at most a response window of parts is handed over"
    );
    h.io(window.id, IoEvent::Body(content(start + 800, BLOCK - 800)));
    h.io(window.id, IoEvent::End);
    assert_eq!(h.body_of(1), content(BLOCK, 400).to_vec(), "nothing more until it drains");
    assert_eq!(h.store.len(), 1, "the window is cached meanwhile");
    // It reads again: the rest goes out whole, from the block the window ended with.
    h.drain = true;
    for _ in 0..BODY_WINDOW {
        h.feed(Input::Drained { id: RequestId(1) });
    }
    assert_eq!(h.body_of(1), content(BLOCK, BLOCK).to_vec());
    assert!(h.ended(1));
}

/// The node no longer holds the blocks it stored last in memory (`Node::held`: later blocks
/// pushed them out), so the next look-up reads the store's copy.
fn forget_held(h: &mut Harness) {
    h.node.held.clear();
}

#[test]
fn a_whole_block_that_rotted_in_the_store_is_read_afresh_and_a_range_of_it_is_not_checked() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    h.serve_origin();
    assert_eq!(h.store.len(), 4);
    // One byte of block 1 changes in the store.
    let e = engine();
    let key = e.block_key(&e.identify(URL), 1);
    let mut rotten = h.store[&key].to_vec();
    rotten[3] ^= 0x01;
    h.store.insert(key, Bytes::from(rotten));
    forget_held(&mut h);
    h.outputs.clear();
    // A whole read: block 1 is dropped and read afresh from the origin; every byte is right.
    h.read(2, None);
    let sends = h.take_sends();
    assert_eq!(sends.len(), 1, "only the rotten block is fetched: {sends:?}");
    assert_eq!(sends[0].headers.get_str("range"), Some("bytes=1024-2047"));
    h.answer_origin(&sends[0]);
    h.serve_origin();
    assert_eq!(h.body_of(2), content(0, SIZE).to_vec());
    assert_eq!(h.node.counters().rotten_blocks_dropped, 1);
    assert_eq!(h.store[&key], content(BLOCK, BLOCK), "stored again, intact");
    // A range inside a block reads only its window: not checked (the digest covers the whole
    // block), so a window of a rotten copy would be served as it is (docs/peer-plane.md).
    let mut rotten = h.store[&key].to_vec();
    rotten[3] ^= 0x01;
    h.store.insert(key, Bytes::from(rotten.clone()));
    forget_held(&mut h);
    h.outputs.clear();
    h.read(3, Some("bytes=1024-1031"));
    assert!(h.take_sends().is_empty());
    assert_eq!(h.body_of(3), rotten[..8].to_vec());
    assert_eq!(h.node.counters().rotten_blocks_dropped, 1);
}

#[test]
fn a_warm_read_is_served_from_the_store_without_any_exchange() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    h.serve_origin();
    h.outputs.clear();
    h.read(2, Some("bytes=1000-2100"));
    assert!(h.sends().is_empty(), "{:?}", h.sends());
    let head = h.head_of(2).expect("a head");
    assert_eq!(head.status, 206);
    assert_eq!(head.headers.get_str("content-range"), Some("bytes 1000-2100/3172"));
    assert_eq!(h.body_of(2), content(1000, 1101).to_vec());
}

/// A node that has read version 1 of the object whole from the origin (and cached every block).
fn warmed_on_version_1() -> Harness {
    let mut h = Harness::new(node_with(engine(), ""));
    h.publish(1);
    h.read(1, None);
    h.serve_origin();
    h
}

/// A node restarted on the store of `before` (a warm start): the store's blocks are handed to
/// the new machine as kept ones.
fn warm_restart(before: Harness, engine: Engine) -> Harness {
    let mut h = Harness::new(node_with(engine, ""));
    h.origin = before.origin;
    h.store = before.store;
    h.node.recovered_blocks(h.store.keys().copied());
    h
}

#[test]
fn blocks_a_warm_start_kept_are_not_served_for_an_object_that_may_have_changed() {
    let h = warmed_on_version_1();
    assert_eq!(h.store.len(), 4);
    // Down; the object changes at the origin (same size); the node starts on its old store.
    let mut h = warm_restart(h, engine());
    h.publish(2);
    h.read(2, None);
    h.serve_origin();
    assert_eq!(h.body_of(2), content_of(2, 0, SIZE).to_vec(), "every byte of the new version");
    assert_eq!(h.node.counters().unversioned_dropped, 4, "each kept block dropped unserved");
    assert_eq!(h.store.len(), 4, "and replaced by this process's own");
    // What this process wrote is served from the store again.
    h.outputs.clear();
    h.read(3, None);
    assert!(h.sends().is_empty(), "{:?}", h.sends());
    assert_eq!(h.body_of(3), content_of(2, 0, SIZE).to_vec());
    assert_eq!(h.node.counters().unversioned_dropped, 4);
}

#[test]
fn a_kept_block_two_reads_find_at_once_is_dropped_and_counted_once() {
    let h = warmed_on_version_1();
    let mut h = warm_restart(h, engine());
    h.publish(2);
    // Two reads wait on one size probe, so both look up every kept block before the store
    // answers either: every answer is withheld, and each block is dropped and counted once.
    h.read(2, None);
    h.read(3, None);
    h.serve_origin();
    for id in [2, 3] {
        assert_eq!(h.body_of(id), content_of(2, 0, SIZE).to_vec(), "read {id}");
    }
    assert_eq!(h.node.counters().unversioned_dropped, 4, "one per kept block");
}

#[test]
fn blocks_a_warm_start_kept_are_served_for_an_immutable_object() {
    let immutable = || {
        let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
        let prefixes = vec!["http://origin/o/".into()];
        Engine::new(EngineConfig {
            geometry,
            immutable_prefixes: prefixes,
            read_ahead: 0,
            origin_read_ahead: 0,
            ..Default::default()
        })
    };
    let mut h = Harness::new(node_with(immutable(), ""));
    h.publish(1);
    h.read(1, None);
    h.serve_origin();
    let mut h = warm_restart(h, immutable());
    h.read(2, None);
    let probe = h.take_sends();
    assert_eq!(probe.len(), 1, "the size is learnt again");
    h.answer_origin(&probe[0]);
    assert!(h.sends().is_empty(), "no block is fetched: {:?}", h.sends());
    assert_eq!(h.body_of(2), content_of(1, 0, SIZE).to_vec());
    assert_eq!(h.node.counters().unversioned_dropped, 0);
    // The store hashed what it kept at open (recovered_digests); a kept block that rots after
    // that is caught by a whole read, dropped and read afresh.
    let mut h = warm_restart(h, immutable());
    let digests: Vec<_> = h.store.iter().map(|(k, b)| (*k, xxh3_128(b))).collect();
    h.node.recovered_digests(digests);
    let e = immutable();
    let key = e.block_key(&e.identify(URL), 2);
    let mut rotten = h.store[&key].to_vec();
    rotten[0] ^= 0x80;
    h.store.insert(key, Bytes::from(rotten));
    h.read(3, None);
    h.serve_origin();
    assert_eq!(h.body_of(3), content_of(1, 0, SIZE).to_vec());
    assert_eq!(h.node.counters().rotten_blocks_dropped, 1);
}

#[test]
fn concurrent_reads_of_one_object_share_one_probe_and_one_fetch_per_block() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    h.read(2, None);
    let probes = h.take_sends();
    assert_eq!(probes.len(), 1, "the second read joined the probe");
    h.answer_origin(&probes[0]);
    let first = h.take_sends();
    assert_eq!(first.len(), 1, "both reads wait on one block flight");
    h.answer_origin(&first[0]);
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert_eq!(h.body_of(2), content(0, SIZE).to_vec());
    assert_eq!(h.node.stats().origin_bytes, SIZE, "coalesced bytes are counted once");
    let puts = h.outputs.iter().filter(|o| matches!(o, Output::StorePut { .. })).count();
    assert_eq!(puts, 4, "each block is offered to the store once, not once per waiter");
}

#[test]
fn a_head_request_gets_the_length_and_no_body() {
    let mut h = Harness::new(node_with(engine(), ""));
    let request = Inbound {
        method: "HEAD".into(),
        target: format!("/dart/{URL}"),
        headers: Headers::new(),
        body: Bytes::new(),
    };
    h.feed(Input::Request { id: RequestId(1), plane: Plane::Client, request });
    h.serve_origin();
    let head = h.head_of(1).expect("head");
    assert_eq!((head.status, head.content_length(), head.body), (200, Some(SIZE), false));
    assert!(h.body_of(1).is_empty());
    assert!(h.ended(1));
}

#[test]
fn bad_methods_and_targets_get_clean_statuses() {
    let mut h = Harness::new(node_with(engine(), ""));
    let request = Inbound {
        method: "POST".into(),
        target: "/dart/x".into(),
        headers: Headers::new(),
        body: Bytes::new(),
    };
    h.feed(Input::Request { id: RequestId(1), plane: Plane::Client, request });
    assert_eq!(h.head_of(1).map(|h| h.status), Some(405));
    h.get(2, Plane::Client, "/elsewhere", Headers::new());
    assert_eq!(h.head_of(2).map(|h| h.status), Some(400));
    h.get(3, Plane::Peer, "/peer/v1/block/zz/1", Headers::new());
    assert_eq!(h.head_of(3).map(|h| h.status), Some(400));
    let bad_hop = Headers::new().with("x-dart-hop", "-1");
    h.get(4, Plane::Peer, "/peer/v1/block/ab/1", bad_hop);
    assert_eq!(h.head_of(4).map(|h| h.status), Some(400));
    h.get(5, Plane::Peer, "/nope", Headers::new());
    assert_eq!(h.head_of(5).map(|h| h.status), Some(404));
    assert!(h.sends().is_empty());
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn an_origin_that_never_answers_is_given_up_at_the_head_bound() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    let probe = h.take_sends().remove(0);
    h.io(probe.id, IoEvent::Connected);
    assert_eq!(h.node.poll_timeout(), Some(Instant::ZERO + Duration::from_secs(30)));
    h.advance(Duration::from_secs(30));
    assert!(h.cancelled(probe.id));
    assert_eq!(h.head_of(1).map(|h| h.status), Some(502));
    h.assert_settled("the test's work");
}

#[test]
fn a_dead_parent_costs_one_dial_bound_then_its_circuit_is_open() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.read(1, Some("bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let peer = h.take_sends().remove(0);
    assert_eq!(peer.endpoint, Endpoint::Peer);
    assert!(peer.url.starts_with("http://p:9000/peer/v1/block/"));
    assert_eq!(peer.headers.get_str("x-dart-origin"), Some(URL));
    assert_eq!(h.node.poll_timeout(), Some(Instant::ZERO + Duration::from_secs(1)));
    h.advance(Duration::from_secs(1));
    assert!(h.cancelled(peer.id));
    let state = h.node.engine().p2p().expect("p2p").breaker.state(&"p:9000".to_owned(), h.now);
    assert_eq!(state, CircuitState::Open, "one dial failure opens");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    h.outputs.clear();
    h.read(2, Some("bytes=2048-2050"));
    assert!(h.sends().iter().all(|r| r.endpoint == Endpoint::Origin), "the open parent is skipped");
}

/// [`reader_of`] with hedging on: its parent is the chunk's root, so a hedge first probes it
/// held-only, and its backup, if the root is silent, is an origin fill.
fn reader_hedging_to_origin() -> Node {
    reader_of_hedging("p:9000", true)
}

/// Starts a one-block read of [`reader_hedging_to_origin`], lets its hedge come due and returns
/// (the primary peer fetch, the liveness probe): a held-only ask of the same root.
fn hedge_probe_of_the_root(h: &mut Harness) -> (IoRequest, IoRequest) {
    let peer = start_block_read(h, &["p:9000".to_owned()]);
    assert_eq!(peer.endpoint, Endpoint::Peer);
    h.io(peer.id, IoEvent::Connected);
    // No estimate yet, and no ancestor left but the root being asked: the hedge is a liveness
    // probe, due after the cold probe delay (shorter than a cold hedge's), and it asks the root
    // held-only, not the origin.
    assert_eq!(h.node.poll_timeout(), Some(Instant::ZERO + COLD_PROBE_DELAY));
    h.advance(COLD_PROBE_DELAY);
    let ask = h.take_sends().remove(0);
    assert_eq!(ask.endpoint, Endpoint::Peer, "no origin before the root is found silent");
    assert_eq!(ask.url, peer.url, "the same root, the same block");
    assert_eq!(ask.headers.get_str("x-dart-held-only"), Some("1"));
    (peer, ask)
}

/// [`hedge_probe_of_the_root`], then the liveness probe connects and says nothing within a
/// quarter of a hedge delay: the root is silent, and the backup is an origin fill. Returns (the
/// primary peer fetch, the liveness probe, the fill's origin window).
fn origin_fill_of_a_silent_root(h: &mut Harness) -> (IoRequest, IoRequest, IoRequest) {
    let (peer, ask) = hedge_probe_of_the_root(h);
    h.io(ask.id, IoEvent::Connected);
    h.advance(crate::engine::probe_wait(COLD_DELAY));
    let fill = h.take_sends().remove(0);
    assert_eq!(fill.endpoint, Endpoint::Origin, "the backup is the origin");
    (peer, ask, fill)
}

#[test]
fn a_child_of_a_silent_root_hedges_to_the_origin_and_takes_the_block_when_it_lands() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, ask, fill) = origin_fill_of_a_silent_root(&mut h);
    h.answer_origin(&fill);
    // The fill stored the block; the read took it and stopped waiting on the root, whose two
    // asks run on unanswered to record how the root answers them.
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    assert_eq!(h.node.live_requests(), 0);
    assert!(!h.cancelled(peer.id) && !h.cancelled(ask.id));
    assert_eq!(h.node.counters().peer_fetches_run_on, 2);
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_probes, s.hedge_probes_alive), (1, 1, 0));
    assert_eq!((s.hedge_origin, s.hedge_backup_won, s.landed), (1, 1, 1));
    assert!(h.node.engine().is_silent("p:9000", h.now), "backed up at once by the next reads");
    // The held-only ask's short bound (one hedge delay once connected) charges nothing; the
    // primary's head bound (the cold 1.5 s) charges the root a timeout.
    h.advance((Instant::ZERO + Duration::from_millis(1500)).saturating_duration_since(h.now));
    assert!(h.node.exchanges().is_empty());
    let b = breaker_of(&h);
    assert_eq!((b.soft, b.hard, b.abandoned), (1, 0, 1));
    h.assert_settled("the test's work");
}

/// A read waiting on an origin flight takes the block when another path brings it in first
/// (here the silent root answers the primary after all, while the origin fill and a second read
/// that joined it wait on the origin): it is served at once, not after the origin's window.
#[test]
fn a_read_waiting_on_an_origin_flight_takes_the_block_a_peer_brought_in_first() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, _, fill) = origin_fill_of_a_silent_root(&mut h);
    h.read(2, Some("bytes=0-9"));
    assert!(h.sends().is_empty(), "the second read joined the fill's flight");
    assert!(matches!(h.node.requests[&RequestId(2)].wait, Wait::Flight(_)));
    answer_peer(&mut h, &peer, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.body_of(2), content(0, 10).to_vec(), "served from the landed block");
    assert!(h.ended(1) && h.ended(2));
    // The origin's window still comes (its bytes are cached, nobody else is answered twice).
    h.answer_origin(&fill);
    assert_eq!(h.body_of(2), content(0, 10).to_vec());
    assert_eq!(h.node.live_requests(), 0);
    h.node.check_invariants();
}

/// A child of its chunk's root in a view of three (fanout 2) that is not ranked second: the
/// tree without the root puts the member ranked second above it. Returns the node, the root's
/// address and the second's.
fn child_of_a_root_with_a_replacement() -> (Node, String, String) {
    let mut e = engine();
    let key = e.block_key(&e.identify(URL), 0);
    let members: Vec<Member> =
        ["a", "b", "c"].map(|id| Member::ready(id, &format!("{id}:9000"))).to_vec();
    let any = Placement::new(View::new(members.clone()), "a", 2, 1);
    let ranked: Vec<String> = any.ranked(key.chunk).into_iter().map(|m| m.to_string()).collect();
    let me = ranked[2].clone();
    let placement = Placement::new(View::new(members), &me, 2, 1);
    let ups: Vec<String> =
        placement.upstreams(key.chunk, |_| true).into_iter().map(|p| p.addr).collect();
    assert_eq!(ups, [format!("{}:9000", ranked[0])], "the root is its one ancestor");
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    e.enable_p2p(P2p { placement, breaker });
    let (root, second) = (format!("{}:9000", ranked[0]), format!("{}:9000", ranked[1]));
    (node_with(e, &me), root, second)
}

/// A child whose root is silent asks the member that replaces it (the tree laid again without
/// the root), not the origin: every child of a silent root filled the same window from the
/// origin before (`dead-root` 35-40 range requests for 32 windows, `reference` a stalled member's
/// chunks read twice). If that member fails too, the origin at once.
#[test]
fn a_child_of_a_silent_root_asks_the_member_that_replaces_it_before_the_origin() {
    for replacement_answers in [true, false] {
        let (node, root, second) = child_of_a_root_with_a_replacement();
        let mut h = Harness::new(node);
        let primary = start_block_read(&mut h, std::slice::from_ref(&root));
        h.io(primary.id, IoEvent::Connected);
        h.advance(COLD_PROBE_DELAY);
        let ask = h.take_sends().remove(0);
        assert_eq!(ask.headers.get_str("x-dart-held-only"), Some("1"), "the liveness probe");
        h.io(ask.id, IoEvent::Connected);
        h.advance(crate::engine::probe_wait(COLD_DELAY));
        let backup = h.take_sends().remove(0);
        assert!(
            backup.url.starts_with(&format!("http://{second}/")),
            "the replacement: {}",
            backup.url
        );
        assert_eq!(backup.headers.get_str("x-dart-held-only"), None, "a fetch on our behalf");
        if replacement_answers {
            answer_peer(&mut h, &backup, 0);
            assert!(h.sends().iter().all(|r| r.endpoint != Endpoint::Origin), "no origin window");
        } else {
            h.io(backup.id, IoEvent::Connected);
            h.io(backup.id, IoEvent::Head { status: 503, headers: Headers::new() });
            let fill = h.take_sends().remove(0);
            assert_eq!(fill.endpoint, Endpoint::Origin, "the origin at once");
            h.answer_origin(&fill);
        }
        assert_eq!(h.body_of(1), content(0, 10).to_vec());
        assert!(h.ended(1));
        let s = h.node.stats();
        assert_eq!(s.peer_reroutes, 1);
        assert_eq!(s.hedge_origin, u64::from(!replacement_answers));
        assert!(h.node.engine().is_silent(&root, h.now));
    }
}

/// A node that fetches little has no hedge credit (it earns 0.05 of a hedge per fetch); the
/// probe of its last ancestor needs none, or a pure relay would wait out its whole head bound on
/// a dead root, and every reader below it with it (`dead-root-some-read` seed 2: 0.72 s).
#[test]
fn a_child_with_no_hedge_credit_left_still_probes_its_silent_root_and_backs_up_to_the_origin() {
    let mut h = Harness::new(reader_hedging_to_origin());
    assert!(h.node.engine_mut().try_hedge(), "the hedge banked at start");
    assert!(!h.node.engine_mut().try_hedge(), "no credit left");
    let (_peer, ask) = hedge_probe_of_the_root(&mut h);
    h.io(ask.id, IoEvent::Connected);
    h.advance(crate::engine::probe_wait(COLD_DELAY));
    let fill = h.take_sends().remove(0);
    assert_eq!(fill.endpoint, Endpoint::Origin, "silent: the backup is the origin");
    h.answer_origin(&fill);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_probes, s.hedge_origin), (1, 1, 1));
}

#[test]
fn a_child_of_a_live_root_keeps_waiting_on_it_and_never_pays_the_origin_twice() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, ask) = hedge_probe_of_the_root(&mut h);
    // The root answers at once that it does not hold the block yet (it is reading it from the
    // origin): alive, so no origin backup, however long the primary then takes.
    h.io(ask.id, IoEvent::Connected);
    h.io(ask.id, IoEvent::Head { status: 404, headers: Headers::new() });
    h.advance(COLD_DELAY * 2);
    assert!(h.sends().iter().all(|r| r.endpoint != Endpoint::Origin), "no origin backup");
    answer_peer(&mut h, &peer, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_probes, s.hedge_probes_alive, s.hedge_origin), (1, 1, 1, 0));
    assert_eq!((s.hedge_primary_won, s.hedge_backup_won), (1, 0));
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!((b.counters().soft, b.counters().hard), (0, 0), "a miss is an answer");
    assert!(!h.node.engine().is_slow("p:9000", h.now));
    assert_eq!(h.node.live_requests(), 0);
}

/// Starts a one-block read of [`reader_hedging_to_origin`] whose root sends its head and half
/// the block 10 ms before the hedge comes due; returns (the primary, the block's length, when
/// its body last moved). Nothing is sent when the hedge comes due: the body is moving.
fn root_streaming_at_the_hedge(h: &mut Harness) -> (IoRequest, u64, Instant) {
    let peer = start_block_read(h, &["p:9000".to_owned()]);
    let len = BLOCK.min(SIZE);
    h.io(peer.id, IoEvent::Connected);
    let headers = Headers::new().with("content-length", len.to_string());
    h.io(peer.id, IoEvent::Head { status: 200, headers });
    h.advance(COLD_DELAY - Duration::from_millis(10));
    let moved = h.now;
    h.io(peer.id, IoEvent::Body(content(0, len / 2)));
    h.advance(Duration::from_millis(10));
    assert!(h.take_sends().is_empty(), "moving: no probe, no origin");
    (peer, len, moved)
}

#[test]
fn a_child_of_a_root_whose_body_is_moving_does_not_probe_it() {
    let mut h = Harness::new(reader_hedging_to_origin());
    // The body is still moving when the hedge comes due: the root is alive on a slow path (a
    // narrow link), so neither a probe nor the origin, which would carry the block twice.
    let (peer, len, _) = root_streaming_at_the_hedge(&mut h);
    h.io(peer.id, IoEvent::Body(content(len / 2, len - len / 2)));
    h.io(peer.id, IoEvent::End);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_probes, s.hedge_origin), (0, 0, 0));
}

#[test]
fn a_read_that_ended_leaves_no_timer_to_wake_its_node() {
    // A hedged client read whose primary answered before its hedge delay.
    let mut h = Harness::new(reader_hedging_to_origin());
    let peer = start_block_read(&mut h, &["p:9000".to_owned()]);
    assert!(h.node.poll_timeout().is_some(), "armed while the read waits");
    answer_peer(&mut h, &peer, 0);
    assert!(h.ended(1));
    h.assert_settled("its hedge timer went with it");
    // A relay with a requester's budget that answered at once.
    let mut h = relay_with_requester("x-dart-budget-ms", "1000");
    let up = h.take_sends().remove(0);
    answer_peer(&mut h, &up, 1);
    assert!(h.ended(7));
    h.assert_settled("its early-answer bound went with it");
}

#[test]
fn a_child_of_a_root_that_dies_mid_body_probes_it_once_the_body_stands_still() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, _, moved) = root_streaming_at_the_hedge(&mut h);
    // The body stops. One hedge delay after it last moved, the root is probed.
    assert_eq!(h.node.poll_timeout(), Some(moved + COLD_DELAY));
    h.advance(COLD_DELAY - Duration::from_millis(10));
    let ask = h.take_sends().remove(0);
    assert_eq!(ask.url, peer.url);
    assert_eq!(ask.headers.get_str("x-dart-held-only"), Some("1"));
    // Silent: after a quarter of a hedge delay the backup is the origin.
    h.io(ask.id, IoEvent::Connected);
    h.advance(crate::engine::probe_wait(COLD_DELAY));
    let fill = h.take_sends().remove(0);
    assert_eq!(fill.endpoint, Endpoint::Origin);
    h.answer_origin(&fill);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_probes, s.hedge_origin, s.hedge_backup_won), (1, 1, 1, 1));
}

#[test]
fn a_root_that_refuses_the_probe_connection_is_charged_and_the_origin_backup_starts_at_once() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, ask) = hedge_probe_of_the_root(&mut h);
    h.io(ask.id, IoEvent::Failed(IoError::Connect("refused".into())));
    let fill = h.take_sends().remove(0);
    assert_eq!(fill.endpoint, Endpoint::Origin, "no wait: the root is not there");
    assert_eq!(breaker_of(&h).hard, 1, "a failed dial is the root's");
    h.answer_origin(&fill);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    assert!(!h.cancelled(peer.id), "the primary runs on to its bound");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_primary_that_answers_before_the_origin_fill_wins_and_the_fill_still_fills() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, _ask) = hedge_probe_of_the_root(&mut h);
    h.advance(COLD_DELAY);
    let fill = h.take_sends().remove(0);
    assert_eq!(fill.endpoint, Endpoint::Origin);
    answer_peer(&mut h, &peer, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    h.answer_origin(&fill);
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_primary_won, s.hedge_backup_won), (1, 1, 0));
    assert_eq!(h.node.live_requests(), 0, "the fill ended too");
}

#[test]
fn a_client_that_hangs_up_mid_peer_fetch_abandons_the_permit_and_charges_nothing() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.read(1, Some("bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let peer = h.take_sends().remove(0);
    h.io(peer.id, IoEvent::Connected);
    h.feed(Input::Cancel { id: RequestId(1) });
    assert!(h.cancelled(peer.id));
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!(b.counters().abandoned, 1);
    assert_eq!(b.counters().soft + b.counters().hard, 0);
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("the test's work");
    assert!(!h.ended(1) && !h.aborted(1), "nothing is sent to a requester that left");
}

/// A reader node serving relay request 7 for block 1, whose requester says `field: value` of
/// itself (`x-dart-budget-ms`, `x-dart-progress-ms`).
fn relay_with_requester(field: &str, value: &str) -> Harness {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    let e = engine();
    let key = e.block_key(&e.identify(URL), 1);
    let headers =
        Headers::new().with("x-dart-origin", URL).with("x-dart-hop", "0").with(field, value);
    h.get(7, Plane::Peer, &crate::codec::wire::block_path(key), headers);
    h
}

fn relay_request(h: &mut Harness, id: u64, block: u64) {
    let e = engine();
    let key = e.block_key(&e.identify(URL), block);
    let headers = Headers::new().with("x-dart-origin", URL).with("x-dart-hop", "0");
    h.get(id, Plane::Peer, &crate::codec::wire::block_path(key), headers);
}

fn size_known(h: &mut Harness) {
    let e = engine();
    h.node.engine_mut().record_probe(
        &e.identify(URL),
        crate::engine::origin::ProbeOutcome::Size(SIZE),
        Default::default(),
        Instant::ZERO,
    );
}

#[test]
fn a_cut_through_relay_forwards_all_but_the_last_byte_until_the_length_is_proven() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    assert_eq!(up.headers.get_str("x-dart-hop"), Some("1"));
    let head = Headers::new().with("content-length", BLOCK.to_string());
    h.io(up.id, IoEvent::Head { status: 200, headers: head });
    let relay_head = h.head_of(7).expect("the relay commits its head on the upstream's");
    let wire = BLOCK + FOOTER_LEN;
    assert_eq!((relay_head.status, relay_head.content_length()), (200, Some(wire)));
    assert_eq!(relay_head.headers.get_str(HEADER_DIGEST), Some(DIGEST_ALGORITHM));
    assert_eq!(relay_head.headers.get_str("x-dart-node"), Some("reader"));
    let block = content(BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(block.slice(..BLOCK as usize)));
    assert_eq!(h.body_of(7).len() as u64, BLOCK - 1, "the last byte is held back");
    h.io(up.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), block.to_vec());
    assert!(h.ended(7));
    assert_eq!(h.store.len(), 1);
}

/// A peer's block answer as it travels: the digest header, then `block` and `footer`.
fn answer_raw(h: &mut Harness, io: IoId, block: &[u8], footer: &[u8], digest_header: bool) {
    answer_raw_in(h, io, block, footer, digest_header, 0);
}

/// [`answer_raw`], the block and its footer in one part each (`parts` 0), or the whole body cut
/// into `parts` parts of about one size (a part may hold the block's last bytes and the footer's
/// first, as a socket's reads do).
fn answer_raw_in(
    h: &mut Harness,
    io: IoId,
    block: &[u8],
    footer: &[u8],
    digest_header: bool,
    parts: usize,
) {
    let mut headers =
        Headers::new().with("content-length", (block.len() + footer.len()).to_string());
    if digest_header {
        headers.push(HEADER_DIGEST, DIGEST_ALGORITHM);
    }
    h.io_raw(io, IoEvent::Connected);
    h.io_raw(io, IoEvent::Head { status: 200, headers });
    let live = |h: &Harness| h.node.exchanges().iter().any(|(i, _, _)| *i == io);
    if parts == 0 {
        h.io_raw(io, IoEvent::Body(Bytes::copy_from_slice(block)));
        if !footer.is_empty() && live(h) {
            h.io_raw(io, IoEvent::Body(Bytes::copy_from_slice(footer)));
        }
    } else {
        let wire = [block, footer].concat();
        for part in wire.chunks(wire.len().div_ceil(parts)) {
            if live(h) {
                h.io_raw(io, IoEvent::Body(Bytes::copy_from_slice(part)));
            }
        }
    }
    if live(h) {
        h.io_raw(io, IoEvent::End);
    }
}

#[test]
fn a_peer_block_that_does_not_match_its_digest_is_refused_and_the_read_is_served_right() {
    // Each wrong answer: a flipped byte under the honest footer, a footer for other bytes, no
    // digest header, a footer a byte short, a footer a byte long.
    let block = content(0, BLOCK);
    let honest = xxh3_128(&block).footer();
    let mut flipped = block.to_vec();
    flipped[7] ^= 0x5a;
    let other = xxh3_128(&flipped).footer();
    let cases: [(&str, Vec<u8>, Vec<u8>, bool); 5] = [
        ("flipped byte", flipped.clone(), honest.to_vec(), true),
        ("footer of other bytes", block.to_vec(), other.to_vec(), true),
        ("no digest header", block.to_vec(), honest.to_vec(), false),
        ("short footer", block.to_vec(), honest[..15].to_vec(), true),
        ("long footer", block.to_vec(), [&honest[..], &[0]].concat(), true),
    ];
    // In one part, as an in-memory transport hands it over, and cut into parts, which the node
    // gathers and hashes as they come in.
    for ((case, body, footer, header), parts) in
        cases.iter().flat_map(|c| [0, 3, 7].map(|parts| (c, parts)))
    {
        let (case, header) = (format!("{case}, {parts} parts"), *header);
        let case = case.as_str();
        let mut h = Harness::new(reader_of("p:9000"));
        h.read(1, Some("bytes=0-9"));
        let probe = h.take_sends().remove(0);
        h.answer_origin(&probe);
        let peer = h.take_sends().remove(0);
        assert_eq!(peer.endpoint, Endpoint::Peer, "{case}");
        answer_raw_in(&mut h, peer.id, body, footer, header, parts);
        assert!(h.store.is_empty(), "{case}: nothing of the answer is cached");
        let breaker = &h.node.engine().p2p().expect("p2p").breaker;
        let state = breaker.state(&"p:9000".to_owned(), h.now);
        assert_eq!(state, CircuitState::Open, "{case}: a hard failure");
        h.serve_origin();
        assert_eq!(h.body_of(1), content(0, 10).to_vec(), "{case}: served from the origin");
        assert!(h.ended(1), "{case}");
        let mismatches = h.node.stats().peer_digest_mismatch;
        let digest_wrong = case.starts_with("flipped byte") || case.starts_with("footer of other");
        assert_eq!(mismatches, u64::from(digest_wrong), "{case}");
        assert_eq!(h.node.stats().peer_digests_verified, 0, "{case}");
    }
}

#[test]
fn a_cut_through_relay_truncates_a_block_whose_digest_fails_and_caches_nothing() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    let block = content(BLOCK, BLOCK);
    let mut flipped = block.to_vec();
    flipped[100] ^= 1;
    answer_raw(&mut h, up.id, &flipped, &xxh3_128(&block).footer(), true);
    assert_eq!(h.head_of(7).map(|x| x.status), Some(200), "the relay had cut through");
    assert_eq!(h.body_of(7).len() as u64, BLOCK - 1, "all but the last byte went out");
    assert!(h.aborted(7) && !h.ended(7), "then the answer is cut short: never a whole block");
    assert!(h.store.is_empty());
    let state = h.node.engine().p2p().expect("p2p").breaker.state(&"p:9000".to_owned(), h.now);
    assert_eq!(state, CircuitState::Open);
    assert_eq!(h.node.stats().peer_digest_mismatch, 1);
}

/// Counts the blocks it hashes.
#[derive(Debug, Default)]
struct CountingHasher(std::sync::atomic::AtomicUsize);

impl crate::integrity::BlockHasher for CountingHasher {
    fn digest(&self, block: &Bytes) -> crate::integrity::BlockDigest {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        xxh3_128(block)
    }
}

/// A relay (the tree's root for block 1) that reads the block from the origin in `parts` parts,
/// with a hasher that counts what it hashes.
fn relayed_from_origin_in(parts: usize) -> (Harness, std::sync::Arc<CountingHasher>) {
    let hasher = std::sync::Arc::new(CountingHasher::default());
    let mut h = Harness::new(reader_of("p:9000"));
    h.node.set_block_hasher(hasher.clone());
    size_known(&mut h);
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head());
    let block = content(BLOCK, BLOCK);
    for part in block.chunks((BLOCK as usize).div_ceil(parts)) {
        h.io(up.id, IoEvent::Body(block.slice_ref(part)));
    }
    h.io(up.id, IoEvent::End);
    (h, hasher)
}

#[test]
fn a_relayed_block_is_hashed_once_for_its_check_its_kept_digest_and_its_footer() {
    let (h, hasher) = relayed_from_origin_in(1);
    assert_eq!(h.relay_block_of(7), content(BLOCK, BLOCK).to_vec());
    assert_eq!(h.store.len(), 1);
    assert_eq!(hasher.0.load(std::sync::atomic::Ordering::Relaxed), 1);
}

/// A block that arrives in parts is hashed as it is gathered, not by the node's hasher after:
/// from the origin (stored, its footer and its kept digest right) and from a peer (checked).
#[test]
fn a_block_gathered_from_parts_is_hashed_as_it_comes_in_and_not_again() {
    let (mut h, hasher) = relayed_from_origin_in(5);
    let block = content(BLOCK, BLOCK);
    assert_eq!(h.relay_block_of(7), block.to_vec(), "the footer is the block's digest");
    assert_eq!(h.store.len(), 1);
    relay_request(&mut h, 8, 1);
    assert_eq!(h.relay_block_of(8), block.to_vec(), "served from the store, kept digest right");
    assert_eq!(hasher.0.load(std::sync::atomic::Ordering::Relaxed), 0, "never hashed again");

    let mut h = Harness::new(reader_of("p:9000"));
    h.node.set_block_hasher(hasher.clone());
    h.read(1, Some("bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let peer = h.take_sends().remove(0);
    let block = content(0, BLOCK);
    answer_raw_in(&mut h, peer.id, &block, &xxh3_128(&block).footer(), true, 4);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.node.stats().peer_digests_verified, 1);
    assert_eq!(hasher.0.load(std::sync::atomic::Ordering::Relaxed), 0, "checked as it came in");
}

/// A relay serving a block it holds: the answer ends with the block's digest, in this wire form.
#[test]
fn the_wire_form_of_a_block_answer() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    let e = engine();
    h.store.insert(e.block_key(&e.identify(URL), 1), content(BLOCK, BLOCK));
    relay_request(&mut h, 7, 1);
    let head = h.head_of(7).expect("a head");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers.get_str(HEADER_DIGEST), Some(DIGEST_ALGORITHM));
    assert_eq!(head.content_length(), Some(BLOCK + FOOTER_LEN));
    assert_eq!(h.relay_block_of(7), content(BLOCK, BLOCK).to_vec());
    assert!(h.sends().is_empty(), "served from the store");
    let body = h.body_of(7);
    let (block, footer) = body.split_at(body.len() - FOOTER_LEN as usize);
    let mut wire = format!("status {}\n", head.status);
    for (name, value) in head.headers.iter() {
        wire.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value)));
    }
    let hex: String = footer.iter().map(|b| format!("{b:02x}")).collect();
    wire.push_str(&format!("body: {} block bytes, then the footer {hex}\n", block.len()));
    assert_eq!(xxh3_128(block).footer(), footer);
    insta::assert_snapshot!(wire);
}

#[test]
fn a_relay_never_passes_on_a_block_that_rotted_in_its_store_and_reads_it_afresh() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    let block = content(BLOCK, BLOCK);
    // Relay 7 fetches block 1 from its parent and stores it, with the block's digest.
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head());
    h.io(up.id, IoEvent::Body(block.clone()));
    h.io(up.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), block.to_vec());
    // A byte of the stored copy changes (a disk or memory fault).
    let key = *h.store.keys().next().expect("stored");
    let mut rotten = block.to_vec();
    rotten[5] ^= 0x10;
    h.store.insert(key, Bytes::from(rotten));
    forget_held(&mut h);
    // Relay 8 finds the rotten copy: dropped, never sent, and the block is read afresh.
    relay_request(&mut h, 8, 1);
    assert_eq!(h.node.counters().rotten_blocks_dropped, 1);
    assert!(h.head_of(8).is_none(), "nothing of the rotten copy went out");
    let again = h.take_sends();
    assert_eq!(again.len(), 1, "fetched afresh: {again:?}");
    h.io(again[0].id, IoEvent::Connected);
    h.io(again[0].id, block_head());
    h.io(again[0].id, IoEvent::Body(block.clone()));
    h.io(again[0].id, IoEvent::End);
    assert_eq!(h.relay_block_of(8), block.to_vec());
    assert_eq!(h.store.get(&key).map(|b| b.to_vec()), Some(block.to_vec()), "stored again");
    // A held copy that is intact is served from the store with the digest it was stored with.
    relay_request(&mut h, 9, 1);
    assert!(h.take_sends().is_empty(), "a cache hit");
    assert_eq!(h.relay_block_of(9), block.to_vec());
    assert_eq!(h.node.counters().rotten_blocks_dropped, 1);
}

/// Relay request `id` for `block`, whose requester names the object: `size` bytes, version
/// `etag` (`X-DART-Object-*`).
fn told_relay_request(h: &mut Harness, id: u64, block: u64, size: &str, etag: Option<&str>) {
    let e = engine();
    let key = e.block_key(&e.identify(URL), block);
    let mut headers = Headers::new()
        .with("x-dart-origin", URL)
        .with("x-dart-hop", "0")
        .with("x-dart-object-size", size);
    if let Some(etag) = etag {
        headers.push("x-dart-object-etag", etag);
    }
    h.get(id, Plane::Peer, &crate::codec::wire::block_path(key), headers);
}

fn block_head_of(etag: &str) -> IoEvent {
    let headers = Headers::new().with("content-length", BLOCK.to_string()).with("etag", etag);
    IoEvent::Head { status: 200, headers }
}

/// A relay that does not know the object asks its parent at once under the size its
/// requester told, beside its own probe (not after it: a cold chain of relays would otherwise
/// probe the origin one hop after the other), and stores the block because the probe taught it
/// the same size and version by the time the block was whole.
#[test]
fn a_cold_relay_told_the_size_asks_its_parent_at_once_and_stores_the_block_its_probe_confirms() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.publish(1);
    told_relay_request(&mut h, 7, 1, &SIZE.to_string(), Some("\"v1\""));
    let sends = h.take_sends();
    let purposes: Vec<Purpose> = sends.iter().map(|s| s.purpose).collect();
    assert_eq!(purposes, [Purpose::Probe, Purpose::PeerBlock], "both at once");
    let (probe, up) = (&sends[0], &sends[1]);
    // It passes on what it was told.
    assert_eq!(up.headers.get_str("x-dart-object-size"), Some(SIZE.to_string().as_str()));
    assert_eq!(up.headers.get_str("x-dart-object-etag"), Some("\"v1\""));
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head_of("\"v1\""));
    assert!(h.head_of(7).is_some(), "the relay streams before its probe answered");
    h.answer_origin(probe);
    let block = content_of(1, BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(block.clone()));
    h.io(up.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), block.to_vec());
    assert_eq!(h.store.len(), 1, "confirmed by its own probe: stored");
    let stats = h.node.engine().stats();
    assert_eq!((stats.relay_told, stats.relay_told_unstored), (1, 0));
    assert_eq!(h.node.live_requests(), 0);
    // Known now: the next relay of the object asks its parent alone, and no probe.
    told_relay_request(&mut h, 8, 2, &SIZE.to_string(), Some("\"v1\""));
    let sends = h.take_sends();
    assert_eq!(sends.iter().map(|s| s.purpose).collect::<Vec<_>>(), [Purpose::PeerBlock]);
    // A warm parent's block is most often whole before the origin answers the probe: it waits
    // for the probe, stored if the answer confirms what the relay was told, else let go.
    for (etag, stored) in [("\"v1\"", 1), ("\"v0\"", 0)] {
        let mut h = Harness::new(reader_of("p:9000"));
        h.publish(1);
        told_relay_request(&mut h, 7, 1, &SIZE.to_string(), Some(etag));
        let sends = h.take_sends();
        let (probe, up) = (&sends[0], &sends[1]);
        h.io(up.id, IoEvent::Connected);
        h.io(up.id, block_head_of(etag));
        h.io(up.id, IoEvent::Body(content_of(1, BLOCK, BLOCK)));
        h.io(up.id, IoEvent::End);
        assert!(h.ended(7), "served without waiting for the probe");
        assert!(h.store.is_empty(), "not before the probe answered");
        h.answer_origin(probe);
        assert_eq!(h.store.len(), stored, "told {etag}");
        assert_eq!(h.node.engine().stats().relay_told_unstored, 1 - stored as u64);
        assert_eq!(h.node.live_requests(), 0);
    }
}

/// What a requester tells is never trusted: a block whose version the relay's own probe does
/// not confirm is passed on but not stored, an upstream whose block has another length than a
/// told size is not charged for it (the requester may have lied), and an origin window read
/// under a told size is used only if the origin's own answer agrees with it.
#[test]
fn a_relay_told_a_wrong_size_or_version_stores_nothing_and_charges_no_upstream() {
    // A stale version: the origin serves v2, the requester names v1, the parent serves v1.
    let mut h = Harness::new(reader_of("p:9000"));
    h.publish(2);
    told_relay_request(&mut h, 7, 1, &SIZE.to_string(), Some("\"v1\""));
    let sends = h.take_sends();
    h.answer_origin(&sends[0]);
    let up = &sends[1];
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head_of("\"v1\""));
    h.io(up.id, IoEvent::Body(content_of(1, BLOCK, BLOCK)));
    h.io(up.id, IoEvent::End);
    assert!(h.ended(7), "passed on: its requester judges it by what it knows");
    assert!(h.store.is_empty(), "a version the relay does not know is never stored");
    assert_eq!(h.node.engine().stats().relay_told_unstored, 1);
    // A wrong size, the probe not back: the parent's block of the true length is not charged,
    // and nothing is stored.
    let mut h = Harness::new(reader_of("p:9000"));
    told_relay_request(&mut h, 7, 1, &(SIZE + 5 * BLOCK).to_string(), None);
    let sends = h.take_sends();
    let up = sends.iter().find(|s| s.purpose == Purpose::PeerBlock).expect("asked at once");
    assert_eq!(up.headers.get_str("x-dart-object-etag"), None);
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, IoEvent::Head { status: 200, headers: Headers::new() });
    h.io(up.id, IoEvent::Body(content(BLOCK, BLOCK - 7)));
    h.io(up.id, IoEvent::End);
    assert!(!h.ended(7));
    assert!(h.store.is_empty());
    let state = h.node.engine().p2p().expect("p2p").breaker.state(&"p:9000".to_owned(), h.now);
    assert_eq!(state, CircuitState::Closed, "a length only told charges nobody");
    assert!(h.node.engine().stats().relay_told_refused >= 1);
    // A parent that does not hold it: with no ancestor left, the relay reads the window under
    // the told size beside its probe; the origin's answer names another total, so the window
    // is refused and nothing is stored.
    let mut h = Harness::new(reader_of("p:9000"));
    told_relay_request(&mut h, 7, 1, &(SIZE + 5 * BLOCK).to_string(), None);
    let sends = h.take_sends();
    let up = sends.iter().find(|s| s.purpose == Purpose::PeerBlock).expect("asked at once");
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, IoEvent::Head { status: 404, headers: Headers::new() });
    let window = h.take_sends();
    assert_eq!(window.iter().map(|s| s.purpose).collect::<Vec<_>>(), [Purpose::Window]);
    h.answer_origin(&window[0]);
    let status = status_of(&h, 7);
    assert_eq!(status, Some(500), "held, not streamed: the window's total contradicts it");
    h.answer_origin(&sends[0]);
    assert!(h.store.is_empty());
    assert!(h.sends().is_empty(), "{:?}", h.sends());
    assert_eq!(h.node.live_requests(), 0);
    // Told the truth, the same relay reads the window at once and stores it once its probe
    // confirms what it was told.
    let mut h = Harness::new(reader_of("p:9000"));
    told_relay_request(&mut h, 7, 1, &SIZE.to_string(), None);
    let sends = h.take_sends();
    let up = sends.iter().find(|s| s.purpose == Purpose::PeerBlock).expect("asked at once");
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, IoEvent::Head { status: 404, headers: Headers::new() });
    let window = h.take_sends();
    assert_eq!(window.iter().map(|s| s.purpose).collect::<Vec<_>>(), [Purpose::Window]);
    h.answer_origin(&window[0]);
    assert_eq!(h.relay_block_of(7), content(BLOCK, BLOCK).to_vec());
    assert!(h.store.is_empty(), "not before its probe answered");
    h.answer_origin(&sends[0]);
    assert_eq!(h.store.len(), 1);
}

/// A tree's root (no peer ancestor: its next source is the origin) told the size reads its
/// window beside its probe instead of after it, and stores the block once the probe confirms
/// it; a malformed value gets a clean 400.
#[test]
fn a_root_told_the_size_reads_its_window_beside_its_probe_and_a_malformed_one_is_refused() {
    let mut h = Harness::new(node_with(engine(), ""));
    told_relay_request(&mut h, 7, 1, &SIZE.to_string(), None);
    let sends = h.take_sends();
    let purposes: Vec<Purpose> = sends.iter().map(|s| s.purpose).collect();
    assert_eq!(purposes, [Purpose::Probe, Purpose::Window], "both at once");
    assert_eq!(h.node.engine().stats().relay_told, 1);
    h.answer_origin(&sends[1]);
    assert_eq!(h.relay_block_of(7), content(BLOCK, BLOCK).to_vec());
    h.answer_origin(&sends[0]);
    assert_eq!(h.store.len(), 1, "stored once the probe confirmed the size");
    for bad in ["", "0", "-5", "12a", "99999999999999999999999"] {
        let mut h = Harness::new(reader_of("p:9000"));
        told_relay_request(&mut h, 7, 1, bad, None);
        assert_eq!(status_of(&h, 7), Some(400), "{bad:?}");
        assert!(h.sends().is_empty());
    }
    let mut h = Harness::new(reader_of("p:9000"));
    told_relay_request(&mut h, 7, 1, &SIZE.to_string(), Some("bad\u{1}etag"));
    assert_eq!(status_of(&h, 7), Some(400));
}

/// A read names the object as it knows it when it asks a peer to fetch for it, and names
/// nothing on a held-only ask (which never fetches).
#[test]
fn a_fetch_on_behalf_names_the_object_as_the_reader_knows_it() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.publish(3);
    let up = start_block_read(&mut h, &["p:9000".to_owned()]);
    assert_eq!(up.headers.get_str("x-dart-object-size"), Some(SIZE.to_string().as_str()));
    assert_eq!(up.headers.get_str("x-dart-object-etag"), Some("\"v3\""));
    assert_eq!(up.headers.get_str("x-dart-object-last-modified"), None);
    let mut h = Harness::new(reader_with_neighbours());
    let ask = held_only_ask_before_the_origin(&mut h);
    assert_eq!(ask.headers.get_str("x-dart-object-size"), None, "held-only asks name nothing");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::default())]
    /// Whatever a requester tells a relay that does not know the object (a size off by a little
    /// or a block, another version, no version) and whatever its parent answers (another
    /// version, a short block), before or after the relay's own probe answers: the relay stores
    /// only the origin's bytes of the version the origin serves, stores nothing it fetched
    /// under a told size its probe did not confirm, charges its parent for a length only under a
    /// confirmed size, and ends with no request live.
    #[test]
    fn a_relay_trusts_nothing_its_requester_told_it(
        delta in proptest::sample::select(vec![0i64, 5, -5, 2 * BLOCK as i64]),
        told_etag in proptest::sample::select(vec![None, Some("\"v1\""), Some("\"v0\"")]),
        answer_etag in proptest::sample::select(vec!["\"v1\"", "\"v0\""]),
        short in proptest::bool::ANY,
        probe_first in proptest::bool::ANY,
        block in 0u64..4,
    ) {
        let mut h = Harness::new(reader_of("p:9000"));
        h.publish(1);
        let told_size = (SIZE as i64 + delta) as u64;
        told_relay_request(&mut h, 7, block, &told_size.to_string(), told_etag);
        let truth = delta == 0 && told_etag == Some("\"v1\"");
        let sends = h.take_sends();
        let probe = sends.iter().find(|s| s.purpose == Purpose::Probe).cloned();
        let up = sends.iter().find(|s| s.purpose == Purpose::PeerBlock).cloned();
        let real = BLOCK.min(SIZE - block * BLOCK);
        if probe_first {
            if let Some(probe) = &probe {
                h.answer_origin(probe);
            }
        }
        if let Some(up) = &up {
            let len = if short { real - 3 } else { real };
            let version = if answer_etag == "\"v1\"" { 1 } else { 0 };
            let headers = Headers::new()
                .with("content-length", len.to_string())
                .with("etag", answer_etag);
            h.io(up.id, IoEvent::Connected);
            h.io(up.id, IoEvent::Head { status: 200, headers });
            if h.node.exchanges().iter().any(|(i, _, _)| *i == up.id) {
                h.io(up.id, IoEvent::Body(content_of(version, block * BLOCK, len)));
            }
            if h.node.exchanges().iter().any(|(i, _, _)| *i == up.id) {
                h.io(up.id, IoEvent::End);
            }
        }
        if !probe_first {
            if let Some(probe) = &probe {
                h.answer_origin(probe);
            }
        }
        // Whatever follows (the relay's own probe, an origin window).
        let mut windows = 0;
        loop {
            let sends: Vec<IoRequest> =
                h.take_sends().into_iter().filter(|r| r.endpoint == Endpoint::Origin).collect();
            if sends.is_empty() {
                break;
            }
            for r in sends {
                windows += usize::from(r.purpose == Purpose::Window);
                h.answer_origin(&r);
            }
        }
        for stored in h.store.values() {
            proptest::prop_assert_eq!(stored, &content_of(1, block * BLOCK, real));
        }
        let under_told = up.is_some();
        if under_told && !truth && windows == 0 {
            // Nothing from the parent is stored under a told size the probe did not confirm
            // (a window the origin answered is the origin's bytes, stored by its own answer).
            proptest::prop_assert!(h.store.is_empty(), "stored under an unconfirmed told size");
        }
        if under_told && truth && !short && answer_etag == "\"v1\"" {
            proptest::prop_assert_eq!(h.store.len(), 1, "a confirmed block is stored");
        }
        let state = h.node.engine().p2p().expect("p2p").breaker.state(&"p:9000".to_owned(), h.now);
        if !truth {
            proptest::prop_assert_eq!(state, CircuitState::Closed, "an honest parent blamed");
        }
        proptest::prop_assert_eq!(h.node.live_requests(), 0);
    }
}

#[test]
fn a_short_cut_through_stream_is_truncated_and_never_cached() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Head { status: 200, headers: Headers::new() });
    h.io(up.id, IoEvent::Body(content(BLOCK, BLOCK - 5)));
    h.io(up.id, IoEvent::End);
    assert!(h.aborted(7));
    assert!(!h.ended(7));
    assert!(h.store.is_empty());
    let state = h.node.engine().p2p().expect("p2p").breaker.state(&"p:9000".to_owned(), h.now);
    assert_eq!(state, CircuitState::Open, "a wrong length is a hard failure");
}

#[test]
fn a_relay_whose_requester_leaves_mid_stream_still_caches_the_block() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 7, 2);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Head { status: 200, headers: Headers::new() });
    h.feed(Input::Cancel { id: RequestId(7) });
    h.io(up.id, IoEvent::Body(content(2 * BLOCK, BLOCK)));
    h.io(up.id, IoEvent::End);
    assert_eq!(h.store.len(), 1);
    assert!(!h.ended(7));
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_driver_bug_in_one_request_fails_only_that_request() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let fetch = h.take_sends().remove(0);
    // A second, independent object read is in flight on another exchange.
    let request = Inbound {
        method: "GET".into(),
        target: "/dart/http://origin/o/other".into(),
        headers: Headers::new(),
        body: Bytes::new(),
    };
    h.feed(Input::Request { id: RequestId(2), plane: Plane::Client, request });
    let other = h.take_sends().remove(0);
    // The driver reports body bytes before any head: a contract violation, so a panic.
    h.io(fetch.id, IoEvent::Body(Bytes::from_static(b"oops")));
    assert_eq!(h.node.counters().panics, 1);
    assert_eq!(h.head_of(1).map(|h| h.status), Some(500), "no byte was out: a clean 500");
    assert!(h.cancelled(fetch.id));
    assert!(h.outputs.iter().any(|o| matches!(o, Output::Event(Event::Panicked { .. }))));
    h.node.check_invariants();
    h.answer_origin(&other);
    h.serve_origin();
    assert!(h.ended(2), "the other read goes on");
    h.outputs.clear();
    h.read(3, None);
    h.serve_origin();
    assert_eq!(h.body_of(3), content(0, SIZE).to_vec(), "a re-read returns correct bytes");
}

#[test]
fn a_range_blind_origin_is_piped_verbatim() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, Some("bytes=5-9"));
    let probe = h.take_sends().remove(0);
    let whole = Headers::new().with("content-length", SIZE.to_string()).with("etag", "\"v1\"");
    h.io(probe.id, IoEvent::Head { status: 200, headers: whole.clone() });
    let pass = h.take_sends().remove(0);
    assert_eq!(pass.headers.get_str("range"), Some("bytes=5-9"), "the client's Range is forwarded");
    h.io(pass.id, IoEvent::Head { status: 200, headers: whole });
    let head = h.head_of(1).expect("head");
    assert_eq!((head.status, head.headers.get_str("etag")), (200, Some("\"v1\"")));
    assert!(h
        .outputs
        .iter()
        .any(|o| matches!(o, Output::Pipe { io, to } if *io == pass.id && to.0 == 1)));
    h.io(pass.id, IoEvent::End);
    assert!(h.ended(1));
    assert_eq!(h.node.stats().passthrough, 1);
}

#[test]
fn body_parts_wait_for_the_transport_to_drain() {
    let mut node = node_with(engine(), "");
    let t = Instant::ZERO;
    let e = engine();
    node.engine_mut().record_probe(
        &e.identify(URL),
        crate::engine::origin::ProbeOutcome::Size(SIZE),
        Default::default(),
        Instant::ZERO,
    );
    let request = Inbound {
        method: "GET".into(),
        target: format!("/dart/{URL}"),
        headers: Headers::new(),
        body: Bytes::new(),
    };
    node.handle_input(Input::Request { id: RequestId(1), plane: Plane::Client, request }, t);
    let mut bodies = 0;
    let mut ended = false;
    for _ in 0..64 {
        let mut ops = Vec::new();
        while let Some(o) = node.poll_output() {
            match o {
                Output::StoreGet { op, key, window } => {
                    let b = key.block;
                    let block = content(b * BLOCK, (SIZE - b * BLOCK).min(BLOCK));
                    ops.push((op, window.map_or(Some(block.clone()), |w| w.slice(&block))))
                }
                Output::Body { .. } => bodies += 1,
                Output::End { .. } => ended = true,
                _ => {}
            }
        }
        for (op, block) in ops {
            node.handle_input(Input::Store { op, block }, t);
        }
        node.check_invariants();
    }
    assert_eq!(bodies, BODY_WINDOW, "no more parts than the window before a drain");
    assert!(!ended);
    node.handle_input(Input::Drained { id: RequestId(1) }, t);
    let mut more = Vec::new();
    while let Some(o) = node.poll_output() {
        more.push(o);
    }
    assert!(more.iter().any(|o| matches!(o, Output::End { .. })), "{more:?}");
}

#[test]
fn a_ping_gets_a_roster_of_the_responder_alone() {
    let mut h = Harness::new(reader_of("p:9000"));
    let target =
        format!("{}?{}", crate::codec::wire::ROSTER_PATH, crate::codec::wire::ROSTER_SELF_QUERY);
    h.get(1, Plane::Peer, &target, Headers::new());
    let body = String::from_utf8(h.body_of(1)).expect("utf-8");
    assert!(body.contains("\"reader\"") && !body.contains("\"parent\""), "{body}");
    h.get(2, Plane::Peer, crate::codec::wire::ROSTER_PATH, Headers::new());
    let body = String::from_utf8(h.body_of(2)).expect("utf-8");
    assert!(body.contains("\"parent\""), "the whole roster without it: {body}");
}

/// The roster carries a tag of its bytes; a fetch that offers it back while it holds gets a 304
/// with no body (about 50 bytes a member saved per fetch in a settled cluster), a ping never.
#[test]
fn an_unchanged_roster_answers_304_to_the_tag_it_was_sent_with() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.get(1, Plane::Peer, crate::codec::wire::ROSTER_PATH, Headers::new());
    let head = h.head_of(1).expect("head");
    assert_eq!(head.status, 200);
    let tag = head.headers.get_str("etag").expect("a tag").to_owned();
    assert!(tag.starts_with('"') && tag.ends_with('"'), "{tag}");
    let offered = Headers::new().with("if-none-match", tag.as_str());
    h.get(2, Plane::Peer, crate::codec::wire::ROSTER_PATH, offered.clone());
    let head = h.head_of(2).expect("head");
    assert_eq!((head.status, head.body), (304, false));
    assert_eq!(head.headers.get_str("x-dart-node"), Some("reader"), "it names itself");
    assert!(h.body_of(2).is_empty() && h.ended(2));
    let ping =
        format!("{}?{}", crate::codec::wire::ROSTER_PATH, crate::codec::wire::ROSTER_SELF_QUERY);
    h.get(3, Plane::Peer, &ping, offered);
    assert_eq!(h.head_of(3).map(|x| x.status), Some(200), "a ping is answered whole");
    let stale = Headers::new().with("if-none-match", "\"0000000000000000\"");
    h.get(4, Plane::Peer, crate::codec::wire::ROSTER_PATH, stale);
    assert_eq!(h.head_of(4).map(|x| x.status), Some(200), "another tag: the whole roster");
}

/// A node discovering from seed `p:9000` whose first round the parent answered with a whole
/// roster tagged `"t1"` (the first fetch offered no tag: it had none).
fn discovering_parent_tagged_t1() -> Harness {
    let mut h = discovering(crate::discovery::Seeds::Static(vec!["p:9000".into()]));
    h.advance(Duration::ZERO);
    let ask = h.take_sends().remove(0);
    assert_eq!(ask.headers.get_str("if-none-match"), None, "nothing to offer yet");
    let body = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"}]}"#;
    let headers = Headers::new().with("x-dart-node", "parent").with("etag", "\"t1\"");
    h.io(ask.id, IoEvent::Head { status: 200, headers });
    h.io(ask.id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
    h.io(ask.id, IoEvent::End);
    h
}

/// A discovery round offers the tag of the roster a member last sent; its 304 is direct contact
/// (the member stays, no hearsay is lost), and a 304 from another process at that address
/// credits nobody and makes the next round fetch the whole roster.
#[test]
fn discovery_offers_the_last_tag_and_takes_a_304_as_contact() {
    let mut h = discovering_parent_tagged_t1();
    assert_eq!(view_ids(&h), ["parent", "reader"]);
    for (round, responder, kept) in [(1, "parent", true), (2, "impostor", false)] {
        // The next rounds (quick, then the interval) offer the tag while it holds.
        h.advance(h.node.poll_timeout().expect("a round due").saturating_duration_since(h.now));
        let ask = h.take_sends().into_iter().find(|r| r.url.ends_with("/peer/v1/roster"));
        let ask = ask.expect("asked");
        assert_eq!(ask.headers.get_str("if-none-match"), Some("\"t1\""), "round {round}");
        let headers = Headers::new().with("x-dart-node", responder);
        h.io(ask.id, IoEvent::Head { status: 304, headers });
        h.io(ask.id, IoEvent::End);
        assert_eq!(view_ids(&h), ["parent", "reader"], "round {round}: nobody left or came");
        let stats = h.node.directory().expect("discovery").stats();
        assert_eq!((stats.answers, stats.unchanged), (1, 1), "round {round}: one credited 304");
        h.node.check_invariants();
        if !kept {
            h.advance(h.node.poll_timeout().expect("a round due").saturating_duration_since(h.now));
            let ask = h.take_sends().into_iter().find(|r| r.url.ends_with("/peer/v1/roster"));
            let ask = ask.expect("asked");
            assert_eq!(ask.headers.get_str("if-none-match"), None, "the tag was dropped");
        }
    }
}

/// A 304 that comes with a body is broken HTTP: the fetch fails (the round counts a failure,
/// nobody is credited by it) and the exchange is cancelled.
#[test]
fn a_304_roster_with_a_body_fails_the_fetch() {
    let mut h = discovering_parent_tagged_t1();
    h.advance(h.node.poll_timeout().expect("a round due").saturating_duration_since(h.now));
    let ask = h.take_sends().into_iter().find(|r| r.url.ends_with("/peer/v1/roster"));
    let ask = ask.expect("asked");
    assert_eq!(ask.headers.get_str("if-none-match"), Some("\"t1\""));
    let headers = Headers::new().with("x-dart-node", "parent");
    h.io(ask.id, IoEvent::Head { status: 304, headers });
    h.io(ask.id, IoEvent::Body(Bytes::from_static(b"{}")));
    assert!(h.cancelled(ask.id), "the exchange is cancelled");
    assert_eq!(h.node.exchanges().len(), 0);
    assert_eq!(view_ids(&h), ["parent", "reader"], "one failed fetch forgets nobody");
    h.node.check_invariants();
}

#[test]
fn the_roster_names_this_node_and_learns_a_caller() {
    let mut h = Harness::new(reader_of("p:9000"));
    let headers =
        Headers::new().with("x-dart-node", "caller").with("x-dart-peer-addr", "10.0.0.9:9000");
    h.get(1, Plane::Peer, "/peer/v1/roster", headers);
    let head = h.head_of(1).expect("head");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers.get_str("x-dart-node"), Some("reader"));
    let body = String::from_utf8(h.body_of(1)).expect("utf-8");
    assert!(body.contains("\"reader\"") && body.contains("\"parent\""), "{body}");
    assert_eq!(h.node.learned().get("caller").map(String::as_str), Some("10.0.0.9:9000"));
}

#[test]
fn a_roster_fetch_reports_the_responder_and_records_the_outcome() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.feed(Input::FetchRoster { ticket: 9, addr: "p:9000".into() });
    let req = h.take_sends().remove(0);
    assert_eq!(req.url, "http://p:9000/peer/v1/roster");
    assert_eq!(req.headers.get_str("x-dart-peer-addr"), Some("reader:9000"));
    let body = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"}]}"#;
    h.io(
        req.id,
        IoEvent::Head { status: 200, headers: Headers::new().with("x-dart-node", "parent") },
    );
    h.io(req.id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
    h.io(req.id, IoEvent::End);
    let got = h.outputs.iter().find_map(|o| match o {
        Output::Event(Event::Roster { ticket: 9, result }) => Some(result.clone()),
        _ => None,
    });
    let (roster, responder) = got.expect("an answer").expect("a roster");
    assert_eq!(responder.as_deref(), Some("parent"));
    assert_eq!(roster.members.len(), 1);
    assert_eq!(h.node.engine().p2p().expect("p2p").breaker.counters().answered, 1);
}

#[test]
fn a_neighbour_is_pinged_with_a_roster_fetch_and_scored_by_its_outcome() {
    let mut node = reader_of("p:9000");
    let config = crate::overlay::set::Config::default();
    assert!(node.enable_neighbours(config, crate::rng::from_seed(7), Instant::ZERO));
    let mut h = Harness::new(node);
    h.advance(Duration::ZERO);
    assert!(h.take_sends().is_empty(), "the first update sends nothing");
    let score = |h: &Harness| {
        let n = h.node.engine().neighbours().expect("on").report();
        assert_eq!(n.len(), 1, "the only other member is the neighbour: {n:?}");
        (n[0].id.clone(), n[0].score, n[0].requests, n[0].failures)
    };
    assert_eq!(score(&h), ("parent".into(), 64, 0, 0));
    h.advance(crate::engine::neighbours::PING_INTERVAL);
    let ping = h.take_sends();
    assert_eq!(ping.len(), 1, "one ping per interval");
    assert_eq!(ping[0].url, "http://p:9000/peer/v1/roster?self", "a ping asks only who answers");
    let body = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"}]}"#;
    h.io(
        ping[0].id,
        IoEvent::Head { status: 200, headers: Headers::new().with("x-dart-node", "parent") },
    );
    h.io(ping[0].id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
    h.io(ping[0].id, IoEvent::End);
    assert_eq!(score(&h), ("parent".into(), 72, 1, 0), "an answered ping is a success");
    h.advance(crate::engine::neighbours::PING_INTERVAL);
    let ping = h.take_sends();
    h.io(ping[0].id, IoEvent::Failed(IoError::Connect("connection refused".into())));
    assert_eq!(score(&h), ("parent".into(), 64, 2, 1), "a refused dial is a plain failure");
    assert!(h.node.poll_timeout().is_some_and(|t| t > h.now));
}

fn held_only_request(h: &mut Harness, id: u64, url: &str, block: u64, held_only: &'static str) {
    let e = engine();
    let key = e.block_key(&e.identify(url), block);
    let headers = Headers::new()
        .with("x-dart-origin", url)
        .with("x-dart-hop", "0")
        .with("x-dart-held-only", held_only);
    h.get(id, Plane::Peer, &crate::codec::wire::block_path(key), headers);
}

#[test]
fn a_held_only_relay_serves_what_it_holds_named_by_its_version_and_never_fetches() {
    let mut h = Harness::new(reader_of("p:9000"));
    let e = engine();
    let id = e.identify(URL);
    let meta = crate::engine::ObjectMeta::from_fields(|n| (n == "etag").then_some(&b"\"v1\""[..]));
    let outcome = crate::engine::origin::ProbeOutcome::Size(SIZE);
    h.node.engine_mut().record_probe(&id, outcome, meta, Instant::ZERO);
    h.store.insert(e.block_key(&id, 1), content(BLOCK, BLOCK));
    held_only_request(&mut h, 7, URL, 1, "1");
    let head = h.head_of(7).expect("an answer");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers.get_str("etag"), Some("\"v1\""), "named by the version it holds");
    assert_eq!(h.relay_block_of(7), content(BLOCK, BLOCK).to_vec());
    // Not held: 404, and nothing is fetched for it.
    held_only_request(&mut h, 8, URL, 2, "1");
    assert_eq!(status_of(&h, 8), Some(404));
    // Held, but of an object whose version this node does not know: not served.
    let other = "http://origin/o/other";
    let other_id = e.identify(other);
    h.store.insert(e.block_key(&other_id, 0), content(0, BLOCK));
    held_only_request(&mut h, 9, other, 0, "1");
    assert_eq!(status_of(&h, 9), Some(404));
    assert!(h.take_sends().is_empty(), "a held-only relay never fetches");
    held_only_request(&mut h, 10, URL, 1, "yes");
    assert_eq!(status_of(&h, 10), Some(400), "a bad held-only header is refused");
}

/// A read of one block whose tree parent does not hold it, with neighbours on: returns the
/// held-only ask of a neighbour it sends before the origin.
fn held_only_ask_before_the_origin(h: &mut Harness) -> IoRequest {
    h.advance(Duration::ZERO);
    h.publish(1);
    h.read(1, Some("bytes=0-9"));
    let probe = h.sends().into_iter().find(|r| r.endpoint == Endpoint::Origin).expect("a probe");
    h.outputs.retain(|o| !matches!(o, Output::Send(r) if r.id == probe.id));
    h.answer_origin(&probe);
    let ask = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Peer).expect("parent");
    h.io(ask.id, IoEvent::Connected);
    h.io(ask.id, IoEvent::Head { status: 404, headers: Headers::new() });
    let held = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Peer);
    let held = held.expect("the neighbour is asked before the origin");
    assert_eq!(held.headers.get_str("x-dart-held-only"), Some("1"));
    held
}

fn reader_with_neighbours() -> Node {
    let mut node = reader_of("p:9000");
    let config = crate::overlay::set::Config::default();
    assert!(node.enable_neighbours(config, crate::rng::from_seed(3), Instant::ZERO));
    node
}

/// The head bound of a held-only ask of a node without an estimate.
fn held_only_head_bound_cold() -> Duration {
    crate::engine::probe_wait(COLD_DELAY).max(super::exchange::HELD_ONLY_HEAD_FLOOR)
}

#[test]
fn a_held_only_ask_that_connects_has_a_short_head_bound_and_charges_nothing() {
    let mut h = Harness::new(reader_with_neighbours());
    let held = held_only_ask_before_the_origin(&mut h);
    h.advance(Duration::from_millis(50));
    h.io(held.id, IoEvent::Connected);
    // Connected, it has as long as a liveness probe (a quarter of the cold hedge delay, at
    // least 100 ms) to answer: it needs no upstream.
    let bound = held_only_head_bound_cold();
    assert_eq!(bound, Duration::from_millis(100));
    h.advance(bound - Duration::from_millis(1));
    assert!(!h.cancelled(held.id));
    assert!(h.sends().iter().all(|r| r.endpoint != Endpoint::Origin), "still waiting on it");
    h.advance(Duration::from_millis(1));
    assert!(h.cancelled(held.id), "given up after the short head bound");
    assert_eq!(breaker_of(&h).soft, 0, "and not charged: a busy peer is not a failed one");
    h.serve_origin();
    assert_eq!(h.body_of(1), content_of(1, 0, 10).to_vec(), "the origin paid");
}

/// A black-holed neighbour or successor (no answer to the dial at all): the read waits for the
/// connection no longer than for a head, and the dial runs on to the dial bound, where the
/// failure is the peer's. Before, the read waited the whole dial bound (1 s) on each such ask:
/// `black-hole` at full scale cost every reader about 0.7 s, the home's read and its read-ahead
/// each waiting on its successor, the hole.
#[test]
fn a_held_only_ask_that_cannot_connect_is_left_for_the_origin_at_its_short_bound_and_its_dial_runs_on(
) {
    let mut h = Harness::new(reader_with_neighbours());
    let held = held_only_ask_before_the_origin(&mut h);
    let asked_at = h.now;
    h.advance(held_only_head_bound_cold() - Duration::from_millis(1));
    assert!(h.sends().iter().all(|r| r.endpoint != Endpoint::Origin), "still waiting on it");
    h.advance(Duration::from_millis(1));
    let fill = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Origin);
    let fill = fill.expect("left for the origin at the short bound");
    assert!(!h.cancelled(held.id), "the dial runs on");
    assert_eq!(breaker_of(&h).soft + breaker_of(&h).hard, 0, "nothing charged yet");
    h.answer_origin(&fill);
    assert_eq!(h.body_of(1), content_of(1, 0, 10).to_vec(), "the origin paid");
    assert!(h.ended(1));
    // The dial bound (1 s): a dial that never connected is the peer's failure.
    let dial = h.node.config().bounds.peer_dial;
    h.advance((asked_at + dial).saturating_duration_since(h.now));
    assert!(h.cancelled(held.id));
    assert_eq!(breaker_of(&h).hard, 1, "a failed dial opens the circuit");
    assert!(h.node.exchanges().is_empty());
}

#[test]
fn a_neighbours_held_block_is_used_only_when_it_names_the_version_the_read_serves() {
    let mut node = reader_of("p:9000");
    let config = crate::overlay::set::Config::default();
    assert!(node.enable_neighbours(config, crate::rng::from_seed(3), Instant::ZERO));
    let mut h = Harness::new(node);
    h.advance(Duration::ZERO);
    h.publish(1);
    let miss = |h: &mut Harness| {
        // The tree parent does not hold the block: 404 (not a failure).
        let ask = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Peer);
        let ask = ask.expect("the parent is asked");
        assert_eq!(ask.headers.get_str("x-dart-held-only"), None);
        h.io(ask.id, IoEvent::Connected);
        h.io(ask.id, IoEvent::Head { status: 404, headers: Headers::new() });
    };
    h.read(1, Some("bytes=0-9"));
    let probe = h.sends().into_iter().find(|r| r.endpoint == Endpoint::Origin).expect("a probe");
    h.outputs.retain(|o| !matches!(o, Output::Send(r) if r.id == probe.id));
    h.answer_origin(&probe);
    miss(&mut h);
    let held = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Peer);
    let held = held.expect("the neighbour is asked before the origin");
    assert_eq!(held.headers.get_str("x-dart-held-only"), Some("1"));
    assert_eq!(held.headers.get_str("x-dart-origin"), Some(URL));
    // It names no version: another one, for all the read knows. Refused; the origin pays.
    h.io(held.id, IoEvent::Connected);
    let plain = Headers::new().with("content-length", BLOCK.to_string());
    h.io(held.id, IoEvent::Head { status: 200, headers: plain });
    h.serve_origin();
    assert_eq!(h.body_of(1), content_of(1, 0, 10).to_vec());
    assert_eq!(h.node.stats().neighbour_hits, 0);
    assert_eq!(h.node.stats().peer_version_mismatch, 1);
    // Block 1: the neighbour names the read's version: its block is used, the origin is not asked.
    h.read(2, Some("bytes=1024-1033"));
    miss(&mut h);
    let held = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Peer).expect("asked");
    h.io(held.id, IoEvent::Connected);
    let named = Headers::new().with("content-length", BLOCK.to_string()).with("etag", "\"v1\"");
    h.io(held.id, IoEvent::Head { status: 200, headers: named });
    h.io(held.id, IoEvent::Body(content_of(1, BLOCK, BLOCK)));
    h.io(held.id, IoEvent::End);
    assert!(h.take_sends().iter().all(|r| r.endpoint != Endpoint::Origin), "no origin fetch");
    assert_eq!(h.body_of(2), content_of(1, BLOCK, 10).to_vec());
    assert_eq!(h.node.stats().neighbour_hits, 1);
}

/// A reader with discovery on: it knows only itself until a round teaches it more.
fn discovering(seeds: crate::discovery::Seeds) -> Harness {
    let mut node = reader_of("p:9000");
    let timing = crate::discovery::Timing::default();
    node.enable_discovery(seeds, timing, Instant::ZERO).expect("discovery on");
    let mut h = Harness::new(node);
    h.pump();
    h
}

fn view_ids(h: &Harness) -> Vec<String> {
    let view = h.node.engine().p2p().expect("p2p").placement.view();
    view.members().iter().map(|m| m.id.clone()).collect()
}

#[test]
fn discovery_places_over_the_members_a_round_meets_and_nothing_it_only_hears_of() {
    let mut h = discovering(crate::discovery::Seeds::Static(vec!["p:9000".into()]));
    assert_eq!(view_ids(&h), ["reader"], "alone until the first round; the fixed view is gone");
    h.advance(Duration::ZERO);
    let ask = h.take_sends();
    assert_eq!(ask.len(), 1);
    assert_eq!(ask[0].url, "http://p:9000/peer/v1/roster");
    let body = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"},{"id":"ghost","addr":"g:9000"}]}"#;
    h.io(
        ask[0].id,
        IoEvent::Head { status: 200, headers: Headers::new().with("x-dart-node", "parent") },
    );
    h.io(ask[0].id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
    h.io(ask[0].id, IoEvent::End);
    let ghost = h.take_sends();
    assert_eq!(ghost.len(), 1, "hearsay is asked in the same round");
    assert_eq!(ghost[0].url, "http://g:9000/peer/v1/roster");
    h.io(ghost[0].id, IoEvent::Failed(IoError::Connect("connection refused".into())));
    assert_eq!(view_ids(&h), ["parent", "reader"], "placed over the member met, not the ghost");
    let changed = h.outputs.iter().any(|o| {
        matches!(o, Output::Event(Event::View { joined, left, .. }) if joined == &["parent"] && left.is_empty())
    });
    assert!(changed, "the new view is reported");
    // The round doubled the view (a boot): the next one is due quickly.
    assert_eq!(h.node.poll_timeout(), Some(Instant::ZERO + crate::discovery::QUICK_ROUND));
}

/// Found by `discovery-boot` (views of a ring-seeded boot filled an interval late): a broadcast
/// ping (`?self`: a roster of the responder alone) to an address a discovery round had asked
/// answered first and was taken as the round's answer; the round's own fetch, with the hearsay,
/// was then dropped.
#[test]
fn a_ping_answering_first_does_not_stand_in_for_the_rounds_roster_of_that_address() {
    let mut node = reader_of("p:9000");
    let seeds = crate::discovery::Seeds::Static(vec!["p:9000".into()]);
    let timing = crate::discovery::Timing::default();
    node.enable_discovery(seeds, timing, Instant::ZERO).expect("discovery on");
    assert!(node.enable_broadcast_targets(crate::rng::from_seed(1), Instant::ZERO));
    let mut h = Harness::new(node);
    h.pump();
    h.advance(Duration::ZERO);
    let ask = h.take_sends().remove(0);
    let answer = |h: &mut Harness, id, body: &'static str| {
        let headers = Headers::new().with("x-dart-node", "parent");
        h.io(id, IoEvent::Head { status: 200, headers });
        h.io(id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
        h.io(id, IoEvent::End);
    };
    let alone = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"}]}"#;
    answer(&mut h, ask.id, alone);
    assert_eq!(view_ids(&h), ["parent", "reader"]);
    // The quick round asks p:9000 again, and the new view designates the parent as a broadcast
    // target, which the targets' round pings; both are out, and the ping answers first.
    h.advance(Duration::from_millis(50));
    let sends = h.take_sends();
    assert_eq!(sends.len(), 2, "{sends:?}");
    let whole = sends.iter().find(|r| r.url == "http://p:9000/peer/v1/roster").expect("asked");
    let ping = sends.iter().find(|r| r.url == "http://p:9000/peer/v1/roster?self");
    let ping = ping.expect("pinged").id;
    answer(&mut h, ping, alone);
    assert!(h.take_sends().is_empty(), "a ping's roster teaches the round nothing");
    let full =
        r#"{"epoch":"2","members":[{"id":"parent","addr":"p:9000"},{"id":"c","addr":"c:9000"}]}"#;
    answer(&mut h, whole.id, full);
    let more = h.take_sends();
    assert_eq!(more.len(), 1, "the round's own roster is taken: {more:?}");
    assert_eq!(more[0].url, "http://c:9000/peer/v1/roster", "its hearsay asked in the round");
    h.node.check_invariants();
}

/// Found by the turmoil/madsim subset: a roster fetch that hung past the discovery interval
/// ended its round at its own bound, inside `handle_timeout` and after the round check, so the
/// next round was due at that very instant and `handle_timeout` left a timer at `now` (the
/// driver's timer task died on that assertion, and the node's timers with it).
#[test]
fn a_discovery_round_that_outlasts_its_interval_starts_the_next_in_the_same_timeout() {
    let mut h = discovering(crate::discovery::Seeds::Static(vec!["p:9000".into()]));
    h.advance(Duration::ZERO);
    let ask = h.take_sends().remove(0);
    h.io(ask.id, IoEvent::Connected);
    // The seed accepted and says nothing: the fetch ends at its head bound, past the interval.
    let mut waited = Duration::ZERO;
    while h.take_sends().is_empty() {
        let next = h.node.poll_timeout().expect("the fetch's bound is armed");
        assert!(waited < Duration::from_secs(60), "the fetch never ended");
        waited = next.saturating_duration_since(h.now);
        h.advance(waited); // asserts that handle_timeout moved every timer past now
    }
    assert!(h.now > Instant::ZERO + crate::discovery::DEFAULT_INTERVAL, "outlasted the interval");
    assert_eq!(h.node.directory().expect("discovery").stats().rounds, 2, "the next round began");
    h.node.check_invariants();
}

#[test]
fn a_member_that_announces_its_departure_leaves_the_view_at_once() {
    let mut h = discovering(crate::discovery::Seeds::Static(vec!["p:9000".into()]));
    h.advance(Duration::ZERO);
    let ask = h.take_sends().remove(0);
    let body = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"}]}"#;
    h.io(
        ask.id,
        IoEvent::Head { status: 200, headers: Headers::new().with("x-dart-node", "parent") },
    );
    h.io(ask.id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
    h.io(ask.id, IoEvent::End);
    assert_eq!(view_ids(&h), ["parent", "reader"]);
    let post = |h: &mut Harness, id: u64, method: &str, body: &'static str| {
        let request = Inbound {
            method: method.into(),
            target: crate::codec::wire::LEAVE_PATH.into(),
            headers: Headers::new(),
            body: Bytes::from_static(body.as_bytes()),
        };
        h.feed(Input::Request { id: RequestId(id), plane: Plane::Peer, request });
        status_of(h, id)
    };
    assert_eq!(post(&mut h, 1, "GET", ""), Some(405));
    assert_eq!(post(&mut h, 2, "POST", "{\"id\":\"parent\"}"), Some(400), "no address");
    assert_eq!(post(&mut h, 3, "POST", "not json"), Some(400));
    assert_eq!(post(&mut h, 4, "POST", r#"{"id":"parent","addr":"elsewhere:9000"}"#), Some(200));
    assert_eq!(
        view_ids(&h),
        ["parent", "reader"],
        "an announcement from another address is ignored"
    );
    assert_eq!(post(&mut h, 5, "POST", r#"{"id":"parent","addr":"p:9000"}"#), Some(200));
    assert_eq!(view_ids(&h), ["reader"], "out of the view at once, not after forget-after");
    h.node.check_invariants();
}

#[test]
fn a_drain_without_broadcast_targets_reports_at_once_that_nobody_was_told() {
    let mut node = reader_of("p:9000");
    assert!(node.enable_broadcast_targets(crate::rng::from_seed(1), Instant::ZERO));
    let mut h = Harness::new(node);
    h.feed(Input::Drain);
    let left = h
        .outputs
        .iter()
        .any(|o| matches!(o, Output::Event(Event::Left { announced: 0, answered: 0 })));
    assert!(left, "{:?}", h.outputs);
}

#[test]
fn a_drain_announces_the_departure_to_each_ping_verified_target_and_reports_when_done() {
    let mut node = reader_of("p:9000");
    assert!(node.enable_broadcast_targets(crate::rng::from_seed(1), Instant::ZERO));
    let mut h = Harness::new(node);
    h.advance(Duration::ZERO);
    // The designated member is pinged with a roster fetch naming this node.
    let ping = h.take_sends().remove(0);
    assert_eq!(ping.url, "http://p:9000/peer/v1/roster?self");
    assert_eq!(ping.headers.get_str("x-dart-node"), Some("reader"));
    let body = r#"{"epoch":"1","members":[{"id":"parent","addr":"p:9000"}]}"#;
    h.io(
        ping.id,
        IoEvent::Head { status: 200, headers: Headers::new().with("x-dart-node", "parent") },
    );
    h.io(ping.id, IoEvent::Body(Bytes::from_static(body.as_bytes())));
    h.io(ping.id, IoEvent::End);
    assert_eq!(h.node.broadcast_targets(), Some(&["parent".to_owned()][..]));
    h.feed(Input::Drain);
    let leave = h.take_sends().remove(0);
    assert_eq!((leave.method, leave.url.as_str()), ("POST", "http://p:9000/peer/v1/leave"));
    assert_eq!(&leave.body[..], br#"{"id":"reader","addr":"reader:9000"}"#);
    h.feed(Input::Drain);
    assert!(h.take_sends().is_empty(), "a second drain sends nothing");
    // Leaving, it no longer presents itself: a roster request is refused, and its own roster
    // fetches do not name it (either would make a member credit it again).
    h.get(9, Plane::Peer, crate::codec::wire::ROSTER_PATH, Headers::new());
    assert_eq!(status_of(&h, 9), Some(503));
    h.feed(Input::FetchRoster { ticket: 1, addr: "p:9000".into() });
    let anonymous = h.take_sends().remove(0);
    assert_eq!(anonymous.headers.get_str("x-dart-node"), None);
    assert_eq!(anonymous.headers.get_str("x-dart-peer-addr"), None);
    h.io(leave.id, IoEvent::Head { status: 200, headers: Headers::new() });
    h.io(leave.id, IoEvent::End);
    let left = h
        .outputs
        .iter()
        .any(|o| matches!(o, Output::Event(Event::Left { announced: 1, answered: 1 })));
    assert!(left, "{:?}", h.outputs);
}

#[test]
fn a_seed_name_that_does_not_answer_in_time_lets_the_round_go_on_and_its_late_answer_is_ignored() {
    let seeds = crate::discovery::Seeds::Dns { name: "dart.svc".into(), port: 9000 };
    let mut h = discovering(seeds);
    h.advance(Duration::ZERO);
    let ticket = h
        .outputs
        .iter()
        .find_map(|o| match o {
            Output::Resolve { ticket, name, port: 9000 } if name == "dart.svc" => Some(*ticket),
            _ => None,
        })
        .expect("the driver is asked to resolve the seed name");
    h.advance(crate::discovery::RESOLVE_BOUND);
    let told = h.outputs.iter().any(|o| matches!(o, Output::Event(Event::Discovery { message, .. }) if message.contains("did not resolve")));
    assert!(told, "the timeout is reported");
    assert!(h.node.poll_timeout().is_some_and(|t| t > h.now), "the next round is scheduled");
    h.feed(Input::Resolved { ticket, result: Ok(vec!["p:9000".into()]) });
    assert!(h.take_sends().is_empty(), "a late answer starts nothing");
    // The next round resolves again; the first round's answer, arriving now, is still stale.
    h.outputs.clear();
    h.advance(crate::discovery::DEFAULT_INTERVAL);
    let next = h.outputs.iter().find_map(|o| match o {
        Output::Resolve { ticket, .. } => Some(*ticket),
        _ => None,
    });
    let next = next.expect("the next round resolves");
    assert_ne!(next, ticket);
    h.feed(Input::Resolved { ticket, result: Ok(vec!["p:9000".into()]) });
    assert!(h.take_sends().is_empty(), "the stale ticket is refused while another resolves");
    h.feed(Input::Resolved { ticket: next, result: Ok(vec!["p:9000".into()]) });
    assert_eq!(h.take_sends().len(), 1, "the current answer starts the round's fetches");
    h.node.check_invariants();
}

#[test]
fn a_block_that_arrives_in_one_part_is_stored_and_served_without_a_copy() {
    // From the origin: one 206 part is the block the store gets.
    let mut h = Harness::new(node_with(engine(), ""));
    size_known(&mut h);
    h.read(1, Some("bytes=0-9"));
    let fetch = h.take_sends().remove(0);
    let part = content(0, BLOCK);
    let headers = Headers::new()
        .with("content-range", format!("bytes 0-{}/{SIZE}", BLOCK - 1))
        .with("content-length", BLOCK.to_string());
    h.io(fetch.id, IoEvent::Head { status: 206, headers });
    h.io(fetch.id, IoEvent::Body(part.clone()));
    h.io(fetch.id, IoEvent::End);
    let stored = h.store.values().next().expect("stored").clone();
    assert_eq!(stored.as_ptr(), part.as_ptr(), "the stored block is the part, not a copy");
    // From a peer, cut through: the forwarded parts and the stored block are all the part.
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Head { status: 200, headers: Headers::new() });
    let part = content(BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(part.clone()));
    h.io(up.id, IoEvent::End);
    let forwarded: Vec<Bytes> = h
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Body { data, .. } => Some(data.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(forwarded.len(), 3, "all but the last byte, then the last byte, then the digest");
    assert_eq!(forwarded[0].as_ptr(), part.as_ptr());
    assert_eq!(forwarded[1].as_ptr(), part[BLOCK as usize - 1..].as_ptr());
    assert_eq!(forwarded[2], xxh3_128(&part).footer());
    let stored = h.store.values().next().expect("stored").clone();
    assert_eq!(stored.as_ptr(), part.as_ptr());
    // Parts that come in pieces are joined.
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 8, 2);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Head { status: 200, headers: Headers::new() });
    let whole = content(2 * BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(whole.slice(..100)));
    h.io(up.id, IoEvent::Body(whole.slice(100..)));
    h.io(up.id, IoEvent::End);
    assert_eq!(h.relay_block_of(8), whole.to_vec());
    assert_eq!(h.store.values().next().map(|b| b.to_vec()), Some(whole.to_vec()));
}

#[test]
fn a_relay_whose_requester_leaves_still_learns_that_its_upstream_stalls() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_request(&mut h, 7, 1);
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Connected);
    h.feed(Input::Cancel { id: RequestId(7) });
    assert!(!h.cancelled(up.id), "the upstream exchange goes on");
    h.advance(Duration::from_secs(10));
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!((b.counters().soft, b.counters().abandoned), (1, 0), "the stall is recorded");
    assert!(h.sends().is_empty(), "nothing further is asked for a requester that left");
    assert_eq!(h.node.live_requests(), 0);
    assert!(h.head_of(7).is_none() && !h.ended(7));
}

// ---- Validators, conditional requests and objects that change at the origin ----

fn read_with(h: &mut Harness, id: u64, headers: Headers) {
    h.get(id, Plane::Client, &format!("/dart/{URL}"), headers);
}

fn store_drops(h: &Harness) -> usize {
    h.outputs.iter().filter(|o| matches!(o, Output::StoreDrop { .. })).count()
}

#[test]
fn the_client_head_carries_the_origin_validators_and_entity_fields() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.publish(1);
    h.origin.extra = vec![("content-type", "application/x-tar"), ("cache-control", "max-age=300")];
    h.read(1, None);
    h.serve_origin();
    let head = h.head_of(1).expect("a head");
    assert_eq!(head.headers.get_str("etag"), Some("\"v1\""));
    assert_eq!(head.headers.get_str("content-type"), Some("application/x-tar"));
    assert_eq!(head.headers.get_str("cache-control"), Some("max-age=300"));
    h.outputs.clear();
    h.read(2, Some("bytes=5-9"));
    let warm = h.head_of(2).expect("a head");
    assert_eq!(warm.headers.get_str("etag"), Some("\"v1\""), "a warm read names the version too");
}

#[test]
fn a_fresh_object_is_served_without_asking_the_origin_and_a_stale_one_revalidates() {
    let mut h = warmed_on_version_1();
    h.outputs.clear();
    h.advance(Duration::from_secs(59));
    h.read(2, None);
    assert!(h.sends().is_empty(), "fresh for --revalidate-after (60 s)");
    h.advance(Duration::from_secs(1));
    h.outputs.clear();
    h.read(3, None);
    let probe = h.take_sends();
    assert_eq!(probe.len(), 1, "one revalidating probe");
    assert_eq!(probe[0].headers.get_str("range"), Some("bytes=0-0"));
    h.answer_origin(&probe[0]);
    assert!(h.sends().is_empty(), "the same version: every block from the store");
    assert_eq!(h.body_of(3), content_of(1, 0, SIZE).to_vec());
    assert_eq!(h.node.stats().revalidations, 1);
    assert_eq!(h.node.stats().object_changes, 0);
    assert_eq!(store_drops(&h), 0);
}

#[test]
fn an_object_that_changed_at_the_origin_is_refetched_and_its_old_blocks_dropped() {
    let mut h = warmed_on_version_1();
    assert_eq!(h.store.len(), 4);
    h.publish(2);
    h.advance(Duration::from_secs(61));
    h.outputs.clear();
    h.read(2, None);
    h.serve_origin();
    assert_eq!(store_drops(&h), 1, "the old version's blocks are dropped at once");
    assert_eq!(h.body_of(2), content_of(2, 0, SIZE).to_vec(), "never a byte of the old version");
    assert_eq!(h.head_of(2).expect("head").headers.get_str("etag"), Some("\"v2\""));
    assert_eq!(h.node.stats().object_changes, 1);
    assert_eq!(h.store.len(), 4, "the new version is cached");
}

#[test]
fn an_object_that_changes_mid_read_restarts_the_read_before_any_byte_goes_out() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.publish(1);
    h.read(1, None);
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    // The origin changes between the probe and the first block.
    h.publish(2);
    h.serve_origin();
    assert_eq!(h.node.stats().object_changes, 1);
    let head = h.head_of(1).expect("a head");
    assert_eq!((head.status, head.headers.get_str("etag")), (200, Some("\"v2\"")));
    assert_eq!(h.body_of(1), content_of(2, 0, SIZE).to_vec(), "one version, whole");
    assert!(h.ended(1));
}

#[test]
fn an_object_that_changes_after_bytes_went_out_aborts_the_response_and_mixes_nothing() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.publish(1);
    h.read(1, None);
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let first = h.take_sends().remove(0);
    h.answer_origin(&first);
    assert_eq!(h.body_of(1), content_of(1, 0, BLOCK).to_vec());
    h.publish(2);
    h.serve_origin();
    assert!(h.aborted(1), "the response is cut, not finished with another version's bytes");
    assert!(!h.ended(1));
    assert_eq!(h.body_of(1), content_of(1, 0, BLOCK).to_vec(), "no byte of version 2 went out");
    assert!(h.store.values().all(|b| b.len() as u64 <= BLOCK));
    assert_eq!(h.store.len(), 0, "the first block was dropped with its version");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn conditional_requests_answer_304_412_and_honour_if_range() {
    let mut h = warmed_on_version_1();

    h.outputs.clear();
    read_with(&mut h, 2, Headers::new().with("if-none-match", "\"v1\""));
    let head = h.head_of(2).expect("a head");
    assert_eq!((head.status, head.body), (304, false));
    assert_eq!(head.headers.get_str("etag"), Some("\"v1\""));
    assert_eq!(head.content_length(), None, "a 304 carries no length");
    assert!(h.body_of(2).is_empty() && h.ended(2));

    read_with(&mut h, 3, Headers::new().with("if-match", "\"v0\""));
    assert_eq!(h.head_of(3).map(|h| h.status), Some(412));
    assert!(h.body_of(3).is_empty());

    let stale_range = Headers::new().with("range", "bytes=0-9").with("if-range", "\"v0\"");
    read_with(&mut h, 4, stale_range);
    let head = h.head_of(4).expect("a head");
    assert_eq!((head.status, head.content_length()), (200, Some(SIZE)), "If-Range failed: all");
    assert_eq!(h.body_of(4), content_of(1, 0, SIZE).to_vec());

    let fresh_range = Headers::new().with("range", "bytes=0-9").with("if-range", "\"v1\"");
    read_with(&mut h, 5, fresh_range);
    assert_eq!(h.head_of(5).map(|h| h.status), Some(206));
    assert_eq!(h.body_of(5), content_of(1, 0, 10).to_vec());
    assert!(h.sends().is_empty(), "all answered from what the node knows");
}

#[test]
fn a_stale_object_is_served_when_the_origin_is_down_and_counted() {
    let mut h = warmed_on_version_1();
    h.advance(Duration::from_secs(301));
    h.origin.status = Some(503);
    h.outputs.clear();
    h.read(2, None);
    h.serve_origin();
    assert_eq!(h.head_of(2).map(|h| h.status), Some(200), "stale-if-error");
    assert_eq!(h.body_of(2), content_of(1, 0, SIZE).to_vec());
    assert_eq!(h.node.stats().stale_served, 1);
}

/// A read that joins an origin flight in its second half and hears that the origin is
/// unavailable asks it again, once, instead of taking the verdict: the outage may have ended while
/// the flight hung (a read right after it was served the version from before it, in the
/// `stale-if-error` scenario, with reads joining the revalidations relays sent during it). One
/// that waited most of the flight takes the verdict, as the leader does.
#[test]
fn a_read_that_joined_a_failed_flight_late_asks_the_origin_again_once() {
    let mut h = warmed_on_version_1();
    h.advance(Duration::from_secs(301));
    h.publish(2);
    h.outputs.clear();
    h.read(2, None);
    let probe = h.take_sends().remove(0);
    assert_eq!(probe.purpose, Purpose::Probe);
    h.io(probe.id, IoEvent::Connected);
    h.advance(Duration::from_secs(1));
    h.read(3, None);
    h.advance(Duration::from_secs(9));
    h.read(4, None);
    assert!(h.sends().is_empty(), "both joined the revalidating probe");
    h.advance(Duration::from_secs(2));
    // The origin answers the flight, 12 s after it was sent, with a 503; it is back after that.
    h.origin.status = Some(503);
    h.answer_origin(&probe);
    h.origin.status = None;
    for (id, v) in [(2, 1), (3, 1)] {
        assert_eq!(h.head_of(id).map(|h| h.status), Some(200), "read {id}: stale-if-error");
        assert_eq!(h.body_of(id), content_of(v, 0, SIZE).to_vec());
    }
    assert_eq!(h.node.counters().origin_asked_again, 1);
    let again = h.sends();
    assert_eq!(again.iter().map(|s| s.purpose).collect::<Vec<_>>(), [Purpose::Probe]);
    h.serve_origin();
    assert_eq!(h.body_of(4), content_of(2, 0, SIZE).to_vec(), "read 4 asked again: version 2");
    assert!(h.ended(4));
    assert_eq!(h.node.live_requests(), 0);
    // Once: a late joiner whose second flight fails too takes that verdict.
    h.advance(Duration::from_secs(301));
    h.publish(3);
    h.outputs.clear();
    h.read(5, None);
    let probe = h.take_sends().remove(0);
    h.io(probe.id, IoEvent::Connected);
    h.advance(Duration::from_secs(10));
    h.read(6, None);
    h.advance(Duration::from_secs(2));
    h.origin.status = Some(503);
    h.answer_origin(&probe);
    let again = h.take_sends().remove(0);
    h.advance(Duration::from_secs(1));
    h.answer_origin(&again);
    assert_eq!(h.node.counters().origin_asked_again, 2);
    assert!(h.sends().is_empty(), "no third probe");
    for id in [5, 6] {
        assert_eq!(h.head_of(id).map(|h| h.status), Some(200), "read {id}: stale-if-error");
        assert_eq!(h.body_of(id), content_of(2, 0, SIZE).to_vec());
    }
}

#[test]
fn a_not_found_origin_is_not_papered_over_with_a_stale_copy() {
    let mut h = warmed_on_version_1();
    h.advance(Duration::from_secs(301));
    h.origin.status = Some(404);
    h.outputs.clear();
    h.read(2, None);
    h.serve_origin();
    assert_eq!(h.head_of(2).map(|h| h.status), Some(404), "the origin's answer, not stale bytes");
    assert_eq!(h.node.stats().stale_served, 0);
}

#[test]
fn an_immutable_prefix_is_never_revalidated() {
    let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
    let config = EngineConfig {
        geometry,
        immutable_prefixes: vec!["http://origin/o/".into()],
        read_ahead: 0,
        origin_read_ahead: 0,
        ..EngineConfig::default()
    };
    let mut h = Harness::new(node_with(Engine::new(config), ""));
    h.publish(1);
    h.read(1, None);
    h.serve_origin();
    h.advance(Duration::from_secs(86_400 * 30));
    h.outputs.clear();
    h.read(2, None);
    assert!(h.sends().is_empty(), "an immutable object is never probed again");
    assert_eq!(h.body_of(2), content_of(1, 0, SIZE).to_vec());
    assert_eq!(h.node.stats().revalidations, 0);
}

#[test]
fn a_peer_answer_naming_another_version_is_refused_without_charging_the_peer() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.publish(2);
    h.read(1, Some("bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let peer = h.take_sends().remove(0);
    assert_eq!(peer.endpoint, Endpoint::Peer);
    h.io(peer.id, IoEvent::Connected);
    let stale = Headers::new().with("content-length", BLOCK.to_string()).with("etag", "\"v1\"");
    h.io(peer.id, IoEvent::Head { status: 200, headers: stale });
    assert!(h.cancelled(peer.id), "the old version's bytes are never read");
    assert_eq!(h.node.stats().peer_version_mismatch, 1);
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!(b.counters().soft + b.counters().hard, 0, "a lagging peer is not a failing one");
    h.serve_origin();
    assert_eq!(h.body_of(1), content_of(2, 0, 10).to_vec(), "served from the origin instead");
}

#[test]
fn a_relay_head_names_the_version_it_serves() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.publish(3);
    h.read(1, None);
    h.serve_origin();
    h.outputs.clear();
    relay_request(&mut h, 7, 1);
    let head = h.head_of(7).expect("a relay head");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers.get_str("etag"), Some("\"v3\""));
    assert_eq!(h.relay_block_of(7), content_of(3, BLOCK, BLOCK).to_vec());
}

#[test]
fn a_requester_that_stops_reading_is_given_up_at_the_write_stall_bound() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    h.serve_origin();
    h.outputs.clear();
    h.drain = false;
    h.read(2, None);
    let parts = h.outputs.iter().filter(|o| matches!(o, Output::Body { .. })).count();
    assert_eq!(parts as u32, BODY_WINDOW, "the node stops at the window");
    assert_eq!(h.node.live_requests(), 1);
    let bound = Bounds::default().write_stall;
    assert_eq!(h.node.poll_timeout(), Some(h.now + bound));
    h.advance(bound - Duration::from_millis(1));
    assert!(!h.aborted(2));
    h.advance(Duration::from_millis(1));
    assert!(h.aborted(2), "the connection is aborted");
    assert!(!h.ended(2));
    assert_eq!(h.node.live_requests(), 0, "the request and its buffers are released");
    assert_eq!(h.node.counters().write_stalls, 1);
    h.assert_settled("the test's work");
}

#[test]
fn a_requester_that_keeps_reading_is_never_given_up() {
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    h.serve_origin();
    h.outputs.clear();
    h.drain = false;
    h.read(2, None);
    let bound = Bounds::default().write_stall;
    h.advance(bound - Duration::from_millis(1));
    // The requester takes one part just in time; the read goes on and finishes.
    h.drain = true;
    h.feed(Input::Drained { id: RequestId(2) });
    h.advance(bound);
    assert!(!h.aborted(2));
    assert!(h.ended(2));
    assert_eq!(h.body_of(2), content(0, SIZE).to_vec());
    assert_eq!(h.node.counters().write_stalls, 0);
}

// ---- Access: the upstream policy, the credential check, the peer MAC ----

use crate::peer_auth::{AuthRefusal, ClusterSecret, Covered, HEADER_AUTH};
use crate::policy::Refusal;

/// A node with the default access rules (every read of `origin` is vouched for by the origin).
fn checked_node() -> Node {
    node_with_access(engine(), "", Access::default())
}

fn read_url(h: &mut Harness, id: u64, url: &str, headers: Headers) {
    h.get(id, Plane::Client, &format!("/dart/{url}"), headers);
}

fn status_of(h: &Harness, id: u64) -> Option<u16> {
    h.head_of(id).map(|h| h.status)
}

#[test]
fn metadata_loopback_and_unlisted_upstreams_are_refused_before_any_exchange() {
    let mut h = Harness::new(checked_node());
    for (id, url, reason) in [
        (1, "http://169.254.169.254/latest/meta-data/", Refusal::LinkLocal),
        (2, "http://127.0.0.1:9100/metrics", Refusal::Loopback),
        (3, "http://[::1]/x", Refusal::Loopback),
        (4, "http://localhost/x", Refusal::Loopback),
        (5, "http://a.example@169.254.169.254/x", Refusal::LinkLocal),
        (6, "http://2130706433/x", Refusal::BadHost),
    ] {
        read_url(&mut h, id, url, Headers::new());
        let head = h.head_of(id).expect("an answer");
        assert_eq!(head.status, 403, "{url}");
        assert_eq!(head.headers.get_str("x-dart-refused"), Some(reason.label()), "{url}");
        assert!(h.node.access_counters().refused(reason) > 0, "{url}");
    }
    assert!(h.sends().is_empty(), "no exchange for a refused upstream");
    // A relay naming a refused origin is refused the same way.
    let e = engine();
    let key = e.block_key(&e.identify("http://169.254.169.254/x"), 0);
    let headers = Headers::new().with("x-dart-origin", "http://169.254.169.254/x");
    h.get(9, Plane::Peer, &crate::codec::wire::block_path(key), headers);
    assert_eq!(status_of(&h, 9), Some(403));
    assert!(h.sends().is_empty());
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn an_allow_list_admits_only_its_hosts_and_a_dial_time_refusal_is_a_403() {
    let access = Access {
        policy: crate::policy::UpstreamPolicy::new(
            vec!["origin".parse().expect("pattern"), ".blobs.example".parse().expect("pattern")],
            vec![],
        ),
        public: vec!["origin".parse().expect("pattern")],
        ..Access::default()
    };
    let mut h = Harness::new(node_with_access(engine(), "", access));
    read_url(&mut h, 1, "http://elsewhere/o/obj", Headers::new());
    assert_eq!(status_of(&h, 1), Some(403));
    assert!(h.sends().is_empty());
    // The name is admitted, but the shell's dialer found it resolves to a refused address.
    h.read(2, None);
    let probe = h.take_sends().remove(0);
    h.io(probe.id, IoEvent::Failed(IoError::Refused(Refusal::LinkLocal)));
    let head = h.head_of(2).expect("an answer");
    assert_eq!(head.status, 403);
    assert_eq!(head.headers.get_str("x-dart-refused"), Some("link_local"));
    assert_eq!(h.node.access_counters().refused(Refusal::LinkLocal), 1);
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_cached_private_object_is_served_only_to_requesters_the_origin_accepts() {
    let mut h = Harness::new(checked_node());
    h.origin.secret = Some("good");
    let good = format!("{URL}?sig=good&exp=1");
    read_url(&mut h, 1, &good, Headers::new());
    let check = h.take_sends();
    assert_eq!(check.len(), 1);
    assert_eq!(check[0].purpose, Purpose::Check);
    assert_eq!(check[0].url, good, "the requester's exact URL");
    assert_eq!(check[0].headers.get_str("range"), Some("bytes=0-0"));
    h.answer_origin(&check[0]);
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert_eq!(h.node.stats().probes, 0, "the check taught the size: no separate probe");
    assert_eq!(h.store.len(), 4, "the object is cached");

    // No signature, a forged one, another signature: each is checked, gets the origin's 403 and
    // no byte of the cached object.
    for (id, url) in
        [(2, URL.to_owned()), (3, format!("{URL}?sig=forged")), (4, format!("{URL}?sig=bad&exp=1"))]
    {
        h.outputs.clear();
        read_url(&mut h, id, &url, Headers::new());
        let sends = h.take_sends();
        assert_eq!(sends.len(), 1, "{url}: one check");
        h.answer_origin(&sends[0]);
        assert_eq!(status_of(&h, id), Some(403), "{url}");
        assert!(h.body_of(id).starts_with(b"dart: the origin refused this request"), "{url}");
        assert!(!h.outputs.iter().any(|o| matches!(o, Output::StoreGet { .. })), "{url}");
        assert!(h.sends().is_empty(), "{url}: nothing fetched for a refused requester");
    }
    assert_eq!(h.node.access_counters().check_refused, 3);

    // The accepted credential is trusted for the TTL: no check, served from the store.
    h.outputs.clear();
    read_url(&mut h, 5, &good, Headers::new());
    assert!(h.sends().is_empty(), "{:?}", h.sends());
    assert_eq!(h.body_of(5), content(0, SIZE).to_vec());
    assert_eq!(h.node.access_counters().check_hits, 1);
    // After the TTL it is checked again (at most one check per credential and object per TTL).
    h.advance(Duration::from_secs(30));
    h.outputs.clear();
    read_url(&mut h, 6, &good, Headers::new());
    assert_eq!(h.sends().len(), 1);
    assert_eq!(h.node.access_counters().checks, 5);
}

#[test]
fn an_authorization_is_part_of_the_credential_and_reaches_the_origin() {
    let mut h = Harness::new(checked_node());
    h.origin.secret = Some("tok");
    let good = Headers::new().with("authorization", "Bearer tok");
    read_with(&mut h, 1, good.clone());
    let check = h.take_sends().remove(0);
    assert_eq!(check.headers.get_str("authorization"), Some("Bearer tok"));
    h.answer_origin(&check);
    let window = h.sends().remove(0);
    assert_eq!(window.headers.get_str("authorization"), Some("Bearer tok"), "blocks too");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    h.outputs.clear();
    read_with(&mut h, 2, Headers::new().with("authorization", "Bearer nope"));
    let check = h.take_sends().remove(0);
    h.answer_origin(&check);
    let head = h.head_of(2).expect("an answer");
    assert_eq!(head.status, 401, "the origin's own status");
    assert_eq!(head.headers.get_str("www-authenticate"), Some("Bearer realm=\"o\""));
}

#[test]
fn an_origin_refusal_of_an_unchecked_read_is_passed_through() {
    // A public upstream skips the check; if the origin refuses anyway, the client hears it.
    let mut h = Harness::new(node_with(engine(), ""));
    h.origin.secret = Some("s");
    h.read(1, None);
    h.serve_origin();
    assert_eq!(status_of(&h, 1), Some(403));
    read_with(&mut h, 2, Headers::new().with("authorization", "Bearer wrong"));
    h.serve_origin();
    let head = h.head_of(2).expect("an answer");
    assert_eq!(head.status, 401);
    assert_eq!(head.headers.get_str("www-authenticate"), Some("Bearer realm=\"o\""));
}

/// A debug print of an origin flight shows neither a presigned URL's query nor an
/// `Authorization` value, of the flight or of its waiters.
#[test]
fn a_debug_print_of_a_flight_never_shows_a_credential() {
    use super::flights::{Fill, Flight, Waiter};
    let url = "https://user:pw-s3cr3t@origin.test/o?X-Amz-Signature=s3cr3t".to_owned();
    let auth = Some(b"Bearer s3cr3t".to_vec());
    let waiter = Waiter {
        request: RequestId(7),
        url: url.clone(),
        joined: Instant::ZERO,
        auth: auth.clone(),
        streamed: None,
        span: (0, 0),
        client: true,
    };
    let flight = Flight {
        key: crate::engine::flight::FlightKey::Probe("origin.test/o".into()),
        io: IoId(3),
        started: Instant::ZERO,
        waiters: vec![waiter],
        fill: Fill::Probe(crate::identity::ObjectId {
            id: "origin.test/o".into(),
            content_addressed: false,
        }),
        leader: RequestId(7),
        url,
        auth,
    };
    let shown = format!("{flight:?}");
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert_eq!(shown.matches("https://origin.test/o?<redacted>").count(), 2, "{shown}");
    assert_eq!(shown.matches("<redacted, 13 bytes>").count(), 2, "{shown}");
}

/// The `Range` of the first ten bytes of block 1.
fn block_1() -> Headers {
    Headers::new().with("range", format!("bytes={BLOCK}-{}", BLOCK + 9))
}

/// A node whose origin signs URLs: read 1 (valid URL) learnt the size from block 0, so the next
/// reads go straight to block 1; read 2 leads block 1's flight under an expired URL. Returns
/// the harness, the valid URL, the expired one and the flight's window.
fn block_1_led_under_an_expired_url() -> (Harness, String, String, IoRequest) {
    let mut h = Harness::new(node_with(engine(), ""));
    h.origin.secret = Some("s");
    let (good, expired) = (format!("{URL}?sig=s"), format!("{URL}?sig=old"));
    read_url(&mut h, 1, &good, Headers::new().with("range", "bytes=0-9"));
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    h.outputs.clear();
    read_url(&mut h, 2, &expired, block_1());
    let window = h.take_sends().remove(0);
    (h, good, expired, window)
}

/// A refusal judges the credential the flight's exchange was sent under, not the flight's
/// waiters: a reader that joined it with another credential retries alone with its own, also
/// when the one that led it left before the refusal came (found by `expired-credential` seed
/// 47895323: a relay that led a flight under a leaf's expired URL took its block from a peer
/// and left; the client read that had joined with a valid URL was first in line then and took
/// the 403 as its own). A joiner with the refused credential takes the refusal without asking
/// again: the origin would refuse it again.
#[test]
fn a_refusal_is_retried_by_every_waiter_with_another_credential_even_after_the_leader_left() {
    let (mut h, good, expired, window) = block_1_led_under_an_expired_url();
    assert_eq!((window.purpose, window.url.as_str()), (Purpose::Window, expired.as_str()));
    read_url(&mut h, 3, &good, block_1());
    read_url(&mut h, 4, &expired, block_1());
    assert!(h.sends().is_empty(), "both joined the leader's flight");
    h.feed(Input::Cancel { id: RequestId(2) });
    assert!(!h.cancelled(window.id), "the joiners still wait for it");
    h.answer_origin(&window);
    assert_eq!(status_of(&h, 4), Some(403), "the refused credential takes the refusal");
    assert_eq!(status_of(&h, 3), None, "the other credential is not judged yet");
    let again = h.take_sends();
    assert_eq!(again.len(), 1, "one retry: {again:?}");
    assert_eq!((again[0].purpose, again[0].url.as_str()), (Purpose::Window, good.as_str()));
    h.answer_origin(&again[0]);
    assert_eq!(status_of(&h, 3), Some(206));
    assert_eq!(h.body_of(3), content(BLOCK, 10).to_vec());
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("the test's work");
}

/// A read that waits alone on its own origin window (here a refusal's retry under its own
/// credential) takes the block when another read brings it in first, and its window is
/// cancelled: it is served at once, not after the origin answers it.
#[test]
fn a_read_retrying_a_refusal_alone_takes_the_block_another_read_brought_in_first() {
    let (mut h, good, _, window) = block_1_led_under_an_expired_url();
    read_url(&mut h, 3, &good, block_1());
    h.answer_origin(&window);
    assert_eq!(status_of(&h, 2), Some(403));
    let retry = h.take_sends().remove(0);
    assert!(matches!(h.node.requests[&RequestId(3)].wait, Wait::Alone(io) if io == retry.id));
    // A fourth read leads a new flight for the block (the retry is not in the flight table).
    read_url(&mut h, 4, &good, block_1());
    let lead = h.take_sends().remove(0);
    assert_ne!(lead.id, retry.id);
    h.answer_origin(&lead);
    assert_eq!(status_of(&h, 4), Some(206));
    assert_eq!(status_of(&h, 3), Some(206), "served from the landed block");
    assert_eq!(h.body_of(3), content(BLOCK, 10).to_vec());
    assert!(h.cancelled(retry.id), "its own window is not needed any more");
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("the test's work");
}

#[test]
fn concurrent_requests_with_one_credential_share_one_check() {
    let mut h = Harness::new(checked_node());
    h.read(1, None);
    h.read(2, Some("bytes=0-9"));
    let sends = h.take_sends();
    assert_eq!(sends.len(), 1, "one check for both");
    assert_eq!(h.node.live_requests(), 2);
    h.answer_origin(&sends[0]);
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert_eq!(h.body_of(2), content(0, 10).to_vec());
    assert_eq!(h.node.access_counters().checks, 1);
}

#[test]
fn a_check_that_cannot_complete_fails_closed_except_for_a_credential_accepted_recently() {
    let mut h = Harness::new(checked_node());
    h.read(1, None);
    h.serve_origin();
    h.advance(Duration::from_secs(31));
    // 5xx: not a refusal, but not a yes either. The credential the origin accepted 31 s ago is
    // admitted again (stale-if-error), and its read is served from the cache.
    h.origin.status = Some(503);
    h.outputs.clear();
    h.read(2, None);
    h.serve_origin();
    assert_eq!(status_of(&h, 2), Some(200));
    assert_eq!(h.body_of(2), content(0, SIZE).to_vec());
    assert_eq!(h.node.access_counters().check_stale, 1);
    // A credential the origin never accepted fails closed.
    h.outputs.clear();
    read_url(&mut h, 3, &format!("{URL}?sig=never-seen"), Headers::new());
    h.serve_origin();
    assert_eq!(status_of(&h, 3), Some(502));
    assert!(h.body_of(3).starts_with(b"dart: could not confirm access"));
    // Past the grace, the accepted one fails closed too; a check that never answers is given up
    // at the origin's head bound.
    h.advance(super::DEFAULT_STALE_GRACE);
    h.origin.status = None;
    h.outputs.clear();
    h.read(4, None);
    let check = h.take_sends().remove(0);
    assert_eq!(check.purpose, Purpose::Check);
    h.io(check.id, IoEvent::Connected);
    h.advance(Bounds::default().origin_head);
    assert!(h.cancelled(check.id));
    assert_eq!(status_of(&h, 4), Some(502));
    assert_eq!(h.node.access_counters().check_failed, 2);
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("the test's work");
}

#[test]
fn a_requester_that_leaves_during_its_check_cancels_the_check_if_alone() {
    let mut h = Harness::new(checked_node());
    h.read(1, None);
    h.read(2, None);
    let check = h.take_sends().remove(0);
    h.feed(Input::Cancel { id: RequestId(1) });
    assert!(!h.cancelled(check.id), "another request still waits");
    h.feed(Input::Cancel { id: RequestId(2) });
    assert!(h.cancelled(check.id));
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("the test's work");
}

/// In a cold herd a peer's relay request most often reaches a node while the node's own client
/// read of the object is being checked: the relay waits for that check, which is a probe of the
/// same object, instead of probing the origin beside it (`stalled-peer`: 37 of 154 origin
/// requests were such probes).
#[test]
fn a_relay_that_needs_the_size_waits_for_a_check_of_the_object_in_flight_instead_of_probing() {
    let mut h = Harness::new(checked_node());
    h.read(1, None);
    let check = h.take_sends().remove(0);
    assert_eq!(check.purpose, Purpose::Check);
    relay_request(&mut h, 2, 0);
    assert!(h.sends().is_empty(), "no probe beside the check");
    h.answer_origin(&check);
    // The check taught the node the size: the client read and the relay each go on to the block
    // (one origin window, shared), and nothing probed.
    let sends = h.take_sends();
    assert!(sends.iter().all(|r| r.purpose == Purpose::Window), "{sends:?}");
    for r in &sends {
        h.answer_origin(r);
    }
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert_eq!(status_of(&h, 2), Some(200));
    assert_eq!(h.node.access_counters().probes_joined, 1);
    assert_eq!(h.node.access_counters().checks, 1);
    assert_eq!(h.node.live_requests(), 0);
}

/// A check that does not admit teaches nothing: the relay that waited for it probes then, and a
/// relay whose requester leaves stops waiting without cancelling the check its client read
/// still needs (nor keeping alive one nobody needs).
#[test]
fn a_relay_whose_joined_check_is_refused_probes_itself_and_one_that_leaves_cancels_nothing_needed()
{
    let mut h = Harness::new(checked_node());
    h.origin.secret = Some("s");
    h.read(1, None);
    let check = h.take_sends().remove(0);
    relay_request(&mut h, 2, 0);
    relay_request(&mut h, 3, 1);
    assert!(h.sends().is_empty());
    h.feed(Input::Cancel { id: RequestId(3) });
    assert!(!h.cancelled(check.id), "the client read still waits for it");
    h.answer_origin(&check);
    assert_eq!(status_of(&h, 1), Some(403), "the client's credential is refused");
    let probe = h.take_sends().remove(0);
    assert_eq!(probe.purpose, Purpose::Probe, "the relay probes itself now");
    assert_eq!(h.node.access_counters().probes_joined, 0);
    // A relay alone with a check: the client read leaves, the relay keeps the check alive.
    let mut h = Harness::new(checked_node());
    h.read(1, None);
    let check = h.take_sends().remove(0);
    relay_request(&mut h, 2, 0);
    h.feed(Input::Cancel { id: RequestId(1) });
    assert!(!h.cancelled(check.id), "the relay still waits for it");
    h.feed(Input::Cancel { id: RequestId(2) });
    assert!(h.cancelled(check.id), "nobody waits any more");
    assert_eq!(h.node.live_requests(), 0);
    h.assert_settled("the test's work");
}

#[test]
fn content_addressed_and_public_objects_skip_the_check() {
    let mut h = Harness::new(checked_node());
    let digest = format!("http://origin/v2/lib/blobs/sha256:{}", "ab".repeat(32));
    read_url(&mut h, 1, &digest, Headers::new());
    assert_eq!(h.sends()[0].purpose, Purpose::Probe, "no check for a digest");
    let strict = Access { check_content_addressed: true, ..Access::default() };
    let mut h = Harness::new(node_with_access(engine(), "", strict));
    read_url(&mut h, 1, &digest, Headers::new());
    assert_eq!(h.sends()[0].purpose, Purpose::Check, "the stricter option checks digests");
    let mut h = Harness::new(node_with(engine(), ""));
    h.read(1, None);
    assert_eq!(h.sends()[0].purpose, Purpose::Probe, "a public upstream is not checked");
}

/// A public pattern names hosts without regard to case or a trailing dot, a suffix only what
/// ends in it past its start; everything else is checked.
#[test]
fn public_patterns_match_hosts_without_regard_to_case() {
    let cases = [
        ("http://ORIGIN/o", true),
        ("http://origin./o", true),
        ("http://Blobs.Example.COM/o", true),
        ("http://example.com/o", false),
        ("http://xexample.com/o", false),
        ("http://10.1.2.3/o", true),
        ("http://origin2/o", false),
    ];
    for (i, (url, public)) in cases.into_iter().enumerate() {
        let access = Access {
            public: ["origin", "*.example.com", "10.0.0.0/8"]
                .iter()
                .map(|p| p.parse().expect("pattern"))
                .collect(),
            ..Access::default()
        };
        let mut h = Harness::new(node_with_access(engine(), "", access));
        read_url(&mut h, i as u64 + 1, url, Headers::new());
        let want = if public { Purpose::Probe } else { Purpose::Check };
        assert_eq!(h.sends()[0].purpose, want, "{url}");
    }
}

fn secret() -> ClusterSecret {
    ClusterSecret::from_bytes(b"a-cluster-secret-of-32-bytes-ok!").expect("secret")
}

/// A parent-reading node with the cluster secret and its wall clock at `unix_ms`.
fn authenticated(unix_ms: u64) -> Harness {
    let mut e = engine();
    let view = View::new(vec![Member::ready("parent", "p:9000")]);
    e.enable_p2p(P2p {
        placement: Placement::new(view, "reader", 2, 1),
        breaker: Breaker::new(BreakerConfig::default()).expect("breaker"),
    });
    let access = Access {
        peer_secret: Some(secret()),
        public: vec!["origin".parse().expect("pattern")],
        ..Access::default()
    };
    let mut h = Harness::new(node_with_access(e, "reader", access));
    h.feed(Input::WallClock { unix_ms });
    h
}

const UNIX_MS: u64 = 1_800_000_000_000;

fn signed_relay_headers(path: &str, unix: u64) -> Headers {
    let mut headers = Headers::new().with("x-dart-origin", URL).with("x-dart-hop", "0");
    let covered = Covered {
        method: "GET",
        target: path,
        hop: b"0",
        origin: URL.as_bytes(),
        ..Covered::default()
    };
    headers.push(HEADER_AUTH, covered.sign(&secret(), unix));
    headers
}

#[test]
fn peer_requests_without_a_valid_mac_are_refused_and_teach_nothing() {
    let mut h = authenticated(UNIX_MS);
    size_known(&mut h);
    let e = engine();
    let key = e.block_key(&e.identify(URL), 1);
    h.store.insert(key, content(BLOCK, BLOCK));
    let path = crate::codec::wire::block_path(key);
    let now = UNIX_MS / 1000;
    // No MAC, a MAC from another secret, a replayed old one, one for another path.
    let unsigned = Headers::new().with("x-dart-origin", URL).with("x-dart-hop", "0");
    let foreign = {
        let other = ClusterSecret::from_bytes(b"another-secret-entirely-16").expect("secret");
        let c = Covered {
            method: "GET",
            target: &path,
            hop: b"0",
            origin: URL.as_bytes(),
            ..Covered::default()
        };
        unsigned.clone().with(HEADER_AUTH, c.sign(&other, now))
    };
    let old = signed_relay_headers(&path, now - 3600);
    let other_path = crate::codec::wire::block_path(e.block_key(&e.identify(URL), 2));
    let moved = signed_relay_headers(&other_path, now);
    for (id, headers, reason) in [
        (10, unsigned, AuthRefusal::Missing),
        (11, foreign, AuthRefusal::BadMac),
        (12, old, AuthRefusal::Expired),
        (13, moved, AuthRefusal::BadMac),
    ] {
        h.get(id, Plane::Peer, &path, headers);
        assert_eq!(status_of(&h, id), Some(401), "{reason}");
        assert!(h.node.access_counters().auth_refused(reason) > 0, "{reason}");
    }
    // A roster request from a caller without the secret is not learned.
    let roster =
        Headers::new().with("x-dart-node", "intruder").with("x-dart-peer-addr", "6.6.6.6:9000");
    h.get(14, Plane::Peer, crate::codec::wire::ROSTER_PATH, roster);
    assert_eq!(status_of(&h, 14), Some(401));
    assert!(h.node.learned().is_empty());
    assert!(h.sends().is_empty(), "nothing relayed for an unauthenticated caller");
    // The same request, signed now, is served.
    h.get(15, Plane::Peer, &path, signed_relay_headers(&path, now + 20));
    assert_eq!(status_of(&h, 15), Some(200));
    assert_eq!(h.relay_block_of(15), content(BLOCK, BLOCK).to_vec());
}

#[test]
fn outgoing_peer_requests_carry_a_mac_the_receiver_accepts() {
    let mut h = authenticated(UNIX_MS);
    h.read(1, Some("bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let peer = h.take_sends().remove(0);
    assert_eq!(peer.endpoint, Endpoint::Peer);
    let target = peer.url.strip_prefix("http://p:9000").expect("the parent's URL");
    let covered = Covered {
        method: "GET",
        target,
        hop: peer.headers.get("x-dart-hop").unwrap_or_default(),
        origin: peer.headers.get("x-dart-origin").unwrap_or_default(),
        node: peer.headers.get("x-dart-node").unwrap_or_default(),
        peer_addr: peer.headers.get("x-dart-peer-addr").unwrap_or_default(),
        body: &[],
    };
    let mac = peer.headers.get(HEADER_AUTH);
    assert!(mac.is_some(), "{:?}", peer.headers);
    // The wall clock moved on with the node's own clock.
    let sent_at = UNIX_MS / 1000;
    let verdict = covered.verify(&secret(), mac, sent_at, Duration::from_secs(1));
    assert_eq!(verdict, Ok(()));
}

/// Asserts that every block in the harness's store is the bytes of version `v`.
fn store_holds_only(h: &Harness, v: u8) {
    let e = engine();
    let id = e.identify(URL);
    for (key, data) in &h.store {
        let block = (0..4).find(|&b| e.block_key(&id, b) == *key).expect("a block of the object");
        let start = block * BLOCK;
        assert_eq!(
            data.to_vec(),
            content_of(v, start, data.len() as u64).to_vec(),
            "block {block}"
        );
    }
}

#[test]
fn a_read_whose_object_was_forgotten_under_it_takes_no_block_of_another_version() {
    // Found by the simulator (`object-changes`): once another request found the object changed,
    // the node knew no version at all, so a block of the new version passed the check meant for
    // the old one, joined a response that named the old one, and was cached unversioned.
    let mut h = Harness::new(node_with(engine(), ""));
    h.publish(1);
    h.read(1, None);
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let first = h.take_sends().remove(0);
    h.read(2, Some("bytes=2048-2057"));
    let other = h.take_sends().remove(0);
    h.publish(2);
    h.answer_origin(&other);
    assert_eq!(h.node.stats().object_changes, 1, "read 2's window revealed version 2");
    // Read 1's first window, asked for version 1, comes back as version 2.
    h.answer_origin(&first);
    h.serve_origin();
    let head = h.head_of(1).expect("a head");
    assert_eq!(head.headers.get_str("etag"), Some("\"v2\""), "read 1 started over on version 2");
    assert_eq!(h.body_of(1), content_of(2, 0, SIZE).to_vec(), "one version, whole");
    assert!(h.ended(1));
    assert_eq!(h.body_of(2), content_of(2, 2048, 10).to_vec());
    store_holds_only(&h, 2);
}

#[test]
fn a_read_never_takes_a_peer_block_of_a_version_its_node_learnt_after_the_read_began() {
    let mut h = Harness::new(reader_of("p:9000"));
    h.publish(1);
    h.read(1, None);
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let peer = h.take_sends().remove(0);
    let v1 = Headers::new().with("content-length", BLOCK.to_string()).with("etag", "\"v1\"");
    h.io(peer.id, IoEvent::Connected);
    h.io(peer.id, IoEvent::Head { status: 200, headers: v1 });
    h.io(peer.id, IoEvent::Body(content_of(1, 0, BLOCK)));
    h.io(peer.id, IoEvent::End);
    assert_eq!(h.body_of(1), content_of(1, 0, BLOCK).to_vec(), "the head went out, version 1");
    let next = h.take_sends().remove(0);
    assert_eq!(next.endpoint, Endpoint::Peer);
    // Meanwhile another read's probe found version 2 (and dropped version 1's blocks).
    h.publish(2);
    let meta = crate::engine::ObjectMeta { etag: Some("\"v2\"".into()), ..Default::default() };
    let id = engine().identify(URL);
    let outcome = crate::engine::origin::ProbeOutcome::Size(SIZE);
    for key in h.node.engine_mut().record_probe(&id, outcome, meta, h.now) {
        h.store.remove(&key);
    }
    // The peer, which has version 2 too, answers with it: not for this read.
    let v2 = Headers::new().with("content-length", BLOCK.to_string()).with("etag", "\"v2\"");
    h.io(next.id, IoEvent::Connected);
    h.io(next.id, IoEvent::Head { status: 200, headers: v2 });
    assert!(h.cancelled(next.id), "refused at its head");
    h.serve_origin();
    assert_eq!(h.body_of(1), content_of(1, 0, BLOCK).to_vec(), "never a byte of version 2");
    assert!(h.aborted(1) && !h.ended(1), "cut short");
    store_holds_only(&h, 2);
}

// ---- Tail control: hedged peer fetches ----

/// A reader in a four-member view; returns the node and its ancestors for `URL`'s block 0,
/// nearest first (parent, grandparent, ...).
fn hedging_reader(hedge_ratio: f64) -> (Node, Vec<String>) {
    hedging_reader_warm(hedge_ratio, true)
}

/// [`hedging_reader`], with a warm estimator (16 recent peer fetches of 20 ms) or none.
fn hedging_reader_warm(hedge_ratio: f64, warm: bool) -> (Node, Vec<String>) {
    let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
    let mut e = Engine::new(EngineConfig {
        geometry,
        hedge: hedge_ratio > 0.0,
        hedge_ratio,
        read_ahead: 0,
        origin_read_ahead: 0,
        ..EngineConfig::default()
    });
    let key = e.block_key(&e.identify(URL), 0);
    // A fanout-1 chain of four; pick the member that sits third or lower for this chunk.
    let members: Vec<Member> =
        ["a", "b", "c", "d"].map(|id| Member::ready(id, &format!("{id}:9000"))).to_vec();
    let (self_id, placement, ancestors) = ["a", "b", "c", "d"]
        .into_iter()
        .find_map(|me| {
            let placement = Placement::new(View::new(members.clone()), me, 1, 1);
            let ancestors: Vec<String> =
                placement.upstreams(key.chunk, |_| true).into_iter().map(|p| p.addr).collect();
            (ancestors.len() >= 2).then_some((me, placement, ancestors))
        })
        .expect("a member with a parent and a grandparent");
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    e.enable_p2p(P2p { placement, breaker });
    // A warm estimator: recent peer fetches took 20 ms.
    for _ in 0..if warm { 16 } else { 0 } {
        e.record_peer_latency(Duration::from_millis(20));
    }
    let access = Access { public: vec!["origin".parse().expect("pattern")], ..Access::default() };
    (node_with_access(e, self_id, access), ancestors)
}

/// Answers peer exchange `req` with the block it asks for.
fn answer_peer(h: &mut Harness, req: &IoRequest, block: u64) {
    let len = BLOCK.min(SIZE - block * BLOCK);
    let headers = Headers::new().with("content-length", len.to_string());
    h.io(req.id, IoEvent::Connected);
    h.io(req.id, IoEvent::Head { status: 200, headers });
    h.io(req.id, IoEvent::Body(content(block * BLOCK, len)));
    h.io(req.id, IoEvent::End);
}

fn peer_sends(h: &Harness) -> Vec<IoRequest> {
    h.sends().into_iter().filter(|r| r.endpoint == Endpoint::Peer).collect()
}

fn breaker_of(h: &Harness) -> crate::breaker::BreakerCounters {
    h.node.engine().p2p().expect("p2p").breaker.counters().clone()
}

/// Starts a one-block read and answers its probe; returns the primary peer exchange.
fn start_block_read(h: &mut Harness, ancestors: &[String]) -> IoRequest {
    h.read(1, Some("bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let primary = h.take_sends().remove(0);
    assert!(primary.url.starts_with(&format!("http://{}/", ancestors[0])), "the parent first");
    primary
}

#[test]
fn a_hedge_beats_a_slow_primary_and_the_loser_is_not_blamed() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    // The parent is slow: at the estimated p99 (20 ms) a backup races at the grandparent.
    assert_eq!(h.node.poll_timeout(), Some(h.now + Duration::from_millis(20)));
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    answer_peer(&mut h, &backup, 0);
    assert!(h.cancelled(primary.id), "the loser is cancelled");
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_backup_won, s.hedge_primary_won), (1, 1, 0));
    let b = breaker_of(&h);
    assert_eq!((b.soft, b.hard, b.abandoned), (0, 0, 1), "a lost race is abandoned, not charged");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_relay_whose_backup_stream_wins_asks_the_beaten_primary_last_for_the_next_blocks() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    size_known(&mut h);
    relay_from(&mut h, 7, 0, "z");
    let primary = peer_sends(&h).remove(0);
    assert!(primary.url.starts_with(&format!("http://{}/", ancestors[0])), "the parent first");
    h.io(primary.id, IoEvent::Connected);
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    // The backup's stream starts first: the relay commits to it, and the parent it beat is
    // remembered slow, as when a backup's whole block wins (before, only that path did, so a
    // relay asked a stalled parent first again for its very next block).
    h.io(backup.id, IoEvent::Connected);
    h.io(backup.id, block_head());
    assert!(h.cancelled(primary.id));
    assert_eq!(h.head_of(7).map(|x| x.status), Some(200));
    assert!(h.node.engine().is_slow(&ancestors[0], h.now));
    h.io(backup.id, IoEvent::Body(content(0, BLOCK)));
    h.io(backup.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), content(0, BLOCK).to_vec());
    relay_from(&mut h, 8, 1, "z");
    let next = peer_sends(&h).pop().expect("the next block's fetch");
    assert!(next.url.starts_with(&format!("http://{}/", ancestors[1])), "the slow parent last");
}

#[test]
fn a_primary_still_dialling_when_a_backup_stream_wins_runs_on_and_a_dead_peer_is_charged() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    size_known(&mut h);
    relay_from(&mut h, 7, 0, "z");
    let primary = peer_sends(&h).remove(0);
    // The parent never accepts the connection (gone); the backup's stream starts first.
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    h.io(backup.id, IoEvent::Connected);
    h.io(backup.id, block_head());
    assert!(!h.cancelled(primary.id), "it runs on to record how it ends");
    assert!(h.node.engine().is_slow(&ancestors[0], h.now));
    h.io(backup.id, IoEvent::Body(content(0, BLOCK)));
    h.io(backup.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), content(0, BLOCK).to_vec());
    // Its dial bound charges the dead parent (a hard failure), as a fetch of its own would.
    h.advance(Bounds::default().peer_dial);
    assert!(h.node.exchanges().is_empty());
    assert_eq!(breaker_of(&h).hard, 1);
    assert_eq!(h.node.counters().peer_fetches_run_on, 1);
}

#[test]
fn with_hedging_off_a_slow_primary_is_waited_for_and_nothing_is_duplicated() {
    let (node, ancestors) = hedging_reader(0.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    // The head wait is four times the estimated p99 (20 ms), but at least the 1 s floor.
    assert_eq!(h.node.poll_timeout(), Some(h.now + Bounds::default().peer_head_floor));
    h.advance(Duration::from_millis(900));
    assert!(peer_sends(&h).is_empty(), "no duplicate");
    answer_peer(&mut h, &primary, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.node.stats().hedge_fired, 0);
}

#[test]
fn a_primary_that_wins_after_a_hedge_counts_as_a_primary_win() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    answer_peer(&mut h, &primary, 0);
    assert!(h.cancelled(backup.id));
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_primary_won, s.hedge_backup_won), (1, 1, 0));
}

#[test]
fn win_counters_move_only_when_a_hedge_fired() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    answer_peer(&mut h, &primary, 0);
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_primary_won, s.hedge_backup_won), (0, 0, 0));
}

#[test]
fn a_failover_is_not_rate_limited_and_never_launches_twice() {
    // The hedge budget is empty (ratio 0 makes the limiter refuse), yet a dead parent still
    // escalates to the grandparent at once.
    let (node, ancestors) = hedging_reader(0.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Failed(IoError::Connect("refused".into())));
    let failover = peer_sends(&h).pop().expect("a failover");
    assert!(failover.url.starts_with(&format!("http://{}/", ancestors[1])));
    answer_peer(&mut h, &failover, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.node.stats().peer_failover, 1);
    // With a hedge in flight, a failing primary waits for the backup: no third fetch.
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    h.outputs.retain(|o| !matches!(o, Output::Send(_)));
    h.io(primary.id, IoEvent::Failed(IoError::Connect("refused".into())));
    assert!(h.sends().is_empty(), "the backup is already racing: nothing is launched again");
    answer_peer(&mut h, &backup, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
}

#[test]
fn when_both_contenders_miss_the_origin_serves() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    h.outputs.retain(|o| !matches!(o, Output::Send(_)));
    for x in [&primary, &backup] {
        h.io(x.id, IoEvent::Connected);
        h.io(x.id, IoEvent::Head { status: 404, headers: Headers::new() });
    }
    // Past the two raced ancestors, the rest of the chain, then the origin.
    loop {
        let sends = h.take_sends();
        let Some(next) = sends.first() else { break };
        if next.endpoint == Endpoint::Origin {
            h.answer_origin(next);
            continue;
        }
        h.io(next.id, IoEvent::Connected);
        h.io(next.id, IoEvent::Head { status: 404, headers: Headers::new() });
    }
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.node.stats().block_source_origin, 1);
}

#[test]
fn misses_never_feed_the_latency_estimator() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let before = h.node.engine().peer_latency(0.5);
    for id in 0..40u64 {
        h.outputs.clear();
        h.read(100 + id, Some("bytes=0-9"));
        for s in h.take_sends() {
            match s.endpoint {
                Endpoint::Origin => h.answer_origin(&s),
                Endpoint::Peer => {
                    h.advance(Duration::from_millis(1));
                    h.io(s.id, IoEvent::Head { status: 404, headers: Headers::new() });
                }
            }
        }
        h.serve_origin();
        h.store.clear();
    }
    let _ = ancestors;
    assert_eq!(h.node.engine().peer_latency(0.5), before, "fast 404s teach nothing");
    assert_eq!(before, Some(Duration::from_millis(20)));
}

#[test]
fn a_peer_body_that_stops_moving_is_cut_off_at_the_progress_bound_and_failed_over() {
    let (node, ancestors) = hedging_reader(0.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    let headers = Headers::new().with("content-length", BLOCK.to_string());
    h.io(primary.id, IoEvent::Connected);
    h.io(primary.id, IoEvent::Head { status: 200, headers });
    h.io(primary.id, IoEvent::Body(content(0, BLOCK / 2)));
    // Half a block, then nothing: the estimated block time (20 ms) plus the 1 s margin.
    let bound = Duration::from_millis(20) + Bounds::default().peer_progress_margin;
    assert_eq!(h.node.poll_timeout(), Some(h.now + bound));
    h.advance(bound);
    assert!(h.cancelled(primary.id));
    assert_eq!(breaker_of(&h).soft, 1, "a stalled body is the peer's soft failure");
    let failover = peer_sends(&h).pop().expect("a failover");
    assert!(failover.url.starts_with(&format!("http://{}/", ancestors[1])));
    answer_peer(&mut h, &failover, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
}

#[test]
fn a_relay_whose_upstream_is_silent_answers_within_its_requesters_budget_and_blames_only_the_upstream(
) {
    let mut h = relay_with_requester("x-dart-budget-ms", "1000");
    let up = h.take_sends().remove(0);
    assert_eq!(up.endpoint, Endpoint::Peer);
    // It waits on its own upstream a margin (1/16) less than its requester waits on it, and
    // says so upstream.
    assert_eq!(up.headers.get_str("x-dart-budget-ms"), Some("937"));
    h.io(up.id, IoEvent::Connected);
    h.advance(Duration::from_micros(937_500));
    assert!(h.cancelled(up.id), "the silent upstream is given up");
    assert_eq!(breaker_of(&h).soft, 1, "and charged by this relay");
    let origin = h.take_sends().into_iter().find(|r| r.endpoint == Endpoint::Origin);
    let origin = origin.expect("the relay fails over to the origin");
    // Half a margin before its requester's budget runs out, it answers "my upstream is slow".
    h.advance(Duration::from_micros(31_250));
    let head = h.head_of(7).expect("an early answer");
    assert_eq!(head.status, 504);
    assert_eq!(head.headers.get_str("x-dart-upstream-status"), Some("504"));
    assert_eq!(h.node.counters().relay_early_answers, 1);
    // It goes on without its requester and caches the block.
    h.answer_origin(&origin);
    assert_eq!(h.store.len(), 1);
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_relay_cuts_off_a_stalled_upstream_body_a_margin_before_its_requester_would_cut_it_off() {
    let mut h = relay_with_requester("x-dart-progress-ms", "1600");
    let up = h.take_sends().remove(0);
    // The relay's own bound is 2 s without an estimate; its requester's, less 1/16, is shorter
    // and is what it says upstream.
    assert_eq!(up.headers.get_str("x-dart-progress-ms"), Some("1500"));
    half_a_block_then_silence(&mut h, &up);
    assert_eq!(h.head_of(7).map(|head| head.status), Some(200), "cut through: committed");
    h.advance(Duration::from_millis(1499));
    assert!(!h.cancelled(up.id));
    h.advance(Duration::from_millis(1));
    assert!(h.cancelled(up.id), "the stalled upstream body is cut off at 1.5 s");
    assert_eq!(breaker_of(&h).soft, 1, "and charged by this relay");
    assert!(h.aborted(7), "its requester sees a broken body 100 ms before its own bound");
}

/// Peer fetch `up` of block 1 connects, sends its head and half the block, then nothing.
fn half_a_block_then_silence(h: &mut Harness, up: &IoRequest) {
    h.io(up.id, IoEvent::Connected);
    let head = Headers::new().with("content-length", BLOCK.to_string());
    h.io(up.id, IoEvent::Head { status: 200, headers: head });
    h.io(up.id, IoEvent::Body(content(BLOCK, BLOCK / 2)));
}

/// A client read of block 1 fetches it from the parent with the node's own bound (2 s without
/// an estimate), relay 7 for the same block, whose requester cuts its body off at 1.6 s, joins
/// that fetch, and the fetch sends half the block, then nothing. Returns the fetch.
fn relay_joins_a_looser_fetch() -> (Harness, IoRequest) {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    h.read(1, Some(&format!("bytes={}-{}", BLOCK, 2 * BLOCK - 1)));
    let up = h.take_sends().remove(0);
    assert_eq!(up.headers.get_str("x-dart-progress-ms"), Some("2000"));
    let e = engine();
    let key = e.block_key(&e.identify(URL), 1);
    let headers = Headers::new()
        .with("x-dart-origin", URL)
        .with("x-dart-hop", "0")
        .with("x-dart-progress-ms", "1600");
    h.get(7, Plane::Peer, &crate::codec::wire::block_path(key), headers);
    assert!(peer_sends(&h).is_empty(), "joined, not asked again");
    assert_eq!(h.node.counters().peer_fetches_joined, 1);
    half_a_block_then_silence(&mut h, &up);
    (h, up)
}

/// CI's `dead-root-some-read` seed 141476503: a relay joined a fetch begun for another read,
/// kept that fetch's longer progress bound, and its abort reached its requester after the
/// requester's own bound had charged it, an honest relay, with a timeout.
#[test]
fn a_relay_that_joins_a_fetch_with_a_looser_bound_cuts_off_a_stalled_body_at_its_own_bound_and_charges_nobody(
) {
    let (mut h, up) = relay_joins_a_looser_fetch();
    assert_eq!(h.head_of(7).map(|head| head.status), Some(200), "cut through: committed");
    // The body stops. At the relay's own bound (its requester's less 1/16) it breaks its
    // stream, before its requester's bound; the fetch goes on for the client read, and the
    // parent, told 2 s, is charged nothing yet.
    h.advance(Duration::from_millis(1499));
    assert!(!h.aborted(7));
    h.advance(Duration::from_millis(1));
    assert!(h.aborted(7), "its requester sees a broken body 100 ms before its own bound");
    assert!(!h.cancelled(up.id), "the client read still waits on the fetch");
    assert_eq!(breaker_of(&h).soft + breaker_of(&h).hard, 0, "nobody charged");
    // At the fetch's own bound the parent is cut off and charged once.
    h.advance(Duration::from_millis(500));
    assert!(h.cancelled(up.id));
    assert_eq!(breaker_of(&h).soft, 1);
}

/// The same join, with the fetch's first reader gone before the body stops: the relay, its
/// last reader, leaves at its own bound, and the fetch runs on to its own to record how the
/// peer answers (found by `dead-root-some-read` seed 9: an exchange left with no reader).
#[test]
fn a_fetch_whose_last_reader_leaves_at_its_own_bound_runs_on_to_the_fetchs_bound() {
    let (mut h, up) = relay_joins_a_looser_fetch();
    h.feed(Input::Cancel { id: RequestId(1) });
    assert!(!h.cancelled(up.id), "the relay still reads it");
    h.advance(Duration::from_millis(1500));
    assert!(h.aborted(7));
    assert!(!h.cancelled(up.id), "runs on with no reader");
    assert_eq!(h.node.counters().peer_fetches_run_on, 1);
    assert_eq!(breaker_of(&h).soft + breaker_of(&h).hard, 0);
    h.advance(Duration::from_millis(500));
    assert!(h.cancelled(up.id));
    assert_eq!(breaker_of(&h).soft, 1, "charged at the bound the peer was told");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_bad_progress_bound_is_refused_with_a_clear_error() {
    for bad in ["0", "-5", "soon", ""] {
        let mut h = Harness::new(reader_of("p:9000"));
        let e = engine();
        let key = e.block_key(&e.identify(URL), 1);
        let headers = Headers::new()
            .with("x-dart-origin", URL)
            .with("x-dart-hop", "0")
            .with("x-dart-progress-ms", bad);
        h.get(7, Plane::Peer, &crate::codec::wire::block_path(key), headers);
        assert_eq!(h.head_of(7).map(|head| head.status), Some(400), "{bad:?}");
        let body = String::from_utf8(h.body_of(7)).expect("text");
        assert!(body.contains("bad progress bound"), "{bad:?}: {body}");
        assert!(h.take_sends().is_empty(), "{bad:?}: nothing goes upstream");
    }
}

#[test]
fn a_requester_does_not_blame_a_relay_that_reports_its_upstream_slow() {
    let (node, ancestors) = hedging_reader(0.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    let slow = Headers::new().with("x-dart-upstream-status", "504");
    h.io(primary.id, IoEvent::Connected);
    h.io(primary.id, IoEvent::Head { status: 504, headers: slow });
    let b = breaker_of(&h);
    assert_eq!((b.soft, b.hard), (0, 0), "the relay did its job");
    let failover = peer_sends(&h).pop().expect("a failover");
    answer_peer(&mut h, &failover, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
}

/// A read of block 0 and a relay of it share one fetch from the root, which sends its head and
/// half the block, then dies; the read's hedge finds the root silent and fills the block from
/// the origin. `upstream` is what the root sent of the block's first half. Returns (the shared
/// fetch, the block's length).
fn relay_stream_whose_root_dies(h: &mut Harness, upstream: Bytes) -> (IoRequest, u64) {
    let up = start_block_read(h, &["p:9000".to_owned()]);
    relay_from(h, 7, 0, "child-a");
    assert!(h.take_sends().is_empty(), "the relay joins the read's fetch");
    let len = BLOCK.min(SIZE);
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head());
    h.io(up.id, IoEvent::Body(upstream.clone()));
    assert_eq!(h.body_of(7), upstream.to_vec(), "the relay is committed to the stream");
    h.advance(COLD_DELAY);
    let ask = h.take_sends().remove(0);
    assert_eq!(ask.headers.get_str("x-dart-held-only"), Some("1"), "the root is probed");
    h.io(ask.id, IoEvent::Connected);
    h.advance(crate::engine::probe_wait(COLD_DELAY));
    let fill = h.take_sends().remove(0);
    assert_eq!(fill.endpoint, Endpoint::Origin, "silent: the origin fills the block");
    h.answer_origin(&fill);
    assert_eq!(h.body_of(1), content(0, 10).to_vec(), "the read took the block that landed");
    (up, len)
}

#[test]
fn a_committed_relay_stream_whose_upstream_stops_is_finished_from_the_copy_that_lands() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let len = BLOCK.min(SIZE);
    let (up, _) = relay_stream_whose_root_dies(&mut h, content(0, len / 2));
    // The relay's stream goes on from the landed copy where the root left it, and ends with the
    // copy's digest: its requester gets the whole block, not a truncated answer after the
    // body's progress bound.
    assert_eq!(h.relay_block_of(7), content(0, len).to_vec());
    assert!(h.ended(7) && !h.aborted(7));
    let s = h.node.stats();
    assert_eq!((s.streams_resumed, s.streams_resume_refused, s.landed), (1, 0, 2));
    assert_eq!(h.node.live_requests(), 0);
    // The fetch from the dead root runs on, unanswered, and its progress bound charges the root.
    assert!(!h.cancelled(up.id));
    h.advance(Duration::from_secs(2));
    assert!(h.node.exchanges().is_empty());
    assert_eq!(breaker_of(&h).soft, 1, "the root's stalled body is charged");
    assert_eq!(store_puts(&h), 1, "the block is stored once, by the origin fill");
}

#[test]
fn a_committed_stream_that_forwarded_other_bytes_is_never_finished_from_the_landed_copy() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let len = BLOCK.min(SIZE);
    // The root sent bytes that are not the origin's (another version's, or a lie).
    let (up, _) = relay_stream_whose_root_dies(&mut h, content_of(9, 0, len / 2));
    assert!(!h.ended(7), "no mix of the root's bytes and the copy's");
    let s = h.node.stats();
    assert_eq!((s.streams_resumed, s.streams_resume_refused), (0, 1));
    // The stream ends as it would have: cut off at its progress bound, the response truncated.
    h.advance(Duration::from_secs(2));
    assert!(h.aborted(7));
    assert!(h.cancelled(up.id) || h.node.exchanges().is_empty());
    assert_eq!(h.node.live_requests(), 0);
}

// ---- Shared peer fetches: reads of one block from one peer ask it once ----

fn relay_from(h: &mut Harness, id: u64, block: u64, requester: &str) {
    let e = engine();
    let key = e.block_key(&e.identify(URL), block);
    let headers = Headers::new()
        .with("x-dart-origin", URL)
        .with("x-dart-hop", "0")
        .with("x-dart-node", requester);
    h.get(id, Plane::Peer, &crate::codec::wire::block_path(key), headers);
}

fn store_puts(h: &Harness) -> usize {
    h.outputs.iter().filter(|o| matches!(o, Output::StorePut { .. })).count()
}

fn block_head() -> IoEvent {
    IoEvent::Head { status: 200, headers: Headers::new().with("content-length", BLOCK.to_string()) }
}

#[test]
fn reads_of_one_block_share_one_peer_fetch_and_each_gets_the_whole_block() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    let range = format!("bytes={}-{}", BLOCK, 2 * BLOCK - 1);
    h.read(1, Some(&range));
    relay_from(&mut h, 7, 1, "child-a");
    relay_from(&mut h, 8, 1, "child-b");
    let ups = peer_sends(&h);
    assert_eq!(ups.len(), 1, "one fetch for three reads: {ups:?}");
    let up = ups[0].clone();
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head());
    for relay in [7, 8] {
        assert_eq!(h.head_of(relay).map(|x| x.status), Some(200), "relay {relay} cuts through");
    }
    let block = content(BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(block.slice(..100)));
    assert_eq!(h.body_of(7), block[..100].to_vec());
    assert_eq!(h.body_of(8), block[..100].to_vec());
    h.io(up.id, IoEvent::Body(block.slice(100..)));
    h.io(up.id, IoEvent::End);
    for id in [1, 7, 8] {
        assert_eq!(h.served_of(id), block.to_vec(), "request {id}");
        assert!(h.ended(id), "request {id}");
    }
    assert_eq!(store_puts(&h), 1, "the block is offered to the store once");
    assert_eq!(h.node.counters().peer_fetches_joined, 2);
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!(b.counters().answered, 1, "the peer's answer is recorded once");
    assert_eq!(b.counters().soft + b.counters().hard, 0);
    assert_eq!(h.node.engine().stats().peer_bytes, BLOCK, "wire bytes are counted once");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_relay_that_joins_after_the_head_gets_the_bytes_already_received() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    relay_from(&mut h, 7, 1, "child-a");
    let up = peer_sends(&h).remove(0);
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, block_head());
    let block = content(BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(block.slice(..300)));
    relay_from(&mut h, 8, 1, "child-b");
    assert_eq!(peer_sends(&h).len(), 1, "the late relay joins");
    assert!(h.head_of(8).is_none(), "its stream starts with the next part");
    h.io(up.id, IoEvent::Body(block.slice(300..600)));
    assert_eq!(h.body_of(8), block[..600].to_vec(), "the backlog, then the part");
    h.io(up.id, IoEvent::Body(block.slice(600..)));
    h.io(up.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), block.to_vec());
    assert_eq!(h.relay_block_of(8), block.to_vec());
    assert!(h.ended(7) && h.ended(8));
}

#[test]
fn a_shared_fetch_that_fails_fails_over_every_reader_and_charges_the_peer_once() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    h.read(1, Some("bytes=0-9"));
    h.read(2, Some("bytes=10-19"));
    let ups = peer_sends(&h);
    assert_eq!(ups.len(), 1);
    h.io(ups[0].id, IoEvent::Connected);
    h.io(ups[0].id, IoEvent::Head { status: 503, headers: Headers::new() });
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!(b.counters().soft + b.counters().hard, 1, "one failure for one answer");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.body_of(2), content(10, 10).to_vec());
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_reader_that_leaves_a_shared_fetch_leaves_it_running_for_the_others() {
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    h.read(1, Some("bytes=0-9"));
    h.read(2, Some("bytes=10-19"));
    let up = peer_sends(&h).remove(0);
    h.io(up.id, IoEvent::Connected);
    h.feed(Input::Cancel { id: RequestId(1) });
    assert!(!h.cancelled(up.id), "the other reader still waits on it");
    h.io(up.id, block_head());
    h.io(up.id, IoEvent::Body(content(0, BLOCK)));
    h.io(up.id, IoEvent::End);
    assert_eq!(h.body_of(2), content(10, 10).to_vec());
    assert!(!h.ended(1));
    // The last reader to leave cancels it, and nothing is charged.
    h.read(3, Some("bytes=1024-1030"));
    let up = peer_sends(&h).into_iter().last().expect("a fetch of block 1");
    h.feed(Input::Cancel { id: RequestId(3) });
    assert!(h.cancelled(up.id));
    let b = &h.node.engine().p2p().expect("p2p").breaker;
    assert_eq!(b.counters().soft + b.counters().hard, 0);
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_relay_never_joins_a_fetch_from_the_member_it_serves() {
    // Views that disagree can make the parent ask us for a block we are fetching from it:
    // joining would wait on ourselves until a bound fires. The relay asks on its own.
    let mut h = Harness::new(reader_of("p:9000"));
    size_known(&mut h);
    h.read(1, Some("bytes=1024-1030"));
    relay_from(&mut h, 7, 1, "parent");
    assert_eq!(peer_sends(&h).len(), 2);
    assert_eq!(h.node.counters().peer_fetches_joined, 0);
}

// ---- Read-ahead: a client read that misses keeps the next blocks in flight ----

/// A reader whose misses go to `p:9000`, reading `ahead` blocks ahead.
fn reader_ahead(ahead: usize) -> Node {
    let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
    let mut e =
        Engine::new(EngineConfig { geometry, read_ahead: ahead, ..EngineConfig::default() });
    let view = View::new(vec![Member::ready("parent", "p:9000")]);
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    e.enable_p2p(P2p { placement: Placement::new(view, "reader", 2, 1), breaker });
    node_with(e, "reader")
}

/// The block a peer exchange asks for.
fn block_asked(req: &IoRequest) -> u64 {
    let path = req.url.split_once("9000").expect("a peer URL").1;
    crate::codec::wire::parse_block_path(path).expect("a block path").block
}

/// No output of any kind is addressed to a read-ahead read.
fn nothing_to_node_requests(h: &Harness) {
    for o in &h.outputs {
        let id = match o {
            Output::Respond { id, .. }
            | Output::Body { id, .. }
            | Output::End { id }
            | Output::Abort { id } => *id,
            _ => continue,
        };
        assert!(id.0 < NODE_REQUEST_IDS, "an output to read-ahead read {id}: {o:?}");
    }
}

#[test]
fn a_read_that_misses_keeps_the_next_blocks_in_flight_and_serves_them_from_the_cache() {
    let mut h = Harness::new(reader_ahead(2));
    size_known(&mut h);
    h.read(1, None);
    let asked: Vec<u64> = peer_sends(&h).iter().map(block_asked).collect();
    assert_eq!(asked, vec![0, 1, 2], "the block it serves and the two after it");
    assert_eq!(h.node.counters().read_ahead, 2);
    // The read-ahead blocks arrive first; the read then finds them in the store.
    for req in h.take_sends().into_iter().rev() {
        let block = block_asked(&req);
        answer_peer(&mut h, &req, block);
    }
    let last: Vec<u64> = peer_sends(&h).iter().map(block_asked).collect();
    assert_eq!(last, vec![3], "only the last block is left to fetch");
    let req = h.take_sends().remove(0);
    answer_peer(&mut h, &req, 3);
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert!(h.ended(1));
    assert_eq!(h.node.counters().read_ahead, 2, "nothing is fetched twice");
    assert_eq!(h.node.live_requests(), 0, "read-ahead reads end with their fetch");
    nothing_to_node_requests(&h);
}

/// Serves one-block read `id` of block 0 through the tree: its head comes `wait` after the ask,
/// its end `transfer` after the head (the node's peer pace, [`Node::peer_ahead`]).
fn first_block_paced(h: &mut Harness, id: u64, wait: Duration, transfer: Duration) {
    h.read(id, Some(&format!("bytes=0-{}", BLOCK - 1)));
    let req = h.take_sends().remove(0);
    assert_eq!(block_asked(&req), 0);
    h.advance(wait);
    let headers = Headers::new().with("content-length", BLOCK.to_string());
    h.io(req.id, IoEvent::Connected);
    h.io(req.id, IoEvent::Head { status: 200, headers });
    h.advance(transfer);
    h.io(req.id, IoEvent::Body(content(0, BLOCK)));
    h.io(req.id, IoEvent::End);
    assert!(h.ended(id));
}

/// Through a tree slow to answer and fast to send (a cold tree: its root waits on the origin for
/// each block), a read that misses keeps the next blocks of its range in flight, as a read whose
/// miss goes to an origin like it does; through a tree that answers at once, or whose bytes take
/// longer than its wait (a busy link), one block at a time; beside another client's read of the
/// object, none.
#[test]
fn a_read_through_a_tree_slow_to_answer_keeps_the_next_blocks_in_flight() {
    let ms = Duration::from_millis;
    for (wait, transfer, crowded, ahead) in [
        (ms(30), ms(1), false, vec![1, 2, 3]),
        (ms(2), ms(0), false, vec![1]),
        (ms(30), ms(20), false, vec![1]),
        (ms(30), ms(1), true, vec![1]),
    ] {
        let mut h = Harness::new(reader_ahead(0));
        size_known(&mut h);
        first_block_paced(&mut h, 1, wait, transfer);
        let mut other = Vec::new();
        if crowded {
            // Another client reads the object (its block 2) while the next read runs.
            h.read(3, Some(&format!("bytes={}-{}", 2 * BLOCK, 2 * BLOCK)));
            other = h.take_sends();
            assert_eq!(other.iter().map(block_asked).collect::<Vec<_>>(), [2]);
        }
        h.read(2, None);
        let asked: Vec<u64> = peer_sends(&h).iter().map(block_asked).collect();
        assert_eq!(asked, ahead, "wait {wait:?}, transfer {transfer:?}, crowded {crowded}");
        for req in other.into_iter().chain(h.take_sends().into_iter().rev()) {
            let block = block_asked(&req);
            answer_peer(&mut h, &req, block);
        }
        while let Some(req) = peer_sends(&h).into_iter().next() {
            h.take_sends();
            let block = block_asked(&req);
            answer_peer(&mut h, &req, block);
        }
        assert!(h.body_of(2) == content(0, SIZE).to_vec(), "read 2's bytes (crowded {crowded})");
        assert!(h.ended(2));
        assert!(!crowded || h.ended(3));
        assert_eq!(h.node.live_requests(), 0);
        nothing_to_node_requests(&h);
    }
}

#[test]
fn a_read_that_reaches_a_block_still_in_flight_joins_its_fetch() {
    let mut h = Harness::new(reader_ahead(1));
    size_known(&mut h);
    h.read(1, Some(&format!("bytes=0-{}", 2 * BLOCK - 1)));
    let sends = h.take_sends();
    assert_eq!(sends.iter().map(block_asked).collect::<Vec<_>>(), vec![0, 1]);
    answer_peer(&mut h, &sends[0], 0);
    assert!(peer_sends(&h).is_empty(), "block 1 is being fetched: the read joins it");
    assert_eq!(h.node.counters().peer_fetches_joined, 1);
    answer_peer(&mut h, &sends[1], 1);
    assert_eq!(h.body_of(1), content(0, 2 * BLOCK).to_vec());
    assert!(h.ended(1));
    assert_eq!(h.node.counters().read_ahead, 1, "read-ahead stops at the range's end");
    assert_eq!(h.node.live_requests(), 0);
    nothing_to_node_requests(&h);
}

#[test]
fn a_read_ahead_that_fails_costs_the_read_nothing() {
    let mut h = Harness::new(reader_ahead(1));
    size_known(&mut h);
    h.read(1, Some(&format!("bytes=0-{}", 2 * BLOCK - 1)));
    let sends = h.take_sends();
    // The read-ahead's peer fails; it goes to the origin, which fails too.
    h.io(sends[1].id, IoEvent::Connected);
    h.io(sends[1].id, IoEvent::Head { status: 503, headers: Headers::new() });
    h.origin.status = Some(503);
    h.serve_origin();
    h.origin.status = None;
    answer_peer(&mut h, &sends[0], 0);
    // The read asks for block 1 itself and gets it.
    let again = h.take_sends();
    let peer: Vec<&IoRequest> = again.iter().filter(|r| r.endpoint == Endpoint::Peer).collect();
    assert_eq!(peer.iter().map(|r| block_asked(r)).collect::<Vec<_>>(), vec![1]);
    answer_peer(&mut h, peer[0], 1);
    assert_eq!(h.body_of(1), content(0, 2 * BLOCK).to_vec());
    assert!(h.ended(1) && !h.aborted(1));
    assert_eq!(h.node.live_requests(), 0);
    nothing_to_node_requests(&h);
}

/// A node alone in its view (the root of every tree: its misses go to the origin) that reads
/// `ahead` blocks ahead of origin misses and none ahead of peer misses.
fn root_ahead(ahead: usize) -> Node {
    root_ahead_chunked(ahead, 4)
}

/// [`root_ahead`] with chunks of `blocks` blocks.
fn root_ahead_chunked(ahead: usize, blocks: u64) -> Node {
    let geometry = Geometry::new(blocks * BLOCK, BLOCK).expect("geometry");
    let config = EngineConfig {
        geometry,
        read_ahead: 0,
        origin_read_ahead: ahead,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config);
    let view = View::new(vec![Member::ready("root", "root:9000")]);
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    e.enable_p2p(P2p { placement: Placement::new(view, "root", 2, 1), breaker });
    node_with(e, "root")
}

/// The block an origin exchange asks for.
fn origin_block(r: &IoRequest) -> u64 {
    let range = r.headers.get_str("range").expect("a ranged GET");
    let start = range.strip_prefix("bytes=").and_then(|r| r.split_once('-')).expect("range").0;
    start.parse::<u64>().expect("start") / BLOCK
}

/// The blocks the origin exchanges not yet answered ask for, in order.
fn origin_asked(h: &Harness) -> Vec<u64> {
    let sends = h.sends();
    sends.iter().filter(|r| r.endpoint == Endpoint::Origin).map(origin_block).collect()
}

/// Answers the oldest origin exchange in flight.
fn answer_first_origin(h: &mut Harness) {
    let sends = h.take_sends();
    let first = sends.iter().position(|r| r.endpoint == Endpoint::Origin).expect("an origin send");
    for (i, r) in sends.iter().enumerate() {
        if i != first {
            h.outputs.push(Output::Send(r.clone()));
        }
    }
    h.answer_origin(&sends[first]);
}

#[test]
fn a_lone_sequential_read_reads_ahead_at_the_origin_from_its_second_block() {
    let mut h = Harness::new(root_ahead(2));
    size_known(&mut h);
    h.read(1, None);
    assert_eq!(origin_asked(&h), vec![0], "the first block alone: a read may be one block");
    answer_first_origin(&mut h);
    assert_eq!(origin_asked(&h), vec![1, 2, 3], "past its first block, two more ride along");
    assert_eq!(h.node.counters().read_ahead, 2);
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert!(h.ended(1));
    // Every block counts once, from the origin: a block read ahead is no cache hit.
    let stats = h.node.engine().stats();
    assert_eq!((stats.block_source_origin, stats.block_source_cache), (4, 0));
    assert_eq!(h.node.live_requests(), 0);
    nothing_to_node_requests(&h);
}

#[test]
fn a_root_that_relays_the_object_reads_nothing_ahead_at_a_busy_origin() {
    let mut h = Harness::new(root_ahead(2));
    // Three windows' bodies would take longer than one window's wait for its head.
    h.origin.pace = (Duration::from_millis(5), Duration::from_millis(5));
    size_known(&mut h);
    h.read(1, None);
    // A child asks for a block of the same object while the read is on its first block.
    relay_from(&mut h, 7, 3, "child");
    assert_eq!(origin_asked(&h), vec![0, 3]);
    answer_first_origin(&mut h);
    assert_eq!(origin_asked(&h), vec![3, 1], "block 1 alone: nothing ahead of it");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert!(h.ended(1) && h.ended(7));
    assert_eq!(h.node.counters().read_ahead, 0, "read-ahead would share the subtree's link");
    assert_eq!(h.node.live_requests(), 0);
}

/// Where the origin's wait for a head dwarfs its windows' transfer, a read that shares its
/// object reads ahead too: windows ahead overlap the wait and leave the link mostly idle, where
/// one window per round trip would pace every reader behind this node (the `herd` scenario at
/// test scale ran at twice the time the root's read took alone).
#[test]
fn a_root_that_relays_the_object_reads_ahead_at_an_origin_that_is_slow_to_answer_and_fast_to_send()
{
    let mut h = Harness::new(root_ahead(2));
    h.origin.pace = (Duration::from_millis(20), Duration::from_millis(1));
    size_known(&mut h);
    h.read(1, None);
    relay_from(&mut h, 7, 3, "child");
    assert_eq!(origin_asked(&h), vec![0, 3]);
    answer_first_origin(&mut h);
    assert_eq!(origin_asked(&h), vec![3, 1, 2], "block 2 ahead; block 3's flight is joined");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert!(h.ended(1) && h.ended(7));
    // The read's four blocks and the relay's one, each from the origin's window, and the
    // origin sent each window once: the object's bytes.
    let stats = h.node.engine().stats();
    assert_eq!((stats.block_source_origin, stats.block_source_cache), (5, 0));
    assert_eq!(stats.origin_bytes, SIZE);
    assert!(h.node.counters().read_ahead >= 2);
    assert_eq!(h.node.live_requests(), 0);
}

/// The real `dart demo` at an origin 20 ms from its first byte paid the origin 1.25-1.63x for
/// two readers on about 1 run in 14: the surviving root's borrowed budget, full of the first
/// object's blocks, refused each new block it read ahead (TinyLFU), and the read, then the
/// peer behind it, fetched the block again.
#[test]
fn blocks_read_ahead_reach_the_read_and_its_relays_when_the_store_keeps_nothing() {
    // The root of the object's tree is not its owner: the owner ranks first but has no address
    // to ask (as a dead owner's open circuit leaves it), so what the root fetches is borrowed.
    let geometry = Geometry::new(4 * BLOCK, BLOCK).expect("geometry");
    let config =
        EngineConfig { geometry, read_ahead: 0, origin_read_ahead: 2, ..EngineConfig::default() };
    let chunk = Engine::new(config.clone()).block_key(&engine().identify(URL), 0).chunk;
    let placement = (0..64)
        .map(|i| {
            let owner = Member::ready(&format!("owner{i}"), "");
            let view = View::new(vec![owner, Member::ready("root", "root:9000")]);
            Placement::new(view, "root", 2, 1)
        })
        .find(|p| p.class_of(chunk) == BlockClass::Borrowed)
        .expect("a member that outranks the root");
    let mut e = Engine::new(config);
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    e.enable_p2p(P2p { placement, breaker });
    let mut h = Harness::new(node_with(e, "root"));
    h.refuse_puts = true;
    h.origin.pace = (Duration::from_millis(20), Duration::from_millis(1));
    size_known(&mut h);
    h.read(1, None);
    relay_from(&mut h, 7, 3, "child");
    answer_first_origin(&mut h);
    assert_eq!(origin_asked(&h), vec![3, 1, 2], "block 2 ahead; block 3's flight is joined");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert!(h.ended(1) && h.ended(7));
    // A child asks for a block the read took a while ago: the node holds its last blocks.
    relay_from(&mut h, 8, 2, "child");
    assert!(h.ended(8));
    assert!(h.store.is_empty(), "the store kept nothing");
    let stats = h.node.engine().stats();
    assert_eq!(stats.origin_bytes, SIZE, "the origin sent each window once");
    assert!(h.node.counters().held_hits >= 2, "{:?}", h.node.counters());
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_read_alone_reads_ahead_whatever_the_origin_pace() {
    let mut h = Harness::new(root_ahead(2));
    h.origin.pace = (Duration::from_millis(5), Duration::from_millis(5));
    size_known(&mut h);
    h.read(1, None);
    answer_first_origin(&mut h);
    assert_eq!(origin_asked(&h), vec![1, 2, 3]);
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
}

#[test]
fn two_client_reads_of_one_object_read_nothing_ahead_even_at_an_origin_slow_to_answer() {
    let mut h = Harness::new(root_ahead(2));
    // Latency-bound, where a read beside a relay would read ahead: two client reads would
    // each keep their own windows in flight.
    h.origin.pace = (Duration::from_millis(20), Duration::from_millis(1));
    size_known(&mut h);
    h.read(1, None);
    h.read(2, Some(&format!("bytes={}-", 2 * BLOCK)));
    assert_eq!(origin_asked(&h), vec![0, 2]);
    answer_first_origin(&mut h);
    assert_eq!(origin_asked(&h), vec![2, 1], "block 1 alone: nothing ahead of it");
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    assert_eq!(h.body_of(2), content(2 * BLOCK, SIZE - 2 * BLOCK).to_vec());
    assert!(h.ended(1) && h.ended(2));
    assert_eq!(h.node.counters().read_ahead, 0, "each would keep its own windows in flight");
    assert_eq!(h.node.live_requests(), 0);
}

/// A tree root asked for the object's blocks in order by its children, reading none of it
/// itself, at an origin slow to answer and fast to send: `h` has learnt the origin's pace from
/// relay 7's block 0 and relay 8 asks for block 1.
fn relays_in_order(h: &mut Harness, pace: (Duration, Duration)) {
    h.origin.pace = pace;
    size_known(h);
    relay_from(h, 7, 0, "child");
    assert_eq!(origin_asked(h), vec![0]);
    h.serve_origin();
    assert!(h.ended(7));
    relay_from(h, 8, 1, "child");
}

/// After [`relays_in_order`]: relay 8 asked the origin for its own block 1 and nothing ahead,
/// and ends with it.
fn relay_reads_only_its_block(h: &mut Harness, why: &str) {
    assert_eq!(origin_asked(h), vec![1], "{why}");
    h.serve_origin();
    assert!(h.ended(8));
    assert_eq!(h.node.counters().read_ahead, 0);
}

/// Without this, a root that only relays the object asks the origin for one window per round
/// trip, and every reader in its tree follows at that pace.
#[test]
fn a_root_that_only_relays_a_stream_reads_ahead_at_an_origin_slow_to_answer() {
    let mut h = Harness::new(root_ahead(2));
    relays_in_order(&mut h, (Duration::from_millis(20), Duration::from_millis(1)));
    assert_eq!(origin_asked(&h), vec![1, 2, 3], "block 1 continues block 0: two ride along");
    assert_eq!(h.node.counters().read_ahead, 2);
    h.serve_origin();
    assert!(h.ended(8));
    // The children's next asks find the blocks stored: the origin is asked nothing more.
    relay_from(&mut h, 9, 2, "child");
    relay_from(&mut h, 10, 3, "other-child");
    assert_eq!(origin_asked(&h), Vec::<u64>::new());
    assert!(h.ended(9) && h.ended(10));
    let relayed: Vec<u8> = [7, 8, 9, 10].iter().flat_map(|&id| h.body_of(id)).collect();
    let footers = 4 * crate::integrity::FOOTER_LEN as usize;
    assert_eq!(relayed.len(), SIZE as usize + footers);
    assert_eq!(h.node.engine().stats().origin_bytes, SIZE, "each window once");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn an_origin_s_pace_is_kept_per_host_and_port() {
    let mut h = Harness::new(root_ahead(2));
    relays_in_order(&mut h, (Duration::from_millis(20), Duration::from_millis(1)));
    h.serve_origin();
    assert!(h.node.origin_latency_bound(URL, 2), "learnt from this origin's windows");
    // Another host, or another port of the same host, has not shown its pace: nothing ahead
    // there on this origin's word.
    let (host, port) = crate::policy::url_host_port(URL).expect("the test URL dials");
    assert!(!h.node.origin_latency_bound(&format!("http://other.example:{port}/o"), 2));
    assert!(!h.node.origin_latency_bound(&format!("http://{host}:{}/o", port + 1), 2));
    assert!(h.node.origin_latency_bound(&format!("http://{}:{port}/o", host.to_uppercase()), 2));
}

#[test]
fn an_origin_that_answers_within_milliseconds_is_not_latency_bound() {
    // Its bytes take a tenth of its wait, but a wait of 5 ms is an origin next door (or the
    // node's own scheduling): nothing ahead beside the relays.
    let mut h = Harness::new(root_ahead(2));
    relays_in_order(&mut h, (Duration::from_millis(5), Duration::from_micros(500)));
    relay_reads_only_its_block(&mut h, "a wait of 5 ms");
    assert!(!h.node.origin_latency_bound(URL, 2));
}

#[test]
fn a_root_that_only_relays_reads_nothing_ahead_at_a_busy_origin() {
    let mut h = Harness::new(root_ahead(2));
    relays_in_order(&mut h, (Duration::from_millis(5), Duration::from_millis(5)));
    relay_reads_only_its_block(&mut h, "windows ahead would slow the one its subtree follows");
}

#[test]
fn a_relay_that_continues_no_stream_reads_nothing_ahead() {
    let mut h = Harness::new(root_ahead(2));
    h.origin.pace = (Duration::from_millis(20), Duration::from_millis(1));
    size_known(&mut h);
    relay_from(&mut h, 7, 3, "child");
    h.serve_origin();
    // A successor's held-only ask for block 0 (not held: 404) is no stream of this node's.
    let e = engine();
    let key = e.block_key(&e.identify(URL), 0);
    let held_only = Headers::new()
        .with("x-dart-origin", URL)
        .with("x-dart-hop", "0")
        .with("x-dart-held-only", "1")
        .with("x-dart-node", "home");
    h.get(8, Plane::Peer, &crate::codec::wire::block_path(key), held_only);
    assert!(h.ended(8));
    // Block 1 follows neither block 3 nor the held-only ask: a reader that skips about costs
    // the origin no window it did not ask for.
    relay_from(&mut h, 9, 1, "child");
    assert_eq!(origin_asked(&h), vec![1]);
    h.serve_origin();
    assert!(h.ended(9));
    assert_eq!(h.node.counters().read_ahead, 0);
}

#[test]
fn a_relay_reads_ahead_only_inside_its_chunk() {
    // Chunks of two blocks: block 1 ends the first chunk, whose tree is the one this node roots.
    let mut h = Harness::new(root_ahead_chunked(2, 2));
    relays_in_order(&mut h, (Duration::from_millis(20), Duration::from_millis(1)));
    relay_reads_only_its_block(&mut h, "blocks 2 and 3 are the next chunk's");
}

#[test]
fn a_block_read_ahead_from_the_origin_counts_once_when_a_later_read_hits_it() {
    let mut h = Harness::new(root_ahead(2));
    size_known(&mut h);
    h.read(1, None);
    answer_first_origin(&mut h);
    // The read-ahead windows land first; the read then finds blocks 2 and 3 stored.
    let sends = h.take_sends();
    for r in sends.iter().rev() {
        h.answer_origin(r);
    }
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    let stats = h.node.engine().stats();
    assert_eq!((stats.block_source_origin, stats.block_source_cache), (4, 0));
    // A second read of the same blocks: plain cache hits now.
    h.read(2, None);
    assert_eq!(h.body_of(2), content(0, SIZE).to_vec());
    let stats = h.node.engine().stats();
    assert_eq!((stats.block_source_origin, stats.block_source_cache), (4, 4));
}

#[test]
fn a_relay_that_hits_a_block_read_ahead_leaves_its_count_to_the_client_read() {
    let mut h = Harness::new(root_ahead(2));
    size_known(&mut h);
    h.read(1, None);
    answer_first_origin(&mut h);
    // Blocks 2 and 3 (read ahead) land; block 1, the read's own, is still on its way.
    let sends = h.take_sends();
    let own = sends.iter().position(|r| origin_block(r) == 1).expect("block 1 asked");
    for (i, r) in sends.iter().enumerate() {
        if i != own {
            h.answer_origin(r);
        }
    }
    // A child's relay finds block 2 stored (a relay counts in `relay_served`, in no block
    // source): the record stays for the client read, which counts block 2 from the origin.
    relay_from(&mut h, 7, 2, "child");
    assert!(h.ended(7));
    h.answer_origin(&sends[own]);
    h.serve_origin();
    assert_eq!(h.body_of(1), content(0, SIZE).to_vec());
    let stats = h.node.engine().stats();
    assert_eq!((stats.block_source_origin, stats.block_source_cache), (4, 0), "{stats:?}");
    assert_eq!(stats.relay_served, 1);
}

#[test]
fn a_driver_that_uses_the_node_s_own_request_ids_is_refused_as_a_driver_bug() {
    let mut h = Harness::new(reader_ahead(1));
    let id = NODE_REQUEST_IDS + 5;
    h.get(id, Plane::Client, &format!("/dart/{URL}"), Headers::new());
    assert_eq!(h.node.counters().panics, 1, "a driver bug, isolated");
    assert_eq!(h.node.live_requests(), 0);
}

// ---- A root relay streams its origin window ----

/// The only member of its view: the root of every tree, so a relay's miss goes to the origin.
fn root_node() -> Node {
    let mut e = engine();
    let view = View::new(vec![Member::ready("root", "root:9000")]);
    let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
    e.enable_p2p(P2p { placement: Placement::new(view, "root", 2, 1), breaker });
    node_with(e, "root")
}

/// Relay request 7 for block 1 at the root, whose origin window has answered its 206 head.
fn relay_with_origin_head(h: &mut Harness) -> IoRequest {
    relay_from(h, 7, 1, "child");
    let up = h.take_sends().remove(0);
    let head = Headers::new()
        .with("content-range", format!("bytes {}-{}/{SIZE}", BLOCK, 2 * BLOCK - 1))
        .with("content-length", BLOCK.to_string());
    h.io(up.id, IoEvent::Connected);
    h.io(up.id, IoEvent::Head { status: 206, headers: head });
    up
}

#[test]
fn a_root_relay_streams_its_origin_window_holding_back_the_last_byte() {
    let mut h = Harness::new(root_node());
    size_known(&mut h);
    let up = relay_with_origin_head(&mut h);
    assert_eq!(up.endpoint, Endpoint::Origin);
    assert_eq!(h.head_of(7).map(|x| x.status), Some(200), "the head goes out on the origin's");
    let block = content(BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(block.slice(..300)));
    assert_eq!(h.body_of(7), block[..300].to_vec(), "bytes go out as they arrive");
    h.io(up.id, IoEvent::Body(block.slice(300..)));
    assert_eq!(h.body_of(7).len() as u64, BLOCK - 1, "the last byte waits for the end");
    h.io(up.id, IoEvent::End);
    assert_eq!(h.relay_block_of(7), block.to_vec());
    assert!(h.ended(7), "{:?}", h.outputs);
    assert_eq!(store_puts(&h), 1);
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_root_relay_whose_origin_window_ends_short_truncates_and_caches_nothing() {
    let mut h = Harness::new(root_node());
    size_known(&mut h);
    let up = relay_with_origin_head(&mut h);
    let block = content(BLOCK, BLOCK);
    h.io(up.id, IoEvent::Body(block.slice(..BLOCK as usize - 1)));
    assert_eq!(h.body_of(7).len() as u64, BLOCK - 1, "all but the last byte");
    h.io(up.id, IoEvent::End);
    assert!(h.aborted(7), "a short window truncates the stream");
    assert!(!h.ended(7));
    assert_eq!(store_puts(&h), 0);
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_root_relay_does_not_stream_a_range_blind_answer() {
    let mut h = Harness::new(root_node());
    size_known(&mut h);
    relay_from(&mut h, 7, 1, "child");
    let up = h.take_sends().remove(0);
    h.io(up.id, IoEvent::Connected);
    let head = Headers::new().with("content-length", SIZE.to_string());
    h.io(up.id, IoEvent::Head { status: 200, headers: head });
    assert!(h.head_of(7).is_none(), "a Range-blind 200 is never streamed");
    h.io(up.id, IoEvent::Body(content(0, SIZE)));
    h.io(up.id, IoEvent::End);
    // Served whole once it is cut from the whole object, never cached.
    assert_eq!(h.relay_block_of(7), content(BLOCK, BLOCK).to_vec());
    assert_eq!(store_puts(&h), 0);
}

// ---- Interleavings of shared peer fetches, streams and read-ahead (model-based fuzz) ----
//
// proptest drives one reader node through arbitrary interleavings of client reads (ranges over
// the object's blocks), relay requests from two children and from its own parent, requesters
// leaving, the parent's answers to every peer exchange in any order and any pieces (head, body
// parts, end, a 503, a broken connection), origin answers and time passing (every exchange
// bound). The parent and the origin are honest, so: the machine's invariants hold after every
// step (the harness checks them); nothing is ever sent to a read-ahead request id; when the
// world is drained every request that stayed has ended with exactly its bytes, been aborted
// with a prefix of them, or been answered with an error status; nothing is left live. Cases
// follow `PROPTEST_CASES` (256 when unset) for longer runs:
// `PROPTEST_CASES=20000 cargo test -p dart-core --lib node::tests::shared_fetch_interleavings --release`.

#[derive(Clone, Copy, Debug)]
enum PeerStep {
    Head,
    Unavailable,
    UpstreamSlow,
    Part(usize),
    Finish,
    Break,
    /// The rest of the body with one byte flipped, then the digest of the right bytes (or, when
    /// every byte went already, a footer with one bit flipped), then the end.
    Corrupt,
}

#[derive(Clone, Copy, Debug)]
enum FuzzOp {
    Read { first: u64, last: u64 },
    Relay { block: u64, requester: u8 },
    Leave(usize),
    Peer { pick: usize, step: PeerStep },
    Origin,
    Advance(u64),
}

fn fuzz_op() -> impl proptest::strategy::Strategy<Value = FuzzOp> {
    use proptest::prelude::*;
    let blocks = SIZE.div_ceil(BLOCK);
    let step = prop_oneof![
        3 => Just(PeerStep::Head),
        1 => Just(PeerStep::Unavailable),
        1 => Just(PeerStep::UpstreamSlow),
        3 => (1usize..700).prop_map(PeerStep::Part),
        3 => Just(PeerStep::Finish),
        1 => Just(PeerStep::Break),
        1 => Just(PeerStep::Corrupt),
    ];
    prop_oneof![
        3 => (0..blocks, 0..blocks).prop_map(|(a, b)| FuzzOp::Read { first: a.min(b), last: a.max(b) }),
        3 => (0..blocks, 0u8..3).prop_map(|(block, requester)| FuzzOp::Relay { block, requester }),
        1 => (0usize..16).prop_map(FuzzOp::Leave),
        8 => (0usize..16, step).prop_map(|(pick, step)| FuzzOp::Peer { pick, step }),
        2 => Just(FuzzOp::Origin),
        1 => prop_oneof![Just(50u64), Just(1_000), Just(4_000)].prop_map(FuzzOp::Advance),
    ]
}

/// What one started request must answer: its first byte and its length.
struct Asked {
    id: u64,
    start: u64,
    len: u64,
    left: bool,
}

struct Fuzz {
    h: Harness,
    /// Live peer exchanges the fuzzer knows: block, head sent, body bytes sent.
    peers: std::collections::BTreeMap<IoId, (u64, bool, u64)>,
    origin: Vec<IoRequest>,
    asked: Vec<Asked>,
    next_id: u64,
}

impl Fuzz {
    fn collect(&mut self) {
        for req in self.h.take_sends() {
            match req.endpoint {
                Endpoint::Peer => {
                    self.peers.insert(req.id, (block_asked(&req), false, 0));
                }
                Endpoint::Origin => self.origin.push(req),
            }
        }
        let live: Vec<IoId> = self.h.node.exchanges().iter().map(|(id, _, _)| *id).collect();
        self.peers.retain(|io, _| live.contains(io));
        self.origin.retain(|r| live.contains(&r.id));
    }

    fn peer(&mut self, io: IoId, step: PeerStep) {
        let Some(&(block, head, sent)) = self.peers.get(&io) else { return };
        let len = BLOCK.min(SIZE - block * BLOCK);
        let data = content(block * BLOCK, len);
        let live = |f: &Fuzz| f.h.node.exchanges().iter().any(|(id, _, _)| *id == io);
        let send_head = |f: &mut Fuzz| {
            f.h.io(io, IoEvent::Connected);
            if live(f) {
                let headers = Headers::new().with("content-length", len.to_string());
                f.h.io(io, IoEvent::Head { status: 200, headers });
            }
        };
        match step {
            PeerStep::Head if !head => send_head(self),
            PeerStep::Unavailable if !head => {
                self.h.io(io, IoEvent::Connected);
                if live(self) {
                    self.h.io(io, IoEvent::Head { status: 503, headers: Headers::new() });
                }
            }
            PeerStep::UpstreamSlow if !head => {
                self.h.io(io, IoEvent::Connected);
                if live(self) {
                    self.h.io(io, upstream_slow());
                }
            }
            PeerStep::Part(n) if head => {
                let end = (sent + n as u64).min(len);
                if end > sent {
                    self.h.io(io, IoEvent::Body(data.slice(sent as usize..end as usize)));
                    if let Some(p) = self.peers.get_mut(&io) {
                        p.2 = end;
                    }
                }
            }
            PeerStep::Finish => {
                if !head {
                    send_head(self);
                }
                if live(self) && sent < len {
                    self.h.io(io, IoEvent::Body(data.slice(sent as usize..)));
                }
                if live(self) {
                    self.h.io(io, IoEvent::End);
                }
            }
            PeerStep::Break => self.h.io(io, IoEvent::Failed(IoError::Broken("reset".into()))),
            PeerStep::Corrupt => {
                if !head {
                    send_head(self);
                }
                // Past the harness's honest wire form: the footer is of the right bytes.
                self.h.peer_blocks.remove(&io);
                let mut footer = xxh3_128(&data).footer().to_vec();
                if live(self) && sent < len {
                    let mut rest = data[sent as usize..].to_vec();
                    rest[0] ^= 0x40;
                    self.h.io_raw(io, IoEvent::Body(Bytes::from(rest)));
                } else {
                    footer[0] ^= 0x01;
                }
                if live(self) {
                    self.h.io_raw(io, IoEvent::Body(Bytes::from(footer)));
                }
                if live(self) {
                    self.h.io_raw(io, IoEvent::End);
                }
            }
            _ => return,
        }
        if let Some(p) = self.peers.get_mut(&io) {
            p.1 = true;
        }
    }

    fn apply(&mut self, op: FuzzOp) {
        self.collect();
        match op {
            FuzzOp::Read { first, last } => {
                let start = first * BLOCK;
                let end = ((last + 1) * BLOCK).min(SIZE) - 1;
                let id = self.next_id;
                self.next_id += 1;
                self.asked.push(Asked { id, start, len: end - start + 1, left: false });
                self.h.read(id, Some(&format!("bytes={start}-{end}")));
            }
            FuzzOp::Relay { block, requester } => {
                let id = self.next_id;
                self.next_id += 1;
                let len = BLOCK.min(SIZE - block * BLOCK);
                self.asked.push(Asked { id, start: block * BLOCK, len, left: false });
                let who = ["child-a", "child-b", "parent"][requester as usize];
                relay_from(&mut self.h, id, block, who);
            }
            FuzzOp::Leave(i) => {
                if let Some(a) = self.asked.get_mut(i) {
                    if !a.left {
                        a.left = true;
                        let id = RequestId(a.id);
                        self.h.feed(Input::Cancel { id });
                    }
                }
            }
            FuzzOp::Peer { pick, step } => {
                let ios: Vec<IoId> = self.peers.keys().copied().collect();
                if let Some(&io) = ios.get(pick % ios.len().max(1)) {
                    self.peer(io, step);
                }
            }
            FuzzOp::Origin => {
                for req in std::mem::take(&mut self.origin) {
                    if self.h.node.exchanges().iter().any(|(id, _, _)| *id == req.id) {
                        self.h.answer_origin(&req);
                    }
                }
            }
            FuzzOp::Advance(ms) => self.h.advance(Duration::from_millis(ms)),
        }
        self.collect();
        nothing_to_node_requests(&self.h);
    }

    /// Answers everything honestly and lets time pass until nothing is live.
    fn drain(&mut self) {
        for _ in 0..200 {
            self.collect();
            let ios: Vec<IoId> = self.peers.keys().copied().collect();
            for io in ios {
                self.peer(io, PeerStep::Finish);
            }
            self.apply(FuzzOp::Origin);
            if self.h.node.exchanges().is_empty() && self.h.node.live_requests() == 0 {
                return;
            }
            self.h.advance(Duration::from_secs(1));
        }
        panic!(
            "not drained: {} requests, exchanges {:?}",
            self.h.node.live_requests(),
            self.h.node.exchanges()
        );
    }

    fn check(&self) {
        nothing_to_node_requests(&self.h);
        for (key, block) in &self.h.store {
            let want = content(key.block * BLOCK, BLOCK.min(SIZE - key.block * BLOCK));
            assert!(*block == want, "block {key} cached with wrong bytes");
        }
        for a in &self.asked {
            let status = self.h.head_of(a.id).map(|x| x.status);
            let body = self.h.served_of(a.id);
            let want = content(a.start, a.len);
            // A cut-through relay forwards all but the last byte before it can check them: one
            // whose upstream lied is cut short, and only its whole answers must be right.
            let relay = self.h.peer_requests.contains(&a.id);
            if matches!(status, Some(200 | 206)) && (!relay || self.h.ended(a.id)) {
                assert!(
                    want.starts_with(&body),
                    "request {}: bytes differ from the object's",
                    a.id
                );
            }
            if a.left {
                continue;
            }
            let ended = self.h.ended(a.id);
            if ended && matches!(status, Some(200 | 206)) {
                assert_eq!(body.len() as u64, a.len, "request {} ended short", a.id);
            }
            assert!(
                ended || self.h.aborted(a.id),
                "request {} neither ended nor aborted (head {status:?})",
                a.id
            );
        }
        assert_eq!(self.h.node.live_requests(), 0);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::default())]
    #[test]
    fn shared_fetch_interleavings(
        ahead in 0usize..3,
        slow_origin in proptest::bool::ANY,
        ops in proptest::collection::vec(fuzz_op(), 1..60),
    ) {
        let mut f = Fuzz {
            h: Harness::new(reader_ahead(ahead)),
            peers: Default::default(),
            origin: Vec::new(),
            asked: Vec::new(),
            next_id: 1,
        };
        if slow_origin {
            // Latency-bound once a window came: relays in order and reads beside them read
            // ahead at the origin (`Node::relay_ahead`, `Node::origin_ahead`).
            f.h.origin.pace = (Duration::from_millis(20), Duration::from_millis(1));
        }
        size_known(&mut f.h);
        for op in ops {
            f.apply(op);
        }
        f.drain();
        f.check();
    }
}

// ---- A relay that reports its upstream slow, and slow peers remembered across reads ----

fn upstream_slow() -> IoEvent {
    let headers = Headers::new().with("x-dart-upstream-status", "504");
    IoEvent::Head { status: 504, headers }
}

#[test]
fn a_relay_that_reports_its_upstream_slow_is_asked_once_more_before_that_upstream() {
    let (node, ancestors) = hedging_reader(0.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    h.io(primary.id, upstream_slow());
    // The relay goes on fetching past its slow upstream: it is asked again, not the grandparent.
    let again = peer_sends(&h).into_iter().last().expect("a second ask");
    assert!(again.url.starts_with(&format!("http://{}/", ancestors[0])), "{}", again.url);
    h.io(again.id, IoEvent::Connected);
    h.io(again.id, upstream_slow());
    // Only once per block: then the next ancestor.
    let next = peer_sends(&h).into_iter().last().expect("a third ask");
    assert!(next.url.starts_with(&format!("http://{}/", ancestors[1])), "{}", next.url);
    answer_peer(&mut h, &next, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    let b = breaker_of(&h);
    assert_eq!(b.soft + b.hard, 0, "a relay that reports its upstream slow is not blamed");
}

#[test]
fn a_relay_that_reports_its_upstream_slow_while_a_backup_races_is_asked_again_at_once() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    h.io(backup.id, IoEvent::Connected);
    h.outputs.retain(|o| !matches!(o, Output::Send(_)));
    // The parent gave up on its own upstream (most likely the grandparent the backup waits on)
    // and goes on fetching past it: it takes the freed place now, not after the backup answers.
    h.io(primary.id, upstream_slow());
    let again = peer_sends(&h).pop().expect("the relay asked again at once");
    assert!(again.url.starts_with(&format!("http://{}/", ancestors[0])), "{}", again.url);
    answer_peer(&mut h, &again, 0);
    assert!(h.cancelled(backup.id), "the backup lost");
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    let b = breaker_of(&h);
    assert_eq!(b.soft + b.hard, 0, "neither the relay nor the slow backup is blamed");
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn a_relay_whose_requester_left_asks_its_upstream_no_more_and_leaves_its_backup() {
    let (node, ancestors) = hedging_reader(1.0);
    let mut h = Harness::new(node);
    // A relay read (its requester left later) rather than a client read: a relay keeps its
    // exchanges when its requester leaves (`Node::release`), and asks nothing further.
    relay_request(&mut h, 1, 0);
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let primary = h.take_sends().remove(0);
    assert!(primary.url.starts_with(&format!("http://{}/", ancestors[0])), "the parent first");
    h.io(primary.id, IoEvent::Connected);
    h.advance(Duration::from_millis(20));
    let backup = peer_sends(&h).pop().expect("a backup");
    h.feed(Input::Cancel { id: RequestId(1) });
    h.outputs.retain(|o| !matches!(o, Output::Send(_)));
    // The relay's "upstream slow" would ask it again beside the backup; nobody waits any more,
    // so the read ends and leaves the backup too (the harness checks no exchange is orphaned).
    h.io(primary.id, upstream_slow());
    assert!(peer_sends(&h).is_empty(), "nothing asked for a requester that left");
    assert!(h.cancelled(backup.id));
    assert_eq!(h.node.live_requests(), 0);
    let b = breaker_of(&h);
    assert_eq!(b.soft + b.hard, 0);
}

/// A node without an estimate looks at a slow primary with another ancestor left after the
/// cold probe delay: a held-only ask of the same peer, which spends no hedge credit.
fn cold_look_at_the_parent(h: &mut Harness, ancestors: &[String]) -> (IoRequest, IoRequest) {
    let primary = start_block_read(h, ancestors);
    h.io(primary.id, IoEvent::Connected);
    assert_eq!(h.node.poll_timeout(), Some(h.now + COLD_PROBE_DELAY));
    h.advance(COLD_PROBE_DELAY);
    let look = peer_sends(h).pop().expect("a look at the parent");
    assert_eq!(look.url, primary.url, "the same parent, the same block");
    assert_eq!(look.headers.get_str("x-dart-held-only"), Some("1"));
    h.outputs.retain(|o| !matches!(o, Output::Send(_)));
    (primary, look)
}

#[test]
fn a_node_without_an_estimate_hedges_its_first_slow_fetch_after_the_cold_delay() {
    let (node, ancestors) = hedging_reader_warm(DEFAULT_HEDGE_RATIO, false);
    let mut h = Harness::new(node);
    let (primary, look) = cold_look_at_the_parent(&mut h, &ancestors);
    // The parent answers at once that it does not hold the block yet: alive, so the hedge
    // proper comes at the cold delay after the primary was sent, paid from the hedge a node
    // starts with.
    let due = h.now + (COLD_DELAY - COLD_PROBE_DELAY);
    h.io(look.id, IoEvent::Connected);
    h.io(look.id, IoEvent::Head { status: 404, headers: Headers::new() });
    h.advance(crate::engine::probe_wait(COLD_DELAY));
    assert!(peer_sends(&h).is_empty(), "no backup after the probe wait: the parent is alive");
    h.advance(due.saturating_duration_since(h.now) - Duration::from_millis(1));
    assert!(peer_sends(&h).is_empty(), "no backup before the cold delay");
    h.advance(Duration::from_millis(1));
    let backup = peer_sends(&h).pop().expect("a backup");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    answer_peer(&mut h, &backup, 0);
    assert!(h.cancelled(primary.id));
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    let s = h.node.stats();
    assert_eq!((s.hedge_fired, s.hedge_probes, s.hedge_probes_alive), (2, 1, 1));
    assert_eq!((s.hedge_probe_failovers, s.hedge_origin), (0, 0));
    // The banked hedge is spent: the next slow fetch (of another block) is looked at, but not
    // hedged until fetches have earned another (20 at the default ratio).
    h.outputs.clear();
    h.read(2, Some(&format!("bytes={BLOCK}-{}", BLOCK + 9)));
    let second = peer_sends(&h).remove(0);
    h.io(second.id, IoEvent::Connected);
    h.advance(COLD_PROBE_DELAY);
    let look = peer_sends(&h).pop().expect("a look at the parent");
    h.io(look.id, IoEvent::Connected);
    h.io(look.id, IoEvent::Head { status: 404, headers: Headers::new() });
    h.advance(crate::engine::probe_wait(COLD_DELAY));
    h.advance(COLD_DELAY);
    assert_eq!(peer_sends(&h).len(), 2, "no second hedge");
    answer_peer(&mut h, &second, 1);
    assert!(h.ended(2));
    assert_eq!(h.node.stats().hedge_fired - h.node.stats().hedge_probes, 1);
}

/// A stalled parent met before the node has an estimate: its look goes unanswered for a probe
/// wait, and the backup goes to the grandparent at once, without hedge credit (a failover from
/// a silent peer), the parent's two asks running on to record how it ends. Before, the read
/// waited the whole cold hedge delay (375 ms) for the hedge, and a node with no credit left
/// waited its head bound (`stalled-peer`, `tail-at-scale`'s first seconds).
#[test]
fn a_silent_parent_met_without_an_estimate_is_left_for_the_grandparent_at_the_probe_wait() {
    let (node, ancestors) = hedging_reader_warm(DEFAULT_HEDGE_RATIO, false);
    let mut h = Harness::new(node);
    assert!(h.node.engine_mut().try_hedge(), "the hedge banked at start");
    let (primary, look) = cold_look_at_the_parent(&mut h, &ancestors);
    let hedge_due = h.now + (COLD_DELAY - COLD_PROBE_DELAY);
    h.io(look.id, IoEvent::Connected);
    h.advance(crate::engine::probe_wait(COLD_DELAY) - Duration::from_millis(1));
    assert!(peer_sends(&h).is_empty(), "still waiting on the look");
    h.advance(Duration::from_millis(1));
    assert!(h.now < hedge_due, "before the cold hedge would have come");
    let backup = peer_sends(&h).pop().expect("a backup with no credit left");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    assert_eq!(backup.headers.get_str("x-dart-held-only"), None, "a whole fetch");
    assert!(h.sends().iter().all(|r| r.endpoint != Endpoint::Origin), "no origin");
    answer_peer(&mut h, &backup, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    assert!(!h.cancelled(primary.id) && !h.cancelled(look.id), "both run on");
    let s = h.node.stats();
    assert_eq!((s.hedge_probes, s.hedge_probes_alive, s.hedge_probe_failovers), (1, 0, 1));
    assert_eq!((s.hedge_origin, s.hedge_backup_won), (0, 1));
    assert!(h.node.engine().is_silent(&ancestors[0], h.now));
    assert!(h.node.engine().is_slow(&ancestors[0], h.now), "the next blocks ask it last");
}

/// The same when the look fails outright (its connection breaks): the grandparent, not the
/// origin. A first version sent such a read to the origin (an origin fill), as a last
/// ancestor's probe does; the turmoil run of the shared subset caught it (no hedge won, no
/// timeout: every child of the stalled node paid the origin).
#[test]
fn a_silent_parent_whose_look_fails_is_left_for_the_grandparent_not_the_origin() {
    let (node, ancestors) = hedging_reader_warm(DEFAULT_HEDGE_RATIO, false);
    let mut h = Harness::new(node);
    let (primary, look) = cold_look_at_the_parent(&mut h, &ancestors);
    h.io(look.id, IoEvent::Failed(IoError::Broken("connection reset".into())));
    let backup = peer_sends(&h).pop().expect("a backup");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    assert!(h.sends().iter().all(|r| r.endpoint != Endpoint::Origin), "no origin");
    answer_peer(&mut h, &backup, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(!h.cancelled(primary.id), "the parent's fetch runs on");
    let s = h.node.stats();
    assert_eq!((s.hedge_probe_failovers, s.hedge_origin, s.hedge_backup_won), (1, 0, 1));
}

#[test]
fn a_block_another_read_stored_ends_the_wait_of_a_read_stuck_on_a_slow_peer() {
    // One hedge in the bank, none earned: the first read hedges, the second cannot.
    let (node, ancestors) = hedging_reader(DEFAULT_HEDGE_RATIO);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    // A second read of the same block joins the fetch from the (stalled) parent.
    h.read(2, Some("bytes=0-9"));
    assert!(peer_sends(&h).is_empty(), "joined, not sent again");
    h.advance(Duration::from_millis(20));
    let sends = peer_sends(&h);
    let grandparent = format!("http://{}/", ancestors[1]);
    let backup = sends.iter().find(|r| r.url.starts_with(&grandparent)).expect("a backup");
    assert_eq!(backup.headers.get_str("x-dart-held-only"), None, "the first read's hedge");
    // The second read, with no credit, looks at the parent instead (a held-only ask).
    assert_eq!(sends.len(), 2, "one hedge and one look: {sends:?}");
    let look = sends.iter().find(|r| r.id != backup.id).expect("the look");
    assert!(look.url.starts_with(&format!("http://{}/", ancestors[0])));
    assert_eq!(look.headers.get_str("x-dart-held-only"), Some("1"));
    let backup = backup.clone();
    answer_peer(&mut h, &backup, 0);
    // The first read stored the block; the second takes it instead of waiting out its bound.
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.body_of(2), content(0, 10).to_vec());
    assert!(h.ended(2));
    assert!(h.cancelled(primary.id), "nobody waits on the parent any more");
    let b = breaker_of(&h);
    assert_eq!((b.soft, b.hard), (0, 0), "the slow parent is not charged");
    assert_eq!(h.node.stats().landed, 1);
    assert_eq!(h.node.live_requests(), 0);
}

/// A node out of hedge credit (one that reads little earns 0.05 of a hedge per fetch) still
/// looks at a primary slower than the hedge delay: the held-only liveness probe, which spends
/// none. Unanswered within a probe wait, the parent is left for the grandparent at once (a
/// failover from a silent peer, no credit); answered, the read keeps waiting on it. Before, the
/// read waited out its whole head bound on a stalled parent (`tail-at-scale`'s slowest reads,
/// 1.0 s each, with the grandparent at hand).
#[test]
fn a_node_out_of_hedge_credit_looks_at_a_slow_parent_and_leaves_a_silent_one_for_the_grandparent() {
    let (node, ancestors) = hedging_reader(DEFAULT_HEDGE_RATIO);
    let mut h = Harness::new(node);
    assert!(h.node.engine_mut().try_hedge(), "the banked hedge, spent");
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    h.advance(Duration::from_millis(20));
    let look = peer_sends(&h).pop().expect("a look at the parent");
    assert!(look.url.starts_with(&format!("http://{}/", ancestors[0])));
    assert_eq!(look.headers.get_str("x-dart-held-only"), Some("1"), "a liveness probe");
    h.io(look.id, IoEvent::Connected);
    let wait = crate::engine::probe_wait(h.node.engine().hedge_delay().expect("an estimate"));
    h.advance(wait);
    let backup = peer_sends(&h).pop().expect("the failover");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])), "the grandparent");
    assert_eq!(backup.headers.get_str("x-dart-held-only"), None, "a whole fetch");
    answer_peer(&mut h, &backup, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert!(h.ended(1));
    let s = h.node.stats();
    assert_eq!((s.hedge_probes, s.hedge_probe_failovers, s.hedge_backup_won), (1, 1, 1));
    assert!(h.node.engine().is_slow(&ancestors[0], h.now), "the next blocks ask it last");
    // A parent that answers the look (it does not hold the block: it is fetching it) is alive:
    // the read keeps waiting on it, and no backup goes out without credit.
    let (node, ancestors) = hedging_reader(DEFAULT_HEDGE_RATIO);
    let mut h = Harness::new(node);
    assert!(h.node.engine_mut().try_hedge());
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    h.advance(Duration::from_millis(20));
    let look = peer_sends(&h).pop().expect("a look at the parent");
    h.io(look.id, IoEvent::Connected);
    h.io(look.id, IoEvent::Head { status: 404, headers: Headers::new() });
    h.advance(Duration::from_millis(500));
    let sent = peer_sends(&h);
    assert_eq!(sent.len(), 1, "the look only, no backup without credit: {sent:?}");
    answer_peer(&mut h, &primary, 0);
    assert_eq!(h.body_of(1), content(0, 10).to_vec());
    assert_eq!(h.node.stats().hedge_probes_alive, 1);
}

#[test]
fn a_peer_one_read_found_slow_is_asked_after_the_others_by_the_next_reads() {
    let (node, ancestors) = hedging_reader(0.0);
    let mut h = Harness::new(node);
    let primary = start_block_read(&mut h, &ancestors);
    h.io(primary.id, IoEvent::Connected);
    // The parent never answers: the read times out on it and goes to the grandparent.
    h.advance(Duration::from_secs(10));
    let backup = peer_sends(&h).into_iter().last().expect("a failover");
    assert!(backup.url.starts_with(&format!("http://{}/", ancestors[1])));
    answer_peer(&mut h, &backup, 0);
    assert!(h.ended(1));
    assert!(h.node.engine().is_slow(&ancestors[0], h.now));
    // Another read of the node (block 1, same tree) asks the grandparent first.
    h.outputs.clear();
    h.read(2, Some(&format!("bytes={BLOCK}-{}", BLOCK + 9)));
    let first = peer_sends(&h).remove(0);
    assert!(first.url.starts_with(&format!("http://{}/", ancestors[1])), "{}", first.url);
    // The memory fades: after it, the tree order again.
    h.advance(crate::engine::SLOW_MEMORY);
    assert!(!h.node.engine().is_slow(&ancestors[0], h.now));
}

// ---- The reader tree: JOINs to an object's tracker, routing over the granted readers ----

const TRACKED: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// A node of a six-member chain with the reader tree on, chosen so that the tracker of `URL` is
/// another member; returns it, the tracker's address, and the ranking of `URL`'s block 0 (ids).
fn tracked_reader() -> (Node, String, Vec<String>) {
    let members: Vec<Member> = TRACKED.map(|id| Member::ready(id, &format!("{id}:9000"))).to_vec();
    for me in TRACKED {
        let mut e = engine();
        let key = e.block_key(&e.identify(URL), 0);
        let placement = Placement::new(View::new(members.clone()), me, 1, 1);
        let ranked: Vec<String> =
            placement.ranked(key.chunk).into_iter().map(str::to_owned).collect();
        // Below rank 2, so that the readers' tree and the members' tree give another parent.
        if ranked.iter().position(|id| id == me).is_none_or(|i| i < 3) {
            continue;
        }
        let breaker = Breaker::new(BreakerConfig::default()).expect("breaker");
        e.enable_p2p(P2p { placement, breaker });
        let mut node = node_with(e, me);
        assert!(node.enable_reader_tree(Duration::ZERO));
        if let Some(TrackerHost::Peer(addr)) = node.tracker_host(&node.engine().identify(URL).id) {
            return (node, addr, ranked);
        }
    }
    panic!("no member reads with a peer as its tracker");
}

fn grant_body(readers: &[&str]) -> Bytes {
    let grant = crate::tracker::Grant {
        epoch: 1,
        readers: readers.iter().map(|r| (*r).to_owned()).collect(),
        lease: Duration::from_secs(6),
    };
    Bytes::from(crate::tracker::encode_grant(&grant))
}

fn answer_join(h: &mut Harness, join: &IoRequest, status: u16, body: Bytes) {
    let headers = Headers::new().with("content-length", body.len().to_string());
    h.io(join.id, IoEvent::Connected);
    h.io(join.id, IoEvent::Head { status, headers });
    if status == 200 {
        h.io(join.id, IoEvent::Body(body));
        h.io(join.id, IoEvent::End);
    }
}

#[test]
fn a_reader_joins_its_objects_tracker_and_lays_later_misses_over_the_granted_readers() {
    let (node, tracker, ranked) = tracked_reader();
    let me = node.config().self_id.clone();
    let file = node.engine().identify(URL).id;
    let mut h = Harness::new(node);
    h.read(1, Some("bytes=0-9"));
    let sends = h.take_sends();
    let join = sends.iter().find(|s| s.purpose == Purpose::Tracker).expect("a JOIN").clone();
    let probe = sends.iter().find(|s| s.purpose == Purpose::Probe).expect("a probe").clone();
    assert_eq!(join.url, format!("http://{tracker}/tracker/v1/join"));
    assert_eq!((join.method, join.endpoint), ("POST", Endpoint::Peer));
    let asked = crate::tracker::decode_join(&join.body).expect("a JOIN body");
    assert_eq!(
        (asked.file.as_str(), asked.node.as_str(), asked.ttl_ms),
        (file.as_str(), me.as_str(), 0)
    );
    let c = h.node.counters();
    let counts = (c.tracker_joins, c.tracker_join_ok, c.tracker_join_failed);
    assert_eq!(counts, (1, 0, 0), "a JOIN in flight is neither granted nor failed");
    // The tracker grants a set of two: this node and the best-ranked member, which is not this
    // node's parent over all members (that is the member just above it).
    let best = ranked[0].as_str();
    let all_parent = &ranked[ranked.iter().position(|id| *id == me).expect("ranked") - 1];
    assert_ne!(best, all_parent);
    answer_join(&mut h, &join, 200, grant_body(&[best, &me]));
    h.answer_origin(&probe);
    let fetch = peer_sends(&h).pop().expect("a peer fetch");
    assert!(fetch.url.starts_with(&format!("http://{best}:9000/")), "{}", fetch.url);
    let c = h.node.counters();
    assert_eq!((c.tracker_joins, c.tracker_join_ok, c.tracker_join_failed), (1, 1, 0));
    // Half the lease later the next miss re-JOINs, still routing over the readers meanwhile.
    answer_peer(&mut h, &fetch, 0);
    h.advance(Duration::from_secs(3));
    h.take_sends();
    h.read(2, Some(&format!("bytes={BLOCK}-{}", BLOCK + 9)));
    let sends = h.take_sends();
    assert_eq!(sends.iter().filter(|s| s.purpose == Purpose::Tracker).count(), 1, "a renewal");
    let fetch = sends.iter().find(|s| s.purpose == Purpose::PeerBlock).expect("a peer fetch");
    assert!(fetch.url.starts_with(&format!("http://{best}:9000/")), "{}", fetch.url);
}

#[test]
fn a_join_that_fails_leaves_the_read_on_every_member_and_is_not_retried_at_once() {
    let (node, _, ranked) = tracked_reader();
    let me = node.config().self_id.clone();
    let mut h = Harness::new(node);
    h.read(1, Some("bytes=0-9"));
    let sends = h.take_sends();
    let join = sends.iter().find(|s| s.purpose == Purpose::Tracker).expect("a JOIN").clone();
    let probe = sends.iter().find(|s| s.purpose == Purpose::Probe).expect("a probe").clone();
    answer_join(&mut h, &join, 503, Bytes::new());
    assert!(h.cancelled(join.id));
    assert_eq!(h.node.counters().tracker_join_failed, 1);
    h.answer_origin(&probe);
    let fetch = peer_sends(&h).pop().expect("a peer fetch");
    let parent = &ranked[ranked.iter().position(|id| *id == me).expect("ranked") - 1];
    assert!(fetch.url.starts_with(&format!("http://{parent}:9000/")), "{}", fetch.url);
    // Another read within the 2 s hold-off sends no JOIN; one after it does.
    answer_peer(&mut h, &fetch, 0);
    h.take_sends();
    h.read(2, Some("bytes=0-9"));
    assert!(!h.take_sends().iter().any(|s| s.purpose == Purpose::Tracker));
    h.advance(crate::tracker::RETRY_AFTER);
    h.read(3, Some("bytes=0-9"));
    assert!(h.take_sends().iter().any(|s| s.purpose == Purpose::Tracker));
}

#[test]
fn a_tracker_that_never_answers_is_given_up_at_two_seconds() {
    let (node, _, _) = tracked_reader();
    let mut h = Harness::new(node);
    h.read(1, Some("bytes=0-9"));
    let join = h.take_sends().into_iter().find(|s| s.purpose == Purpose::Tracker).expect("JOIN");
    h.io(join.id, IoEvent::Connected);
    h.advance(Duration::from_millis(1999));
    assert!(!h.cancelled(join.id));
    h.advance(Duration::from_millis(1));
    assert!(h.cancelled(join.id), "the JOIN bound");
    assert_eq!(h.node.counters().tracker_join_failed, 1);
    let reported: Vec<_> = h
        .outputs
        .iter()
        .filter_map(|o| match o {
            Output::Event(Event::TrackerJoinFailed { error, suppressed, .. }) => {
                Some((error.clone(), *suppressed))
            }
            _ => None,
        })
        .collect();
    assert_eq!(reported.len(), 1, "the failure is reported: {reported:?}");
    assert_eq!(reported[0].1, 0);
}

#[test]
fn failed_joins_are_reported_at_most_once_a_minute_with_the_count_held_back() {
    let (node, _, _) = tracked_reader();
    let mut h = Harness::new(node);
    let reports = |h: &Harness| -> Vec<u64> {
        h.outputs
            .iter()
            .filter_map(|o| match o {
                Output::Event(Event::TrackerJoinFailed { suppressed, .. }) => Some(*suppressed),
                _ => None,
            })
            .collect()
    };
    for (i, wait) in [0u64, 3, 3, 60].into_iter().enumerate() {
        h.advance(Duration::from_secs(wait));
        h.read(10 + i as u64, Some("bytes=0-9"));
        let join = h.take_sends().into_iter().find(|s| s.purpose == Purpose::Tracker);
        let join = join.expect("a JOIN after the hold-off");
        answer_join(&mut h, &join, 503, Bytes::new());
    }
    assert_eq!(h.node.counters().tracker_join_failed, 4);
    assert_eq!(reports(&h), vec![0, 2], "the first, then one a minute on naming the two held back");
}

fn post(h: &mut Harness, id: u64, path: &str, body: &str) {
    let request = Inbound {
        method: "POST".into(),
        target: path.into(),
        headers: Headers::new(),
        body: Bytes::from(body.to_owned()),
    };
    h.feed(Input::Request { id: RequestId(id), plane: Plane::Peer, request });
}

#[test]
fn the_peer_listener_serves_joins_and_leaves_only_with_the_reader_tree_on() {
    let mut h = Harness::new(reader_of("p:9000"));
    post(&mut h, 1, "/tracker/v1/join", r#"{"file":"f","node":"x"}"#);
    assert_eq!(status_of(&h, 1), Some(404), "the reader tree is off");
    let mut node = reader_of("p:9000");
    assert!(node.enable_reader_tree(Duration::ZERO));
    let mut h = Harness::new(node);
    post(&mut h, 2, "/tracker/v1/join", r#"{"file":"f","node":"x"}"#);
    let head = h.head_of(2).expect("a head");
    assert_eq!(head.status, 200);
    assert_eq!(head.headers.get_str("x-dart-node"), Some("reader"));
    let grant = crate::tracker::decode_grant(&h.body_of(2)).expect("a grant");
    assert_eq!((grant.epoch, grant.readers.clone()), (1, vec!["x".to_owned()]));
    assert_eq!(h.node.registry().expect("a registry").files(), 1);
    post(&mut h, 3, "/tracker/v1/leave", r#"{"file":"f","node":"x"}"#);
    assert_eq!(h.head_of(3).map(|h| (h.status, h.body)), Some((204, false)));
    assert!(h.ended(3));
    assert_eq!(h.node.registry().expect("a registry").files(), 0);
    post(&mut h, 4, "/tracker/v1/join", "{not json");
    assert_eq!(status_of(&h, 4), Some(400));
    h.get(5, Plane::Peer, "/tracker/v1/join", Headers::new());
    assert_eq!(status_of(&h, 5), Some(405));
    assert_eq!(h.node.live_requests(), 0);
}

#[test]
fn the_tracker_of_its_own_objects_joins_locally_without_an_exchange() {
    let members: Vec<Member> = TRACKED.map(|id| Member::ready(id, &format!("{id}:9000"))).to_vec();
    let e = engine();
    let file = e.identify(URL).id;
    let key = crate::hash::ChunkKey::file_key(e.config().namespace.as_str(), &file);
    let view = View::new(members);
    let tracker = Placement::new(view.clone(), "a", 1, 1).ranked(key)[0].to_owned();
    let mut e = e;
    let placement = Placement::new(view, &tracker, 1, 1);
    e.enable_p2p(P2p { placement, breaker: Breaker::new(BreakerConfig::default()).expect("b") });
    let mut node = node_with(e, &tracker);
    assert!(node.enable_reader_tree(Duration::ZERO));
    assert_eq!(node.tracker_host(&file), Some(TrackerHost::Local));
    let mut h = Harness::new(node);
    h.read(1, Some("bytes=0-9"));
    assert!(!h.sends().iter().any(|s| s.purpose == Purpose::Tracker), "no JOIN exchange");
    let registry = h.node.registry().expect("a registry");
    assert_eq!(registry.files(), 1);
    assert_eq!(h.node.counters().tracker_joins, 1);
}

/// A registry-mode reader (`--registry http://origin`) whose every miss goes to `parent`.
fn registry_reader_of(parent: &str) -> Node {
    let mut node = reader_of(parent);
    let registry = crate::registry::Registry::new("http://origin").expect("upstream");
    node.config.mode = UpstreamMode::Registry { registry, prefix: "dart".into() };
    node
}

/// The registry path of the test object ([`content`] of [`SIZE`] bytes) named by its digest.
fn blob_target() -> String {
    let digest = crate::registry::sha256_digest(&content(0, SIZE));
    format!("/v2/lib/app/blobs/{digest}")
}

/// Answers every peer block fetch with the right length and one flipped byte.
fn serve_lies(h: &mut Harness) -> usize {
    let mut lies = 0;
    loop {
        let sends: Vec<IoRequest> =
            h.take_sends().into_iter().filter(|r| r.endpoint == Endpoint::Peer).collect();
        if sends.is_empty() {
            return lies;
        }
        for r in sends {
            let block: u64 = r.url.rsplit('/').next().and_then(|b| b.parse().ok()).expect("block");
            let len = BLOCK.min(SIZE - block * BLOCK);
            let mut bytes = content(block * BLOCK, len).to_vec();
            bytes[0] ^= 0x5a;
            let head = Headers::new().with("content-length", len.to_string());
            h.io(r.id, IoEvent::Connected);
            h.io(r.id, IoEvent::Head { status: 200, headers: head });
            h.io(r.id, IoEvent::Body(Bytes::from(bytes)));
            h.io(r.id, IoEvent::End);
            lies += 1;
        }
    }
}

#[test]
fn a_blob_that_fails_its_digest_through_a_lying_peer_is_read_from_the_origin_next_time() {
    let mut h = Harness::new(registry_reader_of("p:9000"));
    let target = blob_target();
    h.get(1, Plane::Client, &target, Headers::new());
    let probe = h.take_sends().remove(0);
    assert_eq!(probe.endpoint, Endpoint::Origin);
    assert!(probe.url.starts_with("http://origin/v2/lib/app/blobs/sha256:"), "{}", probe.url);
    h.answer_origin(&probe);
    let lies = serve_lies(&mut h);
    assert_eq!(lies, 4, "every block came from the lying parent");
    let head = h.head_of(1).expect("a head");
    assert_eq!(head.status, 200);
    let digest = target.rsplit('/').next().expect("digest");
    assert_eq!(head.headers.get_str("docker-content-digest"), Some(digest));
    assert!(h.aborted(1) && !h.ended(1), "the response fails instead of ending");
    let sealed = h.outputs.iter().any(|o| matches!(o, Output::Seal { id } if id.0 == 1));
    let hashed = h.outputs.iter().any(|o| matches!(o, Output::Hash { id, .. } if id.0 == 1));
    assert!(hashed && sealed, "the transport hashed the parts, holding the last for the verdict");
    assert_eq!(h.node.counters().blob_digest_mismatches, 1);
    assert!(h.store.is_empty(), "every cached block of the blob was dropped");
    assert_eq!(h.node.stats().objects_distrusted, 1);

    // The client's retry: every block from the origin (the peer is not asked), and verified.
    h.outputs.clear();
    h.get(2, Plane::Client, &target, Headers::new());
    assert!(h.sends().iter().all(|r| r.endpoint == Endpoint::Origin), "{:?}", h.sends());
    h.serve_origin();
    assert!(h.ended(2));
    assert_eq!(h.body_of(2), content(0, SIZE).to_vec());
    assert_eq!(h.node.counters().blob_digests_verified, 1);

    // Ten minutes on, the peer path is back.
    h.advance(crate::engine::DISTRUST_MEMORY);
    assert!(!h.node.engine().peers_distrusted(&h.node.engine().identify(&probe.url).id, h.now));
}

#[test]
fn a_ranged_registry_read_is_served_unchecked_and_a_head_names_the_digest() {
    let mut h = Harness::new(registry_reader_of("p:9000"));
    let target = blob_target();
    h.get(1, Plane::Client, &target, Headers::new().with("range", "bytes=0-9"));
    let probe = h.take_sends().remove(0);
    h.answer_origin(&probe);
    let lies = serve_lies(&mut h);
    assert_eq!(lies, 1);
    assert!(h.ended(1), "a range cannot be checked: served");
    assert_eq!(h.head_of(1).expect("head").status, 206);
    assert_eq!(h.node.counters().blob_digest_mismatches, 0);
}

// ---- The invariant check compares the timer indexes with what they bound ----

/// The panic message of `check` on `node`, if it panicked.
fn check_fails(node: &Node) -> Option<String> {
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node.check_invariants()));
    run.err().map(|p| super::panic_message(&*p))
}

#[test]
fn the_invariant_check_catches_a_timer_index_out_of_step_with_its_exchanges_and_requests() {
    let mut h = Harness::new(reader_hedging_to_origin());
    let (peer, ask) = hedge_probe_of_the_root(&mut h);
    h.io(ask.id, IoEvent::Connected);
    assert_eq!(check_fails(&h.node), None);
    let timers = h.node.timers.clone();
    let deadline = |io: IoId| timers.iter().find(|t| t.1 == io).expect("a deadline").0;
    let (a, b) = (deadline(peer.id), deadline(ask.id));
    assert_ne!(a, b, "two exchanges due at different instants");
    // The two exchanges' deadlines swapped in the index: same size, same instants, same ids.
    h.node.timers.remove(&(a, peer.id));
    h.node.timers.remove(&(b, ask.id));
    h.node.timers.insert((b, peer.id));
    h.node.timers.insert((a, ask.id));
    let message = check_fails(&h.node).expect("swapped deadlines are caught");
    assert!(message.contains("timer index out of step for"), "{message}");
    // A deadline missing, and a stale one beside the right ones.
    h.node.timers = timers.clone();
    h.node.timers.remove(&(a, peer.id));
    assert!(check_fails(&h.node).is_some_and(|m| m.contains("timer index out of step")));
    h.node.timers = timers.clone();
    h.node.timers.insert((a + Duration::from_millis(1), peer.id));
    assert!(check_fails(&h.node).is_some_and(|m| m.contains("a stale one")));
    h.node.timers = timers;
    assert_eq!(check_fails(&h.node), None);
    // A request's bound not armed, and a timer for a request that has no such bound.
    let rid = RequestId(1);
    let hedges = h.node.hedge_timers.clone();
    let answers = h.node.answer_timers.clone();
    let first = *hedges.iter().next().expect("the read's next hedge is armed");
    h.node.hedge_timers.remove(&first);
    let message = check_fails(&h.node).expect("an unarmed hedge is caught");
    assert!(message.contains("hedge timer not armed"), "{message}");
    h.node.hedge_timers = hedges;
    h.node.answer_timers.insert((h.now + Duration::from_secs(9), rid));
    let message = check_fails(&h.node).expect("a stale answer-by timer is caught");
    assert!(message.contains("answer-by timer"), "{message}");
    h.node.answer_timers = answers;
    assert_eq!(check_fails(&h.node), None);
}
