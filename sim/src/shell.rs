//! The node's shell, written against the simulator instead of tokio: it drives each core [`Read`]
//! exactly as `net-tokio`'s read driver does (answer `Probe`, `Lookup`, `FetchPeer` and
//! `FetchOrigin`; carry out `Store` and `Emit`; stop at `Finish`, `Fail` or `Passthrough`),
//! coalesces origin fetches through the core's `FlightTable` as `net-tokio`'s origin fetcher does
//! (the leader fills the cache, ends the flight, then publishes; joiners retry alone on a
//! refusal), and judges origin answers with the same core functions. Every checkable fact is
//! checked on the way. The peer half (client classification, peer server) is in `peer.rs`.
//!
//! [`Read`]: dart_core::engine::Read

use crate::calls::{Call, CallAnswer, CallFailure, CallRequest, PeerRequest, Purpose};
use crate::net::Endpoint;
use crate::node::{ActiveRead, Fill, FlightKey, FlightState, ReadId, ReadKind, Waiter, Waiting};
use crate::origin::{object_url, OriginAnswer, OriginRequest};
use crate::report::{BlockEvent, BlockSource, ReadOutcome};
use crate::sim::{Sim, ACTIONS_PER_DRIVE_MAX};
use crate::workload;
use bytes::Bytes;
use dart_core::engine::flight::{joiner_action, JoinerAction, Role};
use dart_core::engine::origin::{
    classify_probe, finish_range_body, plan_range_response, OriginError, ProbeOutcome,
};
use dart_core::engine::{
    block_verdict, Action, BlockClass, FetchedBlock, Method, ReadFailure, ReadRequest,
    ResponseHead, Verdict,
};
use dart_core::hash::BlockKey;

/// Body bytes the client actually reads from `answer` to `request` (the shell aborts the rest):
/// none for a probe, the window (after skipping to it) for a block fetch, all for passthrough.
pub fn body_bytes_read(request: &OriginRequest, answer: &OriginAnswer) -> u64 {
    match request {
        OriginRequest::Probe => 0,
        OriginRequest::Passthrough { .. } => answer.body.len,
        OriginRequest::Range { start, end } => {
            let cr = answer.content_range.as_deref().map(str::as_bytes);
            match plan_range_response(*start, *end, answer.status, cr, answer.content_length) {
                Ok(plan) => answer.body.len.min(plan.skip.saturating_add(plan.read_max)),
                Err(_) => 0,
            }
        }
    }
}

/// The shell's transport error for a failed exchange.
fn transport(failure: CallFailure) -> OriginError {
    OriginError::Transport(failure.to_string())
}

fn origin_answer(answer: Result<CallAnswer, CallFailure>) -> Result<OriginAnswer, OriginError> {
    match answer.map_err(transport)? {
        CallAnswer::Origin(a) => Ok(a),
        CallAnswer::Peer(_) => unreachable!("an origin call gets an origin answer"),
    }
}

/// A judged flight result.
#[derive(Clone, Debug)]
pub(crate) enum Judged {
    Probe(ProbeOutcome),
    Block(FetchedBlock),
}

impl Judged {
    fn kind(&self) -> &'static str {
        match self {
            Judged::Probe(_) => "probe",
            Judged::Block(_) => "block",
        }
    }
}

impl Sim {
    /// Judges an origin answer as `net-tokio`'s `probe_once` / `fetch_once` do: classify the
    /// probe; or plan from the head, skip, read at most `read_max`, judge the length.
    fn judge(
        &self,
        object: usize,
        key: &FlightKey,
        answer: Result<CallAnswer, CallFailure>,
    ) -> Result<Judged, OriginError> {
        let a = origin_answer(answer)?;
        let cr = a.content_range.as_deref().map(str::as_bytes);
        let (start, end) = match key {
            FlightKey::Probe(_) => {
                return classify_probe(a.status, cr, a.content_length).map(Judged::Probe)
            }
            FlightKey::Block(_, start, end) => (*start, *end),
        };
        let plan = plan_range_response(start, end, a.status, cr, a.content_length)?;
        let skipped_all = a.body.len >= plan.skip;
        let take = a.body.len.saturating_sub(plan.skip).min(plan.read_max);
        let shape = self.spec.cluster.objects[object].shape();
        let data = self.contents.window(shape, a.body.start + plan.skip, take);
        debug_assert_eq!(data.len() as u64, take);
        let body = finish_range_body(&plan, skipped_all, take)?;
        Ok(Judged::Block(FetchedBlock { data, body, coalesced: false }))
    }

