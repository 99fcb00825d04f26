//! Live membership: the refresh loop's decisions as a pure state machine (spec/cluster.md §5,
//! seeds/peer.md §3.7). Time comes in as an argument; the node carries out what it decides.
//!
//! # Driving contract
//!
//! The owner (the node machine) runs:
//!
//! 1. At [`Directory::poll_timeout`], call [`Directory::start_round`]. It answers
//!    [`Start::Resolve`] (resolve the DNS seed name, then call [`Directory::seeds_resolved`]) or
//!    [`Start::Ask`] (the addresses whose rosters to fetch now).
//! 2. For every address asked, report the outcome with [`Directory::answered`]; it may name more
//!    addresses to ask in the same round (ones a roster mentioned that nobody asked yet).
//! 3. An inbound roster request that names its caller and the caller's advertised address is
//!    reported with [`Directory::caller`].
//! 4. After any call, [`Directory::take_view`] yields the new view when the published one
//!    changed; placement must use it from then on.
//!
//! # Decisions (and where they differ from the earlier implementation)
//!
//! - **Only direct contact makes a member.** A member is published when it answered a roster
//!   fetch naming itself (`X-DART-Node`) or called us naming itself and its advertised address.
//!   What a roster says about *other* members is hearsay: it teaches an address to ask, in this
//!   round, and never a member or a clock. The earlier implementation published hearsay members
//!   with a full grace, so a dead member could be taught back to a node that had just forgotten
//!   it, and a node that joined late kept it for a whole grace; here every node drops a dead
//!   member at most `forget_after` plus one `interval` after its last direct contact, whatever
//!   the others still say.
//! - **Credit goes to the responder's self-reported id,** never to the dialed address (pod IPs
//!   are reused). An anonymous responder credits nobody.
//! - **An address belongs to one live member.** When a member is credited at an address another
//!   member was recorded at, the other record is stale (its process is gone or moved) and is
//!   dropped at once; if that member is alive elsewhere its next direct contact brings it back.
//! - **Self is always present**, Ready, at its advertised address, weight 1.
//! - **A failed resolution keeps the known seeds** (a DNS outage never empties membership).
//! - **A view far from whole is refreshed sooner.** When, since the last round ended, the view
//!   met at least a quarter as many new members as it held then (in the round, or callers
//!   between rounds; a boot: every node knows a seed or two), or it holds only this node (no
//!   seed answered yet: it came up first), the next round is due
//!   [`QUICK_ROUND`] after this one started, doubling while rounds keep meeting that many (at
//!   most [`QUICK_ROUNDS_MAX`] in a row), instead of one `interval` later. The spec runs one
//!   refresh per interval; a cluster booted at once then reads its first objects for two or three
//!   intervals through partial views, each electing its own tree roots that read from the origin.
//!   A member joining a settled view is one new member: no quick round.
//! - The published view changes only at the start and the end of a round (a round starts every
//!   `interval`, or sooner as above): both drop the members silent for longer than
//!   `forget_after`, and the end adds the members credited during the round. So a member that
//!   stopped talking at `t` is out of every view by `t + forget_after + interval` (plus the
//!   round's length when a round runs longer than `interval`: roster fetches are bounded by the
//!   node's exchange bounds).

use crate::codec::roster::Roster;
use crate::membership::{validate_member_id, Member, MemberIdError, MemberState, View};
use crate::time::Instant;
use crate::walk_gate::WalkGate;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Default time between refresh rounds.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// Default time without direct contact after which a member is forgotten.
pub const DEFAULT_FORGET_AFTER: Duration = Duration::from_secs(60);
/// Most members remembered (self excluded); a new one past it is refused.
pub const MEMBERS_MAX: usize = 4096;
/// Most hearsay addresses remembered; a new one past it is refused.
pub const HEARD_MAX: usize = 4096;
/// Most addresses asked in one round.
pub const ROUND_ASKS_MAX: usize = 4096;
/// The delay to the next round after a round that left the view far from whole (since the last
/// round ended, the view met at least a quarter as many new members as it held then: a boot, or
/// two parts of a cluster meeting; or it holds only this node, whose seeds did not answer yet);
/// doubled after each such round in a row, up to the interval ([`QUICK_ROUNDS_MAX`] of them).
/// A cluster that boots at once (each node seeded with a few others) then holds whole views in
/// about a second instead of two or three intervals, while its first reads run: every partial
/// view elects its own tree roots, and each root reads the object from the origin.
pub const QUICK_ROUND: Duration = Duration::from_millis(25);
/// Most quick rounds in a row ([`QUICK_ROUND`]); a round that meets fewer new members resets the
/// count.
pub const QUICK_ROUNDS_MAX: u32 = 8;
/// How long a seed resolution may take before the round goes on with the known seeds.
pub const RESOLVE_BOUND: Duration = Duration::from_secs(5);
/// At most one discovery error is reported per this period; the rest are counted.
pub const ERROR_REPORT_PERIOD: Duration = Duration::from_secs(60);

