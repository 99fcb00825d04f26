//! Exchanges between a node and another endpoint: dial, request, response, and what faults do to
//! them on the way.
//!
//! A call is a small state machine. A path that goes silent mid-exchange stalls it, as TCP would:
//! segments are retransmitted with exponential backoff, so when the path heals the exchange
//! resumes at the next retransmission (a SYN's schedule starts at 1 s, a data segment's at
//! 200 ms). Only the caller's own bounds end a stalled exchange: the dial bound before the
//! connection exists, the response-head bound until the head arrives, then the request bound. A
//! process that is down refuses at once (a reset after one round trip).

use crate::net::{Endpoint, PathState, RETRANSMIT_DELAY};
use crate::node::{FlightKey, ReadId};
use crate::origin::{OriginAnswer, OriginRequest, HEAD_BYTES};
use crate::sim::{Event, Sim};
use bytes::Bytes;
use dart_core::hash::BlockKey;
use dart_core::time::Instant;
use std::fmt;
use std::time::Duration;

/// First SYN retransmission (Linux: 1 s, doubling).
pub const SYN_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Most doublings of a retransmission schedule that are modelled.
const BACKOFF_STEPS_MAX: u32 = 16;

/// An exchange's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CallId(pub u64);

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

/// Why an exchange failed, as the caller's transport sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallFailure {
    /// The dial timed out or was refused.
    DialFailed,
    /// The connection was reset.
    Reset,
    /// No response head within the bound.
    HeaderTimeout,
    /// The body did not complete within the bound.
    BodyTimeout,
}

impl fmt::Display for CallFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CallFailure::DialFailed => "dial failed",
            CallFailure::Reset => "connection reset",
            CallFailure::HeaderTimeout => "response header timed out",
            CallFailure::BodyTimeout => "request timed out",
        })
    }
}

/// Why a node made a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// It leads this origin flight.
    Flight(dart_core::engine::flight::FlightId),
    /// For this read alone (flight table full, or a joiner's refusal retry) on this key.
    Alone(ReadId, FlightKey),
    /// The verbatim passthrough of this read.
    Passthrough(ReadId),
    /// A block request to a peer for this read.
    Peer(ReadId),
}

/// A peer block request (`GET /peer/v1/block/<key>` with `X-DART-Origin` and `X-DART-Hop`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRequest {
    /// The block.
    pub key: BlockKey,
    /// `X-DART-Origin`.
    pub url: String,
    /// `X-DART-Hop`.
    pub hop: u64,
    /// The block's geometry length (the client reads at most one byte more).
    pub expected_len: u64,
}

/// What a call asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallRequest {
    /// An origin request.
    Origin(OriginRequest),
    /// A peer block request.
    Peer(PeerRequest),
}

/// Compact, stable trace form: times in nanoseconds.
impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Stage::Request { arrive_at } => write!(f, "arrives {}", arrive_at.as_nanos()),
            Stage::Response { head_at, done_at } => {
                write!(f, "response {}-{}", head_at.as_nanos(), done_at.as_nanos())
            }
            Stage::Streaming { head_at, floor, .. } => {
                write!(f, "streaming {}-{}", head_at.as_nanos(), floor.as_nanos())
            }
            Stage::Serving { deadline } => write!(f, "serving until {}", deadline.as_nanos()),
            Stage::Stalled { leg, deadline, .. } => {
                write!(f, "stalled {leg:?} until {}", deadline.as_nanos())
            }
            Stage::Failed { failure, at } => write!(f, "failed ({failure}) at {}", at.as_nanos()),
        }
    }
}

impl fmt::Display for CallRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallRequest::Origin(OriginRequest::Probe) => f.write_str("probe"),
            CallRequest::Origin(OriginRequest::Range { start, end }) => {
                write!(f, "range {start}-{end}")
            }
            CallRequest::Origin(OriginRequest::Passthrough { range }) => {
                write!(f, "passthrough {range:?}")
            }
            CallRequest::Peer(p) => write!(f, "block {} hop {}", p.key, p.hop),
        }
    }
}

