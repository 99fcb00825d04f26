//! Active reader-set tracker (spec/tracker.md): the tracker's lease registry, its HTTP decisions
//! and wire forms, and a reading node's reader-set cache, as pure state machines.
//!
//! # Driving contract
//!
//! **Tracker side.** The member that wins HRW top-1 for a file key owns one [`Registry`]. A
//! request on the peer listener is handed to [`serve`] with its method, path, body and `now`; the
//! driver writes the returned [`Reply`] as is. When the reading node is itself the tracker, the
//! engine calls [`Registry::join`] directly instead. The registry has no timer: expiry, the
//! frozen set's recompute and idle eviction all happen lazily inside [`Registry::join`],
//! [`Registry::leave`] and [`Registry::readers`], so nothing needs to call it when idle (an idle
//! registry keeps the files it has until the next call evicts them).
//!
//! **Reader side.** A reading node owns one [`ReaderCache`]. Per read it calls
//! [`ReaderCache::lookup`]: the readers it returns (if any) are the tree candidates; when it says
//! `join`, the driver sends one JOIN (ttl 0, 2 s total timeout) to the file's tracker, or calls the
//! local registry, and reports the outcome with [`ReaderCache::joined`], always, error or not. A
//! read never waits for the JOIN: until the answer comes, the previous readers (or none, meaning
//! "route over all Ready members") are used.
//!
//! # Decisions (and where they differ from the earlier implementation)
//!
//! - **Bounded.** The earlier tracker had no file cap; here [`FILES_MAX`] files, [`READERS_MAX`]
//!   leases per file and [`LEASES_MAX`] leases in all are kept, and a JOIN that would pass a bound
//!   is refused ([`RegistryError`], 503 on the wire). Losing a reader set only costs routing.
//! - **Time never goes backwards.** Both machines act on the latest `now` they were given; an
//!   earlier `now` counts as that latest one (a lease is never granted from a past instant).
//! - **Leave counts live leases.** A leave forgets the file when no *live* lease is left; leases
//!   already past their deadline count as gone even if no recompute has dropped them yet, so the
//!   outcome does not depend on when lazy cleanup last ran.
//! - **ttlMs.** Clamped to [`MAX_LEASE`] before it becomes a [`Duration`] (#27). A negative
//!   integer means "tracker default", as the earlier tracker treated `ttl <= 0`; a fraction, a
//!   string or an integer beyond `u64` is refused (400).
//! - **The reader cache never blocks a read.** It re-JOINs at half the lease while still serving
//!   the readers it holds until the lease ends, so a renewal in flight costs nothing; a failed
//!   JOIN keeps those readers until their lease ends and holds off the next JOIN for
//!   [`RETRY_AFTER`].

use crate::membership::{validate_member_id, MemberIdError};
use crate::time::Instant;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Default time between recomputes of a file's published reader set.
pub const DEFAULT_TICK: Duration = Duration::from_secs(3);
/// Lease granted for a JOIN with ttl 0: twice the *default* tick, whatever tick is configured.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(6);
/// Longest lease granted; longer requests are clamped and the grant reports the clamp.
pub const MAX_LEASE: Duration = Duration::from_secs(600);
/// A file without leases is forgotten once its last JOIN or reader query is older than this.
pub const IDLE_GRACE: Duration = Duration::from_secs(60);
/// Largest request (and grant) body accepted, in bytes.
pub const BODY_MAX: usize = 64 * 1024;
/// Most files tracked; a JOIN for a new file past it is refused.
pub const FILES_MAX: usize = 65_536;
/// Most leases per file (and readers in one grant); a JOIN of a new reader past it is refused.
pub const READERS_MAX: usize = 4096;
/// Most leases across all files; a JOIN of a new reader past it is refused.
pub const LEASES_MAX: usize = 1 << 20;
/// Longest file identity string, in bytes.
pub const FILE_MAX_LEN: usize = 4096;
/// Path of the JOIN endpoint on the peer listener.
pub const JOIN_PATH: &str = "/tracker/v1/join";
/// Path of the LEAVE endpoint on the peer listener.
pub const LEAVE_PATH: &str = "/tracker/v1/leave";
/// The client's total bound on one JOIN or LEAVE exchange (spec §4: 2 s).
pub const JOIN_BOUND: Duration = Duration::from_secs(2);
/// Most files a [`ReaderCache`] holds; a lookup of a new file past it is not cached.
pub const CACHE_MAX: usize = 4096;
/// A [`ReaderCache`] sweeps spent entries when a new file arrives and it holds more than this.
pub const CACHE_SWEEP_ABOVE: usize = 512;
/// After a failed JOIN, the next JOIN for that file waits this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// How long a grant of lease 0 (an older tracker) is served before the next JOIN.
pub const RENEW_FALLBACK: Duration = Duration::from_secs(2);
/// A JOIN unanswered for this long is presumed lost and another may be sent. The driver's
/// [`JOIN_BOUND`] should always answer first; this only bounds the cost of an answer that never came.
pub const IN_FLIGHT_MAX: Duration = Duration::from_secs(10);

