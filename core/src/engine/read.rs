//! One client read as a state machine.

use super::meta::ObjectMeta;
use super::origin::{OriginError, ProbeOutcome, RangeBody};
use super::route::PeerRef;
use super::{hedge, BlockClass, Engine, ObjectInfo};
use crate::breaker::{HardReason, Observation, Outcome, Permit};
use crate::codec::conditional::{evaluate, Conditions, Validators, Verdict as Precondition};
use crate::codec::range::{
    content_range_header, resolve_range, unsatisfied_content_range, RangeOutcome,
};
use crate::geometry::{Segment, Segments};
use crate::hash::BlockKey;
use crate::identity::ObjectId;
use crate::time::Instant;
use bytes::Bytes;
use std::collections::VecDeque;
use thiserror::Error;

/// The client's method; anything else is refused by the shell with 405 before a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// Headers and body.
    Get,
    /// Headers only; never sent upstream as HEAD.
    Head,
}

/// A client read: the resolved upstream URL, the method, the raw `Range` header and the
/// request's preconditions.
#[derive(Clone, Debug)]
pub struct ReadRequest {
    /// Upstream URL (may carry a presigned query; it is a credential).
    pub url: String,
    /// GET or HEAD.
    pub method: Method,
    /// The raw `Range` header, if any.
    pub range: Option<Vec<u8>>,
    /// Conditional-request header fields (RFC 9110 §13), raw.
    pub conditions: Preconditions,
}

/// A request's precondition header fields, raw (see [`crate::codec::conditional`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// `If-Match`.
    pub if_match: Option<Vec<u8>>,
    /// `If-None-Match`.
    pub if_none_match: Option<Vec<u8>>,
    /// `If-Modified-Since`.
    pub if_modified_since: Option<Vec<u8>>,
    /// `If-Unmodified-Since`.
    pub if_unmodified_since: Option<Vec<u8>>,
    /// `If-Range`.
    pub if_range: Option<Vec<u8>>,
}

impl Preconditions {
    fn borrowed(&self) -> Conditions<'_> {
        Conditions {
            if_match: self.if_match.as_deref(),
            if_none_match: self.if_none_match.as_deref(),
            if_modified_since: self.if_modified_since.as_deref(),
            if_unmodified_since: self.if_unmodified_since.as_deref(),
            if_range: self.if_range.as_deref(),
        }
    }
}

/// What a read knew before it revalidated: the object's entry and, for a relay, the block it
/// holds.
#[derive(Debug)]
struct Stale {
    info: Option<ObjectInfo>,
    held: Option<Bytes>,
}

/// Most times one read starts over because the object changed under it.
pub const RESTARTS_MAX: u8 = 2;

/// Status line and framing of the response, with the object's validators and entity fields.
/// `Accept-Ranges: bytes` always accompanies a client's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// 200, 206, 304, 412 or 416.
    pub status: u16,
    /// Exact body length: the block path never uses chunked framing.
    pub content_length: u64,
    /// `Content-Range` value for 206 and 416.
    pub content_range: Option<String>,
    /// The object's validators and entity fields, as the origin sent them at the probe.
    pub meta: ObjectMeta,
}

/// A block fetched from the origin, with the fetcher's judgement of the response.
#[derive(Clone, Debug)]
pub struct FetchedBlock {
    /// The bytes of the window.
    pub data: Bytes,
    /// What the response revealed (total, Range ignored).
    pub body: RangeBody,
    /// The bytes came from another caller's flight (not counted as origin wire bytes).
    pub coalesced: bool,
}

/// Why a read failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReadError {
    /// A relay does not hold the block and may not fetch it (no origin, past the object's end).
    #[error("block not held")]
    NotHeld,
    /// A peer failed after a cut-through relay had started forwarding its bytes.
    #[error("upstream peer failed mid-block ({0:?})")]
    PeerFailed(Observation),
    /// The origin failed or refused (probe or block fetch).
    #[error(transparent)]
    Origin(#[from] OriginError),
    /// A fetched block did not have the length the geometry requires.
    #[error("block {block} has {got} bytes, geometry requires {want}")]
    BlockLength {
        /// Global block index.
        block: u64,
        /// Required length.
        want: u64,
        /// Received length.
        got: u64,
    },
    /// The origin's total changed under us: the object is not immutable.
    #[error("object size changed from {known} to {now}")]
    SizeChanged {
        /// Size learnt by the probe.
        known: u64,
        /// Size the block response reported.
        now: u64,
    },
}

/// A failed read: before the head is committed the shell answers `status`; after, it can only
/// truncate the body (the client sees a short Content-Length body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFailure {
    /// The response head was already emitted.
    pub committed: bool,
    /// Status to answer when not committed. Client reads: 404 when the origin said 404, else 502.
    /// Relays: 404 when not held, 502 when the origin refused the requester's credential, else
    /// 500.
    pub status: u16,
    /// For a relay whose origin refused the requester's credential: the origin's status, sent as
    /// `X-DART-Upstream-Status` so the requester does not blame this relay.
    pub upstream_status: Option<u16>,
    /// The cause.
    pub error: ReadError,
}

/// Which of a block's (at most two) concurrent peer fetches an answer is about: the primary
/// (the nearest usable ancestor, or a failover after a definitive failure) or the backup (a hedge
/// raced at the next usable ancestor once the primary is slower than the estimated p99).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Contender {
    /// The first fetch of a block, or a failover.
    Primary,
    /// A hedge.
    Backup,
}

impl Contender {
    /// The other one.
    pub fn other(self) -> Contender {
        match self {
            Contender::Primary => Contender::Backup,
            Contender::Backup => Contender::Primary,
        }
    }

    /// Its slot in a pair.
    pub fn index(self) -> usize {
        match self {
            Contender::Primary => 0,
            Contender::Backup => 1,
        }
    }
}

/// A peer's answer to [`Action::FetchPeer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerAnswer {
    /// 200 with a complete body (the shell read at most `expected_len + 1` bytes).
    Block(Bytes),
    /// Anything else, classified by the shell: a 404 is [`Observation::Miss`].
    Failed(Observation),
}

/// What the shell must do next.
#[derive(Debug)]
pub enum Action {
    /// Start an origin fill of block `key` for this read's object and credential
    /// ([`Engine::begin_origin_fill`]): the hedge's backup when no other ancestor is left. It
    /// answers nobody; this read takes the block when it lands ([`Read::take_landed`]).
    FillFromOrigin {
        /// The block.
        key: BlockKey,
    },
    /// Send `GET url` with `Range: bytes=0-0` and answer with [`Read::handle_probe`].
    Probe {
        /// Upstream URL.
        url: String,
    },
    /// The origin ignores Range: proxy this request verbatim (fetch.md §6). Terminal.
    Passthrough {
        /// Upstream URL.
        url: String,
    },
    /// Send the response head (for a relay: 200 with `X-DART-Node`).
    Respond(Box<ResponseHead>),
    /// Look `key` up in the local store and answer with [`Read::handle_lookup`]: with a
    /// `window`, only those bytes of the block, and only if the stored block has exactly the
    /// window's `block_len` (anything else is answered as a miss); without, the whole block.
    Lookup {
        /// The block.
        key: BlockKey,
        /// The part of the block the read needs, when it is not the whole block.
        window: Option<Window>,
    },
    /// Ask `peer` for block `key` (`GET /peer/v1/block/<key>` with `X-DART-Origin: url` and
    /// `X-DART-Hop: hop`), bounded by the peer client's timeouts, and answer with
    /// [`Read::handle_peer`], handing back `permit`. If the answer never comes (the task is
    /// dropped), the shell must report the permit abandoned ([`Engine::abandon`]).
    /// Boxed ([`PeerAsk`]): the largest action, and every read keeps a queue of actions.
    FetchPeer(Box<PeerAsk>),
    /// Stop the `contender`'s fetch (another contender won the race) and report its permit
    /// abandoned: a loser is never charged as a failure. No answer is expected for it.
    ///
    /// With `run_on`, the read stops waiting on it but the fetch is not stopped: it runs to
    /// its end or its bounds, and its permit records how it ended. This is for a peer a liveness
    /// probe found silent ([`Read::handle_hedge_due`]): the read went on without it, and only
    /// the fetch's own outcome (a failed dial, a head that never came) can open its circuit, so
    /// that the tree replaces it instead of every later block waiting on it first.
    CancelPeer {
        /// The loser.
        contender: Contender,
        /// Let it run on unanswered (see above).
        run_on: bool,
    },
    /// Probe the object at `url` in the background, by a read of its own that serves nobody
    /// ([`Engine::begin_learn`]): its answer teaches the engine the object. No answer to this
    /// read. A relay working under a [`Told`] size emits it, and stores its block only if the
    /// engine then knows that same size and version.
    Learn {
        /// The block the emitting read serves.
        key: BlockKey,
        /// Upstream URL.
        url: String,
    },
    /// Fetch `start..=end` of `url` from the origin (coalesced by the shell's flight table) and
    /// answer with [`Read::handle_fetch`].
    FetchOrigin {
        /// The block being filled.
        key: BlockKey,
        /// Upstream URL.
        url: String,
        /// First byte.
        start: u64,
        /// Last byte (inclusive), already clamped to the object.
        end: u64,
        /// The block's geometry length (`end - start + 1`).
        expected_len: u64,
        /// The object's size as the probe learnt it.
        object_size: u64,
        /// Budget the block is charged to if the flight fills the cache (see [`block_verdict`]).
        class: BlockClass,
    },
    /// Store a validated block (best effort: a refusal never fails the read).
    Store {
        /// The block.
        key: BlockKey,
        /// Its exact bytes.
        data: Bytes,
        /// Budget to charge.
        class: BlockClass,
    },
    /// Store a whole block fetched under a told size ([`Read::set_told`]) once the engine
    /// confirms it ([`Engine::confirms`]: the node's own probe of the object answered with that
    /// size and version), drop it if the answer contradicts it. The shell keeps a bounded number
    /// of such blocks waiting; one it lets go counts as unstored
    /// ([`Engine::note_told_unstored`]).
    StoreWhenConfirmed {
        /// The block.
        key: BlockKey,
        /// Its exact bytes.
        data: Bytes,
        /// Budget to charge.
        class: BlockClass,
        /// What the relay was told.
        told: Box<Told>,
    },
    /// Write these bytes to the client (or requesting peer), in order.
    Emit(Bytes),
    /// The response is complete. Terminal.
    Finish,
    /// The read failed. Terminal.
    Fail(ReadFailure),
}

/// What [`Action::FetchPeer`] asks: a peer, for a block.
#[derive(Debug)]
pub struct PeerAsk {
    /// Which contender this fetch is.
    pub contender: Contender,
    /// Hedging is possible for this fetch: when it has not answered (for a cut-through
    /// fetch: sent its head) this long after it was sent, the shell calls
    /// [`Read::handle_hedge_due`].
    pub hedge_after: Option<std::time::Duration>,
    /// The peer.
    pub peer: PeerRef,
    /// The block.
    pub key: BlockKey,
    /// Upstream URL, for the peer to relay on our behalf.
    pub url: String,
    /// Ask the peer for a block it holds only (`X-DART-Held-Only`): it must not fetch, and
    /// its answer is used only if it names the version this read serves (a neighbour's
    /// ask before the origin).
    pub held_only: bool,
    /// Relay depth to send.
    pub hop: u64,
    /// The block's geometry length; read at most one byte more.
    pub expected_len: u64,
    /// Breaker admission for this request.
    pub permit: Permit<String>,
    /// The object as this read knows it, for a fetch on our behalf: sent with the request
    /// so that a relay that does not know the object can ask its own upstream at once
    /// ([`Told`]). `None` for a held-only ask. Boxed: every read keeps a queue of actions.
    pub told: Option<Box<Told>>,
    /// A relay's fetch: the shell may stream it through (cut-through). When the peer's
    /// 200 head arrives the shell calls [`Read::handle_peer_started`], sends the head this
    /// read then emits, pipes the body to the requester while keeping a copy (at most
    /// `expected_len + 1` bytes), and finally answers [`Read::handle_peer`] with the copy.
    pub cut_through: bool,
}

