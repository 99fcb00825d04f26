//! The read-through engine: the sans-IO state machines that turn a client read into size probes,
//! cache look-ups and block fetches, and decide what may be cached.
//!
//! [`Engine`] is the per-node state shared by all reads: configuration, the object table (sizes
//! and Range-blind marks learnt by probes) and counters. A shell keeps one `Engine` behind a lock
//! and drives one [`Read`] per client request; see [`Read`] for the driving contract.

pub mod flight;
pub mod hedge;
pub mod meta;
pub mod neighbours;
pub mod origin;
mod read;
pub mod redirect;
pub mod resolve;
pub mod route;

#[cfg(test)]
mod p2p_tests;
#[cfg(test)]
mod tests;

pub use meta::ObjectMeta;
pub(crate) use read::peer_outcome;
pub use read::{
    block_verdict, probe_wait, Action, Contender, FetchedBlock, HedgeAgain, Method, PeerAnswer,
    PeerAsk, Preconditions, Read, ReadError, ReadFailure, ReadRequest, ResponseHead, Told, Verdict,
    Window, PROBE_WAIT_FLOOR, RESTARTS_MAX,
};

use crate::breaker::{Admission, Breaker, Outcome, Permit};
use crate::geometry::Geometry;
use crate::hash::{BlockKey, ChunkKey};
use crate::identity::{object_id, IdLayout, Namespace, ObjectId};
use crate::time::Instant;
use origin::ProbeOutcome;
use route::{PeerRef, Placement};
use std::collections::BTreeMap;

/// Most objects whose probe result is remembered; past it the oldest entry is forgotten (a later
/// read probes again: one extra 1-byte request, never a wrong byte).
pub const OBJECTS_MAX: usize = 65_536;

/// Which budget a cached block is charged to (spec/store.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockClass {
    /// This node is an authoritative holder of the block's chunk.
    Owned,
    /// A copy made for a local client or a peer.
    Borrowed,
}

/// What the engine knows of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectInfo {
    /// The origin honours Range; the object has this many bytes.
    Sized(u64),
    /// The origin ignores Range: every read is proxied verbatim and nothing is cached.
    RangeBlind,
}

/// Engine configuration.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Chunk and block sizes (identical on every node of a cluster).
    pub geometry: Geometry,
    /// Chunk-key namespace.
    pub namespace: Namespace,
    /// Object-identity layout.
    pub layout: IdLayout,
    /// Relays stream a block from their upstream peer while receiving it (cut-through); off,
    /// they store and forward whole blocks (kept for comparison benchmarks).
    pub cut_through: bool,
    /// How long an object's size and validators are trusted before a revalidating probe, when
    /// the origin's `Cache-Control` does not say (`--revalidate-after`).
    pub revalidate_after: std::time::Duration,
    /// URL prefixes whose objects never change (besides content-addressed paths): never
    /// revalidated, and their blocks are not checked against a validator (`--immutable`).
    pub immutable_prefixes: Vec<String>,
    /// Race a backup peer fetch when the primary is slower than the estimated p99
    /// (seeds/engine.md §3.8; `--hedge`).
    pub hedge: bool,
    /// Longest-run share of peer fetches that may be hedged (`--hedge-ratio`).
    pub hedge_ratio: f64,
    /// Blocks a client read keeps in flight ahead of the one it is serving when it misses
    /// (`--read-ahead`; 0 reads one block at a time): hop and origin latency are pipelined, at
    /// the cost of more streams sharing each ancestor's uplink.
    pub read_ahead: usize,
    /// The same where a sequential read's miss goes to the origin (`--origin-read-ahead`; the
    /// larger of the two applies): the origin's latency and this node's own work on each block
    /// overlap the next. It applies to a client read past its first block that no other
    /// client's read of its object ran beside on this node; beside a peer's relay of the
    /// object, only while the origin is latency-bound (its windows' bytes take far less time
    /// than its wait for their heads, and that wait is 10 ms or more), so that windows ahead do
    /// not share a busy origin link with the one a subtree's streams follow. A peer's relay that continues the block
    /// relayed before it reads ahead inside its chunk on the same condition, so a tree root
    /// that relays and reads nothing itself does not pace its tree at one origin round trip
    /// per block. A client read whose miss goes to its tree reads as many ahead while the tree
    /// is latency-bound (the node's last peer block waited 10 ms or more for its head, far
    /// longer than its bytes took), unless another client's read of its object runs beside it.
    pub origin_read_ahead: usize,
    /// A cold client read whose span starts deep in a block it leads the origin window of also
    /// asks the origin for that span beside the window, so that its first byte does not wait
    /// for the bytes before it (`crate::node`'s lead-ins; on by default, `--no-origin-lead-in`).
    pub lead_in: bool,
}

/// The default [`EngineConfig::read_ahead`]: off. On links that bound a herd, more streams per
/// uplink made its slowest reader slower (docs/benchmarks.md, "Herd throughput").
pub const DEFAULT_READ_AHEAD: usize = 0;

