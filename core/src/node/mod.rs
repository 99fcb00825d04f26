//! One node as one sans-IO state machine: the engine and its reads, origin flight coalescing,
//! breaker permits, relay serving with cut-through, the roster exchange, and every exchange bound
//! as a timer. The tokio shell and the simulator both drive exactly this machine; neither holds a
//! decision of its own.
//!
//! See [`Node`] for the driving contract.

mod access;
mod body;
mod bounds;
mod broadcast;
mod discover;
mod exchange;
mod flights;
mod io;
mod lead_in;
mod peer;
mod requests;
mod track;

#[cfg(test)]
mod tests;

pub use access::{
    Access, AccessCounters, Credential, DEFAULT_CHECK_TTL, DEFAULT_STALE_GRACE, VERIFIED_MAX,
};
pub use bounds::{Bounds, BoundsError, BOUND_MAX};
pub use broadcast::{BROADCAST_KEY, DESIGNATED_PER_TARGET, LEAVE_BOUND};
pub use discover::DiscoveryError;
pub use io::{
    BlockSource, Endpoint, Event, FetchKind, Head, Headers, Inbound, Input, IoError, IoEvent, IoId,
    IoRequest, Output, Plane, Purpose, RequestId, StoreOp, HEADERS_MAX,
};
pub use track::TrackerHost;

use crate::engine::flight::{FlightId, FlightKey, FlightTable};
use crate::engine::resolve::UpstreamMode;
use crate::engine::{Engine, EngineStats};
use crate::time::Instant;
use exchange::Exchange;
use flights::Flight;
use requests::{Request, Wait};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Most requests a node serves at once; past it a new request is answered 503 at once.
pub const REQUESTS_MAX: usize = 65_536;
/// Request ids at and above this are the node's own (read-ahead reads, which answer nobody); a
/// driver never chooses one.
pub const NODE_REQUEST_IDS: u64 = 1 << 63;
/// Read-ahead starts only while fewer requests than this are live.
const READ_AHEAD_LIVE_MAX: usize = REQUESTS_MAX / 2;
/// Most roster fetches in flight at once; past it a fetch fails at once.
pub const ROSTER_FETCHES_MAX: usize = 1024;
/// Body parts of one response the transport may hold before the node waits for
/// [`Input::Drained`] (the backpressure window of block reads).
pub const BODY_WINDOW: u32 = 4;
/// Callers remembered from inbound roster requests.
pub const LEARNED_MAX: usize = 4096;
/// Most outputs one input may queue (a runaway guard; the driver drains after every input).
pub const OUTPUTS_MAX: usize = 1 << 20;
/// How long a node that worked has no live request before it releases memory kept for reuse
/// ([`Output::ReleaseMemory`]). A burst's buffers are worth keeping while reads come and go; ten
/// seconds without any read is the end of the burst, not a pause inside it.
pub const IDLE_RELEASE_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// What a node is: how client targets name upstream URLs, its bounds, and its peer identity.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// How client request-targets name upstream URLs.
    pub mode: UpstreamMode,
    /// Every exchange bound (and the shell's transport limits).
    pub bounds: Bounds,
    /// This node's member id (`X-DART-Node`); empty for a single node.
    pub self_id: String,
    /// The address peers reach this node at (sent in rosters and roster requests).
    pub advertise: String,
    /// Who may make this node fetch what, and read what it holds: the upstream policy, the
    /// credential check of private objects, the peer-plane MAC.
    pub access: Access,
}

impl NodeConfig {
    /// A single node in prefix mode with default bounds.
    pub fn single(mode: UpstreamMode) -> Self {
        NodeConfig {
            mode,
            bounds: Bounds::default(),
            self_id: String::new(),
            advertise: String::new(),
            access: Access::default(),
        }
    }
}

/// Counters of the node machine itself (the engine keeps the read counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounters {
    /// Requests accepted.
    pub requests: u64,
    /// Requests whose requester went away before the end.
    pub cancelled: u64,
    /// Requests refused because [`REQUESTS_MAX`] were live.
    pub overloaded: u64,
    /// Exchanges started.
    pub exchanges: u64,
    /// Exchanges that hit a bound.
    pub timeouts: u64,
    /// Inputs whose handling panicked (their requests were failed and forgotten).
    pub panics: u64,
    /// Requests given up because their requester stopped reading ([`Bounds::write_stall`]).
    pub write_stalls: u64,
    /// Relays that answered `504` + upstream `504` because their requester's budget ran out
    /// while their own upstream had not answered.
    pub relay_early_answers: u64,
    /// Blocks a client read asked for ahead of the one it served ([`crate::engine::EngineConfig::read_ahead`]).
    pub read_ahead: u64,
    /// Peer block fetches a read joined instead of asking the peer again (another read of this
    /// node was fetching the same block from the same peer).
    pub peer_fetches_joined: u64,
    /// Origin fills started as a hedge's backup ([`crate::engine::Action::FillFromOrigin`]).
    pub origin_fills: u64,
    /// Requests that joined an origin flight in its second half and asked the origin again when
    /// the flight found it unavailable, instead of taking that verdict.
    pub origin_asked_again: u64,
    /// Origin requests for a client read's own span deep in a block window the node fetched
    /// beside it, so that its first byte did not wait for the bytes before it (`lead_in`).
    pub origin_lead_ins: u64,
    /// Peer fetches left to run on unanswered, to record how a silent peer answers
    /// ([`crate::engine::Action::CancelPeer`]`::run_on`).
    pub peer_fetches_run_on: u64,
    /// Blocks kept from an earlier process that a look-up found for an object that may change:
    /// dropped unserved ([`Node::recovered_blocks`]).
    pub unversioned_dropped: u64,
    /// JOINs to objects' trackers (local ones included).
    pub tracker_joins: u64,
    /// JOINs that granted nothing (the reads routed over every Ready member).
    pub tracker_join_failed: u64,
    /// JOINs whose tracker granted a lease (`tracker_joins` less these and the failed ones are
    /// in flight).
    pub tracker_join_ok: u64,
    /// JOINs this node granted as the tracker of an object (its own included).
    pub tracker_joins_granted: u64,
    /// Whole registry blobs whose bytes did not match their digest: the response failed before
    /// its last byte and the object's cached blocks were dropped ([`crate::registry`]).
    pub blob_digest_mismatches: u64,
    /// Whole registry blobs served whose bytes matched their digest.
    pub blob_digests_verified: u64,
    /// Whole blocks a read found in its store that no longer hashed to the digest they were
    /// stored with: dropped and read afresh ([`crate::integrity`]).
    pub rotten_blocks_dropped: u64,
    /// Look-ups answered from the blocks the node stored last ([`Node::held`]), before the
    /// store was asked.
    pub held_hits: u64,
    /// Times the node, idle for [`IDLE_RELEASE_AFTER`] after work, asked the shell to give
    /// memory kept for reuse back ([`Output::ReleaseMemory`]).
    pub memory_releases: u64,
}

