//! Calls over the simulated network: starting one for a machine's `Output::Send`, its stages
//! (dial, request, the callee's work, response), what faults do to it on the way, and the
//! [`IoEvent`]s its caller's machine is told at simulated times.

use super::{Event, Sim, Step};
use crate::calls::{
    group_at, group_ends, next_retransmission, Answer, Body, Call, CallId, CallKind, Leg, Stage,
    SYN_RETRY_DELAY,
};
use crate::net::{Endpoint, PathState, RETRANSMIT_DELAY};
use crate::origin::{OriginRequest, HEAD_BYTES};
use crate::workload::RangeSpec;
use bytes::Bytes;
use dart_core::node::{Inbound, Input, IoError, IoEvent, IoRequest, Plane, RequestId};
use dart_core::time::Instant;

impl Sim {
    /// Starts the call that carries node `n`'s exchange `req`; returns it and whether the caller
    /// is connected at once (a warm pooled connection).
    pub(super) fn start_call(
        &mut self,
        n: usize,
        req: IoRequest,
        kind: CallKind,
        window: Option<(usize, usize, u64, u64)>,
    ) -> (CallId, bool) {
        let id = CallId(self.next_call);
        self.next_call += 1;
        let from = Endpoint::Node(n);
        let to = match kind {
            CallKind::Peer { node } => Endpoint::Node(node),
            CallKind::Probe { .. } | CallKind::Window { .. } | CallKind::Passthrough { .. } => {
                Endpoint::Origin
            }
        };
        let warm = self.net.is_warm(from, to);
        let now = self.now;
        let (stage, error) = match self.net.path(from, to) {
            PathState::Open => {
                let connect_at = (!warm).then(|| now + self.rtt(from, to));
                let arrive_at = connect_at.unwrap_or(now) + self.net.latency(from, to);
                (Stage::Request { connect_at, arrive_at }, None)
            }
            PathState::Refused => {
                self.net.set_warm(from, to, false);
                let at = now + self.rtt(from, to);
                let error = if warm {
                    IoError::Broken("connection reset by peer".into())
                } else {
                    IoError::Connect("connection refused".into())
                };
                (Stage::Failing { at }, Some(error))
            }
            PathState::Silent => {
                let leg = if warm { Leg::Request } else { Leg::Dial };
                (Stage::Stalled { since: now, leg, head_at: now, done_at: now }, None)
            }
        };
        self.trace.line(now, format_args!("send n{n} {} {id} -> {to} {kind} {stage}", req.id));
        if let Some(w) = window {
            let count = self.origin_windows.entry(w).or_default();
            *count += 1;
            if *count > 1 {
                let what = format!("two origin requests in flight for o{} {}-{}", w.1, w.2, w.3);
                self.violate(Some(n), what);
            }
        }
        let call = Call {
            node: n,
            io: req.id,
            to,
            url: req.url,
            headers: req.headers,
            method: req.method,
            body: req.body,
            kind,
            sent: now,
            stage,
            gen: 0,
            connected: warm,
            dialed: !warm,
            head_delivered: false,
            parts_delivered: 0,
            answer: None,
            error,
            pipe_to: None,
            callee_request: None,
            window,
            egress: None,
        };
        self.calls.insert(id, Box::new(call));
        self.set_stage(id, stage);
        (id, warm)
    }

    fn rtt(&mut self, a: Endpoint, b: Endpoint) -> std::time::Duration {
        self.net.latency(a, b) + self.net.latency(b, a)
    }

    /// Moves call `id` to `stage` (times in the past become now) and schedules what it does
    /// next; events of its earlier stages become stale.
    pub(super) fn set_stage(&mut self, id: CallId, stage: Stage) {
        let now = self.now;
        let block = self.block_bytes();
        let call = self.calls.get_mut(&id).expect("a live call");
        call.gen += 1;
        let gen = call.gen;
        call.stage = stage;
        let mut push = |at: Instant, step: Step| {
            self.queue.push(at.max(now), Event::Call { call: id, gen, step });
        };
        match stage {
            Stage::Request { connect_at, arrive_at } => {
                if let Some(at) = connect_at {
                    push(at, Step::Connected);
                }
                push(arrive_at, Step::Arrive);
            }
            Stage::Serving | Stage::Stalled { .. } => {}
            Stage::Failing { at } => push(at, Step::Fail),
            Stage::Streaming { head_at, .. } => {
                if !call.head_delivered {
                    push(head_at, Step::Head);
                }
            }
            Stage::Response { head_at, done_at } => {
                if !call.head_delivered {
                    push(head_at, Step::Head);
                }
                let (at, step) = next_body_step(call, head_at, done_at, block);
                push(at, step);
            }
        }
    }