/// The default [`EngineConfig::origin_read_ahead`]: two blocks (docs/benchmarks.md, "The cold
/// path").
pub const DEFAULT_ORIGIN_READ_AHEAD: usize = 2;

/// Default of [`EngineConfig::revalidate_after`].
pub const DEFAULT_REVALIDATE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            geometry: Geometry::default(),
            namespace: Namespace::default(),
            layout: IdLayout::default(),
            cut_through: true,
            revalidate_after: DEFAULT_REVALIDATE_AFTER,
            immutable_prefixes: Vec::new(),
            hedge: true,
            hedge_ratio: hedge::DEFAULT_HEDGE_RATIO,
            read_ahead: DEFAULT_READ_AHEAD,
            origin_read_ahead: DEFAULT_ORIGIN_READ_AHEAD,
            lead_in: true,
        }
    }
}

/// Counters of what the engine decided; the shell exports them as metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Blocks served from the local cache.
    pub block_source_cache: u64,
    /// Blocks served from a peer.
    pub block_source_peer: u64,
    /// Blocks served from the origin (coalesced reads count).
    pub block_source_origin: u64,
    /// Bytes sent to clients on the block path.
    pub client_bytes: u64,
    /// Bytes received from the origin on the block path, coalesced results excluded.
    pub origin_bytes: u64,
    /// Size probes whose answer was used.
    pub probes: u64,
    /// Reads proxied verbatim to a Range-blind origin.
    pub passthrough: u64,
    /// Registry-mode requests proxied to the upstream registry (everything under `/v2` but
    /// blobs: the ping, manifests, tags).
    pub proxied: u64,
    /// Objects whose content failed a whole-object check, read from the origin only for a
    /// while ([`Engine::distrust_peers`]).
    pub objects_distrusted: u64,
    /// Fetched blocks served but refused by the cache (Range-ignored bytes).
    pub uncacheable: u64,
    /// Cached blocks found with the wrong length (treated as misses; once per read or relay
    /// that meets one, not again when it looks again before the origin).
    pub cache_corrupt: u64,
    /// Bytes received from peers on the block path.
    pub peer_bytes: u64,
    /// Peer blocks refused for their length (the peer's circuit opened).
    pub peer_wrong_length: u64,
    /// Peer blocks refused because their bytes did not match the digest that ended them
    /// ([`crate::integrity`]; the peer's circuit opened).
    pub peer_digest_mismatch: u64,
    /// Peer blocks whose bytes matched the digest that ended them.
    pub peer_digests_verified: u64,
    /// Escalations past a peer that failed (not counting 404s).
    pub peer_failover: u64,
    /// Blocks whose ancestors had all failed and for which a tree laid again (without the
    /// members whose circuits opened meanwhile) named an ancestor not asked yet.
    pub peer_reroutes: u64,
    /// Upstream peers skipped because the breaker refused admission.
    pub peer_skipped_open: u64,
    /// Relay requests answered with a block.
    pub relay_served: u64,
    /// Relay requests declined (404).
    pub relay_declined: u64,
    /// Relays of an object this node did not know that asked upstream at once under the size
    /// their requester told, probing in the background ([`Read::set_told`]).
    pub relay_told: u64,
    /// Blocks such relays did not store: the engine had not learnt the told size and version
    /// by the time the block was whole (the background probe not back, or it disagreed).
    pub relay_told_unstored: u64,
    /// Such relays that declined before the origin (no ancestor left while the told size was
    /// not confirmed), and upstream blocks of the wrong length they did not charge.
    pub relay_told_refused: u64,
    /// Objects found changed at the origin (a new validator): their size, validators and cached
    /// blocks were dropped.
    pub object_changes: u64,
    /// Probes made because an object's validators were no longer fresh.
    pub revalidations: u64,
    /// Peer answers refused because they described another version of the object.
    pub peer_version_mismatch: u64,
    /// Hedges fired: a backup peer fetch raced a slow primary. Those at another ancestor spend
    /// hedge credit (`hedge_ratio`); probes do not.
    pub hedge_fired: u64,
    /// Of the hedges fired, the held-only liveness probes of the primary's peer
    /// ([`Read::handle_hedge_due`]), which spend no hedge credit: a primary with no other
    /// ancestor left is probed instead of hedged, and one with another ancestor left is probed
    /// first while the node has no estimate.
    pub hedge_probes: u64,
    /// Of those probes, the ones the peer answered (it was alive: no origin backup).
    pub hedge_probes_alive: u64,
    /// Of those probes, the ones that went unanswered with no other ancestor left, so the
    /// backup was an origin fill.
    pub hedge_origin: u64,
    /// Of those probes, the ones that went unanswered with another ancestor left: the backup
    /// went there at once, spending no hedge credit (a failover from a silent peer).
    pub hedge_probe_failovers: u64,
    /// Hedged blocks the primary still won.
    pub hedge_primary_won: u64,
    /// Hedged blocks the backup won.
    pub hedge_backup_won: u64,
    /// Blocks the home of their chunk asked its successor for, held-only, before the origin
    /// (`Engine::successor_relay`).
    pub successor_asks: u64,
    /// Of those, blocks the successor held (origin reads saved).
    pub successor_hits: u64,
    /// Blocks a read waiting on peers took from this node's store instead, when another read
    /// of this node stored them first (its peer fetches were cancelled, not charged).
    pub landed: u64,
    /// Of those, committed relay streams finished from the landed copy: its first bytes matched
    /// every byte the stream had forwarded, so the rest came from it ([`Read::resume_stream`]).
    pub streams_resumed: u64,
    /// Landed copies a committed stream could not be finished from: the bytes the stream had
    /// forwarded differ from them (the stream ends on its own, and its footer judges it).
    pub streams_resume_refused: u64,
    /// Client reads' block windows passed on from the origin as they arrived, instead of held
    /// whole first ([`Read::origin_stream_span`]).
    pub origin_streams: u64,
    /// Client bytes of those windows passed on before the window ended.
    pub origin_streamed_bytes: u64,
    /// Blocks a read asked a neighbour for before paying the origin (spec/overlay.md §5).
    pub neighbour_asks: u64,
    /// Of those, blocks the neighbour held (origin reads saved).
    pub neighbour_hits: u64,
    /// Reads that went on with stale validators because the revalidating probe found the origin
    /// unavailable (stale-if-error).
    pub stale_served: u64,
}

