//! The peer plane as the node sees it: serving a peer's block request (the core's relay checks,
//! then a relay read), fetching a block from a peer (the head judged before the body, the body
//! read bounded, cut-through with the last byte held back), and the roster exchange in both
//! directions.

use super::body::BodyBuf;
use super::exchange::{Expiry, Job, PeerJob, Reader};
use super::io::{
    BlockSource, Endpoint, Event, FetchKind, Head, Headers, Inbound, IoEvent, IoId, Output, Plane,
    RequestId,
};
use super::requests::{Requester, Wait};
use super::{Node, LEARNED_MAX, ROSTER_FETCHES_MAX};
use crate::breaker::{Observation, Permit};
use crate::codec::roster::{decode_roster, roster_body, Roster, ROSTER_BYTES_MAX};
use crate::codec::wire::{
    block_path, parse_block_path, parse_hop, BLOCK_PATH_PREFIX, HEADER_EPOCH, HEADER_HELD_ONLY,
    HEADER_HOP, HEADER_NODE, HEADER_OBJECT_ETAG, HEADER_OBJECT_LAST_MODIFIED, HEADER_OBJECT_SIZE,
    HEADER_ORIGIN, HEADER_PEER_ADDR, HEADER_UPSTREAM_STATUS, LEAVE_PATH, ROSTER_PATH,
    ROSTER_SELF_QUERY,
};
use crate::engine::hedge::DELAY_FLOOR;
use crate::engine::meta::META_VALUE_MAX;
use crate::engine::route::{relay_check, RelayPlan};
use crate::engine::{Contender, HedgeAgain, Method, ObjectMeta, PeerAnswer, Told};
use crate::hash::BlockKey;
use crate::integrity::{check_block, FooterError, DIGEST_ALGORITHM, FOOTER_LEN, HEADER_DIGEST};
use crate::membership::{validate_member_id, Member};
use crate::time::Instant;
use bytes::{Bytes, BytesMut};

/// Most bytes reserved up front for one peer body.
const BODY_RESERVE_MAX: u64 = 64 << 20;

/// The tracker's endpoints on the peer listener.
const TRACKER_PATH_PREFIX: &str = "/tracker/";

/// What to ask a peer for.
pub(super) struct PeerFetch {
    pub key: BlockKey,
    pub url: String,
    pub hop: u64,
    pub expected: u64,
    /// Ask for a block the peer holds only (`X-DART-Held-Only`).
    pub held_only: bool,
    /// The object as the asking read knows it (`X-DART-Object-*`), for a fetch on its behalf.
    pub told: Option<Told>,
}

/// The object a relay request names (`X-DART-Object-Size` with the version's validators), if
/// any; a malformed value is an error (a size that is not a positive decimal, a validator that
/// may not travel in a header). Validators without a size are ignored.
fn parse_told(headers: &Headers) -> Result<Option<Told>, &'static str> {
    let Some(size) = headers.get(HEADER_OBJECT_SIZE) else { return Ok(None) };
    let digits = (!size.is_empty() && size.iter().all(u8::is_ascii_digit)).then_some(size);
    let size = digits.and_then(|d| std::str::from_utf8(d).ok()?.parse::<u64>().ok());
    let Some(size) = size.filter(|&n| n > 0) else {
        return Err("dart: bad object size (a positive decimal number of bytes)");
    };
    let validator = |name| match headers.get(name) {
        None => Ok(None),
        Some(v) if !v.is_empty() && v.len() <= META_VALUE_MAX && header_safe(v) => {
            Ok(Some(std::str::from_utf8(v).expect("visible ASCII is UTF-8").into()))
        }
        Some(_) => Err("dart: bad object validator (visible ASCII, at most 1024 bytes)"),
    };
    let meta = ObjectMeta {
        etag: validator(HEADER_OBJECT_ETAG)?,
        last_modified: validator(HEADER_OBJECT_LAST_MODIFIED)?,
        ..ObjectMeta::default()
    };
    Ok(Some(Told { size, meta }))
}

/// Whether `value` may travel in a header field (visible ASCII, space and tab; no controls).
fn header_safe(value: &[u8]) -> bool {
    value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
}

