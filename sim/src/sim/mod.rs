//! The event loop: a virtual clock that jumps to the next event, one seeded RNG from which every
//! component's seed is drawn, fault application, phases, the invariant checks run after every
//! step, and the report. Driving the node machines is in `drive.rs`, the calls between endpoints
//! in `transport.rs`.

mod drive;
mod transport;

use crate::calls::{Call, CallId};
use crate::config::{full_check_every, CheckLevel, SimSpec};
use crate::content::Contents;
use crate::fault::{FaultKind, ORIGIN_SIDE};
use crate::net::{Endpoint, Net};
use crate::node::{member_addr, static_view, SimNode};
use crate::origin::Origin;
use crate::queue::Queue;
use crate::report::{BlockEvent, NodeReport, Phase, ReadOutcome, ReadRecord, RunReport, Violation};
use crate::trace::Trace;
use dart_core::breaker::CircuitState;
use dart_core::engine::Engine;
use dart_core::hash::{BlockKey, ChunkKey};
use dart_core::identity::ObjectId;
use dart_core::node::RequestId;
use dart_core::rng::{self, Rng};
use dart_core::time::Instant;
use std::collections::BTreeMap;
use std::time::Duration;

/// Most exchanges in flight at once across the cluster.
pub const CALLS_MAX: usize = 1 << 20;
/// How long a liveness client waits before retrying a failed read.
pub const LIVENESS_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Most inputs one event may feed a node before its outputs must settle (a runaway guard).
pub const INPUTS_PER_STEP_MAX: usize = 1 << 20;

/// What a call does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The handshake completes: the caller is told `Connected`.
    Connected,
    /// The request reaches the callee.
    Arrive,
    /// The response head reaches the caller.
    Head,
    /// Body group `i` (not the last) reaches the caller.
    Group(usize),
    /// The last body group and the end (or the break) reach the caller.
    Tail,
    /// The caller learns the call failed.
    Fail,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Event {
    ReadStart {
        record: usize,
    },
    Call {
        call: CallId,
        gen: u32,
        step: Step,
    },
    /// A caller went away: the callee node's machine hears `Input::Cancel` for its request.
    PeerCancel {
        node: usize,
        incarnation: u32,
        request: RequestId,
    },
    NodeTimer {
        node: usize,
    },
    FaultStart {
        fault: usize,
    },
    FaultEnd {
        fault: usize,
    },
    Heal,
    End,
}

/// A simulated cluster run.
pub struct Sim {
    pub(crate) spec: SimSpec,
    pub(crate) seed: u64,
    pub(crate) now: Instant,
    pub(crate) queue: Queue<Event>,
    pub(crate) net: Net,
    pub(crate) origin: Origin,
    pub(crate) contents: Contents,
    /// The block hasher every node uses (the checker verifies relays' digest footers with it).
    pub(crate) hasher: std::sync::Arc<dyn dart_core::integrity::BlockHasher>,
    pub(crate) nodes: Vec<SimNode>,
    pub(crate) calls: BTreeMap<CallId, Box<Call>>,
    pub(crate) next_call: u64,
    pub(crate) trace: Trace,
    /// Which object each chunk key belongs to (the checker's map from cache keys back to bytes).
    pub(crate) chunk_objects: BTreeMap<ChunkKey, usize>,
    /// Each object's identity, for block keys.
    pub(crate) object_ids: Vec<ObjectId>,
    /// An engine used only to compute block keys (identity and chunking are the nodes').
    pub(crate) keys: Engine,
    /// Origin requests in flight per (node, object, first byte, last byte): never above one.
    pub(crate) origin_windows: BTreeMap<(usize, usize, u64, u64), u32>,
    pub(crate) records: Vec<ReadRecord>,
    pub(crate) blocks: Vec<BlockEvent>,
    pub(crate) violation: Option<Violation>,
    pub(crate) stale_refetches: u64,
    pub(crate) peer_answers: BTreeMap<(usize, String), u64>,
    pub(crate) peer_timeouts: BTreeMap<(usize, usize), u64>,
    /// Objects the plan replaces: a node must never cache their blocks without knowing which
    /// version it reads (a later probe could not tell what to drop).
    pub(crate) replaced: Vec<bool>,
    buffers: drive::Buffers,
    events: u64,
    fault_active: Vec<bool>,
    crashes: Vec<u32>,
    heal_at: Instant,
    end_at: Instant,
    touched: Vec<usize>,
    liveness_failures: Vec<String>,
}