/// One dart node as a sans-IO state machine.
///
/// # Driving contract
///
/// The driver (the tokio shell, a turmoil host, the simulator) owns one `Node` and runs this loop,
/// passing its clock's `now` with every call:
///
/// 1. Feed what happened with [`handle_input`](Self::handle_input): a request on a listener
///    ([`Input::Request`], with an id the driver chose below [`NODE_REQUEST_IDS`] and registered
///    to receive the response parts), the requester going away ([`Input::Cancel`]), a body part taken by the transport
///    ([`Input::Drained`]), progress of an exchange ([`Input::Io`]), a store answer
///    ([`Input::Store`]), the digest of a checked response ([`Input::Sealed`]), or a discovery
///    request ([`Input::FetchRoster`]).
/// 2. Drain [`poll_output`](Self::poll_output) until `None` and carry every [`Output`] out: send or
///    cancel an exchange, pipe a passthrough body, get or put a block, write a response head,
///    body part, end or abort, hash a checked response's parts holding the last one back and
///    report their digest when sealed ([`Output::Hash`], [`Output::Seal`]), give memory kept
///    for reuse back when the node went idle ([`Output::ReleaseMemory`]), record an event.
///    Outputs for one request come in wire order.
/// 3. Sleep until [`poll_timeout`](Self::poll_timeout), then call
///    [`handle_timeout`](Self::handle_timeout) and drain again. After `handle_timeout(now)` and a
///    drain, `poll_timeout()` is `None` or later than `now` (no busy loop).
///
/// The node decides everything else: which upstream a block comes from, what is coalesced, what
/// may be cached, whom the breaker blames, when an exchange is given up (dial, response head,
/// request and flight bounds are timers here), what a relay forwards before it has the whole
/// block (cut-through holds back the last byte until the length is proven), and every response
/// status. The driver only moves bytes and reports what happened, in the order
/// [`IoEvent`] documents; an input out of that order is a driver bug and panics.
///
/// A panic while handling one input never escapes: the requests and the exchange that input
/// touched are failed (500 before the head, an abort after) and forgotten, their permits are
/// abandoned, and every other request goes on. [`NodeCounters::panics`] counts them.
///
/// # Invariants ([`check_invariants`](Self::check_invariants))
///
/// - Every request waits on exactly one thing that exists (a store operation, a flight, an
///   exchange) or is ready; every exchange belongs to a live request, a flight or a roster fetch.
/// - Every flight in the table has one exchange and its waiters; at most [`REQUESTS_MAX`]
///   requests and one timer per exchange.
/// - A peer block fetch that answers reads answers each at most once, every one of them waits
///   on it, and the shared-fetch index names only live fetches of its block and peer.
/// - The idle release is armed only while no request is live, after work since the last one.
/// - The engine's and the breaker's own invariants.
pub struct Node {
    /// When a failed JOIN was last reported ([`Event::TrackerJoinFailed`]) and how many were
    /// held back since.
    join_warnings: (Option<Instant>, u64),
    engine: Engine,
    config: NodeConfig,
    requests: BTreeMap<RequestId, Box<Request>>,
    exchanges: BTreeMap<IoId, Box<Exchange>>,
    timers: BTreeSet<(Instant, IoId)>,
    /// Write-stall deadlines of requests whose body window is full (an entry whose request
    /// moved on is dropped when it comes due).
    stall_timers: BTreeSet<(Instant, RequestId)>,
    /// Hedge deadlines of requests racing a primary peer fetch (stale entries are dropped when
    /// they come due).
    hedge_timers: BTreeSet<(Instant, RequestId)>,
    /// Relays' answer-by deadlines (stale entries are dropped when they come due).
    answer_timers: BTreeSet<(Instant, RequestId)>,
    flights: FlightTable<FlightKey>,
    flight_state: BTreeMap<FlightId, Flight>,
    /// Lead-in exchanges by the read they serve ([`lead_in`]).
    lead_ins: BTreeMap<RequestId, IoId>,
    /// The peer block fetch other reads may join, by block and peer address.
    shared_fetches: BTreeMap<(crate::hash::BlockKey, String), IoId>,
    /// Read-ahead reads by the block they acquire (entries whose read ended are pruned when
    /// the next read-ahead starts).
    ahead: BTreeMap<crate::hash::BlockKey, RequestId>,
    next_ahead: u64,
    /// Blocks a read-ahead read brought in, with where from, until a client read finds them in
    /// the store: that hit counts as the block's source, not as a cache hit. At most
    /// [`READ_AHEAD_LIVE_MAX`], the oldest forgotten first (`ahead_order`).
    ahead_landed: BTreeMap<crate::hash::BlockKey, io::BlockSource>,
    ahead_order: VecDeque<crate::hash::BlockKey>,
    /// The last [`RELAYED_MEMO`] distinct blocks peers asked this node to fetch on their behalf
    /// (held-only asks aside), newest last: a relay that continues one of them is part of a
    /// sequential stream ([`Node::relay_ahead`]).
    relayed: VecDeque<crate::hash::BlockKey>,
    /// Look-ups in flight: the request, the key, whether the key was a kept block of an
    /// earlier process when asked ([`Node::recovered_blocks`]), and whether the whole block was
    /// asked for (no window).
    store_ops: BTreeMap<StoreOp, (RequestId, crate::hash::BlockKey, bool, bool)>,
    /// Blocks kept from an earlier process whose version nobody knows (a warm start); a block
    /// leaves the set when this process drops or writes it.
    recovered: std::collections::BTreeSet<crate::hash::BlockKey>,
    learned: BTreeMap<String, String>,
    /// Live membership, when discovery is on.
    directory: Option<crate::discovery::Directory>,
    /// The broadcast targets and a drain's announcements, when on.
    broadcast: Option<broadcast::Broadcast>,
    /// [`Input::Drain`] arrived: the node is leaving and no longer presents itself as a member.
    draining: bool,
    /// The reader sets of the objects this node is the tracker of, when the reader tree is on.
    registry: Option<crate::tracker::Registry>,
    /// The seed resolution in flight.
    resolve_ticket: u64,
    out: VecDeque<Output>,
    next_io: u64,
    next_op: u64,
    /// Roster fetches in flight.
    roster_fetches: usize,
    /// Blocks stored during the current input, handed to other reads waiting on peers for them
    /// once its handling is over ([`Node::hand_landed`]).
    landed: Vec<(crate::hash::BlockKey, bytes::Bytes)>,
    /// Requests whose handling is on the stack (the culprits if it panics).
    working: Vec<RequestId>,
    /// The exchange whose event is being handled.
    working_io: Option<IoId>,
    counters: NodeCounters,
    /// Gated requests, credential checks, admitted credentials, the wall clock.
    access: access::State,
    /// Computes the digests of peer-plane blocks ([`crate::integrity`]).
    hasher: std::sync::Arc<dyn crate::integrity::BlockHasher>,
    /// The digest of each block this process stored, of the bytes it stored
    /// ([`Node::kept_digest`]), at most [`KEPT_DIGESTS_MAX`]; a dropped block's goes with it.
    /// `kept_order` is the order they were kept in: it may still name keys dropped since, so a
    /// key dropped and stored again may lose its digest early (it is then served unchecked).
    kept_digests: BTreeMap<crate::hash::BlockKey, crate::integrity::BlockDigest>,
    kept_order: VecDeque<crate::hash::BlockKey>,
    /// The last blocks hashed, by handle ([`Node::digest_of`]): a block a relay receives is
    /// checked, kept and sent on as one handle, and hashed once. A handle held here keeps its
    /// bytes alive, so an equal pointer and length are the same bytes.
    recent_digests: VecDeque<(bytes::Bytes, crate::integrity::BlockDigest)>,
    /// How the last block window from each origin (by scheme, host and port) took its time
    /// ([`Node::origin_ahead`], [`Node::relay_ahead`]); at most [`ORIGIN_PACES_MAX`] origins.
    origin_pace: BTreeMap<flights::PaceKey, flights::OriginPace>,
    /// How the last peer block fetch that held its block took its time ([`Node::peer_ahead`]).
    peer_pace: Option<flights::OriginPace>,
    /// The last [`HELD_BLOCKS`] borrowed blocks this node stored, newest last: a look-up finds
    /// them here before it asks the store ([`Node::held_block`]). Once the borrowed budget is
    /// full, its admission refuses a block less popular than its victim, as every new block is;
    /// yet a borrowed block this node fetched as a tree's root (a reader tree's, or in a dead
    /// owner's place) is the one its own read ahead, or a peer behind it, asks for next: without
    /// this each such follower fetched it again. Owned blocks are always admitted (a degraded
    /// disk skips every write: the node then reads the origin, as documented).
    held: VecDeque<(crate::hash::BlockKey, bytes::Bytes)>,
    /// Blocks relays fetched under a size their requester told, waiting for this node's own
    /// probe of the object to confirm it ([`crate::engine::Action::StoreWhenConfirmed`]),
    /// oldest first; at most [`PARKED_BLOCKS`].
    parked: VecDeque<Parked>,
    /// When the node releases memory kept for reuse ([`Output::ReleaseMemory`]): set when the
    /// last live request ends after work, cleared when a request is live again or once released.
    idle_release_at: Option<Instant>,
    /// A request was live since the last release: an idle node releases once, not every
    /// [`IDLE_RELEASE_AFTER`].
    busy_since_release: bool,
}