impl Node {
    pub(super) fn peer_request(&mut self, id: RequestId, request: Inbound, now: Instant) {
        let path = request.target.split_once('?').map_or(request.target.as_str(), |(p, _)| p);
        // Nothing is learned, relayed or served for a caller without the cluster secret.
        if let Err(reason) = self.verify_peer_request(
            &request.method,
            &request.target,
            &request.body,
            &request.headers,
            now,
        ) {
            let message = format!("dart: peer authentication failed ({reason})");
            let extra = Headers::new().with("www-authenticate", "DART-HMAC-SHA256");
            return self.reply(id, Plane::Peer, 401, &message, extra);
        }
        if path == ROSTER_PATH {
            return self.serve_roster(id, &request, now);
        }
        if path == LEAVE_PATH {
            return self.serve_leave(id, &request, now);
        }
        if path.starts_with(TRACKER_PATH_PREFIX) {
            return self.serve_tracker(id, &request, path, now);
        }
        if !path.starts_with(BLOCK_PATH_PREFIX) {
            return self.reply(id, Plane::Peer, 404, "dart: unknown peer path", Headers::new());
        }
        if request.method != "GET" {
            let allow = Headers::new().with("allow", "GET");
            return self.reply(id, Plane::Peer, 405, "dart: method not allowed", allow);
        }
        let key = match parse_block_path(path) {
            Ok(key) => key,
            Err(e) => {
                return self.reply(id, Plane::Peer, 400, &format!("dart: {e}"), Headers::new())
            }
        };
        let hop = match parse_hop(request.headers.get(HEADER_HOP)) {
            Ok(hop) => hop,
            Err(e) => {
                let msg = format!("dart: bad hop: {e}");
                return self.reply(id, Plane::Peer, 400, &msg, Headers::new());
            }
        };
        // The requester's head budget, capped at our own longest head wait; absent: no budget.
        let cap = self.config.bounds.peer_head;
        let budget = match millis_header(&request.headers, crate::codec::wire::HEADER_BUDGET, cap) {
            Ok(budget) => budget,
            Err(()) => {
                let msg = "dart: bad budget (a positive number of milliseconds)";
                return self.reply(id, Plane::Peer, 400, msg, Headers::new());
            }
        };
        // The requester's body progress bound, capped at our whole-request bound; absent: none.
        let cap = self.config.bounds.peer_request;
        let progress =
            match millis_header(&request.headers, crate::codec::wire::HEADER_PROGRESS, cap) {
                Ok(progress) => progress,
                Err(()) => {
                    let msg = "dart: bad progress bound (a positive number of milliseconds)";
                    return self.reply(id, Plane::Peer, 400, msg, Headers::new());
                }
            };
        // An empty value means cache-only, as an absent header does (peer.md §3.1).
        let origin = match request.headers.get(HEADER_ORIGIN) {
            None | Some(b"") => None,
            Some(v) if header_safe(v) && v.is_ascii() => {
                Some(String::from_utf8(v.to_vec()).expect("ASCII is UTF-8"))
            }
            Some(_) => {
                let msg = "dart: origin header is not ASCII";
                return self.reply(id, Plane::Peer, 400, msg, Headers::new());
            }
        };
        let held_only = match request.headers.get(HEADER_HELD_ONLY) {
            None => false,
            Some(b"1") => true,
            Some(_) => {
                let msg = "dart: bad held-only header (1 or absent)";
                return self.reply(id, Plane::Peer, 400, msg, Headers::new());
            }
        };
        if let Some(url) = origin.as_deref() {
            if let Some(refusal) = self.upstream_refusal(url) {
                let message = format!("dart: upstream refused ({refusal}): {}", refusal.explain());
                let extra = Headers::new().with("x-dart-refused", refusal.label());
                return self.reply(id, Plane::Peer, 403, &message, extra);
            }
        }
        let (url, next_hop) = match relay_check(&self.engine, key, origin.as_deref(), hop) {
            Ok(RelayPlan::CacheOnly) => (None, hop),
            Ok(RelayPlan::FetchOnBehalf { next_hop }) => (origin, next_hop),
            Err(decline) => {
                self.engine.note_relay_declined();
                let msg = format!("dart: declined: {decline}");
                return self.reply(id, Plane::Peer, 404, &msg, Headers::new());
            }
        };
        let told = match parse_told(&request.headers) {
            Ok(told) => told,
            Err(msg) => return self.reply(id, Plane::Peer, 400, msg, Headers::new()),
        };
        let requester = request.headers.get_str(HEADER_NODE).map(str::to_owned);
        let mut read = match url {
            // Held-only: serve what is held, named by its version; never fetch (the hop stays).
            Some(url) if held_only => self.engine.begin_relay_held(key, url, hop),
            Some(url) => {
                self.note_relayed(key);
                self.engine.begin_relay(key, Some(url), next_hop)
            }
            None => self.engine.begin_relay(key, None, next_hop),
        };
        read.set_requester(requester.clone());
        if !held_only {
            read.set_told(told);
        }
        let requester = Requester { name: requester, budget, progress };
        self.admit(id, Plane::Peer, Method::Get, read, Headers::new(), requester, now);
    }