/// [`MAX_LEASE`] in milliseconds: `ttlMs` is clamped to it before it becomes a `Duration`.
const MAX_LEASE_MS: u64 = 600_000;
const _: () = assert!(MAX_LEASE.as_millis() == MAX_LEASE_MS as u128);
const _: () = assert!(DEFAULT_LEASE.as_nanos() == 2 * DEFAULT_TICK.as_nanos());

/// What a JOIN grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The file's reader-set epoch: 0 for no set, bumped on every change of the set.
    pub epoch: u64,
    /// The published readers, sorted by member id ascending.
    pub readers: Vec<String>,
    /// The lease granted to the joining node (after defaulting and clamping).
    pub lease: Duration,
}

/// Why the registry refused a JOIN.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// [`FILES_MAX`] files are tracked and the JOIN names a new one.
    #[error("tracker holds the most files it may ({FILES_MAX})")]
    FilesFull,
    /// The file has [`READERS_MAX`] live leases and the JOIN names a new reader.
    #[error("file has the most readers it may ({READERS_MAX})")]
    ReadersFull,
    /// [`LEASES_MAX`] leases are held across all files and the JOIN names a new reader.
    #[error("tracker holds the most leases it may ({LEASES_MAX})")]
    LeasesFull,
    /// The file identity is empty or longer than [`FILE_MAX_LEN`] bytes.
    #[error("file identity is empty or longer than {FILE_MAX_LEN} bytes")]
    BadFile,
    /// The node is not a valid member id.
    #[error("bad node: {0}")]
    BadNode(#[from] MemberIdError),
}

/// The bounds a registry enforces; the constants, or smaller ones in tests.
#[derive(Clone, Copy, Debug)]
struct Caps {
    files: usize,
    readers: usize,
    leases: usize,
}

/// One tracked file.
#[derive(Clone, Debug)]
struct File {
    /// Node id to lease deadline; a lease is live while `now < deadline`.
    leases: BTreeMap<String, Instant>,
    /// No lease's deadline is earlier: until then nothing expires, and a JOIN need not look
    /// at every lease (a herd of R readers would cost R² otherwise).
    soonest: Instant,
    /// The frozen set: what JOIN and readers answer, sorted ascending.
    published: Vec<String>,
    /// Bumped exactly when `published` changes.
    epoch: u64,
    recomputed_at: Instant,
    /// Last JOIN or reader query.
    active_at: Instant,
}

impl File {
    fn new(now: Instant) -> Self {
        File {
            leases: BTreeMap::new(),
            soonest: Instant::MAX,
            published: Vec::new(),
            epoch: 0,
            recomputed_at: now,
            active_at: now,
        }
    }

    /// Drops leases past their deadline; answers how many.
    fn drop_expired(&mut self, now: Instant) -> usize {
        if now < self.soonest {
            return 0;
        }
        let before = self.leases.len();
        self.leases.retain(|_, deadline| *deadline > now);
        self.soonest = self.leases.values().copied().min().unwrap_or(Instant::MAX);
        before - self.leases.len()
    }

    /// Republishes the live leases; answers how many expired leases it dropped.
    fn recompute(&mut self, now: Instant) -> usize {
        let dropped = self.drop_expired(now);
        if !self.leases.keys().eq(self.published.iter()) {
            self.published = self.leases.keys().cloned().collect();
            self.epoch += 1;
        }
        self.recomputed_at = self.recomputed_at.max(now);
        dropped
    }