/// The object a requester names with its relay request (`X-DART-Object-Size`,
/// `X-DART-Object-ETag`, `X-DART-Object-Last-Modified`): its size and the validators of the
/// version it reads. A relay that does not know the object works under it while its own probe is
/// out, so a cold chain of relays asks upstream at once instead of probing the origin one hop
/// after the other; it is never trusted ([`Read::set_told`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Told {
    /// The object's size in bytes.
    pub size: u64,
    /// The version's validators (`etag`, `last_modified`; other fields unset).
    pub meta: ObjectMeta,
}

/// Bytes `start..=end` of a block whose full length is `block_len` (offsets within the block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// First byte, from the block's start.
    pub start: u64,
    /// Last byte (inclusive), from the block's start.
    pub end: u64,
    /// The block's exact geometry length: a stored block of another length is a miss.
    pub block_len: u64,
}

impl Window {
    /// Bytes in the window.
    pub fn len(&self) -> u64 {
        self.end - self.start + 1
    }

    /// Never true: a window holds at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The window's bytes of a whole `block`, if `block` has exactly `block_len` bytes.
    pub fn slice(&self, block: &Bytes) -> Option<Bytes> {
        (block.len() as u64 == self.block_len)
            .then(|| block.slice(self.start as usize..=self.end as usize))
    }
}

/// What may be done with a fetched block (decided identically by a read and by the shell's
/// flight, which fills the cache before it ends so that later readers find the block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Exact length, Range honoured: serve and cache.
    Cache,
    /// Exact length but sliced from a Range-ignoring 200: serve, never cache.
    ServeOnly,
    /// Wrong length or a changed object: serve nothing, cache nothing.
    Reject(ReadError),
}

/// Judges a fetched block of an object of `size` bytes whose geometry length is `expected`.
pub fn block_verdict(size: u64, expected: u64, block: &FetchedBlock) -> Verdict {
    if let Some(total) = block.body.total {
        if total != size && !block.body.range_ignored {
            return Verdict::Reject(ReadError::SizeChanged { known: size, now: total });
        }
    }
    let got = block.data.len() as u64;
    if got != expected {
        return Verdict::Reject(ReadError::BlockLength { block: 0, want: expected, got });
    }
    if block.body.range_ignored {
        Verdict::ServeOnly
    } else {
        Verdict::Cache
    }
}

/// A block being acquired: cache, then upstream peers nearest first, then the origin.
#[derive(Debug)]
struct Job {
    seg: Segment,
    key: BlockKey,
    expected: u64,
    /// The part of the block a look-up asks for (a client read needing less than the block).
    window: Option<Window>,
    upstreams: VecDeque<PeerRef>,
    /// A cut-through relay has committed its head to the upstream peer's stream, or (in
    /// [`State::AwaitFetch`]) the read streams its origin window as it arrives.
    streaming: bool,
    /// Bytes of `seg` a client read streaming its origin window has emitted so far.
    forwarded: u64,
    /// A peer was asked for this block (so a concurrent read may have cached it meanwhile).
    tried_peer: bool,
    /// The store was consulted again after the peers failed, just before the origin.
    rechecked: bool,
    /// The peer fetches in flight for this block, by [`Contender::index`]: the address asked.
    race: [Option<String>; 2],
    /// A hedge fired for this block (win counters are kept only then).
    hedged: bool,
    /// A relay that answered "my upstream is slow" was asked once more for this block.
    asked_again: bool,
    /// The tree ancestors asked for this block ([`Read::launch`]), so that a tree laid again
    /// ([`Read::reroute`]) never asks one twice.
    asked: Vec<String>,
    /// The tree was laid again for this block once its ancestors had failed, or may not be (a
    /// peer answered a block of the wrong length: no other peer is asked for this block).
    rerouted: bool,
    /// A neighbour was asked for this block before the origin (its address), or the engine
    /// had none to ask (`Some(None)`).
    neighbour: Option<Option<String>>,
    /// That neighbour is the home's successor ([`Engine::successor_relay`]).
    successor: bool,
    /// The hedge's backup is an origin fill ([`Action::FillFromOrigin`]).
    origin_backup: bool,
    /// The hedge of a read with no ancestor left but the one asked, or the cold look at a
    /// primary with another ancestor left: a held-only ask of that same peer
    /// ([`Contender::Backup`]), whose answer tells a live peer from a silent one.
    probe: Probe,
    /// The backup in flight is that probe (not a fetch from another ancestor).
    probing: bool,
    /// When the hedge proper of the current primary is due, once a cold look at it
    /// ([`Read::handle_hedge_due`]) has come (`None` until then, and for a node with an
    /// estimate, whose first look is the hedge).
    hedge_at: Option<Instant>,
}

/// When the shell calls [`Read::handle_hedge_due`] again for the same fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeAgain {
    /// Not for this fetch (a new fetch carries its own `hedge_after`).
    Never,
    /// Once the primary's body has stood still for a hedge delay (it was moving, with no
    /// ancestor left): a root that dies mid-body is then probed, instead of the read waiting
    /// out the body's progress bound.
    WhenStill,
    /// At this time: the hedge a cold look postponed.
    At(Instant),
}

/// Where the liveness probe of a hedge with no ancestor left stands
/// ([`Read::handle_hedge_due`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// None was sent.
    None,
    /// Sent, not answered.
    Out,
    /// The peer answered it (any head: it is alive, so its slowness is its upstream's).
    Alive,
    /// It failed to answer (no connection, no head within its bound, or not within
    /// [`probe_wait`]), or a probe found the peer silent lately: the backup went to the origin.
    Silent,
}

impl Job {
    /// Whether `asked` was this block's held-only ask (a neighbour's or the successor's).
    fn asked_held_only(&self, asked: &str) -> bool {
        self.neighbour.as_ref().is_some_and(|n| n.as_deref() == Some(asked))
    }

    fn in_flight(&self) -> bool {
        self.race.iter().any(Option::is_some)
    }

    /// Whether an ancestor other than `asked` is left to ask: with none, a hedge of the fetch
    /// from `asked` is a liveness probe of it ([`Read::handle_hedge_due`]).
    fn ancestor_left(&self, asked: &str) -> bool {
        self.upstreams.iter().any(|p| p.addr != asked)
    }
}

#[derive(Debug)]
enum State {
    AwaitProbe,
    /// A relay's first look at its store, before it knows the object's size.
    AwaitRelayLookup,
    AwaitLookup(Job),
    AwaitPeer(Job),
    AwaitFetch(Job),
    Done,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Client { method: Method, range: Option<Vec<u8>>, conditions: Preconditions },
    Relay { key: BlockKey, fetch: bool, hop: u64 },
}

/// One read: a client's byte range, or a relay serving one whole block to a peer.
///
/// # Driving contract
///
/// Create with [`Engine::begin_read`] (client) or [`Engine::begin_relay`] (peer request that
/// passed [`super::route::relay_check`]). Loop on [`Read::poll_action`] until it returns `None`,
/// carrying out each [`Action`]. Four actions ask a question ([`Action::Probe`],
/// [`Action::Lookup`], [`Action::FetchPeer`], [`Action::FetchOrigin`]): the shell answers with
/// the matching `handle_*` call (passing the same engine and the current time) before polling
/// again. [`Action::Finish`], [`Action::Fail`] and [`Action::Passthrough`] are terminal.
///
/// A missed block is asked of this node's usable tree ancestors nearest first (circuit not
/// open; the breaker admits each request), then the origin. A peer's 404 or failure escalates to
/// the next ancestor at once; a peer's block of the wrong length is never trusted: its circuit
/// opens (hard failure) and the origin is asked. A relay that does not cut through emits its
/// head only once it holds the whole block, so its every failure is a clean status; a
/// cut-through relay commits its head on its upstream's, after which a failure can only
/// truncate. A client read holds its head until its first body bytes: a block's, or the first
/// bytes of an origin window of the read's version passed on as they arrive
/// ([`Read::origin_stream_span`]), after which a failure can only truncate too.
///
/// # Invariants
/// - Emitted bytes are exactly the requested bytes of the object, in order, and their total
///   equals the head's `Content-Length` on success.
/// - A block is offered to the store only with the exact geometry length and never when the
///   origin ignored Range.
/// - Every breaker permit handed out is returned exactly once (by the shell through
///   `handle_peer`, or [`Engine::abandon`]).
/// - Nothing is learnt about an object from a failed probe, nor from what a requester told.
/// - A relay working under a size its requester told ([`Told`]) stores its block, and charges
///   an upstream for a block of the wrong length, only once the engine knows the object (its
///   own probe answered) with that size and version.
pub struct Read {
    url: String,
    object: ObjectId,
    kind: Kind,
    size: u64,
    segments: Option<Segments>,
    head_sent: bool,
    /// The client head, held until the first body bytes are in hand (a failure before then is
    /// a clean status; an object that changed before then is read again).
    pending_head: Option<Box<ResponseHead>>,
    restarts: u8,
    /// The version of the object this read serves (the validators its head names, or a relay's
    /// when it set out): every block it uses must be of it.
    version: Option<Box<ObjectMeta>>,
    /// This read has probed the origin (it never probes twice for one answer).
    probed: bool,
    /// What this read would use if its revalidating probe finds the origin unavailable
    /// (stale-if-error).
    stale: Option<Stale>,
    emitted: u64,
    content_length: u64,
    /// Peers that were slow for an earlier block of this read (no answer within the hedge
    /// delay while a backup won, or a timeout): later blocks ask them last, so a stalled parent
    /// costs a read one wait, not one per block.
    slow_peers: Vec<String>,
    /// A read-ahead read ([`Engine::begin_read_ahead`]): it serves nobody, so it counts in no
    /// block-source or relay statistic (its wire bytes still count).
    ahead: bool,
    /// For a relay that served its block: the block, whose digest ends the response
    /// ([`crate::integrity`]).
    served: Option<Bytes>,
    /// For a relay: the member that asked (`X-DART-Node`), never asked back held-only.
    requester: Option<String>,
    /// An origin fill ([`Engine::begin_origin_fill`]): it asks no peer, only the store and the
    /// origin.
    origin_only: bool,
    /// For a relay: the object as its requester named it ([`Read::set_told`]).
    told: Option<Box<Told>>,
    /// The read works under `told`'s size and version, not under what the engine learnt.
    under_told: bool,
    /// A background probe ([`Engine::begin_learn`]): it ends when the probe answered.
    learn_only: bool,
    state: State,
    out: VecDeque<Action>,
}