    pub(crate) fn start_read(&mut self, record: usize) {
        let spec = self.read_spec(record);
        let n = spec.node % self.spec.cluster.nodes;
        let object = spec.object % self.spec.cluster.objects.len();
        let rid = ReadId(self.next_read);
        self.next_read += 1;
        let r = &mut self.records[record];
        r.started.get_or_insert(self.now);
        r.attempts += 1;
        r.bytes = 0;
        r.outcome = ReadOutcome::Pending;
        self.trace.line(
            self.now,
            format_args!("read {rid} n{n} o{object} {:?} {:?}", spec.range, spec.method),
        );
        if !self.nodes[n].up {
            self.close_record(record, ReadOutcome::Refused);
            return;
        }
        let expires = spec.expires.map_or(u64::MAX, |d| d.as_millis() as u64);
        let url = object_url(object, &format!("n{n}r{record}"), expires);
        let size = self.spec.cluster.objects[object].size;
        let expected = workload::expected(spec.range, size);
        let request = ReadRequest { url, method: spec.method, range: spec.range.header() };
        let node = &mut self.nodes[n];
        let read = node.engine.begin_read(request);
        let kind =
            ReadKind::Client { record, method: spec.method, next_offset: expected.start, expected };
        let active = ActiveRead {
            read,
            kind,
            object,
            waiting: None,
            permit: None,
            last_range_ignored: false,
            just_looked_up: false,
        };
        node.reads.insert(rid, active);
        self.touch(n);
        self.drive(n, rid);
    }

    /// Carries out `rid`'s actions until it waits for an answer or ends.
    pub(crate) fn drive(&mut self, n: usize, rid: ReadId) {
        for _ in 0..ACTIONS_PER_DRIVE_MAX {
            let Some(active) = self.nodes[n].reads.get_mut(&rid) else {
                return;
            };
            let Some(action) = active.read.poll_action() else {
                break;
            };
            self.act(n, rid, action);
            if self.violation.is_some() {
                return;
            }
        }
        let Some(active) = self.nodes[n].reads.get(&rid) else {
            return;
        };
        if active.waiting.is_none() {
            let what = format!("read {rid} ({:?}) waits for nothing", active.kind);
            self.violate(Some(n), what);
        }
    }

    fn act(&mut self, n: usize, rid: ReadId, action: Action) {
        let now = self.now;
        match action {
            Action::Probe { url } => self.ask_origin(n, rid, url, None),
            Action::Passthrough { url } => self.passthrough(n, rid, url),
            Action::Respond(head) => self.on_head(n, rid, head),
            Action::Lookup { key, window } => {
                let node = &mut self.nodes[n];
                let hit = match window {
                    Some(w) => node.cache.get(&key).and_then(|b| w.slice(&b)),
                    None => node.cache.get(&key),
                };
                let active = node.reads.get_mut(&rid).expect("driven read");
                if hit.is_some() && active.record().is_some() {
                    self.blocks.push(BlockEvent { at: now, node: n, source: BlockSource::Cache });
                }
                active.just_looked_up = true;
                active.last_range_ignored = false;
                active.read.handle_lookup(&mut node.engine, hit, now);
            }
            Action::FetchPeer { peer, key, url, hop, expected_len, permit, cut_through } => {
                let active = self.nodes[n].reads.get_mut(&rid).expect("driven read");
                active.waiting = Some(Waiting::Peer);
                active.permit = Some(permit);
                let Some(j) = crate::node::node_of_addr(&peer.addr) else {
                    self.violate(Some(n), format!("peer address {} of no node", peer.addr));
                    return;
                };
                if j == n {
                    self.violate(Some(n), "the engine routed a block to its own node".into());
                    return;
                }
                let request =
                    CallRequest::Peer(PeerRequest { key, url: url.clone(), hop, expected_len });
                let id = self.start_call(n, Endpoint::Node(j), url, request, Purpose::Peer(rid));
                // Only the response stages look at the flag, so setting it after the request
                // left is in time.
                if let Some(call) = self.calls.get_mut(&id) {
                    call.cut_through = cut_through;
                }
            }
            Action::FetchOrigin { key, url, start, end, expected_len, object_size, class } => {
                // Right after a look-up, a held block of the right length must be served, not
                // fetched (a wrong-length one is a miss to the core: that fetch is explained).
                // After a peer failover the read does not look again: a sibling may have cached
                // the block meanwhile, and that refetch is counted, not forbidden.
                let held =
                    self.nodes[n].cache.get(&key).map(|b| b.len() as u64) == Some(expected_len);
                let just_looked_up = self.nodes[n].reads[&rid].just_looked_up;
                if held && just_looked_up {
                    self.violate(Some(n), format!("origin fetch of cached block {key}"));
                    return;
                }
                if held {
                    self.stale_refetches += 1;
                    self.trace.line(now, format_args!("stale-refetch {rid} n{n} {key}"));
                }
                let fill = Fill { key, expected_len, object_size, class };
                self.ask_origin(n, rid, url, Some((start, end, fill)));
            }
            Action::Store { key, data, class } => {
                if self.nodes[n].reads[&rid].last_range_ignored {
                    self.violate(
                        Some(n),
                        format!("Range-ignored bytes offered to the store: {key}"),
                    );
                    return;
                }
                self.cache_put(n, key, data, class);
            }
            Action::Emit(bytes) => self.on_emit(n, rid, bytes),
            Action::Finish => self.on_end(n, rid, None),
            Action::Fail(f) => self.on_end(n, rid, Some(f)),
        }
    }