/// A block waiting in [`Node::parked`].
struct Parked {
    object: crate::identity::ObjectId,
    key: crate::hash::BlockKey,
    data: bytes::Bytes,
    class: crate::engine::BlockClass,
    told: crate::engine::Told,
}

/// Blocks kept in [`Node::parked`]: a probe answers within an origin round trip, and a relay
/// from a warm parent is whole sooner only for a few blocks at a time. The oldest goes first,
/// unstored.
const PARKED_BLOCKS: usize = 8;

/// Blocks kept in [`Node::held`]: at 4 MiB blocks, 32 MiB pinned at most (the store's RAM tier,
/// when on, keeps a handle on the same buffers).
const HELD_BLOCKS: usize = 8;

/// Origins whose pace [`Node::origin_pace`] keeps.
const ORIGIN_PACES_MAX: usize = 64;

/// Blocks remembered in [`Node::relayed`]: enough for a tree root's children to be a few blocks
/// apart in one stream, or for a few streams at once.
const RELAYED_MEMO: usize = 16;

/// Blocks remembered in [`Node::recent_digests`] (each pins its buffer).
const RECENT_DIGESTS: usize = 4;

/// Most block digests kept (the oldest go first): 256 GiB of 4 MiB blocks. A block whose
/// digest went is served as it is.
const KEPT_DIGESTS_MAX: usize = 1 << 16;