impl Read {
    pub(super) fn new(engine: &mut Engine, request: ReadRequest, now: Instant) -> Read {
        let object = engine.identify(&request.url);
        let kind = Kind::Client {
            method: request.method,
            range: request.range,
            conditions: request.conditions,
        };
        let mut read = Read::blank(request.url, object, kind);
        // Join the object's readers at once: the grant is usually back before the first miss.
        engine.reading(&read.object.id, now);
        let fresh = engine.is_fresh(&read.object, now);
        match engine.object(&read.object) {
            Some(ObjectInfo::Sized(size)) if fresh => read.respond(engine, size),
            Some(ObjectInfo::RangeBlind) if fresh => read.passthrough(engine),
            info @ Some(_) => {
                // Known, but no longer trusted: probe again; a new validator drops the old blocks.
                engine.stats.revalidations += 1;
                read.stale = Some(Stale { info, held: None });
                read.probe();
            }
            None => read.probe(),
        }
        read
    }

    /// A registry request proxied verbatim to `url` ([`Engine::begin_proxy`]).
    pub(super) fn proxy(engine: &mut Engine, url: String, method: Method) -> Read {
        let object = engine.identify(&url);
        let kind = Kind::Client { method, range: None, conditions: Preconditions::default() };
        let mut read = Read::blank(url, object, kind);
        engine.stats.proxied += 1;
        read.out.push_back(Action::Passthrough { url: read.url.clone() });
        read.state = State::Done;
        read
    }

    pub(super) fn relay(engine: &mut Engine, key: BlockKey, url: Option<String>, hop: u64) -> Read {
        let fetch = url.is_some();
        Read::relay_as(engine, key, url.unwrap_or_default(), fetch, hop)
    }

    /// A relay of `key` of the object at `url` that serves only a block it holds
    /// (`X-DART-Held-Only`), and only while it knows the object's version.
    pub(super) fn relay_held(engine: &mut Engine, key: BlockKey, url: String, hop: u64) -> Read {
        Read::relay_as(engine, key, url, false, hop)
    }

    /// A background probe of the object at `url` ([`Action::Learn`]): it serves nobody, counts
    /// in no block statistic, and ends when the probe answered (an error too: it only teaches).
    pub(super) fn learn(engine: &mut Engine, key: BlockKey, url: String) -> Read {
        let object = engine.identify(&url);
        let mut read = Read::blank(url, object, Kind::Relay { key, fetch: true, hop: 0 });
        read.ahead = true;
        read.learn_only = true;
        read.probe();
        read
    }

    fn relay_as(engine: &mut Engine, key: BlockKey, url: String, fetch: bool, hop: u64) -> Read {
        let object = engine.identify(&url);
        let mut read = Read::blank(url, object, Kind::Relay { key, fetch, hop });
        read.out.push_back(Action::Lookup { key, window: None });
        read.state = State::AwaitRelayLookup;
        read
    }

    fn blank(url: String, object: ObjectId, kind: Kind) -> Read {
        Read {
            url,
            object,
            kind,
            size: 0,
            segments: None,
            head_sent: false,
            pending_head: None,
            restarts: 0,
            version: None,
            probed: false,
            stale: None,
            emitted: 0,
            content_length: 0,
            slow_peers: Vec::new(),
            ahead: false,
            served: None,
            requester: None,
            origin_only: false,
            told: None,
            under_told: false,
            learn_only: false,
            state: State::AwaitProbe,
            out: VecDeque::new(),
        }
    }

    /// Names the member this relay serves: the read never asks it back held-only (it asked
    /// because it does not hold the block).
    pub fn set_requester(&mut self, member: Option<String>) {
        self.requester = member;
    }

    /// Names the object as this relay's requester told it ([`Told`]). Used only while this
    /// node does not know the object: the relay then asks upstream (its peer ancestors, or the
    /// origin for a tree's root) at once under the told size and version and probes in the
    /// background ([`Action::Learn`]), instead of probing before it asks. What it was told is never
    /// trusted: the engine learns nothing from it, the block is stored only if the engine
    /// learnt the same size and version (a block whole before then waits for the answer,
    /// [`Action::StoreWhenConfirmed`]), an upstream is charged for a block of the wrong length
    /// only then, and an origin window read under it (a tree's root, or a relay whose peers
    /// failed) is used only if its own answer (total, validators) agrees with what it was told;
    /// once the probe contradicts it, the relay declines. The requester checks every byte it
    /// gets against its own knowledge, as it does every relay's.
    pub fn set_told(&mut self, told: Option<Told>) {
        self.told = told.map(Box::new);
    }

    /// The object's identity.
    pub fn object(&self) -> &ObjectId {
        &self.object
    }

    /// The version of the object this read serves, once it knows: the validators its head names
    /// (a relay's: those it knew when it set out). A block of another version must never join
    /// it; the shell refuses peer answers and origin windows that name another.
    pub fn version(&self) -> Option<&ObjectMeta> {
        self.version.as_deref()
    }

    pub(super) fn set_ahead(&mut self) {
        self.ahead = true;
    }

    pub(super) fn set_origin_only(&mut self) {
        self.origin_only = true;
    }

    /// Adds one to a block-source or relay statistic, unless this is a read-ahead read.
    fn count(&self, stat: &mut u64) {
        if !self.ahead {
            *stat += 1;
        }
    }

    /// The URL this read asks the origin (and peers, on its behalf) with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Up to `n` blocks of a client `GET` after the one it is acquiring now, in order (none for
    /// a relay, a `HEAD`, or a read that is not acquiring a block).
    pub fn blocks_ahead(&self, n: usize) -> Vec<u64> {
        let get = matches!(self.kind, Kind::Client { method: Method::Get, .. });
        let acquiring = matches!(
            self.state,
            State::AwaitLookup(_) | State::AwaitPeer(_) | State::AwaitFetch(_)
        );
        match (&self.segments, get && acquiring) {
            (Some(segments), true) => segments.clone().take(n).map(|s| s.block_index).collect(),
            _ => Vec::new(),
        }
    }

    /// Whether the node no longer reads this read's version: it learnt another, or forgot the
    /// object because it changed. The store holds blocks of the node's version only, so such a
    /// read must not take a block from it.
    fn outdated(&self, engine: &Engine) -> bool {
        let Some(version) = &self.version else { return false };
        if engine.is_immutable(&self.object) {
            return false;
        }
        match engine.meta_of(&self.object.id) {
            Some(known) => known.same_version(version) == Some(false),
            None => version.etag.is_some() || version.last_modified.is_some(),
        }
    }

    /// The object changed under this read: it starts over if nothing was committed, else fails
    /// (a committed response is cut short, never completed with another version's bytes).
    fn changed(&mut self) {
        if self.can_restart() {
            self.restart();
        } else {
            self.fail(ReadError::Origin(OriginError::Changed));
        }
    }

    /// The validators a relay's head names: those of the version it serves.
    fn head_meta(&self, engine: &Engine) -> ObjectMeta {
        match &self.version {
            Some(v) => ObjectMeta::clone(v),
            None => engine.meta_of(&self.object.id).cloned().unwrap_or_default(),
        }
    }

    /// The next action, or `None` while waiting for an answer or after a terminal action.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// True once a terminal action was emitted.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// For a relay that finished: the block it served, whose digest ends its response.
    pub fn served_block(&self) -> Option<&Bytes> {
        self.served.as_ref()
    }

    fn is_relay(&self) -> bool {
        matches!(self.kind, Kind::Relay { .. })
    }

    fn probe(&mut self) {
        self.out.push_back(Action::Probe { url: self.url.clone() });
        self.state = State::AwaitProbe;
    }

    /// The answer to [`Action::Probe`]: the classified origin response or the failure.
    pub fn handle_probe(
        &mut self,
        engine: &mut Engine,
        answer: Result<ProbeOutcome, OriginError>,
        now: Instant,
    ) {
        assert!(matches!(self.state, State::AwaitProbe), "probe answer out of turn");
        self.probed = true;
        if self.learn_only {
            if let Ok(outcome) = answer {
                engine.stats.probes += 1;
                engine.learn(&self.object, outcome);
            }
            return self.finish();
        }
        match answer {
            Ok(outcome) => {
                engine.stats.probes += 1;
                engine.learn(&self.object, outcome);
                match (outcome, &self.kind) {
                    (ProbeOutcome::Size(size), Kind::Client { .. }) => self.respond(engine, size),
                    (ProbeOutcome::Size(_), Kind::Relay { key, .. }) => {
                        // Now that the object (and its version) is known, the store again: a
                        // block held before the probe is served only if it is still this version
                        // (a changed object's blocks were dropped with the probe's answer).
                        let key = *key;
                        self.out.push_back(Action::Lookup { key, window: None });
                        self.state = State::AwaitRelayLookup;
                        let _ = now;
                    }
                    (ProbeOutcome::RangeBlind { .. }, Kind::Client { .. }) => {
                        self.passthrough(engine)
                    }
                    (ProbeOutcome::RangeBlind { .. }, Kind::Relay { .. }) => {
                        engine.stats.relay_declined += 1;
                        self.fail(ReadError::NotHeld);
                    }
                }
            }
            Err(e) if e.is_unavailable() && self.stale.is_some() => self.use_stale(engine, e, now),
            Err(e) => self.fail(e.into()),
        }
    }

    /// The revalidating probe found the origin unavailable: go on with what was known
    /// (stale-if-error), as a cache should while its origin is down.
    fn use_stale(&mut self, engine: &mut Engine, error: OriginError, now: Instant) {
        let Stale { info, held } = self.stale.take().expect("a stale read");
        match (info, held, &self.kind) {
            (Some(ObjectInfo::Sized(size)), _, Kind::Client { .. }) => {
                engine.stats.stale_served += 1;
                self.respond(engine, size);
            }
            (Some(ObjectInfo::RangeBlind), _, Kind::Client { .. }) => self.passthrough(engine),
            (_, Some(held), Kind::Relay { .. }) => {
                engine.stats.stale_served += 1;
                let _ = now;
                self.relay_serve(engine, held);
            }
            (None, _, _) | (_, None, Kind::Relay { .. }) => self.fail(error.into()),
        }
    }

    /// A relay answers with a block it holds.
    fn relay_serve(&mut self, engine: &mut Engine, data: Bytes) {
        self.count(&mut engine.stats.relay_served);
        let len = data.len() as u64;
        self.head_sent = true;
        self.content_length = len;
        // A held block is of the version the node reads now.
        let meta = engine.meta_of(&self.object.id).cloned().unwrap_or_default();
        self.version = Some(Box::new(meta.clone()));
        self.out.push_back(Action::Respond(Box::new(ResponseHead {
            status: 200,
            content_length: len,
            content_range: None,
            meta,
        })));
        self.emitted = len;
        self.served = Some(data.clone());
        self.out.push_back(Action::Emit(data));
        self.finish();
    }

    /// The answer to [`Action::Lookup`]: the cached bytes, if any.
    pub fn handle_lookup(&mut self, engine: &mut Engine, cached: Option<Bytes>, now: Instant) {
        match std::mem::replace(&mut self.state, State::Done) {
            State::AwaitRelayLookup => self.relay_lookup(engine, cached, now),
            State::AwaitLookup(_) if cached.is_some() && self.outdated(engine) => self.changed(),
            State::AwaitLookup(mut job) => match cached {
                Some(data) if job.window.is_some_and(|w| data.len() as u64 == w.len()) => {
                    self.count(&mut engine.stats.block_source_cache);
                    self.commit_head();
                    self.emitted += data.len() as u64;
                    engine.stats.client_bytes += data.len() as u64;
                    self.out.push_back(Action::Emit(data));
                    self.next_block(engine);
                }
                Some(data) if job.window.is_none() && data.len() as u64 == job.expected => {
                    self.count(&mut engine.stats.block_source_cache);
                    self.deliver(engine, job.seg, &data);
                }
                Some(_) | None => {
                    // The look-again before the origin finds the same short block: it was
                    // counted when this read first met it.
                    if cached.is_some() && !job.rechecked {
                        engine.stats.cache_corrupt += 1;
                    }
                    if !job.rechecked {
                        job.upstreams = self.ordered_upstreams(engine, job.key, now);
                    }
                    self.next_source(engine, job, now);
                }
            },
            other => panic!("lookup answer out of turn: {other:?}"),
        }
    }

