//! Inbound requests on the client plane and the reads that serve them: the response heads, flow
//! control, cancellation, store answers and the verbatim passthrough of Range-blind origins.

use super::exchange::{Expiry, Job};
use super::flights::Fill;
use super::io::{
    BlockSource, Endpoint, Event, Head, Headers, Inbound, IoError, IoEvent, IoId, Output, Plane,
    RequestId, StoreOp,
};
use super::{Node, BODY_WINDOW, REQUESTS_MAX};
use crate::codec::redact::redact_url;
use crate::codec::wire::HEADER_NODE;
use crate::engine::flight::{FlightId, FlightKey};
use crate::engine::origin::OriginError;
use crate::engine::resolve::{ResolveError, UpstreamMode};
use crate::engine::{Action, Method, Preconditions, Read, ReadRequest, ResponseHead};
use crate::hash::BlockKey;
use crate::registry::{DigestAlgorithm, Route};
use crate::time::Instant;
use bytes::Bytes;

/// Client header fields a passthrough forwards to the origin (spec/fetch.md §6), and the
/// credential every origin exchange of a client read carries.
const FORWARDED: [&str; 4] = ["range", "if-range", "accept", "authorization"];
/// Origin header fields a passthrough copies to the client.
const PASSTHROUGH_HEADERS: [&str; 7] = [
    "content-type",
    "content-length",
    "content-range",
    "etag",
    "last-modified",
    "cache-control",
    "accept-ranges",
];

/// Request header fields a registry proxy forwards upstream (spec/node.md §3): content
/// negotiation (a manifest's media types), the client's credential, conditionals and ranges.
const PROXIED: [&str; 9] = [
    "accept",
    "authorization",
    "range",
    "if-range",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "user-agent",
];
/// Response header fields a registry proxy never copies: hop-by-hop fields (RFC 9110 §7.6.1),
/// which describe the upstream connection, not the resource.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A registry-mode request's role (spec/node.md §3, [`crate::registry`]).
#[derive(Debug)]
pub(super) enum Mirror {
    /// A blob read through the engine: its head names the digest (`Docker-Content-Digest`),
    /// and a whole `GET` (a `200`) is checked against it: the transport hashes the parts as it
    /// writes them, holding the last one back ([`Output::Hash`]), and the verdict is taken here
    /// when the transport reports the digest ([`Input::Sealed`]).
    Blob {
        /// The digest of the path.
        digest: String,
        /// The value a whole read's bytes must hash to, from the head of a `200` on.
        expected: Option<Vec<u8>>,
    },
    /// Proxied to the upstream: its head is copied but for hop-by-hop fields.
    Proxy,
}

/// What a request is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// Nothing: its read has actions to carry out (or is paused by the body window).
    Ready,
    /// A store look-up.
    Store(StoreOp),
    /// An origin flight's result.
    Flight(FlightId),
    /// Its own uncoalesced origin exchange.
    Alone(IoId),
    /// A credential check of the object it needs the size of, in place of its own probe
    /// ([`Node::join_check`]).
    Check(super::access::Credential),
    /// Its peer block exchanges in flight, by [`crate::engine::Contender::index`] (a primary,
    /// and a hedge raced beside it); at least one is set.
    Peers([Option<IoId>; 2]),
    /// A passthrough exchange (its head, then its piped body).
    Pipe(IoId),
    /// The transport's digest of a checked response ([`Output::Seal`]), every part handed over.
    Seal,
}

/// One live request.
pub(super) struct Request {
    pub plane: Plane,
    pub method: Method,
    pub read: Read,
    pub wait: Wait,
    /// Body parts out that the transport has not taken yet.
    pub window: u32,
    pub head_sent: bool,
    /// The requester went away; the request runs on only to fill the cache (a cut-through relay
    /// mid-stream), with every response part suppressed.
    pub cancelled: bool,
    /// A read-ahead read: nobody asked for it (it is `cancelled` from the start, so nothing
    /// goes out), and it runs to its end to fill the cache.
    pub background: bool,
    /// Client header fields a passthrough forwards.
    pub forward: Headers,
    /// When the body window filled and the requester has not taken a part since.
    pub stalled_at: Option<Instant>,
    /// A block the flight that delivered it already offered to the store (the read's own
    /// `Store` of it is not repeated).
    pub filled: Option<crate::hash::BlockKey>,
    /// It joined an origin flight late and asked the origin again when that flight found it
    /// unavailable (`Node::publish`): it does so once.
    pub origin_asked_again: bool,
    /// When its primary peer fetch may be hedged ([`crate::engine::PeerAsk::hedge_after`]).
    pub hedge_at: Option<Instant>,
    /// A relay's requester's head budget (`X-DART-Budget-Ms`).
    pub budget: Option<std::time::Duration>,
    /// A relay's requester's body progress bound (`X-DART-Progress-Ms`).
    pub progress: Option<std::time::Duration>,
    /// When a relay that has not committed its head answers `504` + upstream `504` instead.
    pub answer_by: Option<Instant>,
    /// The member a relay serves (its `X-DART-Node`): a relay never waits on a fetch that
    /// asks that member, which would wait on this relay in turn.
    pub requester: Option<String>,
    /// Its registry-mode role.
    pub mirror: Option<Mirror>,
    /// A client read that another read of its object ran beside on this node (a peer's relay,
    /// another client's read), at any time since it began: it is not a lone stream, so origin
    /// read-ahead stays off unless the origin is latency-bound ([`Node::origin_ahead`]).
    pub shared: bool,
    /// A client read that another client's read of its object ran beside on this node at any
    /// time since it began: origin read-ahead stays off ([`Node::origin_ahead`]).
    pub crowded: bool,
}

/// What a relay's requester said of itself on its peer request.
#[derive(Debug, Clone, Default)]
pub struct Requester {
    /// Its member name (`X-DART-Node`).
    pub name: Option<String>,
    /// How long it waits for our response head (`X-DART-Budget-Ms`).
    pub budget: Option<std::time::Duration>,
    /// How long it lets our body stand still (`X-DART-Progress-Ms`).
    pub progress: Option<std::time::Duration>,
}

impl Wait {
    /// The peer exchanges this wait holds.
    pub fn peers(self) -> impl Iterator<Item = IoId> {
        match self {
            Wait::Peers(slots) => slots.into_iter().flatten(),
            _ => [None, None].into_iter().flatten(),
        }
    }
}

impl Request {
    /// Disarms this request's (`rid`'s) early-answer bound, if armed, in `timers`.
    fn disarm_answer(
        &mut self,
        timers: &mut std::collections::BTreeSet<(Instant, RequestId)>,
        rid: RequestId,
    ) {
        if let Some(at) = self.answer_by.take() {
            timers.remove(&(at, rid));
        }
    }

    /// A request about to be driven, waiting for nothing yet.
    pub fn new(plane: Plane, method: Method, read: Read, forward: Headers) -> Self {
        Request {
            plane,
            method,
            read,
            wait: Wait::Ready,
            window: 0,
            head_sent: false,
            cancelled: false,
            background: false,
            forward,
            stalled_at: None,
            filled: None,
            origin_asked_again: false,
            hedge_at: None,
            budget: None,
            progress: None,
            answer_by: None,
            requester: None,
            mirror: None,
            shared: false,
            crowded: false,
        }
    }

    pub fn check(&self, rid: RequestId) {
        assert!(self.window <= BODY_WINDOW, "{rid}: body window overrun");
        if self.cancelled && !self.background {
            assert!(matches!(self.wait, Wait::Peers(_) | Wait::Ready), "{rid}: cancelled but held");
        }
        assert!(!self.background || self.cancelled, "{rid}: a read-ahead answers nobody");
        if let Wait::Peers(slots) = self.wait {
            assert!(slots.iter().any(Option::is_some), "{rid}: waits on no peer");
        }
    }
}

