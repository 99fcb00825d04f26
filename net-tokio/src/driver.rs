//! The executor of a core [`Node`]: it feeds the machine what happened and carries out what the
//! machine decides. It moves bytes and keeps no decision of its own: no timeouts (the node's
//! timers bound every exchange and cancel it), no flight table, no breaker logic, no status
//! choices.
//!
//! # Ownership
//!
//! One `Node` behind one mutex, shared by every connection task: an input takes the lock, the
//! node handles it, its outputs are drained under the same lock into per-request mailboxes and
//! task spawns, and the lock is released. The machine's work per input is small (it routes
//! `Bytes` handles; block bytes are never copied under the lock on a cache hit), so both cores
//! serve requests in parallel and the lock is held for microseconds. The node isolates panics
//! itself (a panicking input fails only the requests it touched), so the mutex is never poisoned
//! by the core; a poisoned lock from a shell bug is taken over rather than propagated.
//!
//! Store reads that may touch the disk and every disk write run on tokio's blocking pool, never
//! on the async workers; a RAM-tier hit is answered inline.

use crate::body::{self, BodyError, ResponseBody};
use crate::cache::BlockCache;
use crate::client::{parse_target, HttpClient};
use crate::guard::ConnectionAbort;
use crate::metrics::{Metrics, Scrape};
use crate::registry_auth::{RegistryAuth, Turn};
use crate::seam::{DialError, Dialer, ShellClock};
use bytes::Bytes;
use dart_core::codec::roster::Roster;
use dart_core::engine::redirect;
use dart_core::engine::{EngineStats, PeerAnswer, Window};
use dart_core::hash::BlockKey;
use dart_core::node::{
    Endpoint, Event, FetchKind, Head, Headers, Inbound, Input, IoError, IoEvent, IoId, IoRequest,
    Node, NodeCounters, Output, Plane, RequestId,
};
use dart_core::registry::auth::{
    parse_token, AuthPlan, Credential, OnUnauthorized, TOKEN_BODY_MAX, TOKEN_EXCHANGE_BOUND,
};
use http::header::{HeaderName, HeaderValue, HOST};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::AbortHandle;

/// Blocks whose disk write is in flight, kept so that a look-up meanwhile still finds them; past
/// this many, further writes are not tracked (a look-up may then miss until the write lands).
pub const PENDING_PUTS_MAX: usize = 256;

/// A response part for a request's handler.
pub enum Part {
    /// The head.
    Head(Head),
    /// Body bytes the node emitted (each acknowledged with `Input::Drained` once taken).
    Data(Bytes),
    /// The response is complete.
    End,
    /// The response cannot complete: reset it.
    Abort,
    /// Passthrough: the rest of the body is this origin body, moved as is.
    Pipe(OriginBody, IoId),
    /// Hash every data part from here on and hold the latest back ([`Output::Hash`]).
    Hash(dart_core::registry::DigestAlgorithm),
    /// Report the digest of every part so far ([`Output::Seal`]).
    Seal,
}

/// An origin response body: streamed from the connection, or (a registry's first `401` kept
/// while its retry was refused too) held whole.
pub type OriginBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// Most bytes of a `401` body held for an answer while its retry runs.
const UNAUTHORIZED_BODY_MAX: usize = 64 << 10;

type RosterResult = Result<(Roster, Option<String>), String>;

/// Where a request's response parts go, and how to end its connection at once.
struct Mailbox {
    tx: mpsc::UnboundedSender<Part>,
    /// Fired on the node's abort: a requester that stopped reading never polls its body again,
    /// so the abort part alone would never reach its socket.
    connection: Option<ConnectionAbort>,
}

struct Inner {
    node: Node,
    mailboxes: BTreeMap<RequestId, Mailbox>,
    ios: BTreeMap<IoId, AbortHandle>,
    pipes: BTreeMap<IoId, RequestId>,
    pending_puts: BTreeMap<BlockKey, Bytes>,
    /// Puts running on the blocking pool, and keys dropped meanwhile.
    puts: PutLedger,
    rosters: BTreeMap<u64, oneshot::Sender<RosterResult>>,
    blocks: BTreeMap<u64, oneshot::Sender<Option<PeerAnswer>>>,
    taps: Vec<mpsc::UnboundedSender<Event>>,
    next_ticket: u64,
    armed: Option<dart_core::time::Instant>,
}

/// Work found while draining that must happen outside the lock.
/// Puts that run on the blocking pool, against drops that happen meanwhile.
///
/// A drop deletes a key at once, under the driver's lock; a put already handed to the blocking
/// pool would write it back afterwards. So a key dropped while a put of it is in flight is
/// hidden (every look-up misses) until the last such put finishes, and then deleted again.
#[derive(Debug, Default)]
struct PutLedger {
    in_flight: BTreeMap<BlockKey, u32>,
    dropped: BTreeSet<BlockKey>,
}

impl PutLedger {
    /// A put of `key` was handed to the blocking pool.
    fn started(&mut self, key: BlockKey) {
        *self.in_flight.entry(key).or_default() += 1;
    }

    /// `key` was dropped from the store.
    fn dropped(&mut self, key: BlockKey) {
        if self.in_flight.contains_key(&key) {
            self.dropped.insert(key);
        }
    }

    /// No put is running.
    fn is_idle(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Whether a look-up of `key` must miss whatever the store holds.
    fn hides(&self, key: &BlockKey) -> bool {
        self.dropped.contains(key)
    }

    /// A put of `key` finished; true if the key must now be deleted again (it was dropped while
    /// this or another put of it ran, and none is left running).
    fn finished(&mut self, key: BlockKey) -> bool {
        let Some(n) = self.in_flight.get_mut(&key) else { return false };
        *n -= 1;
        if *n > 0 {
            return false;
        }
        self.in_flight.remove(&key);
        self.dropped.remove(&key)
    }
}

enum Deferred {
    StoreGet(dart_core::node::StoreOp, BlockKey, Option<Window>),
    StorePut(
        BlockKey,
        Bytes,
        dart_core::engine::BlockClass,
        Option<dart_core::integrity::BlockDigest>,
    ),
    Event(Event),
    ReleaseMemory,
}

/// Where the driver reads wall-clock time for the node (peer MAC timestamps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WallClock {
    /// The system clock.
    System,
    /// A simulation: this Unix time (milliseconds) plus the shell clock's (virtual) elapsed time.
    Virtual {
        /// The Unix time at the driver's start.
        epoch_ms: u64,
    },
}