/// Where the seed addresses come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seeds {
    /// A fixed list of `host:port` addresses (`--discover static:a:p,b:p`).
    Static(Vec<String>),
    /// A name resolved every round, each address joined with `port` (`--discover dns:name:port`).
    Dns {
        /// The name (e.g. a headless Service).
        name: String,
        /// The peer port.
        port: u16,
    },
}

/// Why a `--discover` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeedsError {
    /// Nothing after the scheme.
    #[error("--discover names no seed")]
    Empty,
    /// A static entry is not `host:port` with a port 1..=65535.
    #[error("--discover seed {0:?} is not host:port (port 1-65535)")]
    Entry(String),
    /// A DNS spec is not `dns:<name>:<port>`.
    #[error("--discover {0:?} is not dns:<name>:<port> (port 1-65535)")]
    Dns(String),
    /// A scheme this build does not know.
    #[error("--discover scheme {0:?} is not supported (use static: or dns:)")]
    Scheme(String),
}

impl Seeds {
    /// Parses `--discover`: `static:<host:port>,...`, `dns:<name>:<port>`, or a bare static list.
    /// `k8s:` (EndpointSlice discovery) is refused by name: this build does not have it.
    pub fn parse(spec: &str) -> Result<Seeds, SeedsError> {
        let spec = spec.trim();
        if let Some(rest) = spec.strip_prefix("dns:") {
            let (name, port) = rest.rsplit_once(':').ok_or_else(|| SeedsError::Dns(spec.into()))?;
            let port = parse_port(port).ok_or_else(|| SeedsError::Dns(spec.into()))?;
            if name.is_empty() || name.contains(['/', ' ', ',']) {
                return Err(SeedsError::Dns(spec.into()));
            }
            return Ok(Seeds::Dns { name: name.to_owned(), port });
        }
        let list = match spec.strip_prefix("static:") {
            Some(rest) => rest,
            None => {
                if let Some((scheme, _)) = spec.split_once(':') {
                    if scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                        && scheme.chars().all(|c| c.is_ascii_alphanumeric())
                    {
                        // `k8s:`, `consul:`, ...: a bare host:port has a numeric port after ':'.
                        if !spec.contains(',') && parse_port(&spec[scheme.len() + 1..]).is_none() {
                            return Err(SeedsError::Scheme(scheme.into()));
                        }
                    }
                }
                spec
            }
        };
        let mut seeds = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if !is_host_port(entry) {
                return Err(SeedsError::Entry(entry.into()));
            }
            seeds.push(entry.to_owned());
        }
        if seeds.is_empty() {
            return Err(SeedsError::Empty);
        }
        Ok(Seeds::Static(seeds))
    }
}

fn parse_port(s: &str) -> Option<u16> {
    s.parse::<u16>().ok().filter(|&p| p > 0 && s.bytes().all(|b| b.is_ascii_digit()))
}

/// `host:port` with a non-empty host (an IPv6 host in brackets) and a port 1..=65535.
pub fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else { return false };
    if parse_port(port).is_none() || host.is_empty() || host.contains(['/', ' ', ',', '@']) {
        return false;
    }
    if host.contains(':') {
        return host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    }
    true
}

/// Why an advertised peer address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdvertiseError {
    /// Not `host:port` with a port 1..=65535.
    #[error("advertised address {0:?} is not host:port (port 1-65535)")]
    NotHostPort(String),
    /// The host is a wildcard (every peer would dial itself).
    #[error("advertised address {0:?} is a wildcard; peers must be able to dial it")]
    Wildcard(String),
}