impl Node {
    pub(super) fn on_request(
        &mut self,
        id: RequestId,
        plane: Plane,
        request: Inbound,
        now: Instant,
    ) {
        assert!(!self.requests.contains_key(&id), "request id {id} reused while live");
        assert!(id.0 < super::NODE_REQUEST_IDS, "request id {id} is reserved for the node");
        self.counters.requests += 1;
        if self.live_requests() >= REQUESTS_MAX {
            self.counters.overloaded += 1;
            return self.reply(id, plane, 503, "dart: too many requests", Headers::new());
        }
        match plane {
            Plane::Client => self.client_request(id, request, now),
            Plane::Peer => self.peer_request(id, request, now),
        }
    }

    fn client_request(&mut self, id: RequestId, request: Inbound, now: Instant) {
        let method = match request.method.as_str() {
            "GET" => Method::Get,
            "HEAD" => Method::Head,
            _ => {
                let allow = Headers::new().with("allow", "GET, HEAD");
                return self.reply(id, Plane::Client, 405, "dart: method not allowed", allow);
            }
        };
        let mut mirror = None;
        let url = match &self.config.mode {
            UpstreamMode::Registry { registry, .. } => match registry.route(&request.target) {
                Route::Blob { url, digest } => {
                    mirror = Some(Mirror::Blob { digest, expected: None });
                    url
                }
                Route::Proxy { url } => return self.proxy(id, method, url, &request.headers, now),
                Route::NotFound => match self.config.mode.resolve(&request.target) {
                    Ok(url) => url, // the prefix API beside the mirror
                    Err(e @ ResolveError::NotRegistry(_)) => {
                        let message = format!("dart: {e}");
                        return self.reply(id, Plane::Client, 404, &message, Headers::new());
                    }
                    Err(e) => {
                        let message = format!("dart: {e}");
                        return self.reply(id, Plane::Client, 400, &message, Headers::new());
                    }
                },
            },
            mode => match mode.resolve(&request.target) {
                Ok(url) => url,
                Err(e) => {
                    let message = format!("dart: {e}");
                    return self.reply(id, Plane::Client, 400, &message, Headers::new());
                }
            },
        };
        let range = request.headers.get("range").map(<[u8]>::to_vec);
        let field = |name| request.headers.get(name).map(<[u8]>::to_vec);
        let conditions = Preconditions {
            if_match: field("if-match"),
            if_none_match: field("if-none-match"),
            if_modified_since: field("if-modified-since"),
            if_unmodified_since: field("if-unmodified-since"),
            if_range: field("if-range"),
        };
        let mut forward = Headers::new();
        for name in FORWARDED {
            if let Some(v) = request.headers.get(name) {
                forward.push(name, v);
            }
        }
        if let Some(refusal) = self.upstream_refusal(&url) {
            return self.refuse_upstream(id, refusal);
        }
        let read = ReadRequest { url, method, range, conditions };
        self.gate(id, read, method, forward, mirror, now);
    }

    /// Answers `403` for an upstream the policy refuses.
    fn refuse_upstream(&mut self, id: RequestId, refusal: crate::policy::Refusal) {
        let message = format!("dart: upstream refused ({refusal}): {}", refusal.explain());
        let extra = Headers::new().with("x-dart-refused", refusal.label());
        self.reply(id, Plane::Client, 403, &message, extra);
    }

    /// A registry request that is not a blob: proxied to `url` with the client's credential,
    /// content negotiation and conditionals, its answer copied back whatever its status.
    fn proxy(
        &mut self,
        id: RequestId,
        method: Method,
        url: String,
        client: &Headers,
        now: Instant,
    ) {
        if let Some(refusal) = self.upstream_refusal(&url) {
            return self.refuse_upstream(id, refusal);
        }
        let mut forward = Headers::new();
        for name in PROXIED {
            if let Some(v) = client.get(name) {
                forward.push(name, v);
            }
        }
        forward.push("x-forwarded-proto", "http");
        if let Some(host) = client.get("host") {
            forward.push("x-forwarded-host", host);
        }
        let read = self.engine.begin_proxy(url, method);
        let request = Request {
            mirror: Some(Mirror::Proxy),
            ..Request::new(Plane::Client, method, read, forward)
        };
        self.admit_request(id, request, now);
    }