impl Sim {
    /// Builds the run of `spec` under `seed`. Every random stream descends from the seed in a
    /// fixed order: network, origin, then one per node.
    pub fn new(spec: SimSpec, seed: u64) -> Self {
        let mut root = rng::from_seed(seed);
        let net_rng = rng::child(&mut root, "net");
        let origin_rng = rng::child(&mut root, "origin");
        let cluster = &spec.cluster;
        assert!(cluster.nodes > 0, "a cluster has nodes");
        if let Err(e) = cluster.bounds.validate() {
            panic!("unusable bounds: {e}");
        }
        let view = static_view(cluster.nodes);
        let contents = Contents::new(cluster.geometry.block_bytes());
        let hasher: std::sync::Arc<dyn dart_core::integrity::BlockHasher> =
            std::sync::Arc::new(crate::content::SimHasher::new(&contents));
        let nodes: Vec<SimNode> = (0..cluster.nodes)
            .map(|i| {
                let rng: Rng = rng::child(&mut root, &format!("n{i}"));
                let peer = cluster.peer.clone().map(|p| (p, view.clone()));
                let (engine, access) = (cluster.engine(), cluster.access());
                let node = SimNode::new(
                    i,
                    engine,
                    cluster.bounds,
                    access,
                    cluster.cache_blocks,
                    peer,
                    rng,
                )
                .with_hasher(hasher.clone());
                if cluster.blobs.is_some() {
                    node.registry_mode()
                } else {
                    node
                }
            })
            .collect();
        let keys = Engine::new(cluster.engine());
        let object_ids: Vec<ObjectId> = (0..cluster.objects.len())
            .map(|i| keys.identify(&cluster.object_url(i, "index", u64::MAX)))
            .collect();
        let mut chunk_objects = BTreeMap::new();
        for (i, o) in cluster.objects.iter().enumerate() {
            index_chunks(&mut chunk_objects, &keys, &object_ids[i], i, o.size, cluster);
        }
        let mut replaced = vec![false; cluster.objects.len()];
        for f in &spec.plan.faults {
            if let FaultKind::ReplaceObject { object, .. } = f.kind {
                replaced[object % cluster.objects.len()] = true;
            }
        }
        let heal_at = Instant::ZERO + spec.phases.safety;
        let end_at = heal_at + spec.phases.liveness;
        let mut sim = Sim {
            net: Net::new(cluster.net.clone(), cluster.nodes, net_rng),
            origin: Origin::new(cluster.objects.clone(), cluster.origin, origin_rng),
            contents,
            hasher,
            nodes,
            calls: BTreeMap::new(),
            next_call: 0,
            trace: Trace::new(spec.record_trace),
            chunk_objects,
            object_ids,
            keys,
            origin_windows: BTreeMap::new(),
            records: Vec::new(),
            blocks: Vec::new(),
            violation: None,
            stale_refetches: 0,
            peer_answers: BTreeMap::new(),
            peer_timeouts: BTreeMap::new(),
            replaced,
            buffers: drive::Buffers::default(),
            events: 0,
            fault_active: vec![false; spec.plan.faults.len()],
            crashes: vec![0; cluster.nodes],
            heal_at,
            end_at,
            touched: Vec::new(),
            liveness_failures: Vec::new(),
            queue: Queue::default(),
            now: Instant::ZERO,
            seed,
            spec,
        };
        sim.schedule_start();
        sim
    }

    fn schedule_start(&mut self) {
        let w = &self.spec.workload;
        for (i, r) in w.safety.iter().enumerate() {
            self.records.push(record(Phase::Safety, i, r.node, r.object));
            if Instant::ZERO + r.at < self.heal_at {
                self.queue.push(Instant::ZERO + r.at, Event::ReadStart { record: i });
            }
        }
        for (i, r) in w.liveness.iter().enumerate() {
            self.records.push(record(Phase::Liveness, i, r.node, r.object));
        }
        for (i, f) in self.spec.plan.faults.iter().enumerate() {
            let start = Instant::ZERO + f.at;
            if start < self.heal_at {
                self.queue.push(start, Event::FaultStart { fault: i });
                self.queue.push((start + f.lasts).min(self.heal_at), Event::FaultEnd { fault: i });
            }
        }
        self.queue.push(self.heal_at, Event::Heal);
        self.queue.push(self.end_at, Event::End);
    }

