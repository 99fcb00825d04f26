//! Origin flights (spec/fetch.md §5): concurrent requests for one probe or block window share one
//! origin exchange. The leader's result fills the cache (or the object table) before the flight
//! ends, the flight leaves the table before its result is published (a request arriving later
//! never joins a finished flight), and a joiner whose leader's credential was refused retries
//! alone with its own URL.

use super::body::BodyBuf;
use super::exchange::{Expiry, Job, OriginBody, Owner};
use super::io::{
    BlockSource, Endpoint, Event, FetchKind, Headers, IoEvent, IoId, Output, RequestId,
};
use super::requests::Wait;
use super::{Node, BODY_WINDOW};
use crate::codec::redact::redact_url;
use crate::engine::flight::{joiner_action, FlightId, FlightKey, JoinerAction, Role};
use crate::engine::origin::{
    classify_probe, finish_range_body, plan_range_response, OriginError, ProbeOutcome,
};
use crate::engine::{block_verdict, BlockClass, FetchedBlock, ObjectMeta, Verdict};
use crate::hash::BlockKey;
use crate::identity::ObjectId;
use crate::time::Instant;
use std::fmt;

/// Most bytes reserved up front for one origin body (larger windows grow as they arrive).
const BODY_RESERVE_MAX: u64 = 64 << 20;

/// What the leader does with a successful result before the flight ends.
#[derive(Debug, Clone)]
pub(super) enum Fill {
    /// Record the probe's outcome in the engine (a later read never probes again).
    Probe(ObjectId),
    /// Store the block if its verdict allows.
    Block { key: BlockKey, expected: u64, size: u64, class: BlockClass },
}

/// A request waiting on a flight, with its own URL (for a refusal retry).
#[derive(Clone)]
pub(super) struct Waiter {
    pub request: RequestId,
    pub url: String,
    /// When it began waiting on the flight.
    pub joined: Instant,
    /// The request's `Authorization`, sent with any origin exchange made for it.
    pub auth: Option<Vec<u8>>,
    /// A read that streams this flight's window (a cut-through relay that committed its head
    /// to it, or a client read of the window's version): the bytes of its span passed on so
    /// far (never the window's last byte before the end).
    pub streamed: Option<u64>,
    /// The bytes of the block it passes on, first and last (offsets within the block), and
    /// whether it is a client read (whose bytes go through its read, [`Read::stream_origin_part`]).
    pub span: (u64, u64),
    pub client: bool,
}

impl Waiter {
    /// Request `request` waits, streaming nothing yet.
    fn new(request: RequestId, url: String, auth: Option<Vec<u8>>, joined: Instant) -> Self {
        Waiter { request, url, auth, joined, streamed: None, span: (0, 0), client: false }
    }
}

/// A flight in progress.
pub(super) struct Flight {
    pub key: FlightKey,
    pub io: IoId,
    /// When its exchange was sent.
    pub started: Instant,
    /// Leader first, then joiners in arrival order (requests that went away are removed, the
    /// leader too: the first waiter is not always the leader).
    pub waiters: Vec<Waiter>,
    pub fill: Fill,
    /// The request that led it.
    pub leader: RequestId,
    /// The credential its exchange went out under: the leader's URL and `Authorization`.
    pub url: String,
    pub auth: Option<Vec<u8>>,
}

/// How a debug print shows an `Authorization` value: its length only.
fn redacted_auth(auth: &Option<Vec<u8>>) -> Option<String> {
    auth.as_ref().map(|a| format!("<redacted, {} bytes>", a.len()))
}

/// As derived, with the URL redacted ([`redact_url`]) and the `Authorization` shown by length.
impl fmt::Debug for Waiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiter")
            .field("request", &self.request)
            .field("url", &redact_url(&self.url))
            .field("joined", &self.joined)
            .field("auth", &redacted_auth(&self.auth))
            .field("streamed", &self.streamed)
            .field("span", &self.span)
            .field("client", &self.client)
            .finish()
    }
}