    fn relay_lookup(&mut self, engine: &mut Engine, cached: Option<Bytes>, now: Instant) {
        let Kind::Relay { fetch, key, .. } = self.kind else { unreachable!("relay state") };
        let known = engine.object(&self.object);
        // With an origin URL, a held block is served only for a known version that is still
        // trusted: otherwise probe first (the answer drops a changed object's blocks) and look
        // again.
        if fetch && cached.is_some() && !self.probed && !engine.is_fresh(&self.object, now) {
            if known.is_some() {
                engine.stats.revalidations += 1;
            }
            self.stale = Some(Stale { info: known, held: cached });
            return self.probe();
        }
        // When the object's size is known, a cached block of the wrong length (disk corruption)
        // is treated as a miss rather than served; requesters would refuse it anyway.
        let cached = match (cached, known) {
            (Some(data), Some(ObjectInfo::Sized(size)))
                if engine.config.geometry.block_len(size, key.block) != Some(data.len() as u64) =>
            {
                engine.stats.cache_corrupt += 1;
                None
            }
            (cached, _) => cached,
        };
        // A held-only relay names the version it holds: one whose object it does not know
        // (evicted, or held from an earlier process) is not served for a mutable object.
        let unversioned =
            !fetch && !self.url.is_empty() && known.is_none() && !engine.is_immutable(&self.object);
        let cached = if unversioned { None } else { cached };
        match cached {
            Some(data) => self.relay_serve(engine, data),
            None if !fetch => {
                engine.stats.relay_declined += 1;
                self.fail(ReadError::NotHeld);
            }
            None => match known {
                Some(ObjectInfo::Sized(size)) => self.relay_job(engine, size, now),
                Some(ObjectInfo::RangeBlind) => {
                    engine.stats.relay_declined += 1;
                    self.fail(ReadError::NotHeld);
                }
                None => self.relay_told(engine, now),
            },
        }
    }

    /// A relay of an object this node does not know: with a size its requester told that fits
    /// the block, it goes on at once under what it was told (its peer ancestors, or the origin
    /// for a tree's root) and probes in the background ([`Read::set_told`]); else it probes
    /// first.
    fn relay_told(&mut self, engine: &mut Engine, now: Instant) {
        let Kind::Relay { key, .. } = self.kind else { unreachable!("relay state") };
        let usable = self
            .told
            .as_ref()
            .is_some_and(|t| engine.config.geometry.block_len(t.size, key.block).is_some());
        if !usable {
            return self.probe();
        }
        let size = self.told.as_ref().expect("checked above").size;
        engine.stats.relay_told += 1;
        self.out.push_back(Action::Learn { key, url: self.url.clone() });
        self.under_told = true;
        self.relay_job(engine, size, now);
    }

    /// What a requester told is not what this node learnt: the relay declines, and the
    /// requester goes on from its own knowledge.
    fn refuse_told(&mut self, engine: &mut Engine) {
        engine.stats.relay_told_refused += 1;
        engine.stats.relay_declined += 1;
        self.fail(ReadError::NotHeld);
    }

    /// For a read under a told size ([`Read::set_told`]): whether the engine now knows the
    /// object with that size and version (`Some(true)`), knows it otherwise (`Some(false)`),
    /// or does not know it yet (`None`). `Some(true)` for a read not under one.
    fn told_confirmed(&self, engine: &Engine) -> Option<bool> {
        if !self.under_told {
            return Some(true);
        }
        let told = self.told.as_ref().expect("a read under a told size was told one");
        engine.confirms(&self.object, told)
    }

    /// How an upstream's block of the wrong length is charged: a hard failure (its circuit
    /// opens), unless the length was only told and the engine has not confirmed it: then the
    /// requester may have lied, and an honest upstream is not charged for it.
    fn length_outcome(&self, engine: &mut Engine) -> Outcome {
        if self.told_confirmed(engine) == Some(true) {
            return Outcome::HardFailure(HardReason::Validation);
        }
        engine.stats.relay_told_refused += 1;
        Outcome::Abandoned
    }

    /// Offers a whole block to the store. Under a told size ([`Read::told_confirmed`]): at
    /// once if the engine confirmed it, when it does if its probe has not answered yet
    /// ([`Action::StoreWhenConfirmed`]: a block from a warm parent is most often whole before
    /// the origin answers), never if it contradicts it.
    fn store(&mut self, engine: &mut Engine, key: BlockKey, data: Bytes) {
        let class = engine.class_of(&key);
        match self.told_confirmed(engine) {
            Some(true) => self.out.push_back(Action::Store { key, data, class }),
            None => {
                let told = self.told.clone().expect("a read under a told size was told one");
                self.out.push_back(Action::StoreWhenConfirmed { key, data, class, told });
            }
            Some(false) => engine.stats.relay_told_unstored += 1,
        }
    }

    fn relay_job(&mut self, engine: &mut Engine, size: u64, now: Instant) {
        let Kind::Relay { key, .. } = self.kind else { unreachable!("relay state") };
        self.size = size;
        let geometry = engine.config.geometry;
        let Some(expected) = geometry.block_len(size, key.block) else {
            engine.stats.relay_declined += 1;
            return self.fail(ReadError::NotHeld);
        };
        let start = geometry.block_start(key.block).expect("block_len checked the index");
        let seg = Segment {
            chunk_index: geometry.chunk_of_block(key.block),
            block_index: key.block,
            from: start,
            to: start + expected - 1,
        };
        self.content_length = expected;
        self.version = match (&self.told, self.under_told) {
            (Some(told), true) => Some(Box::new(told.meta.clone())),
            _ => engine.meta_of(&self.object.id).cloned().map(Box::new),
        };
        // The store was already consulted: go straight to the upstreams.
        let upstreams = self.ordered_upstreams(engine, key, now);
        self.next_source(
            engine,
            Job {
                seg,
                key,
                expected,
                window: None,
                upstreams,
                streaming: false,
                forwarded: 0,
                tried_peer: false,
                rechecked: false,
                race: [None, None],
                hedged: false,
                asked_again: false,
                asked: Vec::new(),
                rerouted: false,
                neighbour: None,
                successor: false,
                origin_backup: false,
                probe: Probe::None,
                probing: false,
                hedge_at: None,
            },
            now,
        );
    }

    fn hop(&self) -> u64 {
        match self.kind {
            Kind::Client { .. } => 0,
            Kind::Relay { hop, .. } => hop,
        }
    }

    /// Asks the next upstream the breaker admits as `contender`; false if none did.
    fn launch(
        &mut self,
        engine: &mut Engine,
        job: &mut Job,
        contender: Contender,
        now: Instant,
    ) -> bool {
        while let Some(peer) = job.upstreams.pop_front() {
            if job.race.iter().flatten().any(|a| *a == peer.addr) {
                continue; // never race one address against itself
            }
            let Some(permit) = engine.admit(&peer.addr, now) else {
                engine.stats.peer_skipped_open += 1;
                continue;
            };
            job.tried_peer = true;
            job.asked.push(peer.addr.clone());
            // Every primary carries the hedge timer: with another ancestor left, the backup
            // goes there (a node without an estimate looks first, after the cold probe delay);
            // with none, `handle_hedge_due` probes this one before the origin.
            let hedge_after = match contender {
                Contender::Primary => engine.probe_delay(),
                Contender::Backup => None,
            };
            if contender == Contender::Primary {
                engine.on_peer_fetch();
                job.hedge_at = None;
            }
            job.race[contender.index()] = Some(peer.addr.clone());
            self.ask_peer(engine, job, contender, hedge_after, peer, permit, false);
            return true;
        }
        false
    }

    /// The primary fetch of this block has not answered within the hedge delay: race a backup at
    /// the next usable ancestor if the hedge budget allows. A stale call (the race moved on) does
    /// nothing.
    ///
    /// With no ancestor left but the one asked (this node is a child of the chunk's root, or
    /// every other ancestor's circuit is open), the backup would be the origin, which a healthy
    /// root is most likely reading for this very window already (its head waits on the
    /// origin's): racing it there would make the origin serve the window twice. A primary whose
    /// head came and whose body moved within the last hedge delay (`primary_moving`, the shell's
    /// word) is a live peer on a slow path: the read keeps waiting, and a body that stops moving
    /// is cut off by its progress bound. Otherwise the hedge first asks that peer held-only,
    /// which needs no upstream and is answered at once by a live peer (a miss, or the block if it
    /// landed meanwhile). An answer of any kind means the peer is alive: the read keeps waiting on
    /// the primary. No answer (a failed dial or connection, or nothing within a quarter of a
    /// hedge delay, [`probe_wait`], when this is called again) means it is not: the backup is an
    /// origin fill of this node ([`Action::FillFromOrigin`]), whose block the read takes when
    /// it lands.
    ///
    /// With another ancestor left, while the node has no estimate yet (the hedge delay is the
    /// cold [`hedge::COLD_DELAY`]), the first call comes after [`hedge::COLD_PROBE_DELAY`] and is
    /// a look, not the hedge: a primary whose head has not come is probed as above; unanswered,
    /// the peer is silent and the backup goes to the next ancestor at once, spending no hedge
    /// credit (a failover from a failed peer, not a hedge); answered, or with its body moving,
    /// the hedge proper waits for the rest of the cold delay ([`HedgeAgain::At`]). A stalled
    /// peer met in a node's first seconds so costs a probe delay and a probe wait, not the whole
    /// cold delay, and a slow but live one (an upstream slow to answer) is hedged no earlier
    /// than before.
    ///
    /// The answer says when the shell should call this again.
    #[must_use]
    pub fn handle_hedge_due(
        &mut self,
        engine: &mut Engine,
        primary_moving: bool,
        now: Instant,
    ) -> HedgeAgain {
        let State::AwaitPeer(job) = &mut self.state else { return HedgeAgain::Never };
        if job.streaming {
            return HedgeAgain::Never;
        }
        if job.probe == Probe::Out && job.probing {
            // The probe's own delay ran out unanswered.
            let Some(asked) = job.race[Contender::Backup.index()].clone() else {
                return HedgeAgain::Never;
            };
            let mut job = self.take_peer_job();
            self.probe_silent(engine, &mut job, &asked, now);
            self.state = State::AwaitPeer(job);
            return HedgeAgain::Never;
        }
        let ready = job.race[0].is_some() && job.race[1].is_none();
        if !ready || job.hedged {
            return HedgeAgain::Never;
        }
        let Some(primary) = job.race[0].clone() else { return HedgeAgain::Never };
        let ancestor_left = job.ancestor_left(&primary);
        if !ancestor_left && primary_moving {
            return HedgeAgain::WhenStill;
        }
        if ancestor_left {
            if let Some(at) = job.hedge_at.filter(|at| *at > now) {
                // A cold look found the primary alive or moving: the hedge waits until then.
                return HedgeAgain::At(at);
            }
            if job.hedge_at.is_none() && engine.hedge_is_cold() {
                let rest = hedge::COLD_DELAY.saturating_sub(hedge::COLD_PROBE_DELAY);
                let at = now.saturating_add(rest);
                job.hedge_at = Some(at);
                if primary_moving {
                    return HedgeAgain::At(at);
                }
                self.look_at(engine, primary, now);
                return HedgeAgain::Never;
            }
        }
        let silent = !ancestor_left && engine.is_silent(&primary, now);
        // Only a backup at another ancestor spends hedge credit. The probe of the last one is a
        // held-only ask (a live peer answers it at once from its store, with no upstream) and
        // its origin backup follows only a silent peer: a failure, not a hedge. With credit
        // asked of it too, a node that fetches little (a pure relay earns 0.05 of a hedge per
        // fetch) waited out its whole head bound on a dead last ancestor (`dead-root-some-read`
        // seed 2: 0.72 s, the chain of readers below it with it).
        if ancestor_left && !engine.try_hedge() {
            // No credit for a backup: look at the primary instead, once per block (a held-only
            // liveness probe spends none), and leave a silent one for the next ancestor at once,
            // as a failed peer is left. Without the look, a node that reads little (it earns 0.05
            // of a hedge per fetch) waited out its whole head bound on a stalled parent
            // (`tail-at-scale`'s slowest reads: 1.0 s each, with another ancestor at hand).
            if primary_moving {
                return HedgeAgain::WhenStill;
            }
            if job.probe == Probe::None {
                self.look_at(engine, primary, now);
            }
            return HedgeAgain::Never;
        }
        let mut job = self.take_peer_job();
        if ancestor_left {
            if self.launch(engine, &mut job, Contender::Backup, now) {
                job.hedged = true;
                engine.stats.hedge_fired += 1;
            }
        } else if silent {
            // A probe found this peer silent lately: no second probe (and no hedge credit, which
            // its first one may have spent), the member that replaces it or the origin at once.
            job.hedged = true;
            engine.stats.hedge_fired += 1;
            if self.relay_without(engine, &mut job, &primary, now) {
                self.fail_over_silent(engine, &mut job, &primary, now);
            } else {
                self.origin_backup(engine, &mut job, &primary, now);
            }
        } else {
            self.send_probe(engine, &mut job, primary, now);
        }
        self.state = State::AwaitPeer(job);
        HedgeAgain::Never
    }