    /// Runs to the end and reports.
    pub fn run(mut self) -> RunReport {
        // Machines with a deadline from the start (discovery's first round) are woken for it.
        for n in 0..self.nodes.len() {
            self.arm_timer(n);
        }
        while let Some((at, event)) = self.queue.pop() {
            debug_assert!(at >= self.now, "time never goes backwards in the queue");
            self.now = at;
            self.events += 1;
            self.touched.clear();
            let end = event == Event::End;
            self.step(event);
            self.check_step();
            if end || self.violation.is_some() {
                break;
            }
        }
        if self.violation.is_none() {
            self.check_all();
        }
        self.report()
    }

    fn step(&mut self, event: Event) {
        match event {
            Event::ReadStart { record } => self.start_read(record),
            Event::Call { call, gen, step } => self.call_step(call, gen, step),
            Event::PeerCancel { node, incarnation, request } => {
                self.peer_cancel(node, incarnation, request)
            }
            Event::NodeTimer { node } => self.node_timer(node),
            Event::FaultStart { fault } => self.fault(fault, true),
            Event::FaultEnd { fault } => self.fault(fault, false),
            Event::Heal => self.heal(),
            Event::End => self.end(),
        }
    }

    /// Records the first invariant violation; the run stops after the current step.
    pub(crate) fn violate(&mut self, node: Option<usize>, what: String) {
        self.trace.line(self.now, format_args!("VIOLATION {what}"));
        if self.violation.is_none() {
            self.violation = Some(Violation { at: self.now, node, what });
        }
    }

    pub(crate) fn touch(&mut self, node: usize) {
        if !self.touched.contains(&node) {
            self.touched.push(node);
        }
    }

    fn check_step(&mut self) {
        if self.violation.is_some() {
            return; // the run stops here; the state is not expected to be consistent
        }
        let full = self.spec.check == CheckLevel::Full
            || self.events.is_multiple_of(full_check_every(self.nodes.len()));
        let touched = match self.spec.check {
            CheckLevel::Full | CheckLevel::Touched => true,
            CheckLevel::Sampled { every } => self.events.is_multiple_of(every.max(1)),
        };
        if full {
            self.check_all();
        } else if touched {
            for &n in &self.touched {
                self.nodes[n].check_invariants();
            }
        }
        assert!(self.calls.len() <= CALLS_MAX, "calls above their bound");
        for i in 0..self.touched.len() {
            let n = self.touched[i];
            self.arm_timer(n);
        }
    }

    /// The workload entry of read record `record`.
    pub(crate) fn read_spec(&self, record: usize) -> crate::workload::ReadSpec {
        let safety = self.spec.workload.safety.len();
        if record < safety {
            self.spec.workload.safety[record]
        } else {
            self.spec.workload.liveness[record - safety]
        }
    }

    fn check_all(&mut self) {
        for node in &self.nodes {
            node.check_invariants();
            node.check_exchanges();
        }
        self.net.check_invariants();
        for (id, call) in &self.calls {
            let owner = self.nodes[call.node].exchanges.get(&call.io);
            assert_eq!(owner, Some(id), "call {id} of no exchange");
        }
        assert!(self.origin_windows.values().all(|&n| n == 1), "origin window count drifted");
        if (0..self.spec.cluster.objects.len()).any(|o| self.origin.versions(o).len() > 1) {
            self.check_cached_versions();
        }
    }

    /// Schedules node `n`'s timer event at its machine's earliest deadline, if earlier than the
    /// one armed.
    fn arm_timer(&mut self, n: usize) {
        let node = &mut self.nodes[n];
        let Some(machine) = &node.machine else { return };
        if let Some(at) = machine.poll_timeout() {
            // A deadline already past (discovery's first round is due at start) fires now.
            let at = at.max(self.now);
            if node.timer_at.is_none_or(|t| at < t) {
                node.timer_at = Some(at);
                self.queue.push(at, Event::NodeTimer { node: n });
            }
        }
    }