/// A peer's response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerReply {
    /// HTTP status.
    pub status: u16,
    /// `X-DART-Upstream-Status`, on a 502 that relays an origin refusal.
    pub upstream_status: Option<u16>,
    /// `Content-Length`.
    pub content_length: Option<u64>,
    /// The body bytes sent.
    pub body: Bytes,
    /// The connection breaks before the body ends.
    pub interrupted: bool,
}

/// What a call got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallAnswer {
    /// From the origin.
    Origin(OriginAnswer),
    /// From a peer.
    Peer(PeerReply),
}

/// Which way a stalled exchange was travelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// Connecting.
    Dial,
    /// The request.
    Request,
    /// The response.
    Response,
}

/// Where a call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The request travels; it arrives at `arrive_at`.
    Request {
        /// Arrival at the callee.
        arrive_at: Instant,
    },
    /// The response travels.
    Response {
        /// First byte at the caller.
        head_at: Instant,
        /// Last byte at the caller.
        done_at: Instant,
    },
    /// A cut-through relay sent its head (arriving at `head_at`) and streams the body as its
    /// own upstream delivers it; the body cannot arrive before `floor`; the caller gives up at
    /// `deadline` (its request bound).
    Streaming {
        /// The head's arrival at the caller.
        head_at: Instant,
        /// Earliest arrival of the last byte (the link's own transfer time).
        floor: Instant,
        /// The caller's request bound.
        deadline: Instant,
    },
    /// The callee is working on it (a relay read); the caller gives up at `deadline`.
    Serving {
        /// The caller's response-head bound.
        deadline: Instant,
    },
    /// A silent path holds it; unless the path heals first it fails at `deadline`.
    Stalled {
        /// When the path went silent.
        since: Instant,
        /// Which way it was going.
        leg: Leg,
        /// The response's times before the stall (response leg only).
        head_at: Instant,
        /// See `head_at`.
        done_at: Instant,
        /// When the caller gives up.
        deadline: Instant,
        /// How it then fails.
        failure: CallFailure,
    },
    /// It failed; the caller learns at `at`.
    Failed {
        /// How.
        failure: CallFailure,
        /// When the caller learns.
        at: Instant,
    },
}

/// An exchange in flight.
#[derive(Clone, Debug)]
pub struct Call {
    /// The caller.
    pub node: usize,
    pub(crate) incarnation: u32,
    /// The callee.
    pub to: Endpoint,
    /// The upstream URL.
    pub url: String,
    /// What was asked.
    pub request: CallRequest,
    /// Why.
    pub purpose: Purpose,
    /// When it was sent.
    pub sent: Instant,
    /// Where it is.
    pub stage: Stage,
    pub(crate) answer: Option<CallAnswer>,
    dialed: bool,
    /// The caller streams the body through (a cut-through relay's upstream fetch).
    pub cut_through: bool,
    /// The caller was told of the 200 head.
    pub head_delivered: bool,
}

/// The first retransmission at or after `now` of a schedule that began at `since` with `first`.
fn next_retransmission(since: Instant, first: Duration, now: Instant) -> Instant {
    let mut at = since + first;
    let mut step = first;
    for _ in 0..BACKOFF_STEPS_MAX {
        if at >= now {
            return at;
        }
        step *= 2;
        at += step;
    }
    at.max(now)
}

impl Sim {
    fn bounds_for(&self, to: Endpoint) -> (Duration, Duration, Duration) {
        let b = &self.spec.cluster.bounds;
        match to {
            Endpoint::Origin => (b.origin_dial, b.origin_header, b.origin_request),
            Endpoint::Node(_) => (b.peer_dial, b.peer_header, b.peer_request),
        }
    }