    fn tick_elapsed(&self, now: Instant, tick: Duration) -> bool {
        now.saturating_duration_since(self.recomputed_at) >= tick
    }
}

/// The tracker's per-file lease registry (spec §3).
///
/// Per file: each reader's lease deadline, and a frozen published set (sorted, with its epoch)
/// that the first JOIN publishes at once and that is recomputed from the live leases at most once
/// per tick, lazily. Idle files are evicted by a scan that any call triggers at most once per
/// tick. See the module documentation for how to drive it.
#[derive(Clone, Debug)]
pub struct Registry {
    tick: Duration,
    lease: Duration,
    grace: Duration,
    caps: Caps,
    files: BTreeMap<String, File>,
    /// Leases held across all files (expired ones not yet dropped included).
    leases_total: usize,
    /// The latest `now` seen; every decision uses it.
    clock: Instant,
    swept_at: Option<Instant>,
}

impl Registry {
    /// A registry recomputing every `tick` (zero: [`DEFAULT_TICK`]), granting [`DEFAULT_LEASE`]
    /// by default and evicting files idle for more than [`IDLE_GRACE`].
    pub fn new(tick: Duration) -> Self {
        Registry::with_timing(tick, DEFAULT_LEASE, IDLE_GRACE)
    }

    /// A registry with every timing chosen (tests); a zero picks the default, a default lease
    /// above [`MAX_LEASE`] is clamped to it.
    pub fn with_timing(tick: Duration, lease: Duration, grace: Duration) -> Self {
        let or = |d: Duration, default: Duration| if d.is_zero() { default } else { d };
        let registry = Registry {
            tick: or(tick, DEFAULT_TICK),
            lease: or(lease, DEFAULT_LEASE).min(MAX_LEASE),
            grace: or(grace, IDLE_GRACE),
            caps: Caps { files: FILES_MAX, readers: READERS_MAX, leases: LEASES_MAX },
            files: BTreeMap::new(),
            leases_total: 0,
            clock: Instant::ZERO,
            swept_at: None,
        };
        registry.check_invariants();
        registry
    }

    /// Smaller bounds than the constants, so tests can fill them.
    #[cfg(test)]
    fn with_caps(mut self, files: usize, readers: usize, leases: usize) -> Self {
        assert!(files <= FILES_MAX && readers <= READERS_MAX && leases <= LEASES_MAX);
        assert!(files > 0 && readers > 0 && leases > 0);
        self.caps = Caps { files, readers, leases };
        self
    }

    /// Sets or refreshes `node`'s lease on `file` for `ttl_ms` milliseconds (0: the default
    /// lease; above [`MAX_LEASE`]: clamped) and answers the published set and the lease granted.
    /// The first JOIN of a file publishes at once; otherwise the set follows once a tick has
    /// passed since its last recompute. Refused for an invalid file or node, and when a bound
    /// would be passed ([`RegistryError`]); a refused JOIN grants nothing and is not activity.
    pub fn join(
        &mut self,
        file: &str,
        node: &str,
        ttl_ms: u64,
        now: Instant,
    ) -> Result<Grant, RegistryError> {
        if file.is_empty() || file.len() > FILE_MAX_LEN {
            return Err(RegistryError::BadFile);
        }
        validate_member_id(node)?;
        let lease = match ttl_ms {
            0 => self.lease,
            ms => Duration::from_millis(ms.min(MAX_LEASE_MS)),
        };
        let now = self.advance(now);
        self.maybe_sweep(now);
        let created = self.admit(file, node, now)?;
        let file_state = self.files.get_mut(file).expect("admit keeps or creates the file");
        if file_state.leases.insert(node.to_owned(), now + lease).is_none() {
            self.leases_total += 1;
        }
        file_state.soonest = file_state.soonest.min(now + lease);
        file_state.active_at = file_state.active_at.max(now);
        if created || file_state.tick_elapsed(now, self.tick) {
            self.leases_total -= file_state.recompute(now);
        }
        let grant = Grant { epoch: file_state.epoch, readers: file_state.published.clone(), lease };
        assert!(grant.epoch > 0 || now == Instant::MAX, "a joined file is published");
        assert!(grant.lease > Duration::ZERO && grant.lease <= MAX_LEASE);
        Ok(grant)
    }

