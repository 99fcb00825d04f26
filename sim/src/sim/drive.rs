//! Driving the node machines: every input a node gets (a client read, a peer's request, progress
//! of its exchanges, store answers, drains, cancellations, timers) goes through
//! [`Sim::feed`] or [`Sim::timeout`], which drain the machine's outputs fully and carry each out:
//! exchanges become calls, store operations are answered from the node's [`SimCache`], response
//! parts go to the local client (judged by the oracle) or back over a peer's call, events go to
//! the trace and the report. The checks that need the machine's outputs live here.
//!
//! [`SimCache`]: crate::cache::SimCache

use super::Sim;
use crate::calls::{Answer, Body, CallKind, Leg, Stage};
use crate::fault::Lie;
use crate::net::{Endpoint, PathState};
use crate::node::{node_of_addr, ClientHead, ClientRequest};
use crate::origin::{parse_url, HEAD_BYTES};
use crate::report::{BlockEvent, ReadOutcome};
use crate::workload;
use bytes::Bytes;
use dart_core::breaker::Observation;
use dart_core::engine::Method;
use dart_core::hash::BlockKey;
use dart_core::node::{
    Endpoint as IoEndpoint, Event, Head, Headers, Inbound, Input, IoEvent, IoRequest, Output,
    Plane, Purpose, RequestId,
};
use std::collections::VecDeque;

/// What the input being handled tells the checks of the outputs it causes.
#[derive(Clone, Copy, Debug, Default)]
struct Context {
    /// The input answered a look-up with this block, of the right length.
    store_hit: Option<BlockKey>,
    /// The input was the origin refusing (401/403) this (object, first, last) window: requests
    /// for it that follow are joiners retrying alone with their own credentials.
    refusal: Option<(usize, u64, u64)>,
    /// The input carried a Range-ignoring origin body for this block.
    range_ignored: Option<BlockKey>,
    /// The input is the machine's timer: exchanges it abandons timed out.
    timer: bool,
}

/// Buffers [`Sim::feed`] reuses from one input to the next.
#[derive(Default)]
pub(crate) struct Buffers {
    pending: VecDeque<(Input, Context)>,
    dirty: Vec<RequestId>,
    outputs: Vec<Output>,
}

enum Stimulus {
    Input(Input),
    Timeout,
}

impl Sim {
    /// A client sends read record `record` to its node.
    pub(crate) fn start_read(&mut self, record: usize) {
        let spec = self.read_spec(record);
        let n = spec.node % self.spec.cluster.nodes;
        let object = spec.object % self.spec.cluster.objects.len();
        let r = &mut self.records[record];
        r.started.get_or_insert(self.now);
        r.attempts += 1;
        r.bytes = 0;
        r.outcome = ReadOutcome::Pending;
        r.version = None;
        if !self.nodes[n].is_up() {
            self.trace.line(self.now, format_args!("read r{record} n{n} refused"));
            self.close_record(record, ReadOutcome::Refused);
            return;
        }
        let expires = spec.expires.map_or(u64::MAX, |d| d.as_millis() as u64);
        let signer = match spec.signer {
            Some(k) => format!("c{k}"),
            None => format!("n{n}r{record}"),
        };
        let url = self.spec.cluster.object_url(object, &signer, expires);
        // What the head must say is settled when it names its version; until then, the current.
        let size = self.origin.current(object).shape.size;
        let expected = workload::expected(spec.range, size);
        let mut headers = Headers::new();
        if let Some(range) = spec.range.header() {
            headers.push("range", range);
        }
        let method = match spec.method {
            Method::Get => "GET",
            Method::Head => "HEAD",
        };
        let node = &mut self.nodes[n];
        let id = node.next_request_id();
        self.trace.line(
            self.now,
            format_args!("read r{record} n{n} {id} o{object} {:?} {method}", spec.range),
        );
        let next_offset = expected.start;
        node.clients.insert(
            id,
            Box::new(ClientRequest {
                record,
                object,
                method: spec.method,
                expected,
                head: ClientHead::None,
                next_offset,
                bytes: 0,
                failure: None,
                passthrough: false,
                version: None,
                hasher: None,
            }),
        );
        let target = self.spec.cluster.client_target(&url);
        let request = Inbound { method: method.into(), target, headers, body: Default::default() };
        self.feed(n, Input::Request { id, plane: Plane::Client, request });
    }

    /// Feeds node `n`'s machine `input` and carries out everything that follows at this instant.
    pub(crate) fn feed(&mut self, n: usize, input: Input) {
        self.run_machine(n, Stimulus::Input(input));
    }

    /// Fires node `n`'s due timers and carries out everything that follows at this instant.
    pub(crate) fn timeout(&mut self, n: usize) {
        self.run_machine(n, Stimulus::Timeout);
    }