    fn node_timer(&mut self, n: usize) {
        let now = self.now;
        let node = &mut self.nodes[n];
        if node.timer_at != Some(now) {
            return; // superseded by an earlier deadline, or the process died
        }
        node.timer_at = None;
        let Some(machine) = &node.machine else { return };
        if machine.poll_timeout().is_some_and(|t| t <= now) {
            self.trace.line(now, format_args!("timer n{n}"));
            self.timeout(n);
            let due = self.nodes[n].machine.as_ref().and_then(|m| m.poll_timeout());
            if let Some(t) = due.filter(|&t| t <= now) {
                self.violate(
                    Some(n),
                    format!("timer due at {t} after handle_timeout({now}): busy loop"),
                );
            }
        }
        self.touch(n);
    }

    // ---- faults and phases ---------------------------------------------------------------------

    fn fault(&mut self, i: usize, on: bool) {
        if self.fault_active[i] == on {
            return;
        }
        self.fault_active[i] = on;
        let fault = self.spec.plan.faults[i];
        let nodes = self.spec.cluster.nodes;
        let node = |k: usize| Endpoint::Node(k % nodes);
        self.trace.line(
            self.now,
            format_args!("fault {} #{i} {}", if on { "start" } else { "end" }, fault.kind),
        );
        match fault.kind {
            FaultKind::Partition { a, b, one_way } => {
                self.net.cut(node(a), node(b), on);
                if !one_way {
                    self.net.cut(node(b), node(a), on);
                }
            }
            FaultKind::CutOrigin { node: k, one_way } => {
                self.net.cut(node(k), Endpoint::Origin, on);
                if !one_way {
                    self.net.cut(Endpoint::Origin, node(k), on);
                }
            }
            FaultKind::Isolate { node: k } | FaultKind::BlackHole { node: k } => {
                self.net.darken(node(k), on)
            }
            FaultKind::Drain { node: k } => {
                if on {
                    if self.nodes[k % nodes].is_up() {
                        self.feed(k % nodes, dart_core::node::Input::Drain);
                    }
                } else {
                    self.crash(k % nodes, false);
                }
            }
            FaultKind::Crash { node: k, keep_cache } => {
                if on {
                    self.crash(k % nodes, keep_cache);
                } else {
                    self.restart(k % nodes);
                }
            }
            FaultKind::Stall { node: k } => {
                let pf = &mut self.nodes[k % nodes].peer_faults;
                if on {
                    pf.stalls += 1;
                } else {
                    pf.stalls -= 1;
                }
            }
            FaultKind::Rot { node: k } => {
                if on {
                    let n = self.nodes[k % nodes].cache.rot();
                    self.trace.line(self.now, format_args!("rot n{} {n} blocks", k % nodes));
                }
            }
            FaultKind::Lies { node: k, lie } => {
                let pf = &mut self.nodes[k % nodes].peer_faults;
                if on {
                    pf.lies.push(lie);
                } else if let Some(p) = pf.lies.iter().position(|l| *l == lie) {
                    pf.lies.remove(p);
                }
            }
            FaultKind::Slow { node: k, extra_ms, divisor } => self.net.add_slow(
                node(k),
                Duration::from_millis(extra_ms.into()),
                divisor.max(1).into(),
                on,
            ),
            FaultKind::Loss { a, b, percent } => {
                let side = |k: usize| if k == ORIGIN_SIDE { Endpoint::Origin } else { node(k) };
                self.net.add_loss(side(a), side(b), percent, on);
                self.net.add_loss(side(b), side(a), percent, on);
            }
            FaultKind::Origin(o) => self.origin.set_fault(o, on),
            FaultKind::ReplaceObject { object, size } => {
                if on {
                    self.replace_object(object % self.spec.cluster.objects.len(), size);
                }
            }
        }
        if on {
            self.stall_silenced_calls();
        } else {
            self.resume_healed_calls();
        }
    }

    /// The origin serves a new version of `object` from now on.
    fn replace_object(&mut self, object: usize, size: Option<u64>) {
        let v = self.origin.replace(object, self.now, size);
        let (k, size, etag) = (v.index, v.shape.size, v.etag.clone());
        self.trace.line(self.now, format_args!("version o{object} v{k} {size}B {etag}"));
        let id = self.object_ids[object].clone();
        index_chunks(&mut self.chunk_objects, &self.keys, &id, object, size, &self.spec.cluster);
    }