/// Runs one [`Node`] on tokio; see the module doc.
pub struct NodeDriver<D: Dialer> {
    inner: Mutex<Inner>,
    /// The runtime the driver was started on: every task it spawns runs there, whoever feeds it
    /// (in a turmoil simulation, on the node's own host).
    rt: tokio::runtime::Handle,
    clock: ShellClock,
    wall: WallClock,
    store: Arc<dyn BlockCache>,
    client: HttpClient<D>,
    metrics: Arc<Metrics>,
    next_request: AtomicU64,
    timer: Notify,
    /// Woken when the last put running on the blocking pool ends.
    puts_idle: Notify,
    /// Timer ticks that panicked (the timer task survives them: see `run_timers`).
    timer_panics: AtomicU64,
}

/// How long the timer task pauses after a tick that panicked.
const TIMER_PANIC_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// How long [`NodeDriver::close`] waits for puts still running before it closes the store.
pub const CLOSE_PUTS_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl<D: Dialer> NodeDriver<D> {
    /// A driver for `node` over `store` and `client`, with its timer task running until `stop`
    /// turns true. Must be called inside a tokio runtime.
    pub fn start(
        node: Node,
        store: Arc<dyn BlockCache>,
        client: HttpClient<D>,
        stop: watch::Receiver<bool>,
    ) -> Arc<Self> {
        Self::start_with(node, store, client, stop, WallClock::System)
    }

    /// [`start`](Self::start) with the node's wall clock read from `wall`.
    pub fn start_with(
        node: Node,
        store: Arc<dyn BlockCache>,
        client: HttpClient<D>,
        stop: watch::Receiver<bool>,
        wall: WallClock,
    ) -> Arc<Self> {
        let clock = ShellClock::start();
        let driver = Arc::new_cyclic(|weak: &std::sync::Weak<Self>| {
            let weak = weak.clone();
            let snapshot = Box::new(move || match weak.upgrade() {
                Some(d) => d.snapshot(),
                None => Scrape::default(),
            });
            let metrics = Arc::new(Metrics::new(snapshot, store.clone()));
            let inner = Inner {
                node,
                mailboxes: BTreeMap::new(),
                ios: BTreeMap::new(),
                pipes: BTreeMap::new(),
                pending_puts: BTreeMap::new(),
                puts: PutLedger::default(),
                rosters: BTreeMap::new(),
                blocks: BTreeMap::new(),
                taps: Vec::new(),
                next_ticket: 0,
                armed: None,
            };
            NodeDriver {
                inner: Mutex::new(inner),
                rt: tokio::runtime::Handle::current(),
                clock,
                wall,
                store,
                client,
                metrics,
                next_request: AtomicU64::new(0),
                timer: Notify::new(),
                puts_idle: Notify::new(),
                timer_panics: AtomicU64::new(0),
            }
        });
        driver.feed(Input::WallClock { unix_ms: driver.unix_ms() });
        driver.rt.spawn(driver.clone().run_timers(stop));
        driver
    }

    /// The wall clock now, in Unix milliseconds.
    fn unix_ms(&self) -> u64 {
        match self.wall {
            WallClock::System => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            WallClock::Virtual { epoch_ms } => {
                epoch_ms.saturating_add(self.clock.now().as_nanos() / 1_000_000)
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads the node under the lock (admin views, tests).
    pub fn with_node<R>(&self, f: impl FnOnce(&Node) -> R) -> R {
        f(&self.lock().node)
    }

    /// Changes the node under the lock outside the input contract (tests that stage a state, such
    /// as an open circuit); outputs it queues are carried out with the next input.
    pub fn with_node_mut<R>(&self, f: impl FnOnce(&mut Node) -> R) -> R {
        f(&mut self.lock().node)
    }

    /// The engine's counters.
    pub fn stats(&self) -> EngineStats {
        self.lock().node.stats()
    }

    /// The node machine's own counters.
    pub fn counters(&self) -> NodeCounters {
        self.lock().node.counters()
    }

    /// Timer ticks whose handling panicked: a bug in the node machine, logged at error level;
    /// the timer task went on (0 in every test and scenario).
    pub fn timer_panics(&self) -> u64 {
        self.timer_panics.load(Ordering::Relaxed)
    }

    /// The metric registry.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The block store.
    pub fn store(&self) -> &Arc<dyn BlockCache> {
        &self.store
    }

    /// Stops serving: waits for the puts still running on the blocking pool (at most
    /// [`CLOSE_PUTS_WAIT`]), so that a block already served is kept for a warm start, then
    /// closes the store (releasing its directory lock). The caller stops the listeners and the
    /// timer task first; exchanges still in flight then end as store misses and refused puts.
    pub async fn close(&self) {
        let _ = tokio::time::timeout(CLOSE_PUTS_WAIT, async {
            loop {
                // Registered before the check: a put that ends in between still wakes it.
                let idle = self.puts_idle.notified();
                if self.lock().puts.is_idle() {
                    return;
                }
                idle.await;
            }
        })
        .await;
        self.store.close();
    }

    /// The core's clock.
    pub fn clock(&self) -> ShellClock {
        self.clock
    }

    /// A store read that turns a panicking store into a miss.
    fn store_get(&self, key: &BlockKey, window: Option<Window>) -> Option<Bytes> {
        let get = || match window {
            Some(w) => self.store.get_window(key, w),
            None => self.store.get(key),
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(get)).unwrap_or(None)
    }

    fn snapshot(&self) -> Scrape {
        let inner = self.lock();
        let now = self.clock.now();
        let open_circuits = inner.node.engine().p2p().map(|p| p.breaker.open_count(now));
        Scrape {
            stats: inner.node.stats(),
            open_circuits,
            access: inner.node.access_counters(),
            node: inner.node.counters(),
            tracker_files: inner.node.registry().map(|r| r.files()),
            neighbours: inner.node.engine().neighbours().map(|n| n.report()),
            broadcast_targets: inner.node.broadcast_targets().map(<[String]>::len),
            discovery: inner.node.directory().map(|d| d.stats()),
            registry_tokens: self.client.registry_auth().map(|a| {
                let ok = a.exchanges_ok.load(Ordering::Relaxed);
                (ok, a.exchanges_failed.load(Ordering::Relaxed))
            }),
        }
    }

    /// Feeds one input as if the transport had observed it, and carries out what follows. The
    /// shell calls it for everything it sees; tests and debugging tools may too.
    pub fn feed(self: &Arc<Self>, input: Input) {
        self.feed_all([input]);
    }

    /// Feeds `inputs` in order under one hold of the lock, as [`NodeDriver::feed`] feeds one.
    pub fn feed_all(self: &Arc<Self>, inputs: impl IntoIterator<Item = Input>) {
        self.feed_after(|_| {}, inputs);
    }

    /// [`NodeDriver::feed_all`], after `first` under the same hold of the lock.
    fn feed_after(
        self: &Arc<Self>,
        first: impl FnOnce(&mut Inner),
        inputs: impl IntoIterator<Item = Input>,
    ) {
        let deferred = {
            let mut inner = self.lock();
            first(&mut inner);
            let mut deferred = Vec::new();
            for input in inputs {
                inner.node.handle_input(input, self.clock.now());
                deferred.extend(self.settle(&mut inner));
            }
            deferred
        };
        self.carry_out(deferred);
    }

    /// Fires the node's due timers.
    fn tick(self: &Arc<Self>) {
        let deferred = {
            let mut inner = self.lock();
            let now = self.clock.now();
            if inner.node.poll_timeout().is_some_and(|t| t <= now) {
                inner.node.handle_timeout(now);
            }
            self.settle(&mut inner)
        };
        self.carry_out(deferred);
    }

    /// Drains the node and feeds back, under the same lock, every answer known at once (a RAM
    /// hit, a key no tier holds): a look-up and its answer are one step, so no other input can
    /// slip between a miss and the fetch it causes (which would then not coalesce with a flight
    /// that ended in between). The chain is bounded by the body window.
    fn settle(self: &Arc<Self>, inner: &mut Inner) -> Vec<Deferred> {
        let mut queue = VecDeque::new();
        let mut deferred = self.drain(inner, &mut queue);
        while let Some(input) = queue.pop_front() {
            inner.node.handle_input(input, self.clock.now());
            deferred.extend(self.drain(inner, &mut queue));
        }
        deferred
    }

    /// Drains the node's outputs under the lock: mailbox parts and task spawns here, the rest
    /// deferred. Inputs answerable at once (RAM-tier look-ups) join `queue`.
    fn drain(self: &Arc<Self>, inner: &mut Inner, queue: &mut VecDeque<Input>) -> Vec<Deferred> {
        let mut deferred = Vec::new();
        while let Some(output) = inner.node.poll_output() {
            match output {
                Output::Resolve { ticket, name, port } => {
                    // The node bounds the resolution; a late answer is ignored.
                    let driver = self.clone();
                    self.rt.spawn(async move {
                        let result = match driver.client.dialer().resolve(&name, port).await {
                            Ok(addrs) => Ok(addrs.iter().map(ToString::to_string).collect()),
                            Err(e) => Err(format!("{name}: {e}")),
                        };
                        driver.feed(Input::Resolved { ticket, result });
                    });
                }
                Output::Send(req) => {
                    let id = req.id;
                    tracing::debug!(io = %id, endpoint = ?req.endpoint, url = %dart_core::codec::redact::redact_url(&req.url), range = ?req.headers.get_str("range"), "send");
                    let task = self.rt.spawn(self.clone().exchange(req));
                    inner.ios.insert(id, task.abort_handle());
                }
                Output::Cancel(io) => {
                    tracing::debug!(%io, "cancel");
                    if let Some(task) = inner.ios.remove(&io) {
                        task.abort();
                    }
                    inner.pipes.remove(&io);
                }
                Output::Pipe { io, to } => {
                    inner.pipes.insert(io, to);
                }
                Output::StoreGet { op, key, window } => {
                    let ready = match (inner.pending_puts.get(&key), window) {
                        _ if inner.puts.hides(&key) => Some(None),
                        (Some(data), Some(w)) => Some(w.slice(data)),
                        (Some(data), None) => Some(Some(data.clone())),
                        (None, _) => self.store.try_get_now(&key, window),
                    };
                    match ready {
                        Some(block) => queue.push_back(Input::Store { op, block }),
                        None => deferred.push(Deferred::StoreGet(op, key, window)),
                    }
                }
                Output::StoreDrop { keys } => {
                    // At once, under the lock: a look-up that follows must not find them.
                    for key in &keys {
                        inner.pending_puts.remove(key);
                        self.store.delete(key);
                        inner.puts.dropped(*key);
                    }
                }
                Output::StorePut { key, data, class, digest } => {
                    if self.store.blocking() {
                        if inner.pending_puts.len() < PENDING_PUTS_MAX {
                            inner.pending_puts.entry(key).or_insert_with(|| data.clone());
                        }
                        inner.puts.started(key);
                        deferred.push(Deferred::StorePut(key, data, class, digest));
                    } else {
                        self.store.put_digested(key, &data, class, digest);
                    }
                }
                Output::Respond { id, head } => send(inner, id, Part::Head(head), false),
                Output::Body { id, data } => send(inner, id, Part::Data(data), false),
                Output::Hash { id, algorithm } => send(inner, id, Part::Hash(algorithm), false),
                Output::Seal { id } => send(inner, id, Part::Seal, false),
                Output::End { id } => send(inner, id, Part::End, true),
                Output::Abort { id } => send(inner, id, Part::Abort, true),
                Output::ReleaseMemory => deferred.push(Deferred::ReleaseMemory),
                Output::Event(e) => {
                    inner.taps.retain(|tap| tap.send(e.clone()).is_ok());
                    match e {
                        Event::Roster { ticket, result } => {
                            if let Some(tx) = inner.rosters.remove(&ticket) {
                                let _ = tx.send(result);
                            }
                        }
                        Event::BlockFetched { ticket, answer } => {
                            if let Some(tx) = inner.blocks.remove(&ticket) {
                                let _ = tx.send(answer);
                            }
                        }
                        e => deferred.push(Deferred::Event(e)),
                    }
                }
            }
        }
        let next = inner.node.poll_timeout();
        if next.is_some() && (inner.armed.is_none() || next < inner.armed) {
            inner.armed = next;
            self.timer.notify_one();
        }
        deferred
    }

    fn carry_out(self: &Arc<Self>, deferred: Vec<Deferred>) {
        for d in deferred {
            match d {
                Deferred::StoreGet(op, key, window) => {
                    // Bytes the page cache holds are a copy away: read here, on the worker, with
                    // no hand-off (which costs more than the copy for a small range).
                    let cached = || self.store.get_cached(&key, window);
                    let cached = std::panic::catch_unwind(std::panic::AssertUnwindSafe(cached));
                    if let Ok(Some(block)) = cached {
                        self.feed(Input::Store { op, block });
                        continue;
                    }
                    // A store that panics is a miss, never a stuck read.
                    let get = || self.store_get(&key, window);
                    // Where it can, the read runs in the task that asked, with its worker
                    // handed off: the executor keeps running on the other threads, and the
                    // answer needs no hop to a pool thread and back.
                    match crate::seam::block_in_place(&self.rt, get) {
                        Ok(block) => self.feed(Input::Store { op, block }),
                        Err(_) => {
                            let driver = self.clone();
                            self.rt.spawn_blocking(move || {
                                let block = driver.store_get(&key, window);
                                driver.feed(Input::Store { op, block });
                            });
                        }
                    }
                }
                Deferred::StorePut(key, data, class, digest) => {
                    let driver = self.clone();
                    self.rt.spawn_blocking(move || {
                        let put = || driver.store.put_digested(key, &data, class, digest);
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(put));
                        let mut inner = driver.lock();
                        inner.pending_puts.remove(&key);
                        if inner.puts.finished(key) {
                            // Dropped while this put ran: what it wrote is of a version the node
                            // gave up, so it goes too.
                            driver.store.delete(&key);
                        }
                        if inner.puts.is_idle() {
                            driver.puts_idle.notify_waiters();
                        }
                    });
                }
                Deferred::Event(e) => self.record(e),
                Deferred::ReleaseMemory => {
                    // Trimming walks every arena of the allocator: the worker is handed off where
                    // the runtime can do that. Elsewhere (turmoil, madsim) it runs right here: a
                    // thread of the blocking pool would run beside the simulated world and make
                    // its runs differ.
                    let released =
                        match crate::seam::block_in_place(&self.rt, crate::memory::release) {
                            Ok(released) => released,
                            Err(release) => release(),
                        };
                    tracing::debug!(
                        pooled_bytes = released.pooled,
                        trimmed = released.trimmed,
                        "idle: memory kept for reuse released"
                    );
                }
            }
        }
    }

    fn record(&self, event: Event) {
        match event {
            Event::Circuit(e) => {
                tracing::info!(peer = %e.addr, from = %e.from, to = %e.to, reason = %e.reason, "circuit");
            }
            Event::Fetched { kind, elapsed } => {
                let source = match kind {
                    FetchKind::Peer => "peer",
                    FetchKind::Origin => "origin",
                };
                self.metrics.observe_fetch(source, elapsed.as_secs_f64());
            }
            Event::Failed { request, status, committed, error } => {
                tracing::warn!(%request, status, committed, %error, "request failed");
            }
            Event::Panicked { requests, message } => {
                tracing::error!(?requests, %message, "a request panicked in the node; it was failed");
            }
            Event::PeerAnswer { addr, observation } => match observation {
                dart_core::breaker::Observation::Served => {}
                dart_core::breaker::Observation::ValidationFailed => tracing::warn!(
                    peer = %addr,
                    "peer sent a block that does not match its digest (or none): refused, its circuit opens"
                ),
                _ => {
                    tracing::debug!(peer = %addr, ?observation, "peer fetch did not serve the block")
                }
            },
            Event::BlockRotten { key } => {
                tracing::warn!(
                    %key,
                    "a cached block no longer matches the digest it was stored with (disk or memory corruption): dropped, read afresh"
                );
            }
            Event::Block { request, plane, key, source } => {
                tracing::debug!(%request, ?plane, %key, ?source, "block");
            }
            Event::View { epoch, members, joined, left } => {
                tracing::info!(epoch, members, ?joined, ?left, "membership view changed");
            }
            Event::BroadcastTargets { targets } => {
                tracing::debug!(targets, "broadcast targets published");
            }
            Event::Left { announced, answered } => {
                tracing::info!(announced, answered, "departure announced to the broadcast targets");
            }
            Event::Discovery { message, suppressed } => {
                tracing::warn!(suppressed, "discovery: {message}");
            }
            Event::TrackerJoinFailed { file, error, suppressed } => {
                tracing::warn!(
                    %file,
                    %error,
                    suppressed,
                    "reader tree: JOIN failed; the object routes over every member"
                );
            }
            Event::Roster { .. } | Event::BlockFetched { .. } => {}
        }
    }

    async fn run_timers(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        loop {
            if *stop.borrow() {
                return;
            }
            let next = {
                let mut inner = self.lock();
                inner.armed = inner.node.poll_timeout();
                inner.armed
            };
            let clock = self.clock;
            let sleep = async move {
                match next {
                    Some(at) => tokio::time::sleep_until(clock.to_tokio(at)).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.changed() => return,
                () = self.timer.notified() => {}
                () = sleep => {
                    // One task fires every bound of the node: if it died on a panic, every
                    // exchange bound, probe and discovery round would stop for good. A panicking
                    // tick is logged and counted instead, and the loop goes on after a pause (a
                    // bug that panics on every tick then costs a log line per pause, not a core).
                    let tick = std::panic::AssertUnwindSafe(|| self.tick());
                    if std::panic::catch_unwind(tick).is_err() {
                        self.timer_panics.fetch_add(1, Ordering::Relaxed);
                        tracing::error!("a timer tick panicked in the node machine; timers go on");
                        tokio::time::sleep(TIMER_PANIC_PAUSE).await;
                    }
                }
            }
        }
    }

    /// Carries out one exchange: connect (pooled or dialed), send, report the head, then either
    /// report body parts or hand the body to a passthrough response.
    async fn exchange(self: Arc<Self>, req: IoRequest) {
        let id = req.id;
        self.run_exchange(req).await;
        self.lock().ios.remove(&id);
    }

    async fn run_exchange(self: &Arc<Self>, req: IoRequest) {
        let id = req.id;
        let report = |event| self.feed(Input::Io { id, event });
        // An origin GET follows redirects (`dart_core::engine::redirect` decides where, with
        // which headers); the machine sees one exchange and its final answer.
        let mut hop = req;
        let mut hops = 0u8;
        let (target, sender, parts, mut incoming) = loop {
            let (target, sender, parts, mut incoming) = match self.attempt(&hop, hops == 0).await {
                Ok(answer) => answer,
                Err(e) => return report(IoEvent::Failed(e)),
            };
            let location = parts.headers.get(http::header::LOCATION).and_then(|v| v.to_str().ok());
            let status = parts.status.as_u16();
            let next = (hop.endpoint == Endpoint::Origin)
                .then(|| redirect::target(status, location, &hop.url, hops))
                .flatten();
            let Some(next) = next else { break (target, sender, parts, incoming) };
            if read_bounded(&mut incoming, 0).await.is_some() {
                self.client.release(target.key, sender);
            }
            hop.headers = redirect::carried(&hop.headers, &hop.url, &next);
            hop.url = next;
            hops += 1;
        };
        let mut headers = Headers::new();
        for (name, value) in &parts.headers {
            headers.push(name.as_str(), value.as_bytes());
        }
        report(IoEvent::Head { status: parts.status.as_u16(), headers });
        if let Some(to) = self.take_pipe(id) {
            let mailbox = self.lock().mailboxes.get(&to).map(|m| m.tx.clone());
            match mailbox {
                Some(tx) => {
                    let _ = tx.send(Part::Pipe(incoming, id));
                }
                None => report(IoEvent::Failed(IoError::Broken("requester gone".into()))),
            }
            return;
        }
        loop {
            match incoming.frame().await {
                None => {
                    report(IoEvent::End);
                    self.client.release(target.key, sender);
                    return;
                }
                Some(Err(e)) => return report(IoEvent::Failed(IoError::Broken(cause(&e)))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            report(IoEvent::Body(data));
                        }
                    }
                }
            }
        }
    }

    /// One request of an exchange (the first, or one after a redirect): dial or reuse a
    /// connection, send with the registry credential the core's plan gives this URL, and on a
    /// credentialed registry's `401` the plan's one retry. `first` reports `Connected`.
    async fn attempt(
        self: &Arc<Self>,
        req: &IoRequest,
        first: bool,
    ) -> Result<
        (crate::client::Target, SendRequest<Full<Bytes>>, http::response::Parts, OriginBody),
        IoError,
    > {
        let target = match parse_target(&req.url) {
            Ok(mut t) if !(t.key.https && req.endpoint == Endpoint::Peer) => {
                t.key.origin = req.endpoint == Endpoint::Origin;
                t
            }
            Ok(_) => return Err(IoError::Invalid("https to a peer".into())),
            Err(e) if first => return Err(IoError::Invalid(e)),
            Err(e) => return Err(IoError::Invalid(format!("redirect: {e}"))),
        };
        let (mut sender, reused) = match self.client.connect(&target.key).await {
            Ok(s) => s,
            Err(DialError::Refused(r)) => return Err(IoError::Refused(r)),
            Err(e) => return Err(IoError::Connect(e.to_string())),
        };
        if first {
            self.feed(Input::Io { id: req.id, event: IoEvent::Connected });
        }
        // Registry credentials (`--registry-auth`): what this request carries is the core's
        // decision (`dart_core::registry::auth`); a 401 may lead to one retry below.
        let auth = (req.endpoint == Endpoint::Origin)
            .then(|| self.client.registry_auth().cloned())
            .flatten();
        let client_authorized = req.headers.get("authorization").is_some();
        let mut plan = auth.as_ref().and_then(|a| a.plan(&req.url, client_authorized));
        let sent = match (&auth, &plan) {
            (Some(a), Some(p)) => a.first(p, self.clock.now()),
            _ => Credential::None,
        };
        let request = || {
            let (pq, authority) = (&target.path_and_query, &target.authority);
            let headers = with_credential(&req.headers, &sent);
            build_request(req.method, pq, authority, &headers, &req.body)
        };
        let resp = match sender.send_request(request().map_err(IoError::Invalid)?).await {
            Ok(r) => r,
            // A pooled connection may have died while idle (the server closed it, a partition
            // broke it) before our request reached anyone: a GET is safe to send once more, on
            // a fresh connection. Any other failure is the exchange's.
            Err(_) if reused => {
                let retried = async {
                    let mut fresh =
                        self.client.dial(&target.key).await.map_err(|e| e.to_string())?;
                    let again = request()?;
                    let resp = fresh.send_request(again).await.map_err(|e| cause(&e))?;
                    Ok::<_, String>((fresh, resp))
                };
                let (fresh, resp) = retried.await.map_err(IoError::Broken)?;
                sender = fresh;
                resp
            }
            Err(e) => return Err(IoError::Broken(cause(&e))),
        };
        let (mut parts, incoming) = resp.into_parts();
        let mut incoming: OriginBody = incoming.boxed();
        if let (401, Some(a), Some(p)) = (parts.status.as_u16(), &auth, plan.as_mut()) {
            // Hold the registry's 401 (its answer if the retry is refused too), then retry.
            let Some(held) = read_bounded(&mut incoming, UNAUTHORIZED_BODY_MAX).await else {
                return Err(IoError::Broken("a 401 body broke".into()));
            };
            let challenge = parts
                .headers
                .get(http::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            match self.reauthorize(a, p, &target, req, &sent, challenge.as_deref()).await {
                Some((fresh, resp)) => {
                    let first = std::mem::replace(&mut sender, fresh);
                    self.client.release(target.key.clone(), first);
                    let (retried, body) = resp.into_parts();
                    parts = retried;
                    incoming = body.boxed();
                }
                // No usable retry: the registry's first answer is the exchange's.
                None => incoming = held_body(held),
            }
        }
        Ok((target, sender, parts, incoming))
    }

    /// The one retry of an exchange a credentialed registry answered `401`, as
    /// `dart_core::registry::auth` decides it: with Basic, or with a bearer token from the
    /// challenge's realm (one exchange per host and scope at a time). `None`: no retry, or the
    /// retry was refused too (the first `401` is the answer).
    async fn reauthorize(
        self: &Arc<Self>,
        auth: &Arc<RegistryAuth>,
        plan: &mut AuthPlan,
        target: &crate::client::Target,
        req: &IoRequest,
        sent: &Credential,
        challenge: Option<&str>,
    ) -> Option<(SendRequest<Full<Bytes>>, Response<Incoming>)> {
        let credential = match auth.on_unauthorized(plan, sent, challenge) {
            OnUnauthorized::Answer => return None,
            OnUnauthorized::Retry(credential) => credential,
            OnUnauthorized::Exchange { url, authorization, key } => {
                Credential::Bearer(self.token(auth, url, authorization, key).await?)
            }
        };
        let headers = with_credential(&req.headers, &credential);
        let (pq, authority) = (&target.path_and_query, &target.authority);
        let retry = build_request(req.method, pq, authority, &headers, &req.body).ok()?;
        let mut sender = self.client.dial(&target.key).await.ok()?;
        let resp = sender.send_request(retry).await.ok()?;
        if resp.status() == http::StatusCode::UNAUTHORIZED {
            let challenge = resp.headers().get(http::header::WWW_AUTHENTICATE);
            let challenge = challenge.and_then(|v| v.to_str().ok());
            // Drops a refused token; never a second retry.
            let _ = auth.on_unauthorized(plan, &credential, challenge);
            tracing::warn!(host = plan.host(), "the registry refused the node's credential");
            return None;
        }
        Some((sender, resp))
    }

    /// A bearer token for `key`: cached, or from the exchange already running for it, or from a
    /// new one this call starts. The exchange runs in its own task: a caller that goes away
    /// never fails the others.
    async fn token(
        self: &Arc<Self>,
        auth: &Arc<RegistryAuth>,
        url: String,
        authorization: String,
        key: String,
    ) -> Option<String> {
        let rx = match auth.turn(&key, self.clock.now()) {
            Turn::Cached(token) => return Some(token),
            Turn::Follow(rx) => rx,
            Turn::Lead(tx, rx) => {
                let (driver, auth) = (self.clone(), auth.clone());
                self.rt.spawn(async move {
                    let fetch = driver.fetch_token(&url, &authorization);
                    let got =
                        tokio::time::timeout(TOKEN_EXCHANGE_BOUND, fetch).await.ok().flatten();
                    if got.is_none() {
                        let realm = dart_core::codec::redact::redact_url(&url);
                        tracing::warn!(%realm, "registry token exchange failed");
                    }
                    auth.finish(&key, got, driver.clock.now(), tx);
                });
                rx
            }
        };
        RegistryAuth::wait(rx).await
    }

    /// `GET url` with `authorization` (the realm of a bearer challenge, trusted as the registry
    /// named it; dialed under the upstream policy like any origin): its token and lifetime.
    async fn fetch_token(
        &self,
        url: &str,
        authorization: &str,
    ) -> Option<(String, std::time::Duration)> {
        let mut target = parse_target(url).ok()?;
        target.key.origin = true;
        let headers = Headers::new().with("authorization", authorization);
        let (pq, authority) = (&target.path_and_query, &target.authority);
        let request = build_request("GET", pq, authority, &headers, &Bytes::new()).ok()?;
        let mut sender = self.client.dial(&target.key).await.ok()?;
        let resp = sender.send_request(request).await.ok()?;
        if resp.status() != http::StatusCode::OK {
            return None;
        }
        let mut body = resp.into_body().boxed();
        let bytes = read_bounded(&mut body, TOKEN_BODY_MAX + 1).await?;
        if bytes.len() > TOKEN_BODY_MAX {
            return None;
        }
        parse_token(&bytes)
    }

    fn take_pipe(&self, io: IoId) -> Option<RequestId> {
        let mut inner = self.lock();
        let to = inner.pipes.remove(&io)?;
        inner.ios.remove(&io);
        Some(to)
    }

    /// Fetches the roster of the peer at `addr` through the node (breaker outcome recorded).
    pub async fn fetch_roster(self: &Arc<Self>, addr: &str) -> RosterResult {
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut inner = self.lock();
            let ticket = inner.next_ticket;
            inner.next_ticket += 1;
            inner.rosters.insert(ticket, tx);
            ticket
        };
        self.feed(Input::FetchRoster { ticket, addr: addr.to_owned() });
        rx.await.unwrap_or_else(|_| Err("the node dropped the roster fetch".into()))
    }

    /// Fetches one block from the peer at `addr` directly (breaker admission and outcome
    /// recorded); `None` when the circuit is open or the peer path is off.
    pub async fn fetch_block(
        self: &Arc<Self>,
        addr: &str,
        key: BlockKey,
        url: &str,
        hop: u64,
        expected: u64,
    ) -> Option<PeerAnswer> {
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut inner = self.lock();
            let ticket = inner.next_ticket;
            inner.next_ticket += 1;
            inner.blocks.insert(ticket, tx);
            ticket
        };
        let (addr, url) = (addr.to_owned(), url.to_owned());
        self.feed(Input::FetchBlock { ticket, addr, key, url, hop, expected });
        rx.await.unwrap_or(None)
    }

    /// Every event the node emits from now on (tests, diagnostics).
    /// Announces the node's departure to its broadcast targets ([`Input::Drain`]) and waits
    /// for [`Event::Left`]: the machine bounds every announcement by
    /// [`dart_core::node::LEAVE_BOUND`], so it comes within that; `bound` is only a safety net
    /// should the driver stop meanwhile. Answers (targets told, answered), or `None` when
    /// `bound` passed first.
    pub async fn announce_departure(
        self: &Arc<Self>,
        bound: std::time::Duration,
    ) -> Option<(usize, usize)> {
        let mut events = self.tap_events();
        self.feed(Input::Drain);
        let left = async {
            while let Some(e) = events.recv().await {
                if let Event::Left { announced, answered } = e {
                    return Some((announced, answered));
                }
            }
            None
        };
        tokio::time::timeout(bound, left).await.ok().flatten()
    }

    pub fn tap_events(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().taps.push(tx);
        rx
    }

    /// Serves one request that arrived on `plane`.
    pub async fn handle(
        self: Arc<Self>,
        plane: Plane,
        req: Request<Incoming>,
    ) -> Response<ResponseBody> {
        let mut headers = Headers::new();
        for (name, value) in req.headers() {
            headers.push(name.as_str(), value.as_bytes());
        }
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
        let method = req.method().as_str().to_owned();
        let connection = req.extensions().get::<ConnectionAbort>().cloned();
        // The node says which bodies it reads (a tracker JOIN or LEAVE); the rest stay unread.
        let body = match Inbound::body_max(plane, &method) {
            Some(max) => {
                let bound = self.lock().node.config().bounds.inbound_head_read;
                match read_body(req.into_body(), max, bound).await {
                    Some(body) => body,
                    // A transport failure before the node saw the request: nothing to decide.
                    None => {
                        return body::plain(400, "dart: the request body broke or was too slow")
                    }
                }
            }
            None => Bytes::new(),
        };
        let request = Inbound { method, target, headers, body };
        self.respond_on(plane, request, connection).await
    }

    /// Serves one parsed request: the response whose body the node streams. Dropping the
    /// response (or its body before the end) cancels the request.
    pub async fn respond(
        self: Arc<Self>,
        plane: Plane,
        request: Inbound,
    ) -> Response<ResponseBody> {
        self.respond_on(plane, request, None).await
    }

    /// [`respond`](Self::respond) on a connection that the node's abort closes at once.
    pub async fn respond_on(
        self: Arc<Self>,
        plane: Plane,
        request: Inbound,
        connection: Option<ConnectionAbort>,
    ) -> Response<ResponseBody> {
        let id = RequestId(self.next_request.fetch_add(1, Ordering::Relaxed));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut guard = CancelGuard { driver: Some(self.clone()), id };
        // The mailbox, the wall clock and the request under one hold of the lock.
        let wall = Input::WallClock { unix_ms: self.unix_ms() };
        let mailbox = Mailbox { tx, connection };
        self.feed_after(
            |inner| {
                inner.mailboxes.insert(id, mailbox);
            },
            [wall, Input::Request { id, plane, request }],
        );
        let head = match rx.recv().await {
            Some(Part::Head(head)) => head,
            Some(_) | None => {
                guard.disarm();
                return body::plain(500, "dart: the node answered no head");
            }
        };
        let mut resp = Response::new(body::empty());
        *resp.status_mut() = http::StatusCode::from_u16(head.status)
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let remaining = head.content_length();
        // The values are slices of the head's one buffer, not a copy each.
        let (fields, spans) = head.headers.into_shared();
        for (name, value) in spans {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(&fields[name]),
                HeaderValue::from_maybe_shared(fields.slice(value)),
            ) {
                resp.headers_mut().append(n, v);
            }
        }
        let driver = guard.disarm();
        if head.body {
            let body = NodeBody {
                rx,
                driver,
                id,
                remaining,
                piped: None,
                done: false,
                hashing: None,
                held: None,
                ending: false,
                peeked: None,
            };
            *resp.body_mut() = body.boxed();
        }
        resp
    }
}