/// The peer half of an engine: where this node sits and which peers are failing.
pub struct P2p {
    /// Membership view, self id and tree parameters.
    pub placement: Placement,
    /// Per-peer circuits, keyed by peer address.
    pub breaker: Breaker<String>,
}

struct ObjectEntry {
    info: ObjectInfo,
    meta: ObjectMeta,
    /// Until when the entry is trusted without revalidation; `None`: forever (immutable).
    fresh_until: Option<Instant>,
    seq: u64,
}

/// Per-node engine state; see the module doc.
pub struct Engine {
    config: EngineConfig,
    /// Boxed: a map of one or two objects (a node of a large cluster) is one B-tree leaf
    /// sized for eleven entries, 2 KB a node unboxed.
    objects: BTreeMap<String, Box<ObjectEntry>>,
    object_order: BTreeMap<u64, String>,
    /// Counts the changes to `objects` and `object_order` (made by [`Engine::insert`] and
    /// [`Engine::forget`] only), for [`Engine::check_invariants`]'s O(objects log objects) walk
    /// of their agreement.
    objects_gate: crate::walk_gate::WalkGate,
    next_seq: u64,
    stats: EngineStats,
    p2p: Option<P2p>,
    /// Latencies of recent peer fetches that held their block (the hedge delay).
    latency: hedge::LatencyEstimator,
    hedges: hedge::HedgeLimiter,
    /// Peers a read of this node found slow lately (timed out, or beaten by a backup), until
    /// when: every read asks them after its other ancestors ([`SLOW_MEMORY`]).
    slow: BTreeMap<String, Instant>,
    /// Peers a hedge's liveness probe found silent, and until when ([`SILENT_MEMORY`]).
    silent: BTreeMap<String, Instant>,
    /// Reader sets granted by objects' trackers, when the reader tree is on
    /// ([`Engine::enable_reader_tree`]).
    readers: Option<crate::tracker::ReaderCache>,
    /// Objects whose reader set a read wants (re)joined: the node sends the JOINs
    /// ([`Engine::take_joins`]); at most one per object is in flight (the cache marks it).
    joins: Vec<String>,
    /// Objects whose content failed a whole-object check at this node lately, until when:
    /// their reads and relays skip the peer path and read the origin ([`Engine::distrust_peers`]).
    distrusted: BTreeMap<String, Instant>,
    /// The scored neighbours, when on ([`Engine::enable_neighbours`]).
    neighbours: Option<neighbours::Neighbours>,
    /// The identities of the URLs identified last ([`Engine::identify`]): a client read
    /// identifies its URL more than once, and a hot object is read again and again. A memo of
    /// a pure function of the URL and the configured layout.
    identities: std::cell::RefCell<std::collections::VecDeque<(String, ObjectId)>>,
}

/// URLs whose identity [`Engine::identify`] remembers.
const IDENTITIES_MAX: usize = 8;

/// How long an object whose content failed its check is read from the origin only.
pub const DISTRUST_MEMORY: std::time::Duration = std::time::Duration::from_secs(600);
/// Most objects remembered as distrusted (the one expiring first is forgotten past it).
const DISTRUSTED_MAX: usize = 1024;