    /// Node `n`'s process dies: its machine is dropped, its client reads are cut off, the calls it
    /// made vanish (callees serving them hear the reset) and calls to it are reset.
    fn crash(&mut self, n: usize, keep_cache: bool) {
        if !self.nodes[n].is_up() {
            return;
        }
        let (cut, calls) = self.nodes[n].crash(keep_cache);
        for r in cut {
            self.close_record(r, ReadOutcome::Aborted);
        }
        self.crashes[n] += 1;
        self.net.set_down(Endpoint::Node(n), true);
        for id in calls {
            self.remove_call(id, true);
        }
        self.reset_calls_to(n);
        self.touch(n);
    }

    fn restart(&mut self, n: usize) {
        if self.nodes[n].is_up() {
            return;
        }
        self.nodes[n].restart(self.now);
        self.net.set_down(Endpoint::Node(n), false);
        self.touch(n);
    }

    /// Ends read record `r` with `outcome`; a liveness client retries an incomplete read after
    /// [`LIVENESS_RETRY_DELAY`] while the liveness bound allows.
    pub(crate) fn close_record(&mut self, r: usize, outcome: ReadOutcome) {
        let record = &mut self.records[r];
        let retry = record.phase == Phase::Liveness && !outcome.is_complete();
        record.outcome = outcome;
        record.done_at = Some(self.now);
        let at = self.now + LIVENESS_RETRY_DELAY;
        if retry && at < self.end_at {
            self.queue.push(at, Event::ReadStart { record: r });
        }
    }

    fn heal(&mut self) {
        for i in 0..self.fault_active.len() {
            self.fault(i, false);
            if let FaultKind::Drain { node } = self.spec.plan.faults[i].kind {
                // Redeployed: a new process (with an empty cache) joins when the faults heal.
                self.restart(node % self.spec.cluster.nodes);
            }
        }
        let healed = self.net.is_healed() && self.origin.is_healed();
        if !healed || self.nodes.iter().any(|n| !n.is_up()) {
            self.violate(None, "faults still in force after healing".into());
        }
        self.trace.line(self.now, format_args!("heal"));
        let base = self.spec.workload.safety.len();
        for (i, r) in self.spec.workload.liveness.iter().enumerate() {
            self.queue.push(self.now + r.at, Event::ReadStart { record: base + i });
        }
    }

    fn end(&mut self) {
        self.trace.line(self.now, format_args!("end"));
        for r in self.records.iter().filter(|r| r.phase == Phase::Liveness) {
            if !r.outcome.is_complete() {
                self.liveness_failures.push(format!(
                    "liveness read #{} (n{} object {}) ended {:?} by {}",
                    r.index, r.node, r.object, r.outcome, self.now
                ));
            }
        }
    }

    // ---- helpers for the checker ---------------------------------------------------------------

    /// The key of block `block` of object `object`.
    pub(crate) fn block_key(&self, object: usize, block: u64) -> BlockKey {
        self.keys.block_key(&self.object_ids[object], block)
    }

    /// The object of block `key` and the block's geometry length in the version of the object
    /// node `n` believes in (else the version the origin serves now), if it is of a known object
    /// and inside that version.
    pub(crate) fn block_of(&self, n: Option<usize>, key: BlockKey) -> Option<(usize, u64)> {
        let &object = self.chunk_objects.get(&key.chunk)?;
        let believed = n.and_then(|n| self.believed_version(n, object).ok().flatten());
        let size = match believed {
            Some(k) => self.origin.versions(object)[k].shape.size,
            None => self.origin.current(object).shape.size,
        };
        Some((object, self.spec.cluster.geometry.block_len(size, key.block)?))
    }