    fn run_machine(&mut self, n: usize, first: Stimulus) {
        let now = self.now;
        // A machine's outputs never feed another machine synchronously, so the buffers are free.
        let mut pending = std::mem::take(&mut self.buffers.pending);
        let mut dirty = std::mem::take(&mut self.buffers.dirty);
        let mut outputs = std::mem::take(&mut self.buffers.outputs);
        let mut next = Some(match first {
            Stimulus::Input(input) => {
                let ctx = self.context(n, &input);
                (Stimulus::Input(input), ctx)
            }
            Stimulus::Timeout => (Stimulus::Timeout, Context { timer: true, ..Context::default() }),
        });
        let mut inputs = 0usize;
        while let Some((stimulus, ctx)) = next.take() {
            inputs += 1;
            assert!(inputs <= super::INPUTS_PER_STEP_MAX, "n{n}: inputs piling up in one step");
            let Some(machine) = self.nodes[n].machine.as_mut() else { break };
            match stimulus {
                Stimulus::Input(input) => machine.handle_input(input, now),
                Stimulus::Timeout => machine.handle_timeout(now),
            }
            while let Some(out) = machine.poll_output() {
                outputs.push(out);
            }
            for out in outputs.drain(..) {
                self.carry(n, out, ctx, &mut pending, &mut dirty);
                if self.violation.is_some() {
                    return; // the run stops here
                }
            }
            if let Some((input, ctx)) = pending.pop_front() {
                next = Some((Stimulus::Input(input), ctx));
            }
        }
        dirty.sort();
        dirty.dedup();
        for &rid in &dirty {
            self.flush_peer(n, rid);
        }
        dirty.clear();
        self.buffers = Buffers { pending, dirty, outputs };
        self.touch(n);
    }

    /// The context of `input` for node `n`.
    fn context(&self, n: usize, input: &Input) -> Context {
        let mut ctx = Context::default();
        let Input::Io { id, event } = input else { return ctx };
        let Some(call) = self.nodes[n].exchanges.get(id).and_then(|c| self.calls.get(c)) else {
            return ctx;
        };
        match (event, &call.kind) {
            (IoEvent::Head { status: 401 | 403, .. }, CallKind::Probe { object }) => {
                ctx.refusal = Some((*object, 0, 0));
            }
            (IoEvent::Head { status: 401 | 403, .. }, CallKind::Window { object, start, end }) => {
                ctx.refusal = Some((*object, *start, *end));
            }
            (IoEvent::Body(_) | IoEvent::End, CallKind::Window { object, start, .. })
                if call.answer.as_ref().is_some_and(|a| a.status == 200) =>
            {
                let block = start / self.spec.cluster.geometry.block_bytes();
                ctx.range_ignored = Some(self.block_key(*object, block));
            }
            _ => {}
        }
        ctx
    }