    /// Starts an exchange from node `n` to `to`; returns its id.
    pub(crate) fn start_call(
        &mut self,
        n: usize,
        to: Endpoint,
        url: String,
        request: CallRequest,
        purpose: Purpose,
    ) -> CallId {
        debug_assert!(self.nodes[n].up, "a down node makes no calls");
        let id = CallId(self.next_call);
        self.next_call += 1;
        let from = Endpoint::Node(n);
        let (dial, header, _) = self.bounds_for(to);
        let warm = self.net.is_warm(from, to);
        let now = self.now;
        let stage = match self.net.path(from, to) {
            PathState::Open => {
                let handshake = if warm {
                    Duration::ZERO
                } else {
                    self.net.latency(from, to) + self.net.latency(to, from)
                };
                Stage::Request { arrive_at: now + handshake + self.net.latency(from, to) }
            }
            PathState::Refused => {
                self.net.set_warm(from, to, false);
                let rtt = self.net.latency(from, to) + self.net.latency(to, from);
                let failure = if warm { CallFailure::Reset } else { CallFailure::DialFailed };
                Stage::Failed { failure, at: now + rtt }
            }
            PathState::Silent => {
                let (leg, deadline, failure) = if warm {
                    (Leg::Request, now + header, CallFailure::HeaderTimeout)
                } else {
                    (Leg::Dial, now + dial, CallFailure::DialFailed)
                };
                Stage::Stalled { since: now, leg, head_at: now, done_at: now, deadline, failure }
            }
        };
        self.trace.line(now, format_args!("call {id} n{n} -> {to} {request} {stage}"));
        let incarnation = self.nodes[n].incarnation;
        let call = Call {
            node: n,
            incarnation,
            to,
            url,
            request,
            purpose,
            sent: now,
            stage,
            answer: None,
            dialed: !warm,
            cut_through: false,
            head_delivered: false,
        };
        self.calls.insert(id, call);
        self.set_stage(id, stage);
        id
    }

    /// Moves call `id` to `stage` (times in the past become now) and pushes the event that moves
    /// it on; an event that finds its call in another stage, or at another time, is stale.
    fn set_stage(&mut self, id: CallId, stage: Stage) {
        let now = self.now;
        let stage = match stage {
            Stage::Request { arrive_at } => Stage::Request { arrive_at: arrive_at.max(now) },
            Stage::Response { head_at, done_at } => {
                Stage::Response { head_at, done_at: done_at.max(now) }
            }
            Stage::Stalled { since, leg, head_at, done_at, deadline, failure } => Stage::Stalled {
                since,
                leg,
                head_at,
                done_at,
                deadline: deadline.max(now),
                failure,
            },
            Stage::Failed { failure, at } => Stage::Failed { failure, at: at.max(now) },
            Stage::Serving { deadline } => Stage::Serving { deadline: deadline.max(now) },
            Stage::Streaming { head_at, floor, deadline } => {
                Stage::Streaming { head_at, floor, deadline: deadline.max(now) }
            }
        };
        let head = match stage {
            Stage::Response { head_at, .. } | Stage::Streaming { head_at, .. } => Some(head_at),
            Stage::Request { .. }
            | Stage::Stalled { .. }
            | Stage::Failed { .. }
            | Stage::Serving { .. } => None,
        };
        let call = &self.calls[&id];
        if let (Some(head_at), true) = (head, call.cut_through && !call.head_delivered) {
            let streamable = match (&call.answer, &call.request) {
                (None, _) => true,
                (Some(CallAnswer::Peer(r)), CallRequest::Peer(q)) => {
                    r.status == 200 && r.content_length.is_none_or(|n| n <= q.expected_len)
                }
                (Some(_), _) => false,
            };
            if streamable {
                self.queue.push(head_at.max(now), Event::CallHead { call: id });
            }
        }
        let (at, event) = match stage {
            Stage::Serving { deadline } => (deadline, Event::CallError { call: id }),
            Stage::Streaming { deadline, .. } => (deadline, Event::CallError { call: id }),
            Stage::Request { arrive_at } => (arrive_at, Event::CallArrive { call: id }),
            Stage::Response { done_at, .. } => (done_at, Event::CallReply { call: id }),
            Stage::Stalled { deadline, .. } => (deadline, Event::CallError { call: id }),
            Stage::Failed { at, .. } => (at, Event::CallError { call: id }),
        };
        self.calls.get_mut(&id).expect("a live call").stage = stage;
        self.queue.push(at, event);
    }

