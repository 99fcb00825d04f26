//! Who gets in: the upstream policy at request time, the credential check that keeps a shared
//! cache from turning private objects public, and the peer-plane MAC.
//!
//! # The credential check
//!
//! An object's identity drops the URL's query (a presigned signature changes on every request),
//! so cached bytes are shared by every URL that names the object. Before a client read of an
//! object that is not content-addressed is served from the store or from peers, the node confirms
//! that the origin would serve *this* requester: it sends the requester's exact URL and
//! `Authorization` on a 1-byte ranged `GET` (the check). A 2xx (or a 416 of an empty object)
//! admits the requester; its answer also teaches the engine the object's size and validators, so
//! a cold read does not probe again. Any other answer is passed to the requester as the origin's
//! own status (401 with the origin's `WWW-Authenticate`, 403, 404, ...); a 5xx, a transport
//! failure or a timeout answers 502: the node fails closed and never serves cached bytes it could
//! not vouch for.
//!
//! A credential is the fingerprint (SHA-256) of the exact URL and the `Authorization` value. An
//! admitted credential is trusted for [`Access::check_ttl`] (at most [`VERIFIED_MAX`] are
//! remembered, the soonest to expire forgotten first); concurrent requests with one credential
//! share one check. **Stale-if-error for credentials:** when a check finds the origin
//! unavailable (a 5xx, a transport failure, a timeout), a credential the origin accepted within
//! [`Access::stale_grace`] after its TTL ran out is admitted again (counted); a credential the
//! origin never accepted is not — the node still fails closed for it. Skipped: upstreams the operator declares public ([`Access::public`]), and
//! content-addressed objects unless [`Access::check_content_addressed`] (the registry
//! convention: a digest is not a secret to whoever may pull the image, but see SECURITY.md).
//! Relays are not checked: the requesting node checked its own client, and peers authenticate
//! with the cluster MAC.

use super::exchange::{Expiry, Job};
use super::flights::Judged;
use super::io::{Endpoint, Headers, IoEvent, IoId, Output, RequestId};
use super::requests::{Mirror, Request, Wait};
use super::Node;
use crate::codec::redact::redact_url;
use crate::engine::flight::FlightKey;
use crate::engine::origin::classify_probe;
use crate::engine::{Method, ObjectMeta, ReadRequest};
use crate::peer_auth::{AuthRefusal, ClusterSecret, Covered, DEFAULT_SKEW, HEADER_AUTH};
use crate::policy::{Pattern, Refusal, UpstreamPolicy};
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// Most admitted credentials remembered at once.
pub const VERIFIED_MAX: usize = 65_536;
/// Default [`Access::check_ttl`].
pub const DEFAULT_CHECK_TTL: Duration = Duration::from_secs(30);
/// Default [`Access::stale_grace`].
pub const DEFAULT_STALE_GRACE: Duration = Duration::from_secs(3600);

/// Who may make this node fetch what, and read what it holds.
#[derive(Clone, Debug)]
pub struct Access {
    /// Which upstreams the node fetches from (client reads, relays, passthroughs).
    pub policy: UpstreamPolicy,
    /// How long an origin's acceptance of a credential is trusted; zero checks every read.
    pub check_ttl: Duration,
    /// Upstream hosts whose objects anyone may read: no credential check.
    pub public: Vec<Pattern>,
    /// Check content-addressed objects too (default: the registry convention, no check).
    pub check_content_addressed: bool,
    /// How long past its TTL an accepted credential is still admitted while the origin is
    /// unavailable (stale-if-error); zero fails closed at once.
    pub stale_grace: Duration,
    /// The cluster secret of the peer-plane MAC; `None`: the peer plane is unauthenticated.
    pub peer_secret: Option<ClusterSecret>,
    /// Largest clock difference a peer's MAC timestamp may show.
    pub clock_skew: Duration,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            policy: UpstreamPolicy::default(),
            check_ttl: DEFAULT_CHECK_TTL,
            public: Vec::new(),
            check_content_addressed: false,
            stale_grace: DEFAULT_STALE_GRACE,
            peer_secret: None,
            clock_skew: DEFAULT_SKEW,
        }
    }
}