/// How long a peer found slow is asked after the other ancestors by every read of the node.
pub const SLOW_MEMORY: std::time::Duration = std::time::Duration::from_secs(10);
/// Remembers `addr` in `peers` until `now + memory`, dropping the entries that ran out; at
/// [`SLOW_PEERS_MAX`] entries the one that runs out first makes room.
fn remember(
    peers: &mut BTreeMap<String, Instant>,
    addr: &str,
    now: Instant,
    memory: std::time::Duration,
) {
    peers.retain(|_, until| *until > now);
    if peers.len() >= SLOW_PEERS_MAX && !peers.contains_key(addr) {
        let oldest = peers.iter().min_by_key(|(_, u)| **u).map(|(a, _)| a.clone());
        if let Some(a) = oldest {
            peers.remove(&a);
        }
    }
    peers.insert(addr.to_owned(), now.saturating_add(memory));
}

/// How long a peer found silent by a hedge's probe is backed up to the origin without another
/// probe (unless it answers sooner): about the breaker's first cooldown, by when a dead peer's
/// circuit has usually opened and the tree has replaced it.
pub const SILENT_MEMORY: std::time::Duration = std::time::Duration::from_secs(3);
/// Most peers remembered as slow (the oldest is forgotten first past it).
const SLOW_PEERS_MAX: usize = 1024;

impl Engine {
    /// A fresh engine.
    pub fn new(config: EngineConfig) -> Self {
        let config_ratio = config.hedge_ratio;
        Engine {
            config,
            objects: BTreeMap::new(),
            object_order: BTreeMap::new(),
            objects_gate: crate::walk_gate::WalkGate::default(),
            next_seq: 0,
            stats: EngineStats::default(),
            p2p: None,
            latency: hedge::LatencyEstimator::default(),
            hedges: hedge::HedgeLimiter::new(config_ratio),
            slow: BTreeMap::new(),
            identities: Default::default(),
            silent: BTreeMap::new(),
            readers: None,
            joins: Vec::new(),
            distrusted: BTreeMap::new(),
            neighbours: None,
        }
    }

    /// The bytes this node served of `object` failed a whole-object check (a registry blob's
    /// digest): some block came wrong from a peer, the store or the origin, and which one is not
    /// known. For [`DISTRUST_MEMORY`] its reads and relays at this node skip the peer path and
    /// read the origin, so that a retry cannot meet the same wrong block from the same peer.
    pub fn distrust_peers(&mut self, object: &ObjectId, now: Instant) {
        self.distrusted.retain(|_, until| *until > now);
        if self.distrusted.len() >= DISTRUSTED_MAX && !self.distrusted.contains_key(&object.id) {
            let first = self.distrusted.iter().min_by_key(|(_, u)| **u).map(|(o, _)| o.clone());
            if let Some(o) = first {
                self.distrusted.remove(&o);
            }
        }
        self.distrusted.insert(object.id.clone(), now.saturating_add(DISTRUST_MEMORY));
        self.stats.objects_distrusted += 1;
    }

    /// Whether reads of object `file` skip the peer path at `now` ([`Engine::distrust_peers`]).
    pub fn peers_distrusted(&self, file: &str, now: Instant) -> bool {
        self.distrusted.get(file).is_some_and(|until| *until > now)
    }

    /// Lays each object's trees over the nodes reading it (the tracker's reader set) instead of
    /// over every Ready member, once its tracker has granted a set (spec/tracker.md §5).
    pub fn enable_reader_tree(&mut self) {
        self.readers = Some(crate::tracker::ReaderCache::new());
    }

    /// The reader-set cache, when the reader tree is on.
    pub fn reader_cache(&self) -> Option<&crate::tracker::ReaderCache> {
        self.readers.as_ref()
    }

    /// A read of this node reads object `file`: when its reader set is missing or half its lease
    /// has passed, the object is queued for a JOIN ([`Engine::take_joins`]).
    fn reading(&mut self, file: &str, now: Instant) {
        let Some(cache) = self.readers.as_mut() else { return };
        if cache.note_read(file, now) {
            debug_assert!(!self.joins.iter().any(|f| f == file), "one JOIN per object");
            self.joins.push(file.to_owned());
        }
    }

    /// The objects to JOIN now (each is in flight until [`Engine::joined`] answers it).
    pub fn take_joins(&mut self) -> Vec<String> {
        std::mem::take(&mut self.joins)
    }

    /// A JOIN for `file` ended with `result` (an error: the tracker could not be asked or did not
    /// grant; the object's reads route over every Ready member once its last grant lapses).
    pub fn joined(
        &mut self,
        file: &str,
        result: Result<crate::tracker::Grant, String>,
        now: Instant,
    ) {
        if let Some(cache) = self.readers.as_mut() {
            cache.joined(file, result, now);
        }
    }

    /// A read found `addr` slow at `now`: every read of this node asks it after its other
    /// ancestors for [`SLOW_MEMORY`] (it is still asked; the breaker alone excludes peers).
    pub(crate) fn note_slow(&mut self, addr: &str, now: Instant) {
        remember(&mut self.slow, addr, now, SLOW_MEMORY);
    }

    /// Whether a read of this node found `addr` slow within [`SLOW_MEMORY`] of `now`.
    pub fn is_slow(&self, addr: &str, now: Instant) -> bool {
        self.slow.get(addr).is_some_and(|until| *until > now)
    }

