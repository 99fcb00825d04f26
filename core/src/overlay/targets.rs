//! Broadcast targets (spec/overlay.md §4): which designated peers a ping round found alive, as a
//! sans-IO state machine.
//!
//! A [`BroadcastTargets`] holds the designated set (at most [`DESIGNATED_MAX`] peers, each with the
//! time of its last direct contact or record), runs ping rounds over it and publishes the peers
//! that answered as [`BroadcastTargets::targets`]: the peers a joining node announces itself to and
//! a draining node announces its departure to (§5). The targets are never scored. Nothing here
//! reads a clock or draws ambient randomness: `now` and a seeded RNG come in as arguments.
//!
//! A round snapshots the designated peers whose record is at most `stale_after` old, shuffles
//! them, and keeps up to `keep` pings in flight: a ping that fails or reaches its deadline is
//! replaced by the next candidate at once. The round ends when `keep` peers have answered, or when
//! the candidates are used up and every ping sent has been answered or has timed out; then its
//! responders, in the order they answered, become the targets. The next round is due
//! `ping_interval` after this one started, and never starts while this one runs.
//!
//! # Driving contract
//!
//! The driver owns one [`BroadcastTargets`] (behind `&mut self`):
//!
//! 1. Whenever the source of truth changes (a roster epoch change, §5; or by hand at start), pass
//!    the designated set, best first, to [`BroadcastTargets::set_designated`]. A set with other
//!    peers than before starts a round at once: [`BroadcastTargets::poll_timeout`] becomes `now`.
//! 2. On a direct contact with a designated peer (or a newer record of it), pass the time to
//!    [`BroadcastTargets::refresh_contact`]. When the membership layer expires or removes a
//!    designated peer, call [`BroadcastTargets::forget`].
//! 3. Call [`BroadcastTargets::handle_timeout`] with the seeded RNG when `now` reaches
//!    [`BroadcastTargets::poll_timeout`] (an early call does nothing). Afterwards, once the pings
//!    are drained, `poll_timeout` is `None` or later than every `now` seen so far.
//! 4. After every input, drain [`BroadcastTargets::poll_ping`] until `None` and send each
//!    [`Ping`] to its peer. Report each answer with [`BroadcastTargets::ping_answered`], passing
//!    back the ping's [`RoundToken`]; an answer at or after the ping's deadline counts as a
//!    timeout. The driver need not report timeouts or transport errors it sees after the deadline:
//!    the machine times its pings out itself.
//! 5. When [`BroadcastTargets::take_changed`] returns true, re-read
//!    [`BroadcastTargets::targets`] (fastest responder first; the caller decides how many to use).
//! 6. The simulator may call [`BroadcastTargets::check_invariants`] after every step.
//!
//! # Where this differs from upstream, and why (spec §6)
//!
//! - **No abandoned pings (§6.2).** Upstream stops waiting for pings in flight once the candidates
//!   run out, so it can publish fewer than `keep` targets while live peers exist. Here the round
//!   ends only when `keep` peers answered or every ping it sent has been answered or timed out, so
//!   it publishes `keep` targets whenever `keep` of its candidates answer within `ping_timeout`.
//! - **Never empty for a whole interval (§6.3).** A designated set with other peers starts a round
//!   at once instead of at the next tick. Until that round ends, the targets that are still
//!   designated stay published (they answered a ping less than an interval ago, and the ones that
//!   left the set are dropped at once); the round's end replaces them. When the published set is
//!   empty (at start, or when no old target is still designated), each responder is published as
//!   it answers, so a joining node can announce itself after the first answer instead of after the
//!   slowest one.
//! - **The epoch guard is a token check.** Upstream guards publication with an epoch counter
//!   against concurrent rounds. Here a set change abandons the running round (its undrained pings
//!   are dropped and its answers carry an older [`RoundToken`], so they are ignored) and a fresh
//!   round starts: a round for an older set can never publish. A set with the same peers as before
//!   only updates their contact times: it is no change, keeps the epoch and the running round, so
//!   a chatty source cannot starve the rounds.
//! - **Forget purges without restarting.** A forgotten peer leaves the designated set, the targets
//!   and the running round at once; a ping in flight to it is replaced by the next candidate.
//! - **Every knob is used (§6.1).** [`Config`] has `keep`, `ping_interval`, `ping_timeout` and
//!   `stale_after`; each is tested, and a zero or out-of-range value is a [`ConfigError`].
//! - **Kept as upstream:** the numbers (keep 5, every 60 s, 1 s ping timeout, records older than
//!   30 min skipped), the shuffle, and the replacement of a failed ping by the next candidate.
//! - **Left out:** address resolution (the driver resolves a peer's address when it sends a ping;
//!   a record's freshness is its last contact) and the broadcast itself with its adaptive send
//!   timeout, which belong to the node wiring (§5).

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::Rng;