impl Access {
    /// Loopback origins allowed and public (no credential check), everything else as by
    /// default: for tests and demos whose origin runs on this machine.
    pub fn trusting_loopback() -> Self {
        Access {
            policy: UpstreamPolicy::new(crate::policy::loopback_patterns(), Vec::new()),
            public: crate::policy::loopback_patterns(),
            ..Access::default()
        }
    }
}

/// The fingerprint of a requester's credentials for one URL: SHA-256 over the exact URL (query
/// included) and the `Authorization` value.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Credential([u8; 32]);

impl Credential {
    /// The credential of a request for `url` carrying `authorization`.
    pub fn of(url: &str, authorization: Option<&[u8]>) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"dart-credential-v1");
        let auth = authorization.unwrap_or_default();
        for field in [url.as_bytes(), auth] {
            ctx.update(&(field.len() as u64).to_be_bytes());
            ctx.update(field);
        }
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        Credential(out)
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Credential({:02x}{:02x}{:02x}{:02x}..)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// Counters of the access decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessCounters {
    /// Upstreams refused by the policy, by [`Refusal`] (index: position in [`Refusal::ALL`]).
    pub policy_refused: [u64; 6],
    /// Peer requests refused by the MAC check, by [`AuthRefusal`] (index: position in
    /// [`AuthRefusal::ALL`]).
    pub peer_auth_refused: [u64; 4],
    /// Credential checks sent to an origin.
    pub checks: u64,
    /// Reads admitted by a credential remembered from an earlier check.
    pub check_hits: u64,
    /// Reads refused by the origin's answer to a check (passed through).
    pub check_refused: u64,
    /// Reads answered 502 because a check could not be completed.
    pub check_failed: u64,
    /// Reads admitted on a credential accepted earlier while the origin was unavailable.
    pub check_stale: u64,
    /// Size probes a read did not send: it waited for a check of the same object in flight,
    /// whose admitting answer taught the node the object's size and validators
    /// ([`Node::join_check`]).
    pub probes_joined: u64,
}

impl AccessCounters {
    /// Policy refusals for `reason`.
    pub fn refused(&self, reason: Refusal) -> u64 {
        let i = Refusal::ALL.iter().position(|r| *r == reason).expect("a listed reason");
        self.policy_refused[i]
    }

    /// Peer requests refused for `reason`.
    pub fn auth_refused(&self, reason: AuthRefusal) -> u64 {
        let i = AuthRefusal::ALL.iter().position(|r| *r == reason).expect("a listed reason");
        self.peer_auth_refused[i]
    }
}

/// A client request waiting for a credential check; its read begins once admitted.
#[derive(Debug)]
pub(super) struct Gated {
    pub credential: Credential,
    pub read: ReadRequest,
    pub method: Method,
    pub forward: Headers,
    pub mirror: Option<Mirror>,
}

/// A credential check in flight and the requests waiting on it (first: the one that started it).
#[derive(Debug)]
pub(super) struct Check {
    pub io: IoId,
    pub waiters: Vec<RequestId>,
    /// The URL it checks; an admitting answer is a probe of its object too.
    pub url: String,
    /// That object's identity ([`crate::engine::Engine::identify`]).
    pub object: String,
    /// Reads that need that object's size and wait for this check instead of probing
    /// ([`Node::join_check`]), with the URL each would have probed.
    pub probes: Vec<(RequestId, String)>,
}

/// The access state of a node.
#[derive(Debug, Default)]
pub(super) struct State {
    pub gated: BTreeMap<RequestId, Gated>,
    pub checks: BTreeMap<Credential, Check>,
    verified: BTreeMap<Credential, Instant>,
    verified_order: BTreeSet<(Instant, Credential)>,
    /// The wall clock: Unix milliseconds at a core instant ([`super::Input::WallClock`]).
    wall: Option<(Instant, u64)>,
    pub counters: AccessCounters,
}

impl State {
    fn admitted(&self, c: &Credential, now: Instant) -> bool {
        self.verified.get(c).is_some_and(|&until| now < until)
    }