    /// A hedge's liveness probe found `addr` silent ([`Read::handle_hedge_due`]): for
    /// [`SILENT_MEMORY`], or until `addr` answers again, trees are laid around `addr` as around
    /// an open circuit (`Engine::upstreams`), and a read still waiting on it backs up to the
    /// origin at its hedge delay without probing again.
    pub(crate) fn note_silent(&mut self, addr: &str, now: Instant) {
        remember(&mut self.silent, addr, now, SILENT_MEMORY);
    }

    /// `addr` answered: it is no longer silent.
    pub(crate) fn forget_silent(&mut self, addr: &str) {
        self.silent.remove(addr);
    }

    /// Whether a probe found `addr` silent within [`SILENT_MEMORY`] of `now`, and it has not
    /// answered since.
    pub fn is_silent(&self, addr: &str, now: Instant) -> bool {
        self.silent.get(addr).is_some_and(|until| *until > now)
    }

    /// Records a peer fetch that held its block and took `d` (a miss or a failure never does:
    /// a fast 404 must not collapse the hedge delay).
    pub fn record_peer_latency(&mut self, d: std::time::Duration) {
        self.latency.record(d);
    }

    /// The estimated `q`-quantile of peer fetches that held their block (`None` below 16
    /// samples).
    pub fn peer_latency(&self, q: f64) -> Option<std::time::Duration> {
        self.latency.quantile(q)
    }

    /// How long a primary peer fetch runs before a hedge may race it: the estimator's delay, or
    /// [`hedge::COLD_DELAY`] before it has enough samples; `None` with hedging off (`--hedge`
    /// off or a zero ratio).
    pub(crate) fn hedge_delay(&self) -> Option<std::time::Duration> {
        if !self.config.hedge || self.hedges.ratio() == 0.0 {
            return None;
        }
        Some(self.latency.hedge_delay().unwrap_or(hedge::COLD_DELAY))
    }

    /// When a primary peer fetch is first looked at ([`Read::handle_hedge_due`]): the hedge
    /// delay, or [`hedge::COLD_PROBE_DELAY`] before there is an estimate, when that look is a
    /// liveness probe of the peer (the hedge proper, at another ancestor, waits the rest of
    /// [`hedge::COLD_DELAY`] after a live answer).
    pub(crate) fn probe_delay(&self) -> Option<std::time::Duration> {
        let cold = self.hedge_is_cold();
        self.hedge_delay().map(|d| if cold { d.min(hedge::COLD_PROBE_DELAY) } else { d })
    }

    /// Hedging is on and the estimator has no estimate yet ([`hedge::COLD_DELAY`] stands in).
    pub(crate) fn hedge_is_cold(&self) -> bool {
        self.hedge_delay().is_some() && self.latency.hedge_delay().is_none()
    }

    pub(crate) fn on_peer_fetch(&mut self) {
        self.hedges.on_fetch();
    }

    pub(crate) fn try_hedge(&mut self) -> bool {
        self.hedges.try_hedge()
    }

    /// Turns on the scored neighbours (spec/overlay.md §3, §5) with `rng` as their randomness;
    /// the first update is due at `now`. False without the peer path.
    pub fn enable_neighbours(
        &mut self,
        config: crate::overlay::set::Config,
        rng: crate::rng::Rng,
        now: Instant,
    ) -> bool {
        if self.p2p.is_none() {
            return false;
        }
        self.neighbours = Some(neighbours::Neighbours::new(config, rng, now));
        true
    }

    /// The scored neighbours, when on.
    pub fn neighbours(&self) -> Option<&neighbours::Neighbours> {
        self.neighbours.as_ref()
    }

    /// The scored neighbours and the view they are drawn from, when both are on.
    pub(crate) fn neighbours_mut(&mut self) -> Option<(&mut neighbours::Neighbours, &P2p)> {
        Some((self.neighbours.as_mut()?, self.p2p.as_ref()?))
    }

    /// The neighbour a read should ask for `key` (cache-only) before it reads the origin: a
    /// reliable one drawn by weight whose circuit admits, unless this node is the home of the
    /// block's chunk (the best-ranked member of the whole view, which reads the origin by
    /// design: no neighbour can hold a block before it), or the object's peers are distrusted.
    pub(crate) fn neighbour_relay(
        &mut self,
        key: BlockKey,
        file: &str,
        now: Instant,
    ) -> Option<route::PeerRef> {
        if self.peers_distrusted(file, now) {
            return None;
        }
        let p2p = self.p2p.as_ref()?;
        let placement = &p2p.placement;
        if placement.first_ranked(key.chunk).is_none_or(|id| id == placement.self_id()) {
            return None;
        }
        let refused: Vec<&String> = p2p.breaker.unhealthy(now).collect();
        let neighbours = self.neighbours.as_mut()?;
        neighbours.choose(placement.view(), |_, addr| !refused.iter().any(|r| *r == addr))
    }