    /// The version of `object` that these validators name (`ETag`, else `Last-Modified`):
    /// `Ok(None)` when there are none, an error when they name no version of it.
    pub(crate) fn version_named(
        &self,
        object: usize,
        etag: Option<&str>,
        last_modified: Option<&str>,
    ) -> Result<Option<usize>, String> {
        let versions = self.origin.versions(object);
        let found = match (etag, last_modified) {
            (Some(e), _) => versions.iter().position(|v| v.etag == e),
            (None, Some(lm)) => versions.iter().position(|v| v.last_modified == lm),
            (None, None) => return Ok(None),
        };
        match found {
            Some(k) => Ok(Some(k)),
            None => Err(format!(
                "validators {etag:?} / {last_modified:?} name no version of o{object} (it has {})",
                versions.len()
            )),
        }
    }

    /// The version of `object` node `n`'s machine believes it reads (the validators its engine
    /// holds), if it knows any.
    pub(crate) fn believed_version(
        &self,
        n: usize,
        object: usize,
    ) -> Result<Option<usize>, String> {
        let Some(machine) = self.nodes[n].machine.as_ref() else { return Ok(None) };
        let Some(meta) = machine.engine().meta_of(&self.object_ids[object].id) else {
            return Ok(None);
        };
        self.version_named(object, meta.etag.as_deref(), meta.last_modified.as_deref())
    }

    /// Whether `data` is exactly block `key` of version `version` of its object (`None`: of some
    /// version): exact geometry length, exact bytes, never of a Range-blind object. Returns the
    /// version it is.
    pub(crate) fn check_block(
        &self,
        key: BlockKey,
        data: &[bytes::Bytes],
        version: Option<usize>,
    ) -> Result<usize, String> {
        let Some(&object) = self.chunk_objects.get(&key.chunk) else {
            return Err(format!("block {key} of no known object"));
        };
        let def = self.spec.cluster.objects[object];
        let versions = self.origin.versions(object);
        let result = match version {
            Some(k) => match versions.get(k) {
                Some(v) => self.block_is(key, data, v.shape).map(|()| k),
                None => Err(format!("block {key} of version {k}, which o{object} never had")),
            },
            None => {
                // The newest version first: the likeliest, and the one a miss is reported for.
                let mut first = None;
                let found =
                    versions.iter().rev().find_map(|v| match self.block_is(key, data, v.shape) {
                        Ok(()) => Some(v.index),
                        Err(e) => {
                            first.get_or_insert(e);
                            None
                        }
                    });
                found.ok_or_else(|| first.expect("an object has a version"))
            }
        };
        let k = match result {
            Ok(k) => k,
            Err(what) if versions.len() > 1 => {
                // Name the version the bytes are of, if any: a block of the wrong version.
                let other = versions.iter().find(|v| {
                    Some(v.index) != version && self.block_is(key, data, v.shape).is_ok()
                });
                return Err(match other {
                    Some(v) => format!(
                        "block {key} is version {} of o{object}, not version {} ({what})",
                        v.index,
                        version.map_or("?".into(), |k| k.to_string())
                    ),
                    None => what,
                });
            }
            Err(what) => return Err(what),
        };
        if def.range_blind {
            return Err(format!("block {key} of a Range-blind object"));
        }
        Ok(k)
    }

    /// Whether `data` is exactly block `key` of an object shaped `shape`.
    fn block_is(
        &self,
        key: BlockKey,
        data: &[bytes::Bytes],
        shape: crate::content::ObjectShape,
    ) -> Result<(), String> {
        let g = self.spec.cluster.geometry;
        let want = g.block_len(shape.size, key.block);
        let len: u64 = data.iter().map(|d| d.len() as u64).sum();
        if want != Some(len) {
            return Err(format!("block {key}: {len} bytes, geometry says {want:?}"));
        }
        let mut at = key.block * g.block_bytes();
        for part in data {
            if let Err(m) = self.contents.check(shape, at, part) {
                return Err(format!("block {key} with a wrong byte at {}", m.offset));
            }
            at += part.len() as u64;
        }
        Ok(())
    }