    /// Carries out one output of node `n`'s machine.
    fn carry(
        &mut self,
        n: usize,
        out: Output,
        ctx: Context,
        pending: &mut VecDeque<(Input, Context)>,
        dirty: &mut Vec<RequestId>,
    ) {
        match out {
            Output::Send(req) => self.send(n, req, ctx, pending),
            Output::Resolve { ticket, name, port } => {
                // The headless Service: every running node, whatever the port asked.
                let result = if name == crate::node::DNS_NAME {
                    let up = (0..self.nodes.len()).filter(|&j| self.nodes[j].is_up());
                    Ok(up.map(|j| format!("{}:{port}", crate::node::member_id(j))).collect())
                } else {
                    Err(format!("{name}: no such name"))
                };
                pending.push_back((Input::Resolved { ticket, result }, Context::default()));
            }
            Output::Cancel(io) => {
                let Some(&id) = self.nodes[n].exchanges.get(&io) else {
                    return self.violate(Some(n), format!("cancel of unknown exchange {io}"));
                };
                self.trace.line(self.now, format_args!("cancel n{n} {io} {id}"));
                let call = self.remove_call(id, true).expect("a live call");
                if call.connected && (ctx.timer || !call.head_delivered) {
                    // A connection abandoned while its request waited for an answer (a bound
                    // fired, or the requester this exchange served went away) is closed, not
                    // returned to the pool: the next request dials.
                    self.net.set_warm(Endpoint::Node(n), call.to, false);
                }
            }
            Output::Pipe { io, to } => {
                let Some(&id) = self.nodes[n].exchanges.get(&io) else {
                    return self.violate(Some(n), format!("pipe of unknown exchange {io}"));
                };
                let client = self.nodes[n].clients.get_mut(&to);
                match client.map(|c| &mut c.head) {
                    Some(ClientHead::Passthrough { piped: piped @ None, .. }) => {
                        *piped = Some(io);
                        self.calls.get_mut(&id).expect("a live call").pipe_to = Some(to);
                    }
                    other => {
                        let what = format!("{io} piped into {to}, whose head is {other:?}");
                        self.violate(Some(n), what);
                    }
                }
            }
            Output::StoreGet { op, key, window } => {
                let whole = self.nodes[n].cache.lookup(&key);
                let want = self.block_of(Some(n), key).map(|(_, len)| len);
                let hit = whole.as_ref().is_some_and(|b| Some(b.len() as u64) == want);
                // A block a warm start kept may be refused by the machine (its version is
                // unknown): fetching it afresh is then not a refetch of a cached block.
                let kept = self.nodes[n].machine.as_ref().is_some_and(|m| m.is_unversioned(&key));
                // A rotten block may be refused too (it no longer matches its digest).
                let rotten = self.nodes[n].cache.is_rotten(&key);
                let ctx = Context {
                    store_hit: (hit && !kept && !rotten).then_some(key),
                    ..Context::default()
                };
                // A windowed look-up gets just those bytes, of a block of exactly its length.
                let block = match window {
                    Some(w) => whole.and_then(|b| w.slice(&b)),
                    None => whole,
                };
                pending.push_back((Input::Store { op, block }, ctx));
            }
            Output::StoreDrop { keys } => {
                for key in &keys {
                    self.nodes[n].cache.remove(key);
                }
            }
            Output::StorePut { key, data, class, .. } => {
                if ctx.range_ignored == Some(key) {
                    let what = format!("store: Range-ignored bytes offered for {key}");
                    return self.violate(Some(n), what);
                }
                // The bytes of some version of the block, and of the one the node reads.
                let version = match self.check_block(key, std::slice::from_ref(&data), None) {
                    Ok(k) => k,
                    Err(what) => return self.violate(Some(n), format!("store: {what}")),
                };
                if let Err(what) = self.check_put_version(n, key, version) {
                    return self.violate(Some(n), format!("store: {what}"));
                }
                self.nodes[n].cache.put(key, data, class);
            }
            Output::Respond { id, head } => {
                if self.nodes[n].clients.contains_key(&id) {
                    self.client_head(n, id, head);
                } else if let Some(p) = self.nodes[n].peers.get_mut(&id) {
                    if p.head.replace(head).is_some() {
                        return self.violate(Some(n), format!("two heads for peer request {id}"));
                    }
                    dirty.push(id);
                } else {
                    self.unknown_request(n, id, "a head");
                }
            }
            Output::Body { id, data } => {
                if self.nodes[n].clients.contains_key(&id) {
                    self.client_body(n, id, data);
                } else if let Some(p) = self.nodes[n].peers.get_mut(&id) {
                    if p.head.is_none() {
                        return self.violate(Some(n), format!("body before head for {id}"));
                    }
                    p.body_len += data.len() as u64;
                    p.body.push(data);
                    dirty.push(id);
                } else {
                    return self.unknown_request(n, id, "a body part");
                }
                pending.push_back((Input::Drained { id }, Context::default()));
            }
            Output::Hash { id, algorithm } => match self.nodes[n].clients.get_mut(&id) {
                Some(c) => c.hasher = Some(crate::content::BodyHash::new(algorithm)),
                None => self.unknown_request(n, id, "a hash"),
            },
            Output::Seal { id } => {
                let Some(c) = self.nodes[n].clients.get_mut(&id) else {
                    return self.unknown_request(n, id, "a seal");
                };
                let Some(hasher) = c.hasher.take() else {
                    return self.violate(Some(n), format!("{id} sealed but never hashed"));
                };
                let digest = hasher.finish(&self.contents);
                pending.push_back((Input::Sealed { id, digest }, Context::default()));
            }
            Output::End { id } | Output::Abort { id } => {
                let complete = matches!(out, Output::End { .. });
                if self.nodes[n].clients.contains_key(&id) {
                    self.client_end(n, id, complete);
                } else if let Some(p) = self.nodes[n].peers.get_mut(&id) {
                    if p.head.is_none() || p.ended.is_some() {
                        return self.violate(Some(n), format!("{id} ended without a head"));
                    }
                    p.ended = Some(complete);
                    dirty.push(id);
                } else {
                    self.unknown_request(n, id, "an end");
                }
            }
            // The simulated node's memory is not modelled: nothing to give back (the machine's
            // counter, `memory_releases`, says when it asked).
            Output::ReleaseMemory => {}
            Output::Event(e) => self.event(n, e),
        }
    }

    fn unknown_request(&mut self, n: usize, id: RequestId, what: &str) {
        self.violate(Some(n), format!("{what} for {id}, which ended or never was"));
    }