    /// Registers a request with its read and drives it; a relay with what its requester said
    /// of itself.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit(
        &mut self,
        id: RequestId,
        plane: Plane,
        method: Method,
        read: Read,
        forward: Headers,
        requester: Requester,
        now: Instant,
    ) {
        let Requester { name, budget, progress } = requester;
        let answer_by = budget.map(|b| {
            let at = now.saturating_add(b.saturating_sub(super::exchange::budget_margin(b) / 2));
            self.answer_timers.insert((at, id));
            at
        });
        let request = Request {
            budget,
            progress,
            answer_by,
            requester: name,
            ..Request::new(plane, method, read, forward)
        };
        self.admit_request(id, request, now);
    }

    /// Registers `request` as `id` and drives it. A relay or client read marks the live client
    /// reads of its object `shared`, and a client read marks them `crowded` too; a client read
    /// begun beside a live read of its object starts `shared`, and beside a live client read
    /// `crowded` (read-ahead reads aside in both).
    pub(super) fn admit_request(&mut self, id: RequestId, mut request: Request, now: Instant) {
        let object = &request.read.object().id;
        let client = request.plane == Plane::Client;
        let (mut beside, mut beside_client) = (false, false);
        for r in self.requests.values_mut() {
            if !r.background && r.read.object().id == *object {
                beside = true;
                if r.plane == Plane::Client {
                    beside_client = true;
                    r.shared = true;
                    r.crowded |= client;
                }
            }
        }
        if client {
            request.shared = beside;
            request.crowded = beside_client;
        }
        self.requests.insert(id, Box::new(request));
        self.working.push(id);
        self.drive(id, now);
        self.working.pop();
    }

    /// A complete small answer (errors, declines): head, body, end.
    pub(super) fn reply(
        &mut self,
        id: RequestId,
        plane: Plane,
        status: u16,
        message: &str,
        extra: Headers,
    ) {
        let body = Bytes::from(format!("{message}\n"));
        let mut headers = Headers::new().with("content-type", "text/plain; charset=utf-8");
        for (name, value) in extra.iter() {
            headers.push(name, value);
        }
        self.respond_whole(id, plane, status, headers, body);
    }

    /// Answers request `id` on `plane` with a whole response: `headers` plus `Content-Length`
    /// (none on a `204`, which has no body) and, on the peer plane, `X-DART-Node`.
    pub(super) fn respond_whole(
        &mut self,
        id: RequestId,
        plane: Plane,
        status: u16,
        mut headers: Headers,
        body: Bytes,
    ) {
        let has_body = status != 204;
        debug_assert!(has_body || body.is_empty(), "a 204 has no body");
        if has_body {
            headers.push("content-length", body.len().to_string());
        }
        self.name_self(plane, &mut headers);
        self.emit(Output::Respond { id, head: Head { status, headers, body: has_body } });
        if !body.is_empty() {
            self.emit(Output::Body { id, data: body });
        }
        self.emit(Output::End { id });
    }

    /// Adds `X-DART-Node` to a peer-plane response.
    pub(super) fn name_self(&self, plane: Plane, headers: &mut Headers) {
        if plane == Plane::Peer && !self.config.self_id.is_empty() {
            headers.push(HEADER_NODE, self.config.self_id.as_str());
        }
    }

    /// Carries out request `rid`'s actions until it waits, pauses on its body window, or ends.
    pub(super) fn drive(&mut self, rid: RequestId, now: Instant) {
        loop {
            let Some(req) = self.requests.get_mut(&rid) else { return };
            if req.window >= BODY_WINDOW {
                return; // resumed by Input::Drained
            }
            let Some(action) = req.read.poll_action() else { break };
            self.act(rid, action, now);
        }
        if let Some(req) = self.requests.get(&rid) {
            assert_ne!(req.wait, Wait::Ready, "request {rid} waits for nothing");
        }
    }

    fn act(&mut self, rid: RequestId, action: Action, now: Instant) {
        let req = self.requests.get_mut(&rid).expect("a driven request");
        if req.cancelled && !req.background && asks(&action) {
            // Nobody waits for this request any more: it ends instead of asking anything else,
            // and leaves what it still races (a relay asked again beside a backup in flight).
            let req = self.take_request(rid).expect("a driven request");
            if let Action::FetchPeer(ask) = action {
                self.engine.abandon(ask.permit, now);
            }
            if let Wait::Peers(slots) = req.wait {
                for io in slots.into_iter().flatten() {
                    self.leave_exchange(io, rid, now);
                }
            }
            return;
        }
        match action {
            Action::Probe { url } => {
                if !self.join_check(rid, &url) {
                    self.probe_origin(rid, url, now);
                }
            }
            Action::Passthrough { url } => self.start_passthrough(rid, url, now),
            Action::Respond(head) => {
                req.head_sent = true;
                // Answered: the early-answer bound has nothing left to do.
                req.disarm_answer(&mut self.answer_timers, rid);
                let mut hash = None;
                let head = match req.plane {
                    Plane::Client => {
                        let mut client = client_head(&head, req.method);
                        if let Some(Mirror::Blob { digest, expected }) = req.mirror.as_mut() {
                            hash =
                                mirror_blob_head(&mut client, &head, req.method, digest, expected);
                        }
                        client
                    }
                    Plane::Peer => self.relay_head(&head),
                };
                self.send_requester(rid, Output::Respond { id: rid, head });
                if let Some(algorithm) = hash {
                    self.send_requester(rid, Output::Hash { id: rid, algorithm });
                }
            }
            Action::Lookup { key, window } => {
                if let Some(block) = self.held_block(&key, window) {
                    // Answered here: the read goes on in the loop that drives it.
                    self.counters.held_hits += 1;
                    self.looked_up(rid, key, Some(block), now);
                    return;
                }
                let op = self.next_store_op();
                let unversioned = self.recovered.contains(&key);
                self.store_ops.insert(op, (rid, key, unversioned, window.is_none()));
                self.requests.get_mut(&rid).expect("a driven request").wait = Wait::Store(op);
                self.emit(Output::StoreGet { op, key, window });
            }
            Action::FetchPeer(ask) => {
                let crate::engine::PeerAsk {
                    contender,
                    hedge_after,
                    peer,
                    key,
                    url,
                    held_only,
                    hop,
                    expected_len,
                    permit,
                    told,
                    cut_through,
                } = *ask;
                let expected = expected_len;
                let told = told.map(|told| *told);
                let fetch = super::peer::PeerFetch { key, url, hop, expected, held_only, told };
                self.fetch_peer(
                    rid,
                    contender,
                    peer.id,
                    peer.addr,
                    fetch,
                    permit,
                    cut_through,
                    now,
                );
                if let Some(delay) = hedge_after {
                    let at = now.saturating_add(delay);
                    let req = self.requests.get_mut(&rid).expect("a driven request");
                    if let Some(old) = req.hedge_at.replace(at) {
                        self.hedge_timers.remove(&(old, rid));
                    }
                    self.hedge_timers.insert((at, rid));
                }
                if contender == crate::engine::Contender::Primary {
                    let n = self.peer_ahead(rid).max(self.engine.config().read_ahead);
                    self.read_ahead(rid, n, now);
                }
            }
            Action::CancelPeer { contender, run_on } => {
                self.cancel_peer(rid, contender, run_on, now)
            }
            Action::FillFromOrigin { key } => self.fill_from_origin(rid, key, now),
            Action::Learn { key, url } => self.learn_object(rid, key, url, now),
            Action::FetchOrigin { key, url, start, end, expected_len, object_size, class } => {
                let id = req.read.object().id.clone();
                let fill = Fill::Block { key, expected: expected_len, size: object_size, class };
                self.ask_origin(rid, FlightKey::Block(id, start, end), url, fill, now);
                let n = self.origin_ahead(rid).max(self.engine.config().read_ahead);
                self.read_ahead(rid, n, now);
                self.relay_ahead(rid, key, object_size, now);
            }
            Action::Store { key, data, class } => {
                if req.filled.take() == Some(key) {
                    return; // the flight's fill offered it already
                }
                // Only the version the node reads now is cached.
                let read = &self.requests[&rid].read;
                if self.may_store(read.object(), read.version()) {
                    self.store_put(key, data, class);
                }
            }
            Action::StoreWhenConfirmed { key, data, class, told } => {
                let object = self.requests[&rid].read.object().clone();
                self.park(super::Parked { object, key, data, class, told: *told });
            }
            Action::Emit(data) => {
                if !req.cancelled {
                    req.window += 1;
                    if req.window >= BODY_WINDOW {
                        let at = now.saturating_add(self.config.bounds.write_stall);
                        req.stalled_at = Some(at);
                        self.stall_timers.insert((at, rid));
                    }
                    self.emit(Output::Body { id: rid, data });
                }
            }
            Action::Finish => {
                if matches!(req.mirror, Some(Mirror::Blob { expected: Some(_), .. }))
                    && !req.cancelled
                {
                    // Every byte is with the transport; the last part waits for the verdict.
                    req.wait = Wait::Seal;
                    return self.emit(Output::Seal { id: rid });
                }
                let req = self.take_request(rid).expect("a driven request");
                if !req.cancelled {
                    if req.plane == Plane::Peer {
                        // A relay's block ends with its digest (crate::integrity). One from
                        // the store matched the digest it was stored with already
                        // (check_held), and is not hashed again (digest_of).
                        let block = req.read.served_block().expect("a relay finishes served");
                        let footer = self.digest_of(block).footer();
                        self.emit(Output::Body { id: rid, data: footer });
                    }
                    self.emit(Output::End { id: rid });
                }
            }
            Action::Fail(f) => {
                let req = self.take_request(rid).expect("a driven request");
                let error = f.error.to_string();
                let (status, committed) = (f.status, f.committed);
                // A relay that does not hold a block (a neighbour's held-only ask, a declined
                // relay) answered a question: not a failure to report.
                let answered = req.plane == Plane::Peer && status == 404 && !committed;
                if !answered {
                    let error = error.clone();
                    self.event(Event::Failed { request: rid, status, committed, error });
                }
                if req.cancelled {
                    return;
                }
                if committed {
                    self.emit(Output::Abort { id: rid });
                } else {
                    let mut extra = Headers::new();
                    if let Some(up) = f.upstream_status {
                        extra.push(crate::codec::wire::HEADER_UPSTREAM_STATUS, up.to_string());
                    }
                    match &f.error {
                        crate::engine::ReadError::Origin(OriginError::Refused(r)) => {
                            extra.push("x-dart-refused", r.label());
                        }
                        crate::engine::ReadError::Origin(OriginError::Status {
                            status: 401,
                            challenge: Some(c),
                        }) if req.plane == Plane::Client => {
                            extra.push("www-authenticate", c.as_str());
                        }
                        _ => {}
                    }
                    self.reply(rid, req.plane, status, &format!("dart: {error}"), extra);
                }
            }
        }
    }

    /// How many blocks ahead client read `rid`, whose miss goes to the origin, acquires by
    /// [`EngineConfig::origin_read_ahead`], once it has sent its head (it is past its first
    /// block: a sequential read):
    /// - alone on this node with its object: that many;
    /// - beside a peer's relay of its object (`shared`; a tree root with children reading):
    ///   that many only while its origin is latency-bound (the last block window that host
    ///   sent this node: its transfer, times the windows that would be in flight, fits in its
    ///   wait for the head: [`OriginPace::latency_bound`]), else none. A subtree's cut-through
    ///   streams leave at the rate this node's origin window arrives, and windows ahead sharing
    ///   a busy origin link slow that window and starve them (the `herd-narrow-links` scenario:
    ///   herd p99 from 1.14x to 1.56x one solo read when the root read ahead). Where each window
    ///   waits on the origin's latency far longer than its bytes take, a read that does not read
    ///   ahead paces every reader behind it at one round trip per block: the `herd` scenario at
    ///   test scale (128 KiB blocks, 20 ms origin) ran every reader at twice the root's read
    ///   alone;
    /// - beside another client's read of its object (`crowded`): none, whatever the origin.
    ///   Readers spread over the object each keep their own windows ahead, so many more blocks
    ///   are in flight at once (64 readers of one 1 GiB object, two herds: peak RSS 340 and
    ///   381 MiB without, 419 and 734 MiB with; docs/benchmarks.md, "Read-ahead at the origin").
    ///
    /// [`EngineConfig::origin_read_ahead`]: crate::engine::EngineConfig::origin_read_ahead
    /// [`OriginPace::latency_bound`]: super::flights::OriginPace::latency_bound
    fn origin_ahead(&self, rid: RequestId) -> usize {
        let n = self.engine.config().origin_read_ahead;
        let Some(req) = self.requests.get(&rid) else { return 0 };
        let latency_bound = self.origin_latency_bound(req.read.url(), n);
        if !req.head_sent || req.crowded || (req.shared && !latency_bound) {
            0
        } else {
            n
        }
    }

    /// How many blocks ahead client read `rid`, whose miss goes to its tree, acquires by
    /// [`EngineConfig::origin_read_ahead`]: that many while the tree is latency-bound (the last
    /// peer fetch of this node that held its block waited 10 ms or more for its head, far longer
    /// than its bytes took: a cold tree, whose root waits on the origin for each block), and
    /// no other client's read of its object runs beside it here; else none. One block at a
    /// time through a cold tree costs a read one origin round trip per block.
    ///
    /// [`EngineConfig::origin_read_ahead`]: crate::engine::EngineConfig::origin_read_ahead
    fn peer_ahead(&self, rid: RequestId) -> usize {
        let n = self.engine.config().origin_read_ahead;
        let Some(req) = self.requests.get(&rid) else { return 0 };
        let bound = self.peer_pace.is_some_and(|p| p.latency_bound(n));
        if req.crowded || !bound {
            0
        } else {
            n
        }
    }

    /// Client read `rid` missed a block: the next `n` blocks of its range
    /// ([`EngineConfig::read_ahead`] for any miss, or [`Node::origin_ahead`] when the miss went
    /// to the origin, whichever is larger) are acquired now by read-ahead reads (relay reads of
    /// this node that answer nobody), so that hop and origin latency overlap the transfer of the
    /// block being served. Each takes the path a miss takes (its tree ancestors, then the origin,
    /// with the read's own credential) and fills the cache; the read then finds each block in
    /// the store, or joins the peer fetch or origin flight still under way. Nothing starts for a
    /// block a read-ahead already acquires, nor while half of [`super::REQUESTS_MAX`] requests
    /// are live.
    ///
    /// [`EngineConfig::read_ahead`]: crate::engine::EngineConfig::read_ahead
    /// [`EngineConfig::origin_read_ahead`]: crate::engine::EngineConfig::origin_read_ahead
    fn read_ahead(&mut self, rid: RequestId, n: usize, now: Instant) {
        let Some(req) = self.requests.get(&rid) else { return };
        if n == 0 || req.plane != Plane::Client || req.background {
            return;
        }
        let blocks = req.read.blocks_ahead(n);
        self.start_ahead(rid, blocks, now);
    }

    /// Peer relay `rid`, whose miss of block `key` (of an object of `size` bytes) goes to the
    /// origin, acquires the next [`EngineConfig::origin_read_ahead`] blocks of the object by
    /// read-ahead reads, as a client read's miss does ([`Node::read_ahead`]), when:
    /// - the relay continues a stream: this node was asked to fetch the block before it lately
    ///   ([`Node::relayed`]), so its requesters read the object in order, and a random reader
    ///   costs the origin no windows nobody asked for;
    /// - its origin is latency-bound ([`OriginPace::latency_bound`]): windows ahead overlap its
    ///   wait for the head instead of slowing the window the subtree's streams follow (the
    ///   reason a shared client read reads ahead only then, [`Node::origin_ahead`]).
    ///
    /// Only blocks of the same chunk: the next chunk's tree has another root, which its readers
    /// ask. Without this a tree root that relays the object and reads none of it asks the origin
    /// for one window per round trip, and every reader in its tree follows at that pace.
    ///
    /// [`EngineConfig::origin_read_ahead`]: crate::engine::EngineConfig::origin_read_ahead
    /// [`OriginPace::latency_bound`]: super::flights::OriginPace::latency_bound
    fn relay_ahead(&mut self, rid: RequestId, key: BlockKey, size: u64, now: Instant) {
        let Some(req) = self.requests.get(&rid) else { return };
        let n = self.engine.config().origin_read_ahead;
        if n == 0 || req.plane != Plane::Peer || req.background {
            return;
        }
        if !self.origin_latency_bound(req.read.url(), n) {
            return;
        }
        let follows =
            |k: &BlockKey| k.chunk == key.chunk && k.block.checked_add(1) == Some(key.block);
        if !self.relayed.iter().any(follows) {
            return;
        }
        let geometry = self.engine.config().geometry;
        let (count, chunk) = (geometry.block_count(size), geometry.chunk_of_block(key.block));
        let blocks = (key.block.saturating_add(1)..count)
            .take(n)
            .filter(|&b| geometry.chunk_of_block(b) == chunk)
            .collect();
        self.start_ahead(rid, blocks, now);
    }

    /// Peers asked this node to fetch block `key` on their behalf ([`Node::relayed`]).
    pub(super) fn note_relayed(&mut self, key: BlockKey) {
        if self.relayed.contains(&key) {
            return;
        }
        if self.relayed.len() == super::RELAYED_MEMO {
            self.relayed.pop_front();
        }
        self.relayed.push_back(key);
    }

    /// Starts a read-ahead read, with the URL and credential of request `rid`, for each of
    /// `blocks` of its object that no read-ahead acquires yet, while fewer than
    /// [`super::READ_AHEAD_LIVE_MAX`] requests are live.
    fn start_ahead(&mut self, rid: RequestId, blocks: Vec<u64>, now: Instant) {
        let Some(req) = self.requests.get(&rid) else { return };
        if blocks.is_empty() {
            return;
        }
        let (object, url, forward) =
            (req.read.object().clone(), req.read.url().to_owned(), req.forward.clone());
        let requests = &self.requests;
        self.ahead.retain(|_, id| requests.contains_key(id));
        for block in blocks {
            if self.live_requests() >= super::READ_AHEAD_LIVE_MAX {
                return;
            }
            let key = self.engine.block_key(&object, block);
            if self.ahead.contains_key(&key) {
                continue;
            }
            let id = RequestId(self.next_ahead);
            self.next_ahead += 1;
            self.ahead.insert(key, id);
            self.counters.read_ahead += 1;
            let read = self.engine.begin_read_ahead(key, url.clone());
            let request = Request {
                cancelled: true,
                background: true,
                ..Request::new(Plane::Peer, Method::Get, read, forward.clone())
            };
            self.requests.insert(id, Box::new(request));
            self.isolated(now, |node| {
                node.working.push(id);
                node.drive(id, now);
                node.working.pop();
            });
        }
    }

    /// A read-ahead read acquired block `key` from `source`: the client read that finds it in
    /// the store counts that source (`on_store`). The oldest record goes past
    /// [`super::READ_AHEAD_LIVE_MAX`] (its read ended without reaching the block).
    pub(super) fn ahead_landed(&mut self, key: crate::hash::BlockKey, source: BlockSource) {
        if self.ahead_landed.insert(key, source).is_none() {
            self.ahead_order.push_back(key);
        }
        while self.ahead_order.len() > super::READ_AHEAD_LIVE_MAX {
            if let Some(old) = self.ahead_order.pop_front() {
                self.ahead_landed.remove(&old);
            }
        }
    }

    /// Starts an origin fill of block `key` for request `rid` (its hedge's backup): a background
    /// read with `rid`'s URL and credential that asks the origin only (an origin flight joins
    /// any fetch of the same window). Its block reaches `rid` when it lands (`hand_landed`).
    fn fill_from_origin(&mut self, rid: RequestId, key: crate::hash::BlockKey, now: Instant) {
        let Some(req) = self.requests.get(&rid) else { return };
        if req.cancelled || self.live_requests() >= super::READ_AHEAD_LIVE_MAX {
            return;
        }
        let (url, forward) = (req.read.url().to_owned(), req.forward.clone());
        self.counters.origin_fills += 1;
        let read = self.engine.begin_origin_fill(key, url);
        self.start_background(read, forward, now);
    }

    /// Starts `read` as a background request (it answers nobody) with the forwarded headers of
    /// the request it serves, and drives it.
    fn start_background(&mut self, read: Read, forward: Headers, now: Instant) {
        let id = RequestId(self.next_ahead);
        self.next_ahead += 1;
        let request = Request {
            cancelled: true,
            background: true,
            ..Request::new(Plane::Peer, Method::Get, read, forward)
        };
        self.requests.insert(id, Box::new(request));
        self.isolated(now, |node| {
            node.working.push(id);
            node.drive(id, now);
            node.working.pop();
        });
    }

    /// Starts a background probe of the object at `url` for relay `rid`, which works under a
    /// size its requester told ([`crate::engine::Told`]): a read that serves nobody, whose
    /// probe is a flight shared with the node's other probes and checks of the object. Not
    /// started past [`super::READ_AHEAD_LIVE_MAX`] live requests (the relay then stores
    /// nothing).
    fn learn_object(&mut self, rid: RequestId, key: BlockKey, url: String, now: Instant) {
        let Some(req) = self.requests.get(&rid) else { return };
        if self.live_requests() >= super::READ_AHEAD_LIVE_MAX {
            return;
        }
        let forward = req.forward.clone();
        let read = self.engine.begin_learn(key, url);
        self.start_background(read, forward, now);
    }

    /// Keeps a block fetched under a told size until the node learns its object
    /// ([`Node::learn_probe`] unparks it), letting the oldest waiting block go past
    /// [`super::PARKED_BLOCKS`]. The read emitted it because the engine could not judge it yet,
    /// and nothing is learnt between that and this.
    fn park(&mut self, parked: super::Parked) {
        if self.parked.len() == super::PARKED_BLOCKS {
            self.parked.pop_front();
            self.engine.note_told_unstored();
        }
        self.parked.push_back(parked);
    }

    /// The node learnt `object` (a probe or an admitting check answered), or its probe failed
    /// (`done`): each block waiting for it is stored if the engine confirms what its relay was
    /// told, else let go; with `done` those it cannot judge go too.
    pub(super) fn unpark(&mut self, object: &str, done: bool) {
        if !self.parked.iter().any(|p| p.object.id == object) {
            return;
        }
        let (mine, rest): (std::collections::VecDeque<_>, std::collections::VecDeque<_>) =
            std::mem::take(&mut self.parked).into_iter().partition(|p| p.object.id == object);
        self.parked = rest;
        for p in mine {
            match self.engine.confirms(&p.object, &p.told) {
                Some(true) if self.may_store(&p.object, Some(&p.told.meta)) => {
                    self.store_put(p.key, p.data, p.class)
                }
                None if !done => self.parked.push_back(p),
                _ => self.engine.note_told_unstored(),
            }
        }
    }

    /// Emits a response part unless the requester went away.
    pub(super) fn send_requester(&mut self, rid: RequestId, output: Output) {
        if self.requests.get(&rid).is_some_and(|r| !r.cancelled) {
            self.emit(output);
        }
    }

    /// A relay's head: the block's length, and the object's validators as this node knows them
    /// (the requester refuses a block of another version).
    fn relay_head(&self, head: &ResponseHead) -> Head {
        debug_assert_eq!(head.status, 200, "a relay's head is a block's");
        // The block, then its digest (crate::integrity).
        let length = head.content_length + crate::integrity::FOOTER_LEN;
        let mut headers = Headers::new()
            .with("content-length", length.to_string())
            .with("content-type", "application/octet-stream")
            .with(crate::integrity::HEADER_DIGEST, crate::integrity::DIGEST_ALGORITHM);
        for (name, value) in head.meta.fields() {
            if matches!(name, "etag" | "last-modified") {
                headers.push(name, value);
            }
        }
        self.name_self(Plane::Peer, &mut headers);
        Head { status: head.status, headers, body: true }
    }

    /// Request `rid`'s write-stall bound (armed for `at`) came due: if its requester still has
    /// not taken a body part, the request is cancelled and its connection aborted.
    pub(super) fn on_write_stall(&mut self, rid: RequestId, at: Instant, now: Instant) {
        let Some(req) = self.requests.get_mut(&rid) else { return };
        if req.stalled_at != Some(at) || req.cancelled {
            return;
        }
        req.stalled_at = None;
        self.working.push(rid);
        self.counters.write_stalls += 1;
        self.event(Event::Failed {
            request: rid,
            status: 0,
            committed: true,
            error: format!(
                "the requester took no body part for {:?}",
                self.config.bounds.write_stall
            ),
        });
        self.on_cancel(rid, now);
        self.emit(Output::Abort { id: rid });
    }

    /// Relay `rid`'s requester's budget is nearly spent and its head is not committed: it
    /// answers `504` + `X-DART-Upstream-Status: 504` (its upstream is slow, not this relay) and
    /// goes on without a requester, filling its cache and charging its own upstream.
    pub(super) fn on_answer_due(&mut self, rid: RequestId, at: Instant, now: Instant) {
        let Some(req) = self.requests.get_mut(&rid) else { return };
        if req.answer_by != Some(at) {
            return;
        }
        req.answer_by = None;
        if req.head_sent || req.cancelled {
            return;
        }
        self.working.push(rid);
        self.counters.relay_early_answers += 1;
        let extra = Headers::new().with(crate::codec::wire::HEADER_UPSTREAM_STATUS, "504");
        let message = "dart: the upstream did not answer within the requester's budget";
        self.reply(rid, Plane::Peer, 504, message, extra);
        self.release(rid, now);
    }

    pub(super) fn on_cancel(&mut self, rid: RequestId, now: Instant) {
        if self.cancel_gated(rid) {
            self.counters.cancelled += 1;
            return;
        }
        let Some(req) = self.requests.get(&rid) else { return };
        if req.cancelled {
            return;
        }
        self.counters.cancelled += 1;
        self.release(rid, now);
    }

    /// Takes request `rid` out of the table with its hedge and early-answer timers: a timer left
    /// behind would only wake the node for nothing.
    pub(super) fn take_request(&mut self, rid: RequestId) -> Option<Box<Request>> {
        let mut req = self.requests.remove(&rid)?;
        if let Some(at) = req.hedge_at {
            self.hedge_timers.remove(&(at, rid));
        }
        req.disarm_answer(&mut self.answer_timers, rid);
        Some(req)
    }

    /// Request `rid` has nobody to answer any more: what it waits on is released (a relay's
    /// peer exchanges run on to fill the cache, asking nothing further).
    fn release(&mut self, rid: RequestId, now: Instant) {
        let req = self.requests.get_mut(&rid).expect("a live request");
        // Nobody waits for a backup any more.
        if let Some(at) = req.hedge_at.take() {
            self.hedge_timers.remove(&(at, rid));
        }
        let req = self.requests.get(&rid).expect("a live request");
        let streaming = req.wait.peers().any(|io| self.peer_streaming(io, rid));
        if matches!(req.wait, Wait::Peers(_)) && (req.plane == Plane::Peer || streaming) {
            // A relay keeps its upstream exchanges to their end: mid-stream the block is still
            // worth caching, and before the head their outcome is evidence about the upstream
            // that only this relay can record (its requester's equal bound fires first, so a
            // relay that gave up with it would never learn that its parent stalls). It asks
            // nothing further (see `act`).
            let req = self.requests.get_mut(&rid).expect("a live request");
            req.cancelled = true;
            // Nobody waits for an early answer either.
            req.disarm_answer(&mut self.answer_timers, rid);
            return;
        }
        let req = self.take_request(rid).expect("a live request");
        match req.wait {
            Wait::Ready | Wait::Seal => {}
            Wait::Store(op) => {
                self.store_ops.remove(&op);
            }
            Wait::Flight(fid) => self.leave_flight(fid, rid),
            Wait::Check(credential) => self.leave_check(credential, rid),
            // The requester left, which says nothing about the peer: abandoned, not charged.
            Wait::Alone(io) | Wait::Pipe(io) => self.leave_exchange(io, rid, now),
            Wait::Peers(_) => {
                for io in req.wait.peers() {
                    self.leave_exchange(io, rid, now);
                }
            }
        }
    }

    /// Hands each block stored during this input to the other reads that still wait on peers
    /// for it (`Read::take_landed`): a read whose primary is stuck on a stalled peer gets the
    /// block another read of this node (its hedge, a relay's own fetch, an origin flight)
    /// brought in, instead of waiting out its head bound; and to the reads that wait on an origin
    /// flight for it and passed none of its window on (they leave the flight, which goes on for
    /// its other waiters and the cache), instead of waiting for the origin's window (or, in
    /// `expired-credential` seed 47895323, for a refusal of another requester's credential and a
    /// retry after it); and to reads that wait alone on their own origin window (a refusal's
    /// retry, or a full flight table), whose window is cancelled. Only reads of the version the
    /// node stores, none of whose fetches is the one that just ended (its readers get its
    /// answer), and that can act now.
    pub(super) fn hand_landed(&mut self, now: Instant) {
        while !self.landed.is_empty() {
            for (key, data) in std::mem::take(&mut self.landed) {
                let len = data.len() as u64;
                let waiting: Vec<RequestId> = self
                    .requests
                    .iter()
                    .filter(|(rid, r)| {
                        // A read whose body window is full acts on nothing until drained
                        // (`drive`): it could not drop its race now.
                        let on_peers = || {
                            r.read.awaits_peer_for(key, len)
                                && matches!(r.wait, Wait::Peers(slots)
                                    if slots.iter().flatten().all(|io| self.exchanges.contains_key(io)))
                        };
                        // One waiting on an origin flight that passed it nothing yet (a flight
                        // that just ended is out of the table: its waiters get its answer).
                        let on_flight = || {
                            r.read.awaits_fetch_for(key, len)
                                && matches!(r.wait, Wait::Flight(fid)
                                    if self.flight_state.get(&fid).is_some_and(|f| {
                                        f.waiters.iter().any(|w| w.request == **rid && w.streamed.is_none())
                                    }))
                        };
                        // One waiting alone on its own origin window (the flight table was
                        // full, or it retries a refusal under its own credential): nothing of
                        // that window reaches a read before it ends.
                        let alone = || {
                            r.read.awaits_fetch_for(key, len)
                                && matches!(r.wait, Wait::Alone(io) if self.exchanges.contains_key(&io))
                        };
                        !r.cancelled
                            && r.window < BODY_WINDOW
                            && (on_peers() || on_flight() || alone())
                            && self.may_store(r.read.object(), r.read.version())
                    })
                    .map(|(rid, _)| *rid)
                    .collect();
                for rid in waiting {
                    self.isolated(now, |node| {
                        node.working.push(rid);
                        let wait = node.requests[&rid].wait;
                        match wait {
                            // Out of the flight: it goes on for its other waiters, and stores.
                            Wait::Flight(fid) => node.leave_flight(fid, rid),
                            // Its window serves nobody else and the block is in: cancelled.
                            Wait::Alone(io) => node.leave_exchange(io, rid, now),
                            _ => {}
                        }
                        if matches!(wait, Wait::Flight(_) | Wait::Alone(_)) {
                            node.requests.get_mut(&rid).expect("a waiting read").wait = Wait::Ready;
                        }
                        let req = node.requests.get_mut(&rid).expect("a waiting read");
                        if req.read.take_landed(&mut node.engine, key, &data, now) {
                            node.drive(rid, now);
                        }
                        node.working.pop();
                    });
                }
                let streaming: Vec<RequestId> = self
                    .requests
                    .iter()
                    .filter(|(_, r)| {
                        !r.cancelled
                            && r.read.streams_peer_block(key, data.len() as u64)
                            && self.may_store(r.read.object(), r.read.version())
                    })
                    .map(|(rid, _)| *rid)
                    .collect();
                for rid in streaming {
                    self.isolated(now, |node| node.resume_stream(rid, key, &data, now));
                }
            }
        }
    }

    /// Relay `rid`'s committed stream of block `key` can end from the copy `data` that just
    /// landed in the store, when every byte it forwarded is that copy's: the copy's remaining
    /// bytes go out after them, and the read ends the stream ([`crate::engine::Read::resume_stream`]).
    /// A stream that forwarded other bytes (its upstream sent another version's, or lied) is left
    /// to end on its own: its footer judges it, and its requester refuses a block that does not
    /// match the digest the relay sends. The upstream fetch runs on to its end when its body has
    /// stood still for a hedge delay (a stalled or dead peer is then charged for it).
    fn resume_stream(
        &mut self,
        rid: RequestId,
        key: crate::hash::BlockKey,
        data: &Bytes,
        now: Instant,
    ) {
        let Some(Wait::Peers(slots)) = self.requests.get(&rid).map(|r| r.wait) else { return };
        let stream = slots.iter().flatten().find_map(|io| {
            let x = self.exchanges.get(io)?;
            let Job::Peer(p) = &x.job else { return None };
            p.readers.iter().find(|r| r.rid == rid && r.streaming).map(|r| {
                (r.forwarded, p.copy.starts_like(r.forwarded as usize, data), x.last_progress)
            })
        });
        let Some((forwarded, same, moved)) = stream else { return };
        if !same {
            self.engine.note_stream_resume_refused();
            return;
        }
        let still =
            now.saturating_duration_since(moved) >= self.engine.hedge_delay().unwrap_or_default();
        self.working.push(rid);
        let req = self.requests.get_mut(&rid).expect("a streaming relay");
        if req.read.resume_stream(&mut self.engine, key, data, still) {
            let tail = data.slice(forwarded as usize..);
            self.send_requester(rid, Output::Body { id: rid, data: tail });
            self.drive(rid, now);
        }
        self.working.pop();
    }

    /// Request `rid` stops waiting on exchange `io`: a shared peer fetch goes on for its other
    /// readers; otherwise the exchange is cancelled and its permit abandoned (a read that left
    /// says nothing about the peer).
    pub(super) fn leave_exchange(&mut self, io: IoId, rid: RequestId, now: Instant) {
        self.leave_exchange_as(io, rid, false, now)
    }

    /// [`Node::leave_exchange`]; with `run_on`, a peer fetch nobody else waits on is not
    /// cancelled but runs to its end unanswered, and its permit records how it ended
    /// ([`crate::engine::Action::CancelPeer`]).
    pub(super) fn leave_exchange_as(
        &mut self,
        io: IoId,
        rid: RequestId,
        run_on: bool,
        now: Instant,
    ) {
        let Some(x) = self.exchanges.get_mut(&io) else { return };
        if let Job::Peer(p) = &mut x.job {
            p.readers.retain(|r| r.rid != rid);
            if !p.readers.is_empty() || p.ticket.is_some() || p.run_on {
                return;
            }
            if run_on {
                p.run_on = true;
                self.counters.peer_fetches_run_on += 1;
                return;
            }
        }
        let x = self.remove_exchange(io).expect("a live exchange");
        self.emit(Output::Cancel(io));
        if let Some(permit) = x.into_permit() {
            self.engine.abandon(permit, now);
        }
    }

    pub(super) fn on_drained(&mut self, rid: RequestId, now: Instant) {
        let Some(req) = self.requests.get_mut(&rid) else { return };
        req.window = req.window.saturating_sub(1);
        if let Some(at) = req.stalled_at.take() {
            self.stall_timers.remove(&(at, rid));
        }
        let req = self.requests.get_mut(&rid).expect("a live request");
        if req.wait == Wait::Ready {
            self.working.push(rid);
            self.drive(rid, now);
            self.working.pop();
        }
    }

    pub(super) fn on_store(&mut self, op: StoreOp, block: Option<Bytes>, now: Instant) {
        let Some((rid, key, unversioned, whole)) = self.store_ops.remove(&op) else { return };
        let mut block = block;
        if unversioned && block.is_some() {
            let object = &self.requests.get(&rid).expect("a store op's request is live").read;
            if !self.engine.is_immutable(object.object()) {
                // Kept from an earlier process, of a version nobody can vouch for. Another
                // look-up in flight beside this one may have dropped it already (its answer
                // left the store before the drop reached it): withheld all the same, dropped
                // and counted once.
                block = None;
                if self.recovered.contains(&key) {
                    self.counters.unversioned_dropped += 1;
                    self.emit(Output::StoreDrop { keys: vec![key] });
                }
            }
        }
        let block = match block {
            Some(b) if whole => self.check_held(key, b),
            other => other,
        };
        self.working.push(rid);
        let req = self.requests.get_mut(&rid).expect("a store op's request is live");
        assert_eq!(req.wait, Wait::Store(op), "store answer out of turn");
        req.wait = Wait::Ready;
        self.looked_up(rid, key, block, now);
        self.drive(rid, now);
        self.working.pop();
    }

    /// The copy of block `key` that [`Node::held`] keeps, if it does: the whole of it, or
    /// `window` of it when the block has the window's block length (as the store answers).
    fn held_block(
        &self,
        key: &crate::hash::BlockKey,
        window: Option<crate::engine::Window>,
    ) -> Option<Bytes> {
        let (_, data) = self.held.iter().rev().find(|(k, _)| k == key)?;
        match window {
            Some(w) => w.slice(data),
            None => Some(data.clone()),
        }
    }

    /// Request `rid`'s look-up of `key` found `block` (or nothing): the read takes it; a hit on
    /// a block a read-ahead brought in counts where it came from.
    fn looked_up(
        &mut self,
        rid: RequestId,
        key: crate::hash::BlockKey,
        block: Option<Bytes>,
        now: Instant,
    ) {
        let req = self.requests.get_mut(&rid).expect("a looked-up request is live");
        let before = self.engine.stats().block_source_cache;
        req.read.handle_lookup(&mut self.engine, block, now);
        if self.engine.stats().block_source_cache > before {
            let plane = req.plane;
            let source = match self.ahead_landed.remove(&key) {
                Some(source) if plane == Plane::Client => {
                    self.engine.recount_ahead_hit(source == BlockSource::Peer);
                    source
                }
                _ => BlockSource::Cache,
            };
            self.event(Event::Block { request: rid, plane, key, source });
        }
    }

    /// A read found the whole `block` of `key` in the store: it is served only if it still
    /// hashes to the digest it was stored with (a relay's footer then reuses that hash; a client
    /// read of a whole block pays one hash). One that does not rotted in the
    /// store: it is dropped and counted, and the read takes the block afresh as if it had
    /// missed, so the rot reaches neither a peer nor a client. A part of a block (a range read's
    /// window), a block stored before this process, or one whose digest is no longer kept, is
    /// served as it is.
    fn check_held(&mut self, key: crate::hash::BlockKey, block: Bytes) -> Option<Bytes> {
        let Some(kept) = self.kept_digest(&key) else { return Some(block) };
        if self.digest_of(&block) != kept {
            self.counters.rotten_blocks_dropped += 1;
            self.event(Event::BlockRotten { key });
            // Its kept digest goes with it.
            self.emit(Output::StoreDrop { keys: vec![key] });
            return None;
        }
        Some(block)
    }

    fn start_passthrough(&mut self, rid: RequestId, url: String, now: Instant) {
        let req = self.requests.get(&rid).expect("a driven request");
        let head_only = req.method == Method::Head;
        let headers = req.forward.clone();
        let job = Job::Passthrough { request: rid, head_only };
        let io = self.start_exchange(Endpoint::Origin, url, headers, job, now);
        self.requests.get_mut(&rid).expect("a driven request").wait = Wait::Pipe(io);
    }

    /// The transport's digest of checked response `rid`: the verdict. A match ends the
    /// response (the transport writes the held part); anything else is a mismatch.
    pub(super) fn on_sealed(&mut self, rid: RequestId, digest: Vec<u8>, now: Instant) {
        let Some(req) = self.requests.get(&rid) else { return };
        if req.wait != Wait::Seal {
            return; // not asked for: a driver's stray answer changes nothing
        }
        let expected = match &req.mirror {
            Some(Mirror::Blob { expected: Some(e), .. }) => e,
            _ => unreachable!("only a checked blob waits for its seal"),
        };
        if *expected != digest {
            return self.blob_mismatch(rid, now);
        }
        self.take_request(rid);
        self.counters.blob_digests_verified += 1;
        self.emit(Output::End { id: rid });
    }

    /// Request `rid`, a whole registry blob, served bytes that do not match its digest. The
    /// response fails before its last byte (the client sees a truncated body, never a whole
    /// wrong one), every cached block of the object is dropped, and for a while the object is
    /// read from the origin only ([`crate::engine::Engine::distrust_peers`]), so that the
    /// client's retry meets neither the same cached bytes nor the same lying peer.
    fn blob_mismatch(&mut self, rid: RequestId, now: Instant) {
        let req = self.take_request(rid).expect("a driven request");
        self.counters.blob_digest_mismatches += 1;
        let object = req.read.object().clone();
        self.engine.distrust_peers(&object, now);
        let stale = self.engine.forget(&object);
        if !stale.is_empty() {
            self.emit(Output::StoreDrop { keys: stale });
        }
        let digest = match req.mirror.as_ref() {
            Some(Mirror::Blob { digest, .. }) => digest.as_str(),
            _ => unreachable!("a blob check belongs to a blob"),
        };
        let error = format!("blob bytes do not match {digest}: its cached blocks were dropped");
        self.event(Event::Failed { request: rid, status: 502, committed: true, error });
        if !req.cancelled {
            self.emit(Output::Abort { id: rid });
        }
    }

    pub(super) fn passthrough_io(&mut self, io: IoId, event: IoEvent, _now: Instant) {
        let x = &self.exchanges[&io];
        let Job::Passthrough { request: rid, head_only } = x.job else {
            unreachable!("a passthrough job")
        };
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, headers: origin } => {
                let req = self.requests.get(&rid).expect("a passthrough's request");
                let mut headers = Headers::new();
                if matches!(req.mirror.as_ref(), Some(Mirror::Proxy)) {
                    // A registry's answer is the client's to read whole: its challenge, digest,
                    // API version, pagination links, redirect target.
                    for (name, v) in origin.iter() {
                        if !HOP_BY_HOP.contains(&name) {
                            headers.push(name, v);
                        }
                    }
                } else {
                    for name in PASSTHROUGH_HEADERS {
                        if let Some(v) = origin.get(name) {
                            headers.push(name, v);
                        }
                    }
                }
                let head = Head { status, headers, body: !head_only };
                let req = self.requests.get_mut(&rid).expect("a passthrough's request");
                req.head_sent = true;
                req.disarm_answer(&mut self.answer_timers, rid);
                self.emit(Output::Respond { id: rid, head });
                if head_only {
                    // A HEAD is answered from an upstream GET's head; its body is never read.
                    self.remove_exchange(io);
                    self.take_request(rid);
                    self.emit(Output::Cancel(io));
                    self.emit(Output::End { id: rid });
                } else {
                    self.emit(Output::Pipe { io, to: rid });
                }
            }
            IoEvent::Body(_) => panic!("{io}: a piped body is the driver's to move"),
            IoEvent::End => {
                self.remove_exchange(io);
                self.take_request(rid);
                self.emit(Output::End { id: rid });
            }
            IoEvent::Failed(IoError::Refused(refusal)) => {
                self.count_refusal(refusal);
                self.remove_exchange(io);
                self.take_request(rid).expect("a passthrough's request");
                let message = format!("dart: upstream refused ({refusal}): {}", refusal.explain());
                let extra = Headers::new().with("x-dart-refused", refusal.label());
                self.reply(rid, Plane::Client, 403, &message, extra);
            }
            IoEvent::Failed(e) => {
                let url = redact_url(&self.exchanges[&io].url);
                self.passthrough_failed(io, rid, &format!("request {url}: {e}"));
            }
        }
    }

    pub(super) fn passthrough_expired(&mut self, io: IoId, expiry: Expiry, _now: Instant) {
        let x = &self.exchanges[&io];
        let Job::Passthrough { request: rid, .. } = x.job else { unreachable!("a passthrough") };
        let url = redact_url(&x.url);
        self.emit(Output::Cancel(io));
        self.passthrough_failed(io, rid, &format!("request {url}: {expiry}"));
    }

    /// Read `rid` probes the origin at `url` for its object's size (a flight shared with the
    /// node's other probes of the object).
    pub(super) fn probe_origin(&mut self, rid: RequestId, url: String, now: Instant) {
        let req = self.requests.get(&rid).expect("a probing request");
        let object = req.read.object().clone();
        let key = FlightKey::Probe(object.id.clone());
        self.ask_origin(rid, key, url, Fill::Probe(object), now);
    }

    fn passthrough_failed(&mut self, io: IoId, rid: RequestId, cause: &str) {
        self.remove_exchange(io);
        let req = self.take_request(rid).expect("a passthrough's request");
        let error = format!("origin transport error: {cause}");
        let committed = req.head_sent;
        self.event(Event::Failed { request: rid, status: 502, committed, error: error.clone() });
        if committed {
            self.emit(Output::Abort { id: rid });
        } else {
            self.reply(rid, Plane::Client, 502, &format!("dart: {error}"), Headers::new());
        }
    }
}