    fn block_bytes(&self) -> u64 {
        self.spec.cluster.geometry.block_bytes()
    }

    /// Handles a step of call `id` scheduled in generation `gen`.
    pub(super) fn call_step(&mut self, id: CallId, gen: u32, step: Step) {
        let Some(call) = self.calls.get(&id) else { return };
        if call.gen != gen {
            return; // the call changed stage since
        }
        let n = call.node;
        match step {
            Step::Connected => {
                let call = self.calls.get_mut(&id).expect("a live call");
                call.connected = true;
                let io = call.io;
                self.feed(n, Input::Io { id: io, event: IoEvent::Connected });
            }
            Step::Arrive => self.arrive(id),
            Step::Head => {
                let call = self.calls.get_mut(&id).expect("a live call");
                call.head_delivered = true;
                call.connected = true;
                let answer = call.answer.as_mut().expect("a head of an answer");
                // Only the status is looked at after the head went out.
                let (status, headers) = (answer.status, std::mem::take(&mut answer.headers));
                let io = call.io;
                self.feed(n, Input::Io { id: io, event: IoEvent::Head { status, headers } });
            }
            Step::Group(i) => {
                self.deliver_group(id, i);
                let Some(call) = self.calls.get(&id) else { return };
                let Stage::Response { head_at, done_at } = call.stage else { return };
                let (at, step) = next_body_step(call, head_at, done_at, self.block_bytes());
                let gen = call.gen;
                self.queue.push(at.max(self.now), Event::Call { call: id, gen, step });
            }
            Step::Tail => self.tail(id),
            Step::Fail => {
                let call = self.remove_call(id, false).expect("a live call");
                let error = call.error.clone().expect("a failing call knows why");
                if matches!(error, IoError::Broken(_)) {
                    self.net.set_warm(Endpoint::Node(n), call.to, false);
                }
                self.trace.line(self.now, format_args!("fail {id} n{n} {error}"));
                self.feed(n, Input::Io { id: call.io, event: IoEvent::Failed(error) });
            }
        }
    }

    /// Delivers body group `i` of call `id` (to its caller's machine, or piped to a client).
    fn deliver_group(&mut self, id: CallId, i: usize) {
        let block_bytes = self.block_bytes();
        let call = self.calls.get_mut(&id).expect("a live call");
        let (n, io, pipe) = (call.node, call.io, call.pipe_to);
        let answer = call.answer.as_mut().expect("a body of an answer");
        let parts: Vec<Bytes> = match &mut answer.body {
            // A peer answer is one group: its parts are delivered once.
            Body::Parts(parts) => std::mem::take(parts),
            &mut Body::Window { object, version, start, len } => {
                let ends = group_ends(&Body::Window { object, version, start, len }, block_bytes);
                let from = if i == 0 { 0 } else { ends[i - 1] };
                let to = ends[i].min(len);
                // The answer is of the version current when the origin answered, to its end.
                let shape = self.origin.versions(object)[version].shape;
                let bytes = to - from;
                self.origin.account(self.now, bytes);
                if bytes == 0 {
                    Vec::new()
                } else {
                    vec![self.contents.window(shape, start + from, bytes)]
                }
            }
        };
        self.calls.get_mut(&id).expect("a live call").parts_delivered = i + 1;
        if let Some(rid) = pipe {
            let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
            self.piped(n, rid, len);
            return;
        }
        for data in parts {
            if !self.calls.contains_key(&id) {
                return; // the machine gave up on the rest
            }
            self.feed(n, Input::Io { id: io, event: IoEvent::Body(data) });
        }
    }

