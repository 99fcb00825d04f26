//! The node's broadcast targets (spec/overlay.md §4, §5) and its departure announcement.
//!
//! The designated set is the top of the roster by HRW on one fixed key ([`BROADCAST_KEY`]):
//! every node designates the same members, so announcements converge on them. A ping is a
//! roster fetch naming this node and its address, so a ping round is also the joining node's
//! announcement: every target that answers has met it directly and publishes it at the end of
//! its own round. A draining node sends `POST /peer/v1/leave` to its targets
//! ([`Input::Drain`](super::Input::Drain)); a target with discovery drops it from its view at
//! once ([`crate::discovery::Directory::left`]) instead of after `forget_after`.
//!
//! The seed list is not designated (spec §5 names it): seeds are addresses, not member ids, and
//! discovery asks every seed each round anyway.

use super::exchange::{Expiry, Job};
use super::io::{Endpoint, Event, Headers, Inbound, IoEvent, IoId, Output, Plane, RequestId};
use super::Node;
use crate::codec::wire::{HEADER_NODE, LEAVE_PATH};
use crate::hash::ChunkKey;
use crate::membership::validate_member_id;
use crate::overlay::targets::{BroadcastTargets, Config, RoundToken};
use crate::rng::Rng;
use crate::time::Instant;
use bytes::Bytes;
use std::time::Duration;

/// The HRW key whose ranking of the roster designates the broadcast targets.
pub const BROADCAST_KEY: u64 = 0x6461_7274_2f62_6361; // "dart/bca"
/// Members designated per target kept: spares for the ping rounds to replace the dead with.
pub const DESIGNATED_PER_TARGET: usize = 2;
/// How long a leave announcement may take (spec §4's send timeout).
pub const LEAVE_BOUND: Duration = Duration::from_millis(500);
/// Largest leave announcement body accepted.
pub const LEAVE_BODY_MAX: usize = 1024;

/// A leave announcement: who leaves, from which address.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Leave {
    id: String,
    addr: String,
}

/// The broadcast targets and the drain in progress.
#[derive(Debug)]
pub(super) struct Broadcast {
    targets: BroadcastTargets<String>,
    rng: Rng,
    /// The departure announced: (sent, answered, still in flight).
    leaving: Option<(usize, usize, usize)>,
}

impl Broadcast {
    pub(super) fn check_invariants(&self) {
        self.targets.check_invariants();
        if let Some((sent, answered, pending)) = self.leaving {
            assert!(answered + pending <= sent);
        }
    }
}

impl Node {
    /// Turns the broadcast targets on at `now` (spec/overlay.md §4): ping rounds over the HRW
    /// top of the view find the live ones; a drain announces the departure to them. `rng` is
    /// their randomness. False without the peer path or a member id.
    pub fn enable_broadcast_targets(&mut self, rng: Rng, now: Instant) -> bool {
        if self.engine.p2p().is_none() || validate_member_id(&self.config.self_id).is_err() {
            return false;
        }
        let targets = BroadcastTargets::new(Config::default()).expect("the defaults are valid");
        self.broadcast = Some(Broadcast { targets, rng, leaving: None });
        self.designate(now);
        true
    }

    /// The published broadcast targets (member ids, fastest responder first).
    pub fn broadcast_targets(&self) -> Option<&[String]> {
        self.broadcast.as_ref().map(|b| b.targets.targets())
    }

    pub(super) fn broadcast_timeout(&self) -> Option<Instant> {
        self.broadcast.as_ref().and_then(|b| b.targets.poll_timeout())
    }

    pub(super) fn broadcast_check(&self) {
        if let Some(b) = &self.broadcast {
            b.check_invariants();
        }
    }

    /// Designates the HRW top of the current view (a new view is the source-of-truth change).
    pub(super) fn designate(&mut self, now: Instant) {
        let Some(p2p) = self.engine.p2p() else { return };
        let Some(b) = self.broadcast.as_mut() else { return };
        let view = p2p.placement.view();
        let contacts: std::collections::BTreeMap<String, Duration> = self
            .directory
            .as_ref()
            .map(|d| d.contacts(now).into_iter().collect())
            .unwrap_or_default();
        let wanted = b.targets.config().keep * DESIGNATED_PER_TARGET;
        let order = view.ranking(ChunkKey(BROADCAST_KEY).0);
        let designated: Vec<(String, Instant)> = order
            .iter()
            .map(|&k| view.ready_member(k as usize))
            .filter(|m| m.id != self.config.self_id && !m.addr.is_empty())
            .take(wanted)
            .map(|m| {
                // A member's record is as fresh as our last direct contact with it; a fixed
                // member list is always fresh.
                let since = contacts.get(&m.id).copied().unwrap_or(Duration::ZERO);
                let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
                (m.id.clone(), Instant::from_nanos(now.as_nanos().saturating_sub(nanos)))
            })
            .collect();
        b.targets.set_designated(designated, now);
        self.send_target_pings(now);
    }

    /// Runs the targets' due round and ping expiries (from [`Node::handle_timeout`]).
    pub(super) fn broadcast_due(&mut self, now: Instant) {
        let Some(b) = self.broadcast.as_mut() else { return };
        if b.targets.poll_timeout().is_none_or(|t| t > now) {
            return;
        }
        b.targets.handle_timeout(now, &mut b.rng);
        self.send_target_pings(now);
    }

