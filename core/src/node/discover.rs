//! The node's half of discovery: it runs the [`Directory`]'s rounds with its own roster fetches
//! (through the same exchanges, bounds and breaker as every peer request), asks the driver to
//! resolve a DNS seed name, and moves placement onto each new view.

use super::io::{Event, Output};
use super::Node;
use crate::codec::roster::Roster;
use crate::discovery::{Directory, Seeds, Start, Timing};
use crate::membership::{validate_member_id, Member, View};
use crate::time::Instant;
use thiserror::Error;

/// Why discovery could not be turned on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DiscoveryError {
    /// The node has no peer half (placement, breaker).
    #[error("discovery needs the peer path (a placement and a breaker)")]
    NoPeerPath,
    /// The node's member id is missing or invalid.
    #[error("discovery needs a valid --self-id: {0}")]
    SelfId(String),
    /// The node's advertised address is missing.
    #[error("discovery needs an advertised peer address (--peer-advertise)")]
    NoAdvertise,
}

impl Node {
    /// Turns discovery on at `now`: membership starts as this node alone and follows the
    /// [`Directory`]'s rounds from then on (the first is due at once).
    pub fn enable_discovery(
        &mut self,
        seeds: Seeds,
        timing: Timing,
        now: Instant,
    ) -> Result<(), DiscoveryError> {
        if self.engine.p2p().is_none() {
            return Err(DiscoveryError::NoPeerPath);
        }
        validate_member_id(&self.config.self_id)
            .map_err(|e| DiscoveryError::SelfId(e.to_string()))?;
        if self.config.advertise.is_empty() {
            return Err(DiscoveryError::NoAdvertise);
        }
        let me = Member::ready(&self.config.self_id, &self.config.advertise);
        self.directory = Some(Directory::new(me, seeds, timing, now));
        self.apply_view(now);
        Ok(())
    }

    /// Turns the scored neighbours on at `now` (spec/overlay.md §3, §5): `keep` of the view's
    /// members are kept, scored by every exchange with them, pinged with a roster fetch, and
    /// asked for a block before the origin ([`crate::engine::neighbours`]). `rng` is their
    /// randomness (a child of the node's seed). False without the peer path.
    pub fn enable_neighbours(
        &mut self,
        config: crate::overlay::set::Config,
        rng: crate::rng::Rng,
        now: Instant,
    ) -> bool {
        self.engine.enable_neighbours(config, rng, now)
    }

    /// Runs the neighbours' due update and ping (from [`Node::handle_timeout`]).
    pub(super) fn neighbours_due(&mut self, now: Instant) {
        let self_id = self.config.self_id.clone();
        let Some((neighbours, p2p)) = self.engine.neighbours_mut() else { return };
        if neighbours.poll_timeout() > now {
            return;
        }
        if let Some(peer) = neighbours.handle_timeout(p2p.placement.view(), &self_id, now) {
            self.ping_neighbour(peer, now);
        }
    }

    /// The directory, when discovery is on.
    pub fn directory(&self) -> Option<&Directory> {
        self.directory.as_ref()
    }

    /// Starts a due round (from [`Node::handle_timeout`]).
    pub(super) fn discovery_due(&mut self, now: Instant) {
        let Some(dir) = self.directory.as_mut() else { return };
        if dir.poll_timeout().is_none_or(|t| t > now) {
            return;
        }
        if dir.is_resolving() {
            // The resolution took too long: a late answer is ignored (its ticket is stale).
            self.resolve_ticket += 1;
            let bound = crate::discovery::RESOLVE_BOUND;
            return self.seeds_resolved(
                self.resolve_ticket,
                Err(format!("no answer within {bound:?}")),
                now,
            );
        }
        match dir.start_round(now) {
            Start::Resolve { name, port } => {
                self.resolve_ticket += 1;
                let ticket = self.resolve_ticket;
                self.emit(Output::Resolve { ticket, name, port });
            }
            Start::Ask(addrs) => self.ask_rosters(addrs, now),
        }
        self.apply_view(now);
    }

    pub(super) fn seeds_resolved(
        &mut self,
        ticket: u64,
        result: Result<Vec<String>, String>,
        now: Instant,
    ) {
        let Some(dir) = self.directory.as_mut() else { return };
        if ticket != self.resolve_ticket || !dir.is_resolving() {
            return; // not the resolution in flight (late, or a driver answering twice)
        }
        if let Err(e) = &result {
            let message = format!("seed name did not resolve ({e}); keeping the known seeds");
            self.discovery_error(message, now);
        }
        let dir = self.directory.as_mut().expect("checked above");
        let ask = dir.seeds_resolved(result, now);
        self.ask_rosters(ask, now);
        self.apply_view(now);
    }

    fn ask_rosters(&mut self, addrs: Vec<String>, now: Instant) {
        for addr in addrs {
            self.fetch_roster(None, addr, now);
        }
    }

    /// A discovery roster fetch ended: a whole roster (with its `ETag`, if it sent one), an
    /// `unchanged` one (304: the tag offered still holds), or a failure.
    pub(super) fn discovery_answered(
        &mut self,
        addr: &str,
        result: Result<(Roster, Option<String>), String>,
        etag: Option<String>,
        unchanged: bool,
        now: Instant,
    ) {
        let Some(dir) = self.directory.as_mut() else { return };
        if !dir.is_pending(addr) {
            return;
        }
        if unchanged {
            let responder = result.ok().and_then(|(_, r)| r);
            dir.unchanged(addr, responder.as_deref(), now);
            return self.apply_view(now);
        }
        let whole = result.is_ok();
        let answered = dir.answered(addr, result, now);
        if whole {
            dir.note_tag(addr, etag);
        }
        if let Some(first) = answered.invalid.first() {
            let n = answered.invalid.len();
            self.discovery_error(
                format!("roster from {addr}: {n} invalid member id(s) dropped, e.g. {first}"),
                now,
            );
        }
        self.ask_rosters(answered.ask, now);
        self.apply_view(now);
    }

    fn discovery_error(&mut self, message: String, now: Instant) {
        let Some(dir) = self.directory.as_mut() else { return };
        if let Some(suppressed) = dir.report_error(now) {
            self.event(Event::Discovery { message, suppressed });
        }
    }

    /// Moves placement onto the directory's new view, if it changed.
    pub(super) fn apply_view(&mut self, now: Instant) {
        let Some(view) = self.directory.as_mut().and_then(Directory::take_view) else { return };
        let Some(p2p) = self.engine.p2p_mut() else { return };
        let (joined, left) = diff(p2p.placement.view(), &view);
        let (epoch, members) = (view.epoch(), view.members().len());
        p2p.placement = p2p.placement.with_view(view);
        let self_id = self.config.self_id.clone();
        if let Some((neighbours, p2p)) = self.engine.neighbours_mut() {
            neighbours.on_view(p2p.placement.view(), &self_id, now);
        }
        self.designate(now);
        if !joined.is_empty() || !left.is_empty() {
            self.event(Event::View { epoch, members, joined, left });
        }
    }
}

/// Ids in `new` and not in `old`, and the reverse (an address change is neither).
fn diff(old: &View, new: &View) -> (Vec<String>, Vec<String>) {
    let ids = |v: &View| v.members().iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    let (o, n) = (ids(old), ids(new));
    let joined = n.iter().filter(|id| old.get(id).is_none()).cloned().collect();
    let left = o.iter().filter(|id| new.get(id).is_none()).cloned().collect();
    (joined, left)
}