    /// The last body group of call `id` and its end.
    fn tail(&mut self, id: CallId) {
        let (groups, len) = {
            let call = &self.calls[&id];
            let answer = call.answer.as_ref().expect("a tail of an answer");
            (group_ends(&answer.body, self.block_bytes()).len(), answer.body.len())
        };
        self.deliver_group(id, groups - 1);
        if !self.calls.contains_key(&id) {
            return;
        }
        let call = self.remove_call(id, false).expect("a live call");
        let n = call.node;
        let answer = call.answer.expect("a tail of an answer");
        let event = match answer.ending.expect("a complete answer") {
            None => IoEvent::End,
            Some(why) => {
                self.net.set_warm(Endpoint::Node(n), call.to, false);
                IoEvent::Failed(IoError::Broken(why))
            }
        };
        self.trace.line(self.now, format_args!("done {id} n{n} {len}B {event:?}"));
        self.feed(n, Input::Io { id: call.io, event });
    }

    /// Call `id`'s request reaches its callee.
    fn arrive(&mut self, id: CallId) {
        let call = self.calls.get_mut(&id).expect("a live call");
        call.connected = true;
        let (n, to, dialed) = (call.node, call.to, call.dialed);
        if dialed {
            self.net.set_warm(Endpoint::Node(n), to, true);
        }
        match to {
            Endpoint::Origin => self.origin_arrive(id),
            Endpoint::Node(j) => self.peer_arrive(id, j),
        }
    }

    fn origin_arrive(&mut self, id: CallId) {
        let now = self.now;
        let call = &self.calls[&id];
        let n = call.node;
        let (object, request) = match call.kind {
            CallKind::Probe { object } => (object, OriginRequest::Probe),
            CallKind::Window { object, start, end } => {
                (object, OriginRequest::Range { start, end })
            }
            CallKind::Passthrough { object } => {
                let range = RangeSpec::parse(call.headers.get("range")).unwrap_or(RangeSpec::Whole);
                (object, OriginRequest::Passthrough { range })
            }
            CallKind::Peer { .. } => unreachable!("origin calls carry origin requests"),
        };
        let url = call.url.clone();
        let answer = self.origin.answer(now, &url, &request);
        self.trace.line(
            now,
            format_args!(
                "origin {id} {} {}B delay={:?}{}{}",
                answer.status,
                answer.body.len,
                answer.delay,
                if answer.stalled { " stalled" } else { "" },
                // Later versions only, so that runs of unchanging objects trace as before.
                if answer.version > 0 { format!(" v{}", answer.version) } else { String::new() }
            ),
        );
        if answer.stalled {
            // Accepted and never answered: only the caller's head bound ends it.
            self.set_stage(id, Stage::Serving);
            return;
        }
        let truncated = answer.content_length.is_some_and(|l| l > answer.body.len);
        let reply = Answer {
            status: answer.status,
            headers: answer.headers(),
            body: Body::Window {
                object,
                version: answer.version,
                start: answer.body.start,
                len: answer.body.len,
            },
            ending: Some(truncated.then(|| "connection closed before the body ended".into())),
        };
        let (from, to) = (Endpoint::Origin, Endpoint::Node(n));
        let ready = now + answer.delay;
        let (head_at, done_at, slot) =
            self.net.transfer_slot(from, to, HEAD_BYTES + answer.body.len, ready);
        let call = self.calls.get_mut(&id).expect("a live call");
        call.answer = Some(reply);
        call.egress = slot.map(|s| (from, s.0, s.1));
        let stage = self.respond_stage(id, head_at, done_at);
        self.set_stage(id, stage);
    }

    /// Peer request `id` reached node `j`'s peer listener: handed to its machine, unless the
    /// plane is stalled (accepted, never answered).
    fn peer_arrive(&mut self, id: CallId, j: usize) {
        let n = self.calls[&id].node;
        if !self.nodes[j].is_up() {
            let at = self.now + self.net.latency(Endpoint::Node(j), Endpoint::Node(n));
            self.calls.get_mut(&id).expect("a live call").error =
                Some(IoError::Broken("connection reset by peer".into()));
            self.set_stage(id, Stage::Failing { at });
            return;
        }
        self.set_stage(id, Stage::Serving);
        if self.nodes[j].peer_faults.stalls > 0 {
            self.trace.line(self.now, format_args!("held {id} n{j}"));
            return;
        }
        let call = self.calls.get_mut(&id).expect("a live call");
        let authority = call.url.strip_prefix("http://").unwrap_or(&call.url);
        let target = authority.find('/').map_or("/", |i| &authority[i..]).to_owned();
        let path = target.split_once('?').map_or(target.as_str(), |(p, _)| p);
        let key = dart_core::codec::wire::parse_block_path(path).ok();
        let headers = std::mem::take(&mut call.headers);
        let (method, mut body) = (call.method, std::mem::take(&mut call.body));
        // What the tokio driver hands over: the body the node reads, at most one byte past its
        // limit; none for the others.
        match Inbound::body_max(Plane::Peer, method) {
            Some(max) => body.truncate(max + 1),
            None => body.clear(),
        }
        let rid = self.nodes[j].next_request_id();
        self.calls.get_mut(&id).expect("a live call").callee_request = Some(rid);
        self.nodes[j].peers.insert(
            rid,
            crate::node::PeerRequest {
                call: id,
                key,
                head: None,
                body: Vec::new(),
                body_len: 0,
                head_sent: false,
                ended: None,
                lie: None,
            },
        );
        let request = Inbound { method: method.into(), target, headers, body };
        self.feed(j, Input::Request { id: rid, plane: Plane::Peer, request });
    }