use crate::time::Instant;
use crate::walk_gate::WalkGate;

/// Default number of targets a round looks for.
pub const KEEP_DEFAULT: usize = 5;
/// Most targets a [`BroadcastTargets`] may be configured to keep (and most pings in flight).
pub const KEEP_MAX: usize = 64;
/// Most designated peers held; further entries of the caller's list are ignored.
pub const DESIGNATED_MAX: usize = 256;
/// Default time from the start of one round to the start of the next.
pub const PING_INTERVAL: Duration = Duration::from_secs(60);
/// Default time a ping may take before it counts as failed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(1);
/// Default age past which a designated peer's record is too old to ping.
pub const STALE_AFTER: Duration = Duration::from_secs(30 * 60);

const _: () = assert!(KEEP_DEFAULT <= KEEP_MAX && KEEP_MAX <= DESIGNATED_MAX);

/// Settings of a [`BroadcastTargets`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Most targets published and most pings in flight, `1..=KEEP_MAX`.
    pub keep: usize,
    /// Time from the start of one round to the start of the next; not zero.
    pub ping_interval: Duration,
    /// Time a ping may take before it counts as failed; not zero.
    pub ping_timeout: Duration,
    /// A designated peer whose last contact is older than this is not pinged; not zero.
    pub stale_after: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            keep: KEEP_DEFAULT,
            ping_interval: PING_INTERVAL,
            ping_timeout: PING_TIMEOUT,
            stale_after: STALE_AFTER,
        }
    }
}

impl Config {
    /// Checks every setting is in range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.keep == 0 {
            return Err(ConfigError::KeepZero);
        }
        if self.keep > KEEP_MAX {
            return Err(ConfigError::KeepAboveMax { keep: self.keep });
        }
        if self.ping_interval.is_zero() {
            return Err(ConfigError::ZeroPingInterval);
        }
        if self.ping_timeout.is_zero() {
            return Err(ConfigError::ZeroPingTimeout);
        }
        if self.stale_after.is_zero() {
            return Err(ConfigError::ZeroStaleAfter);
        }
        Ok(())
    }
}

/// A [`Config`] setting out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `keep` is 0: a round could never publish anyone.
    #[error("keep must be at least 1")]
    KeepZero,
    /// `keep` is above [`KEEP_MAX`].
    #[error("keep {keep} is above {KEEP_MAX}")]
    KeepAboveMax {
        /// The configured value.
        keep: usize,
    },
    /// `ping_interval` is zero: rounds would follow each other without pause.
    #[error("ping_interval must not be zero")]
    ZeroPingInterval,
    /// `ping_timeout` is zero: every ping would time out as it is sent.
    #[error("ping_timeout must not be zero")]
    ZeroPingTimeout,
    /// `stale_after` is zero: every record would be too old to ping.
    #[error("stale_after must not be zero")]
    ZeroStaleAfter,
}

/// Names one ping round: the epoch of the designated set it was started for and its number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RoundToken {
    epoch: u64,
    round: u64,
}

impl RoundToken {
    /// The epoch of the designated set the round was started for.
    pub fn epoch(self) -> u64 {
        self.epoch
    }

