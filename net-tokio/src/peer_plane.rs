//! The peer server: `GET /peer/v1/block/<chunk-hex>/<block-dec>` (seeds/peer.md §2).
//!
//! A request is parsed (400 for a malformed path or hop, 405 for another verb), checked by the
//! core ([`relay_check`]: declines are a clean 404 that never blames this relay), then served by a
//! core relay read driven through [`NodeCore::next`]. The relay holds the whole validated block
//! before it sends a header, so every failure is a clean status: 404 not held, 500 source error,
//! 502 with `X-DART-Upstream-Status` when the origin refused the requester's credential.

use crate::body::{self, BodyError, ChannelBody, ResponseBody};
use crate::driver::{NodeCore, Outward};
use crate::seam::Dialer;
use bytes::Bytes;
use bytes::BytesMut;
use dart_core::breaker::{Observation, Permit};
use dart_core::codec::roster::encode_roster;
use dart_core::codec::wire::{
    parse_block_path, parse_hop, BLOCK_PATH_PREFIX, HEADER_HOP, HEADER_NODE, HEADER_ORIGIN,
    HEADER_PEER_ADDR, HEADER_UPSTREAM_STATUS, ROSTER_PATH,
};
use dart_core::membership::{validate_member_id, Member};

/// Epoch header on roster responses (decimal u64).
pub const HEADER_EPOCH: &str = "x-dart-epoch";
use dart_core::engine::route::{relay_check, RelayPlan};
use dart_core::engine::{Action, PeerAnswer, Read, ReadFailure};
use dart_core::hash::BlockKey;
use http::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Most callers remembered from inbound roster requests.
pub const LEARNED_MAX: usize = 4096;

/// The peer plane of one node.
pub struct PeerPlane<D: Dialer> {
    /// The node's shared machinery.
    pub node: Arc<NodeCore<D>>,
    /// This node's member id, echoed as `X-DART-Node`.
    pub self_id: String,
    /// The address peers dial to reach this node (sent in rosters).
    pub advertise: String,
    /// Callers that identified themselves on a roster request (`X-DART-Node` and
    /// `X-DART-Peer-Addr`): the inbound half of the exchange, kept for discovery. With a static
    /// member list nothing consumes it yet.
    pub learned: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl<D: Dialer> PeerPlane<D> {
    /// The peer plane of `node`, named `self_id`, reached by peers at `advertise`.
    pub fn new(node: Arc<NodeCore<D>>, self_id: &str, advertise: &str) -> Self {
        PeerPlane {
            node,
            self_id: self_id.to_owned(),
            advertise: advertise.to_owned(),
            learned: Default::default(),
        }
    }

    fn reply(&self, status: StatusCode, msg: &str) -> Response<ResponseBody> {
        let mut r = Response::new(body::full(format!("{msg}\n")));
        *r.status_mut() = status;
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        self.name(&mut r);
        r
    }

    fn name(&self, r: &mut Response<ResponseBody>) {
        if let Ok(v) = HeaderValue::try_from(self.self_id.as_str()) {
            r.headers_mut().insert(HEADER_NODE, v);
        }
    }

    fn failure(&self, f: &ReadFailure) -> Response<ResponseBody> {
        let status = StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = self.reply(status, &format!("dart: {}", f.error));
        if let Some(up) = f.upstream_status {
            r.headers_mut().insert(HEADER_UPSTREAM_STATUS, HeaderValue::from(up));
        }
        r
    }

    /// Asks the upstream peer; on its 200 head commits ours and streams its body through (the
    /// requester's first byte follows the upstream's first byte, not its last). Before the head
    /// the read is handed back (`Err`) to try its next source.
    async fn cut_through(
        &self,
        mut read: Read,
        up: Upstream<'_>,
        permit: Permit<String>,
    ) -> Result<Response<ResponseBody>, Read> {
        let peers =
            self.node.peers.as_ref().expect("relays route to peers only with a peer client");
        let guard = OwnedPermit { permit: Some(permit), node: self.node.clone() };
        let started = tokio::time::Instant::now();
        let body = match peers.open_block(up.addr, up.key, up.url, up.hop, up.expected).await {
            Ok(body) => body,
            Err(observation) => {
                let permit = guard.take();
                let now = self.node.clock.now();
                let mut engine = self.node.engine.lock().expect("engine lock");
                read.handle_peer(&mut engine, permit, PeerAnswer::Failed(observation), now);
                return Err(read);
            }
        };
        read.handle_peer_started(&mut self.node.engine.lock().expect("engine lock"));
        let Some(Action::Respond(head)) = read.poll_action() else {
            unreachable!("a started stream sends its head first");
        };
        let (tx, resp_body) = ChannelBody::channel(head.content_length, STREAM_DEPTH);
        let remaining = peers.config().request_timeout.saturating_sub(started.elapsed());
        let node = self.node.clone();
        tokio::spawn(pipe(node, read, guard, body, tx, up.expected, remaining));
        let mut r = Response::new(resp_body);
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(head.content_length));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        self.name(&mut r);
        Ok(r)
    }