    /// Whether `c` was accepted and its TTL ran out less than `grace` ago.
    fn stale_ok(&self, c: &Credential, now: Instant, grace: Duration) -> bool {
        self.verified.get(c).is_some_and(|&until| now < until.saturating_add(grace))
    }

    fn admit(&mut self, c: Credential, until: Instant) {
        if let Some(old) = self.verified.insert(c, until) {
            self.verified_order.remove(&(old, c));
        }
        self.verified_order.insert((until, c));
        while self.verified.len() > VERIFIED_MAX {
            let (at, oldest) = self.verified_order.pop_first().expect("ordered like the map");
            let removed = self.verified.remove(&oldest);
            debug_assert_eq!(removed, Some(at));
        }
    }

    /// Unix seconds at `now`, from the last wall-clock reading.
    pub fn unix_secs(&self, now: Instant) -> Option<u64> {
        let (at, unix_ms) = self.wall?;
        let since = now.saturating_duration_since(at).as_millis();
        Some((u128::from(unix_ms) + since) as u64 / 1000)
    }

    pub fn set_wall(&mut self, now: Instant, unix_ms: u64) {
        self.wall = Some((now, unix_ms));
    }

    pub fn check_invariants(&self, requests: &BTreeMap<RequestId, Box<super::Request>>) {
        assert_eq!(self.verified.len(), self.verified_order.len());
        assert!(self.verified.len() <= VERIFIED_MAX);
        let mut waiting = 0;
        for (c, check) in &self.checks {
            for rid in &check.waiters {
                let g = self.gated.get(rid).expect("a check waiter is gated");
                assert_eq!(g.credential, *c, "{rid}: waits on another credential's check");
                assert!(!requests.contains_key(rid), "{rid}: gated and admitted");
            }
            assert!(
                !check.waiters.is_empty() || !check.probes.is_empty(),
                "a check nobody waits for"
            );
            for (rid, _) in &check.probes {
                let req = requests.get(rid).expect("a joined probe of no request");
                assert_eq!(req.wait, Wait::Check(*c), "{rid}: joined another check");
            }
            waiting += check.waiters.len();
        }
        assert_eq!(waiting, self.gated.len(), "a gated request waits on no check");
    }
}

impl Node {
    /// The access counters.
    pub fn access_counters(&self) -> AccessCounters {
        self.access.counters
    }

    pub(super) fn count_refusal(&mut self, reason: Refusal) {
        let i = Refusal::ALL.iter().position(|r| *r == reason).expect("a listed reason");
        self.access.counters.policy_refused[i] += 1;
    }

    /// The policy's verdict on fetching `url` (before any connection).
    pub(super) fn upstream_refusal(&mut self, url: &str) -> Option<Refusal> {
        let verdict = match crate::policy::url_host_port(url) {
            Some((host, port)) => self.config.access.policy.check_host(host, port),
            None => Err(Refusal::BadHost),
        };
        let refusal = verdict.err()?;
        self.count_refusal(refusal);
        Some(refusal)
    }

    /// Whether a client read of `url` must be vouched for by the origin.
    fn needs_check(&self, url: &str) -> bool {
        let access = &self.config.access;
        let object = self.engine.identify(url);
        if object.content_addressed && !access.check_content_addressed {
            return false;
        }
        let Some((host, _)) = crate::policy::url_host_port(url) else { return true };
        let host = host.trim_end_matches('.');
        let public = access.public.iter().any(|p| match p {
            Pattern::Net(n) => host.parse::<std::net::IpAddr>().is_ok_and(|ip| n.contains(&ip)),
            name => name.matches_name(host),
        });
        !public
    }