    /// Every cached block of a replaced object is of the version its node believes in (a node
    /// that learnt a new version dropped the old one's blocks).
    fn check_cached_versions(&mut self) {
        let mut bad = None;
        'nodes: for (n, node) in self.nodes.iter().enumerate() {
            for (key, data, _) in node.cache.iter() {
                let Some(&object) = self.chunk_objects.get(&key.chunk) else { continue };
                if self.origin.versions(object).len() < 2 {
                    continue;
                }
                // A block a warm start kept is of no version the machine knows: it may be of any,
                // and the machine never serves it for an object that may change.
                if node.machine.as_ref().is_some_and(|m| m.is_unversioned(key)) {
                    continue;
                }
                let believed = match self.believed_version(n, object) {
                    Ok(Some(k)) => k,
                    Ok(None) => continue,
                    Err(e) => {
                        bad = Some((n, e));
                        break 'nodes;
                    }
                };
                if let Err(e) = self.check_block(*key, std::slice::from_ref(data), Some(believed)) {
                    bad = Some((
                        n,
                        format!("cache holds {e} while the node reads version {believed}"),
                    ));
                    break 'nodes;
                }
            }
        }
        if let Some((n, what)) = bad {
            self.violate(Some(n), what);
        }
    }

    fn report(mut self) -> RunReport {
        let now = self.now;
        // Peer addresses by node index: `unclosed` lists circuits in that order.
        let peers: BTreeMap<String, usize> =
            (0..self.nodes.len()).map(|i| (member_addr(i), i)).collect();
        let nodes = self
            .nodes
            .iter_mut()
            .zip(&self.crashes)
            .map(|(n, &crashes)| {
                let p2p = n.machine.as_ref().and_then(|m| m.engine().p2p());
                let unclosed = p2p.map_or(Vec::new(), |p| {
                    let mut unclosed: Vec<(usize, String, CircuitState)> = p
                        .breaker
                        .unclosed(now)
                        .filter_map(|(a, s)| Some((*peers.get(a)?, a.clone(), s)))
                        .collect();
                    unclosed.sort_unstable_by_key(|(i, _, _)| *i);
                    unclosed.into_iter().map(|(_, a, s)| (a, s)).collect()
                });
                NodeReport {
                    engine: n.stats(),
                    cached_blocks: n.cache.len(),
                    evictions: n.cache.evictions,
                    admit_rejected: n.cache.admit_rejected,
                    crashes,
                    breaker: p2p.map(|p| p.breaker.counters().clone()),
                    unclosed,
                    circuit_events: std::mem::take(&mut n.circuit_events),
                    view: n.view(),
                    view_changes: std::mem::take(&mut n.view_changes),
                    member_id: n.member_id(),
                    counters: n.machine.as_ref().map(|m| m.counters()).unwrap_or_default(),
                }
            })
            .collect();
        let mut origin = self.origin.stats().clone();
        origin.bytes_timeline.sort();
        RunReport {
            seed: self.seed,
            plan: self.spec.plan.clone(),
            trace_hash: self.trace.hash(),
            events: self.events,
            trace_lines: self.trace.len(),
            end: self.now,
            heal_at: self.heal_at,
            reads: std::mem::take(&mut self.records),
            origin,
            nodes,
            blocks: std::mem::take(&mut self.blocks),
            violation: self.violation.take(),
            stale_refetches: self.stale_refetches,
            peer_answers: std::mem::take(&mut self.peer_answers),
            peer_timeouts: std::mem::take(&mut self.peer_timeouts),
            liveness_failures: std::mem::take(&mut self.liveness_failures),
            versions: (0..self.spec.cluster.objects.len())
                .map(|o| self.origin.versions(o).to_vec())
                .collect(),
            trace: self.trace.take_lines(),
        }
    }
}

fn record(phase: Phase, index: usize, node: usize, object: usize) -> ReadRecord {
    ReadRecord {
        phase,
        index,
        node,
        object,
        started: None,
        head_at: None,
        first_byte_at: None,
        done_at: None,
        bytes: 0,
        attempts: 0,
        outcome: ReadOutcome::Pending,
        version: None,
    }
}