    /// A probe (`block == None`) or a block fetch, coalesced through the node's flight table.
    fn ask_origin(&mut self, n: usize, rid: ReadId, url: String, block: Option<(u64, u64, Fill)>) {
        let now = self.now;
        let node = &mut self.nodes[n];
        let active = node.reads.get_mut(&rid).expect("driven read");
        let identity = active.read.object().id.clone();
        let (key, request, waiting, fill) = match block {
            None => (FlightKey::Probe(identity), OriginRequest::Probe, Waiting::Probe, None),
            Some((start, end, fill)) => (
                FlightKey::Block(identity, start, end),
                OriginRequest::Range { start, end },
                Waiting::Fetch,
                Some(fill),
            ),
        };
        active.waiting = Some(waiting);
        let role = node.flights.begin(&key, now);
        self.trace.line(now, format_args!("origin {rid} n{n} {key} {role:?}"));
        let request = CallRequest::Origin(request);
        match role {
            Role::Lead(id) => {
                let waiters = vec![Waiter { read: rid, url: url.clone() }];
                *node.leading.entry(key.clone()).or_default() += 1;
                node.flight_state.insert(id, FlightState { key, waiters, fill });
                self.start_call(n, Endpoint::Origin, url, request, Purpose::Flight(id));
            }
            Role::Join(id) => {
                let Some(state) = node.flight_state.get_mut(&id) else {
                    self.violate(Some(n), format!("joined flight {id:?} that has no state"));
                    return;
                };
                state.waiters.push(Waiter { read: rid, url });
            }
            Role::Alone => {
                self.start_call(n, Endpoint::Origin, url, request, Purpose::Alone(rid, key));
            }
        }
    }

    fn passthrough(&mut self, n: usize, rid: ReadId, url: String) {
        let active = self.nodes[n].reads.get_mut(&rid).expect("driven read");
        let ReadKind::Client { record, .. } = active.kind else {
            self.violate(Some(n), format!("relay read {rid} asked for a passthrough"));
            return;
        };
        active.waiting = Some(Waiting::Passthrough);
        let range = self.read_spec(record).range;
        let request = CallRequest::Origin(OriginRequest::Passthrough { range });
        self.start_call(n, Endpoint::Origin, url, request, Purpose::Passthrough(rid));
    }

    /// An exchange of node `call.node` ended.
    pub(crate) fn on_call_done(&mut self, call: Call, answer: Result<CallAnswer, CallFailure>) {
        let n = call.node;
        let object = crate::origin::parse_url(&call.url).map_or(0, |(o, _)| o);
        match call.purpose {
            Purpose::Flight(id) => {
                let Some(state) = self.nodes[n].flight_state.remove(&id) else {
                    self.violate(Some(n), format!("flight {id:?} ended twice"));
                    return;
                };
                let result = self.judge(object, &state.key, answer);
                if let (Ok(Judged::Block(b)), Some(fill)) = (&result, state.fill) {
                    if block_verdict(fill.object_size, fill.expected_len, b) == Verdict::Cache {
                        self.cache_put(n, fill.key, b.data.clone(), fill.class);
                    }
                }
                let node = &mut self.nodes[n];
                let finished = node.flights.finish(&state.key, id);
                if let Some(c) = node.leading.get_mut(&state.key) {
                    *c -= 1;
                    if *c == 0 {
                        node.leading.remove(&state.key);
                    }
                }
                if !finished {
                    self.violate(Some(n), format!("flight {id:?} was not in the table"));
                }
                self.publish(n, state, result);
            }
            Purpose::Alone(rid, key) => {
                let result = self.judge(object, &key, answer);
                self.deliver(n, rid, result, false);
            }
            Purpose::Passthrough(rid) => self.end_passthrough(n, rid, answer),
            Purpose::Peer(rid) => {
                let CallRequest::Peer(req) = &call.request else {
                    unreachable!("peer calls carry peer requests");
                };
                let Endpoint::Node(peer) = call.to else {
                    unreachable!("peer calls go to nodes");
                };
                self.peer_done(n, rid, answer, req.expected_len, peer);
            }
        }
    }

