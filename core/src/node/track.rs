//! The node's half of the active-reader tracker (spec/tracker.md): it hosts the registry of the
//! objects whose tracker it is (`POST /tracker/v1/join` and `/leave` on the peer listener), and
//! JOINs the tracker of every object its client reads fetch, so that those objects' trees are laid
//! over the nodes reading them.
//!
//! A read never waits for its tracker: the first blocks of an object route over every Ready
//! member while the JOIN is out, later blocks over the granted readers. A JOIN that fails, a
//! tracker that is not in the view or whose circuit is open, and a grant that lapsed all mean the
//! same: route over every Ready member.

use super::exchange::{Expiry, Job};
use super::io::{Endpoint, Event, Headers, Inbound, IoEvent, IoId, Output, Plane, RequestId};
use super::Node;
use crate::codec::wire::{HEADER_NODE, HEADER_PEER_ADDR};
use crate::hash::ChunkKey;
use crate::time::Instant;
use crate::tracker::{self, Grant, JoinRequest, Registry};
use bytes::{Bytes, BytesMut};
use std::time::Duration;

/// At most one failed JOIN is reported ([`Event::TrackerJoinFailed`]) per this long.
const JOIN_WARNING_EVERY: Duration = Duration::from_secs(60);

/// Where an object's tracker is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackerHost {
    /// This node: its own registry answers.
    Local,
    /// A peer at this address.
    Peer(String),
}

impl Node {
    /// Turns the reader tree on: this node hosts a registry with `tick` (zero: the default 3 s)
    /// for the objects it is the tracker of, and lays the trees of the objects it reads over
    /// their readers. Needs the peer path; without it this does nothing and returns `false`.
    pub fn enable_reader_tree(&mut self, tick: Duration) -> bool {
        if self.engine.p2p().is_none() || self.config.self_id.is_empty() {
            return false;
        }
        self.engine.enable_reader_tree();
        self.registry = Some(Registry::new(tick));
        true
    }

    /// The registry this node hosts, when the reader tree is on.
    pub fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// The tracker of object `file` in this node's view: the top member of the HRW ranking of
    /// the object's file key over the Ready members (spec/tracker.md §2), if it has an address.
    pub fn tracker_host(&self, file: &str) -> Option<TrackerHost> {
        let p2p = self.engine.p2p()?;
        let key = ChunkKey::file_key(self.engine.config().namespace.as_str(), file);
        let top = p2p.placement.first_ranked(key)?;
        if top == self.config.self_id {
            return Some(TrackerHost::Local);
        }
        let member = p2p.placement.view().get(top)?;
        (!member.addr.is_empty()).then(|| TrackerHost::Peer(member.addr.clone()))
    }

    /// Sends the JOINs the engine's reads asked for (after every input).
    pub(super) fn send_joins(&mut self, now: Instant) {
        for file in self.engine.take_joins() {
            self.counters.tracker_joins += 1;
            match self.tracker_host(&file) {
                None => self.join_ended(&file, Err("no tracker in the view".to_owned()), now),
                Some(TrackerHost::Local) => {
                    let registry = self.registry.as_mut().expect("the reader tree is on");
                    let grant = registry.join(&file, &self.config.self_id, 0, now);
                    self.counters.tracker_joins_granted += u64::from(grant.is_ok());
                    self.join_ended(&file, grant.map_err(|e| e.to_string()), now);
                }
                Some(TrackerHost::Peer(addr)) => self.send_join(file, addr, now),
            }
        }
    }

    fn send_join(&mut self, file: String, addr: String, now: Instant) {
        let open = self.engine.p2p().is_some_and(|p| !p.breaker.healthy(&addr, now));
        if open {
            let message = format!("the tracker's circuit ({addr}) is open");
            return self.join_ended(&file, Err(message), now);
        }
        let join = JoinRequest { file: file.clone(), node: self.config.self_id.clone(), ttl_ms: 0 };
        let body = Bytes::from(tracker::encode_join(&join));
        let mut headers = Headers::new()
            .with("content-type", "application/json")
            .with(HEADER_NODE, self.config.self_id.as_str());
        if !self.config.advertise.is_empty() {
            headers.push(HEADER_PEER_ADDR, self.config.advertise.as_str());
        }
        let url = format!("http://{addr}{}", tracker::JOIN_PATH);
        let job = Job::Tracker { file, body: BytesMut::new() };
        self.start_request(Endpoint::Peer, url, headers, body, job, now);
    }