/// Records which object each chunk key of object `i` (of `size` bytes) belongs to.
fn index_chunks(
    out: &mut BTreeMap<ChunkKey, usize>,
    keys: &Engine,
    id: &ObjectId,
    i: usize,
    size: u64,
    cluster: &crate::config::ClusterConfig,
) {
    let g = cluster.geometry;
    let mut block = 0;
    while block < g.block_count(size) {
        let key = keys.block_key(id, block);
        let previous = out.insert(key.chunk, i);
        assert!(previous.is_none_or(|p| p == i), "two objects share a chunk key");
        block += g.blocks_per_chunk();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClusterConfig, Phases};
    use crate::fault::FaultPlan;
    use crate::origin::ObjectDef;
    use crate::workload::{ReadSpec, Workload};
    use bytes::Bytes;
    use dart_core::engine::BlockClass;

    fn sim(reads: Vec<ReadSpec>) -> Sim {
        let spec = SimSpec {
            cluster: ClusterConfig::new(2, 1 << 10, vec![ObjectDef::plain(10_000, 3)]),
            workload: Workload { safety: reads, liveness: vec![] },
            plan: FaultPlan::none(),
            phases: Phases { safety: Duration::from_secs(5), liveness: Duration::from_secs(5) },
            check: CheckLevel::Full,
            record_trace: true,
        };
        Sim::new(spec, 1)
    }

    #[test]
    fn a_corrupted_cached_block_is_caught_when_it_is_served() {
        let mut s = sim(vec![ReadSpec::whole(Duration::ZERO, 0, 0)]);
        let key = s.block_key(0, 2);
        let shape = s.spec.cluster.objects[0].shape();
        let mut bad = s.contents.window(shape, 2 << 10, 1 << 10).to_vec();
        bad[100] ^= 0xff;
        s.nodes[0].cache.put(key, Bytes::from(bad), BlockClass::Owned);
        let r = s.run();
        let v = r.violation.expect("the checker sees the wrong byte");
        assert!(v.what.contains("wrong byte at offset 2148"), "{v}");
    }

    #[test]
    fn a_short_cached_block_is_a_miss_for_the_core_and_never_served() {
        let mut s = sim(vec![ReadSpec::whole(Duration::ZERO, 0, 0)]);
        let key = s.block_key(0, 1);
        s.nodes[0].cache.put(key, Bytes::from_static(b"short"), BlockClass::Owned);
        let r = s.run();
        assert!(r.passed(), "{}", r.summary());
        assert_eq!(r.nodes[0].engine.cache_corrupt, 1);
        assert_eq!(r.reads[0].bytes, 10_000);
    }

    #[test]
    fn the_trace_has_one_line_per_event_at_least_and_records_the_calls() {
        let r = sim(vec![ReadSpec::whole(Duration::ZERO, 1, 0)]).run();
        let lines = r.trace.expect("recorded");
        assert!(lines.len() as u64 >= r.events);
        assert!(lines.iter().any(|l| l.contains("send n1 x0 c0 -> origin probe o0")), "{lines:#?}");
    }

    #[test]
    fn a_block_is_judged_against_the_version_it_must_be_and_named_when_it_is_another() {
        let mut s = sim(vec![]);
        let key = s.block_key(0, 2);
        let v0 = s.origin.versions(0)[0].shape;
        let old = s.contents.window(v0, 2 << 10, 1 << 10);
        s.replace_object(0, None);
        let v1 = s.origin.versions(0)[1].shape;
        let new = s.contents.window(v1, 2 << 10, 1 << 10);
        assert_eq!(s.check_block(key, std::slice::from_ref(&old), None), Ok(0));
        assert_eq!(s.check_block(key, std::slice::from_ref(&new), None), Ok(1));
        assert_eq!(s.check_block(key, std::slice::from_ref(&new), Some(1)), Ok(1));
        let e = s.check_block(key, std::slice::from_ref(&old), Some(1)).expect_err("old");
        assert!(e.contains("is version 0 of o0, not version 1"), "{e}");
        let mut bad = new.to_vec();
        bad[7] ^= 1;
        let e = s.check_block(key, &[Bytes::from(bad)], None).expect_err("corrupt");
        assert!(e.contains("wrong byte at 2055"), "{e}");
        // A version of another size has other block lengths.
        s.replace_object(0, Some(2500));
        let e = s.check_block(key, std::slice::from_ref(&new), Some(2)).expect_err("length");
        assert!(e.contains("geometry says Some(452)"), "{e}");
        assert_eq!(s.version_named(0, Some("\"o0v2\""), None), Ok(Some(2)));
        let lm = s.origin.versions(0)[1].last_modified.clone();
        assert_eq!(s.version_named(0, None, Some(&lm)), Ok(Some(1)));
        assert_eq!(s.version_named(0, None, None), Ok(None));
        assert!(s.version_named(0, Some("\"o0v9\""), None).is_err());
    }
}