    /// Looks at `primary`, slow with another ancestor left: leaves it for that ancestor at once
    /// if it was found silent lately, else sends it the liveness probe ([`Read::send_probe`]).
    fn look_at(&mut self, engine: &mut Engine, primary: String, now: Instant) {
        let mut job = self.take_peer_job();
        if engine.is_silent(&primary, now) {
            self.fail_over_silent(engine, &mut job, &primary, now);
        } else {
            self.send_probe(engine, &mut job, primary, now);
        }
        self.state = State::AwaitPeer(job);
    }

    fn take_peer_job(&mut self) -> Job {
        match std::mem::replace(&mut self.state, State::Done) {
            State::AwaitPeer(job) => job,
            _ => unreachable!("a read waiting on peers"),
        }
    }

    /// Sends the liveness probe of [`Read::handle_hedge_due`]: a held-only ask of `addr` (the
    /// primary's peer) as the backup, with [`probe_wait`] to answer in. When the breaker
    /// refuses it, the peer counts as silent at once (its circuit just turned). The probe of a
    /// primary with another ancestor left (a cold look) is not the hedge: the hedge may follow.
    fn send_probe(&mut self, engine: &mut Engine, job: &mut Job, addr: String, now: Instant) {
        job.hedged = !job.ancestor_left(&addr);
        engine.stats.hedge_fired += 1;
        engine.stats.hedge_probes += 1;
        let Some(permit) = engine.admit(&addr, now) else {
            return self.probe_silent(engine, job, &addr, now);
        };
        job.probe = Probe::Out;
        job.probing = true;
        job.race[Contender::Backup.index()] = Some(addr.clone());
        let id = engine.upstream_ref(job.key, &self.object.id, &addr, now).map(|p| p.id);
        let peer = PeerRef { id: id.unwrap_or_default(), addr };
        let hedge_after = engine.hedge_delay().map(probe_wait);
        self.ask_peer(engine, job, Contender::Backup, hedge_after, peer, permit, true);
    }

    /// Emits the ask of `peer` for `job`'s block as `contender` ([`Action::FetchPeer`]).
    #[allow(clippy::too_many_arguments)]
    fn ask_peer(
        &mut self,
        engine: &Engine,
        job: &Job,
        contender: Contender,
        hedge_after: Option<std::time::Duration>,
        peer: PeerRef,
        permit: Permit<String>,
        held_only: bool,
    ) {
        self.out.push_back(Action::FetchPeer(Box::new(PeerAsk {
            contender,
            hedge_after,
            peer,
            key: job.key,
            url: self.url.clone(),
            held_only,
            hop: self.hop(),
            expected_len: job.expected,
            permit,
            told: (!held_only && self.size > 0).then(|| {
                Box::new(Told {
                    size: self.size,
                    meta: self.version.as_deref().map(ObjectMeta::validators).unwrap_or_default(),
                })
            }),
            cut_through: self.is_relay() && engine.config.cut_through,
        })));
    }

    /// The probe of `addr`, the primary's peer, went unanswered (or failed): with another
    /// ancestor left, the backup goes there ([`Read::fail_over_silent`]); with none, to the
    /// origin ([`Read::origin_backup`]).
    fn probe_silent(&mut self, engine: &mut Engine, job: &mut Job, addr: &str, now: Instant) {
        if job.ancestor_left(addr) || self.relay_without(engine, job, addr, now) {
            self.fail_over_silent(engine, job, addr, now);
        } else {
            self.origin_backup(engine, job, addr, now);
        }
    }

    /// The last ancestor `addr` is silent: lays the tree again without it (the node notes it
    /// silent, and trees are laid around silent members as around dead ones), once per block,
    /// and queues the ancestors of the new tree this block has not asked (the member that
    /// replaces a silent root, for its children); false when there is none (this node is the one
    /// that replaces it, or no other member is usable). Without this every child of a silent root
    /// filled the same window from the origin (`dead-root`: 33-36 range requests for 32
    /// windows; `reference`, a stalled member's chunks read twice).
    fn relay_without(
        &mut self,
        engine: &mut Engine,
        job: &mut Job,
        addr: &str,
        now: Instant,
    ) -> bool {
        if job.rerouted {
            return false;
        }
        engine.note_silent(addr, now);
        // (`addr` is among those asked: it is the primary.)
        let upstreams = self.unasked_upstreams(engine, job, now);
        if upstreams.is_empty() {
            return false;
        }
        job.rerouted = true;
        job.upstreams = upstreams;
        engine.stats.peer_reroutes += 1;
        true
    }

    /// The ancestors of `job`'s block in the tree as laid now (silent members and open circuits
    /// left out), nearest first, without those this block asked already.
    fn unasked_upstreams(
        &mut self,
        engine: &mut Engine,
        job: &Job,
        now: Instant,
    ) -> VecDeque<PeerRef> {
        let mut upstreams = self.ordered_upstreams(engine, job.key, now);
        upstreams.retain(|p| !job.asked.contains(&p.addr));
        upstreams
    }

    /// The primary's peer `addr` is silent and another ancestor is left: the backup goes to it
    /// at once, with no hedge credit (a failover from a failed peer), and the probe, if out, runs
    /// on unanswered to record how the peer ends. The node remembers `addr` silent and slow, so
    /// the next blocks ask it last and trees are laid around it. With no ancestor admitted after
    /// all, the backup is an origin fill.
    fn fail_over_silent(&mut self, engine: &mut Engine, job: &mut Job, addr: &str, now: Instant) {
        job.probe = Probe::Silent;
        job.hedged = true;
        engine.note_silent(addr, now);
        self.mark_slow(engine, addr.to_owned(), now);
        if job.probing {
            self.cancel_contender(job, Contender::Backup, true);
        }
        if self.launch(engine, job, Contender::Backup, now) {
            engine.stats.hedge_probe_failovers += 1;
            engine.stats.peer_failover += 1;
        } else {
            self.origin_backup(engine, job, addr, now);
        }
    }

    /// The probe's peer `addr` is silent: an origin fill of this node that answers nobody races
    /// the primary. When it stores the block, this read takes it ([`Read::take_landed`]); if
    /// the primary wins first, the fill still fills the cache. At most once per block. The node
    /// remembers `addr` silent ([`Engine::note_silent`]).
    fn origin_backup(&mut self, engine: &mut Engine, job: &mut Job, addr: &str, now: Instant) {
        job.probe = Probe::Silent;
        engine.note_silent(addr, now);
        if job.origin_backup {
            return;
        }
        job.origin_backup = true;
        engine.stats.hedge_origin += 1;
        self.out.push_back(Action::FillFromOrigin { key: job.key });
    }

    /// The answer to the liveness probe ([`Read::send_probe`]), the backup of `job`.
    fn probe_answered(
        &mut self,
        engine: &mut Engine,
        mut job: Job,
        permit: Option<Permit<String>>,
        observation: Observation,
        asked: String,
        now: Instant,
    ) {
        let silent = matches!(
            observation,
            Observation::DialFailed | Observation::TimedOut | Observation::BodyInterrupted
        );
        settle(engine, permit, peer_outcome(observation, true), now);
        if silent {
            if job.probe == Probe::Out {
                self.probe_silent(engine, &mut job, &asked, now);
            }
            self.mark_slow(engine, asked, now);
        } else {
            engine.forget_silent(&asked);
            if job.probe == Probe::Out {
                job.probe = Probe::Alive;
                engine.stats.hedge_probes_alive += 1;
            }
        }
        // Nothing else in flight (the primary failed meanwhile): on to the next source.
        self.next_source(engine, job, now);
    }

    /// The usable ancestors to ask for `key`, nearest first, those found slow (by this read, or
    /// lately by any read of the node) after the others. Stable: the tree order holds among the
    /// fast and among the slow.
    fn ordered_upstreams(
        &self,
        engine: &mut Engine,
        key: BlockKey,
        now: Instant,
    ) -> VecDeque<PeerRef> {
        if self.origin_only {
            return VecDeque::new();
        }
        if matches!(self.kind, Kind::Client { .. }) {
            // A relay reads on another's behalf: it routes over the reader set it has, and
            // never joins one.
            engine.reading(&self.object.id, now);
        }
        let mut upstreams = engine.upstreams(key, &self.object.id, now);
        upstreams
            .sort_by_key(|p| self.slow_peers.contains(&p.addr) || engine.is_slow(&p.addr, now));
        upstreams.into()
    }

    /// `addr` was slow for this read: later blocks ask it last, and so do the node's other
    /// reads for a while ([`Engine::note_slow`]).
    fn mark_slow(&mut self, engine: &mut Engine, addr: String, now: Instant) {
        engine.note_slow(&addr, now);
        if !self.slow_peers.contains(&addr) {
            self.slow_peers.push(addr);
        }
    }

    /// Stops every contender still in flight (the race is over). Those asking a peer a probe
    /// found silent run on, unanswered, to record how they end ([`Action::CancelPeer`]).
    fn cancel_race(&mut self, job: &mut Job) {
        let run_on = job.probe == Probe::Silent;
        for contender in [Contender::Primary, Contender::Backup] {
            self.cancel_contender(job, contender, run_on);
        }
    }

    /// Stops `contender` if it is in flight ([`Action::CancelPeer`]; `run_on`: its fetch runs
    /// on, unanswered, to record how the peer answers).
    fn cancel_contender(&mut self, job: &mut Job, contender: Contender, run_on: bool) {
        if contender == Contender::Backup {
            job.probing = false;
        }
        if job.race[contender.index()].take().is_some() {
            self.out.push_back(Action::CancelPeer { contender, run_on });
        }
    }