    /// Serves `GET /peer/v1/roster`: this node's view as JSON, naming itself in `X-DART-Node`,
    /// and learning a caller that identifies itself.
    fn roster(&self, req: &Request<Incoming>) -> Response<ResponseBody> {
        if req.method() != http::Method::GET {
            let mut r = self.reply(StatusCode::METHOD_NOT_ALLOWED, "dart: method not allowed");
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
            return r;
        }
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
        if let (Some(id), Some(addr)) = (header(HEADER_NODE), header(HEADER_PEER_ADDR)) {
            if validate_member_id(id).is_ok() && id != self.self_id && !addr.is_empty() {
                let mut learned = self.learned.lock().expect("learned lock");
                if learned.len() < LEARNED_MAX || learned.contains_key(id) {
                    learned.insert(id.to_owned(), addr.to_owned());
                }
            }
        }
        let engine = self.node.engine.lock().expect("engine lock");
        let Some(p2p) = engine.p2p() else {
            drop(engine);
            return self.reply(StatusCode::INTERNAL_SERVER_ERROR, "dart: no membership");
        };
        let view = p2p.placement.view();
        let me = Member::ready(&self.self_id, &self.advertise);
        let body = encode_roster(view, &me);
        let epoch = view.epoch();
        drop(engine);
        let mut r = Response::new(body::full(body.clone()));
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        r.headers_mut().insert(HEADER_EPOCH, HeaderValue::from(epoch));
        self.name(&mut r);
        r
    }

    /// Serves one peer request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<ResponseBody> {
        let path = req.uri().path();
        if path == ROSTER_PATH {
            return self.roster(&req);
        }
        if !path.starts_with(BLOCK_PATH_PREFIX) {
            return self.reply(StatusCode::NOT_FOUND, "dart: unknown peer path");
        }
        if req.method() != http::Method::GET {
            let mut r = self.reply(StatusCode::METHOD_NOT_ALLOWED, "dart: method not allowed");
            r.headers_mut().insert(ALLOW, HeaderValue::from_static("GET"));
            return r;
        }
        let key = match parse_block_path(path) {
            Ok(k) => k,
            Err(e) => return self.reply(StatusCode::BAD_REQUEST, &format!("dart: {e}")),
        };
        let hop = match parse_hop(req.headers().get(HEADER_HOP).map(HeaderValue::as_bytes)) {
            Ok(h) => h,
            Err(e) => return self.reply(StatusCode::BAD_REQUEST, &format!("dart: bad hop: {e}")),
        };
        // An empty value means cache-only, as an absent header does (peer.md §3.1).
        let origin = match req.headers().get(HEADER_ORIGIN).map(|v| v.to_str()) {
            None | Some(Ok("")) => None,
            Some(Ok(url)) => Some(url.to_owned()),
            Some(Err(_)) => {
                return self.reply(StatusCode::BAD_REQUEST, "dart: origin header is not ASCII")
            }
        };
        let plan = {
            let mut engine = self.node.engine.lock().expect("engine lock");
            match relay_check(&engine, key, origin.as_deref(), hop) {
                Ok(plan) => Ok(plan),
                Err(decline) => {
                    engine.note_relay_declined();
                    Err(decline)
                }
            }
        };
        let (url, next_hop) = match plan {
            Ok(RelayPlan::CacheOnly) => (None, hop),
            Ok(RelayPlan::FetchOnBehalf { next_hop }) => (origin, next_hop),
            Err(decline) => {
                tracing::debug!(block = %key, %decline, "relay declined");
                return self.reply(StatusCode::NOT_FOUND, &format!("dart: declined: {decline}"));
            }
        };
        let mut read =
            self.node.engine.lock().expect("engine lock").begin_relay(key, url, next_hop);
        let mut head = None;
        let mut data = BytesMut::new();
        loop {
            let Some(action) = read.poll_action() else {
                unreachable!("a relay waiting for nothing");
            };
            let out = match action {
                Action::FetchPeer {
                    peer,
                    key,
                    url,
                    hop,
                    expected_len,
                    permit,
                    cut_through: true,
                } => {
                    let fetch =
                        Upstream { addr: &peer.addr, key, url: &url, hop, expected: expected_len };
                    match self.cut_through(read, fetch, permit).await {
                        Ok(response) => return response,
                        Err(r) => {
                            read = r;
                            continue;
                        }
                    }
                }
                other => match self.node.perform(&mut read, other).await {
                    Some(out) => out,
                    None => continue,
                },
            };
            match out {
                Outward::Respond(h) => head = Some(h),
                Outward::Emit(b) => data.extend_from_slice(&b),
                Outward::Finish => break,
                Outward::Fail(f) => return self.failure(&f),
                Outward::Passthrough(_) => unreachable!("relays never proxy"),
            }
        }
        let head = head.expect("a finished relay sent its head");
        debug_assert_eq!(head.content_length, data.len() as u64);
        let mut r = Response::new(body::full(data.freeze()));
        r.headers_mut().insert(CONTENT_LENGTH, HeaderValue::from(head.content_length));
        r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
        self.name(&mut r);
        r
    }
}