    /// Node `n` sends exchange `req`: checked and classified, then carried by a new call.
    fn send(
        &mut self,
        n: usize,
        mut req: IoRequest,
        ctx: Context,
        pending: &mut VecDeque<(Input, Context)>,
    ) {
        let io = req.id;
        let (kind, window) = match req.endpoint {
            IoEndpoint::Origin => {
                let Some((object, _)) = parse_url(&req.url) else {
                    return self.violate(Some(n), format!("origin request for {}", req.url));
                };
                if req.purpose == Purpose::Passthrough {
                    let client = req.request.and_then(|rid| self.nodes[n].clients.get_mut(&rid));
                    let Some(client) = client else {
                        return self
                            .violate(Some(n), format!("a passthrough for no client: {req:?}"));
                    };
                    client.passthrough = true;
                    (CallKind::Passthrough { object }, None)
                } else if req.purpose == Purpose::Check {
                    // A credential check is per credential: concurrent ones for one object are
                    // expected (each requester's URL is its own), so it is no coalescing window.
                    (CallKind::Probe { object }, None)
                } else {
                    let range = req.headers.get_str("range").and_then(parse_window);
                    let Some((start, end)) = range else {
                        return self.violate(Some(n), format!("origin request {req:?}"));
                    };
                    if req.purpose == Purpose::LeadIn {
                        // One read's span beside its block's window: no window of its own (the
                        // origin serves it as any range), never a refetch of a cached block.
                        (CallKind::Window { object, start, end }, None)
                    } else {
                        let kind = if (start, end) == (0, 0) {
                            CallKind::Probe { object }
                        } else {
                            self.check_refetch(n, object, start, ctx);
                            CallKind::Window { object, start, end }
                        };
                        let retry = ctx.refusal == Some((object, start, end));
                        (kind, (!retry).then_some((n, object, start, end)))
                    }
                }
            }
            IoEndpoint::Peer => {
                let lie = self.nodes[n].peer_faults.lies.iter().rev().find(|l| !l.in_answers());
                if let Some(&lie) = lie {
                    self.lie_in_request(n, lie, &mut req);
                }
                let host = req.url.strip_prefix("http://").and_then(|r| r.split('/').next());
                let Some(j) = host.and_then(node_of_addr) else {
                    return self.violate(Some(n), format!("peer request to {}", req.url));
                };
                if j == n || j >= self.nodes.len() {
                    return self.violate(Some(n), format!("peer request to itself: {}", req.url));
                }
                (CallKind::Peer { node: j }, None)
            }
        };
        let (id, warm) = self.start_call(n, req, kind, window);
        self.nodes[n].exchanges.insert(io, id);
        if warm {
            pending
                .push_back((Input::Io { id: io, event: IoEvent::Connected }, Context::default()));
        }
    }

    /// A requester that lies names the object otherwise than it is in a relay request
    /// ([`Lie::ToldSize`], [`Lie::ToldVersion`]); the request is signed over other fields, so
    /// it still passes as the requester's.
    fn lie_in_request(&mut self, n: usize, lie: Lie, req: &mut IoRequest) {
        use dart_core::codec::wire::{HEADER_OBJECT_ETAG, HEADER_OBJECT_SIZE};
        let Some(size) = req.headers.get_u64(HEADER_OBJECT_SIZE) else { return };
        let mut headers = dart_core::node::Headers::new();
        for (name, value) in req.headers.iter() {
            if name != HEADER_OBJECT_SIZE && name != HEADER_OBJECT_ETAG {
                headers.push(name, value);
            }
        }
        let block = self.spec.cluster.geometry.block_bytes();
        match lie {
            Lie::ToldSize => {
                headers.push(HEADER_OBJECT_SIZE, (size + block + block / 2).to_string());
                if let Some(etag) = req.headers.get(HEADER_OBJECT_ETAG) {
                    headers.push(HEADER_OBJECT_ETAG, etag);
                }
            }
            _ => {
                headers.push(HEADER_OBJECT_SIZE, size.to_string());
                headers.push(HEADER_OBJECT_ETAG, "\"a-version-that-never-was\"");
            }
        }
        self.trace.line(self.now, format_args!("lie n{n} {lie:?} in {}", req.url));
        req.headers = headers;
    }

    /// An origin block fetch: never of a block the store just answered; counted when the store
    /// holds it anyway.
    fn check_refetch(&mut self, n: usize, object: usize, start: u64, ctx: Context) {
        let block_bytes = self.spec.cluster.geometry.block_bytes();
        if !start.is_multiple_of(block_bytes) {
            return;
        }
        let key = self.block_key(object, start / block_bytes);
        if ctx.store_hit == Some(key) {
            return self.violate(Some(n), format!("origin fetch of cached block {key}"));
        }
        let want = self.block_of(Some(n), key).map(|(_, len)| len);
        let held = self.nodes[n].cache.get(&key).map(|b| b.len() as u64);
        if held.is_some() && held == want {
            self.stale_refetches += 1;
            self.trace.line(self.now, format_args!("stale-refetch n{n} {key}"));
        }
    }

    /// A block of version `version` offered to node `n`'s cache must be of the version the node
    /// reads: its engine's validators name it. A node that knows no version of an object the
    /// plan replaces must not cache it at all (a later probe could not tell the block is old).
    fn check_put_version(&self, n: usize, key: BlockKey, version: usize) -> Result<(), String> {
        let Some(&object) = self.chunk_objects.get(&key.chunk) else { return Ok(()) };
        match self.believed_version(n, object)? {
            Some(k) if k == version => Ok(()),
            Some(k) => Err(format!(
                "block {key} of version {version} of o{object} offered while the node reads version {k}"
            )),
            None if self.replaced[object] => Err(format!(
                "block {key} (version {version}) offered while the node knows no version of o{object}"
            )),
            None => Ok(()),
        }
    }

    /// The version of block `key`'s object that a peer answer's head names, if any.
    fn head_version(&self, key: BlockKey, headers: &Headers) -> Result<Option<usize>, String> {
        let Some(&object) = self.chunk_objects.get(&key.chunk) else { return Ok(None) };
        self.version_named(object, headers.get_str("etag"), headers.get_str("last-modified"))
    }

    // ---- client plane --------------------------------------------------------------------------