    /// A call is void when its caller has crashed since it was made.
    fn live_call(&self, id: CallId) -> Option<&Call> {
        let call = self.calls.get(&id)?;
        (self.nodes[call.node].incarnation == call.incarnation).then_some(call)
    }

    pub(crate) fn call_arrive(&mut self, id: CallId) {
        let now = self.now;
        let Some(call) = self.live_call(id) else {
            self.calls.remove(&id);
            return;
        };
        if call.stage != (Stage::Request { arrive_at: now }) {
            return; // stalled or re-timed since this event was scheduled
        }
        let (n, to, dialed) = (call.node, call.to, call.dialed);
        if dialed {
            self.net.set_warm(Endpoint::Node(n), to, true);
        }
        match to {
            Endpoint::Origin => self.origin_arrive(id),
            Endpoint::Node(j) => {
                let (_, header, _) = self.bounds_for(to);
                let deadline = self.calls[&id].sent + header;
                self.set_stage(id, Stage::Serving { deadline });
                self.peer_arrive(id, j);
            }
        }
    }

    fn origin_arrive(&mut self, id: CallId) {
        let now = self.now;
        let call = &self.calls[&id];
        let (n, to, sent) = (call.node, call.to, call.sent);
        let CallRequest::Origin(request) = &call.request else {
            unreachable!("origin calls carry origin requests");
        };
        let (url, request) = (call.url.clone(), request.clone());
        let from = Endpoint::Node(n);
        let answer = self.origin.answer(now, &url, &request);
        let (_, header, _) = self.bounds_for(to);
        let body = crate::shell::body_bytes_read(&request, &answer);
        self.trace.line(
            now,
            format_args!(
                "arrive {id} origin status={} body={body}B delay={:?}{}",
                answer.status,
                answer.delay,
                if answer.stalled { " stalled" } else { "" }
            ),
        );
        let stage = if answer.stalled {
            Stage::Failed { failure: CallFailure::HeaderTimeout, at: sent + header }
        } else {
            let ready = now + answer.delay;
            let (head_at, done_at) = self.net.transfer(to, from, HEAD_BYTES + body, ready);
            self.origin.account(done_at, body);
            self.respond_stage(id, head_at, done_at)
        };
        self.calls.get_mut(&id).expect("live call").answer = Some(CallAnswer::Origin(answer));
        self.set_stage(id, stage);
    }

    /// The callee of peer call `id` answers now with `reply` (its relay read ended). Ignored if
    /// the caller already gave up or crashed.
    pub(crate) fn peer_respond(&mut self, id: CallId, reply: PeerReply) {
        let now = self.now;
        let Some(call) = self.live_call(id) else {
            self.calls.remove(&id);
            return;
        };
        let (from, to, sent, stage) = (Endpoint::Node(call.node), call.to, call.sent, call.stage);
        let has_answer = call.answer.is_some();
        let stage = match stage {
            Stage::Serving { .. } => {
                let bytes = HEAD_BYTES + reply.body.len() as u64;
                let (head_at, done_at) = self.net.transfer(to, from, bytes, now);
                self.respond_stage(id, head_at, done_at)
            }
            Stage::Streaming { head_at, floor, .. } => {
                let done_at = floor.max(now + self.net.latency(to, from));
                self.within_bounds(sent, to, Stage::Response { head_at, done_at })
            }
            Stage::Stalled { leg: Leg::Response, .. } if !has_answer => {
                // The stream's tail is ready while the path is silent: it resumes with the rest.
                self.calls.get_mut(&id).expect("live call").answer = Some(CallAnswer::Peer(reply));
                return;
            }
            Stage::Request { .. }
            | Stage::Response { .. }
            | Stage::Stalled { .. }
            | Stage::Failed { .. } => return,
        };
        self.calls.get_mut(&id).expect("live call").answer = Some(CallAnswer::Peer(reply));
        self.set_stage(id, stage);
    }