    /// Publishes a flight's result: the leader first, then joiners (a refusal sends a live
    /// joiner to retry alone with its own URL).
    fn publish(&mut self, n: usize, state: FlightState, result: Result<Judged, OriginError>) {
        for (i, w) in state.waiters.into_iter().enumerate() {
            let joiner = i > 0;
            let live = self.nodes[n].reads.contains_key(&w.read);
            match &result {
                Err(e) if joiner && joiner_action(Some(e), live) == JoinerAction::RetryAlone => {
                    let request = CallRequest::Origin(match &state.key {
                        FlightKey::Probe(_) => OriginRequest::Probe,
                        FlightKey::Block(_, s, e) => OriginRequest::Range { start: *s, end: *e },
                    });
                    self.trace.line(self.now, format_args!("retry-alone {} n{n}", w.read));
                    let purpose = Purpose::Alone(w.read, state.key.clone());
                    self.start_call(n, Endpoint::Origin, w.url, request, purpose);
                }
                _ if !live => {}
                Ok(_) | Err(_) => self.deliver(n, w.read, result.clone(), joiner),
            }
        }
    }

    /// Hands a probe or fetch result to a read and drives it on.
    fn deliver(
        &mut self,
        n: usize,
        rid: ReadId,
        result: Result<Judged, OriginError>,
        coalesced: bool,
    ) {
        let now = self.now;
        let node = &mut self.nodes[n];
        let Some(active) = node.reads.get_mut(&rid) else { return };
        let waiting = active.waiting.take();
        active.just_looked_up = false;
        active.last_range_ignored = false;
        let client = active.record().is_some();
        match (waiting, result) {
            (Some(Waiting::Probe), Ok(Judged::Probe(p))) => {
                active.read.handle_probe(&mut node.engine, Ok(p), now)
            }
            (Some(Waiting::Probe), Err(e)) => {
                active.read.handle_probe(&mut node.engine, Err(e), now)
            }
            (Some(Waiting::Fetch), Ok(Judged::Block(mut b))) => {
                b.coalesced = coalesced;
                active.last_range_ignored = b.body.range_ignored;
                if client {
                    let source =
                        if coalesced { BlockSource::Coalesced } else { BlockSource::Origin };
                    self.blocks.push(BlockEvent { at: now, node: n, source });
                }
                active.read.handle_fetch(&mut node.engine, Ok(b));
            }
            (Some(Waiting::Fetch), Err(e)) => active.read.handle_fetch(&mut node.engine, Err(e)),
            (w, r) => {
                let what = format!("read {rid} waiting {w:?} got {:?}", r.map(|j| j.kind()));
                self.violate(Some(n), what);
                return;
            }
        }
        self.drive(n, rid);
    }

    fn on_head(&mut self, n: usize, rid: ReadId, head: ResponseHead) {
        let now = self.now;
        let active = self.nodes[n].reads.get_mut(&rid).expect("driven read");
        match &mut active.kind {
            ReadKind::Client { record, expected, .. } => {
                let (record, e) = (*record, expected.clone());
                if head.status != e.status
                    || head.content_length != e.content_length
                    || head.content_range != e.content_range
                {
                    self.violate(Some(n), format!("read {rid} head {head:?}, oracle {e:?}"));
                    return;
                }
                self.records[record].head_at = Some(now);
                self.trace.line(
                    now,
                    format_args!("head {rid} n{n} {} {}", head.status, head.content_length),
                );
            }
            ReadKind::Relay { head: slot, streaming, call, .. } => {
                let (streaming, call, len) = (*streaming, *call, head.content_length);
                if slot.replace(head).is_some() {
                    self.violate(Some(n), format!("relay {rid} sent two heads"));
                    return;
                }
                if streaming {
                    self.peer_stream_head(call, len);
                }
            }
        }
    }