    fn client_head(&mut self, n: usize, id: RequestId, head: Head) {
        let c = &self.nodes[n].clients[&id];
        let (record, object, method, passthrough) = (c.record, c.object, c.method, c.passthrough);
        if c.head != ClientHead::None {
            return self.violate(Some(n), format!("{id} sent two heads"));
        }
        let text = head.headers.get_str("content-type").is_some_and(|t| t.starts_with("text/"));
        // The machine's own text reply, also for a read whose passthrough exchange failed before
        // the origin's head came (the simulated origin sends no content type).
        let error = head.status >= 400 && text;
        // The version the head names by its validators (an error's names none).
        let named = if error {
            None
        } else {
            let (etag, lm) = (head.headers.get_str("etag"), head.headers.get_str("last-modified"));
            match self.version_named(object, etag, lm) {
                Ok(v) => v,
                Err(what) => return self.violate(Some(n), format!("{id} head: {what}")),
            }
        };
        let mut expected = None;
        let kind = if error {
            ClientHead::Error { status: head.status, text: Vec::new() }
        } else if passthrough {
            ClientHead::Passthrough { status: head.status, piped: None }
        } else {
            // The head must be the oracle's for the version it names; a 416 names none (it
            // carries no validators) and must be right for some version.
            let candidates: Vec<usize> = match named {
                Some(k) => vec![k],
                None if head.status == 416 => (0..self.origin.versions(object).len()).collect(),
                None => {
                    let what = format!("{id} head {head:?} names no version of o{object}");
                    return self.violate(Some(n), what);
                }
            };
            let range = self.read_spec(record).range;
            let length = head.content_length();
            let content_range = head.headers.get_str("content-range");
            let oracles: Vec<workload::Expected> = candidates
                .iter()
                .map(|&k| workload::expected(range, self.origin.versions(object)[k].shape.size))
                .collect();
            let fits = |e: &workload::Expected| {
                head.status == e.status
                    && length == Some(e.content_length)
                    && content_range == e.content_range.as_deref()
                    && head.body == (method == Method::Get && e.content_length > 0)
            };
            let Some(e) = oracles.iter().find(|e| fits(e)) else {
                return self.violate(Some(n), format!("{id} head {head:?}, oracle {oracles:?}"));
            };
            expected = Some(e.clone());
            ClientHead::Block
        };
        let c = self.nodes[n].clients.get_mut(&id).expect("a live client");
        c.head = kind;
        c.version = named;
        if let Some(e) = expected {
            c.next_offset = e.start;
            c.expected = e;
        }
        self.records[record].version = named;
        self.records[record].head_at = Some(self.now);
        let len = head.content_length().unwrap_or(0);
        self.trace.line(self.now, format_args!("respond n{n} {id} {} {len}", head.status));
    }

    fn client_body(&mut self, n: usize, id: RequestId, data: Bytes) {
        let c = self.nodes[n].clients.get_mut(&id).expect("a live client");
        match &mut c.head {
            ClientHead::Block if c.method == Method::Get => {}
            ClientHead::Error { text, .. } => {
                if let Some(hasher) = &mut c.hasher {
                    hasher.bytes(&self.contents, &data);
                }
                text.extend_from_slice(&data);
                return;
            }
            other => {
                let what = format!("{id} body part after head {other:?} ({:?})", c.method);
                return self.violate(Some(n), what);
            }
        }
        let (at, object, record, version) = (c.next_offset, c.object, c.record, c.version);
        c.next_offset += data.len() as u64;
        c.bytes += data.len() as u64;
        // Every byte is of the one version the head named.
        let Some(k) = version else {
            return self.violate(Some(n), format!("{id} body part after a head of no version"));
        };
        let shape = self.origin.versions(object)[k].shape;
        if let Err(m) = self.contents.check(shape, at, &data) {
            let other = self
                .origin
                .versions(object)
                .iter()
                .find(|v| v.index != k && self.contents.check(v.shape, at, &data).is_ok());
            let what = match other {
                Some(v) => format!(
                    "{id} delivered bytes of version {} at offset {at} under a head naming version {k}",
                    v.index
                ),
                None => format!("{id} delivered a wrong byte at offset {}", m.offset),
            };
            return self.violate(Some(n), what);
        }
        // Checked: the generator's bytes (the digest of a span of them is computed at the seal).
        let c = self.nodes[n].clients.get_mut(&id).expect("a live client");
        if let Some(hasher) = &mut c.hasher {
            hasher.generated(&self.contents, shape, at, &data);
        }
        let r = &mut self.records[record];
        r.first_byte_at.get_or_insert(self.now);
        r.bytes += data.len() as u64;
    }

    /// `len` bytes of a passthrough body reached client `id` of node `n`.
    pub(super) fn piped(&mut self, n: usize, id: RequestId, len: u64) {
        let Some(c) = self.nodes[n].clients.get_mut(&id) else { return };
        c.bytes += len;
        let r = &mut self.records[c.record];
        if len > 0 {
            r.first_byte_at.get_or_insert(self.now);
        }
        r.bytes += len;
    }

