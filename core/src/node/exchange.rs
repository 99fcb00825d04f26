//! Outbound exchanges: their bounds as timers and the routing of their progress to the job they
//! serve (an origin flight, a peer fetch, a passthrough, a roster fetch).

use super::body::BodyBuf;
use super::io::{Endpoint, Headers, IoEvent, IoId, IoRequest, Output, Purpose, RequestId};
use super::Node;
use crate::breaker::Permit;
use crate::codec::wire::{HEADER_BUDGET, HEADER_PROGRESS};
use crate::engine::flight::{FlightId, FlightKey};
use crate::engine::origin::BodyPlan;
use crate::engine::ObjectMeta;
use crate::time::Instant;
use bytes::{Bytes, BytesMut};
use std::time::Duration;

/// The shortest head wait of a held-only ask ([`Node::held_only_head_bound`]): a held block's
/// head on a busy link may queue behind other bytes for tens of milliseconds.
pub(super) const HELD_ONLY_HEAD_FLOOR: Duration = Duration::from_millis(100);

/// What a relay keeps of its requester's head budget for itself: it waits on its own upstream
/// for the budget less this margin, and answers its requester when half the margin is left.
pub(super) fn budget_margin(budget: Duration) -> Duration {
    (budget / 16).max(Duration::from_millis(20))
}

/// Who an origin exchange answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owner {
    /// A coalesced flight and its waiters.
    Flight(FlightId),
    /// One request, uncoalesced (table full, or a joiner's refusal retry).
    Alone(RequestId),
}

/// How much of an origin body has been read.
#[derive(Debug)]
pub(super) enum OriginBody {
    /// Waiting for the head.
    Head,
    /// Reading a block window under `plan`: `skip` bytes still to discard, then into `buf`;
    /// `meta` is what the head said of the object (the version the bytes are of).
    Reading { plan: BodyPlan, skip: u64, buf: BodyBuf, meta: Box<ObjectMeta> },
}

/// A read waiting on a peer block fetch.
#[derive(Debug)]
pub(super) struct Reader {
    pub rid: RequestId,
    /// Which contender of its request's race this fetch is.
    pub contender: crate::engine::Contender,
    /// A relay's read that may cut through.
    pub stream: bool,
    /// The relay committed its head to this stream.
    pub streaming: bool,
    /// Bytes already forwarded to its requester (never the last byte before the end).
    pub forwarded: u64,
    /// Its own progress bound, when tighter than the fetch's: a relay that joined a fetch begun
    /// for a read with a looser bound ([`Node::peer_progress_bound`]). Past it the reader leaves
    /// the fetch as if its own had stopped ([`Node::drop_stalled_readers`]); the fetch goes on.
    pub progress: Option<Duration>,
}

/// A peer block fetch. Reads of this node that need the same block from the same peer share
/// one fetch (see `Node::joinable`): the first asked, the others joined; each reader gets the
/// answer as if the fetch were its own, while the peer's outcome is recorded once, on the
/// fetch's own permit.
#[derive(Debug)]
pub(super) struct PeerJob {
    /// A driver's direct fetch ([`super::Input::FetchBlock`]), which answers no read.
    pub ticket: Option<u64>,
    /// The reads it answers, in the order they asked or joined (requests that dropped this
    /// fetch are removed; a fetch no read waits on is cancelled).
    pub readers: Vec<Reader>,
    /// The identity of the object the block belongs to, when a read asked (to check the
    /// answer's version).
    pub object: Option<String>,
    pub key: crate::hash::BlockKey,
    pub permit: Option<Permit<String>>,
    pub addr: String,
    /// The member the fetch asks (never joined by a relay serving that member).
    pub member: String,
    pub expected: u64,
    /// A held-only ask (`X-DART-Held-Only`): its answer must name the version the read
    /// serves, for an object that may change.
    pub held_only: bool,
    /// No read waits on it any more, but it runs to its end so that its outcome is recorded
    /// against the peer ([`crate::engine::Action::CancelPeer`]`::run_on`).
    pub run_on: bool,
    /// The block's bytes so far, at most `expected`.
    pub copy: BodyBuf,
    /// The bytes after the block: its digest footer ([`crate::integrity`]), at most
    /// [`crate::integrity::FOOTER_LEN`] `+ 1`.
    pub footer: Vec<u8>,
}