fn send(inner: &mut Inner, id: RequestId, part: Part, last: bool) {
    if !last {
        if let Some(m) = inner.mailboxes.get(&id) {
            let _ = m.tx.send(part);
        }
        return;
    }
    let Some(m) = inner.mailboxes.remove(&id) else { return };
    let abort = matches!(part, Part::Abort);
    let _ = m.tx.send(part);
    if let (true, Some(connection)) = (abort, m.connection) {
        connection.abort();
    }
}

/// A body held whole, as an [`OriginBody`].
fn held_body(bytes: Bytes) -> OriginBody {
    Full::new(bytes).map_err(|never: std::convert::Infallible| match never {}).boxed()
}

/// Reads `body` to its end, keeping at most `max` bytes; `None` if it breaks.
async fn read_bounded(body: &mut OriginBody, max: usize) -> Option<Bytes> {
    let mut held = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.ok()?.into_data() {
            let room = max.saturating_sub(held.len());
            held.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Some(held.freeze())
}

/// `headers` with `credential`'s `Authorization`, if it has one.
fn with_credential(headers: &Headers, credential: &Credential) -> Headers {
    let mut out = headers.clone();
    if let Some(value) = credential.header() {
        out.push("authorization", value);
    }
    out
}

fn cause(e: &hyper::Error) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

fn build_request(
    method: &str,
    path_and_query: &str,
    authority: &str,
    headers: &Headers,
    body: &Bytes,
) -> Result<Request<Full<Bytes>>, String> {
    let mut builder = Request::builder().method(method).uri(path_and_query).header(HOST, authority);
    for (name, value) in headers.iter() {
        builder = builder.header(name, value);
    }
    if !body.is_empty() {
        builder = builder.header(http::header::CONTENT_LENGTH, body.len());
    }
    builder.body(Full::new(body.clone())).map_err(|e| e.to_string())
}

/// Reads an inbound request body: at most `max + 1` bytes (the node refuses a body past `max`;
/// the rest is never buffered), within `bound`. A body that breaks or does not arrive in time
/// is `None`.
async fn read_body(
    mut incoming: Incoming,
    max: usize,
    bound: std::time::Duration,
) -> Option<Bytes> {
    let read = async {
        let mut body = bytes::BytesMut::new();
        while body.len() <= max {
            match incoming.frame().await {
                None => break,
                Some(Err(_)) => return None,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        let room = max + 1 - body.len();
                        body.extend_from_slice(&data[..data.len().min(room)]);
                    }
                }
            }
        }
        Some(body.freeze())
    };
    tokio::time::timeout(bound, read).await.ok().flatten()
}