    /// The round's number: 1 for the first round, counting every round ever started.
    pub fn round(self) -> u64 {
        self.round
    }
}

/// A ping the driver must send, and report the answer of with [`BroadcastTargets::ping_answered`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ping<K> {
    /// The designated peer to ping.
    pub peer: K,
    /// The round the ping belongs to; passed back with the answer.
    pub token: RoundToken,
    /// When the machine counts the ping as failed: the answer must come before it.
    pub deadline: Instant,
}

#[derive(Clone, Debug)]
enum Round<K> {
    /// No round runs; the next is due at `next_at`, or never while the designated set is empty.
    Idle {
        next_at: Option<Instant>,
    },
    Running(Running<K>),
}

#[derive(Clone, Debug)]
struct Running<K> {
    token: RoundToken,
    started_at: Instant,
    /// Shuffled candidates not pinged yet, next at the front.
    candidates: VecDeque<K>,
    /// Pings sent and not yet resolved, with their deadlines; never empty while running.
    in_flight: BTreeMap<K, Instant>,
    /// Peers that answered ok, in answer order.
    responders: Vec<K>,
    /// The responders are published as they answer (the targets were empty when one answered).
    early: bool,
}

/// The designated set, its ping rounds and the published broadcast targets (spec §4).
#[derive(Clone, Debug)]
pub struct BroadcastTargets<K> {
    config: Config,
    /// Designated peers and the time of their last direct contact or record.
    designated: BTreeMap<K, Instant>,
    /// Incremented whenever the designated peers are replaced by other peers.
    epoch: u64,
    /// Rounds ever started; the number of the latest.
    rounds_started: u64,
    /// The latest `now` seen; an earlier `now` counts as this one.
    clock: Instant,
    round: Round<K>,
    /// Pings of the running round not yet drained by the driver.
    outbox: VecDeque<Ping<K>>,
    /// The targets, fastest responder first.
    published: Vec<K>,
    changed: bool,
    last_completed: Option<RoundToken>,
    /// Counts calls of the writers (every `&mut self` method but [`Self::take_changed`], which
    /// only clears `changed`, and [`Self::poll_ping`] when it hands out nothing): the check runs
    /// again only after one (the simulator checks the touched node after every event, and most
    /// events touch no broadcast round).
    walk_gate: WalkGate,
}