/// What an exchange is for.
#[derive(Debug)]
pub(super) enum Job {
    Origin {
        key: FlightKey,
        owner: Owner,
        body: OriginBody,
    },
    Peer(PeerJob),
    /// One client read's bytes deep in a block window its flight fetches ([`super::lead_in`]).
    LeadIn(Box<super::lead_in::LeadIn>),
    Passthrough {
        request: RequestId,
        head_only: bool,
    },
    /// A credential check (see `access`).
    Check {
        credential: super::access::Credential,
    },
    Roster {
        /// The driver's ticket (an [`Event::Roster`] answers it), or `None`: discovery asked.
        ticket: Option<u64>,
        addr: String,
        /// The neighbour this fetch pings (its outcome is scored), if it is a ping.
        ping: Option<String>,
        /// The broadcast target this fetch pings (its round's token and the member id).
        target_ping: Option<(crate::overlay::targets::RoundToken, String)>,
        permit: Option<Permit<String>>,
        responder: Option<String>,
        body: BytesMut,
        /// A discovery fetch offered the tag of the roster it last had (`If-None-Match`).
        offered: bool,
        /// The answer's `ETag` (a whole roster), or the 304 that said it did not change.
        etag: Option<String>,
        unchanged: bool,
    },
    /// A departure announcement to a broadcast target (`POST /peer/v1/leave`).
    Leave,
    /// A JOIN to an object's tracker (spec/tracker.md §4).
    Tracker {
        file: String,
        body: BytesMut,
    },
}

/// One outbound exchange.
#[derive(Debug)]
pub(super) struct Exchange {
    pub endpoint: Endpoint,
    pub url: String,
    pub sent: Instant,
    pub connected: bool,
    pub head: bool,
    /// When the head arrived.
    pub head_at: Option<Instant>,
    dial: Duration,
    head_bound: Duration,
    /// The head bound counts from the connection, not from the request (a held-only ask's
    /// short bound: until connected, the dial bound is the exchange's, so a peer that cannot
    /// be reached is a failed dial, judged as one, and not a head that came late; its readers
    /// leave earlier, at [`Exchange::ask_wait`]).
    head_from_connect: bool,
    /// `None`: no whole-exchange bound (a passthrough body may be a whole object).
    request_bound: Option<Duration>,
    /// Longest gap between body parts once the head arrived (peer fetches: a body that stops
    /// moving is cut off here, not at the whole-request bound).
    progress_bound: Option<Duration>,
    /// The tightest of its readers' own progress bounds ([`Reader::progress`]), if any.
    pub reader_bound: Option<Duration>,
    /// How long the readers of a held-only ask wait for its connection (its short head bound,
    /// [`Node::held_only_head_bound`]): past it they leave it for the origin, charging nobody,
    /// and the dial runs on to the dial bound to record how the peer answers. `None` once they
    /// left, and for any other exchange.
    pub ask_wait: Option<Duration>,
    /// When the head or the last body part arrived.
    pub last_progress: Instant,
    deadline: Option<Instant>,
    pub job: Job,
}

impl Exchange {
    /// How the exchange, ending `now`, took its time once its head came: the wait for the head
    /// and the transfer after it ([`super::flights::OriginPace`]); `None` before a head.
    pub fn pace(&self, now: Instant) -> Option<super::flights::OriginPace> {
        let head_at = self.head_at?;
        Some(super::flights::OriginPace {
            wait: head_at.saturating_duration_since(self.sent),
            transfer: now.saturating_duration_since(head_at),
        })
    }

    pub fn request(&self) -> Option<RequestId> {
        match &self.job {
            Job::Origin { owner: Owner::Alone(rid), .. } => Some(*rid),
            Job::Peer(p) => p.readers.first().map(|r| r.rid),
            Job::Passthrough { request, .. } => Some(*request),
            Job::Origin { owner: Owner::Flight(_), .. }
            | Job::LeadIn(_)
            | Job::Roster { .. }
            | Job::Leave
            | Job::Tracker { .. }
            | Job::Check { .. } => None,
        }
    }