    /// Tries the next upstream peer the breaker admits, else the origin. With a contender still
    /// in flight it waits for that one instead (a failover never launches twice).
    fn next_source(&mut self, engine: &mut Engine, mut job: Job, now: Instant) {
        if job.in_flight() {
            self.state = State::AwaitPeer(job);
            return;
        }
        if self.launch(engine, &mut job, Contender::Primary, now)
            || self.reroute(engine, &mut job, now)
        {
            self.state = State::AwaitPeer(job);
            return;
        }
        if job.tried_peer && !job.rechecked {
            // While the peers failed, a concurrent read may have cached the block: look again
            // before paying the origin.
            job.rechecked = true;
            self.out.push_back(Action::Lookup { key: job.key, window: job.window });
            self.state = State::AwaitLookup(job);
            return;
        }
        match self.told_confirmed(engine) {
            Some(true) => self.under_told = false,
            // Its own probe not back: to the origin under what it was told. The window's own
            // answer names the total and the validators, so a size or version the origin did
            // not give fails the read (`block_verdict`, the version check of the window) and
            // nothing is cached under it (`store`, and the flight's fill needs the engine to
            // know the version).
            None => {}
            Some(false) => return self.refuse_told(engine),
        }
        if job.neighbour.is_none() && !self.origin_only {
            // About to pay the origin: a neighbour may hold the block (spec/overlay.md §5).
            let asked = self.ask_neighbour(engine, &mut job, now);
            let done = asked.is_some();
            job.neighbour = Some(asked);
            if done {
                self.state = State::AwaitPeer(job);
                return;
            }
        }
        let start = job.seg.block_index * engine.config.geometry.block_bytes();
        self.out.push_back(Action::FetchOrigin {
            key: job.key,
            url: self.url.clone(),
            start,
            end: start + job.expected - 1,
            expected_len: job.expected,
            object_size: self.size,
            class: engine.class_of(&job.key),
        });
        self.state = State::AwaitFetch(job);
    }

    /// Every ancestor asked for this block failed: lays the tree again, once per block, and asks
    /// the first ancestor it has that was not asked yet; false when there is none.
    ///
    /// An ancestor whose dial failed has an open circuit now, and the tree laid without it puts
    /// the member that replaces it above this node ([`crate::engine::route::Placement::upstreams`]).
    /// Without this step each child of a dead home read the origin on its own, the first time it
    /// met the home dead, where the replacement was fetching the same block for the others
    /// (`second-herd-dead-owner`: block 0 sent twice or more on every seed). The replacement
    /// is better ranked than this node in the new tree, as every ancestor is, so no cycle.
    fn reroute(&mut self, engine: &mut Engine, job: &mut Job, now: Instant) -> bool {
        if job.rerouted || job.asked.is_empty() {
            return false;
        }
        job.rerouted = true;
        let upstreams = self.unasked_upstreams(engine, job, now);
        if upstreams.is_empty() {
            return false;
        }
        job.upstreams = upstreams;
        let asked = self.launch(engine, job, Contender::Primary, now);
        if asked {
            engine.stats.peer_reroutes += 1;
        }
        asked
    }

    /// Asks one reliable neighbour for the block it holds (held-only: it never fetches, so it
    /// cannot ask this node back, and it names the version it holds), before the origin;
    /// answers the address asked, or `None` when there is no neighbour to ask
    /// (`Engine::neighbour_relay`) or its circuit refused.
    fn ask_neighbour(
        &mut self,
        engine: &mut Engine,
        job: &mut Job,
        now: Instant,
    ) -> Option<String> {
        debug_assert!(!job.in_flight(), "the origin is next: nothing is in flight");
        let (peer, successor) = match engine.neighbour_relay(job.key, &self.object.id, now) {
            Some(peer) => (peer, false),
            // Only for this node's own reads (and their read-ahead): a relay read at the home
            // serves the tree below it, whose every block would pay the ask in a healthy herd.
            None if !self.is_relay() || self.ahead => {
                let requester = self.requester.as_deref();
                (engine.successor_relay(job.key, &self.object.id, requester, now)?, true)
            }
            None => return None,
        };
        if engine.is_slow(&peer.addr, now) {
            // It timed out or lost a race lately: an ask that may be skipped skips it.
            return None;
        }
        let permit = engine.admit(&peer.addr, now)?;
        job.tried_peer = true;
        job.successor = successor;
        if successor {
            engine.stats.successor_asks += 1;
        } else {
            engine.stats.neighbour_asks += 1;
        }
        engine.on_peer_fetch();
        let addr = peer.addr.clone();
        job.race[Contender::Primary.index()] = Some(addr.clone());
        self.ask_peer(engine, job, Contender::Primary, None, peer, permit, true);
        Some(addr)
    }

    /// The bytes of the block (offsets within it, first and last inclusive) this read would
    /// pass on as its origin window arrives, if it may stream the window (it acquires its block
    /// from the origin and has not started): a relay that cuts through, the whole block (its
    /// head is committed on the window's); a client `GET` the part of the block its
    /// range covers, when the window is of the version the read serves (`window`, the
    /// validators on the window's head, name the read's version, or the object is immutable)
    /// and nothing of this block was passed on yet. A window whose version cannot be told is
    /// never streamed to a client: a change found at its end could then only cut the response
    /// short, where a held block lets the read start over.
    ///
    /// A relay streams a window whose head names the object's size as the read knows it (or no
    /// total), and, under a size its requester told ([`Read::set_told`]), a version that is
    /// not another than the one it was told: else it holds the window, and the window's end
    /// refuses it with a clean status instead of a stream cut short.
    pub fn origin_stream_span(
        &self,
        engine: &Engine,
        window: &ObjectMeta,
        total: Option<u64>,
    ) -> Option<(u64, u64)> {
        let State::AwaitFetch(job) = &self.state else { return None };
        if job.streaming || self.ahead {
            return None;
        }
        if self.is_relay() {
            let other_version = self.under_told
                && !engine.is_immutable(&self.object)
                && self.version.as_ref().and_then(|v| v.same_version(window)) == Some(false);
            let other_size = total.is_some_and(|t| t != self.size);
            if other_version || other_size {
                return None;
            }
            return engine.config.cut_through.then(|| (0, job.expected - 1));
        }
        if !matches!(self.kind, Kind::Client { method: Method::Get, .. }) {
            return None;
        }
        if !self.serves_version(engine, window) {
            return None;
        }
        self.client_block_span(engine)
    }

    /// Whether `window`'s validators name the version this read serves (or the object is
    /// immutable): bytes under them may go out before the block they belong to has ended.
    pub fn serves_version(&self, engine: &Engine, window: &ObjectMeta) -> bool {
        engine.is_immutable(&self.object)
            || self.version.as_ref().and_then(|v| v.same_version(window)) == Some(true)
    }

    /// The bytes of the block it waits for (offsets within it, first and last inclusive) that a
    /// client `GET` acquiring its block from the origin would pass on, while none went out yet
    /// (not a read ahead); `None` for any other read. What the span may be streamed from is
    /// [`Read::origin_stream_span`]'s to decide, on a head.
    pub fn client_block_span(&self, engine: &Engine) -> Option<(u64, u64)> {
        let State::AwaitFetch(job) = &self.state else { return None };
        let client_get = matches!(self.kind, Kind::Client { method: Method::Get, .. });
        if job.streaming || self.ahead || !client_get {
            return None;
        }
        let block_start = job.seg.block_index * engine.config.geometry.block_bytes();
        Some((job.seg.from - block_start, job.seg.to - block_start))
    }

    /// This read's origin window answered with the range honoured, and the shell streams it
    /// ([`Read::origin_stream_span`] said which bytes). A relay commits its head now
    /// ([`Action::Respond`]); the shell forwards the window's bytes itself, all but the last
    /// until [`Read::handle_fetch`] proves the length. A client read commits its held head with
    /// the first bytes the shell passes on ([`Read::stream_origin_part`]). After this a failure
    /// only truncates the response.
    pub fn handle_origin_started(&mut self, engine: &mut Engine) {
        let State::AwaitFetch(job) = &mut self.state else {
            panic!("an origin stream out of turn");
        };
        assert!(!job.streaming, "an origin stream starts once");
        job.streaming = true;
        if self.is_relay() {
            assert!(engine.config.cut_through, "only relays that cut through stream");
            self.commit_relay_head(engine);
        } else {
            engine.stats.origin_streams += 1;
        }
    }

    /// The next bytes of a client read's streaming origin window, within its span: they go
    /// out at once ([`Action::Emit`]), after the held head.
    pub fn stream_origin_part(&mut self, engine: &mut Engine, data: Bytes) {
        assert!(!self.is_relay(), "a client read's origin stream");
        let State::AwaitFetch(job) = &mut self.state else {
            panic!("an origin stream part out of turn");
        };
        assert!(job.streaming, "a started origin stream");
        assert!(
            job.forwarded + data.len() as u64 <= job.seg.to - job.seg.from + 1,
            "past the span"
        );
        job.forwarded += data.len() as u64;
        self.commit_head();
        self.emitted += data.len() as u64;
        engine.stats.client_bytes += data.len() as u64;
        engine.stats.origin_streamed_bytes += data.len() as u64;
        self.out.push_back(Action::Emit(data));
    }

    /// Every byte of this client read's span of its streaming origin window went out (the span
    /// ends before the block's last byte, so no length proof is needed for it): the read moves
    /// on without waiting for the rest of the window, which the shell's flight still stores.
    pub fn handle_origin_stream_done(&mut self, engine: &mut Engine) {
        assert!(!self.is_relay(), "a client read's origin stream");
        let State::AwaitFetch(job) = std::mem::replace(&mut self.state, State::Done) else {
            panic!("an origin stream's end out of turn");
        };
        assert!(job.streaming, "a started origin stream");
        assert_eq!(job.forwarded, job.seg.to - job.seg.from + 1, "the whole span went out");
        self.count(&mut engine.stats.block_source_origin);
        self.next_block(engine);
    }

    /// A relay's head: 200, the block's length, the object's validators as the node knows them.
    fn commit_relay_head(&mut self, engine: &Engine) {
        self.head_sent = true;
        let meta = self.head_meta(engine);
        self.out.push_back(Action::Respond(Box::new(ResponseHead {
            status: 200,
            content_length: self.content_length,
            content_range: None,
            meta,
        })));
    }

    /// A relay stream ended with the whole block of its length: it is stored, and the response
    /// ends (its bytes went out as they arrived).
    fn end_stream(&mut self, engine: &mut Engine, key: BlockKey, data: Bytes) {
        self.count(&mut engine.stats.relay_served);
        self.emitted = data.len() as u64;
        self.served = Some(data.clone());
        self.store(engine, key, data);
        self.finish();
    }