    /// Makes room for `node`'s lease on `file`, creating the file if new; answers whether it was.
    fn admit(&mut self, file: &str, node: &str, now: Instant) -> Result<bool, RegistryError> {
        let Some(file_state) = self.files.get_mut(file) else {
            if self.files.len() >= self.caps.files {
                return Err(RegistryError::FilesFull);
            }
            if self.leases_total >= self.caps.leases {
                return Err(RegistryError::LeasesFull);
            }
            self.files.insert(file.to_owned(), File::new(now));
            return Ok(true);
        };
        if file_state.leases.contains_key(node) {
            return Ok(false);
        }
        // Expired leases hold no slot a new reader needs; the published set is left as is.
        self.leases_total -= file_state.drop_expired(now);
        if file_state.leases.len() >= self.caps.readers {
            return Err(RegistryError::ReadersFull);
        }
        if self.leases_total >= self.caps.leases {
            return Err(RegistryError::LeasesFull);
        }
        Ok(false)
    }

    /// Deletes `node`'s lease on `file`; a file left without a live lease is forgotten (its epoch
    /// reads 0 again), otherwise the published set follows at its next recompute. Not activity.
    pub fn leave(&mut self, file: &str, node: &str, now: Instant) {
        let now = self.advance(now);
        self.maybe_sweep(now);
        let Some(file_state) = self.files.get_mut(file) else {
            return;
        };
        if file_state.leases.remove(node).is_some() {
            self.leases_total -= 1;
        }
        self.leases_total -= file_state.drop_expired(now);
        if file_state.leases.is_empty() {
            self.files.remove(file);
        }
    }

    /// The published set of `file` and its epoch, recomputed first if a tick has passed; an
    /// unknown file answers `(0, [])`. Counts as activity on a known file.
    pub fn readers(&mut self, file: &str, now: Instant) -> (u64, Vec<String>) {
        let now = self.advance(now);
        self.maybe_sweep(now);
        let Some(file_state) = self.files.get_mut(file) else {
            return (0, Vec::new());
        };
        file_state.active_at = file_state.active_at.max(now);
        if file_state.tick_elapsed(now, self.tick) {
            self.leases_total -= file_state.recompute(now);
        }
        (file_state.epoch, file_state.published.clone())
    }

    /// How many files are tracked.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Whether `file` is tracked (no side effect: not activity, no sweep).
    pub fn contains(&self, file: &str) -> bool {
        self.files.contains_key(file)
    }

    /// Moves the clock to `now` unless that is earlier; answers the clock.
    fn advance(&mut self, now: Instant) -> Instant {
        self.clock = self.clock.max(now);
        self.clock
    }

    /// Idle eviction, at most once per tick: drop expired leases everywhere and forget the files
    /// left without leases whose last activity is more than the grace ago.
    fn maybe_sweep(&mut self, now: Instant) {
        if self.swept_at.is_some_and(|at| now.saturating_duration_since(at) < self.tick) {
            return;
        }
        self.swept_at = Some(now);
        let grace = self.grace;
        let leases_total = &mut self.leases_total;
        self.files.retain(|_, file_state| {
            *leases_total -= file_state.drop_expired(now);
            !file_state.leases.is_empty()
                || now.saturating_duration_since(file_state.active_at) <= grace
        });
    }

    /// Asserts the registry's invariants (the simulator calls it after every step).
    pub fn check_invariants(&self) {
        assert!(!self.tick.is_zero() && !self.grace.is_zero());
        assert!(!self.lease.is_zero() && self.lease <= MAX_LEASE);
        assert!(self.caps.files <= FILES_MAX && self.caps.readers <= READERS_MAX);
        assert!(self.caps.leases <= LEASES_MAX);
        assert!(self.files.len() <= self.caps.files, "file bound");
        assert!(self.swept_at.is_none_or(|at| at <= self.clock));
        let mut leases = 0;
        for (name, f) in &self.files {
            assert!(!name.is_empty() && name.len() <= FILE_MAX_LEN);
            assert!(f.leases.len() <= self.caps.readers, "reader bound");
            assert!(f.leases.values().all(|&d| d >= f.soonest), "no lease before the soonest");
            assert!(f.published.len() <= self.caps.readers);
            assert!(f.published.windows(2).all(|w| w[0] < w[1]), "published sorted, unique");
            assert!(f.epoch > 0 || f.published.is_empty(), "a published set has an epoch");
            assert!(f.recomputed_at <= self.clock && f.active_at <= self.clock);
            leases += f.leases.len();
        }
        assert_eq!(leases, self.leases_total, "lease count");
        assert!(self.leases_total <= self.caps.leases, "lease bound");
    }
}