    /// Asks `addr` for a block on behalf of request `rid`: joins a fetch of the same block from
    /// the same peer that another read of this node has in flight (its permit is abandoned: the
    /// shared fetch records the peer's outcome once), or sends its own.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch_peer(
        &mut self,
        rid: RequestId,
        contender: Contender,
        member: String,
        addr: String,
        fetch: PeerFetch,
        permit: Permit<String>,
        cut_through: bool,
        now: Instant,
    ) {
        let mut reader = Reader {
            rid,
            contender,
            stream: cut_through,
            streaming: false,
            forwarded: 0,
            progress: None,
        };
        let io = match self.joinable(rid, &addr, &member, &fetch) {
            Some(io) => {
                self.engine.abandon(permit, now);
                self.counters.peer_fetches_joined += 1;
                let x = &self.exchanges[&io];
                // A relay whose requester waits less than the fetch's first reader keeps its
                // own bound: its abort must reach its requester before the requester's bound
                // fires, which the fetch's bound would not (an honest relay timed out).
                let own = self.peer_progress_bound(Some(rid), x.request_bound());
                if x.progress_bound().is_some_and(|b| own < b) {
                    reader.progress = Some(own);
                }
                let x = self.exchanges.get_mut(&io).expect("a joinable fetch is live");
                if let Some(own) = reader.progress {
                    x.reader_bound = Some(x.reader_bound.map_or(own, |b| b.min(own)));
                }
                let Job::Peer(job) = &mut x.job else { unreachable!("a joinable peer fetch") };
                job.readers.push(reader);
                self.rearm(io);
                io
            }
            None => {
                let object = self.requests.get(&rid).map(|r| r.read.object().id.clone());
                let on_behalf =
                    !fetch.url.is_empty() && header_safe(fetch.url.as_bytes()) && !fetch.held_only;
                let key = fetch.key;
                let io = self.send_peer_fetch(
                    Some(reader),
                    None,
                    object,
                    member,
                    addr.clone(),
                    fetch,
                    permit,
                    now,
                );
                if on_behalf {
                    // Only a fetch that lets the peer fetch on our behalf is worth joining.
                    self.shared_fetches.insert((key, addr), io);
                }
                io
            }
        };
        let req = self.requests.get_mut(&rid).expect("a driven request");
        let mut slots = match req.wait {
            Wait::Peers(slots) => slots,
            Wait::Ready => [None, None],
            other => unreachable!("{rid}: a peer fetch while waiting on {other:?}"),
        };
        assert!(slots[contender.index()].is_none(), "{rid}: {contender:?} launched twice");
        slots[contender.index()] = Some(io);
        req.wait = Wait::Peers(slots);
    }

    /// The fetch of `fetch.key` from `addr` that request `rid` may join instead of sending its
    /// own: one that asks the same member at the same address for the same block of the same
    /// version, on our behalf, that `rid` does not wait on already, and that does not ask the
    /// member `rid` relays for (that member may be waiting on this very relay: a wait cycle
    /// until a bound fires).
    fn joinable(
        &self,
        rid: RequestId,
        addr: &str,
        member: &str,
        fetch: &PeerFetch,
    ) -> Option<IoId> {
        let io = *self.shared_fetches.get(&(fetch.key, addr.to_owned()))?;
        let Job::Peer(job) = &self.exchanges.get(&io)?.job else { return None };
        let req = self.requests.get(&rid)?;
        let first = self.requests.get(&job.readers.first()?.rid)?;
        let same_version = self.engine.is_immutable(req.read.object())
            || match (req.read.version(), first.read.version()) {
                (Some(a), Some(b)) => a == b || a.same_version(b) == Some(true),
                (a, b) => a == b,
            };
        let joinable = job.ticket.is_none()
            && job.expected == fetch.expected
            && job.member == member
            && same_version
            && req.requester.as_deref() != Some(member)
            && job.readers.iter().all(|r| r.rid != rid);
        joinable.then_some(io)
    }

    /// Request `rid`'s read dropped `contender` (another won): its exchange is cancelled and its
    /// permit abandoned — losing a race is not a failure — unless other reads share it.
    pub(super) fn cancel_peer(
        &mut self,
        rid: RequestId,
        contender: Contender,
        run_on: bool,
        now: Instant,
    ) {
        let req = self.requests.get_mut(&rid).expect("a driven request");
        let Wait::Peers(mut slots) = req.wait else {
            unreachable!("{rid}: cancels a peer it does not wait on")
        };
        let io = slots[contender.index()].take().expect("a contender in flight");
        req.wait = if slots.iter().any(Option::is_some) { Wait::Peers(slots) } else { Wait::Ready };
        self.leave_exchange_as(io, rid, run_on, now);
    }

    /// Request `rid`'s hedge deadline (armed for `at`) came due.
    pub(super) fn on_hedge_due(&mut self, rid: RequestId, at: Instant, now: Instant) {
        let Some(req) = self.requests.get_mut(&rid) else { return };
        if req.hedge_at != Some(at) {
            return; // re-armed or moved on
        }
        req.hedge_at = None;
        if req.cancelled || !matches!(req.wait, Wait::Peers(_)) {
            return;
        }
        let Wait::Peers(slots) = req.wait else { unreachable!("checked above") };
        let recent = self.engine.hedge_delay().unwrap_or_default();
        // When the primary's body last moved, if its head came.
        let moved = slots[Contender::Primary.index()].and_then(|io| {
            let x = &self.exchanges[&io];
            x.head.then_some(x.last_progress)
        });
        let primary_moving = moved.is_some_and(|at| now.saturating_duration_since(at) < recent);
        self.working.push(rid);
        let req = self.requests.get_mut(&rid).expect("a live request");
        let again = match req.read.handle_hedge_due(&mut self.engine, primary_moving, now) {
            HedgeAgain::Never => None,
            // Looked at again once the body has stood still for a hedge delay.
            HedgeAgain::WhenStill => Some(
                moved.unwrap_or(now).saturating_add(recent).max(now.saturating_add(DELAY_FLOOR)),
            ),
            HedgeAgain::At(at) => Some(at.max(now.saturating_add(DELAY_FLOOR))),
        };
        if let Some(at) = again {
            let req = self.requests.get_mut(&rid).expect("a live request");
            if req.hedge_at.is_none() {
                req.hedge_at = Some(at);
                self.hedge_timers.insert((at, rid));
            }
        }
        self.drive(rid, now);
        self.working.pop();
    }

    /// A direct block fetch for the driver, through the breaker.
    pub(super) fn fetch_block(
        &mut self,
        ticket: u64,
        addr: String,
        fetch: PeerFetch,
        now: Instant,
    ) {
        let Some(permit) = self.engine.admit(&addr, now) else {
            return self.event(Event::BlockFetched { ticket, answer: None });
        };
        let member = String::new();
        self.send_peer_fetch(None, Some(ticket), None, member, addr, fetch, permit, now);
    }

    #[allow(clippy::too_many_arguments)]
    fn send_peer_fetch(
        &mut self,
        reader: Option<Reader>,
        ticket: Option<u64>,
        object: Option<String>,
        member: String,
        addr: String,
        fetch: PeerFetch,
        permit: Permit<String>,
        now: Instant,
    ) -> IoId {
        let mut headers = Headers::new().with(HEADER_HOP, fetch.hop.to_string());
        // An empty URL is a transport-only request: the header is absent, never empty.
        if !fetch.url.is_empty() && header_safe(fetch.url.as_bytes()) {
            headers.push(HEADER_ORIGIN, fetch.url.as_str());
        }
        if fetch.held_only {
            headers.push(HEADER_HELD_ONLY, "1");
        }
        if let Some(told) = fetch.told.as_ref().filter(|_| !fetch.url.is_empty()) {
            headers.push(HEADER_OBJECT_SIZE, told.size.to_string());
            let fields = [
                (HEADER_OBJECT_ETAG, &told.meta.etag),
                (HEADER_OBJECT_LAST_MODIFIED, &told.meta.last_modified),
            ];
            for (name, value) in fields {
                if let Some(v) = value.as_deref().filter(|v| header_safe(v.as_bytes())) {
                    headers.push(name, v);
                }
            }
        }
        if !self.config.self_id.is_empty() {
            headers.push(HEADER_NODE, self.config.self_id.as_str());
        }
        let url = format!("http://{addr}{}", block_path(fetch.key));
        let job = PeerJob {
            ticket,
            readers: reader.into_iter().collect(),
            object,
            key: fetch.key,
            permit: Some(permit),
            addr,
            member,
            expected: fetch.expected,
            held_only: fetch.held_only,
            run_on: false,
            copy: BodyBuf::default(),
            footer: Vec::new(),
        };
        self.start_exchange(Endpoint::Peer, url, headers, Job::Peer(job), now)
    }

    /// Whether a peer's block answer names another version of the object than the asking reads
    /// serve (else than this node reads), by the validators on its head. A peer that names
    /// none is trusted by length, as before. (Reads share a fetch only when they serve the same
    /// version, so the first reader speaks for all.)
    fn peer_version_differs(&self, io: IoId, headers: &Headers) -> bool {
        let Some(Job::Peer(job)) = self.exchanges.get(&io).map(|x| &x.job) else { return false };
        let Some(identity) = &job.object else { return false };
        if self.engine.is_immutable(&crate::identity::ObjectId::from_id(identity)) {
            return false;
        }
        let read = job.readers.first().and_then(|r| self.requests.get(&r.rid));
        let read = read.and_then(|r| r.read.version());
        let answer = crate::engine::ObjectMeta::from_fields(|n| headers.get(n));
        let Some(known) = read.or_else(|| self.engine.meta_of(identity)) else {
            // A held-only answer is used only when both sides name one version.
            return job.held_only;
        };
        match known.same_version(&answer) {
            Some(same) => !same,
            // Neither says: a fetch-on-behalf answer is trusted by its length, as before; a
            // held-only one (the neighbour's copy may be of any version it ever held) is not.
            None => job.held_only,
        }
    }

    /// Whether peer exchange `io` is a cut-through stream whose head relay `rid` already
    /// committed.
    pub(super) fn peer_streaming(&self, io: IoId, rid: RequestId) -> bool {
        match self.exchanges.get(&io).map(|x| &x.job) {
            Some(Job::Peer(p)) => p.readers.iter().any(|r| r.rid == rid && r.streaming),
            _ => false,
        }
    }

    pub(super) fn peer_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        if let IoEvent::Head { status: 200, headers } = &event {
            if self.peer_version_differs(io, headers) {
                self.engine.note_peer_version_mismatch();
                let answer = Err(Observation::VersionMismatch);
                return self.finish_peer(io, answer, true, now);
            }
        }
        let x = self.exchanges.get_mut(&io).expect("routed to a live exchange");
        let Job::Peer(job) = &mut x.job else { unreachable!("a peer job") };
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, headers } => {
                let upstream =
                    headers.get_u64(HEADER_UPSTREAM_STATUS).and_then(|s| u16::try_from(s).ok());
                let announced = headers.get_u64("content-length");
                let expected = job.expected;
                let wire = expected.saturating_add(FOOTER_LEN);
                if let Some(o) = Observation::of_block_head(status, upstream, announced, wire) {
                    return self.finish_peer(io, Err(o), true, now);
                }
                if headers.get(HEADER_DIGEST) != Some(DIGEST_ALGORITHM.as_bytes()) {
                    // A block without its digest cannot be checked: never used.
                    let answer = Err(Observation::ValidationFailed);
                    return self.finish_peer(io, answer, true, now);
                }
                let reserve = expected.min(BODY_RESERVE_MAX) as usize;
                job.copy.reserve(reserve);
                // Checked against its footer at the end: hashed as it is gathered.
                job.copy.digesting();
                self.start_streams(io, now);
            }
            IoEvent::Body(data) => self.peer_body(io, data, now),
            IoEvent::End => {
                let answer = self.checked_block(io);
                self.finish_peer(io, answer, false, now);
            }
            IoEvent::Failed(e) => self.finish_peer(io, Err(e.observation()), false, now),
        }
    }

    /// The block peer exchange `io` received, if it is whole and its bytes match the digest
    /// that ended it ([`crate::integrity`]); else how the answer failed.
    fn checked_block(&mut self, io: IoId) -> Result<Bytes, Observation> {
        let x = self.exchanges.get_mut(&io).expect("a live exchange");
        let Job::Peer(job) = &mut x.job else { unreachable!("a peer job") };
        let ((block, digest), footer, expected) =
            (job.copy.take_digested(), std::mem::take(&mut job.footer), job.expected);
        if let Some(digest) = digest {
            self.remember_digest(&block, digest);
        }
        match check_block(block, &footer, expected, |b| self.digest_of(b)) {
            Ok(block) => {
                self.engine.note_peer_digest(true);
                Ok(block)
            }
            Err(FooterError::Length) => Err(Observation::WrongLength),
            Err(FooterError::Digest) => {
                self.engine.note_peer_digest(false);
                Err(Observation::ValidationFailed)
            }
        }
    }

    /// Peer exchange `io` has its head: every relay reading it that may cut through commits its
    /// own head now (a relay that joined later starts at the next body part).
    fn start_streams(&mut self, io: IoId, now: Instant) {
        let Some(Job::Peer(job)) = self.exchanges.get_mut(&io).map(|x| &mut x.job) else {
            return;
        };
        let starting: Vec<(RequestId, Contender)> = job
            .readers
            .iter_mut()
            .filter(|r| r.stream && !r.streaming)
            .map(|r| {
                r.streaming = true;
                (r.rid, r.contender)
            })
            .collect();
        for (rid, contender) in starting {
            // The rival still dialling (no connection yet) when this stream wins: most likely a
            // peer that is gone, so its fetch runs on to record how it ends.
            let rival = match self.requests.get(&rid).map(|r| r.wait) {
                Some(Wait::Peers(slots)) => slots[contender.other().index()],
                _ => None,
            };
            let unreached =
                rival.and_then(|io| self.exchanges.get(&io)).is_some_and(|x| !x.connected);
            self.start_relay_stream(rid, now, |read, engine| {
                read.handle_peer_started(engine, contender, unreached, now)
            });
        }
    }

    /// Relay `rid` commits its head to a stream its upstream started (`start` tells its read),
    /// and is driven on; a panic fails only this relay.
    pub(super) fn start_relay_stream(
        &mut self,
        rid: RequestId,
        now: Instant,
        start: impl FnOnce(&mut crate::engine::Read, &mut crate::engine::Engine),
    ) {
        self.isolated(now, |node| {
            node.working.push(rid);
            let req = node.requests.get_mut(&rid).expect("a streaming relay is live");
            start(&mut req.read, &mut node.engine);
            node.drive(rid, now);
            node.working.pop();
        });
    }

    /// Sends stream parts to their requesters (none to one that went away).
    pub(super) fn send_parts(&mut self, parts: Vec<(RequestId, Bytes)>) {
        for (rid, data) in parts {
            self.send_requester(rid, Output::Body { id: rid, data });
        }
    }

    /// Keeps the block's `expected` bytes and at most one byte more than the digest footer; a
    /// stream forwards all but the block's last byte at once.
    fn peer_body(&mut self, io: IoId, data: Bytes, now: Instant) {
        let x = self.exchanges.get_mut(&io).expect("a live exchange");
        let Job::Peer(job) = &mut x.job else { unreachable!("a peer job") };
        let room = (job.expected - job.copy.len() as u64) as usize;
        let split = data.len().min(room);
        // The block's part stays one handle when it came in one part (no copy).
        job.copy.push(data.slice(..split));
        let rest = &data[split..];
        let more = rest.len().min(FOOTER_LEN as usize + 1 - job.footer.len());
        job.footer.extend_from_slice(&rest[..more]);
        if job.footer.len() as u64 > FOOTER_LEN {
            return self.finish_peer(io, Err(Observation::WrongLength), true, now);
        }
        if job.readers.iter().any(|r| r.stream && !r.streaming) {
            self.start_streams(io, now);
        }
        let Some(Job::Peer(job)) = self.exchanges.get_mut(&io).map(|x| &mut x.job) else {
            return;
        };
        // The last byte waits until the end proves the exact length, so a stream that turns out
        // short or long reaches the requester truncated, never as a whole block.
        let safe = (job.copy.len() as u64).min(job.expected.saturating_sub(1));
        let mut parts = Vec::new();
        for r in job.readers.iter_mut().filter(|r| r.streaming && safe > r.forwarded) {
            parts.push((r.rid, job.copy.slice(r.forwarded as usize..safe as usize)));
            r.forwarded = safe;
        }
        self.send_parts(parts);
    }

    pub(super) fn peer_expired(&mut self, io: IoId, expiry: Expiry, now: Instant) {
        self.finish_peer(io, Err(expiry.observation()), true, now);
    }

    /// The body of peer fetch `io` stood still past the own bound of some of its readers
    /// ([`Reader::progress`]) but not past the fetch's, or a held-only ask is still dialling
    /// past its short bound ([`Exchange::ask_wait`]): they leave it, each answered as if its
    /// own fetch had timed out, and charge nobody (the peer was told the fetch's bound, which
    /// has not passed); the fetch goes on for its other readers, or, with none left, runs on
    /// to its own bound to record how the peer answers (a dial that never connects opens the
    /// peer's circuit at the dial bound).
    pub(super) fn drop_stalled_readers(&mut self, io: IoId, now: Instant) {
        let x = self.exchanges.get_mut(&io).expect("a live exchange");
        let last = x.last_progress;
        // A held-only ask still dialling past its short bound: every reader leaves it.
        let unreached = !x.connected && x.ask_wait.is_some_and(|w| now >= x.sent.saturating_add(w));
        if unreached {
            x.ask_wait = None;
        }
        let Job::Peer(job) = &mut x.job else { unreachable!("a peer job") };
        let (key, expected) = (job.key, job.expected);
        let (stalled, kept): (Vec<Reader>, Vec<Reader>) = std::mem::take(&mut job.readers)
            .into_iter()
            .partition(|r| unreached || r.progress.is_some_and(|b| now >= last.saturating_add(b)));
        x.reader_bound = kept.iter().filter_map(|r| r.progress).min();
        job.readers = kept;
        if job.readers.is_empty() && job.ticket.is_none() && !job.run_on {
            // Every reader left: it runs on to its own bound, to record how the peer answers.
            job.run_on = true;
            self.counters.peer_fetches_run_on += 1;
        }
        self.rearm(io);
        for reader in stalled {
            let answer = PeerAnswer::Failed(Observation::TimedOut);
            self.isolated(now, |node| {
                node.answer_reader(io, &reader, key, expected, None, answer, now)
            });
        }
    }

    /// Peer exchange `io` is over with its whole body (of any length) or a failure: report it
    /// once, then hand each reader its answer. The fetch's own permit goes with the first
    /// reader's answer (or, for a driver's fetch, records the outcome here); the other readers
    /// shared it and hold none.
    fn finish_peer(
        &mut self,
        io: IoId,
        result: Result<Bytes, Observation>,
        cancel: bool,
        now: Instant,
    ) {
        let x = self.remove_exchange(io).expect("a live exchange");
        if cancel {
            self.emit(Output::Cancel(io));
        }
        let elapsed = now.saturating_duration_since(x.sent);
        self.event(Event::Fetched { kind: FetchKind::Peer, elapsed });
        let pace = x.pace(now);
        let Job::Peer(job) = x.job else { unreachable!("a peer job") };
        let observation = match &result {
            Ok(b) if b.len() as u64 == job.expected => Observation::Served,
            Ok(_) => Observation::WrongLength,
            Err(o) => *o,
        };
        self.event(Event::PeerAnswer { addr: job.addr.clone(), observation });
        if let Some((neighbours, _)) = self.engine.neighbours_mut() {
            neighbours.observe(&job.member, observation, elapsed);
        }
        if observation == Observation::Served {
            // Only fetches that held the block teach the hedge delay.
            self.engine.record_peer_latency(elapsed);
            if pace.is_some() {
                self.peer_pace = pace;
            }
        }
        let mut permit = job.permit;
        if let Some(ticket) = job.ticket {
            let permit = permit.expect("a peer job holds its permit");
            if let Some(p2p) = self.engine.p2p_mut() {
                p2p.breaker.complete(permit, observation.outcome(), now);
            }
            let answer = match result {
                Ok(b) if observation == Observation::Served => PeerAnswer::Block(b),
                Ok(_) => PeerAnswer::Failed(Observation::WrongLength),
                Err(o) => PeerAnswer::Failed(o),
            };
            return self.event(Event::BlockFetched { ticket, answer: Some(answer) });
        }
        if job.run_on {
            // Nobody waits on it: it ran on only to record how the peer answered.
            debug_assert!(job.readers.is_empty());
            let permit = permit.take().expect("a run-on fetch holds its permit");
            let outcome = crate::engine::peer_outcome(observation, job.held_only);
            if let Some(p2p) = self.engine.p2p_mut() {
                p2p.breaker.complete(permit, outcome, now);
            }
            return;
        }
        for reader in job.readers {
            // A stream judges any length itself (its bytes went out already); a whole-block
            // answer is exactly the block or a failure.
            let answer = match &result {
                Ok(b) if reader.streaming || observation == Observation::Served => {
                    PeerAnswer::Block(b.clone())
                }
                Ok(_) => PeerAnswer::Failed(Observation::WrongLength),
                Err(o) => PeerAnswer::Failed(*o),
            };
            let permit = permit.take();
            self.isolated(now, |node| {
                node.answer_reader(io, &reader, job.key, job.expected, permit, answer, now)
            });
        }
    }

    /// Hands one reader of peer exchange `io` its answer and drives its request on.
    #[allow(clippy::too_many_arguments)]
    fn answer_reader(
        &mut self,
        io: IoId,
        reader: &Reader,
        key: crate::hash::BlockKey,
        expected: u64,
        permit: Option<Permit<String>>,
        answer: PeerAnswer,
        now: Instant,
    ) {
        let rid = reader.rid;
        // Only the fetch's first reader holds its permit; the others shared it.
        let shared = permit.is_none();
        if let (true, PeerAnswer::Block(b)) = (reader.streaming, &answer) {
            if b.len() as u64 == expected && reader.forwarded < expected {
                let tail = b.slice(reader.forwarded as usize..);
                self.send_requester(rid, Output::Body { id: rid, data: tail });
            }
        }
        self.working.push(rid);
        let req = self.requests.get_mut(&rid).expect("a peer fetch's request is live");
        let Wait::Peers(mut slots) = req.wait else { unreachable!("{rid}: not waiting on peers") };
        assert_eq!(slots[reader.contender.index()].take(), Some(io), "{rid}: contender mix-up");
        req.wait = if slots.iter().any(Option::is_some) { Wait::Peers(slots) } else { Wait::Ready };
        let whole = matches!(&answer, PeerAnswer::Block(b) if b.len() as u64 == expected);
        if shared && whole {
            // The fetch's first reader offers the block to the store; this one does not repeat it.
            req.filled = Some(key);
        }
        let before = self.engine.stats().block_source_peer;
        let ahead = req.background && whole;
        req.read.handle_peer(&mut self.engine, reader.contender, permit, answer, now);
        if self.engine.stats().block_source_peer > before {
            let plane = req.plane;
            // A read-ahead's block this read took from the shared fetch: counted here, once.
            self.ahead_landed.remove(&key);
            self.event(Event::Block { request: rid, plane, key, source: BlockSource::Peer });
        }
        if ahead {
            self.ahead_landed(key, BlockSource::Peer);
        }
        self.drive(rid, now);
        self.working.pop();
    }

    /// `GET /peer/v1/roster`: this node's view, naming itself, learning a caller that names
    /// itself and its advertised address.
    fn serve_roster(&mut self, id: RequestId, request: &Inbound, now: Instant) {
        if request.method != "GET" {
            let allow = Headers::new().with("allow", "GET");
            return self.reply(id, Plane::Peer, 405, "dart: method not allowed", allow);
        }
        if self.draining {
            // Leaving: answering as a member would make the asker credit it again.
            return self.reply(id, Plane::Peer, 503, "dart: draining", Headers::new());
        }
        let caller = request.headers.get_str(HEADER_NODE);
        let addr = request.headers.get_str(HEADER_PEER_ADDR);
        if let (Some(caller), Some(addr), Some(dir)) = (caller, addr, self.directory.as_mut()) {
            dir.caller(caller, addr, now);
        } else if let (Some(caller), Some(addr)) = (caller, addr) {
            let known = self.learned.contains_key(caller);
            if validate_member_id(caller).is_ok()
                && caller != self.config.self_id
                && !addr.is_empty()
                && (known || self.learned.len() < LEARNED_MAX)
            {
                self.learned.insert(caller.to_owned(), addr.to_owned());
            }
        }
        let Some(p2p) = self.engine.p2p() else {
            return self.reply(id, Plane::Peer, 500, "dart: no membership", Headers::new());
        };
        let view = p2p.placement.view();
        let me = Member::ready(&self.config.self_id, &self.config.advertise);
        // A ping (`?self`) asks only who answers: a roster of the responder alone, instead of
        // every member (at 10,000 members a full roster is about 500 KB).
        let query = request.target.split_once('?').map_or("", |(_, q)| q);
        let ping = query.split('&').any(|p| p == ROSTER_SELF_QUERY);
        // The whole roster's tag: the hash of its bytes (members, addresses, weights, epoch).
        // A discovery fetch that offers it back (`If-None-Match`) while it still holds gets a
        // 304 with no body: in a settled cluster nearly every fetch (spec/cluster.md §6 has
        // no such answer; a node that never offers a tag always gets the whole roster).
        let (body, hash) = if ping {
            roster_body(&crate::membership::View::new(vec![me.clone()]), &me)
        } else {
            roster_body(view, &me)
        };
        let tag = format!("\"{hash:016x}\"");
        let epoch = view.epoch().to_string();
        if !ping && request.headers.get_str("if-none-match") == Some(tag.as_str()) {
            let mut headers =
                Headers::new().with("etag", tag.as_str()).with(HEADER_EPOCH, epoch.as_str());
            self.name_self(Plane::Peer, &mut headers);
            self.emit(Output::Respond { id, head: Head { status: 304, headers, body: false } });
            self.emit(Output::End { id });
            return;
        }
        let mut headers = Headers::new()
            .with("content-length", body.len().to_string())
            .with("content-type", "application/json")
            .with(HEADER_EPOCH, epoch);
        if !ping {
            headers.push("etag", tag.as_str());
        }
        self.name_self(Plane::Peer, &mut headers);
        self.emit(Output::Respond { id, head: Head { status: 200, headers, body: true } });
        self.emit(Output::Body { id, data: body });
        self.emit(Output::End { id });
    }

    /// Fetches `addr`'s roster. Roster requests bypass the breaker's admission (discovery must
    /// reach peers whose circuit is open) but their outcome is recorded.
    pub(super) fn fetch_roster(&mut self, ticket: Option<u64>, addr: String, now: Instant) {
        self.fetch_roster_for(ticket, None, None, addr, now);
    }

    /// Pings neighbour `peer` (spec/overlay.md §3): the ping is a roster fetch (`?self`), whose
    /// outcome is scored on the neighbour; discovery learns only from its own rounds' fetches
    /// ([`Node::roster_answered`]).
    pub(super) fn ping_neighbour(&mut self, peer: crate::engine::route::PeerRef, now: Instant) {
        self.fetch_roster_for(None, Some(peer.id), None, peer.addr, now);
    }

    /// Pings broadcast target `id` at `addr` for round `token`: a roster fetch (`?self`) naming
    /// this node, which also announces it to the target (the target's discovery meets it as a
    /// caller); this node's discovery learns only from its own rounds' fetches.
    pub(super) fn fetch_roster_target(
        &mut self,
        token: crate::overlay::targets::RoundToken,
        id: String,
        addr: String,
        now: Instant,
    ) {
        self.fetch_roster_for(None, None, Some((token, id)), addr, now);
    }

    fn fetch_roster_for(
        &mut self,
        ticket: Option<u64>,
        ping: Option<String>,
        target_ping: Option<(crate::overlay::targets::RoundToken, String)>,
        addr: String,
        now: Instant,
    ) {
        let refused = if self.engine.p2p().is_none() {
            Some("the peer path is off")
        } else if self.roster_fetches >= ROSTER_FETCHES_MAX {
            Some("too many roster fetches in flight")
        } else {
            None
        };
        if let Some(why) = refused {
            if let (Some(id), Some((neighbours, _))) = (&ping, self.engine.neighbours_mut()) {
                neighbours.observe(id, Observation::DialFailed, std::time::Duration::ZERO);
            }
            if let Some((token, id)) = &target_ping {
                self.target_pinged(*token, id, false, now);
            }
            let whole = ping.is_none() && target_ping.is_none();
            let result = Err(why.to_owned());
            return self.roster_answered(ticket, whole, &addr, result, None, false, now);
        }
        let p2p = self.engine.p2p_mut().expect("checked above");
        let permit = p2p.breaker.begin_roster(&addr, now);
        let mut headers = Headers::new();
        // A draining node asks anonymously: naming itself would make the peer credit it again.
        if !self.config.self_id.is_empty() && !self.draining {
            headers.push(HEADER_NODE, self.config.self_id.as_str());
        }
        if !self.config.advertise.is_empty() && !self.draining {
            headers.push(HEADER_PEER_ADDR, self.config.advertise.as_str());
        }
        // A ping asks only who answers (`?self`); discovery and the driver want the whole roster.
        let url = if ping.is_some() || target_ping.is_some() {
            format!("http://{addr}{ROSTER_PATH}?{ROSTER_SELF_QUERY}")
        } else {
            format!("http://{addr}{ROSTER_PATH}")
        };
        // A discovery fetch offers the tag of the roster it last had from this member: an
        // unchanged roster comes back as a 304 with no body (about 50 bytes a member saved).
        let discovery = ticket.is_none() && ping.is_none() && target_ping.is_none();
        let tag =
            discovery.then(|| self.directory.as_ref().and_then(|d| d.tag_for(&addr))).flatten();
        let offered = tag.is_some();
        if let Some(tag) = tag {
            headers.push("if-none-match", tag);
        }
        let body = BytesMut::new();
        let job = Job::Roster {
            ticket,
            addr,
            ping,
            target_ping,
            permit: Some(permit),
            responder: None,
            body,
            offered,
            etag: None,
            unchanged: false,
        };
        self.roster_fetches += 1;
        self.start_exchange(Endpoint::Peer, url, headers, job, now);
    }

    pub(super) fn roster_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        let x = self.exchanges.get_mut(&io).expect("routed to a live exchange");
        let Job::Roster { addr, responder, body, offered, etag, unchanged, .. } = &mut x.job else {
            unreachable!("a roster job")
        };
        let failed = |o: Observation, m: String| Err::<(Roster, Option<String>), _>((o, m));
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, headers } => {
                if status == 304 && *offered {
                    *unchanged = true;
                    *responder = headers.get_str(HEADER_NODE).map(str::to_owned);
                    return;
                }
                if status != 200 {
                    let result = failed(
                        Observation::UnexpectedStatus(status),
                        format!("roster status {status}"),
                    );
                    return self.roster_done(io, result, true, now);
                }
                *responder = headers.get_str(HEADER_NODE).map(str::to_owned);
                *etag = headers.get_str("etag").map(str::to_owned);
            }
            IoEvent::Body(_) if *unchanged => {
                let msg = "a body after a 304".to_owned();
                self.roster_done(io, failed(Observation::MalformedBody, msg), true, now);
            }
            IoEvent::Body(data) => {
                if body.len() + data.len() > ROSTER_BYTES_MAX {
                    let msg = format!("roster body larger than {ROSTER_BYTES_MAX} bytes");
                    return self.roster_done(
                        io,
                        failed(Observation::BodyInterrupted, msg),
                        true,
                        now,
                    );
                }
                body.extend_from_slice(&data);
            }
            IoEvent::End if *unchanged => {
                let empty = Roster { epoch: 0, members: Vec::new(), invalid: Vec::new() };
                let result = Ok((empty, responder.clone()));
                self.roster_done(io, result, false, now);
            }
            IoEvent::End => {
                let result = match decode_roster(body, responder.as_deref(), addr) {
                    Ok(roster) => Ok((roster, responder.clone())),
                    Err(e) => failed(Observation::MalformedBody, e.to_string()),
                };
                self.roster_done(io, result, false, now);
            }
            IoEvent::Failed(e) => {
                self.roster_done(io, failed(e.observation(), e.to_string()), false, now);
            }
        }
    }

    pub(super) fn roster_expired(&mut self, io: IoId, expiry: Expiry, now: Instant) {
        self.roster_done(io, Err((expiry.observation(), expiry.to_string())), true, now);
    }

    fn roster_done(
        &mut self,
        io: IoId,
        result: Result<(Roster, Option<String>), (Observation, String)>,
        cancel: bool,
        now: Instant,
    ) {
        let x = self.remove_exchange(io).expect("a live exchange");
        if cancel {
            self.emit(Output::Cancel(io));
        }
        self.roster_fetches -= 1;
        let Job::Roster { ticket, permit, addr, ping, target_ping, etag, unchanged, .. } = x.job
        else {
            unreachable!("a roster job")
        };
        let observation = match &result {
            Ok(_) => Observation::Served,
            Err((o, _)) => *o,
        };
        if let (Some(id), Some((neighbours, _))) = (&ping, self.engine.neighbours_mut()) {
            neighbours.observe(id, observation, now.saturating_duration_since(x.sent));
        }
        if let Some((token, id)) = &target_ping {
            // Answered by the member pinged (not another process at its old address).
            let ok = matches!(&result, Ok((_, Some(responder))) if responder == id);
            self.target_pinged(*token, id, ok, now);
        }
        if let (Some(permit), Some(p2p)) = (permit, self.engine.p2p_mut()) {
            p2p.breaker.complete(permit, observation.outcome(), now);
        }
        let result = result.map_err(|(_, m)| m);
        let whole = ping.is_none() && target_ping.is_none();
        self.roster_answered(ticket, whole, &addr, result, etag, unchanged, now);
    }

    /// A roster fetch ended: the driver's ticket is answered, or discovery learns from a whole
    /// roster. A ping's roster (`?self`: the responder alone) is not the answer a discovery
    /// round waits for from the same address: taken for it, it ended the round's ask with no
    /// hearsay, and the round's own fetch, answering after it, was dropped (a boot's views took
    /// an interval longer to fill: found by `discovery-boot`, whose broadcast pings went to the
    /// addresses its rounds asked).
    #[allow(clippy::too_many_arguments)]
    fn roster_answered(
        &mut self,
        ticket: Option<u64>,
        whole: bool,
        addr: &str,
        result: Result<(Roster, Option<String>), String>,
        etag: Option<String>,
        unchanged: bool,
        now: Instant,
    ) {
        match ticket {
            Some(ticket) => self.event(Event::Roster { ticket, result }),
            // A discovery fetch: a whole roster (with its tag), a 304, or a failure.
            None if whole => self.discovery_answered(addr, result, etag, unchanged, now),
            None => {}
        }
    }
}

/// A header holding a positive number of milliseconds, capped at `cap`: `Ok(None)` when absent,
/// `Err(())` when present but not such a number.
fn millis_header(
    headers: &Headers,
    name: &str,
    cap: std::time::Duration,
) -> Result<Option<std::time::Duration>, ()> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => match std::str::from_utf8(v).ok().and_then(|t| t.parse::<u64>().ok()) {
            Some(ms) if ms > 0 => Ok(Some(std::time::Duration::from_millis(ms).min(cap))),
            _ => Err(()),
        },
    }
}