    /// A cut-through relay serving call `id` commits its head now and streams a body of
    /// `len` bytes as its own upstream delivers it.
    pub(crate) fn peer_stream_head(&mut self, id: CallId, len: u64) {
        let now = self.now;
        let Some(call) = self.live_call(id) else {
            self.calls.remove(&id);
            return;
        };
        if !matches!(call.stage, Stage::Serving { .. }) {
            return; // the caller gave up
        }
        let (from, to, sent) = (Endpoint::Node(call.node), call.to, call.sent);
        let (_, header, total) = self.bounds_for(to);
        let (head_at, floor) = self.net.transfer(to, from, HEAD_BYTES + len, now);
        let stage = if head_at > sent + header {
            Stage::Failed { failure: CallFailure::HeaderTimeout, at: sent + header }
        } else if self.net.path(to, from) != PathState::Open {
            Stage::Stalled {
                since: now,
                leg: Leg::Response,
                head_at,
                done_at: floor,
                deadline: sent + header,
                failure: CallFailure::HeaderTimeout,
            }
        } else {
            Stage::Streaming { head_at, floor, deadline: sent + total }
        };
        self.trace.line(now, format_args!("stream {id} {stage}"));
        self.set_stage(id, stage);
    }

    /// The 200 head of cut-through call `id` reached its caller.
    pub(crate) fn call_head(&mut self, id: CallId) {
        let now = self.now;
        let Some(call) = self.live_call(id) else { return };
        let at_head = match call.stage {
            Stage::Response { head_at, .. } | Stage::Streaming { head_at, .. } => head_at == now,
            Stage::Request { .. }
            | Stage::Stalled { .. }
            | Stage::Failed { .. }
            | Stage::Serving { .. } => false,
        };
        if !at_head || call.head_delivered {
            return;
        }
        let Purpose::Peer(rid) = call.purpose else {
            unreachable!("only peer fetches cut through");
        };
        let n = call.node;
        self.calls.get_mut(&id).expect("live call").head_delivered = true;
        self.trace.line(now, format_args!("head {id} n{n}"));
        self.touch(n);
        self.peer_started(n, rid);
    }

    /// The stage of call `id` once its response leaves now with these times: travelling, stalled
    /// on a silent path, or failed against the caller's bounds.
    fn respond_stage(&self, id: CallId, head_at: Instant, done_at: Instant) -> Stage {
        let call = &self.calls[&id];
        let (from, to) = (Endpoint::Node(call.node), call.to);
        let (_, header, _) = self.bounds_for(to);
        match self.net.path(to, from) {
            PathState::Open => {
                self.within_bounds(call.sent, to, Stage::Response { head_at, done_at })
            }
            PathState::Refused | PathState::Silent => Stage::Stalled {
                since: self.now,
                leg: Leg::Response,
                head_at,
                done_at,
                deadline: call.sent + header,
                failure: CallFailure::HeaderTimeout,
            },
        }
    }