    fn client_end(&mut self, n: usize, id: RequestId, complete: bool) {
        let c = self.nodes[n].clients.remove(&id).expect("a live client");
        let failure = c.failure.clone();
        let outcome = match (&c.head, complete) {
            (ClientHead::None, _) => {
                return self.violate(Some(n), format!("{id} ended without a head"));
            }
            (ClientHead::Block, true) => {
                if c.method == Method::Get && c.bytes != c.expected.content_length {
                    let what = format!(
                        "{id} finished after {} of {} bytes",
                        c.bytes, c.expected.content_length
                    );
                    return self.violate(Some(n), what);
                }
                ReadOutcome::Finished
            }
            (ClientHead::Passthrough { status, .. }, true) => {
                ReadOutcome::Passthrough { status: *status }
            }
            (ClientHead::Passthrough { .. }, false) => ReadOutcome::PassthroughFailed {
                error: failure.map_or_else(|| "aborted".into(), |f| f.1),
            },
            (ClientHead::Error { status, text }, true) => ReadOutcome::Failed {
                status: *status,
                committed: false,
                error: failure.map_or_else(
                    || String::from_utf8_lossy(text).trim().trim_start_matches("dart: ").into(),
                    |f| f.1,
                ),
            },
            (ClientHead::Block | ClientHead::Error { .. }, false) => {
                let (status, error) = failure.unwrap_or((502, "aborted".into()));
                ReadOutcome::Failed { status, committed: true, error }
            }
        };
        self.trace.line(self.now, format_args!("end n{n} {id} {outcome:?} {}B", c.bytes));
        self.close_record(c.record, outcome);
    }

    fn event(&mut self, n: usize, e: Event) {
        match e {
            Event::Circuit(e) => {
                self.trace.line(self.now, format_args!("circuit n{n} {e}"));
                self.nodes[n].circuit_events.push(e);
            }
            Event::Block { plane: Plane::Client, source, .. } => {
                self.blocks.push(BlockEvent { at: self.now, node: n, source });
            }
            Event::Block { plane: Plane::Peer, .. } | Event::Fetched { .. } => {}
            Event::PeerAnswer { addr, observation } => {
                let Some(j) = node_of_addr(&addr) else {
                    return self.violate(Some(n), format!("a peer answer from {addr}"));
                };
                let kind = match observation {
                    Observation::Served => "Block".to_owned(),
                    o => format!("{o:?}"),
                };
                self.trace.line(self.now, format_args!("peer-answer n{n} n{j} {kind}"));
                if observation == Observation::TimedOut {
                    *self.peer_timeouts.entry((n, j)).or_default() += 1;
                }
                *self.peer_answers.entry((j, kind)).or_default() += 1;
            }
            Event::Failed { request, status, committed, error } => {
                self.trace.line(
                    self.now,
                    format_args!("failed n{n} {request} {status} committed={committed} {error}"),
                );
                if let Some(c) = self.nodes[n].clients.get_mut(&request) {
                    c.failure = Some((status, error));
                }
            }
            Event::Roster { ticket, .. } | Event::BlockFetched { ticket, .. } => {
                self.violate(Some(n), format!("an answer (ticket {ticket}) nobody asked for"))
            }
            Event::Panicked { requests, message } => {
                self.violate(Some(n), format!("the machine panicked ({requests:?}): {message}"))
            }
            Event::View { epoch, members, joined, left } => {
                self.trace.line(
                    self.now,
                    format_args!("view n{n} {epoch} {members} +{joined:?} -{left:?}"),
                );
                let ids = self.nodes[n].view_ids();
                self.nodes[n].view_changes.push((self.now, ids));
            }
            Event::Discovery { message, suppressed } => {
                self.trace.line(
                    self.now,
                    format_args!("discovery n{n} {message} ({suppressed} held back)"),
                );
            }
            // Counted in the node's counters; the trace already shows the JOIN's exchange.
            Event::TrackerJoinFailed { .. } => {}
            Event::BroadcastTargets { targets } => {
                self.trace.line(self.now, format_args!("targets n{n} {targets}"));
            }
            Event::Left { announced, answered } => {
                self.trace.line(self.now, format_args!("left n{n} {answered}/{announced}"));
            }
            Event::BlockRotten { key } => {
                self.trace.line(self.now, format_args!("rotten n{n} {key}"));
            }
        }
    }

    // ---- peer plane (the callee's side) --------------------------------------------------------

    /// Puts what node `j`'s machine wrote for peer request `rid` on its call: a whole answer, or
    /// the head of a stream whose body follows its upstream's (cut-through). Lies are applied
    /// here, at the callee.
    fn flush_peer(&mut self, j: usize, rid: RequestId) {
        let Some(p) = self.nodes[j].peers.get(&rid) else { return };
        let id = p.call;
        if !self.calls.contains_key(&id) {
            // The caller gave up; the machine finishes (or hears the hang-up) on its own.
            if p.ended.is_some() {
                self.nodes[j].peers.remove(&rid);
            }
            return;
        }
        match (p.ended, p.head_sent, p.head.is_some()) {
            (Some(_), _, _) => self.answer_peer(j, rid),
            (None, false, true) => self.stream_peer(j, rid),
            (None, _, _) => {}
        }
    }