/// Checks an address to advertise to peers: `host:port`, and never a wildcard host (`0.0.0.0`,
/// `::` in any spelling, with or without a zone). Loopback is fine.
pub fn check_advertise(addr: &str) -> Result<(), AdvertiseError> {
    if !is_host_port(addr) {
        return Err(AdvertiseError::NotHostPort(addr.into()));
    }
    let (host, _) = addr.rsplit_once(':').expect("host:port");
    if is_wildcard_host(host) {
        return Err(AdvertiseError::Wildcard(addr.into()));
    }
    Ok(())
}

/// Whether a listen or advertise host is a wildcard: empty, or an unspecified IP address in
/// any spelling (brackets and an IPv6 zone allowed).
pub fn is_wildcard_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let bare = bare.split_once('%').map_or(bare, |(ip, _)| ip);
    bare.is_empty() || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_unspecified())
}

/// The refresh loop's timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Time between refresh rounds.
    pub interval: Duration,
    /// Time without direct contact after which a member is forgotten.
    pub forget_after: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing { interval: DEFAULT_INTERVAL, forget_after: DEFAULT_FORGET_AFTER }
    }
}

/// What the owner must do to start a round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Resolve `name` and report the addresses (joined with `port`) with
    /// [`Directory::seeds_resolved`].
    Resolve {
        /// The name.
        name: String,
        /// The port to join each address with.
        port: u16,
    },
    /// Fetch these addresses' rosters.
    Ask(Vec<String>),
}

/// What one roster answer taught.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answered {
    /// Addresses to ask in this round as well.
    pub ask: Vec<String>,
    /// Invalid ids the roster carried (the owner reports them, one diagnostic per roster).
    pub invalid: Vec<MemberIdError>,
}

/// Counters of the refresh loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    /// Rounds started.
    pub rounds: u64,
    /// Roster fetches that answered with a whole roster.
    pub answers: u64,
    /// Roster fetches answered 304 (unchanged since the tag offered) by the member recorded at
    /// the address ([`Directory::unchanged`]).
    pub unchanged: u64,
    /// Roster fetches that failed.
    pub failures: u64,
    /// Seed resolutions that failed (the known seeds were kept).
    pub resolve_failures: u64,
    /// Members forgotten for silence.
    pub forgotten: u64,
    /// Member records dropped because another member answered at their address.
    pub displaced: u64,
    /// Members, addresses or callers refused because a table was full.
    pub refused: u64,
    /// Answers or callers that named this node's own id from elsewhere (a duplicate id).
    pub self_conflicts: u64,
    /// Members dropped at once because they announced their departure ([`Directory::left`]).
    pub left: u64,
}

#[derive(Clone, Debug)]
struct Known {
    addr: String,
    weight: f64,
    last_contact: Instant,
}

#[derive(Debug)]
struct Round {
    started: Instant,
    asked: BTreeSet<String>,
    pending: BTreeSet<String>,
    /// Counts the addresses added to `asked` and `pending` since the round began, for
    /// [`Directory::check_invariants`]'s `pending` within `asked`: only an addition can break
    /// that (`asked` never loses one, and `pending` only loses them otherwise).
    added: WalkGate,
}

/// The membership a node has learned, and its refresh loop; see the module doc.
#[derive(Debug)]
pub struct Directory {
    me: Member,
    seeds: Seeds,
    timing: Timing,
    /// Seed addresses last resolved (static seeds: the list).
    resolved: Vec<String>,
    /// Members met directly, self excluded. Changed only through [`Directory::record`],
    /// [`Directory::drop_member`] and [`Directory::forget`], which keep `by_addr` with it.
    members: BTreeMap<String, Known>,
    /// The member recorded at each address of `members` (one per address): the look-ups of an
    /// answer by address are O(log members), not a walk of them (a round asks every member, so a
    /// walk per answer made a round's cost grow with the square of the membership).
    by_addr: BTreeMap<String, String>,
    /// Counts the changes to which member `members` holds at which address, and so to
    /// `by_addr` (made by `record`, `drop_member` and `forget`; a contact's time is not one),
    /// for [`Directory::check_invariants`]'s walk of their agreement (O(members log members)
    /// string compares).
    index: WalkGate,
    /// Addresses heard of (not yet met), with when they were last heard.
    heard: BTreeMap<String, Instant>,
    round: Option<Round>,
    /// Since when a seed resolution is in flight.
    resolving: Option<Instant>,
    next_round: Instant,
    /// Quick rounds in a row ([`QUICK_ROUND`]).
    quick: u32,
    /// The tag (`ETag`) of the last whole roster each member's address answered, offered
    /// again as `If-None-Match` so that an unchanged roster comes back as a bodiless 304
    /// ([`Directory::tag_for`]); only for addresses a member is recorded at.
    tags: BTreeMap<String, String>,
    /// Members the view gained since the last round ended (callers met between rounds join at
    /// the next round's start), and the view's size when it ended.
    met: usize,
    settled: usize,
    view: View,
    changed: bool,
    stats: DirectoryStats,
    /// Members that announced their departure, until when a contact does not bring them back
    /// (an answer they sent before they left may still be on its way).
    departed: BTreeMap<String, Instant>,
    /// Error reports: when the last was let through, and how many were held back since.
    last_report: Option<Instant>,
    suppressed: u64,
}