/// Frames buffered towards the requester of a cut-through relay.
const STREAM_DEPTH: usize = 8;

/// Where a cut-through relay fetches from.
struct Upstream<'a> {
    addr: &'a str,
    key: BlockKey,
    url: &'a str,
    hop: u64,
    expected: u64,
}

/// A permit owned by a streaming task: abandoned if the task is dropped before answering.
struct OwnedPermit<D: Dialer> {
    permit: Option<Permit<String>>,
    node: Arc<NodeCore<D>>,
}

impl<D: Dialer> OwnedPermit<D> {
    fn take(mut self) -> Permit<String> {
        self.permit.take().expect("taken once")
    }
}

impl<D: Dialer> Drop for OwnedPermit<D> {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            if let Ok(mut engine) = self.node.engine.lock() {
                engine.abandon(permit, self.node.clock.now());
            }
        }
    }
}

/// Copies an upstream body to the requester while keeping a copy of at most `expected + 1`
/// bytes. The last byte is held back until the upstream's end proves the exact length, so a
/// stream that turns out short or long reaches the requester truncated, never as a whole block.
async fn transfer(
    body: &mut hyper::body::Incoming,
    copy: &mut BytesMut,
    forwarded: &mut u64,
    tx: &mpsc::Sender<Result<Bytes, BodyError>>,
    expected: u64,
) -> Option<Observation> {
    let limit = expected.saturating_add(1);
    let mut requester_gone = false;
    while (copy.len() as u64) < limit {
        match body.frame().await {
            None => return None,
            Some(Err(_)) => return Some(Observation::BodyInterrupted),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else { continue };
                let room = (limit - copy.len() as u64) as usize;
                copy.extend_from_slice(&data[..data.len().min(room)]);
                let safe = (copy.len() as u64).min(expected.saturating_sub(1));
                if safe > *forwarded && !requester_gone {
                    let chunk = Bytes::copy_from_slice(&copy[*forwarded as usize..safe as usize]);
                    *forwarded = safe;
                    // A requester that went away does not stop the copy: the block is still worth
                    // caching.
                    requester_gone = tx.send(Ok(chunk)).await.is_err();
                }
            }
        }
    }
    None
}

/// Runs a cut-through stream to its end, then lets the core judge the copy.
async fn pipe<D: Dialer>(
    node: Arc<NodeCore<D>>,
    mut read: Read,
    guard: OwnedPermit<D>,
    mut body: hyper::body::Incoming,
    tx: mpsc::Sender<Result<Bytes, BodyError>>,
    expected: u64,
    bound: Duration,
) {
    let mut copy = BytesMut::with_capacity(usize::try_from(expected).unwrap_or(0).min(64 << 20));
    let mut forwarded = 0u64;
    let moved = transfer(&mut body, &mut copy, &mut forwarded, &tx, expected);
    let failure = tokio::time::timeout(bound, moved).await.unwrap_or(Some(Observation::TimedOut));
    let answer = match failure {
        Some(observation) => PeerAnswer::Failed(observation),
        None => PeerAnswer::Block(copy.freeze()),
    };
    let tail = match &answer {
        PeerAnswer::Block(b) if b.len() as u64 == expected => Some(b.slice(forwarded as usize..)),
        PeerAnswer::Block(_) | PeerAnswer::Failed(_) => None,
    };
    let permit = guard.take();
    {
        let now = node.clock.now();
        let mut engine = node.engine.lock().expect("engine lock");
        read.handle_peer(&mut engine, permit, answer, now);
    }
    while let Some(action) = read.poll_action() {
        match action {
            Action::Store { key, data, class } => node.cache.put(key, &data, class),
            Action::Finish => {
                if let Some(tail) = tail.filter(|t| !t.is_empty()) {
                    let _ = tx.send(Ok(tail)).await;
                }
                return;
            }
            Action::Fail(f) => {
                tracing::warn!(error = %f.error, "cut-through relay failed mid-block: truncating");
                let _ = tx.send(Err(f.error.to_string().into())).await;
                return;
            }
            other => unreachable!("a finished stream only stores and ends: {other:?}"),
        }
    }
}