    /// Admits client request `id` for `read`, or holds it for a credential check first.
    pub(super) fn gate(
        &mut self,
        id: RequestId,
        read: ReadRequest,
        method: Method,
        forward: Headers,
        mirror: Option<Mirror>,
        now: Instant,
    ) {
        if !self.needs_check(&read.url) {
            return self.begin_client_read(id, read, method, forward, mirror, now);
        }
        let credential = Credential::of(&read.url, forward.get("authorization"));
        if self.access.admitted(&credential, now) {
            self.access.counters.check_hits += 1;
            return self.begin_client_read(id, read, method, forward, mirror, now);
        }
        let url = read.url.clone();
        let authorization = forward.get("authorization").map(<[u8]>::to_vec);
        self.access.gated.insert(id, Gated { credential, read, method, forward, mirror });
        if let Some(check) = self.access.checks.get_mut(&credential) {
            check.waiters.push(id);
            return;
        }
        self.access.counters.checks += 1;
        let mut headers = Headers::new().with("range", "bytes=0-0");
        if let Some(a) = authorization {
            headers.push("authorization", a);
        }
        let job = Job::Check { credential };
        let io = self.start_exchange(Endpoint::Origin, url.clone(), headers, job, now);
        let object = self.engine.identify(&url).id;
        let check = Check { io, waiters: vec![id], url, object, probes: Vec::new() };
        self.access.checks.insert(credential, check);
    }

    fn begin_client_read(
        &mut self,
        id: RequestId,
        read: ReadRequest,
        method: Method,
        forward: Headers,
        mirror: Option<Mirror>,
        now: Instant,
    ) {
        let read = self.engine.begin_read(read, now);
        let request =
            Request { mirror, ..Request::new(super::io::Plane::Client, method, read, forward) };
        self.admit_request(id, request, now);
    }