    /// Whether this exchange answers request `rid` (a shared peer fetch answers several).
    pub fn serves(&self, rid: RequestId) -> bool {
        match &self.job {
            Job::Peer(p) => p.readers.iter().any(|r| r.rid == rid),
            _ => self.request() == Some(rid),
        }
    }

    pub fn purpose(&self) -> Purpose {
        match &self.job {
            Job::Origin { key: FlightKey::Probe(_), .. } => Purpose::Probe,
            Job::Origin { key: FlightKey::Block(..), .. } => Purpose::Window,
            Job::LeadIn(_) => Purpose::LeadIn,
            Job::Peer(_) => Purpose::PeerBlock,
            Job::Passthrough { .. } => Purpose::Passthrough,
            Job::Roster { .. } | Job::Leave => Purpose::Roster,
            Job::Tracker { .. } => Purpose::Tracker,
            Job::Check { .. } => Purpose::Check,
        }
    }

    pub fn flight(&self) -> Option<FlightId> {
        match &self.job {
            Job::Origin { owner: Owner::Flight(fid), .. } => Some(*fid),
            Job::Origin { owner: Owner::Alone(_), .. }
            | Job::Peer(_)
            | Job::LeadIn(_)
            | Job::Passthrough { .. }
            | Job::Roster { .. }
            | Job::Leave
            | Job::Tracker { .. }
            | Job::Check { .. } => None,
        }
    }

    pub fn into_permit(self) -> Option<Permit<String>> {
        match self.job {
            Job::Peer(p) => p.permit,
            Job::Roster { permit, .. } => permit,
            Job::Origin { .. }
            | Job::LeadIn(_)
            | Job::Passthrough { .. }
            | Job::Check { .. }
            | Job::Leave
            | Job::Tracker { .. } => None,
        }
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The whole-exchange bound (`Duration::MAX` for none).
    pub fn request_bound(&self) -> Duration {
        self.request_bound.unwrap_or(Duration::MAX)
    }

    /// The exchange's own bound on a body that stops moving, if it has one.
    pub fn progress_bound(&self) -> Option<Duration> {
        self.progress_bound
    }

    /// The earliest bound still in force.
    fn compute_deadline(&self) -> Option<Instant> {
        let own = self.own_deadline();
        let reader = match (self.head, self.reader_bound) {
            (true, Some(b)) => Some(self.last_progress.saturating_add(b)),
            _ => None,
        };
        let ask = self.ask_wait.filter(|_| !self.connected).map(|w| self.sent.saturating_add(w));
        [own, reader, ask].into_iter().flatten().min()
    }

    /// The earliest of the exchange's own bounds, its readers' own aside.
    pub fn own_deadline(&self) -> Option<Instant> {
        let request = self.request_bound.map(|b| self.sent.saturating_add(b));
        let head = match (self.head, self.head_from_connect, self.connected) {
            (true, _, _) | (false, true, false) => None,
            (false, false, _) => Some(self.sent.saturating_add(self.head_bound)),
            // Connected: `last_progress` is when.
            (false, true, true) => Some(self.last_progress.saturating_add(self.head_bound)),
        };
        let dial = (!self.connected).then(|| self.sent.saturating_add(self.dial));
        let progress = match (self.head, self.progress_bound) {
            (true, Some(b)) => Some(self.last_progress.saturating_add(b)),
            _ => None,
        };
        [request, head, dial, progress].into_iter().flatten().min()
    }

    /// The body moved (or the head arrived) at `now`.
    pub fn progressed(&mut self, now: Instant) {
        self.last_progress = now;
    }

    /// Which bound fired at `now`: the dial bound while unconnected, else the head or request
    /// bound. Returns a description for errors.
    pub fn expired(&self, now: Instant) -> Expiry {
        if !self.connected && now >= self.sent.saturating_add(self.dial) {
            Expiry::Dial(self.dial)
        } else if !self.head {
            Expiry::Head(self.head_bound.min(self.request_bound.unwrap_or(Duration::MAX)))
        } else if let Some(b) =
            self.progress_bound.filter(|b| now >= self.last_progress.saturating_add(*b))
        {
            Expiry::Progress(b)
        } else {
            Expiry::Request(self.request_bound.unwrap_or(Duration::MAX))
        }
    }
}

/// Which bound ended an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    Dial(Duration),
    Head(Duration),
    Request(Duration),
    Progress(Duration),
}