impl Node {
    /// A node running `engine` (with its peer half enabled or not) under `config`.
    pub fn new(engine: Engine, config: NodeConfig) -> Result<Self, BoundsError> {
        config.bounds.validate()?;
        let flights = FlightTable::new(config.bounds.max_flight);
        Ok(Node {
            engine,
            config,
            requests: BTreeMap::new(),
            exchanges: BTreeMap::new(),
            timers: BTreeSet::new(),
            stall_timers: BTreeSet::new(),
            hedge_timers: BTreeSet::new(),
            answer_timers: BTreeSet::new(),
            flights,
            flight_state: BTreeMap::new(),
            lead_ins: BTreeMap::new(),
            shared_fetches: BTreeMap::new(),
            ahead: BTreeMap::new(),
            next_ahead: NODE_REQUEST_IDS,
            ahead_landed: BTreeMap::new(),
            ahead_order: VecDeque::new(),
            store_ops: BTreeMap::new(),
            recovered: std::collections::BTreeSet::new(),
            learned: BTreeMap::new(),
            directory: None,
            broadcast: None,
            draining: false,
            registry: None,
            resolve_ticket: 0,
            out: VecDeque::new(),
            next_io: 0,
            next_op: 0,
            roster_fetches: 0,
            landed: Vec::new(),
            working: Vec::new(),
            working_io: None,
            counters: NodeCounters::default(),
            access: access::State::default(),
            join_warnings: (None, 0),
            hasher: std::sync::Arc::new(crate::integrity::Xxh3),
            kept_digests: BTreeMap::new(),
            kept_order: VecDeque::new(),
            recent_digests: VecDeque::new(),
            origin_pace: BTreeMap::new(),
            peer_pace: None,
            held: VecDeque::new(),
            parked: VecDeque::new(),
            idle_release_at: None,
            busy_since_release: false,
            relayed: VecDeque::new(),
        })
    }

    /// The digest of `block` ([`crate::integrity`]), hashed at most once per handle among the
    /// last few.
    pub(super) fn digest_of(&mut self, block: &bytes::Bytes) -> crate::integrity::BlockDigest {
        let same = |b: &bytes::Bytes| b.as_ptr() == block.as_ptr() && b.len() == block.len();
        if let Some((_, digest)) = self.recent_digests.iter().find(|(b, _)| same(b)) {
            return *digest;
        }
        let digest = self.hasher.digest(block);
        self.remember_digest(block, digest);
        digest
    }

    /// Remembers that `block` (this handle) has `digest`, which [`Node::digest_of`] then answers
    /// without hashing: for a block whose digest was computed as it was gathered.
    pub(super) fn remember_digest(
        &mut self,
        block: &bytes::Bytes,
        digest: crate::integrity::BlockDigest,
    ) {
        if self.recent_digests.len() == RECENT_DIGESTS {
            self.recent_digests.pop_front();
        }
        self.recent_digests.push_back((block.clone(), digest));
    }

    /// The digest block `key` had when this process stored it, while kept.
    fn kept_digest(&self, key: &crate::hash::BlockKey) -> Option<crate::integrity::BlockDigest> {
        self.kept_digests.get(key).copied()
    }

    /// Keeps the digest of `data`, stored as `key` (a store keeps the first bytes put under a
    /// key, so the first digest stays); returns it when it was hashed for this put, `None` when
    /// the key's digest was kept already (then these bytes are not hashed at all).
    fn keep_digest(
        &mut self,
        key: crate::hash::BlockKey,
        data: &bytes::Bytes,
    ) -> Option<crate::integrity::BlockDigest> {
        if self.kept_digests.contains_key(&key) {
            return None;
        }
        let digest = self.digest_of(data);
        self.kept_digests.insert(key, digest);
        self.kept_order.push_back(key);
        self.bound_kept_digests();
        Some(digest)
    }

    /// Offers block `key` to the store ([`Output::StorePut`]), with the digest of its bytes
    /// when this put hashed them ([`Node::keep_digest`]).
    fn store_put(
        &mut self,
        key: crate::hash::BlockKey,
        data: bytes::Bytes,
        class: crate::engine::BlockClass,
    ) {
        let digest = self.keep_digest(key, &data);
        self.emit(Output::StorePut { key, data, class, digest });
    }

    /// Drops the oldest kept digests past [`KEPT_DIGESTS_MAX`].
    fn bound_kept_digests(&mut self) {
        while self.kept_order.len() > KEPT_DIGESTS_MAX {
            if let Some(old) = self.kept_order.pop_front() {
                self.kept_digests.remove(&old);
            }
        }
    }

    /// Replaces the block hasher (the default hashes every block, [`crate::integrity::Xxh3`]).
    /// A driver may pass a cheaper one that returns the same digests.
    pub fn set_block_hasher(&mut self, hasher: std::sync::Arc<dyn crate::integrity::BlockHasher>) {
        self.hasher = hasher;
    }

    /// The engine (read counters, object table, peer half).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The engine, mutably (e.g. to feed the placement a new view).
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// The engine's counters.
    pub fn stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// The node's own counters.
    pub fn counters(&self) -> NodeCounters {
        self.counters
    }