// ---------------------------------------------------------------------------------------------
// Wire (spec §4)

/// A JOIN request: `{"file":..,"node":..,"ttlMs":..}` (`ttlMs` optional, 0 = tracker default).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinRequest {
    /// The object identity string (not the numeric key).
    pub file: String,
    /// The reader's member id.
    pub node: String,
    /// The lease asked for, in milliseconds; 0 asks for the tracker's default.
    pub ttl_ms: u64,
}

/// A LEAVE request: `{"file":..,"node":..}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaveRequest {
    /// The object identity string.
    pub file: String,
    /// The leaving reader's member id.
    pub node: String,
}

/// Why a tracker body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The body is longer than [`BODY_MAX`] bytes (its length).
    #[error("body of {0} bytes is over the {BODY_MAX}-byte bound")]
    TooLarge(usize),
    /// The body is not a JSON object, or a field has the wrong JSON type.
    #[error("bad JSON: {0}")]
    Json(String),
    /// `file` is missing, null or empty.
    #[error("missing file")]
    MissingFile,
    /// `node` is missing, null or empty.
    #[error("missing node")]
    MissingNode,
    /// `node` is not a valid member id.
    #[error("bad node: {0}")]
    BadNode(#[from] MemberIdError),
    /// `file` is longer than [`FILE_MAX_LEN`] bytes (its length).
    #[error("file of {0} bytes is over the {FILE_MAX_LEN}-byte bound")]
    FileTooLong(usize),
    /// `ttlMs` is not an integer (a fraction, a string, or beyond 64 bits).
    #[error("ttlMs is not an integer")]
    BadTtl,
    /// A grant lists more than [`READERS_MAX`] readers (how many).
    #[error("grant lists {0} readers, over the bound of {READERS_MAX}")]
    TooManyReaders(usize),
}

#[derive(Serialize)]
struct JoinWire<'a> {
    file: &'a str,
    node: &'a str,
    #[serde(rename = "ttlMs")]
    ttl_ms: u64,
}

#[derive(Serialize)]
struct LeaveWire<'a> {
    file: &'a str,
    node: &'a str,
}

#[derive(Serialize)]
struct GrantWire<'a> {
    #[serde(rename = "epochS")]
    epoch: u64,
    readers: &'a [String],
    #[serde(rename = "ttlMs")]
    ttl_ms: u64,
}

fn to_json(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).expect("strings and integers always serialize")
}

/// The JSON body of a JOIN request (`ttlMs` always present).
pub fn encode_join(request: &JoinRequest) -> Vec<u8> {
    to_json(&JoinWire { file: &request.file, node: &request.node, ttl_ms: request.ttl_ms })
}

/// The JSON body of a LEAVE request.
pub fn encode_leave(request: &LeaveRequest) -> Vec<u8> {
    to_json(&LeaveWire { file: &request.file, node: &request.node })
}

/// The JSON body of a JOIN answer: `{"epochS":N,"readers":[..],"ttlMs":N}`.
pub fn encode_grant(grant: &Grant) -> Vec<u8> {
    let ttl_ms = u64::try_from(grant.lease.as_millis()).unwrap_or(u64::MAX);
    to_json(&GrantWire { epoch: grant.epoch, readers: &grant.readers, ttl_ms })
}

/// Decodes a JOIN body. Unknown fields are ignored; `ttlMs` absent, null, 0 or negative asks for
/// the default lease; anything else that is not an integer is refused.
pub fn decode_join(body: &[u8]) -> Result<JoinRequest, WireError> {
    let object = parse_object(body)?;
    let (file, node) = file_and_node(&object)?;
    let ttl_ms = match object.get("ttlMs") {
        None | Some(Value::Null) => 0,
        Some(Value::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(ms), _) => ms,
            // The earlier tracker granted its default for ttl <= 0.
            (None, Some(_negative)) => 0,
            (None, None) => return Err(WireError::BadTtl),
        },
        Some(_) => return Err(WireError::BadTtl),
    };
    Ok(JoinRequest { file, node, ttl_ms })
}