    /// A cut-through relay's upstream peer answered 200: commit the head now. The read emits
    /// [`Action::Respond`]; the shell forwards body bytes itself as they arrive, then answers
    /// [`Read::handle_peer`]. After this, a failure can only truncate the response.
    /// `rival_unreached`: the other contender's fetch, if any, has not connected yet (the shell's
    /// word).
    pub fn handle_peer_started(
        &mut self,
        engine: &mut Engine,
        contender: Contender,
        rival_unreached: bool,
        now: Instant,
    ) {
        let State::AwaitPeer(mut job) = std::mem::replace(&mut self.state, State::Done) else {
            panic!("peer stream start out of turn");
        };
        assert!(matches!(self.kind, Kind::Relay { .. }), "only relays cut through");
        assert!(!job.streaming, "a stream starts once");
        assert!(job.race[contender.index()].is_some(), "a stream of a fetch in flight");
        // The first stream to start wins: there is never a second stream.
        let winner = job.race[contender.index()].take();
        if contender == Contender::Backup {
            job.probing = false;
        }
        if contender == Contender::Backup {
            // As when a backup's whole block wins: the primary it beat is remembered slow, so
            // the next blocks ask it after the other ancestors. One the shell had not even
            // reached runs on, unanswered, so that a dead peer is still charged (remembered
            // slow, it is asked last, and its circuit would otherwise never open).
            if let Some(primary) = job.race[Contender::Primary.index()].clone() {
                if Some(&primary) != winner.as_ref() {
                    self.mark_slow(engine, primary, now);
                    if rival_unreached {
                        self.cancel_contender(&mut job, Contender::Primary, true);
                    }
                }
            }
        }
        self.cancel_race(&mut job);
        job.race[contender.index()] = winner;
        if job.hedged {
            match contender {
                Contender::Primary => engine.stats.hedge_primary_won += 1,
                Contender::Backup => engine.stats.hedge_backup_won += 1,
            }
        }
        job.streaming = true;
        self.state = State::AwaitPeer(job);
        self.commit_relay_head(engine);
    }

    /// The answer to [`Action::FetchPeer`], with the permit it carried: `None` when the fetch
    /// was shared with another read of this node (a coalesced peer fetch), whose permit records
    /// the peer's outcome once and whose wire bytes are counted once.
    pub fn handle_peer(
        &mut self,
        engine: &mut Engine,
        contender: Contender,
        permit: Option<Permit<String>>,
        answer: PeerAnswer,
        now: Instant,
    ) {
        let State::AwaitPeer(mut job) = std::mem::replace(&mut self.state, State::Done) else {
            panic!("peer answer out of turn");
        };
        let asked = job.race[contender.index()].take().expect("an answer of a fetch in flight");
        let was_probe = contender == Contender::Backup && std::mem::take(&mut job.probing);
        let shared = permit.is_none();
        if job.streaming {
            debug_assert!(!job.in_flight(), "a stream has no rival");
            return self.finish_stream(engine, permit, job, answer, now);
        }
        match answer {
            PeerAnswer::Block(data) if data.len() as u64 == job.expected => {
                settle(engine, permit, Outcome::Answered, now);
                engine.forget_silent(&asked);
                if contender == Contender::Backup {
                    if let Some(primary) = job.race[Contender::Primary.index()].clone() {
                        // (Not when the backup was the liveness probe of that same peer.)
                        if primary != asked {
                            self.mark_slow(engine, primary, now);
                        }
                    }
                }
                self.cancel_race(&mut job);
                if job.asked_held_only(&asked) {
                    if job.successor {
                        engine.stats.successor_hits += 1;
                    } else {
                        engine.stats.neighbour_hits += 1;
                    }
                }
                if job.hedged {
                    match contender {
                        Contender::Primary => engine.stats.hedge_primary_won += 1,
                        Contender::Backup => engine.stats.hedge_backup_won += 1,
                    }
                }
                self.count(&mut engine.stats.block_source_peer);
                if !shared {
                    engine.stats.peer_bytes += data.len() as u64;
                }
                self.store(engine, job.key, data.clone());
                self.deliver(engine, job.seg, &data);
            }
            PeerAnswer::Block(_) => {
                // A lying peer: never trusted again this read, and its circuit opens at once
                // (unless the length was only told: `length_outcome`).
                let outcome = self.length_outcome(engine);
                settle(engine, permit, outcome, now);
                engine.stats.peer_wrong_length += 1;
                job.upstreams.clear();
                job.rerouted = true;
                self.next_source(engine, job, now);
            }
            PeerAnswer::Failed(observation) if was_probe => {
                self.probe_answered(engine, job, permit, observation, asked, now)
            }
            PeerAnswer::Failed(observation) => {
                let held_only = job.asked_held_only(&asked);
                let outcome = match observation {
                    Observation::WrongLength => self.length_outcome(engine),
                    _ => peer_outcome(observation, held_only),
                };
                settle(engine, permit, outcome, now);
                if observation != Observation::Miss {
                    engine.stats.peer_failover += 1;
                }
                if observation == Observation::TimedOut {
                    self.mark_slow(engine, asked.clone(), now);
                }
                if observation == Observation::UpstreamSlow && !job.asked_again {
                    // The relay gave up on its own upstream in time to say so, and goes on
                    // fetching (past that upstream, once it times out): ask it once more before
                    // climbing to that same upstream ourselves.
                    job.asked_again = true;
                    if let Some(relay) = engine.upstream_ref(job.key, &self.object.id, &asked, now)
                    {
                        job.upstreams.push_front(relay);
                        if job.in_flight() && self.launch(engine, &mut job, contender, now) {
                            // The other contender (a backup at the relay's own upstream, most
                            // likely: the very peer the relay gave up on) is still out. The
                            // relay takes the freed place at once instead of after that one
                            // answers: still at most two contenders, at two addresses.
                            self.state = State::AwaitPeer(job);
                            return;
                        }
                    }
                }
                if contender == Contender::Backup && job.probe == Probe::Silent && job.in_flight() {
                    // The backup went to the member that replaces a silent primary
                    // (`Read::relay_without`) and failed: the next ancestor of that tree, else
                    // the origin, at once, not after the silent primary's own bound.
                    if !self.launch(engine, &mut job, Contender::Backup, now) {
                        let primary = job.race[Contender::Primary.index()].clone();
                        if let Some(primary) = primary {
                            self.origin_backup(engine, &mut job, &primary, now);
                        }
                    }
                }
                self.next_source(engine, job, now);
            }
        }
    }

    /// Whether this read waits on peers for block `key` and could take `len` bytes of it from
    /// elsewhere: no stream has started (a cut-through relay's committed stream has no rival).
    pub fn awaits_peer_for(&self, key: BlockKey, len: u64) -> bool {
        matches!(&self.state, State::AwaitPeer(job)
            if job.key == key && !job.streaming && job.expected == len)
    }

    /// Whether this read waits on the origin for block `key` of `len` bytes and has passed
    /// none of its window on (it does not stream it): [`Read::take_landed`] can serve it from a
    /// copy that landed in this node's store. The shell takes it out of its flight first.
    pub fn awaits_fetch_for(&self, key: BlockKey, len: u64) -> bool {
        matches!(&self.state, State::AwaitFetch(job)
            if job.key == key && !job.streaming && job.expected == len)
    }

    /// Block `key` landed in this node's store while this read waited on peers for it (another
    /// read of this node fetched it, from a peer or the origin, of the version this read
    /// reads): the read takes it and drops its race. The contenders are cancelled, never
    /// charged: a peer that was merely slower than another path did nothing wrong. Or while it
    /// waited on the origin for it ([`Read::awaits_fetch_for`]; the shell took it out of its
    /// flight, which goes on for its other waiters and the cache): it takes it the same way.
    /// False, and nothing changes, unless one of the two holds.
    pub fn take_landed(
        &mut self,
        engine: &mut Engine,
        key: BlockKey,
        data: &Bytes,
        now: Instant,
    ) -> bool {
        if self.awaits_fetch_for(key, data.len() as u64) {
            let State::AwaitFetch(job) = std::mem::replace(&mut self.state, State::Done) else {
                unreachable!("checked above")
            };
            engine.stats.landed += 1;
            self.count(&mut engine.stats.block_source_cache);
            self.deliver(engine, job.seg, data);
            return true;
        }
        if !self.awaits_peer_for(key, data.len() as u64) {
            return false;
        }
        let State::AwaitPeer(mut job) = std::mem::replace(&mut self.state, State::Done) else {
            unreachable!("checked above")
        };
        if job.origin_backup {
            // The origin fill won the race it was launched into.
            engine.stats.hedge_backup_won += 1;
            if let Some(primary) = job.race[Contender::Primary.index()].clone() {
                self.mark_slow(engine, primary, now);
            }
        }
        self.cancel_race(&mut job);
        engine.stats.landed += 1;
        self.count(&mut engine.stats.block_source_cache);
        self.deliver(engine, job.seg, data);
        true
    }

    /// Whether this read is a relay whose committed stream of block `key` (`len` bytes) could be
    /// finished from a copy that landed in this node's store ([`Read::resume_stream`]).
    pub fn streams_peer_block(&self, key: BlockKey, len: u64) -> bool {
        matches!(&self.state, State::AwaitPeer(job)
            if job.key == key && job.streaming && job.expected == len)
    }

    /// Block `key` landed in this node's store (another read of this node fetched it: its
    /// origin backup, its hedge, a fetch of its own) while this relay's committed stream of it
    /// was still open: the shell found that every byte the stream had forwarded is the landed
    /// copy's, and sent the copy's remaining bytes after them. The stream ends as served from
    /// that copy (its digest is the copy's), instead of waiting on an upstream that stopped
    /// feeding it until the body's progress bound cuts it off and truncates the response. The
    /// upstream fetch is dropped, and runs on to its end when `run_on` (its body stood still:
    /// how it ends is recorded against the peer); a cancel is never charged. False, and nothing
    /// changes, unless [`Read::streams_peer_block`] holds.
    pub fn resume_stream(
        &mut self,
        engine: &mut Engine,
        key: BlockKey,
        data: &Bytes,
        run_on: bool,
    ) -> bool {
        if !self.streams_peer_block(key, data.len() as u64) {
            return false;
        }
        let State::AwaitPeer(mut job) = std::mem::replace(&mut self.state, State::Done) else {
            unreachable!("checked above")
        };
        for contender in [Contender::Primary, Contender::Backup] {
            self.cancel_contender(&mut job, contender, run_on);
        }
        engine.stats.landed += 1;
        engine.stats.streams_resumed += 1;
        self.count(&mut engine.stats.block_source_cache);
        self.count(&mut engine.stats.relay_served);
        // Stored already: only the response ends.
        self.emitted = data.len() as u64;
        self.served = Some(data.clone());
        self.finish();
        true
    }

    /// The end of a cut-through stream: the bytes were already forwarded; only a complete block of
    /// the exact length is cached, anything else truncates the requester's response.
    fn finish_stream(
        &mut self,
        engine: &mut Engine,
        permit: Option<Permit<String>>,
        job: Job,
        answer: PeerAnswer,
        now: Instant,
    ) {
        let shared = permit.is_none();
        match answer {
            PeerAnswer::Block(data) if data.len() as u64 == job.expected => {
                settle(engine, permit, Outcome::Answered, now);
                if job.neighbour.as_ref().is_some_and(Option::is_some) {
                    engine.stats.neighbour_hits += 1;
                }
                self.count(&mut engine.stats.block_source_peer);
                if !shared {
                    engine.stats.peer_bytes += data.len() as u64;
                }
                self.end_stream(engine, job.key, data);
            }
            PeerAnswer::Block(data) => {
                let outcome = self.length_outcome(engine);
                settle(engine, permit, outcome, now);
                engine.stats.peer_wrong_length += 1;
                let got = data.len() as u64;
                let want = job.expected;
                self.fail(ReadError::BlockLength { block: job.key.block, want, got });
            }
            PeerAnswer::Failed(Observation::WrongLength) => {
                let outcome = self.length_outcome(engine);
                settle(engine, permit, outcome, now);
                self.fail(ReadError::PeerFailed(Observation::WrongLength));
            }
            PeerAnswer::Failed(observation) => {
                settle(engine, permit, observation.outcome(), now);
                self.fail(ReadError::PeerFailed(observation));
            }
        }
    }