impl Expiry {
    /// How a peer exchange that ran out of time is judged: a dial that never finished is a dial
    /// failure, any later bound a timeout of our own.
    pub fn observation(self) -> crate::breaker::Observation {
        match self {
            Expiry::Dial(_) => crate::breaker::Observation::DialFailed,
            Expiry::Head(_) | Expiry::Request(_) | Expiry::Progress(_) => {
                crate::breaker::Observation::TimedOut
            }
        }
    }
}

impl std::fmt::Display for Expiry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expiry::Dial(d) => write!(f, "dial timed out after {d:?}"),
            Expiry::Head(d) => write!(f, "no response head within {d:?}"),
            Expiry::Request(d) => write!(f, "request timed out after {d:?}"),
            Expiry::Progress(d) => write!(f, "the body stopped moving for {d:?}"),
        }
    }
}

impl Node {
    /// Starts an exchange: queues the `GET` and arms its bounds. Passthroughs have no whole-request
    /// bound.
    pub(super) fn start_exchange(
        &mut self,
        endpoint: Endpoint,
        url: String,
        headers: Headers,
        job: Job,
        now: Instant,
    ) -> IoId {
        self.start_request(endpoint, url, headers, Bytes::new(), job, now)
    }

    /// Starts an exchange that sends `body` (a `POST`; a `GET` when empty).
    pub(super) fn start_request(
        &mut self,
        endpoint: Endpoint,
        url: String,
        headers: Headers,
        body: Bytes,
        job: Job,
        now: Instant,
    ) -> IoId {
        let id = self.next_io_id();
        let method = if body.is_empty() { "GET" } else { "POST" };
        let (dial, head_bound, request) = self.config.bounds.exchange(endpoint == Endpoint::Peer);
        // A JOIN is a control-plane answer the node can do without: spec/tracker.md's 2 s.
        let (head_bound, request) = match &job {
            Job::Tracker { .. } => (
                head_bound.min(crate::tracker::JOIN_BOUND),
                request.min(crate::tracker::JOIN_BOUND),
            ),
            Job::Leave => (
                head_bound.min(super::broadcast::LEAVE_BOUND),
                request.min(super::broadcast::LEAVE_BOUND),
            ),
            _ => (head_bound, request),
        };
        let mut headers = headers;
        let head_from_connect = matches!(&job, Job::Peer(p) if p.held_only);
        let ask_wait = head_from_connect.then(|| self.held_only_head_bound());
        let head_bound = match &job {
            Job::Peer(p) => {
                let mut bound = self.peer_head_bound(p.readers.first().map(|r| r.rid));
                if p.held_only {
                    bound = bound.min(self.held_only_head_bound());
                }
                // The peer learns how long we wait for its head (a relay answers within it).
                headers.push(HEADER_BUDGET, bound.as_millis().to_string());
                bound
            }
            _ => head_bound,
        };
        if endpoint == Endpoint::Peer {
            self.sign_peer_request(method, &url, &body, &mut headers, now);
        }
        // A peer body that stops moving is cut off after about one estimated block time plus
        // a margin (without an estimate yet: the margin twice); a relay's, a margin before its
        // requester's would be, and the peer learns the bound as its own requester's.
        let progress_bound = match (&job, endpoint) {
            (Job::Peer(p), Endpoint::Peer) => {
                let bound = self.peer_progress_bound(p.readers.first().map(|r| r.rid), request);
                headers.push(HEADER_PROGRESS, bound.as_millis().max(1).to_string());
                Some(bound)
            }
            _ => None,
        };
        let request_bound = match job {
            Job::Passthrough { .. } => None,
            Job::Origin { .. }
            | Job::LeadIn(_)
            | Job::Peer(_)
            | Job::Roster { .. }
            | Job::Leave
            | Job::Tracker { .. }
            | Job::Check { .. } => Some(request),
        };
        let mut x = Exchange {
            endpoint,
            url: url.clone(),
            sent: now,
            connected: false,
            head: false,
            head_at: None,
            dial,
            head_bound,
            head_from_connect,
            request_bound,
            progress_bound,
            reader_bound: None,
            ask_wait,
            last_progress: now,
            deadline: None,
            job,
        };
        x.deadline = x.compute_deadline();
        if let Some(at) = x.deadline {
            self.timers.insert((at, id));
        }
        let (purpose, request) = (x.purpose(), x.request());
        let previous = self.exchanges.insert(id, Box::new(x));
        assert!(previous.is_none(), "exchange ids are never reused");
        self.counters.exchanges += 1;
        let send = IoRequest { id, endpoint, purpose, request, url, method, headers, body };
        self.emit(Output::Send(send));
        id
    }