/// As derived, with the credential its exchange went out under redacted as a [`Waiter`]'s.
impl fmt::Debug for Flight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Flight")
            .field("key", &self.key)
            .field("io", &self.io)
            .field("started", &self.started)
            .field("waiters", &self.waiters)
            .field("fill", &self.fill)
            .field("leader", &self.leader)
            .field("url", &redact_url(&self.url))
            .field("auth", &redacted_auth(&self.auth))
            .finish()
    }
}

impl Flight {
    /// Whether `w` asked with the credential the flight's exchange went out under: a refusal
    /// judged it, and asking again under it would be refused again.
    fn sent_under(&self, w: &Waiter) -> bool {
        w.url == self.url && w.auth == self.auth
    }
}

/// How the last block window the origin sent (or the last block a peer sent, [`Node::peer_ahead`])
/// took its time: from the request to its head (`wait`: round trip and the sender's own delay)
/// and from the head to its end (`transfer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OriginPace {
    pub wait: std::time::Duration,
    pub transfer: std::time::Duration,
}

/// The key an origin's pace is kept under: its scheme, host and port as the dialer reads them
/// ([`crate::engine::redirect::origin_of`]).
pub(super) type PaceKey = (&'static str, String, u16);

impl Node {
    /// Remembers how `url`'s origin sent its last block window ([`Node::origin_pace`]), keeping
    /// at most [`super::ORIGIN_PACES_MAX`] origins (a new one past it replaces the first in
    /// order).
    fn note_origin_pace(&mut self, url: &str, pace: OriginPace) {
        let Some(key) = crate::engine::redirect::origin_of(url) else { return };
        if !self.origin_pace.contains_key(&key) && self.origin_pace.len() >= super::ORIGIN_PACES_MAX
        {
            self.origin_pace.pop_first();
        }
        self.origin_pace.insert(key, pace);
    }

    /// Whether the origin of `url` is latency-bound for `n` windows ahead
    /// ([`OriginPace::latency_bound`]) by the last block window it sent; false before it sent
    /// one.
    pub(super) fn origin_latency_bound(&self, url: &str, n: usize) -> bool {
        let key = crate::engine::redirect::origin_of(url);
        let pace = key.and_then(|key| self.origin_pace.get(&key).copied());
        pace.is_some_and(|p| p.latency_bound(n))
    }
}

/// The shortest wait for a head that makes an origin latency-bound ([`OriginPace::latency_bound`]):
/// an origin across a WAN or an object store (tens of milliseconds to its first byte), not one
/// on the node's own network, whose waits are scheduling noise. On loopback, with 1 MiB blocks
/// on a loaded 2-core machine, waits of a few milliseconds passed the ratio alone. The real
/// node's `dart demo` then paid the origin 1.13-1.25x for two readers on 3 of 8 runs; the cause
/// was found later (a full borrowed budget refused the blocks read ahead: [`Node::held`]), and
/// with it fixed the demo paid once on 16 of 16 runs without this floor. The floor stays for
/// the first reason.
pub(super) const LATENCY_BOUND_WAIT_MIN: std::time::Duration = std::time::Duration::from_millis(10);

impl OriginPace {
    /// Whether `n` more windows in flight beside one would still leave the origin's link idle
    /// most of the time: all `n + 1` transfers take less than one wait, and the wait is at least
    /// [`LATENCY_BOUND_WAIT_MIN`]. Windows ahead then overlap the wait instead of sharing a busy
    /// link with the window being streamed.
    pub fn latency_bound(&self, n: usize) -> bool {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        self.wait >= LATENCY_BOUND_WAIT_MIN
            && self.transfer.saturating_mul(n.saturating_add(1)) < self.wait
    }
}

/// A judged origin result.
#[derive(Debug, Clone)]
pub(super) enum Judged {
    /// What the probe established, and the object's validators and entity fields.
    Probe(ProbeOutcome, ObjectMeta),
    /// A block window, and the validators of the version it is of.
    Block(FetchedBlock, ObjectMeta),
}

impl Node {
    /// Request `rid` needs `key` from the origin at `url`: lead a flight, join one, or go alone.
    pub(super) fn ask_origin(
        &mut self,
        rid: RequestId,
        key: FlightKey,
        url: String,
        fill: Fill,
        now: Instant,
    ) {
        let auth = self.requests.get(&rid).and_then(|r| r.forward.get("authorization"));
        let auth = auth.map(<[u8]>::to_vec);
        let mut joined = None;
        let wait = match self.flights.begin(&key, now) {
            Role::Lead(fid) => {
                // The read's own span first, if it gets a lead-in: it is what the client waits
                // for (an origin that answers its requests in turn sends it first).
                if let (FlightKey::Block(_, start, _), Fill::Block { expected, size, .. }) =
                    (&key, &fill)
                {
                    let block = (*start, *expected, *size, 0);
                    self.start_lead_in(rid, fid, block, &url, auth.as_deref(), now);
                }
                let owner = Owner::Flight(fid);
                let io = self.start_origin(key.clone(), &url, auth.as_deref(), owner, now);
                let waiters = vec![Waiter::new(rid, url.clone(), auth.clone(), now)];
                let flight =
                    Flight { key, io, started: now, waiters, fill, leader: rid, url, auth };
                self.flight_state.insert(fid, flight);
                Wait::Flight(fid)
            }
            Role::Join(fid) => {
                let flight = self.flight_state.get_mut(&fid).expect("a joined flight has state");
                flight.waiters.push(Waiter::new(rid, url.clone(), auth.clone(), now));
                // A joiner whose span the window is still far from asks for it too, under its
                // own credential.
                if let (FlightKey::Block(_, start, _), Fill::Block { expected, size, .. }) =
                    (&flight.key, &flight.fill)
                {
                    let have = match &self.exchanges.get(&flight.io).map(|x| &x.job) {
                        Some(Job::Origin { body: OriginBody::Reading { buf, .. }, .. }) => {
                            buf.len() as u64
                        }
                        _ => 0,
                    };
                    let block = (*start, *expected, *size, have);
                    joined = Some((fid, block, url.clone(), auth.clone()));
                }
                Wait::Flight(fid)
            }
            Role::Alone => {
                Wait::Alone(self.start_origin(key, &url, auth.as_deref(), Owner::Alone(rid), now))
            }
        };
        self.requests.get_mut(&rid).expect("a live request").wait = wait;
        if let Some((fid, block, url, auth)) = joined {
            self.start_lead_in(rid, fid, block, &url, auth.as_deref(), now);
        }
    }

    fn start_origin(
        &mut self,
        key: FlightKey,
        url: &str,
        auth: Option<&[u8]>,
        owner: Owner,
        now: Instant,
    ) -> IoId {
        let range = match &key {
            FlightKey::Probe(_) => "bytes=0-0".to_owned(),
            FlightKey::Block(_, start, end) => format!("bytes={start}-{end}"),
        };
        let mut headers = Headers::new().with("range", range);
        if let Some(auth) = auth {
            headers.push("authorization", auth);
        }
        let job = Job::Origin { key, owner, body: OriginBody::Head };
        self.start_exchange(Endpoint::Origin, url.to_owned(), headers, job, now)
    }

    /// Request `rid` stops waiting on flight `fid` (it went away); the flight goes on.
    pub(super) fn leave_flight(&mut self, fid: FlightId, rid: RequestId) {
        if let Some(flight) = self.flight_state.get_mut(&fid) {
            flight.waiters.retain(|w| w.request != rid);
        }
        self.end_lead_in(rid);
    }

    pub(super) fn origin_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        if let IoEvent::Head { status: 206, headers } = &event {
            // A block window of another version than the one being read: the object changed.
            let identity = match &self.exchanges[&io].job {
                Job::Origin { key: FlightKey::Block(identity, ..), .. } => Some(identity.clone()),
                _ => None,
            };
            if let Some(identity) = identity {
                if self.version_changed(&ObjectId::from_id(&identity), headers) {
                    return self.origin_done(io, Err(OriginError::Changed), true, now);
                }
            }
        }
        let x = self.exchanges.get_mut(&io).expect("routed to a live exchange");
        let Job::Origin { key, body, .. } = &mut x.job else { unreachable!("an origin job") };
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, headers } => {
                let cr = headers.get("content-range");
                let cl = headers.get_u64("content-length");
                match key {
                    FlightKey::Probe(_) => {
                        // The body is dropped unread: a Range-blind 200 may be the whole object.
                        let meta = ObjectMeta::from_fields(|n| headers.get(n));
                        let challenge = headers.get("www-authenticate");
                        let result = classify_probe(status, cr, cl)
                            .map(|o| Judged::Probe(o, meta))
                            .map_err(|e| e.with_challenge(challenge));
                        self.origin_done(io, result, true, now);
                    }
                    FlightKey::Block(_, start, end) => {
                        match plan_range_response(*start, *end, status, cr, cl) {
                            Ok(plan) => {
                                let reserve = plan.read_max.min(BODY_RESERVE_MAX) as usize;
                                let mut buf = BodyBuf::with_reserve(reserve);
                                if plan.honours_range() {
                                    // A block the node may store: hashed as it is gathered.
                                    buf.digesting();
                                }
                                let meta = ObjectMeta::from_fields(|n| headers.get(n));
                                let meta = Box::new(meta);
                                *body = OriginBody::Reading { plan, skip: plan.skip, buf, meta };
                                self.start_origin_streams(io, now);
                            }
                            Err(e) => {
                                let e = e.with_challenge(headers.get("www-authenticate"));
                                self.origin_done(io, Err(e), true, now)
                            }
                        }
                    }
                }
            }
            IoEvent::Body(mut data) => {
                let OriginBody::Reading { plan, skip, buf, .. } = body else {
                    unreachable!("a probe ends at its head");
                };
                if *skip > 0 {
                    let n = (*skip).min(data.len() as u64);
                    *skip -= n;
                    data = data.slice(n as usize..);
                }
                let room = plan.read_max - buf.len() as u64;
                let take = (data.len() as u64).min(room) as usize;
                let fresh = data.slice(..take);
                buf.push(fresh.clone());
                if buf.len() as u64 == plan.read_max {
                    // Whatever is left of the body is aborted.
                    let result = self.judge_block(io);
                    self.origin_done(io, result, true, now);
                } else {
                    self.start_origin_streams(io, now);
                    self.forward_origin_streams(io, &fresh, now);
                }
            }
            IoEvent::End => {
                let result = self.judge_block(io);
                self.origin_done(io, result, false, now);
            }
            IoEvent::Failed(super::io::IoError::Refused(refusal)) => {
                self.count_refusal(refusal);
                self.origin_done(io, Err(OriginError::Refused(refusal)), false, now);
            }
            IoEvent::Failed(e) => {
                let what = if x.head { "body" } else { "request" };
                let msg = format!("{what} {}: {e}", redact_url(&x.url));
                self.origin_done(io, Err(OriginError::Transport(msg)), false, now);
            }
        }
    }

    /// Origin window `io` honours its range: every read waiting on its flight that may stream
    /// it ([`Read::origin_stream_span`]: a cut-through relay, or a client read of the window's
    /// version) and has not started starts now; a relay commits its head (one that joined after
    /// the head starts at the next body part, with the bytes already received).
    fn start_origin_streams(&mut self, io: IoId, now: Instant) {
        let Some(x) = self.exchanges.get(&io) else { return };
        let Job::Origin {
            owner: Owner::Flight(fid),
            body: OriginBody::Reading { plan, meta, .. },
            ..
        } = &x.job
        else {
            return;
        };
        if !plan.honours_range() {
            return;
        }
        let fid = *fid;
        let Some(flight) = self.flight_state.get(&fid) else { return };
        let starting: Vec<(RequestId, (u64, u64), bool)> = flight
            .waiters
            .iter()
            .filter(|w| w.streamed.is_none())
            .filter_map(|w| {
                let r = self.requests.get(&w.request).filter(|r| !r.cancelled)?;
                let span = r.read.origin_stream_span(&self.engine, meta, plan.total())?;
                Some((w.request, span, r.plane == super::io::Plane::Client))
            })
            .collect();
        for (rid, span, client) in starting {
            self.start_waiter_stream(fid, rid, span, client, now);
        }
    }

    /// Waiter `rid` of flight `fid` starts streaming `span` of the block (nothing passed on
    /// yet; `client`: through its read) from the window, or from its lead-in
    /// ([`super::lead_in`]), whichever head came first; its read is told
    /// ([`crate::engine::Read::handle_origin_started`]).
    pub(super) fn start_waiter_stream(
        &mut self,
        fid: FlightId,
        rid: RequestId,
        span: (u64, u64),
        client: bool,
        now: Instant,
    ) {
        let flight = self.flight_state.get_mut(&fid).expect("a live flight");
        if let Some(w) = flight.waiters.iter_mut().find(|w| w.request == rid) {
            (w.streamed, w.span, w.client) = (Some(0), span, client);
        }
        self.start_relay_stream(rid, now, |read, engine| read.handle_origin_started(engine));
    }

    /// Forwards what origin window `io` holds to its flight's streaming reads, all but the
    /// window's last byte (the end proves the length first): a relay's straight to its
    /// requester, a client read's through its read while its response window has room (what
    /// it has no room for goes out whole when the window ends).
    ///
    /// `fresh` is the part that just arrived (the last bytes the window holds): what a reader
    /// takes of it is a handle on it, not a copy; only a reader that lags behind it (one that
    /// joined late, or whose response window was full) is handed a copy of the bytes before.
    fn forward_origin_streams(&mut self, io: IoId, fresh: &bytes::Bytes, now: Instant) {
        let Some(x) = self.exchanges.get(&io) else { return };
        let Job::Origin {
            owner: Owner::Flight(fid),
            body: OriginBody::Reading { plan, buf, .. },
            ..
        } = &x.job
        else {
            return;
        };
        let Some(flight) = self.flight_state.get_mut(fid) else { return };
        let Fill::Block { expected, .. } = flight.fill else { return };
        let safe = (buf.len() as u64).min(plan.read_max).min(expected.saturating_sub(1));
        let fresh_start = (buf.len() - fresh.len()) as u64;
        let part = |from: u64, to: u64| {
            if from >= fresh_start {
                fresh.slice((from - fresh_start) as usize..(to - fresh_start) as usize)
            } else {
                buf.slice(from as usize..to as usize)
            }
        };
        let mut parts = Vec::new();
        let mut client_parts = Vec::new();
        for w in &mut flight.waiters {
            let Some(done) = w.streamed else { continue };
            let (from, to) = (w.span.0 + done, safe.min(w.span.1 + 1));
            if to <= from {
                continue;
            }
            if w.client {
                let room = self.requests.get(&w.request).is_some_and(|r| r.window < BODY_WINDOW);
                if room {
                    client_parts.push((w.request, part(from, to)));
                    w.streamed = Some(to - w.span.0);
                }
            } else {
                parts.push((w.request, part(from, to)));
                w.streamed = Some(to - w.span.0);
            }
        }
        // A client read whose range ends before the block's last byte has it all once its span
        // went out: it leaves the flight (which goes on to fill the store) and moves on, instead
        // of waiting for the rest of the window.
        let mut done = Vec::new();
        flight.waiters.retain(|w| {
            let whole =
                w.client && w.streamed == Some(w.span.1 - w.span.0 + 1) && w.span.1 + 1 < expected;
            if whole {
                done.push(w.request);
            }
            !whole
        });
        self.send_parts(parts);
        for &rid in &done {
            self.end_lead_in(rid);
        }
        for (rid, data) in client_parts {
            let had = done.contains(&rid);
            self.pass_origin_part(rid, data, had, now);
        }
    }

    /// Passes `data`, the next bytes of client read `rid`'s span of a streaming origin window
    /// (or of its lead-in), on through its read; with `whole` the span is all out and the read,
    /// off its flight already, moves on.
    pub(super) fn pass_origin_part(
        &mut self,
        rid: RequestId,
        data: bytes::Bytes,
        whole: bool,
        now: Instant,
    ) {
        self.isolated(now, |node| {
            node.working.push(rid);
            let req = node.requests.get_mut(&rid).expect("a streaming read is live");
            req.read.stream_origin_part(&mut node.engine, data);
            if whole {
                req.wait = Wait::Ready;
                req.read.handle_origin_stream_done(&mut node.engine);
            }
            node.drive(rid, now);
            node.working.pop();
        });
    }

    /// Judges the bytes an origin block exchange read so far.
    fn judge_block(&mut self, io: IoId) -> Result<Judged, OriginError> {
        let x = self.exchanges.get_mut(&io).expect("a live exchange");
        let Job::Origin { body: OriginBody::Reading { plan, skip, buf, meta }, .. } = &mut x.job
        else {
            unreachable!("a block window being read");
        };
        let (data, digest) = buf.take_digested();
        let body = finish_range_body(plan, *skip == 0, data.len() as u64)?;
        let meta = *std::mem::take(meta);
        if let Some(digest) = digest {
            self.remember_digest(&data, digest);
        }
        Ok(Judged::Block(FetchedBlock { data, body, coalesced: false }, meta))
    }

    pub(super) fn origin_expired(&mut self, io: IoId, expiry: Expiry, now: Instant) {
        let url = redact_url(&self.exchanges[&io].url);
        let error = OriginError::Transport(format!("request {url}: {expiry}"));
        self.origin_done(io, Err(error), true, now);
    }

    /// Origin exchange `io` is over with `result`: fill, end the flight, then publish.
    fn origin_done(
        &mut self,
        io: IoId,
        result: Result<Judged, OriginError>,
        cancel: bool,
        now: Instant,
    ) {
        let x = self.remove_exchange(io).expect("a live exchange");
        if cancel {
            self.emit(Output::Cancel(io));
        }
        let elapsed = now.saturating_duration_since(x.sent);
        self.event(Event::Fetched { kind: FetchKind::Origin, elapsed });
        if let (Ok(Judged::Block(..)), Some(pace)) = (&result, x.pace(now)) {
            self.note_origin_pace(&x.url, pace);
        }
        let Job::Origin { key, owner, .. } = x.job else { unreachable!("an origin job") };
        match owner {
            Owner::Alone(rid) => self.deliver_origin(rid, &key, result, false, false, now),
            Owner::Flight(fid) => self.publish(fid, result, now),
        }
    }

    fn publish(&mut self, fid: FlightId, result: Result<Judged, OriginError>, now: Instant) {
        let mut flight = self.flight_state.remove(&fid).expect("a flight's state");
        match (&result, &flight.fill) {
            (Ok(Judged::Probe(outcome, meta)), Fill::Probe(object)) => {
                self.learn_probe(object, *outcome, meta.clone(), now);
            }
            (Ok(Judged::Block(b, meta)), Fill::Block { key, expected, size, class }) => {
                if flight.waiters.is_empty() {
                    // Nobody reads the result (they left, or had their range before it ended):
                    // its bytes still came in.
                    self.engine.note_origin_bytes(b.data.len() as u64);
                }
                let object = match &flight.key {
                    FlightKey::Block(identity, ..) => ObjectId::from_id(identity),
                    FlightKey::Probe(_) => unreachable!("a block flight"),
                };
                // Only the version the node reads now is cached (the object may have changed,
                // or been forgotten for a change, while the window travelled).
                if block_verdict(*size, *expected, b) == Verdict::Cache
                    && self.may_store(&object, Some(meta))
                {
                    let (key, data, class) = (*key, b.data.clone(), *class);
                    self.store_put(key, data, class);
                }
            }
            (Ok(_), _) | (Err(_), _) => {}
        }
        // Out of the table before anyone hears the result.
        self.flights.finish(&flight.key, fid);
        let flew = now.saturating_duration_since(flight.started);
        for w in std::mem::take(&mut flight.waiters) {
            // The window ended: what a lead-in would still bring, the result has.
            self.end_lead_in(w.request);
            // Not by place: the leader may have left, and the first waiter be a joiner.
            let joiner = w.request != flight.leader;
            // A refusal judged the credential the exchange went out under, whoever asked with
            // it: a waiter with another one (a joiner's own URL or `Authorization`) asks alone
            // under it, once; one with the refused credential takes the refusal.
            let retry = match &result {
                Err(e) => {
                    joiner_action(Some(e), true) == JoinerAction::RetryAlone
                        && !flight.sent_under(&w)
                }
                Ok(_) => false,
            };
            // A joiner that came in the flight's second half and hears that the origin is
            // unavailable has not waited out a bound of its own: the origin may be back (an
            // outage that ended while the flight hung), and taking the verdict would serve it
            // what it knew (stale-if-error) or fail it. It asks again, once, in a new flight its
            // other late joiners share; not one that passed on bytes of the window already.
            let waited = now.saturating_duration_since(w.joined);
            let again = joiner
                && !retry
                && matches!(&result, Err(e) if e.is_unavailable())
                && waited < flew / 2
                && w.streamed.is_none()
                && self.requests.get(&w.request).is_some_and(|r| !r.origin_asked_again);
            let key = flight.key.clone();
            let result = result.clone();
            if let (Some(done), false, Ok(Judged::Block(b, _)), Fill::Block { expected, .. }) =
                (w.streamed, w.client, &result, &flight.fill)
            {
                // A whole window of the block's length: the stream's last bytes go out now.
                if b.data.len() as u64 == *expected && done < *expected {
                    let tail = b.data.slice(done as usize..);
                    self.send_requester(w.request, Output::Body { id: w.request, data: tail });
                }
            }
            let fill = again.then(|| flight.fill.clone());
            self.isolated(now, |node| {
                if retry {
                    let owner = Owner::Alone(w.request);
                    let io = node.start_origin(key, &w.url, w.auth.as_deref(), owner, now);
                    node.requests.get_mut(&w.request).expect("a waiter is live").wait =
                        Wait::Alone(io);
                } else if let Some(fill) = fill {
                    node.counters.origin_asked_again += 1;
                    let req = node.requests.get_mut(&w.request).expect("a waiter is live");
                    req.origin_asked_again = true;
                    req.wait = Wait::Ready;
                    node.ask_origin(w.request, key, w.url, fill, now);
                } else {
                    node.deliver_origin(w.request, &key, result, joiner, true, now);
                }
            });
        }
    }

    /// Hands an origin result to request `rid` and drives it on; `coalesced_flight` when the
    /// result came through a flight (which already taught the engine a probe's answer).
    pub(super) fn deliver_origin(
        &mut self,
        rid: RequestId,
        key: &FlightKey,
        result: Result<Judged, OriginError>,
        coalesced: bool,
        coalesced_flight: bool,
        now: Instant,
    ) {
        self.working.push(rid);
        let req = self.requests.get_mut(&rid).expect("an origin waiter is live");
        req.wait = Wait::Ready;
        let before = self.engine.stats();
        match (key, result) {
            (FlightKey::Probe(_), Ok(Judged::Probe(p, meta))) => {
                if !coalesced_flight {
                    // An uncoalesced probe (no flight filled the engine): learn it here.
                    let object = req.read.object().clone();
                    self.learn_probe(&object, p, meta, now);
                }
                let req = self.requests.get_mut(&rid).expect("an origin waiter is live");
                req.read.handle_probe(&mut self.engine, Ok(p), now)
            }
            (FlightKey::Probe(_), Err(e)) => {
                req.read.handle_probe(&mut self.engine, Err(e), now);
                let object = req.read.object().id.clone();
                self.unpark(&object, true);
            }
            (FlightKey::Block(..), Ok(Judged::Block(mut b, meta))) => {
                b.coalesced = coalesced;
                // A window of another version than the one this read serves (the node learnt
                // or forgot a version since the read began) never joins it.
                let object = req.read.object();
                let other = !self.engine.is_immutable(object)
                    && req.read.version().is_some_and(|v| v.same_version(&meta) == Some(false));
                // The flight's fill already offered this block to the store.
                req.filled = match key {
                    FlightKey::Block(_, start, _) if coalesced_flight && !other => {
                        let block = start / self.engine.config().geometry.block_bytes();
                        Some(self.engine.block_key(object, block))
                    }
                    _ => None,
                };
                let fetched = if other { Err(OriginError::Changed) } else { Ok(b) };
                let landed = match (key, &fetched, req.background) {
                    (FlightKey::Block(_, start, _), Ok(_), true) => {
                        let block = start / self.engine.config().geometry.block_bytes();
                        Some(self.engine.block_key(req.read.object(), block))
                    }
                    _ => None,
                };
                req.read.handle_fetch(&mut self.engine, fetched);
                if let Some(block_key) = landed {
                    let source =
                        if coalesced { BlockSource::Coalesced } else { BlockSource::Origin };
                    self.ahead_landed(block_key, source);
                }
            }
            (FlightKey::Block(..), Err(e)) => req.read.handle_fetch(&mut self.engine, Err(e)),
            (FlightKey::Probe(_), Ok(Judged::Block(..)))
            | (FlightKey::Block(..), Ok(Judged::Probe(..))) => {
                unreachable!("a flight's result matches its key")
            }
        }
        let req = self.requests.get(&rid);
        if let (Some(req), true) =
            (req, self.engine.stats().block_source_origin > before.block_source_origin)
        {
            if let FlightKey::Block(_, start, _) = key {
                let block = start / self.engine.config().geometry.block_bytes();
                let object = req.read.object().clone();
                let block_key = self.engine.block_key(&object, block);
                let source = if coalesced { BlockSource::Coalesced } else { BlockSource::Origin };
                let plane = req.plane;
                // A read-ahead's block this read took from the flight: counted here, once.
                self.ahead_landed.remove(&block_key);
                self.event(Event::Block { request: rid, plane, key: block_key, source });
            }
        }
        self.drive(rid, now);
        self.working.pop();
    }

    /// Teaches the engine a probe's answer; if it reveals another version of the object, the old
    /// version's blocks are dropped from the store.
    pub(super) fn learn_probe(
        &mut self,
        object: &ObjectId,
        outcome: ProbeOutcome,
        meta: ObjectMeta,
        now: Instant,
    ) {
        let stale = self.engine.record_probe(object, outcome, meta, now);
        if !stale.is_empty() {
            self.emit(Output::StoreDrop { keys: stale });
        }
        // Blocks relays fetched under a size their requester told wait for this.
        self.unpark(&object.id, false);
    }

    /// Whether a block of the version `version` names (`None`: unknown) of `object` may be
    /// cached: only of the version the node reads now. A node that forgot a changed object
    /// caches nothing of it until a probe names its new version: that probe could not tell an
    /// old block from a new one, so nothing would drop it.
    pub(super) fn may_store(&self, object: &ObjectId, version: Option<&ObjectMeta>) -> bool {
        if self.engine.is_immutable(object) {
            return true;
        }
        let Some(known) = self.engine.meta_of(&object.id) else { return false };
        version.is_none_or(|v| known.same_version(v) != Some(false))
    }

    /// Whether a response's validators say `object` changed since its probe. A changed object is
    /// forgotten and its blocks dropped at once; immutable objects never change.
    pub(super) fn version_changed(&mut self, object: &ObjectId, headers: &Headers) -> bool {
        if self.engine.is_immutable(object) {
            return false;
        }
        let Some(known) = self.engine.meta_of(&object.id) else { return false };
        let answer = ObjectMeta::from_fields(|n| headers.get(n));
        if known.same_version(&answer) != Some(false) {
            return false;
        }
        self.engine.note_change();
        let stale = self.engine.forget(object);
        if !stale.is_empty() {
            self.emit(Output::StoreDrop { keys: stale });
        }
        true
    }

    /// Runs `f`; a panic inside fails only the requests `f` was working on.
    pub(super) fn isolated(&mut self, now: Instant, f: impl FnOnce(&mut Node)) {
        let outer = std::mem::take(&mut self.working);
        let io = self.working_io.take();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        if let Err(panic) = result {
            self.recover(super::panic_message(panic.as_ref()), now);
        }
        self.working = outer;
        self.working_io = io;
    }
}