impl<K: Ord + Clone> BroadcastTargets<K> {
    /// An empty machine: no designated peers, no targets, no round scheduled.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        let targets = BroadcastTargets {
            config,
            designated: BTreeMap::new(),
            epoch: 0,
            rounds_started: 0,
            clock: Instant::ZERO,
            round: Round::Idle { next_at: None },
            outbox: VecDeque::new(),
            published: Vec::new(),
            changed: false,
            last_completed: None,
            walk_gate: WalkGate::default(),
        };
        targets.check_invariants();
        Ok(targets)
    }

    /// The settings.
    pub fn config(&self) -> Config {
        self.config
    }

    /// The published broadcast targets, fastest responder first; at most `keep`, all designated.
    pub fn targets(&self) -> &[K] {
        &self.published
    }

    /// Whether the targets changed since the last call (which clears the flag).
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The epoch of the designated set: it changes whenever other peers are designated.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The designated peers and their last contact, ordered by peer.
    pub fn designated(&self) -> impl Iterator<Item = (&K, Instant)> {
        self.designated.iter().map(|(k, at)| (k, *at))
    }

    /// Whether `peer` is designated.
    pub fn is_designated(&self, peer: &K) -> bool {
        self.designated.contains_key(peer)
    }

    /// The running round, if any.
    pub fn current_round(&self) -> Option<RoundToken> {
        match &self.round {
            Round::Idle { .. } => None,
            Round::Running(r) => Some(r.token),
        }
    }

    /// The last round that ended and published its responders.
    pub fn last_completed(&self) -> Option<RoundToken> {
        self.last_completed
    }

    /// Number of pings of the running round in flight (sent or waiting in [`Self::poll_ping`]).
    pub fn in_flight(&self) -> usize {
        match &self.round {
            Round::Idle { .. } => 0,
            Round::Running(r) => r.in_flight.len(),
        }
    }

    /// Replaces the designated set with the first [`DESIGNATED_MAX`] entries of `set` (a peer
    /// listed twice keeps its latest contact). Returns whether the peers changed: then the epoch
    /// moves on, the running round is abandoned, a new round is due at once, and only the targets
    /// still designated stay published. The same peers as before only update contact times.
    pub fn set_designated(
        &mut self,
        set: impl IntoIterator<Item = (K, Instant)>,
        now: Instant,
    ) -> bool {
        self.walk_gate.changed();
        self.tick(now);
        let mut next: BTreeMap<K, Instant> = BTreeMap::new();
        for (peer, seen) in set.into_iter().take(DESIGNATED_MAX) {
            let at = next.entry(peer).or_insert(seen);
            *at = (*at).max(seen);
        }
        assert!(next.len() <= DESIGNATED_MAX);
        for (peer, seen) in &mut next {
            if let Some(old) = self.designated.get(peer) {
                *seen = (*seen).max(*old); // a contact time never moves backwards
            }
        }
        let changed = !next.keys().eq(self.designated.keys());
        self.designated = next;
        if changed {
            self.epoch += 1;
            self.outbox.clear();
            let next_at = (!self.designated.is_empty()).then_some(self.clock);
            self.round = Round::Idle { next_at };
            let kept: Vec<K> = self
                .published
                .iter()
                .filter(|p| self.designated.contains_key(p))
                .cloned()
                .collect();
            self.publish(kept);
        }
        self.check_invariants();
        changed
    }

    /// Moves `peer`'s last contact to `last_seen` if it is designated and that is later; returns
    /// whether it is designated. The running round keeps its snapshot; the next one sees it.
    pub fn refresh_contact(&mut self, peer: &K, last_seen: Instant) -> bool {
        self.walk_gate.changed();
        match self.designated.get_mut(peer) {
            Some(at) => {
                *at = (*at).max(last_seen);
                true
            }
            None => false,
        }
    }

    /// The membership layer expired or removed `peer`: it leaves the designated set, the targets
    /// and the running round (a ping in flight to it is replaced). Returns whether it was
    /// designated. The epoch does not change: the round's other answers stay valid.
    pub fn forget(&mut self, peer: &K, now: Instant) -> bool {
        self.walk_gate.changed();
        self.tick(now);
        if self.designated.remove(peer).is_none() {
            self.check_invariants();
            return false;
        }
        let kept: Vec<K> = self.published.iter().filter(|p| *p != peer).cloned().collect();
        self.publish(kept);
        let designated_empty = self.designated.is_empty();
        match &mut self.round {
            Round::Idle { next_at } => {
                if designated_empty {
                    *next_at = None;
                }
            }
            Round::Running(r) => {
                r.candidates.retain(|c| c != peer);
                r.in_flight.remove(peer);
                r.responders.retain(|c| c != peer);
            }
        }
        self.prune_outbox();
        self.launch();
        self.finish_if_done();
        self.check_invariants();
        true
    }

    /// The next deadline: the earliest ping in flight while a round runs, else the next round.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.round {
            Round::Idle { next_at } => *next_at,
            Round::Running(r) => r.in_flight.values().min().copied(),
        }
    }

    /// Times out pings whose deadline has come (replacing them) and starts a round when one is
    /// due, shuffling its candidates with `rng`. An early or repeated call does nothing.
    pub fn handle_timeout<R: Rng + ?Sized>(&mut self, now: Instant, rng: &mut R) {
        self.walk_gate.changed();
        self.tick(now);
        let due = match &self.round {
            Round::Idle { next_at } => next_at.is_some_and(|at| at <= self.clock),
            Round::Running(_) => false,
        };
        if due {
            self.start_round(rng);
        }
        // A timer that fires and is not moved makes a busy loop (STYLE.md).
        assert!(
            self.poll_timeout().is_none_or(|at| at > self.clock || self.clock == Instant::MAX),
            "handle_timeout leaves no deadline at or before now"
        );
        self.check_invariants();
    }

    /// The next ping to send, if any.
    pub fn poll_ping(&mut self) -> Option<Ping<K>> {
        let ping = self.outbox.pop_front()?;
        self.walk_gate.changed();
        assert_eq!(Some(ping.token), self.current_round(), "only pings of the running round");
        Some(ping)
    }

    /// Reports `peer`'s answer to the ping of round `token`: `ok` for a correct answer, false for a
    /// wrong one or an error. Returns whether it resolved a ping in flight; an answer of another
    /// round or epoch, a repeated one, or one at or after the ping's deadline is ignored.
    pub fn ping_answered(&mut self, token: RoundToken, peer: &K, ok: bool, now: Instant) -> bool {
        self.walk_gate.changed();
        self.tick(now);
        let mut publish_early = None;
        let counted = match &mut self.round {
            Round::Idle { .. } => false,
            Round::Running(r) => {
                let counted = r.token == token && r.in_flight.remove(peer).is_some();
                if counted && ok {
                    assert!(self.designated.contains_key(peer), "a forgotten peer is not pinged");
                    r.responders.push(peer.clone());
                    if r.early || self.published.is_empty() {
                        r.early = true;
                        publish_early = Some(r.responders.clone());
                    }
                }
                counted
            }
        };
        if counted {
            self.prune_outbox();
            if let Some(responders) = publish_early {
                self.publish(responders);
            }
            self.launch();
            self.finish_if_done();
        }
        self.check_invariants();
        counted
    }

    /// Panics if an internal invariant is broken.
    pub fn check_invariants(&self) {
        self.walk_gate.walk(|| self.check_all());
    }

    fn check_all(&self) {
        assert_eq!(self.config.validate(), Ok(()));
        let keep = self.config.keep;
        assert!(self.designated.len() <= DESIGNATED_MAX);
        assert!(self.published.len() <= keep, "at most keep targets");
        assert_eq!(unique(&self.published), self.published.len(), "no target twice");
        for peer in &self.published {
            assert!(self.designated.contains_key(peer), "every target is designated");
        }
        assert!(self.outbox.len() <= keep);
        if let Some(done) = self.last_completed {
            assert!(done.round <= self.rounds_started && done.epoch <= self.epoch);
        }
        match &self.round {
            Round::Idle { next_at } => {
                assert!(self.outbox.is_empty(), "no pings without a round");
                assert_eq!(next_at.is_some(), !self.designated.is_empty(), "a round is due");
            }
            Round::Running(r) => self.check_running(r),
        }
    }

    fn check_running(&self, r: &Running<K>) {
        let keep = self.config.keep;
        assert_eq!(r.token.epoch, self.epoch, "a running round is for the current set");
        assert_eq!(r.token.round, self.rounds_started);
        assert!(r.started_at <= self.clock);
        assert!(!r.in_flight.is_empty(), "a round without pings in flight has ended");
        assert!(r.responders.len() + r.in_flight.len() <= keep, "at most keep pings out");
        for deadline in r.in_flight.values() {
            assert!(*deadline > self.clock || self.clock == Instant::MAX, "overdue ping");
        }
        let all = r.candidates.iter().chain(r.in_flight.keys()).chain(&r.responders);
        let count = r.candidates.len() + r.in_flight.len() + r.responders.len();
        assert_eq!(unique(all.clone()), count, "a peer is pinged at most once per round");
        assert!(count <= self.designated.len());
        for peer in all {
            assert!(self.designated.contains_key(peer), "a round covers designated peers only");
        }
        if r.early {
            assert!(self.published == r.responders, "early: the targets are the responders");
        }
        for ping in &self.outbox {
            assert_eq!(ping.token, r.token);
            assert!(r.in_flight.get(&ping.peer) == Some(&ping.deadline), "queued is in flight");
        }
    }

    /// Moves the clock to `now` (never backwards) and times out the pings due by then.
    fn tick(&mut self, now: Instant) {
        self.clock = self.clock.max(now);
        let clock = self.clock;
        let expired = match &mut self.round {
            Round::Idle { .. } => false,
            Round::Running(r) => {
                let before = r.in_flight.len();
                r.in_flight.retain(|_, deadline| *deadline > clock);
                r.in_flight.len() < before
            }
        };
        if expired {
            self.prune_outbox();
            self.launch();
            self.finish_if_done();
        }
    }

    /// Starts a round now over the fresh designated peers, in random order.
    fn start_round<R: Rng + ?Sized>(&mut self, rng: &mut R) {
        assert!(matches!(self.round, Round::Idle { .. }), "one round at a time");
        assert!(self.outbox.is_empty());
        let (clock, stale_after) = (self.clock, self.config.stale_after);
        let mut candidates: Vec<K> = self
            .designated
            .iter()
            .filter(|(_, seen)| clock.saturating_duration_since(**seen) <= stale_after)
            .map(|(peer, _)| peer.clone())
            .collect();
        candidates.shuffle(rng);
        self.rounds_started += 1;
        let token = RoundToken { epoch: self.epoch, round: self.rounds_started };
        self.round = Round::Running(Running {
            token,
            started_at: clock,
            candidates: candidates.into(),
            in_flight: BTreeMap::new(),
            responders: Vec::new(),
            early: false,
        });
        self.launch();
        self.finish_if_done(); // at once when no record is fresh
    }

    /// Pings the next candidates until `keep` are answered or in flight, or none is left.
    fn launch(&mut self) {
        let keep = self.config.keep;
        let deadline = self.clock.saturating_add(self.config.ping_timeout);
        match &mut self.round {
            Round::Idle { .. } => {}
            Round::Running(r) => {
                while r.responders.len() + r.in_flight.len() < keep {
                    let Some(peer) = r.candidates.pop_front() else { break };
                    assert!(r.in_flight.insert(peer.clone(), deadline).is_none());
                    self.outbox.push_back(Ping { peer, token: r.token, deadline });
                }
                assert!(r.responders.len() + r.in_flight.len() <= keep);
            }
        }
    }

    /// Ends the running round once no ping is in flight: its responders become the targets and
    /// the next round is due `ping_interval` after this one started.
    fn finish_if_done(&mut self) {
        let (token, started_at, responders) = match &mut self.round {
            Round::Idle { .. } => return,
            Round::Running(r) if !r.in_flight.is_empty() => return,
            Round::Running(r) => {
                assert!(r.responders.len() == self.config.keep || r.candidates.is_empty());
                (r.token, r.started_at, std::mem::take(&mut r.responders))
            }
        };
        assert_eq!(token.epoch, self.epoch, "a round for an older set never publishes");
        assert!(self.outbox.is_empty(), "nothing in flight, nothing queued");
        self.publish(responders);
        self.last_completed = Some(token);
        let next_at = started_at.saturating_add(self.config.ping_interval);
        self.round = Round::Idle { next_at: (!self.designated.is_empty()).then_some(next_at) };
    }

    /// Drops queued pings that are no longer in flight in the running round.
    fn prune_outbox(&mut self) {
        match &self.round {
            Round::Idle { .. } => self.outbox.clear(),
            Round::Running(r) => self
                .outbox
                .retain(|p| p.token == r.token && r.in_flight.get(&p.peer) == Some(&p.deadline)),
        }
    }

    /// Makes `targets` the published set, flagging a change.
    fn publish(&mut self, targets: Vec<K>) {
        assert!(targets.len() <= self.config.keep);
        assert_eq!(unique(&targets), targets.len());
        assert!(targets.iter().all(|p| self.designated.contains_key(p)), "targets are designated");
        if targets != self.published {
            self.published = targets;
            self.changed = true;
        }
    }
}

fn unique<'a, K: Ord + 'a>(peers: impl IntoIterator<Item = &'a K>) -> usize {
    peers.into_iter().collect::<BTreeSet<_>>().len()
}