    /// How long a peer fetch for `reader` waits for its response head: four times the p99 of
    /// recent peer fetches that held their block, within [`Bounds::peer_head_floor`] and
    /// [`Bounds::peer_head`]; without an estimate yet, one and a half times the floor (1.5 s by
    /// default, within the cap): a node that just started does not give a stalled peer the
    /// whole cap (3 s until shared peer fetches ended the herd's cold-start queues; 1.5 s keeps
    /// every scenario green and halves what a cold node pays a stalled peer);
    /// for a relay, also less than
    /// its requester's budget by [`budget_margin`], so that it can answer its requester in time.
    pub(super) fn peer_head_bound(&self, reader: Option<RequestId>) -> Duration {
        let b = &self.config.bounds;
        let adaptive = match self.engine.peer_latency(0.99) {
            Some(p99) => p99.saturating_mul(4).clamp(b.peer_head_floor, b.peer_head),
            None => b.cold_peer_head(),
        };
        let budget = reader.and_then(|rid| self.requests.get(&rid)).and_then(|r| r.budget);
        match budget {
            Some(budget) => adaptive.min(budget.saturating_sub(budget_margin(budget))),
            None => adaptive,
        }
        .max(Duration::from_millis(1))
    }

    /// How long a held-only ask (a neighbour's or the home's successor's before the origin, or
    /// a hedge's liveness probe) waits for its head: it needs no upstream, so a live peer
    /// answers it in about a round trip, and it waits as long as a liveness probe
    /// ([`crate::engine::probe_wait`]: a quarter of the hedge delay, the estimated tail of a
    /// normal block fetch, or of [`crate::engine::hedge::COLD_DELAY`] without an estimate or
    /// with hedging off), at least [`HELD_ONLY_HEAD_FLOOR`], counted from the connection (the
    /// dial bound governs reaching the peer). With the full head bound, a stalled (SIGSTOPped)
    /// successor cost the home's first read on three real nodes five cold head waits (7.7 s
    /// against 0.16 s), one per block until its circuit opened; with a whole cold hedge delay
    /// (375 ms), a root whose successor stalls read nothing ahead while its windows' held-only
    /// asks waited it out (`stalled-peer`, `stalled-successor`: about 0.3 s per read).
    pub(super) fn held_only_head_bound(&self) -> Duration {
        let delay = self.engine.hedge_delay().unwrap_or(crate::engine::hedge::COLD_DELAY);
        crate::engine::probe_wait(delay).max(HELD_ONLY_HEAD_FLOOR)
    }

    /// How long a peer fetch for `reader` lets the peer's body stand still: the p99 of recent
    /// peer fetches that held their block plus [`Bounds::peer_progress_margin`] (the margin
    /// twice without an estimate), within the whole-request bound `request`; for a relay, also
    /// less than its requester's progress bound by [`budget_margin`]. A relay waiting on a
    /// stalled upstream body then gives up on it first, and its abort (a broken body) reaches
    /// its requester before the requester's own bound would time it out: in a chain that
    /// streams one block, every hop's body stops at once, and without the margin each hop's
    /// bound fired within a millisecond of its upstream's and timed out an honest relay.
    pub(super) fn peer_progress_bound(
        &self,
        reader: Option<RequestId>,
        request: Duration,
    ) -> Duration {
        let margin = self.config.bounds.peer_progress_margin;
        let block_time = self.engine.peer_latency(0.99).unwrap_or(margin);
        let own = block_time.saturating_add(margin).min(request);
        let theirs = reader.and_then(|rid| self.requests.get(&rid)).and_then(|r| r.progress);
        match theirs {
            Some(p) => own.min(p.saturating_sub(budget_margin(p))),
            None => own,
        }
        .max(Duration::from_millis(1))
    }