    /// At the home of `key`'s chunk, about to pay the origin: the member ranked next, to ask
    /// held-only first, unless it is `requester` (it asked because it does not hold the block),
    /// its circuit refuses, or the object's peers are distrusted. While the home was unusable to
    /// the readers (dead, cut off), that member was their substitute root and fetched the blocks
    /// they read; a home that comes back finds them there instead of paying the origin again.
    pub(crate) fn successor_relay(
        &mut self,
        key: BlockKey,
        file: &str,
        requester: Option<&str>,
        now: Instant,
    ) -> Option<route::PeerRef> {
        if self.peers_distrusted(file, now) {
            return None;
        }
        let p2p = self.p2p.as_ref()?;
        let next = p2p.placement.successor(key.chunk)?;
        if requester == Some(next.id.as_str())
            || p2p.breaker.unhealthy(now).any(|a| *a == next.addr)
        {
            return None;
        }
        Some(next)
    }

    /// Turns on the peer path: misses go to this node's tree ancestors before the origin.
    pub fn enable_p2p(&mut self, p2p: P2p) {
        self.p2p = Some(p2p);
    }

    /// The peer half, if enabled (the shell drives the breaker's timers and events through it).
    pub fn p2p_mut(&mut self) -> Option<&mut P2p> {
        self.p2p.as_mut()
    }

    /// The peer half, if enabled.
    pub fn p2p(&self) -> Option<&P2p> {
        self.p2p.as_ref()
    }

    /// Starts serving a peer's request for `key` after [`route::relay_check`] accepted it:
    /// `url` is `Some` for fetch-on-behalf (with the hop to send upstream), `None` for cache-only.
    pub fn begin_relay(&mut self, key: BlockKey, url: Option<String>, next_hop: u64) -> Read {
        Read::relay(self, key, url, next_hop)
    }

    /// Starts serving a peer's held-only request (`X-DART-Held-Only`) for `key` of the object
    /// at `url`, after [`route::relay_check`] accepted it: the block is served if held and the
    /// object's version is known here (or the object is immutable), never fetched.
    pub fn begin_relay_held(&mut self, key: BlockKey, url: String, hop: u64) -> Read {
        Read::relay_held(self, key, url, hop)
    }

    /// A background probe of the object at `url` ([`Action::Learn`], emitted by a read of
    /// block `key`): a read that serves nobody and ends when the probe answered.
    pub fn begin_learn(&mut self, key: BlockKey, url: String) -> Read {
        Read::learn(self, key, url)
    }

    /// A read-ahead read of block `key` of the object at `url`: a relay read that serves nobody
    /// (the node suppresses its response) and counts in no block-source or relay statistic.
    pub fn begin_read_ahead(&mut self, key: BlockKey, url: String) -> Read {
        let mut read = Read::relay(self, key, Some(url), 0);
        read.set_ahead();
        read
    }

    /// Starts an origin fill of block `key`: a read-ahead read that asks no peer (the store,
    /// then the origin), the backup of a hedge with no ancestor left to race.
    pub fn begin_origin_fill(&mut self, key: BlockKey, url: String) -> Read {
        let mut read = Read::relay(self, key, Some(url), 0);
        read.set_ahead();
        read.set_origin_only();
        read
    }

    /// Whether this engine knows `object` with the size and the very validators `told` names
    /// (`Some(true)`), knows it otherwise (`Some(false)`: a size or version the requester named
    /// that the origin did not give), or does not know it (`None`). An immutable object needs
    /// the size only.
    pub fn confirms(&self, object: &ObjectId, told: &Told) -> Option<bool> {
        match self.object(object)? {
            ObjectInfo::Sized(size) if size == told.size => {
                if self.is_immutable(object) {
                    return Some(true);
                }
                // The very validators: a requester that named fewer than the origin gave
                // cannot have its block taken for the version the engine knows.
                let known = self.meta_of(&object.id).map(ObjectMeta::validators);
                Some(known.unwrap_or_default() == told.meta.validators())
            }
            _ => Some(false),
        }
    }

    /// Counts a block fetched under a told size that was not stored
    /// ([`Action::StoreWhenConfirmed`] let go unconfirmed).
    pub fn note_told_unstored(&mut self) {
        self.stats.relay_told_unstored += 1;
    }

    /// Counts a relay request declined by [`route::relay_check`] before any work.
    pub fn note_relay_declined(&mut self) {
        self.stats.relay_declined += 1;
    }

    /// Counts origin bytes that came in for a flight no read waited on at its end.
    pub fn note_origin_bytes(&mut self, bytes: u64) {
        self.stats.origin_bytes += bytes;
    }

    /// Counts a landed copy that a committed relay stream could not be finished from
    /// ([`EngineStats::streams_resume_refused`]).
    pub fn note_stream_resume_refused(&mut self) {
        self.stats.streams_resume_refused += 1;
    }

    /// Reports a peer request whose task went away without an answer.
    pub fn abandon(&mut self, permit: Permit<String>, now: Instant) {
        self.complete(permit, Outcome::Abandoned, now);
    }