    fn join_ended(&mut self, file: &str, result: Result<Grant, String>, now: Instant) {
        self.counters.tracker_join_ok += u64::from(result.is_ok());
        if let Err(error) = &result {
            self.counters.tracker_join_failed += 1;
            let (last, held) = &mut self.join_warnings;
            if last.is_some_and(|at| now < at.saturating_add(JOIN_WARNING_EVERY)) {
                *held += 1;
            } else {
                let suppressed = std::mem::take(held);
                *last = Some(now);
                let (file, error) = (file.to_owned(), error.clone());
                self.event(Event::TrackerJoinFailed { file, error, suppressed });
            }
        }
        self.engine.joined(file, result, now);
    }

    pub(super) fn tracker_io(&mut self, io: IoId, event: IoEvent, now: Instant) {
        let x = self.exchanges.get_mut(&io).expect("routed to a live exchange");
        let Job::Tracker { body, .. } = &mut x.job else { unreachable!("a tracker job") };
        match event {
            IoEvent::Connected => unreachable!("handled by the exchange"),
            IoEvent::Head { status, .. } => {
                if status != 200 {
                    self.tracker_done(io, Err(format!("tracker status {status}")), true, now);
                }
            }
            IoEvent::Body(data) => {
                if body.len() + data.len() > tracker::BODY_MAX {
                    let message = format!("grant larger than {} bytes", tracker::BODY_MAX);
                    self.tracker_done(io, Err(message), true, now);
                } else {
                    body.extend_from_slice(&data);
                }
            }
            IoEvent::End => {
                let grant = tracker::decode_grant(body).map_err(|e| format!("bad grant: {e}"));
                self.tracker_done(io, grant, false, now);
            }
            IoEvent::Failed(e) => self.tracker_done(io, Err(e.to_string()), false, now),
        }
    }

    pub(super) fn tracker_expired(&mut self, io: IoId, expiry: Expiry, now: Instant) {
        self.tracker_done(io, Err(expiry.to_string()), true, now);
    }

    fn tracker_done(
        &mut self,
        io: IoId,
        result: Result<Grant, String>,
        cancel: bool,
        now: Instant,
    ) {
        let x = self.remove_exchange(io).expect("a live exchange");
        if cancel {
            self.emit(Output::Cancel(io));
        }
        let Job::Tracker { file, .. } = x.job else { unreachable!("a tracker job") };
        self.join_ended(&file, result, now);
    }

    /// A tracker exchange was dropped after a panic: its object may JOIN again.
    pub(super) fn tracker_quarantined(&mut self, file: &str, now: Instant) {
        self.join_ended(file, Err("internal error".to_owned()), now);
    }

    /// `POST /tracker/v1/{join,leave}` on the peer listener (404 while the reader tree is off).
    pub(super) fn serve_tracker(
        &mut self,
        id: RequestId,
        request: &Inbound,
        path: &str,
        now: Instant,
    ) {
        let Some(registry) = self.registry.as_mut() else {
            let message = "dart: the reader tree is off on this node";
            return self.reply(id, Plane::Peer, 404, message, Headers::new());
        };
        let reply = tracker::serve(registry, &request.method, path, &request.body, now);
        if path == tracker::JOIN_PATH && reply.status == 200 {
            self.counters.tracker_joins_granted += 1;
        }
        let mut headers = Headers::new();
        for (name, value) in reply.headers {
            headers.push(name, value);
        }
        self.respond_whole(id, Plane::Peer, reply.status, headers, Bytes::from(reply.body));
    }
}