/// Tells the node a request went away if its handler is dropped before the head.
struct CancelGuard<D: Dialer> {
    driver: Option<Arc<NodeDriver<D>>>,
    id: RequestId,
}

impl<D: Dialer> CancelGuard<D> {
    fn disarm(&mut self) -> Arc<NodeDriver<D>> {
        self.driver.take().expect("disarmed once")
    }
}

impl<D: Dialer> Drop for CancelGuard<D> {
    fn drop(&mut self) {
        if let Some(driver) = self.driver.take() {
            driver.lock().mailboxes.remove(&self.id);
            driver.feed(Input::Cancel { id: self.id });
        }
    }
}

/// A response body fed by the node's mailbox (or, for a passthrough, by the origin body itself).
/// Every part taken is acknowledged to the node; a body dropped before its end cancels the
/// request.
struct NodeBody<D: Dialer> {
    rx: mpsc::UnboundedReceiver<Part>,
    driver: Arc<NodeDriver<D>>,
    id: RequestId,
    remaining: Option<u64>,
    piped: Option<(OriginBody, IoId)>,
    done: bool,
    /// A checked response's running digest ([`Part::Hash`]), computed here, on the
    /// connection's task, not under the node's lock.
    hashing: Option<dart_core::registry::Hasher>,
    /// The latest part of a checked response, written only once the next arrives or the node
    /// ends the response after its verdict.
    held: Option<Bytes>,
    /// The node ended the response (a checked one after its verdict): the part going out is the
    /// last, then the end.
    ending: bool,
    /// A part taken from the mailbox ahead of its turn ([`NodeBody::release`]).
    peeked: Option<Part>,
}