    /// Progress of credential check `io`.
    pub(super) fn check_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, headers } => {
                self.check_done(io, true, now, |node, credential, url, waiters| {
                    if (200..300).contains(&status) || status == 416 {
                        node.check_admitted(credential, url, waiters, status, &headers, now)
                    } else {
                        node.check_refused(credential, waiters, status, &headers, now);
                        None
                    }
                });
            }
            // The body is never read: the exchange is cancelled at its head.
            IoEvent::Body(_) | IoEvent::End => unreachable!("a check ends at its head"),
            IoEvent::Failed(super::io::IoError::Refused(refusal)) => {
                self.count_refusal(refusal);
                self.check_done(io, false, now, |node, _, _, waiters| {
                    let message =
                        format!("dart: upstream refused ({refusal}): {}", refusal.explain());
                    let extra = Headers::new().with("x-dart-refused", refusal.label());
                    for rid in waiters {
                        node.access.gated.remove(&rid).expect("a check waiter is gated");
                        node.reply(rid, super::io::Plane::Client, 403, &message, extra.clone());
                    }
                    None
                });
            }
            IoEvent::Failed(e) => {
                let url = redact_url(&self.exchanges[&io].url);
                let reason = format!("request {url}: {e}");
                self.check_done(io, false, now, |node, credential, _, waiters| {
                    node.check_failed(credential, waiters, &reason, now);
                    None
                });
            }
        }
    }

    /// A bound of credential check `io` fired.
    pub(super) fn check_expired(&mut self, io: IoId, expiry: Expiry, now: Instant) {
        let url = redact_url(&self.exchanges[&io].url);
        let reason = format!("request {url}: {expiry}");
        let _ = now;
        self.check_done(io, true, now, |node, credential, _, waiters| {
            node.check_failed(credential, waiters, &reason, now);
            None
        });
    }

    /// Ends check `io` and hands its URL and waiters to `f`, which answers what the check taught
    /// the node about its object (an admitting answer is a probe); then the reads that waited
    /// for it instead of probing ([`Node::join_check`]) take that answer, or probe themselves.
    fn check_done(
        &mut self,
        io: IoId,
        cancel: bool,
        now: Instant,
        f: impl FnOnce(&mut Node, Credential, &str, Vec<RequestId>) -> Option<Judged>,
    ) {
        let x = self.remove_exchange(io).expect("a live check");
        if cancel {
            self.emit(Output::Cancel(io));
        }
        let Job::Check { credential } = x.job else { unreachable!("a check job") };
        let check = self.access.checks.remove(&credential).expect("a check's state");
        debug_assert_eq!(check.io, io);
        self.working.extend(check.waiters.iter().copied());
        let learned = f(self, credential, &check.url, check.waiters);
        for (rid, url) in check.probes {
            if self.requests.get(&rid).is_none_or(|r| r.wait != Wait::Check(credential)) {
                continue; // gone meanwhile (a leaving read leaves the check: never expected)
            }
            self.isolated(now, |node| match &learned {
                Some(judged) => {
                    node.access.counters.probes_joined += 1;
                    let key = FlightKey::Probe(check.object.clone());
                    node.deliver_origin(rid, &key, Ok(judged.clone()), true, true, now);
                }
                None => node.probe_origin(rid, url, now),
            });
        }
    }

    /// Read `rid` needs the size of the object at `url` (its probe). When a credential check of
    /// that object is in flight, the read waits for it instead of probing: a check that admits
    /// is a probe of the same object, and in a cold herd a relay request most often reaches a
    /// node while the node's own client read is being checked (`stalled-peer`: 37 probes of 154
    /// origin requests). A check that does not admit leaves the read to probe then. True when
    /// it joined one.
    pub(super) fn join_check(&mut self, rid: RequestId, url: &str) -> bool {
        let req = self.requests.get_mut(&rid).expect("a driven request");
        let object = &req.read.object().id;
        let Some((credential, check)) =
            self.access.checks.iter_mut().find(|(_, c)| c.object == *object)
        else {
            return false;
        };
        check.probes.push((rid, url.to_owned()));
        req.wait = Wait::Check(*credential);
        true
    }

    /// Request `rid` stops waiting on the check of `credential` (it went away); a check nobody
    /// waits for any more is cancelled.
    pub(super) fn leave_check(&mut self, credential: Credential, rid: RequestId) {
        let Some(check) = self.access.checks.get_mut(&credential) else { return };
        check.probes.retain(|(r, _)| *r != rid);
        self.drop_idle_check(credential);
    }

    /// Cancels the check of `credential` if nobody waits for it (no gated read, no joined
    /// probe).
    pub(super) fn drop_idle_check(&mut self, credential: Credential) {
        let Some(check) = self.access.checks.get(&credential) else { return };
        if check.waiters.is_empty() && check.probes.is_empty() {
            let io = check.io;
            self.access.checks.remove(&credential);
            if self.remove_exchange(io).is_some() {
                self.emit(Output::Cancel(io));
            }
        }
    }

    fn check_admitted(
        &mut self,
        credential: Credential,
        url: &str,
        waiters: Vec<RequestId>,
        status: u16,
        headers: &Headers,
        now: Instant,
    ) -> Option<Judged> {
        let until = now.saturating_add(self.config.access.check_ttl);
        if !self.config.access.check_ttl.is_zero() {
            self.access.admit(credential, until);
        }
        // The check is a probe too: teach the engine the object's size and validators.
        let object = self.engine.identify(url);
        let cr = headers.get("content-range");
        let cl = headers.get_u64("content-length");
        let learned = classify_probe(status, cr, cl).ok().map(|outcome| {
            let meta = ObjectMeta::from_fields(|n| headers.get(n));
            self.learn_probe(&object, outcome, meta.clone(), now);
            Judged::Probe(outcome, meta)
        });
        for rid in waiters {
            let g = self.access.gated.remove(&rid).expect("a check waiter is gated");
            self.isolated(now, |node| {
                node.working.push(rid);
                node.begin_client_read(rid, g.read, g.method, g.forward, g.mirror, now);
            });
        }
        learned
    }

    fn check_refused(
        &mut self,
        credential: Credential,
        waiters: Vec<RequestId>,
        status: u16,
        headers: &Headers,
        now: Instant,
    ) {
        if status >= 500 && self.admit_stale(credential, &waiters, now) {
            return;
        }
        let (status, message) = match status {
            400..=499 => (status, format!("dart: the origin refused this request ({status})")),
            _ => {
                let m =
                    format!("dart: could not confirm access with the origin: it answered {status}");
                (502, m)
            }
        };
        let mut extra = Headers::new();
        if status == 401 {
            if let Some(challenge) = headers.get("www-authenticate") {
                extra.push("www-authenticate", challenge);
            }
        }
        for rid in waiters {
            self.access.gated.remove(&rid).expect("a check waiter is gated");
            if status == 502 {
                self.access.counters.check_failed += 1;
            } else {
                self.access.counters.check_refused += 1;
            }
            self.reply(rid, super::io::Plane::Client, status, &message, extra.clone());
        }
    }

    /// The origin could not vouch for `credential` (it is unavailable): if it accepted the
    /// credential recently enough, the waiters go on (stale-if-error). Returns whether they did.
    fn admit_stale(&mut self, credential: Credential, waiters: &[RequestId], now: Instant) -> bool {
        if !self.access.stale_ok(&credential, now, self.config.access.stale_grace) {
            return false;
        }
        for &rid in waiters {
            let g = self.access.gated.remove(&rid).expect("a check waiter is gated");
            self.access.counters.check_stale += 1;
            self.isolated(now, |node| {
                node.working.push(rid);
                node.begin_client_read(rid, g.read, g.method, g.forward, g.mirror, now);
            });
        }
        true
    }

    fn check_failed(
        &mut self,
        credential: Credential,
        waiters: Vec<RequestId>,
        reason: &str,
        now: Instant,
    ) {
        if self.admit_stale(credential, &waiters, now) {
            return;
        }
        let message = format!("dart: could not confirm access with the origin: {reason}");
        for rid in waiters {
            self.access.gated.remove(&rid).expect("a check waiter is gated");
            self.access.counters.check_failed += 1;
            self.reply(rid, super::io::Plane::Client, 502, &message, Headers::new());
        }
    }

    /// Gated request `rid` went away before its check ended; a check nobody waits for is
    /// cancelled. Returns whether `rid` was gated.
    pub(super) fn cancel_gated(&mut self, rid: RequestId) -> bool {
        let Some(g) = self.access.gated.remove(&rid) else { return false };
        let check = self.access.checks.get_mut(&g.credential).expect("a gated request's check");
        check.waiters.retain(|w| *w != rid);
        self.drop_idle_check(g.credential);
        true
    }

    /// Adds `X-DART-Auth` to a peer request for `url` with `headers` and `body`, when a secret is
    /// set.
    pub(super) fn sign_peer_request(
        &self,
        method: &str,
        url: &str,
        body: &[u8],
        headers: &mut Headers,
        now: Instant,
    ) {
        let Some(secret) = &self.config.access.peer_secret else { return };
        let Some(unix) = self.access.unix_secs(now) else { return };
        let target = url
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..]))
            .unwrap_or("/");
        let covered = covered(method, target, body, headers);
        let value = covered.sign(secret, unix);
        headers.push(HEADER_AUTH, value);
    }

    /// The MAC check of an inbound peer request (`Ok` when no secret is set).
    pub(super) fn verify_peer_request(
        &mut self,
        method: &str,
        target: &str,
        body: &[u8],
        headers: &Headers,
        now: Instant,
    ) -> Result<(), AuthRefusal> {
        let Some(secret) = &self.config.access.peer_secret else { return Ok(()) };
        let result = match self.access.unix_secs(now) {
            Some(unix) => covered(method, target, body, headers).verify(
                secret,
                headers.get(HEADER_AUTH),
                unix,
                self.config.access.clock_skew,
            ),
            None => Err(AuthRefusal::Expired),
        };
        if let Err(reason) = result {
            let i = AuthRefusal::ALL.iter().position(|r| *r == reason).expect("a listed reason");
            self.access.counters.peer_auth_refused[i] += 1;
        }
        result
    }
}

fn covered<'a>(
    method: &'a str,
    target: &'a str,
    body: &'a [u8],
    headers: &'a Headers,
) -> Covered<'a> {
    use crate::codec::wire::{HEADER_HOP, HEADER_NODE, HEADER_ORIGIN, HEADER_PEER_ADDR};
    let field = |name| headers.get(name).unwrap_or_default();
    Covered {
        method,
        target,
        hop: field(HEADER_HOP),
        origin: field(HEADER_ORIGIN),
        node: field(HEADER_NODE),
        peer_addr: field(HEADER_PEER_ADDR),
        body,
    }
}