    /// The stage of call `id` once its response leaves now with these times: travelling, or
    /// stalled on a silent path.
    pub(super) fn respond_stage(&self, id: CallId, head_at: Instant, done_at: Instant) -> Stage {
        let call = &self.calls[&id];
        match self.net.path(call.to, Endpoint::Node(call.node)) {
            PathState::Open => Stage::Response { head_at, done_at },
            PathState::Refused | PathState::Silent => {
                Stage::Stalled { since: self.now, leg: Leg::Response, head_at, done_at }
            }
        }
    }

    /// Forgets call `id` (its caller's machine has no more use for it, or died): its origin
    /// window is free, the rest of its response is not sent, and a callee node serving it hears
    /// the caller go away one latency later. With `dropped` the caller abandoned it early.
    pub(super) fn remove_call(&mut self, id: CallId, dropped: bool) -> Option<Box<Call>> {
        let call = self.calls.remove(&id)?;
        if let Some(w) = call.window {
            if let Some(c) = self.origin_windows.get_mut(&w) {
                *c -= 1;
                if *c == 0 {
                    self.origin_windows.remove(&w);
                }
            }
        }
        if self.nodes[call.node].exchanges.get(&call.io) == Some(&id) {
            self.nodes[call.node].exchanges.remove(&call.io);
        }
        if dropped {
            if let Some((from, start, end)) = call.egress {
                self.net.release(from, (start, end), self.now);
            }
            let from = Endpoint::Node(call.node);
            if let (Some(j), Some(rid)) = (call.to_node(), call.callee_request) {
                let serving = self.nodes[j].peers.get(&rid).is_some_and(|p| p.call == id);
                if serving && self.net.path(from, call.to) != PathState::Silent {
                    let at = self.now + self.net.latency(from, call.to);
                    let incarnation = self.nodes[j].incarnation;
                    self.queue.push(at, Event::PeerCancel { node: j, incarnation, request: rid });
                }
            }
        }
        Some(call)
    }

    /// Node `j` hears that the caller of its peer request `rid` went away.
    pub(super) fn peer_cancel(&mut self, j: usize, incarnation: u32, rid: RequestId) {
        let node = &mut self.nodes[j];
        if node.incarnation != incarnation || node.peers.remove(&rid).is_none() {
            return;
        }
        self.trace.line(self.now, format_args!("hangup n{j} {rid}"));
        self.feed(j, Input::Cancel { id: rid });
    }