    /// Fails, as a reset, every call being served by or travelling to node `n`, whose process
    /// just died.
    pub(crate) fn reset_calls_to(&mut self, n: usize) {
        let ids: Vec<CallId> = self
            .calls
            .iter()
            .filter(|(_, c)| c.to == Endpoint::Node(n))
            .filter(|(_, c)| {
                matches!(
                    c.stage,
                    Stage::Request { .. } | Stage::Serving { .. } | Stage::Streaming { .. }
                )
            })
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let from = Endpoint::Node(self.calls[&id].node);
            let back = self.net.latency(Endpoint::Node(n), from);
            self.trace.line(self.now, format_args!("reset {id}"));
            self.set_stage(id, Stage::Failed { failure: CallFailure::Reset, at: self.now + back });
        }
    }

    /// `stage` if a response with these times meets the caller's bounds, else its failure.
    fn within_bounds(&self, sent: Instant, to: Endpoint, stage: Stage) -> Stage {
        let Stage::Response { head_at, done_at } = stage else {
            return stage;
        };
        let (_, header, total) = self.bounds_for(to);
        if head_at > sent + header {
            Stage::Failed { failure: CallFailure::HeaderTimeout, at: sent + header }
        } else if done_at > sent + total {
            Stage::Failed { failure: CallFailure::BodyTimeout, at: sent + total }
        } else {
            stage
        }
    }

    pub(crate) fn call_reply(&mut self, id: CallId) {
        let now = self.now;
        let Some(call) = self.live_call(id) else {
            self.calls.remove(&id);
            return;
        };
        if !matches!(call.stage, Stage::Response { done_at, .. } if done_at == now) {
            return;
        }
        let call = self.calls.remove(&id).expect("live call");
        let Some(answer) = call.answer.clone() else {
            self.violate(Some(call.node), format!("call {id} delivered a response it never got"));
            return;
        };
        let (status, len) = match &answer {
            CallAnswer::Origin(a) => (a.status, a.body.len),
            CallAnswer::Peer(p) => (p.status, p.body.len() as u64),
        };
        self.trace.line(now, format_args!("reply {id} n{} status={status} body={len}B", call.node));
        self.touch(call.node);
        self.on_call_done(call, Ok(answer));
    }

    pub(crate) fn call_error(&mut self, id: CallId) {
        let now = self.now;
        let Some(call) = self.live_call(id) else {
            self.calls.remove(&id);
            return;
        };
        let failure = match call.stage {
            Stage::Failed { failure, at } | Stage::Stalled { deadline: at, failure, .. }
                if at == now =>
            {
                failure
            }
            Stage::Serving { deadline } if deadline == now => CallFailure::HeaderTimeout,
            Stage::Streaming { deadline, .. } if deadline == now => CallFailure::BodyTimeout,
            Stage::Failed { .. }
            | Stage::Stalled { .. }
            | Stage::Serving { .. }
            | Stage::Streaming { .. }
            | Stage::Request { .. }
            | Stage::Response { .. } => return,
        };
        let call = self.calls.remove(&id).expect("live call");
        if failure != CallFailure::DialFailed {
            self.net.set_warm(Endpoint::Node(call.node), call.to, false);
        }
        self.trace.line(now, format_args!("fail {id} n{} {failure}", call.node));
        self.touch(call.node);
        self.on_call_done(call, Err(failure));
    }

    /// Stalls every call travelling over a path that just went silent.
    pub(crate) fn stall_silenced_calls(&mut self) {
        let now = self.now;
        let ids: Vec<CallId> = self.calls.keys().copied().collect();
        for id in ids {
            let call = &self.calls[&id];
            let from = Endpoint::Node(call.node);
            let (_, header, total) = self.bounds_for(call.to);
            let stalled = match call.stage {
                Stage::Request { .. } if self.net.path(from, call.to) == PathState::Silent => {
                    Stage::Stalled {
                        since: now,
                        leg: Leg::Request,
                        head_at: now,
                        done_at: now,
                        deadline: call.sent + header,
                        failure: CallFailure::HeaderTimeout,
                    }
                }
                Stage::Response { head_at, done_at }
                    if self.net.path(call.to, from) == PathState::Silent =>
                {
                    let (deadline, failure) = if head_at <= now {
                        (call.sent + total, CallFailure::BodyTimeout)
                    } else {
                        (call.sent + header, CallFailure::HeaderTimeout)
                    };
                    Stage::Stalled {
                        since: now,
                        leg: Leg::Response,
                        head_at,
                        done_at,
                        deadline,
                        failure,
                    }
                }
                Stage::Streaming { head_at, floor, .. }
                    if self.net.path(call.to, from) == PathState::Silent =>
                {
                    let (deadline, failure) = if head_at <= now {
                        (call.sent + total, CallFailure::BodyTimeout)
                    } else {
                        (call.sent + header, CallFailure::HeaderTimeout)
                    };
                    Stage::Stalled {
                        since: now,
                        leg: Leg::Response,
                        head_at,
                        done_at: floor,
                        deadline,
                        failure,
                    }
                }
                Stage::Request { .. }
                | Stage::Response { .. }
                | Stage::Streaming { .. }
                | Stage::Serving { .. }
                | Stage::Stalled { .. }
                | Stage::Failed { .. } => continue,
            };
            self.trace.line(now, format_args!("stall {id} {stalled}"));
            self.set_stage(id, stalled);
        }
    }

    /// Resumes every stalled call whose path is open again, at its next retransmission.
    pub(crate) fn resume_healed_calls(&mut self) {
        let now = self.now;
        let ids: Vec<CallId> = self.calls.keys().copied().collect();
        for id in ids {
            let call = &self.calls[&id];
            let Stage::Stalled { since, leg, head_at, done_at, deadline, .. } = call.stage else {
                continue;
            };
            let from = Endpoint::Node(call.node);
            let (to, sent) = (call.to, call.sent);
            let open = match leg {
                Leg::Dial => {
                    self.net.path(from, to) == PathState::Open
                        && self.net.path(to, from) == PathState::Open
                }
                Leg::Request => self.net.path(from, to) == PathState::Open,
                Leg::Response => self.net.path(to, from) == PathState::Open,
            };
            if !open {
                continue;
            }
            let resumed = match leg {
                Leg::Dial => {
                    let syn = next_retransmission(since, SYN_RETRY_DELAY, now);
                    if syn > deadline {
                        continue; // the dial bound fires first
                    }
                    let rtt = self.net.latency(from, to) + self.net.latency(to, from);
                    Stage::Request { arrive_at: syn + rtt + self.net.latency(from, to) }
                }
                Leg::Request => {
                    let at = next_retransmission(since, RETRANSMIT_DELAY, now);
                    Stage::Request { arrive_at: at + self.net.latency(from, to) }
                }
                Leg::Response => {
                    let at = next_retransmission(since, RETRANSMIT_DELAY, now);
                    let shift = at.saturating_duration_since(since);
                    let head_at = if head_at > since { head_at + shift } else { head_at };
                    if self.calls[&id].answer.is_none() {
                        // A stream whose relay has not finished: it keeps streaming.
                        let (_, _, total) = self.bounds_for(to);
                        Stage::Streaming { head_at, floor: done_at + shift, deadline: sent + total }
                    } else {
                        let stage = Stage::Response { head_at, done_at: done_at + shift };
                        self.within_bounds(sent, to, stage)
                    }
                }
            };
            if let Stage::Request { arrive_at } = resumed {
                if arrive_at > deadline {
                    continue;
                }
            }
            self.trace.line(now, format_args!("resume {id} {resumed}"));
            self.set_stage(id, resumed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retransmissions_back_off_exponentially_from_the_stall() {
        let t = |ms| Instant::from_millis(ms);
        let d = Duration::from_millis(200);
        assert_eq!(next_retransmission(t(0), d, t(0)), t(200));
        assert_eq!(next_retransmission(t(0), d, t(201)), t(600));
        assert_eq!(next_retransmission(t(0), d, t(1000)), t(1400));
        assert_eq!(next_retransmission(t(0), SYN_RETRY_DELAY, t(2000)), t(3000));
    }
}