    pub(crate) fn admit(&mut self, addr: &String, now: Instant) -> Option<Permit<String>> {
        let p2p = self.p2p.as_mut()?;
        match p2p.breaker.begin_data(addr, now) {
            Admission::Admitted(permit) => Some(permit),
            Admission::Rejected => None,
        }
    }

    fn complete(&mut self, permit: Permit<String>, outcome: Outcome, now: Instant) {
        match self.p2p.as_mut() {
            Some(p2p) => {
                p2p.breaker.complete(permit, outcome, now);
            }
            None => unreachable!("permits exist only with the peer path"),
        }
    }

    /// The usable ancestors of block `key` of object `file`, over the object's live reader set
    /// when there is one.
    fn upstreams(&self, key: BlockKey, file: &str, now: Instant) -> Vec<PeerRef> {
        let Some(p2p) = &self.p2p else { return Vec::new() };
        if self.peers_distrusted(file, now) {
            return Vec::new();
        }
        let readers = self.readers.as_ref().and_then(|c| c.peek_tagged(file, now));
        // The peers the breaker would refuse now, taken once: usually none, so no candidate
        // costs a look-up (the same verdicts as `healthy` per candidate). And those a hedge's
        // probe found silent lately: the tree replaces them as it replaces a dead member
        // (`Placement::upstreams`), so the readers under a silent root converge on the member
        // ranked next instead of each paying the origin; their fetches that ran on
        // (`Action::CancelPeer`) open its circuit if it is dead.
        let silent = self.silent.iter().filter(|(_, until)| **until > now).map(|(a, _)| a);
        let mut refused: Vec<&String> = p2p.breaker.unhealthy(now).chain(silent).collect();
        refused.sort_unstable();
        refused.dedup();
        p2p.placement.upstreams_tagged(key.chunk, readers, &refused)
    }