    /// Resets every call being served by or travelling to node `n`, whose process just died.
    pub(super) fn reset_calls_to(&mut self, n: usize) {
        let ids: Vec<CallId> = self
            .calls
            .iter()
            .filter(|(_, c)| c.to == Endpoint::Node(n))
            .filter(|(_, c)| {
                matches!(c.stage, Stage::Request { .. } | Stage::Serving | Stage::Streaming { .. })
            })
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let call = self.calls.get_mut(&id).expect("a live call");
            let caller = Endpoint::Node(call.node);
            call.error = Some(if call.connected || matches!(call.stage, Stage::Serving) {
                IoError::Broken("connection reset by peer".into())
            } else {
                IoError::Connect("connection refused".into())
            });
            let back = self.net.latency(Endpoint::Node(n), caller);
            self.trace.line(self.now, format_args!("reset {id}"));
            self.set_stage(id, Stage::Failing { at: self.now + back });
        }
    }

    /// Stalls every call travelling over a path that just went silent.
    pub(super) fn stall_silenced_calls(&mut self) {
        let now = self.now;
        let ids: Vec<CallId> = self.calls.keys().copied().collect();
        for id in ids {
            let call = &self.calls[&id];
            let from = Endpoint::Node(call.node);
            let stalled = match call.stage {
                Stage::Request { connect_at, .. }
                    if self.net.path(from, call.to) == PathState::Silent =>
                {
                    let dialing = connect_at.is_some_and(|c| c > now) && !call.connected;
                    let leg = if dialing { Leg::Dial } else { Leg::Request };
                    Stage::Stalled { since: now, leg, head_at: now, done_at: now }
                }
                Stage::Response { head_at, done_at }
                    if self.net.path(call.to, from) == PathState::Silent =>
                {
                    Stage::Stalled { since: now, leg: Leg::Response, head_at, done_at }
                }
                Stage::Streaming { head_at, floor }
                    if self.net.path(call.to, from) == PathState::Silent =>
                {
                    Stage::Stalled { since: now, leg: Leg::Response, head_at, done_at: floor }
                }
                Stage::Request { .. }
                | Stage::Response { .. }
                | Stage::Streaming { .. }
                | Stage::Serving
                | Stage::Stalled { .. }
                | Stage::Failing { .. } => continue,
            };
            self.trace.line(now, format_args!("stall {id} {stalled}"));
            self.set_stage(id, stalled);
        }
    }

    /// Resumes every stalled call whose path is open again, at its next retransmission.
    pub(super) fn resume_healed_calls(&mut self) {
        let now = self.now;
        let ids: Vec<CallId> = self.calls.keys().copied().collect();
        for id in ids {
            let call = &self.calls[&id];
            let Stage::Stalled { since, leg, head_at, done_at } = call.stage else {
                continue;
            };
            let (from, to) = (Endpoint::Node(call.node), call.to);
            let back = self.net.path(to, from) != PathState::Silent;
            if leg != Leg::Response && back && self.net.path(from, to) == PathState::Refused {
                // The callee's process died meanwhile: the retransmission meets a reset.
                let first = if leg == Leg::Dial { SYN_RETRY_DELAY } else { RETRANSMIT_DELAY };
                let at = next_retransmission(since, first, now) + self.rtt(from, to);
                let call = self.calls.get_mut(&id).expect("a live call");
                call.error = Some(if leg == Leg::Dial {
                    IoError::Connect("connection refused".into())
                } else {
                    IoError::Broken("connection reset by peer".into())
                });
                self.trace.line(now, format_args!("refused {id}"));
                self.set_stage(id, Stage::Failing { at });
                continue;
            }
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
            let complete = call.answer.as_ref().is_some_and(|a| a.ending.is_some());
            let resumed = match leg {
                Leg::Dial => {
                    let syn = next_retransmission(since, SYN_RETRY_DELAY, now);
                    let connect_at = syn + self.rtt(from, to);
                    Stage::Request {
                        connect_at: Some(connect_at),
                        arrive_at: connect_at + self.net.latency(from, to),
                    }
                }
                Leg::Request => {
                    let at = next_retransmission(since, RETRANSMIT_DELAY, now);
                    Stage::Request { connect_at: None, arrive_at: at + self.net.latency(from, to) }
                }
                Leg::Response => {
                    let at = next_retransmission(since, RETRANSMIT_DELAY, now);
                    let shift = at.saturating_duration_since(since);
                    let head_at = if head_at > since { head_at + shift } else { head_at };
                    if complete {
                        Stage::Response { head_at, done_at: done_at + shift }
                    } else {
                        // A stream whose relay has not finished: it keeps streaming.
                        Stage::Streaming { head_at, floor: done_at + shift }
                    }
                }
            };
            self.trace.line(now, format_args!("resume {id} {resumed}"));
            self.set_stage(id, resumed);
        }
    }
}

/// The next body step of a response with these times: the next group, or the tail.
fn next_body_step(call: &Call, head_at: Instant, done_at: Instant, block: u64) -> (Instant, Step) {
    let answer = call.answer.as_ref().expect("a response of an answer");
    let ends = group_ends(&answer.body, block);
    let i = call.parts_delivered;
    if i + 1 < ends.len() {
        (group_at(&ends, i, head_at, done_at), Step::Group(i))
    } else {
        (done_at, Step::Tail)
    }
}