/// Decodes a LEAVE body. Unknown fields are ignored.
pub fn decode_leave(body: &[u8]) -> Result<LeaveRequest, WireError> {
    let object = parse_object(body)?;
    let (file, node) = file_and_node(&object)?;
    Ok(LeaveRequest { file, node })
}

/// Decodes a JOIN answer (client side). Absent fields read as 0 or empty; readers that are not
/// valid member ids are dropped and the rest kept, sorted and deduplicated; a lease above
/// [`MAX_LEASE`] is clamped, so a tracker cannot pin this node's cache.
pub fn decode_grant(body: &[u8]) -> Result<Grant, WireError> {
    let object = parse_object(body)?;
    let epoch = match object.get("epochS") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or_else(|| WireError::Json("epochS is not a u64".into()))?,
    };
    let ttl_ms = match object.get("ttlMs") {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_u64().ok_or(WireError::BadTtl)?,
    };
    let listed: &[Value] = match object.get("readers") {
        None | Some(Value::Null) => &[],
        Some(Value::Array(listed)) => listed,
        Some(_) => return Err(WireError::Json("readers is not an array".into())),
    };
    if listed.len() > READERS_MAX {
        return Err(WireError::TooManyReaders(listed.len()));
    }
    let readers = sorted_ids(
        listed.iter().filter_map(Value::as_str).filter(|id| validate_member_id(id).is_ok()),
    );
    Ok(Grant { epoch, readers, lease: Duration::from_millis(ttl_ms.min(MAX_LEASE_MS)) })
}

/// Owned copies of `ids`, sorted ascending without duplicates.
fn sorted_ids<'a>(ids: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = ids.map(str::to_owned).collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn parse_object(body: &[u8]) -> Result<Map<String, Value>, WireError> {
    if body.len() > BODY_MAX {
        return Err(WireError::TooLarge(body.len()));
    }
    serde_json::from_slice(body).map_err(|e| WireError::Json(e.to_string()))
}

fn file_and_node(object: &Map<String, Value>) -> Result<(String, String), WireError> {
    let file = string_field(object, "file")?.ok_or(WireError::MissingFile)?;
    let node = string_field(object, "node")?.ok_or(WireError::MissingNode)?;
    if file.len() > FILE_MAX_LEN {
        return Err(WireError::FileTooLong(file.len()));
    }
    validate_member_id(node)?;
    Ok((file.to_owned(), node.to_owned()))
}

/// A string field; absent, null and empty all read as `None`.
fn string_field<'a>(
    object: &'a Map<String, Value>,
    name: &str,
) -> Result<Option<&'a str>, WireError> {
    match object.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.is_empty())),
        Some(_) => Err(WireError::Json(format!("{name} is not a string"))),
    }
}

// ---------------------------------------------------------------------------------------------
// Server decisions

/// The server's decision for one tracker request on the peer listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status code.
    pub status: u16,
    /// Response headers, names in lower case.
    pub headers: Vec<(&'static str, String)>,
    /// Response body (empty for 204).
    pub body: Vec<u8>,
}

impl Reply {
    fn text(status: u16, message: &str) -> Reply {
        Reply {
            status,
            headers: vec![("content-type", "text/plain; charset=utf-8".to_owned())],
            body: format!("{message}\n").into_bytes(),
        }
    }
}