    /// The usable ancestor of `key`'s tree at `addr`, if it still is one.
    fn upstream_ref(&self, key: BlockKey, file: &str, addr: &str, now: Instant) -> Option<PeerRef> {
        self.upstreams(key, file, now).into_iter().find(|p| p.addr == addr)
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// A client read's cache hit was a block this node's read-ahead brought in for it moments
    /// before (read-ahead reads count in no block source): it counts as a block from a peer
    /// (`from_peer`) or from the origin instead, as it would have without read-ahead.
    pub(crate) fn recount_ahead_hit(&mut self, from_peer: bool) {
        self.stats.block_source_cache -= 1;
        if from_peer {
            self.stats.block_source_peer += 1;
        } else {
            self.stats.block_source_origin += 1;
        }
    }

    /// The identity of the object at `url`.
    pub fn identify(&self, url: &str) -> ObjectId {
        let mut memo = self.identities.borrow_mut();
        if let Some((_, id)) = memo.iter().find(|(u, _)| u == url) {
            return id.clone();
        }
        let id = object_id(url, self.config.layout);
        if memo.len() == IDENTITIES_MAX {
            memo.pop_front();
        }
        memo.push_back((url.to_owned(), id.clone()));
        id
    }

    /// The key of global block `block` of object `id`.
    pub fn block_key(&self, id: &ObjectId, block: u64) -> BlockKey {
        let chunk = self.config.geometry.chunk_of_block(block);
        let chunk = i64::try_from(chunk).expect("chunk index of a legal block fits i64");
        BlockKey { chunk: ChunkKey::new(self.config.namespace.as_str(), &id.id, chunk), block }
    }

    /// What is known of object `id`.
    pub fn object(&self, id: &ObjectId) -> Option<ObjectInfo> {
        self.objects.get(&id.id).map(|e| e.info)
    }

    /// Which budget a block fetched by this node is charged to: owned iff this node is among the
    /// chunk's HRW owners; a single node owns everything.
    pub fn class_of(&self, key: &BlockKey) -> BlockClass {
        match &self.p2p {
            Some(p2p) => p2p.placement.class_of(key.chunk),
            None => BlockClass::Owned,
        }
    }

    /// A read that proxies a registry request to `url` verbatim: its one action is
    /// [`Action::Passthrough`]; nothing is probed, cached or coalesced.
    pub fn begin_proxy(&mut self, url: String, method: Method) -> Read {
        Read::proxy(self, url, method)
    }

    /// Starts a read; drive it with [`Read::poll_action`].
    pub fn begin_read(&mut self, request: ReadRequest, now: Instant) -> Read {
        Read::new(self, request, now)
    }

    /// Records what a probe of object `id` established at `now`: its size (or Range-blindness)
    /// and its validators, trusted for their freshness. The node's probe flight calls this before
    /// the flight ends, so that a read arriving after the flight finds the size instead of
    /// probing again. When an earlier entry described another version (another size or
    /// validator), the object changed: returns the keys of the old version's blocks, which the
    /// caller drops from the store.
    pub fn record_probe(
        &mut self,
        id: &ObjectId,
        outcome: ProbeOutcome,
        meta: ObjectMeta,
        now: Instant,
    ) -> Vec<BlockKey> {
        let old = self.objects.get(&id.id);
        let changed = old.is_some_and(|old| match (old.info, outcome) {
            (ObjectInfo::Sized(a), ProbeOutcome::Size(b)) => {
                a != b || old.meta.same_version(&meta) == Some(false)
            }
            (ObjectInfo::RangeBlind, _) | (_, ProbeOutcome::RangeBlind { .. }) => false,
        });
        let stale = if changed {
            self.stats.object_changes += 1;
            self.forget(id)
        } else {
            Vec::new()
        };
        let fresh_until = if self.is_immutable(id) {
            None
        } else {
            Some(now.saturating_add(meta.freshness(self.config.revalidate_after)))
        };
        self.insert(id, Self::info_of(outcome), meta, fresh_until);
        stale
    }

    fn info_of(outcome: ProbeOutcome) -> ObjectInfo {
        match outcome {
            ProbeOutcome::Size(n) => ObjectInfo::Sized(n),
            ProbeOutcome::RangeBlind { .. } => ObjectInfo::RangeBlind,
        }
    }

    /// Records what a read learnt itself (its own probe's answer, a Range-ignoring block),
    /// keeping the validators and freshness already known.
    fn learn(&mut self, id: &ObjectId, outcome: ProbeOutcome) {
        let (meta, fresh_until) = match self.objects.get(&id.id) {
            Some(e) => (e.meta.clone(), e.fresh_until),
            None => (ObjectMeta::default(), None),
        };
        self.insert(id, Self::info_of(outcome), meta, fresh_until);
    }

    fn insert(
        &mut self,
        id: &ObjectId,
        info: ObjectInfo,
        meta: ObjectMeta,
        fresh_until: Option<Instant>,
    ) {
        self.objects_gate.changed();
        if let Some(old) = self.objects.remove(&id.id) {
            self.object_order.remove(&old.seq);
        }
        if self.objects.len() >= OBJECTS_MAX {
            if let Some((_, oldest)) = self.object_order.pop_first() {
                self.objects.remove(&oldest);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.objects.insert(id.id.clone(), Box::new(ObjectEntry { info, meta, fresh_until, seq }));
        self.object_order.insert(seq, id.id.clone());
    }

    /// The validators and entity fields known for the object with identity `id`.
    pub fn meta_of(&self, id: &str) -> Option<&ObjectMeta> {
        self.objects.get(id).map(|e| &e.meta)
    }

    /// Whether what is known of object `id` may be used at `now` without revalidating.
    pub fn is_fresh(&self, id: &ObjectId, now: Instant) -> bool {
        self.objects.get(&id.id).is_some_and(|e| e.fresh_until.is_none_or(|t| now < t))
    }

    /// Whether object `id` never changes: content-addressed, or under an immutable prefix.
    pub fn is_immutable(&self, id: &ObjectId) -> bool {
        id.content_addressed
            || self.config.immutable_prefixes.iter().any(|p| id.id.starts_with(p.as_str()))
    }

    /// Counts a peer answer refused for naming another version of its object.
    pub fn note_peer_version_mismatch(&mut self) {
        self.stats.peer_version_mismatch += 1;
    }

    /// Counts a peer block checked against its digest: matched or not.
    pub fn note_peer_digest(&mut self, matched: bool) {
        if matched {
            self.stats.peer_digests_verified += 1;
        } else {
            self.stats.peer_digest_mismatch += 1;
        }
    }

    /// Counts an object found changed by a block's answer.
    pub fn note_change(&mut self) {
        self.stats.object_changes += 1;
    }

    /// Forgets object `id` (it changed at the origin): returns the keys of every block of the
    /// size it had, for the caller to drop from the store.
    pub fn forget(&mut self, id: &ObjectId) -> Vec<BlockKey> {
        let Some(entry) = self.objects.remove(&id.id) else { return Vec::new() };
        self.objects_gate.changed();
        self.object_order.remove(&entry.seq);
        match entry.info {
            ObjectInfo::Sized(size) => {
                let blocks = self.config.geometry.block_count(size);
                (0..blocks).map(|b| self.block_key(id, b)).collect()
            }
            ObjectInfo::RangeBlind => Vec::new(),
        }
    }

    /// Asserts the engine's invariants.
    pub fn check_invariants(&self) {
        if let Some(cache) = &self.readers {
            cache.check_invariants();
        }
        if let Some(p2p) = &self.p2p {
            // The view is immutable and checked when built (`View::new`).
            p2p.breaker.check_invariants();
        }
        if let Some(n) = &self.neighbours {
            assert!(self.p2p.is_some(), "neighbours only with the peer path");
            n.check_invariants();
        }
        assert!(self.objects.len() <= OBJECTS_MAX);
        assert_eq!(self.objects.len(), self.object_order.len());
        self.objects_gate.walk(|| {
            for (seq, id) in &self.object_order {
                assert_eq!(self.objects.get(id).map(|e| e.seq), Some(*seq));
            }
        });
    }
}