impl Directory {
    /// A directory for `me` (its id validated by the caller, its address the advertised one);
    /// the first round is due at `now`.
    pub fn new(me: Member, seeds: Seeds, timing: Timing, now: Instant) -> Self {
        let me = Member { state: MemberState::Ready, weight: 1.0, ..me };
        let resolved = match &seeds {
            Seeds::Static(list) => list.clone(),
            Seeds::Dns { .. } => Vec::new(),
        };
        let timing = Timing {
            interval: if timing.interval.is_zero() { DEFAULT_INTERVAL } else { timing.interval },
            forget_after: if timing.forget_after.is_zero() {
                DEFAULT_FORGET_AFTER
            } else {
                timing.forget_after
            },
        };
        let view = View::new(vec![me.clone()]);
        Directory {
            me,
            seeds,
            timing,
            resolved,
            members: BTreeMap::new(),
            by_addr: BTreeMap::new(),
            index: WalkGate::default(),
            heard: BTreeMap::new(),
            round: None,
            resolving: None,
            next_round: now,
            quick: 0,
            tags: BTreeMap::new(),
            met: 0,
            settled: 1,
            view,
            changed: true,
            stats: DirectoryStats::default(),
            departed: BTreeMap::new(),
            last_report: None,
            suppressed: 0,
        }
    }

    /// The published view (self always in it).
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The new view, once, when the published one changed since the last call.
    pub fn take_view(&mut self) -> Option<View> {
        std::mem::take(&mut self.changed).then(|| self.view.clone())
    }

    /// The timings in force (zero durations replaced by the defaults).
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Counters.
    pub fn stats(&self) -> DirectoryStats {
        self.stats
    }