    /// The configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// Callers that named themselves on an inbound roster request: id → advertised address.
    pub fn learned(&self) -> &BTreeMap<String, String> {
        &self.learned
    }

    /// Live requests (those waiting for a credential check included).
    pub fn live_requests(&self) -> usize {
        self.requests.len() + self.access.gated.len()
    }

    /// Live requests that answer a requester: [`Node::live_requests`] without the node's own
    /// background reads (read-ahead, origin fills, background probes), which run to their end or
    /// their bounds whoever went away.
    pub fn answering_requests(&self) -> usize {
        self.requests.values().filter(|r| !r.background).count() + self.access.gated.len()
    }

    /// Exchanges in flight: whom each talks to and the request it serves (none for a flight,
    /// a roster fetch or a direct block fetch).
    pub fn exchanges(&self) -> Vec<(IoId, Endpoint, Option<RequestId>)> {
        self.exchanges.iter().map(|(id, x)| (*id, x.endpoint, x.request())).collect()
    }

    /// Handles one input at `now`; see the type's driving contract.
    pub fn handle_input(&mut self, input: Input, now: Instant) {
        self.guarded(now, |node| {
            node.dispatch(input, now);
            node.hand_landed(now);
            node.send_joins(now);
        });
        debug_assert!(self.out.len() <= OUTPUTS_MAX, "outputs piling up: the driver must drain");
    }

    /// Runs one input's handling; a panic inside fails what it touched (see [`Node::recover`]).
    fn guarded(&mut self, now: Instant, f: impl FnOnce(&mut Node)) {
        self.working.clear();
        self.working_io = None;
        let result = catch_unwind(AssertUnwindSafe(|| f(self)));
        if let Err(panic) = result {
            let message = panic_message(panic.as_ref());
            self.recover(message, now);
        }
        self.working.clear();
        self.working_io = None;
        self.drain_circuit_events();
        self.note_idle(now);
    }

    /// Arms the idle release when the last live request ended after work, disarms it while one
    /// is live ([`IDLE_RELEASE_AFTER`]).
    fn note_idle(&mut self, now: Instant) {
        if !self.requests.is_empty() {
            self.busy_since_release = true;
            self.idle_release_at = None;
        } else if self.busy_since_release && self.idle_release_at.is_none() {
            self.idle_release_at = Some(now.saturating_add(IDLE_RELEASE_AFTER));
        }
    }

    /// The idle release is due: hands the shell [`Output::ReleaseMemory`] and drops the
    /// handles the node keeps only to save a hash ([`Node::recent_digests`]). The blocks it keeps
    /// to serve ([`Node::held`], [`Node::parked`]) stay.
    fn release_idle(&mut self, now: Instant) {
        if self.idle_release_at.is_none_or(|at| at > now) {
            return;
        }
        self.idle_release_at = None;
        self.busy_since_release = false;
        self.recent_digests.clear();
        self.counters.memory_releases += 1;
        self.emit(Output::ReleaseMemory);
    }

    fn dispatch(&mut self, input: Input, now: Instant) {
        match input {
            Input::Request { id, plane, request } => self.on_request(id, plane, request, now),
            Input::Cancel { id } => self.on_cancel(id, now),
            Input::Drained { id } => self.on_drained(id, now),
            Input::Sealed { id, digest } => self.on_sealed(id, digest, now),
            Input::Io { id, event } => {
                self.working_io = Some(id);
                self.on_io(id, event, now);
            }
            Input::Store { op, block } => self.on_store(op, block, now),
            Input::FetchRoster { ticket, addr } => self.fetch_roster(Some(ticket), addr, now),
            Input::Drain => self.drain(now),
            Input::Resolved { ticket, result } => self.seeds_resolved(ticket, result, now),
            Input::WallClock { unix_ms } => self.access.set_wall(now, unix_ms),
            Input::FetchBlock { ticket, addr, key, url, hop, expected } => {
                let fetch =
                    peer::PeerFetch { key, url, hop, expected, held_only: false, told: None };
                self.fetch_block(ticket, addr, fetch, now);
            }
        }
    }