impl<D: Dialer> NodeBody<D> {
    /// Hands `data` to the connection: counted against the length, acknowledged to the node
    /// unless the node has ended the response already (its end waits in the mailbox: the node
    /// took the request out of its table when it ended it, so the acknowledgement would find
    /// nothing, and it costs a hold of the node's lock; a small response's one part and its end
    /// come together).
    fn release(&mut self, data: Bytes) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        if let Some(r) = &mut self.remaining {
            *r = r.saturating_sub(data.len() as u64);
        }
        if !self.ending && self.peeked.is_none() {
            match self.rx.try_recv() {
                Ok(Part::End) if self.held.is_none() => self.ending = true,
                Ok(part) => self.peeked = Some(part),
                Err(_) => {}
            }
        }
        if !self.ending {
            self.driver.feed(Input::Drained { id: self.id });
        }
        Poll::Ready(Some(Ok(Frame::data(data))))
    }
}

impl<D: Dialer> Body for NodeBody<D> {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if let Some((incoming, io)) = &mut this.piped {
                let io = *io;
                return match Pin::new(incoming).poll_frame(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(None) => {
                        this.done = true;
                        this.driver.feed(Input::Io { id: io, event: IoEvent::End });
                        Poll::Ready(None)
                    }
                    Poll::Ready(Some(Err(e))) => {
                        this.done = true;
                        let event = IoEvent::Failed(IoError::Broken(cause(&e)));
                        this.driver.feed(Input::Io { id: io, event });
                        Poll::Ready(Some(Err(Box::new(e))))
                    }
                    Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                        Ok(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                        Err(_) => continue,
                    },
                };
            }
            if this.ending {
                this.done = true;
                return Poll::Ready(None);
            }
            let next = match this.peeked.take() {
                Some(part) => Poll::Ready(Some(part)),
                None => this.rx.poll_recv(cx),
            };
            return match next {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Part::Data(data))) => match &mut this.hashing {
                    Some(hasher) => {
                        hasher.update(&data);
                        match this.held.replace(data) {
                            Some(previous) => this.release(previous),
                            None => continue,
                        }
                    }
                    None => this.release(data),
                },
                Poll::Ready(Some(Part::Hash(algorithm))) => {
                    this.hashing = Some(dart_core::registry::Hasher::new(algorithm));
                    continue;
                }
                Poll::Ready(Some(Part::Seal)) => {
                    let digest = this.hashing.take().map(|h| h.finish()).unwrap_or_default();
                    this.driver.feed(Input::Sealed { id: this.id, digest });
                    continue;
                }
                Poll::Ready(Some(Part::Pipe(incoming, io))) => {
                    this.piped = Some((incoming, io));
                    continue;
                }
                Poll::Ready(Some(Part::End)) => match this.held.take() {
                    Some(last) => {
                        this.ending = true;
                        this.release(last)
                    }
                    None => {
                        this.done = true;
                        Poll::Ready(None)
                    }
                },
                Poll::Ready(Some(Part::Abort)) => {
                    // A held part (a checked response's last) never goes out.
                    this.held = None;
                    this.done = true;
                    Poll::Ready(Some(Err("the response was cut short".into())))
                }
                Poll::Ready(Some(Part::Head(_))) => {
                    this.done = true;
                    Poll::Ready(Some(Err("a second response head".into())))
                }
                Poll::Ready(None) => {
                    this.done = true;
                    Poll::Ready(Some(Err("response body ended early".into())))
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

impl<D: Dialer> Drop for NodeBody<D> {
    fn drop(&mut self) {
        if self.done || self.remaining == Some(0) {
            return;
        }
        // The node cancels a piped origin exchange with the request.
        self.driver.lock().mailboxes.remove(&self.id);
        self.driver.feed(Input::Cancel { id: self.id });
    }
}

#[cfg(test)]
mod put_ledger_tests {
    use super::PutLedger;
    use dart_core::hash::{BlockKey, ChunkKey};

    fn key(block: u64) -> BlockKey {
        BlockKey { chunk: ChunkKey(7), block }
    }

    #[test]
    fn a_key_dropped_while_its_put_runs_is_hidden_then_deleted_when_the_put_ends() {
        let mut l = PutLedger::default();
        l.started(key(0));
        assert!(!l.hides(&key(0)), "a put alone hides nothing");
        l.dropped(key(0));
        assert!(l.hides(&key(0)), "the put may still write the dropped bytes");
        assert!(!l.hides(&key(1)));
        assert!(l.finished(key(0)), "so it is deleted again once the put ends");
        assert!(!l.hides(&key(0)));
        assert!(!l.finished(key(0)), "nothing left to finish");
    }

    #[test]
    fn with_several_puts_in_flight_the_key_stays_hidden_until_the_last_ends() {
        let mut l = PutLedger::default();
        l.started(key(0));
        l.dropped(key(0));
        l.started(key(0)); // a put of the new version, after the drop
        assert!(!l.finished(key(0)));
        assert!(l.hides(&key(0)), "the old put may have finished after the new one wrote");
        assert!(l.finished(key(0)));
        assert!(!l.hides(&key(0)));
    }

    #[test]
    fn a_drop_with_no_put_in_flight_needs_nothing_more() {
        let mut l = PutLedger::default();
        l.dropped(key(0));
        assert!(!l.hides(&key(0)));
        l.started(key(0));
        assert!(!l.finished(key(0)), "a put after the drop is of the new version");
    }
}