    /// Sends every ping the targets ask for: a roster fetch to the member's address.
    fn send_target_pings(&mut self, now: Instant) {
        loop {
            let Some(b) = self.broadcast.as_mut() else { return };
            let Some(ping) = b.targets.poll_ping() else { break };
            match self.member_addr(&ping.peer) {
                Some(addr) => self.fetch_roster_target(ping.token, ping.peer, addr, now),
                None => {
                    let b = self.broadcast.as_mut().expect("checked above");
                    b.targets.ping_answered(ping.token, &ping.peer, false, now);
                }
            }
        }
        if let Some(b) = self.broadcast.as_mut() {
            if b.targets.take_changed() {
                let targets = b.targets.targets().len();
                self.event(Event::BroadcastTargets { targets });
            }
        }
    }

    /// Member `id`'s address in the current view, if it has one.
    fn member_addr(&self, id: &str) -> Option<String> {
        let view = self.engine.p2p()?.placement.view();
        view.get(id).map(|m| m.addr.clone()).filter(|a| !a.is_empty())
    }

    /// A target ping (a roster fetch) ended.
    pub(super) fn target_pinged(&mut self, token: RoundToken, id: &str, ok: bool, now: Instant) {
        let Some(b) = self.broadcast.as_mut() else { return };
        b.targets.ping_answered(token, &id.to_owned(), ok, now);
        self.send_target_pings(now);
    }

    /// [`super::Input::Drain`]: announces the departure to every broadcast target; an
    /// [`Event::Left`] follows once every announcement ended (at once without targets).
    pub(super) fn drain(&mut self, now: Instant) {
        // From now on this node no longer presents itself: its roster answers are refused and
        // its own roster fetches are anonymous, so no member credits it again.
        self.draining = true;
        let targets: Vec<String> = match self.broadcast.as_mut() {
            Some(b) if b.leaving.is_none() => b.targets.targets().to_vec(),
            Some(_) => return, // announced already
            None => Vec::new(),
        };
        let body = serde_json::to_vec(&Leave {
            id: self.config.self_id.clone(),
            addr: self.config.advertise.clone(),
        })
        .expect("a leave serializes");
        let mut sent = 0;
        for id in targets {
            let Some(addr) = self.member_addr(&id) else { continue };
            let headers = Headers::new()
                .with("content-type", "application/json")
                .with(HEADER_NODE, self.config.self_id.as_str());
            let url = format!("http://{addr}{LEAVE_PATH}");
            let job = Job::Leave;
            self.start_request(Endpoint::Peer, url, headers, Bytes::from(body.clone()), job, now);
            sent += 1;
        }
        if let Some(b) = self.broadcast.as_mut() {
            b.leaving = Some((sent, 0, sent));
        }
        if sent == 0 {
            self.event(Event::Left { announced: 0, answered: 0 });
        }
    }

    pub(super) fn leave_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, .. } if status != 200 => self.leave_done(io, false, true, now),
            IoEvent::Head { .. } | IoEvent::Body(_) => {}
            IoEvent::End => self.leave_done(io, true, false, now),
            IoEvent::Failed(_) => self.leave_done(io, false, false, now),
        }
    }

    pub(super) fn leave_expired(&mut self, io: IoId, _expiry: Expiry, now: Instant) {
        self.leave_done(io, false, true, now);
    }

    fn leave_done(&mut self, io: IoId, ok: bool, cancel: bool, _now: Instant) {
        let x = self.remove_exchange(io).expect("a live exchange");
        if cancel {
            self.emit(Output::Cancel(io));
        }
        let Job::Leave = x.job else { unreachable!("a leave job") };
        self.leave_ended(ok);
    }

    /// A leave exchange was removed after a panic: it counts as unanswered.
    pub(super) fn leave_quarantined(&mut self) {
        self.leave_ended(false);
    }

    fn leave_ended(&mut self, ok: bool) {
        let Some(b) = self.broadcast.as_mut() else { return };
        let Some((sent, answered, pending)) = b.leaving.as_mut() else { return };
        *pending -= 1;
        if ok {
            *answered += 1;
        }
        if *pending == 0 {
            let (announced, answered) = (*sent, *answered);
            self.event(Event::Left { announced, answered });
        }
    }

    /// `POST /peer/v1/leave`: a member announces its departure; with discovery it leaves the
    /// view at once.
    pub(super) fn serve_leave(&mut self, id: RequestId, request: &Inbound, now: Instant) {
        if request.method != "POST" {
            let allow = Headers::new().with("allow", "POST");
            return self.reply(id, Plane::Peer, 405, "dart: method not allowed", allow);
        }
        let leave = (request.body.len() <= LEAVE_BODY_MAX)
            .then(|| serde_json::from_slice::<Leave>(&request.body).ok())
            .flatten()
            .filter(|l| validate_member_id(&l.id).is_ok() && !l.addr.is_empty());
        let Some(leave) = leave else {
            let msg = "dart: bad leave announcement (JSON {\"id\", \"addr\"}, at most 1 KiB)";
            return self.reply(id, Plane::Peer, 400, msg, Headers::new());
        };
        let left = self.directory.as_mut().is_some_and(|d| d.left(&leave.id, &leave.addr, now));
        if left {
            self.apply_view(now);
        }
        let message = if left { "dart: left" } else { "dart: not a member here" };
        self.reply(id, Plane::Peer, 200, message, Headers::new());
    }
}