    /// When the next round is due, or when the seed resolution in flight times out
    /// ([`RESOLVE_BOUND`]: then call [`seeds_resolved`](Self::seeds_resolved) with an error);
    /// `None` while roster fetches are in flight.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.resolving, &self.round) {
            (Some(since), _) => Some(since + RESOLVE_BOUND),
            (None, None) => Some(self.next_round),
            (None, Some(_)) => None,
        }
    }

    /// Whether a seed resolution is in flight.
    pub fn is_resolving(&self) -> bool {
        self.resolving.is_some()
    }

    /// How long ago (at `now`) each member was last met directly, by id (self excluded).
    pub fn contacts(&self, now: Instant) -> Vec<(String, Duration)> {
        self.members
            .iter()
            .map(|(id, k)| (id.clone(), now.saturating_duration_since(k.last_contact)))
            .collect()
    }

    /// Starts a round at `now` (call it at [`poll_timeout`](Self::poll_timeout)). Forgets the
    /// members silent for longer than `forget_after` first.
    pub fn start_round(&mut self, now: Instant) -> Start {
        assert!(self.round.is_none() && self.resolving.is_none(), "one round at a time");
        self.stats.rounds += 1;
        self.forget(now);
        self.met += self.publish();
        match &self.seeds {
            Seeds::Dns { name, port } => {
                self.resolving = Some(now);
                Start::Resolve { name: name.clone(), port: *port }
            }
            Seeds::Static(_) => Start::Ask(self.begin(now)),
        }
    }

    /// The seed name resolved (addresses as `host:port`), or failed: the known seeds are kept.
    /// Answers the addresses to ask in this round.
    pub fn seeds_resolved(
        &mut self,
        result: Result<Vec<String>, String>,
        now: Instant,
    ) -> Vec<String> {
        assert!(self.resolving.take().is_some(), "a resolution was asked for");
        match result {
            Ok(mut addrs) => {
                addrs.retain(|a| is_host_port(a));
                addrs.sort();
                addrs.dedup();
                self.resolved = addrs;
            }
            Err(_) => self.stats.resolve_failures += 1,
        }
        self.begin(now)
    }

    fn begin(&mut self, now: Instant) -> Vec<String> {
        let mut targets: BTreeSet<String> = self.resolved.iter().cloned().collect();
        targets.extend(self.members.values().map(|k| k.addr.clone()));
        targets.extend(self.heard.keys().cloned());
        targets.remove(&self.me.addr);
        let asked: BTreeSet<String> = targets.into_iter().take(ROUND_ASKS_MAX).collect();
        let ask: Vec<String> = asked.iter().cloned().collect();
        self.round =
            Some(Round { started: now, pending: asked.clone(), asked, added: WalkGate::default() });
        if ask.is_empty() {
            self.end_round(now);
        }
        ask
    }

    /// Whether a round is in flight and waits for `addr`.
    pub fn is_pending(&self, addr: &str) -> bool {
        self.round.as_ref().is_some_and(|r| r.pending.contains(addr))
    }

    /// A roster fetch from `addr` asked in this round ended: the roster and the responder's
    /// self-reported id, or why not.
    pub fn answered(
        &mut self,
        addr: &str,
        result: Result<(Roster, Option<String>), String>,
        now: Instant,
    ) -> Answered {
        let round = self.round.as_mut().expect("answers come during a round");
        assert!(round.pending.remove(addr), "{addr} was asked in this round");
        let mut out = Answered::default();
        match result {
            Err(_) => self.stats.failures += 1,
            Ok((roster, responder)) => {
                self.stats.answers += 1;
                out.invalid = roster.invalid;
                if let Some(id) = responder.as_deref().filter(|id| validate_member_id(id).is_ok()) {
                    // The responder's own entry carries its advertised address (the decoder
                    // added it at the dialed address when the body left it out).
                    let own = roster.members.iter().find(|m| m.id == id);
                    let (own_addr, weight) =
                        own.map_or((addr.to_owned(), 1.0), |m| (m.addr.clone(), m.weight));
                    self.credit(id, &own_addr, weight, now);
                }
                for m in &roster.members {
                    if m.id == self.me.id || responder.as_deref() == Some(m.id.as_str()) {
                        continue;
                    }
                    let met_there = self.members.get(&m.id).is_some_and(|k| k.addr == m.addr);
                    if !met_there && m.addr != self.me.addr && is_host_port(&m.addr) {
                        self.hear(&m.addr, now);
                    }
                }
                let round = self.round.as_mut().expect("still in the round");
                for a in self.heard.keys() {
                    if round.asked.len() >= ROUND_ASKS_MAX {
                        break;
                    }
                    if round.asked.insert(a.clone()) {
                        round.added.changed();
                        round.pending.insert(a.clone());
                        out.ask.push(a.clone());
                    }
                }
            }
        }
        if self.round.as_ref().is_some_and(|r| r.pending.is_empty()) {
            self.end_round(now);
        }
        out
    }

    /// The tag of the last whole roster `addr` answered, while a member is recorded at `addr`:
    /// the round's fetch offers it (`If-None-Match`), and a responder whose roster did not
    /// change answers 304 with no body ([`Directory::unchanged`]).
    pub fn tag_for(&self, addr: &str) -> Option<&str> {
        let tag = self.tags.get(addr)?;
        self.by_addr.contains_key(addr).then_some(tag.as_str())
    }

    /// Remembers `tag` as the tag of the whole roster `addr` just answered (its `ETag`; `None`
    /// forgets it: a responder that sent none).
    pub fn note_tag(&mut self, addr: &str, tag: Option<String>) {
        match tag {
            Some(tag) if self.by_addr.contains_key(addr) => {
                self.tags.insert(addr.to_owned(), tag);
            }
            _ => {
                self.tags.remove(addr);
            }
        }
    }

    /// `addr`, asked in this round with its tag, answered that its roster did not change (304),
    /// naming itself `responder`: direct contact with the member recorded there, whose roster
    /// teaches nothing new (every address it names was heard when it was whole). A responder
    /// that is not the member recorded at `addr` credits nobody, and the tag is forgotten (the
    /// next round fetches the whole roster).
    pub fn unchanged(&mut self, addr: &str, responder: Option<&str>, now: Instant) -> Answered {
        let round = self.round.as_mut().expect("answers come during a round");
        assert!(round.pending.remove(addr), "{addr} was asked in this round");
        let known = responder.and_then(|id| {
            let k = self.members.get(id).filter(|k| k.addr == addr)?;
            Some((id.to_owned(), k.weight))
        });
        match known {
            Some((id, weight)) => {
                self.stats.unchanged += 1;
                self.credit(&id, addr, weight, now);
            }
            None => {
                self.stats.failures += 1;
                self.tags.remove(addr);
            }
        }
        if self.round.as_ref().is_some_and(|r| r.pending.is_empty()) {
            self.end_round(now);
        }
        Answered::default()
    }

    /// An inbound roster request named its caller `id` and the caller's advertised `addr`:
    /// direct contact. Returns whether it was taken (a valid id other than ours, a `host:port`).
    pub fn caller(&mut self, id: &str, addr: &str, now: Instant) -> bool {
        if validate_member_id(id).is_err() || !is_host_port(addr) {
            return false;
        }
        if id == self.me.id {
            if addr != self.me.addr {
                self.stats.self_conflicts += 1;
            }
            return false;
        }
        self.credit(id, addr, 1.0, now)
    }

    /// Member `id` announced it is leaving from `addr` (a drain, spec/overlay.md §5): it is
    /// dropped from the view at once instead of after `forget_after`. Only the member recorded
    /// at that address leaves (an announcement from an old address of a member that moved is
    /// ignored). For one `interval` after `now` no contact brings it back (a roster answer it
    /// sent before it left may still arrive); after that a direct contact does, like for any
    /// member (a process started again under the same id). Returns whether it left.
    pub fn left(&mut self, id: &str, addr: &str, now: Instant) -> bool {
        let recorded = self.members.get(id).is_some_and(|k| k.addr == addr);
        if !recorded {
            return false;
        }
        self.departed.retain(|_, until| *until > now);
        if self.departed.len() < MEMBERS_MAX {
            self.departed.insert(id.to_owned(), now.saturating_add(self.timing.interval));
        }
        self.drop_member(id);
        self.heard.remove(addr);
        self.stats.left += 1;
        self.publish();
        assert!(self.view.get(id).is_none(), "a member that left is out of the view");
        true
    }

    /// Reports a discovery error at `now`: `Some(suppressed)` when it should be told (with how
    /// many were held back since the last one told), `None` when it is held back.
    pub fn report_error(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_report
            .is_none_or(|t| now.saturating_duration_since(t) >= ERROR_REPORT_PERIOD);
        if due {
            self.last_report = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    fn credit(&mut self, id: &str, addr: &str, weight: f64, now: Instant) -> bool {
        if id == self.me.id {
            self.stats.self_conflicts += 1;
            return false;
        }
        if self.departed.get(id).is_some_and(|until| now < *until) {
            return false; // it announced its departure a moment ago
        }
        if !self.members.contains_key(id) && self.members.len() >= MEMBERS_MAX {
            self.stats.refused += 1;
            return false;
        }
        // Whoever was recorded at this address is not there any more.
        if let Some(other) = self.by_addr.get(addr).filter(|other| other.as_str() != id).cloned() {
            self.drop_member(&other);
            self.stats.displaced += 1;
        }
        self.heard.remove(addr);
        let weight = if weight > 0.0 { weight } else { 1.0 };
        self.record(id, Known { addr: addr.to_owned(), weight, last_contact: now });
        true
    }

    /// Records member `id` as `known` (replacing what was recorded for it), keeping `by_addr`: the
    /// caller has dropped any other member recorded at the same address.
    fn record(&mut self, id: &str, known: Known) {
        if let Some(old) = self.members.get_mut(id).filter(|old| old.addr == known.addr) {
            // The same member at the same address: the index does not change.
            *old = known;
            return;
        }
        self.index.changed();
        let addr = known.addr.clone();
        if let Some(old) = self.members.insert(id.to_owned(), known) {
            self.by_addr.remove(&old.addr);
        }
        let displaced = self.by_addr.insert(addr, id.to_owned());
        debug_assert!(displaced.is_none_or(|other| other == id), "one member per address");
    }

    /// Drops member `id`, and its address from `by_addr`.
    fn drop_member(&mut self, id: &str) {
        if let Some(k) = self.members.remove(id) {
            self.index.changed();
            self.by_addr.remove(&k.addr);
        }
    }

    fn hear(&mut self, addr: &str, now: Instant) {
        if self.heard.contains_key(addr) || self.heard.len() < HEARD_MAX {
            self.heard.insert(addr.to_owned(), now);
        } else {
            self.stats.refused += 1;
        }
    }

    fn forget(&mut self, now: Instant) {
        let forget_after = self.timing.forget_after;
        let before = self.members.len();
        let by_addr = &mut self.by_addr;
        self.members.retain(|_, k| {
            let keep = now.saturating_duration_since(k.last_contact) <= forget_after;
            if !keep {
                by_addr.remove(&k.addr);
            }
            keep
        });
        let forgotten = before - self.members.len();
        if forgotten > 0 {
            self.index.changed();
        }
        self.stats.forgotten += forgotten as u64;
        self.heard.retain(|_, heard| now.saturating_duration_since(*heard) <= forget_after);
    }

    /// Ends the round: publishes what it met, and sets the next round due one interval after
    /// this one started, or sooner ([`QUICK_ROUND`]) when this round found the view far from
    /// whole.
    fn end_round(&mut self, now: Instant) {
        let round = self.round.take().expect("a round to end");
        self.forget(now);
        let met = std::mem::take(&mut self.met) + self.publish();
        let by_addr = &self.by_addr;
        self.tags.retain(|addr, _| by_addr.contains_key(addr));
        // Alone: no seed answered yet (a boot where this node came up first).
        let alone = self.view.members().len() == 1;
        let far_from_whole = alone || (met > 0 && met * 4 >= self.settled);
        self.settled = self.view.members().len();
        let delay = if far_from_whole && self.quick < QUICK_ROUNDS_MAX {
            self.quick += 1;
            (QUICK_ROUND * (1 << (self.quick - 1))).min(self.timing.interval)
        } else {
            if !far_from_whole {
                self.quick = 0;
            }
            self.timing.interval
        };
        self.next_round = (round.started + delay).max(now);
    }

    /// Publishes the members as the view; returns how many of them the view did not hold.
    fn publish(&mut self) -> usize {
        let mut members: Vec<Member> = self
            .members
            .iter()
            .map(|(id, k)| Member {
                id: id.clone(),
                addr: k.addr.clone(),
                weight: k.weight,
                state: MemberState::Ready,
            })
            .collect();
        members.push(self.me.clone());
        let view = View::new(members);
        let met = view.members().iter().filter(|m| self.view.get(&m.id).is_none()).count();
        if view != self.view {
            self.view = view;
            self.changed = true;
        }
        met
    }

    /// Asserts the directory's invariants.
    pub fn check_invariants(&self) {
        assert!(self.view.get(&self.me.id).is_some(), "self is always in the view");
        assert!(!self.members.contains_key(&self.me.id), "self is not a learned member");
        assert!(self.departed.len() <= MEMBERS_MAX);
        assert!(self.members.len() <= MEMBERS_MAX && self.heard.len() <= HEARD_MAX);
        assert!(self.tags.len() <= MEMBERS_MAX + ROUND_ASKS_MAX, "tags past their bound");
        assert_eq!(self.by_addr.len(), self.members.len(), "by_addr holds only members' addresses");
        // One member per address follows: `by_addr` names one member per address, every
        // member is named at its own, and there are as many addresses as members. (Checked
        // without a set of its own, and walked again only after a change.)
        self.index.walk(|| {
            for (id, k) in &self.members {
                assert_eq!(
                    self.by_addr.get(&k.addr),
                    Some(id),
                    "by_addr names the member at {}",
                    k.addr
                );
            }
        });
        if let Some(r) = &self.round {
            assert!(r.pending.len() <= r.asked.len() && self.resolving.is_none());
            r.added.walk(|| {
                assert!(r.pending.is_subset(&r.asked), "a pending address was not asked");
            });
        }
    }
}

#[cfg(test)]
mod tests;