/// Whether `action` asks a question (look-up, probe, fetch, passthrough).
fn asks(action: &Action) -> bool {
    match action {
        Action::Probe { .. }
        | Action::Passthrough { .. }
        | Action::Lookup { .. }
        | Action::FetchPeer(_)
        | Action::FetchOrigin { .. } => true,
        // It asks nothing the request waits on; a request nobody waits for starts no fill.
        Action::FillFromOrigin { .. }
        | Action::Learn { .. }
        | Action::CancelPeer { .. }
        | Action::Respond(_)
        | Action::Store { .. }
        | Action::StoreWhenConfirmed { .. }
        | Action::Emit(_)
        | Action::Finish
        | Action::Fail(_) => false,
    }
}

/// The head of a client read on the block path: exact `Content-Length` (never chunked), the
/// object's validators and entity fields as the origin sent them.
/// Adds a registry blob's fields to its client head and, for a whole `GET` (a `200`) of a
/// digest this node can compute, sets what its bytes must hash to and returns the algorithm the
/// transport hashes them with.
fn mirror_blob_head(
    client: &mut Head,
    head: &ResponseHead,
    method: Method,
    digest: &str,
    expected: &mut Option<Vec<u8>>,
) -> Option<DigestAlgorithm> {
    if !matches!(head.status, 200 | 206 | 304) {
        return None;
    }
    client.headers.push("docker-content-digest", digest);
    if head.status != 200 || method != Method::Get {
        return None;
    }
    let (algorithm, value) = crate::registry::expected(digest)?;
    *expected = Some(value);
    Some(algorithm)
}

fn client_head(head: &ResponseHead, method: Method) -> Head {
    let mut headers = Headers::new();
    match head.status {
        // A 304 carries the validators and caching fields, no length (RFC 9110 §15.4.5).
        304 => {
            for (name, value) in head.meta.fields() {
                if matches!(name, "etag" | "last-modified" | "cache-control") {
                    headers.push(name, value);
                }
            }
            return Head { status: 304, headers, body: false };
        }
        412 => {
            headers.push("content-length", "0");
            return Head { status: 412, headers, body: false };
        }
        _ => {}
    }
    headers.push("content-length", head.content_length.to_string());
    headers.push("accept-ranges", "bytes");
    if let Some(cr) = &head.content_range {
        headers.push("content-range", cr.as_str());
    }
    if head.status != 416 {
        for (name, value) in head.meta.fields() {
            headers.push(name, value);
        }
        if head.meta.content_type.is_none() {
            headers.push("content-type", "application/octet-stream");
        }
    }
    let body = method == Method::Get && head.content_length > 0;
    Head { status: head.status, headers, body }
}