    /// Forgets exchange `io` and its timer (the caller emits `Cancel` when the driver must stop).
    pub(super) fn remove_exchange(&mut self, io: IoId) -> Option<Box<Exchange>> {
        let x = self.exchanges.remove(&io)?;
        if let Some(at) = x.deadline {
            self.timers.remove(&(at, io));
        }
        if let Job::Peer(p) = &x.job {
            let entry = (p.key, p.addr.clone());
            if self.shared_fetches.get(&entry) == Some(&io) {
                self.shared_fetches.remove(&entry);
            }
        }
        Some(x)
    }

    /// Recomputes exchange `io`'s deadline after its phase moved on.
    pub(super) fn rearm(&mut self, io: IoId) {
        let Some(x) = self.exchanges.get_mut(&io) else { return };
        let next = x.compute_deadline();
        if next == x.deadline {
            return;
        }
        if let Some(at) = x.deadline {
            self.timers.remove(&(at, io));
        }
        x.deadline = next;
        if let Some(at) = next {
            self.timers.insert((at, io));
        }
    }

    /// Routes progress of exchange `io`. Events of an exchange the node already gave up are
    /// ignored: the driver may have queued them before it saw the cancel.
    pub(super) fn on_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        let Some(x) = self.exchanges.get_mut(&io) else { return };
        match &event {
            IoEvent::Connected => {
                assert!(!x.head, "{io}: connected after its head");
                x.connected = true;
                x.progressed(now);
                self.rearm(io);
                return;
            }
            IoEvent::Head { .. } => {
                assert!(!x.head, "{io}: a second response head");
                x.connected = true;
                x.head = true;
                x.head_at = Some(now);
                x.progressed(now);
            }
            IoEvent::Body(_) => {
                assert!(x.head, "{io}: body before the head");
                x.progressed(now);
            }
            IoEvent::End => assert!(x.head, "{io}: end before the head"),
            IoEvent::Failed(_) => {}
        }
        self.rearm(io);
        match self.exchanges[&io].job {
            Job::Origin { .. } => self.origin_io(io, event, now),
            Job::LeadIn(_) => self.lead_in_io(io, event, now),
            Job::Peer(_) => self.peer_io(io, event, now),
            Job::Passthrough { .. } => self.passthrough_io(io, event, now),
            Job::Roster { .. } => self.roster_io(io, event, now),
            Job::Leave => self.leave_io(io, event, now),
            Job::Tracker { .. } => self.tracker_io(io, event, now),
            Job::Check { .. } => self.check_io(io, event, now),
        }
    }

    /// A bound of exchange `io` fired at `now`.
    pub(super) fn on_deadline(&mut self, io: IoId, now: Instant) {
        let x = &self.exchanges[&io];
        if matches!(x.job, Job::Peer(_)) && x.own_deadline().is_none_or(|t| t > now) {
            // Only readers' own bounds passed: they leave, the fetch goes on (no exchange
            // hit its bound).
            return self.drop_stalled_readers(io, now);
        }
        self.counters.timeouts += 1;
        let expiry = x.expired(now);
        match &x.job {
            Job::Origin { .. } => self.origin_expired(io, expiry, now),
            Job::LeadIn(_) => self.lead_in_expired(io, expiry),
            Job::Peer(_) => self.peer_expired(io, expiry, now),
            Job::Passthrough { .. } => self.passthrough_expired(io, expiry, now),
            Job::Roster { .. } => self.roster_expired(io, expiry, now),
            Job::Leave => self.leave_expired(io, expiry, now),
            Job::Tracker { .. } => self.tracker_expired(io, expiry, now),
            Job::Check { .. } => self.check_expired(io, expiry, now),
        }
        debug_assert!(
            self.exchanges.get(&io).is_none_or(|x| x.deadline.is_none_or(|t| t > now)),
            "an expired exchange must end or re-arm later"
        );
    }
}