    /// The head of a cut-through answer goes out ahead of its body.
    fn stream_peer(&mut self, j: usize, rid: RequestId) {
        let lie = self.nodes[j].peer_faults.answer_lie();
        let p = self.nodes[j].peers.get_mut(&rid).expect("a live peer request");
        p.head_sent = true;
        p.lie = lie;
        let head = p.head.clone().expect("a head");
        let (id, key) = (p.call, p.key);
        let mut answer = Answer {
            status: head.status,
            headers: head.headers,
            body: Body::Parts(Vec::new()),
            ending: None,
        };
        if let Some(lie) = lie {
            self.trace.line(self.now, format_args!("lie {id} n{j} head {lie:?}"));
            self.lie_head(lie, &mut answer, key);
        }
        let len = answer.headers.get_u64("content-length").unwrap_or(0);
        let n = self.calls[&id].node;
        let (from, to) = (Endpoint::Node(j), Endpoint::Node(n));
        let (head_at, floor, slot) = self.net.transfer_slot(from, to, HEAD_BYTES + len, self.now);
        let stage = if self.net.path(from, to) == PathState::Open {
            Stage::Streaming { head_at, floor }
        } else {
            Stage::Stalled { since: self.now, leg: Leg::Response, head_at, done_at: floor }
        };
        let call = self.calls.get_mut(&id).expect("a live call");
        call.answer = Some(answer);
        call.egress = slot.map(|s| (from, s.0, s.1));
        self.trace.line(self.now, format_args!("stream {id} n{j} {stage}"));
        self.set_stage(id, stage);
    }

    /// The whole answer (or the rest of a stream) goes out.
    fn answer_peer(&mut self, j: usize, rid: RequestId) {
        let p = self.nodes[j].peers.remove(&rid).expect("a live peer request");
        let id = p.call;
        let ok = p.ended == Some(true);
        let head = p.head.expect("an ended answer has a head");
        // A whole block answer: the block's parts, then its digest footer.
        let block_answer =
            (ok && head.status == 200 && p.key.is_some()).then(|| split_footer(&p.body));
        if ok && head.status == 200 {
            if head.content_length() != Some(p.body_len) {
                let what = format!("relay {rid} head {head:?} for {} bytes", p.body_len);
                return self.violate(Some(j), what);
            }
            if let (Some(key), Some((block, footer))) = (p.key, &block_answer) {
                // Exactly the block of the version its head names (of some version if none),
                // then its digest.
                let checked = self
                    .head_version(key, &head.headers)
                    .and_then(|named| self.check_block(key, block, named))
                    .and_then(|k| self.check_footer(key, block, k, footer));
                if let Err(what) = checked {
                    return self
                        .violate(Some(j), format!("relay {rid} served a wrong block: {what}"));
                }
            }
        }
        let ending = Some((!ok).then(|| "the relay aborted its answer".to_owned()));
        let version = p.key.and_then(|k| self.head_version(k, &head.headers).ok().flatten());
        let parts = match block_answer {
            // The block re-joined as one slice of the generator, then its footer.
            Some((block, footer)) => {
                let mut parts = self.coalesce(p.key, block, version);
                parts.push(Bytes::from(footer));
                parts
            }
            None => self.coalesce(p.key, p.body, version),
        };
        let n = self.calls[&id].node;
        let (from, to) = (Endpoint::Node(j), Endpoint::Node(n));
        let now = self.now;
        let stage = self.calls[&id].stage;
        let answer = if p.head_sent {
            let call = self.calls.get_mut(&id).expect("a live call");
            let mut answer = call.answer.take().expect("a streamed head");
            answer.body = Body::Parts(parts);
            answer.ending = ending;
            if let Some(lie) = p.lie {
                self.lie_tail(lie, &mut answer, p.key);
            }
            answer
        } else {
            let mut answer = Answer {
                status: head.status,
                headers: head.headers,
                body: Body::Parts(parts),
                ending,
            };
            if let Some(lie) = self.nodes[j].peer_faults.answer_lie() {
                self.trace.line(now, format_args!("lie {id} n{j} {lie:?}"));
                self.lie_head(lie, &mut answer, p.key);
                self.lie_tail(lie, &mut answer, p.key);
            }
            answer
        };
        let body = answer.body.len();
        self.trace.line(now, format_args!("answer {id} n{j} {} {body}B ok={ok}", answer.status));
        self.calls.get_mut(&id).expect("a live call").answer = Some(answer);
        let next = match stage {
            Stage::Serving => {
                let (head_at, done_at, slot) =
                    self.net.transfer_slot(from, to, HEAD_BYTES + body, now);
                self.calls.get_mut(&id).expect("a live call").egress =
                    slot.map(|s| (from, s.0, s.1));
                self.respond_stage(id, head_at, done_at)
            }
            Stage::Streaming { head_at, floor } => {
                let done_at = floor.max(now + self.net.latency(from, to));
                Stage::Response { head_at, done_at }
            }
            // A stalled stream resumes with its tail; a reset call ignores the answer.
            Stage::Stalled { .. } | Stage::Failing { .. } => return,
            Stage::Request { .. } | Stage::Response { .. } => {
                return self.violate(Some(j), format!("answer to {id} in stage {stage}"));
            }
        };
        self.set_stage(id, next);
    }