    /// The next output, oldest first.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// The earliest deadline: an exchange, write-stall, hedge or answer-by bound, a breaker probe,
    /// a discovery round, the neighbour set's or the broadcast targets' refresh, or the idle
    /// release.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let exchange = self.timers.first().map(|&(t, _)| t);
        let stall = self.stall_timers.first().map(|&(t, _)| t);
        let hedge = self.hedge_timers.first().map(|&(t, _)| t);
        let answer = self.answer_timers.first().map(|&(t, _)| t);
        let breaker = self.engine.p2p().and_then(|p| p.breaker.poll_timeout());
        let discovery = self.directory.as_ref().and_then(|d| d.poll_timeout());
        let neighbours = self.engine.neighbours().map(|n| n.poll_timeout());
        let broadcast = self.broadcast_timeout();
        let idle = self.idle_release_at;
        [exchange, stall, hedge, answer, breaker, discovery, neighbours, broadcast, idle]
            .into_iter()
            .flatten()
            .min()
    }

    /// Fires every bound due at `now`. Afterwards `poll_timeout()` is `None` or later than `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.guarded(now, |node| {
            node.fire_timers(now);
            node.hand_landed(now);
            node.send_joins(now);
        });
        assert!(self.poll_timeout().is_none_or(|t| t > now), "handle_timeout must move the timer");
    }

    fn fire_timers(&mut self, now: Instant) {
        self.release_idle(now);
        self.discovery_due(now);
        self.neighbours_due(now);
        self.broadcast_due(now);
        // Each due exchange is removed or re-armed later than now, so this loop ends.
        while let Some(&(at, io)) = self.timers.first() {
            if at > now {
                break;
            }
            self.working_io = Some(io);
            self.on_deadline(io, now);
            self.working.clear();
        }
        self.working_io = None;
        while let Some(&(at, rid)) = self.stall_timers.first() {
            if at > now {
                break;
            }
            self.stall_timers.remove(&(at, rid));
            self.on_write_stall(rid, at, now);
            self.working.clear();
        }
        while let Some(&(at, rid)) = self.hedge_timers.first() {
            if at > now {
                break;
            }
            self.hedge_timers.remove(&(at, rid));
            self.on_hedge_due(rid, at, now);
            self.working.clear();
        }
        while let Some(&(at, rid)) = self.answer_timers.first() {
            if at > now {
                break;
            }
            self.answer_timers.remove(&(at, rid));
            self.on_answer_due(rid, at, now);
            self.working.clear();
        }
        if let Some(p2p) = self.engine.p2p_mut() {
            if p2p.breaker.poll_timeout().is_some_and(|t| t <= now) {
                p2p.breaker.handle_timeout(now);
            }
        }
        // A roster fetch that ended above at its bound may have ended a discovery round that
        // outlasted its interval, which makes the next round due now: it starts now.
        self.discovery_due(now);
    }

    fn drain_circuit_events(&mut self) {
        let Some(p2p) = self.engine.p2p_mut() else { return };
        while let Some(e) = p2p.breaker.poll_event() {
            self.out.push_back(Output::Event(Event::Circuit(e)));
        }
    }

    fn emit(&mut self, output: Output) {
        match &output {
            // Written by this process: of the version this process knows.
            // Its digest was kept by `store_put`, the only way a put leaves.
            Output::StorePut { key, data, class, .. } => {
                self.recovered.remove(key);
                self.landed.push((*key, data.clone()));
                if *class == crate::engine::BlockClass::Borrowed {
                    self.held.retain(|(k, _)| k != key);
                    if self.held.len() == HELD_BLOCKS {
                        self.held.pop_front();
                    }
                    self.held.push_back((*key, data.clone()));
                }
            }
            Output::StoreDrop { keys } => {
                for key in keys {
                    self.recovered.remove(key);
                    self.kept_digests.remove(key);
                }
                self.held.retain(|(k, _)| !keys.contains(k));
            }
            _ => {}
        }
        self.out.push_back(output);
    }

    /// The store kept `keys` from an earlier process (a warm start). Call before the first
    /// input. Those blocks carry no version, so the node serves them only for objects that
    /// never change (content-addressed, or under an immutable prefix); for any other object the
    /// first look-up that finds one drops it and reads the block afresh, since the object may
    /// have changed while the node was down.
    pub fn recovered_blocks(&mut self, keys: impl IntoIterator<Item = crate::hash::BlockKey>) {
        self.recovered.extend(keys);
    }

    /// The digests of recovered blocks ([`Node::recovered_blocks`], called first), as the store
    /// hashed them when it found their bytes intact at open: a whole-block read of one checks
    /// it against its digest, as for a block this process stored ([`crate::integrity`]).
    /// Digests of keys that were not recovered are ignored.
    pub fn recovered_digests(
        &mut self,
        digests: impl IntoIterator<Item = (crate::hash::BlockKey, crate::integrity::BlockDigest)>,
    ) {
        for (key, digest) in digests {
            if self.recovered.contains(&key) && !self.kept_digests.contains_key(&key) {
                self.kept_digests.insert(key, digest);
                self.kept_order.push_back(key);
            }
        }
        self.bound_kept_digests();
    }

    /// Whether `key` is a block kept from an earlier process that this one has neither written
    /// nor dropped (see [`Node::recovered_blocks`]).
    pub fn is_unversioned(&self, key: &crate::hash::BlockKey) -> bool {
        self.recovered.contains(key)
    }

    fn event(&mut self, event: Event) {
        self.out.push_back(Output::Event(event));
    }

    fn next_io_id(&mut self) -> IoId {
        let id = IoId(self.next_io);
        self.next_io += 1;
        id
    }

    fn next_store_op(&mut self) -> StoreOp {
        let op = StoreOp(self.next_op);
        self.next_op += 1;
        op
    }

    /// After a panic: fail and forget every request and exchange the input touched.
    fn recover(&mut self, message: String, now: Instant) {
        self.counters.panics += 1;
        let mut culprits: Vec<RequestId> = std::mem::take(&mut self.working);
        if let Some(io) = self.working_io.take() {
            culprits.extend(self.quarantine_exchange(io, now));
        }
        culprits.sort();
        culprits.dedup();
        for &rid in &culprits {
            self.quarantine_request(rid, now);
        }
        self.event(Event::Panicked { requests: culprits, message });
    }

    /// Removes exchange `io` after a panic; returns the requests it served.
    fn quarantine_exchange(&mut self, io: IoId, now: Instant) -> Vec<RequestId> {
        let Some(x) = self.remove_exchange(io) else { return Vec::new() };
        self.emit(Output::Cancel(io));
        if let exchange::Job::Roster { .. } = x.job {
            self.roster_fetches -= 1;
        }
        if let exchange::Job::Tracker { file, .. } = &x.job {
            self.tracker_quarantined(file, now);
        }
        if let exchange::Job::Leave = &x.job {
            self.leave_quarantined();
        }
        if let exchange::Job::LeadIn(lead) = &x.job {
            // Its read goes on with the window.
            self.lead_ins.remove(&lead.request);
            return Vec::new();
        }
        if let exchange::Job::Check { credential } = &x.job {
            if let Some(check) = self.access.checks.remove(credential) {
                let probes = check.probes.into_iter().map(|(rid, _)| rid);
                return check.waiters.into_iter().chain(probes).collect();
            }
        }
        let mut served: Vec<RequestId> = match &x.job {
            exchange::Job::Peer(p) => p.readers.iter().map(|r| r.rid).collect(),
            _ => x.request().into_iter().collect(),
        };
        if let Some(fid) = x.flight() {
            if let Some(flight) = self.flight_state.remove(&fid) {
                self.flights.finish(&flight.key, fid);
                served.extend(flight.waiters.iter().map(|w| w.request));
            }
        }
        if let Some(permit) = x.into_permit() {
            self.engine.abandon(permit, now);
        }
        served
    }

    /// Fails request `rid` after a panic and releases everything it holds.
    fn quarantine_request(&mut self, rid: RequestId, now: Instant) {
        if let Some(g) = self.access.gated.remove(&rid) {
            if let Some(check) = self.access.checks.get_mut(&g.credential) {
                check.waiters.retain(|w| *w != rid);
                self.drop_idle_check(g.credential);
            }
            return self.reply(rid, Plane::Client, 500, "dart: internal error", Headers::new());
        }
        let Some(req) = self.take_request(rid) else { return };
        match req.wait {
            Wait::Store(op) => {
                self.store_ops.remove(&op);
            }
            Wait::Flight(fid) => self.leave_flight(fid, rid),
            Wait::Check(credential) => self.leave_check(credential, rid),
            Wait::Alone(_) | Wait::Peers(_) | Wait::Pipe(_) => {
                let ios: Vec<IoId> = match req.wait {
                    Wait::Alone(io) | Wait::Pipe(io) => vec![io],
                    other => other.peers().collect(),
                };
                for io in ios {
                    self.leave_exchange(io, rid, now);
                }
            }
            Wait::Ready | Wait::Seal => {}
        }
        if req.cancelled {
            return;
        }
        if req.head_sent {
            self.emit(Output::Abort { id: rid });
        } else {
            self.reply(rid, req.plane, 500, "dart: internal error", Headers::new());
        }
    }

    /// Asserts every invariant listed on the type. The simulator calls it after every step.
    pub fn check_invariants(&self) {
        self.engine.check_invariants();
        self.broadcast_check();
        if let Some(registry) = &self.registry {
            registry.check_invariants();
        }
        if let Some(directory) = &self.directory {
            directory.check_invariants();
        }
        self.flights.check_invariants();
        assert!(self.live_requests() <= REQUESTS_MAX, "requests above their bound");
        assert!(
            self.idle_release_at.is_none() || self.requests.is_empty() && self.busy_since_release,
            "an idle release armed while a request is live, or without work since the last"
        );
        // Every record is in the order the bound forgets by (checked by count: a scan per
        // record would cost O(records²) per event).
        assert!(self.ahead_order.len() <= READ_AHEAD_LIVE_MAX, "read-ahead records above bound");
        assert!(self.relayed.len() <= RELAYED_MEMO, "relayed blocks above bound");
        assert!(self.origin_pace.len() <= ORIGIN_PACES_MAX, "origin paces above bound");
        assert!(self.held.len() <= HELD_BLOCKS, "held blocks above bound");
        assert!(self.ahead_landed.len() <= self.ahead_order.len(), "a read-ahead record unordered");
        self.access.check_invariants(&self.requests);
        for (c, check) in &self.access.checks {
            let x = self.exchanges.get(&check.io).expect("a check without its exchange");
            assert!(
                matches!(&x.job, exchange::Job::Check { credential } if credential == c),
                "check and exchange disagree"
            );
        }
        assert_eq!(self.flights.len(), self.flight_state.len(), "a flight without its state");
        for (rid, io) in &self.lead_ins {
            let x = self.exchanges.get(io).expect("a lead-in without its exchange");
            let exchange::Job::LeadIn(lead) = &x.job else { panic!("lead-in {io} of another job") };
            assert_eq!(lead.request, *rid, "lead-in {io} indexed under another read");
            let req = self.requests.get(rid).expect("a lead-in of no request");
            assert_eq!(req.wait, Wait::Flight(lead.flight), "{rid}: a lead-in off its flight");
        }
        for (fid, flight) in &self.flight_state {
            let x = self.exchanges.get(&flight.io).expect("a flight without its exchange");
            assert_eq!(x.flight(), Some(*fid), "flight and exchange disagree");
            for w in &flight.waiters {
                let req = self.requests.get(&w.request).expect("a waiter of no request");
                assert_eq!(req.wait, Wait::Flight(*fid), "waiter and flight disagree");
            }
        }
        assert!(self.kept_digests.len() <= KEPT_DIGESTS_MAX, "kept digests past their bound");
        assert!(self.recent_digests.len() <= RECENT_DIGESTS, "recent digests past their bound");
        for (&op, (rid, ..)) in &self.store_ops {
            let req = self.requests.get(rid).expect("a store op of no request");
            assert_eq!(req.wait, Wait::Store(op), "store op and request disagree");
        }
        // The timer index holds exactly each exchange's deadline: the two agree by size and by
        // an order-free digest, each walked once instead of a look-up per exchange (this runs
        // after every simulated event); on a disagreement the slow walk names the exchange.
        let mut deadlines = PairSet::default();
        for (&io, x) in &self.exchanges {
            if let Some(at) = x.deadline() {
                deadlines.add(at, io.0);
            }
            // Checked without allocating: this runs after every simulated event.
            let (peer_readers, other) = match &x.job {
                exchange::Job::Peer(p) => (p.readers.as_slice(), None),
                _ => (&[][..], x.request()),
            };
            for (i, r) in peer_readers.iter().enumerate() {
                let twice = peer_readers[..i].iter().any(|o| o.rid == r.rid);
                assert!(!twice, "exchange {io} answers a read twice");
            }
            if let exchange::Job::Peer(p) = &x.job {
                assert!(
                    p.ticket.is_some() as u8 + p.run_on as u8 + !p.readers.is_empty() as u8 == 1,
                    "peer exchange {io} answers no read, or a ticket and reads, or runs on"
                );
            }
            for rid in peer_readers.iter().map(|r| r.rid).chain(other) {
                let req = self.requests.get(&rid).expect("an exchange of no request");
                let holds = match req.wait {
                    Wait::Alone(i) | Wait::Pipe(i) => i == io,
                    other => other.peers().any(|i| i == io),
                };
                assert!(holds, "exchange {io} and request {rid} disagree");
            }
            if let Some(fid) = x.flight() {
                assert!(self.flight_state.contains_key(&fid), "an exchange of no flight");
            }
            if let exchange::Job::LeadIn(lead) = &x.job {
                assert_eq!(self.lead_ins.get(&lead.request), Some(&io), "lead-in {io} unindexed");
            }
        }
        if deadlines != PairSet::of(self.timers.iter().map(|&(at, io)| (at, io.0))) {
            for (&io, x) in &self.exchanges {
                if let Some(at) = x.deadline() {
                    assert!(self.timers.contains(&(at, io)), "timer index out of step for {io}");
                }
            }
            panic!("a timer of no exchange, or a stale one");
        }
        for ((key, addr), io) in &self.shared_fetches {
            let x = self.exchanges.get(io).expect("a shared fetch that ended");
            assert!(
                matches!(&x.job, exchange::Job::Peer(p) if p.key == *key && p.addr == *addr),
                "shared fetch {io} indexed under another block or peer"
            );
        }
        let (mut answer_by, mut hedge_at) = (PairSet::default(), PairSet::default());
        for (rid, req) in &self.requests {
            req.check(*rid);
            if let Some(at) = req.stalled_at {
                assert!(self.stall_timers.contains(&(at, *rid)), "{rid}: stall bound not armed");
            }
            match req.wait {
                Wait::Store(op) => assert_eq!(self.store_ops.get(&op).map(|e| e.0), Some(*rid)),
                Wait::Flight(fid) => {
                    let flight = self.flight_state.get(&fid).expect("waiting on no flight");
                    assert!(flight.waiters.iter().any(|w| w.request == *rid));
                }
                Wait::Check(c) => {
                    let check = self.access.checks.get(&c).expect("waiting on no check");
                    assert!(check.probes.iter().any(|(r, _)| r == rid), "{rid}: not its probe");
                }
                Wait::Alone(io) | Wait::Pipe(io) => {
                    assert_eq!(self.exchanges.get(&io).and_then(|x| x.request()), Some(*rid));
                }
                Wait::Peers(_) => {
                    for io in req.wait.peers() {
                        let x = self.exchanges.get(&io).expect("a request's peer exchange");
                        assert!(x.serves(*rid), "{rid} waits on peer exchange {io} not its own");
                    }
                }
                Wait::Ready => {}
                Wait::Seal => assert!(
                    req.plane == Plane::Client
                        && matches!(
                            req.mirror,
                            Some(requests::Mirror::Blob { expected: Some(_), .. })
                        ),
                    "{rid}: only a checked blob waits for its seal"
                ),
            }
            if let Some(at) = req.answer_by {
                answer_by.add(at, rid.0);
            }
            if let Some(at) = req.hedge_at {
                hedge_at.add(at, rid.0);
            }
        }
        // Every answer-by and hedge bound is armed, and no timer outlives what it bounds (it
        // would wake the node for nothing): each index holds exactly the requests' bounds,
        // compared as the exchanges' deadlines are above.
        if answer_by != PairSet::of(self.answer_timers.iter().map(|&(at, r)| (at, r.0))) {
            self.timers_disagree(&self.answer_timers, |r| r.answer_by, "answer-by");
        }
        if hedge_at != PairSet::of(self.hedge_timers.iter().map(|&(at, r)| (at, r.0))) {
            self.timers_disagree(&self.hedge_timers, |r| r.hedge_at, "hedge");
        }
    }

    /// The slow walk behind a disagreement [`Node::check_invariants`] found between the timer
    /// index `index` and the requests' `bound`s: panics naming the request whose bound is not
    /// armed, or the stale timer.
    fn timers_disagree(
        &self,
        index: &BTreeSet<(Instant, RequestId)>,
        bound: impl Fn(&Request) -> Option<Instant>,
        what: &str,
    ) -> ! {
        for (rid, req) in &self.requests {
            if let Some(at) = bound(req) {
                assert!(index.contains(&(at, *rid)), "{rid}: {what} timer not armed");
            }
        }
        for &(at, rid) in index {
            let armed = self.requests.get(&rid).is_some_and(|r| bound(r) == Some(at));
            assert!(armed, "{rid}: a stale {what} timer at {at}");
        }
        unreachable!("{what} timers and requests disagree, yet every entry matches")
    }
}

/// A set of `(instant, id)` pairs kept as its size and an order-free digest (the wrapping sum of
/// each pair mixed), so that two indexes that must hold the same pairs are compared by walking
/// each once ([`Node::check_invariants`]). The mix is not linear, so pairs that trade instants
/// (two timers swapped) change the sum; two different sets of one size agree by chance with a
/// probability of about 2^-64.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PairSet {
    len: usize,
    sum: u64,
}

impl PairSet {
    fn add(&mut self, at: Instant, id: u64) {
        let mixed = crate::hash::fmix64(id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ at.as_nanos());
        self.len += 1;
        self.sum = self.sum.wrapping_add(mixed);
    }

    fn of(pairs: impl Iterator<Item = (Instant, u64)>) -> Self {
        let mut set = PairSet::default();
        for (at, id) in pairs {
            set.add(at, id);
        }
        set
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_owned()
    }
}