/// Decides the reply to one request for [`JOIN_PATH`] or [`LEAVE_PATH`] (a query string is
/// ignored): 404 for another path, 405 with `Allow: POST` for another method, 400 naming the
/// problem for a bad body, 503 when the registry is full, else 200 with the grant (JOIN) or 204
/// (LEAVE).
pub fn serve(
    registry: &mut Registry,
    method: &str,
    path: &str,
    body: &[u8],
    now: Instant,
) -> Reply {
    let path = path.split_once('?').map_or(path, |(path, _query)| path);
    let is_join = match path {
        JOIN_PATH => true,
        LEAVE_PATH => false,
        _ => return Reply::text(404, "not found"),
    };
    if method != "POST" {
        let mut reply = Reply::text(405, "method not allowed");
        reply.headers.push(("allow", "POST".to_owned()));
        return reply;
    }
    if !is_join {
        return match decode_leave(body) {
            Ok(request) => {
                registry.leave(&request.file, &request.node, now);
                Reply { status: 204, headers: Vec::new(), body: Vec::new() }
            }
            Err(e) => Reply::text(400, &e.to_string()),
        };
    }
    let request = match decode_join(body) {
        Ok(request) => request,
        Err(e) => return Reply::text(400, &e.to_string()),
    };
    match registry.join(&request.file, &request.node, request.ttl_ms, now) {
        Ok(grant) => Reply {
            status: 200,
            headers: vec![("content-type", "application/json; charset=utf-8".to_owned())],
            body: encode_grant(&grant),
        },
        Err(
            e @ (RegistryError::FilesFull | RegistryError::ReadersFull | RegistryError::LeasesFull),
        ) => Reply::text(503, &e.to_string()),
        Err(e @ (RegistryError::BadFile | RegistryError::BadNode(_))) => {
            Reply::text(400, &e.to_string())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reader side (spec §5)

/// What [`ReaderCache::lookup`] decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lookup {
    /// The readers to lay the tree over (sorted), if a live grant is held.
    pub readers: Option<Vec<String>>,
    /// Whether the caller should send a JOIN for the file now (it is recorded as in flight).
    pub join: bool,
}

/// Readers from a grant and how long to use them.
#[derive(Clone, Debug)]
struct Held {
    readers: Vec<String>,
    /// Which grant this is, unique within its cache ([`ReaderCache::peek_tagged`]).
    tag: u64,
    /// From here a lookup asks for a re-JOIN.
    renew_at: Instant,
    /// From here the readers are no longer served.
    expire_at: Instant,
}

/// Where a file's JOIN stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Joining {
    /// No JOIN in flight and no hold-off.
    Idle,
    /// A JOIN was asked for at `since` and has not been answered.
    InFlight { since: Instant },
    /// The last JOIN failed; no JOIN before `until`.
    HeldOff { until: Instant },
}

#[derive(Clone, Debug)]
struct Entry {
    held: Option<Held>,
    joining: Joining,
}

impl Entry {
    /// Whether a JOIN may be sent now (none in flight, none held off).
    fn may_join(&self, now: Instant) -> bool {
        match self.joining {
            Joining::Idle => true,
            Joining::InFlight { since } => now.saturating_duration_since(since) >= IN_FLIGHT_MAX,
            Joining::HeldOff { until } => now >= until,
        }
    }

    /// Whether the entry holds nothing worth keeping: no live readers, no JOIN awaited.
    fn is_spent(&self, now: Instant) -> bool {
        self.held.as_ref().is_none_or(|h| now >= h.expire_at)
            && !matches!(self.joining, Joining::InFlight { since }
                if now.saturating_duration_since(since) < IN_FLIGHT_MAX)
    }
}

/// A reading node's per-file reader-set cache (spec §5): which readers to build trees over, and
/// when to JOIN the tracker. See the module documentation for how to drive it.
///
/// Holds at most [`CACHE_MAX`] files; spent entries are swept when a new file arrives past
/// [`CACHE_SWEEP_ABOVE`]. When it is still full, a new file is not cached: its lookup answers no
/// readers and no JOIN (routing falls back to all Ready members) until room frees up.
#[derive(Clone, Debug, Default)]
pub struct ReaderCache {
    /// Boxed: most nodes cache one or two files, and a B-tree leaf is sized for eleven entries.
    entries: BTreeMap<String, Box<Entry>>,
    /// The tag of the last grant held.
    last_tag: u64,
    /// The latest `now` seen; every decision uses it.
    clock: Instant,
}

impl ReaderCache {
    /// An empty cache.
    pub fn new() -> Self {
        ReaderCache::default()
    }

    /// The readers to lay the tree over for `file` (a sorted copy) while a grant is live, and
    /// whether to send a JOIN now: when nothing is held or the renewal point (half the lease;
    /// [`RENEW_FALLBACK`] for a lease of 0) has passed, no JOIN is in flight and none failed
    /// within [`RETRY_AFTER`]. A `join: true` answer records the JOIN as in flight.
    pub fn lookup(&mut self, file: &str, now: Instant) -> Lookup {
        let join = self.note_read(file, now);
        let readers = self.peek(file, now).map(<[String]>::to_vec);
        Lookup { readers, join }
    }

    /// [`ReaderCache::lookup`] without the copy of the readers: only whether to JOIN now (with
    /// the same effects: the file is cached, a lapsed grant dropped, a JOIN recorded in flight).
    pub fn note_read(&mut self, file: &str, now: Instant) -> bool {
        self.clock = self.clock.max(now);
        let now = self.clock;
        if !self.entries.contains_key(file) {
            if !self.make_room(now) {
                return false;
            }
            let entry = Box::new(Entry { held: None, joining: Joining::Idle });
            self.entries.insert(file.to_owned(), entry);
        }
        let entry = self.entries.get_mut(file).expect("cached above");
        if entry.held.as_ref().is_some_and(|h| now >= h.expire_at) {
            entry.held = None;
        }
        let due = entry.held.as_ref().is_none_or(|h| now >= h.renew_at);
        let join = due && entry.may_join(now);
        if join {
            entry.joining = Joining::InFlight { since: now };
        }
        join
    }

    /// The readers of `file` while a grant is live, without side effects: no JOIN is asked for
    /// and nothing is recorded (for routing decisions that follow a [`ReaderCache::lookup`]).
    pub fn peek(&self, file: &str, now: Instant) -> Option<&[String]> {
        self.peek_tagged(file, now).map(|(readers, _)| readers)
    }

    /// [`ReaderCache::peek`] with the grant's tag: two answers with one tag are the same set
    /// (each grant held gets a new tag, and a held set never changes), so a caller may key a memo
    /// on the tag instead of comparing the sets.
    pub fn peek_tagged(&self, file: &str, now: Instant) -> Option<(&[String], u64)> {
        let now = self.clock.max(now);
        let held = self.entries.get(file)?.held.as_ref()?;
        (now < held.expire_at).then_some((held.readers.as_slice(), held.tag))
    }

    /// Whether a new file can be cached, sweeping spent entries first when past the threshold.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.entries.len() > CACHE_SWEEP_ABOVE {
            self.entries.retain(|_, entry| !entry.is_spent(now));
        }
        self.entries.len() < CACHE_MAX
    }

    /// A JOIN for `file` ended. A grant is held from now: re-JOIN at half its lease, served until
    /// the lease ends (both [`RENEW_FALLBACK`] for a lease of 0). An error keeps what is held
    /// until it expires and holds off the next JOIN for [`RETRY_AFTER`]. An answer for a file
    /// with no JOIN in flight is stale and ignored.
    pub fn joined(&mut self, file: &str, result: Result<Grant, String>, now: Instant) {
        self.clock = self.clock.max(now);
        let now = self.clock;
        let Some(entry) = self.entries.get_mut(file) else {
            return;
        };
        match entry.joining {
            Joining::InFlight { .. } => {}
            Joining::Idle | Joining::HeldOff { .. } => return,
        }
        entry.joining = match result {
            Ok(grant) => {
                let (renew, expire) = match grant.lease {
                    Duration::ZERO => (RENEW_FALLBACK, RENEW_FALLBACK),
                    lease => (lease / 2, lease),
                };
                let mut readers = sorted_ids(grant.readers.iter().map(String::as_str));
                readers.truncate(READERS_MAX);
                // Checked here, where the only held set is made, rather than after every step.
                assert!(readers.windows(2).all(|w| w[0] < w[1]), "readers sorted, unique");
                self.last_tag += 1;
                let tag = self.last_tag;
                entry.held =
                    Some(Held { readers, tag, renew_at: now + renew, expire_at: now + expire });
                Joining::Idle
            }
            Err(_reason) => Joining::HeldOff { until: now + RETRY_AFTER },
        };
    }

    /// How many files are cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no file is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Asserts the cache's invariants (the simulator calls it after every step).
    pub fn check_invariants(&self) {
        assert!(self.entries.len() <= CACHE_MAX, "cache bound");
        for entry in self.entries.values() {
            if let Some(h) = &entry.held {
                // Sorted and unique: asserted where the set is made (`joined`); it never changes.
                assert!(h.readers.len() <= READERS_MAX);
                assert!(h.renew_at <= h.expire_at);
            }
            match entry.joining {
                Joining::Idle => {}
                Joining::InFlight { since } => assert!(since <= self.clock),
                Joining::HeldOff { until } => assert!(until <= self.clock + RETRY_AFTER),
            }
        }
    }
}

#[cfg(test)]
mod tests;