    /// The parts of an answer for block `key`, as one part when they are contiguous handles on
    /// the generator's bytes of the block (the transport may deliver a body in any parts; one
    /// part lets the receiving machine keep the handle instead of joining copies).
    fn coalesce(
        &self,
        key: Option<BlockKey>,
        parts: Vec<Bytes>,
        version: Option<usize>,
    ) -> Vec<Bytes> {
        let Some((key, (object, _))) = key.and_then(|k| Some((k, self.block_of(None, k)?))) else {
            return parts;
        };
        if parts.len() < 2 {
            return parts;
        }
        let shape = match version {
            Some(k) => self.origin.versions(object)[k].shape,
            None => self.origin.current(object).shape,
        };
        let start = key.block * self.spec.cluster.geometry.block_bytes();
        let mut at = start;
        for part in &parts {
            if !self.contents.aliases(shape, at, part) {
                return parts;
            }
            at += part.len() as u64;
        }
        vec![self.contents.window(shape, start, at - start)]
    }

    /// Whether `footer` is the digest of the block of version `version` whose bytes `block`
    /// holds (checked already): what every requester checks.
    fn check_footer(
        &self,
        key: BlockKey,
        block: &[Bytes],
        version: usize,
        footer: &[u8],
    ) -> Result<(), String> {
        let parts = self.coalesce(Some(key), block.to_vec(), Some(version));
        let digest = match parts.as_slice() {
            [one] => self.hasher.digest(one),
            parts => self.hasher.digest(&Bytes::from(concat(parts))),
        };
        match dart_core::integrity::BlockDigest::from_footer(footer) {
            Some(d) if d == digest => Ok(()),
            Some(d) => Err(format!("block {key}: footer {d:?}, the bytes hash to {digest:?}")),
            None => Err(format!("block {key}: a footer of {} bytes", footer.len())),
        }
    }

    /// What a lying peer plane does to the head it sends.
    fn lie_head(&self, lie: Lie, answer: &mut Answer, key: Option<BlockKey>) {
        match lie {
            Lie::WrongLength if answer.status == 200 => {
                if let Some(len) = answer.headers.get_u64("content-length").filter(|&l| l > 0) {
                    answer.headers = replace_length(&answer.headers, len - 1);
                }
            }
            Lie::Garbage => {
                let expected = key.and_then(|k| self.block_of(None, k)).map_or(0, |(_, len)| len);
                answer.status = 200;
                answer.headers =
                    Headers::new().with("content-length", (expected + 4096).to_string());
            }
            Lie::WrongLength | Lie::Corrupt | Lie::ToldSize | Lie::ToldVersion => {}
        }
    }

    /// What a lying peer plane does to the body it sends.
    fn lie_tail(&self, lie: Lie, answer: &mut Answer, key: Option<BlockKey>) {
        let Body::Parts(parts) = &mut answer.body else { return };
        let len: usize = parts.iter().map(Bytes::len).sum();
        match lie {
            Lie::WrongLength if answer.status == 200 && len > 0 => {
                let mut v = concat(parts);
                v.pop();
                *parts = vec![Bytes::from(v)];
            }
            Lie::Corrupt if answer.status == 200 && len > 0 => {
                let mut v = concat(parts);
                let block = key.map_or(0, |k| k.block as usize);
                let i = block.wrapping_mul(7919) % v.len();
                v[i] ^= 0x5a;
                *parts = vec![Bytes::from(v)];
            }
            Lie::Garbage => {
                *parts = vec![Bytes::from(vec![0xAB; 64])];
                answer.ending = Some(Some("garbage".into()));
            }
            Lie::WrongLength | Lie::Corrupt | Lie::ToldSize | Lie::ToldVersion => {}
        }
    }
}

/// A relay's whole answer body as its block's parts and the digest footer after them.
fn split_footer(parts: &[Bytes]) -> (Vec<Bytes>, Vec<u8>) {
    let footer_len = dart_core::integrity::FOOTER_LEN as usize;
    let total: usize = parts.iter().map(Bytes::len).sum();
    let mut block_left = total.saturating_sub(footer_len);
    let (mut block, mut footer) = (Vec::new(), Vec::with_capacity(footer_len));
    for part in parts {
        let n = part.len().min(block_left);
        if n > 0 {
            block.push(part.slice(..n));
        }
        block_left -= n;
        footer.extend_from_slice(&part[n..]);
    }
    (block, footer)
}

fn concat(parts: &[Bytes]) -> Vec<u8> {
    let mut v = Vec::with_capacity(parts.iter().map(Bytes::len).sum());
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

fn replace_length(headers: &Headers, len: u64) -> Headers {
    let mut out = Headers::new();
    for (name, value) in headers.iter() {
        if name == "content-length" {
            out.push(name, len.to_string());
        } else {
            out.push(name, value);
        }
    }
    out
}

/// `bytes=s-e` as (s, e).
fn parse_window(range: &str) -> Option<(u64, u64)> {
    let (s, e) = range.strip_prefix("bytes=")?.split_once('-')?;
    Some((s.parse().ok()?, e.parse().ok()?))
}