    /// The answer to [`Action::FetchOrigin`].
    pub fn handle_fetch(
        &mut self,
        engine: &mut Engine,
        fetched: Result<FetchedBlock, OriginError>,
    ) {
        let State::AwaitFetch(job) = std::mem::replace(&mut self.state, State::Done) else {
            panic!("fetch answer out of turn");
        };
        let block = match fetched {
            Ok(block) => block,
            Err(OriginError::Changed) if self.can_restart() && !job.streaming => {
                return self.restart()
            }
            Err(e) => return self.fail(e.into()),
        };
        if !block.coalesced {
            engine.stats.origin_bytes += block.data.len() as u64;
        }
        match block_verdict(self.size, job.expected, &block) {
            Verdict::Cache if job.streaming && self.is_relay() => {
                self.count(&mut engine.stats.block_source_origin);
                return self.end_stream(engine, job.key, block.data);
            }
            Verdict::ServeOnly if job.streaming => {
                // Never: a stream starts only on a window that honours Range.
                let got = block.data.len() as u64;
                let err =
                    ReadError::BlockLength { block: job.seg.block_index, want: job.expected, got };
                return self.fail(err);
            }
            Verdict::Cache => self.store(engine, job.key, block.data.clone()),
            Verdict::ServeOnly => {
                // The origin ignores Range after all: later reads proxy it, relays decline it.
                engine.stats.uncacheable += 1;
                engine.learn(
                    &self.object,
                    ProbeOutcome::RangeBlind { content_length: block.body.total },
                );
            }
            Verdict::Reject(err) => {
                let err = match err {
                    ReadError::BlockLength { want, got, .. } => {
                        ReadError::BlockLength { block: job.seg.block_index, want, got }
                    }
                    other => other,
                };
                return self.fail(err);
            }
        }
        self.count(&mut engine.stats.block_source_origin);
        if job.streaming {
            // A client read whose first bytes of this block went out as they arrived.
            self.emit_segment_from(engine, job.seg, &block.data, job.forwarded);
            return self.next_block(engine);
        }
        self.deliver(engine, job.seg, &block.data);
    }

    /// Emits a block's part of the range and moves on.
    fn deliver(&mut self, engine: &mut Engine, seg: Segment, block: &Bytes) {
        if self.is_relay() {
            self.count(&mut engine.stats.relay_served);
            self.commit_relay_head(engine);
            self.emitted = block.len() as u64;
            self.served = Some(block.clone());
            self.out.push_back(Action::Emit(block.clone()));
            return self.finish();
        }
        self.emit_segment(engine, seg, block);
        self.next_block(engine);
    }

    fn respond(&mut self, engine: &mut Engine, size: u64) {
        let Kind::Client { method, range, conditions } = &self.kind else {
            unreachable!("client read")
        };
        let method = *method;
        self.size = size;
        let meta = engine.meta_of(&self.object.id).cloned().unwrap_or_default();
        self.version = Some(Box::new(meta.clone()));
        let validators =
            Validators { etag: meta.etag.as_deref(), last_modified: meta.last_modified.as_deref() };
        let verdict =
            evaluate(method == Method::Get, range.is_some(), &conditions.borrowed(), &validators);
        let plain = |status| ResponseHead {
            status,
            content_length: 0,
            content_range: None,
            meta: meta.clone(),
        };
        let range = match verdict {
            Precondition::NotModified => return self.answer_without_body(plain(304)),
            Precondition::Failed => return self.answer_without_body(plain(412)),
            Precondition::Proceed { range: true } => range.as_deref(),
            Precondition::Proceed { range: false } => None,
        };
        let head = match resolve_range(range, size) {
            Ok(RangeOutcome::Whole) => {
                if size > 0 {
                    self.segments = Some(engine.config.geometry.segments(0, size - 1));
                }
                ResponseHead { status: 200, content_length: size, content_range: None, meta }
            }
            Ok(RangeOutcome::Partial { start, end }) => {
                debug_assert!(start <= end && end < size);
                self.segments = Some(engine.config.geometry.segments(start, end));
                ResponseHead {
                    status: 206,
                    content_length: end - start + 1,
                    content_range: Some(content_range_header(start, end, size)),
                    meta,
                }
            }
            Err(_) => ResponseHead {
                status: 416,
                content_length: 0,
                content_range: Some(unsatisfied_content_range(size)),
                meta,
            },
        };
        self.content_length = head.content_length;
        self.pending_head = Some(Box::new(head));
        if method == Method::Head {
            self.segments = None;
            self.content_length = 0;
        }
        self.next_block(engine);
    }

    /// A 304 or 412: the head alone.
    fn answer_without_body(&mut self, head: ResponseHead) {
        self.segments = None;
        self.content_length = 0;
        self.pending_head = Some(Box::new(head));
        self.finish();
    }

    /// Sends the held client head (before the first body bytes, or at the end).
    fn commit_head(&mut self) {
        if let Some(head) = self.pending_head.take() {
            self.head_sent = true;
            self.out.push_back(Action::Respond(head));
        }
    }

    fn can_restart(&self) -> bool {
        !self.head_sent && !self.is_relay() && self.restarts < RESTARTS_MAX
    }

    /// The object changed before any byte was committed: read it again, from its probe.
    fn restart(&mut self) {
        debug_assert!(self.can_restart());
        self.restarts += 1;
        self.pending_head = None;
        self.version = None;
        self.segments = None;
        self.emitted = 0;
        self.content_length = 0;
        self.probed = false;
        self.probe();
    }

    fn next_block(&mut self, engine: &mut Engine) {
        let next = self.segments.as_mut().and_then(Iterator::next);
        match next {
            Some(seg) => {
                let geometry = engine.config.geometry;
                let expected = geometry
                    .block_len(self.size, seg.block_index)
                    .expect("segments lie inside the object");
                let key = engine.block_key(&self.object, seg.block_index);
                let block_start = seg.block_index * geometry.block_bytes();
                let (start, end) = (seg.from - block_start, seg.to - block_start);
                let whole = start == 0 && end + 1 == expected;
                let window = (!whole).then_some(Window { start, end, block_len: expected });
                self.out.push_back(Action::Lookup { key, window });
                self.state = State::AwaitLookup(Job {
                    seg,
                    key,
                    expected,
                    window,
                    upstreams: VecDeque::new(),
                    streaming: false,
                    forwarded: 0,
                    tried_peer: false,
                    rechecked: false,
                    race: [None, None],
                    hedged: false,
                    asked_again: false,
                    asked: Vec::new(),
                    rerouted: false,
                    neighbour: None,
                    successor: false,
                    origin_backup: false,
                    probe: Probe::None,
                    probing: false,
                    hedge_at: None,
                });
            }
            None => self.finish(),
        }
    }

    fn finish(&mut self) {
        self.commit_head();
        assert_eq!(self.emitted, self.content_length, "emitted bytes != Content-Length");
        self.out.push_back(Action::Finish);
        self.state = State::Done;
    }

    fn emit_segment(&mut self, engine: &mut Engine, seg: Segment, block: &Bytes) {
        self.emit_segment_from(engine, seg, block, 0)
    }

    /// Emits a block's part of the range but its first `skip` bytes (they went out already);
    /// nothing when none are left.
    fn emit_segment_from(&mut self, engine: &mut Engine, seg: Segment, block: &Bytes, skip: u64) {
        let block_start = seg.block_index * engine.config.geometry.block_bytes();
        let from = seg.from + skip - block_start;
        if from > seg.to - block_start {
            return self.commit_head();
        }
        let from = usize::try_from(from).expect("offset inside a block");
        let to = usize::try_from(seg.to - block_start).expect("offset inside a block");
        let slice = block.slice(from..=to);
        self.commit_head();
        self.emitted += slice.len() as u64;
        engine.stats.client_bytes += slice.len() as u64;
        self.out.push_back(Action::Emit(slice));
    }

    fn passthrough(&mut self, engine: &mut Engine) {
        engine.stats.passthrough += 1;
        self.out.push_back(Action::Passthrough { url: self.url.clone() });
        self.state = State::Done;
    }

    fn fail(&mut self, error: ReadError) {
        let relay = self.is_relay();
        let refused = match &error {
            ReadError::Origin(e) if e.is_refusal() => e.status(),
            ReadError::Origin(_)
            | ReadError::NotHeld
            | ReadError::PeerFailed(_)
            | ReadError::BlockLength { .. }
            | ReadError::SizeChanged { .. } => None,
        };
        let status = match (&error, relay) {
            (ReadError::NotHeld, _) => 404,
            // The requester reads another version than the origin now serves: not this relay's
            // fault, and nothing it can serve (the requester finds the change itself).
            (ReadError::Origin(OriginError::Changed), true) => 404,
            // The policy refused the origin: the requester is told it was the origin, not us.
            (ReadError::Origin(OriginError::Refused(_)), true) => 502,
            (ReadError::Origin(OriginError::Refused(_)), false) => 403,
            (_, true) if refused.is_some() => 502,
            (_, true) => 500,
            // The origin's own refusal of the requester (or its answer that the object is gone,
            // or that the requester must slow down: a registry's pull rate limit) is the
            // client's answer, as a proxy would pass it.
            (ReadError::Origin(e), false)
                if matches!(e.status(), Some(401 | 403 | 404 | 410 | 429)) =>
            {
                e.status().expect("matched")
            }
            (
                ReadError::Origin(_)
                | ReadError::PeerFailed(_)
                | ReadError::BlockLength { .. }
                | ReadError::SizeChanged { .. },
                false,
            ) => 502,
        };
        let refused = match &error {
            ReadError::Origin(OriginError::Refused(_)) => Some(403),
            _ => refused,
        };
        let upstream_status = if relay { refused } else { None };
        let failure = ReadFailure { committed: self.head_sent, status, upstream_status, error };
        self.out.push_back(Action::Fail(failure));
        self.state = State::Done;
    }
}

/// Shortest wait for a liveness probe's answer ([`probe_wait`]).
pub const PROBE_WAIT_FLOOR: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a hedge's liveness probe may go unanswered before the peer is taken as silent: a
/// quarter of the hedge delay, at least [`PROBE_WAIT_FLOOR`]. A held-only ask needs no
/// upstream, so a live peer answers it in about one round trip; the hedge delay is a whole
/// block fetch (94 ms without an estimate).
pub fn probe_wait(hedge_delay: std::time::Duration) -> std::time::Duration {
    (hedge_delay / 4).max(PROBE_WAIT_FLOOR)
}

/// How a peer fetch that ended with `observation` is recorded against the peer: as its
/// observation says, except that a held-only ask's short head bound (about one hedge delay: it
/// needs no upstream) is too short to judge a busy peer by, so its timeout is not charged (the
/// peer is remembered slow instead).
pub(crate) fn peer_outcome(observation: Observation, held_only: bool) -> Outcome {
    match observation {
        Observation::TimedOut if held_only => Outcome::Abandoned,
        o => o.outcome(),
    }
}

/// Records a peer fetch's outcome on its permit; a shared fetch's other readers hold none (the
/// fetch's own permit records the outcome once).
fn settle(engine: &mut Engine, permit: Option<Permit<String>>, outcome: Outcome, now: Instant) {
    if let Some(permit) = permit {
        engine.complete(permit, outcome, now);
    }
}