    fn on_emit(&mut self, n: usize, rid: ReadId, bytes: Bytes) {
        let active = self.nodes[n].reads.get_mut(&rid).expect("driven read");
        let object = active.object;
        let (record, at) = match &mut active.kind {
            ReadKind::Client { record, method, next_offset, .. } => {
                if *method == Method::Head {
                    self.violate(Some(n), format!("read {rid} emitted body bytes for a HEAD"));
                    return;
                }
                let at = *next_offset;
                *next_offset += bytes.len() as u64;
                (*record, at)
            }
            ReadKind::Relay { body, .. } => {
                if body.replace(bytes).is_some() {
                    self.violate(Some(n), format!("relay {rid} emitted twice"));
                }
                return;
            }
        };
        let shape = self.spec.cluster.objects[object].shape();
        if let Err(m) = self.contents.check(shape, at, &bytes) {
            let what = format!("read {rid} delivered a wrong byte at offset {}", m.offset);
            self.violate(Some(n), what);
            return;
        }
        let r = &mut self.records[record];
        r.first_byte_at.get_or_insert(self.now);
        r.bytes += bytes.len() as u64;
    }

    /// A terminal action (`failure` is `None` for `Finish`): the read must be done and silent;
    /// a client's bytes must add up; a relay answers its caller.
    fn on_end(&mut self, n: usize, rid: ReadId, failure: Option<ReadFailure>) {
        let mut active = self.nodes[n].reads.remove(&rid).expect("driven read");
        if !active.read.is_done() || active.read.poll_action().is_some() {
            self.violate(Some(n), format!("read {rid} acted after its terminal action"));
            return;
        }
        match active.kind {
            ReadKind::Client { record, method, expected, next_offset } => {
                let delivered = next_offset - expected.start;
                let outcome = match failure {
                    None => ReadOutcome::Finished,
                    Some(f) => ReadOutcome::Failed {
                        status: f.status,
                        committed: f.committed,
                        error: f.error.to_string(),
                    },
                };
                if failure_is_none(&outcome)
                    && method == Method::Get
                    && delivered != expected.content_length
                {
                    let what = format!(
                        "read {rid} finished after {delivered} of {} bytes",
                        expected.content_length
                    );
                    self.violate(Some(n), what);
                    return;
                }
                self.trace.line(self.now, format_args!("end {rid} n{n} {outcome:?} {delivered}B"));
                self.close_record(record, outcome);
            }
            ReadKind::Relay { call, key, head, body, streaming, copy } => {
                let body = if streaming { copy } else { body };
                self.relay_done(n, rid, call, key, streaming, head, body, failure)
            }
        }
    }

    fn end_passthrough(&mut self, n: usize, rid: ReadId, answer: Result<CallAnswer, CallFailure>) {
        let Some(active) = self.nodes[n].reads.remove(&rid) else { return };
        let ReadKind::Client { record, method, .. } = active.kind else {
            unreachable!("only client reads pass through");
        };
        let outcome = match origin_answer(answer) {
            Ok(a) => {
                if method == Method::Get {
                    self.records[record].bytes = a.body.len;
                }
                ReadOutcome::Passthrough { status: a.status }
            }
            Err(e) => ReadOutcome::PassthroughFailed { error: e.to_string() },
        };
        self.trace.line(self.now, format_args!("end {rid} n{n} {outcome:?}"));
        self.close_record(record, outcome);
    }

    /// Offers a block to node `n`'s cache after checking it against the generator: exact
    /// geometry length, exact bytes, never of a Range-blind object.
    pub(crate) fn cache_put(&mut self, n: usize, key: BlockKey, data: Bytes, class: BlockClass) {
        if let Err(what) = self.check_block(key, &data) {
            self.violate(Some(n), format!("store: {what}"));
            return;
        }
        self.nodes[n].cache.put(key, data, class);
    }

    /// Whether `data` is exactly block `key` of its object.
    pub(crate) fn check_block(&self, key: BlockKey, data: &Bytes) -> Result<(), String> {
        let Some(&object) = self.chunk_objects.get(&key.chunk) else {
            return Err(format!("block {key} of no known object"));
        };
        let def = self.spec.cluster.objects[object];
        let g = self.spec.cluster.geometry;
        let want = g.block_len(def.size, key.block);
        if want != Some(data.len() as u64) {
            return Err(format!("block {key}: {} bytes, geometry says {want:?}", data.len()));
        }
        let start = key.block * g.block_bytes();
        if let Err(m) = self.contents.check(def.shape(), start, data) {
            return Err(format!("block {key} with a wrong byte at {}", m.offset));
        }
        if def.range_blind {
            return Err(format!("block {key} of a Range-blind object"));
        }
        Ok(())
    }
}

fn failure_is_none(outcome: &ReadOutcome) -> bool {
    *outcome == ReadOutcome::Finished
}
