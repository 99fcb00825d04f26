//! Peer-path properties (seeds/engine.md §7 P2P tests, seeds/peer.md §7 relay tests), driven by
//! an in-test cluster: several engines, one fake origin, and peer requests served synchronously
//! by running the target node's relay read.

use super::route::{relay_check, Placement, RelayDecline};
use super::tests::{FakeOrigin, Mode};
use super::*;
use crate::breaker::{BreakerConfig, CircuitState, Observation};
use crate::geometry::Geometry;
use crate::membership::{Member, View};
use crate::time::Instant;
use bytes::Bytes;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    /// The machine is gone: every dial fails.
    Dead,
    /// Answers every block request with one byte too few.
    Short,
    /// Accepts requests and never answers in time: every fetch ends in our own timeout.
    Stalled,
}

struct Node {
    engine: Engine,
    cache: BTreeMap<BlockKey, Bytes>,
    fault: Fault,
    relay_requests: usize,
    /// Of those, held-only requests (serve what you hold, never fetch).
    held_only_requests: usize,
    /// Background probes its relays started under a told size ([`Action::Learn`]).
    learns: usize,
}

/// A peer request as the driver carries it.
struct Ask<'a> {
    key: BlockKey,
    url: &'a str,
    held_only: bool,
    hop: u64,
    expected: u64,
    told: Option<Told>,
}

struct Cluster {
    nodes: Vec<Node>,
    origin: FakeOrigin,
    url: String,
    now: Instant,
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    Finish(Vec<u8>),
    Fail(ReadFailure),
}

fn id(i: usize) -> String {
    format!("node-{i}")
}

fn addr(i: usize) -> String {
    format!("10.0.0.{i}:9000")
}

impl Cluster {
    /// `n` nodes with the given fanout over an object of `size` bytes (chunk 16, block 4).
    fn new(n: usize, fanout: usize, size: u64, mode: Mode) -> Self {
        let view = View::new((0..n).map(|i| Member::ready(&id(i), &addr(i))).collect());
        let nodes = (0..n)
            .map(|i| {
                let geometry = Geometry::new(16, 4).expect("geometry");
                let mut engine = Engine::new(EngineConfig { geometry, ..EngineConfig::default() });
                let config = BreakerConfig { failure_threshold: 3, ..BreakerConfig::default() };
                let breaker = crate::breaker::Breaker::new(config).expect("breaker config");
                let placement = Placement::new(view.clone(), &id(i), fanout, 1);
                engine.enable_p2p(P2p { placement, breaker });
                Node {
                    engine,
                    cache: BTreeMap::new(),
                    fault: Fault::None,
                    relay_requests: 0,
                    held_only_requests: 0,
                    learns: 0,
                }
            })
            .collect();
        Cluster {
            nodes,
            origin: FakeOrigin::new(size, mode),
            url: "http://origin.example/blob".into(),
            now: Instant::from_secs(1),
        }
    }

    fn index_of(&self, addr_: &str) -> usize {
        (0..self.nodes.len()).find(|&i| addr(i) == addr_).expect("known peer")
    }

    /// The node ids ranked for the chunk of block `block` (position 0 is the tree root).
    fn ranked(&self, block: u64) -> Vec<usize> {
        let e = &self.nodes[0].engine;
        let key = e.block_key(&e.identify(&self.url), block);
        let p = &e.p2p().expect("p2p").placement;
        p.ranked(key.chunk)
            .into_iter()
            .map(|s| s.trim_start_matches("node-").parse().expect("index"))
            .collect()
    }

    fn read(&mut self, at: usize, range: Option<&str>) -> End {
        let request = ReadRequest {
            url: self.url.clone(),
            method: Method::Get,
            range: range.map(|r| r.as_bytes().to_vec()),
            conditions: Default::default(),
        };
        let read = self.nodes[at].engine.begin_read(request, Instant::ZERO);
        self.drive(at, read)
    }

    fn drive(&mut self, at: usize, mut read: Read) -> End {
        let mut body = Vec::new();
        loop {
            let now = self.now;
            let action = read.poll_action().expect("a read never stalls in this driver");
            match action {
                Action::Probe { .. } => {
                    let answer = self.origin.probe();
                    read.handle_probe(&mut self.nodes[at].engine, answer, now);
                }
                Action::Lookup { key, window } => {
                    let whole = self.nodes[at].cache.get(&key).cloned();
                    let hit = match window {
                        Some(w) => whole.and_then(|b| w.slice(&b)),
                        None => whole,
                    };
                    read.handle_lookup(&mut self.nodes[at].engine, hit, now);
                }
                Action::FetchPeer(ask) => {
                    // Peers answer at once here: no hedge is ever due.
                    let (contender, permit, cut_through) =
                        (ask.contender, ask.permit, ask.cut_through);
                    let expected_len = ask.expected_len;
                    let peer = ask.peer.addr.clone();
                    let ask = Ask {
                        key: ask.key,
                        url: &ask.url,
                        held_only: ask.held_only,
                        hop: ask.hop,
                        expected: expected_len,
                        told: ask.told.map(|t| *t),
                    };
                    let answer = self.serve_peer(&peer, ask);
                    if let (true, PeerAnswer::Block(data)) = (cut_through, &answer) {
                        // The peer's 200 head arrived: commit ours and forward as bytes arrive.
                        read.handle_peer_started(&mut self.nodes[at].engine, contender, false, now);
                        let Some(Action::Respond(_)) = read.poll_action() else {
                            panic!("a started stream sends its head first");
                        };
                        body.extend_from_slice(&data[..data.len().min(expected_len as usize)]);
                    }
                    read.handle_peer(
                        &mut self.nodes[at].engine,
                        contender,
                        Some(permit),
                        answer,
                        now,
                    );
                }
                Action::CancelPeer { .. } | Action::FillFromOrigin { .. } => {
                    panic!("no race without a hedge")
                }
                Action::StoreWhenConfirmed { .. } => {
                    panic!("the background probe answers before the relay's upstream here")
                }
                Action::Learn { key, url } => {
                    // The background probe answers at once here, before the relay's upstream.
                    let learn = self.nodes[at].engine.begin_learn(key, url);
                    self.nodes[at].learns += 1;
                    let End::Finish(body) = self.drive(at, learn) else {
                        panic!("a background probe always ends")
                    };
                    assert!(body.is_empty(), "a background probe serves nothing");
                }
                Action::FetchOrigin { start, end, .. } => {
                    let got = self.origin.fetch(start, end);
                    read.handle_fetch(&mut self.nodes[at].engine, got);
                }
                Action::Store { key, data, .. } => {
                    // Everything the engine offers for storage is exactly the origin's block.
                    let start = key.block * 4;
                    let want = self.expected(start, start + data.len() as u64 - 1);
                    assert_eq!(data[..], want[..], "a stored block is the origin's bytes");
                    assert!(
                        data.len() == 4
                            || start + data.len() as u64 == self.origin.data.len() as u64
                    );
                    self.nodes[at].cache.entry(key).or_insert(data);
                }
                Action::Emit(b) => body.extend_from_slice(&b),
                Action::Respond(_) => {}
                Action::Finish => break,
                Action::Fail(f) => {
                    self.nodes[at].engine.check_invariants();
                    return End::Fail(f);
                }
                Action::Passthrough { .. } => panic!("no Range-blind origin in these tests"),
            }
        }
        self.nodes[at].engine.check_invariants();
        End::Finish(body)
    }

    /// What the peer at `to` answers, as its peer server would: relay check, then a relay read.
    fn serve_peer(&mut self, to: &str, ask: Ask<'_>) -> PeerAnswer {
        let Ask { key, url, held_only, hop, expected, told } = ask;
        let j = self.index_of(to);
        self.nodes[j].relay_requests += 1;
        match self.nodes[j].fault {
            Fault::Dead => return PeerAnswer::Failed(Observation::DialFailed),
            Fault::Stalled => return PeerAnswer::Failed(Observation::TimedOut),
            Fault::Short => {
                let short = vec![0u8; expected.saturating_sub(1) as usize];
                return PeerAnswer::Block(Bytes::from(short));
            }
            Fault::None => {}
        }
        // An empty URL is a cache-only request (no `X-DART-Origin` on the wire).
        let url = (!url.is_empty()).then_some(url);
        let plan = match relay_check(&self.nodes[j].engine, key, url, hop) {
            Ok(plan) => plan,
            Err(_) => return PeerAnswer::Failed(Observation::Miss),
        };
        let read = match (plan, url) {
            (route::RelayPlan::FetchOnBehalf { .. }, Some(url)) if held_only => {
                self.nodes[j].held_only_requests += 1;
                self.nodes[j].engine.begin_relay_held(key, url.to_owned(), hop)
            }
            (route::RelayPlan::FetchOnBehalf { next_hop }, url) => {
                self.nodes[j].engine.begin_relay(key, url.map(str::to_owned), next_hop)
            }
            (route::RelayPlan::CacheOnly, _) => self.nodes[j].engine.begin_relay(key, None, hop),
        };
        let mut read = read;
        if !held_only {
            read.set_told(told);
        }
        match self.drive(j, read) {
            End::Finish(bytes) => PeerAnswer::Block(Bytes::from(bytes)),
            End::Fail(f) if f.committed => PeerAnswer::Failed(Observation::BodyInterrupted),
            End::Fail(f) => match (f.status, f.upstream_status) {
                (404, _) => PeerAnswer::Failed(Observation::Miss),
                (502, Some(status)) => PeerAnswer::Failed(Observation::UpstreamRefused { status }),
                (status, _) => PeerAnswer::Failed(Observation::UnexpectedStatus(status)),
            },
        }
    }

    /// Turns on node `at`'s neighbours, keeping `keep`, and runs their first update.
    fn enable_neighbours(&mut self, at: usize, keep: usize) {
        let config = crate::overlay::set::Config { keep, ..Default::default() };
        let rng = crate::rng::from_seed(at as u64);
        let engine = &mut self.nodes[at].engine;
        assert!(engine.enable_neighbours(config, rng, self.now));
        let (neighbours, p2p) = engine.neighbours_mut().expect("on");
        let ping = neighbours.handle_timeout(p2p.placement.view(), &id(at), self.now);
        assert!(ping.is_none(), "the first ping is one interval away");
        assert_eq!(neighbours.set().len(), keep.min(self.nodes.len() - 1));
    }

    /// Kills block 0's home and returns (home, its successor); with `others_hold`, every member
    /// ranked after the successor holds blocks 0 and 1 (what a home leaves behind).
    fn dead_home(&mut self, others_hold: bool) -> (usize, usize) {
        let ranked = self.ranked(0);
        self.nodes[ranked[0]].fault = Fault::Dead;
        if others_hold {
            for &n in &ranked[2..] {
                self.plant(n, 0);
                self.plant(n, 1);
            }
        }
        (ranked[0], ranked[1])
    }

    /// Puts the origin's block `block` into node `at`'s store.
    fn plant(&mut self, at: usize, block: u64) {
        let e = &self.nodes[at].engine;
        let key = e.block_key(&e.identify(&self.url), block);
        let data = Bytes::from(self.expected(block * 4, block * 4 + 3));
        self.nodes[at].cache.insert(key, data);
    }

    fn expected(&self, a: u64, b: u64) -> Vec<u8> {
        self.origin.data[a as usize..=b as usize].to_vec()
    }

    fn state_of(&self, at: usize, peer: usize) -> CircuitState {
        let b = &self.nodes[at].engine.p2p().expect("p2p").breaker;
        b.state(&addr(peer), self.now)
    }
}

#[test]
fn a_leaf_pulls_through_its_ancestors_and_the_origin_is_read_once_per_block() {
    let mut c = Cluster::new(7, 2, 12, Mode::Honours);
    let ranked = c.ranked(0);
    // Object of 12 bytes = 3 blocks in chunk 0: everyone shares one tree.
    let leaf = ranked[6];
    assert_eq!(c.read(leaf, None), End::Finish(c.expected(0, 11)));
    assert_eq!(c.origin.fetches.len(), 3, "only the root read the origin");
    let root = ranked[0];
    assert_eq!(c.nodes[root].engine.stats().block_source_origin, 3);
    assert_eq!(c.nodes[leaf].engine.stats().block_source_peer, 3);
    // Every node on the leaf's path now holds the blocks: n=7 k=2, position 6's parent is 4.
    for pos in [0, 4, 6] {
        assert_eq!(c.nodes[ranked[pos]].cache.len(), 3, "position {pos} cached the blocks");
    }
    // The interior relay and the root did not know the object: each went on at once under the
    // size the leaf told (the parent, the origin's window) beside a background probe, then
    // knew it for blocks 1 and 2.
    for node in [&c.nodes[ranked[4]], &c.nodes[root]] {
        assert_eq!((node.learns, node.engine.stats().relay_told), (1, 1));
    }
    // A sibling is served by the shared parent without touching the origin again.
    assert_eq!(c.read(ranked[5], None), End::Finish(c.expected(0, 11)));
    assert_eq!(c.origin.fetches.len(), 3);
}

#[test]
fn the_root_of_a_chunk_asks_only_its_successor_held_only_then_reads_the_origin() {
    let mut c = Cluster::new(5, 2, 8, Mode::Honours);
    let ranked = c.ranked(0);
    let root = ranked[0];
    assert_eq!(c.read(root, None), End::Finish(c.expected(0, 7)));
    // One held-only ask per block of the member ranked next, which never fetches; nobody else.
    for (i, n) in c.nodes.iter().enumerate() {
        let asks = if i == ranked[1] { 2 } else { 0 };
        assert_eq!((n.relay_requests, n.held_only_requests), (asks, asks), "node {i}");
    }
    let s = c.nodes[root].engine.stats();
    assert_eq!((s.successor_asks, s.successor_hits, s.neighbour_asks), (2, 0, 0));
    assert_eq!(c.origin.fetches.len(), 2);
}

#[test]
fn a_root_that_comes_back_reads_what_its_successor_fetched_instead_of_the_origin() {
    // While the root was unusable, its successor was the readers' root and fetched the blocks.
    let mut c = Cluster::new(5, 2, 8, Mode::Honours);
    immutable(&mut c); // a planted copy carries no version: only an immutable object's is served
    let ranked = c.ranked(0);
    c.plant(ranked[1], 0);
    c.plant(ranked[1], 1);
    assert_eq!(c.read(ranked[0], None), End::Finish(c.expected(0, 7)));
    assert_eq!(c.origin.fetches.len(), 0, "the origin paid once, for the successor");
    let s = c.nodes[ranked[0]].engine.stats();
    assert_eq!((s.successor_asks, s.successor_hits), (2, 2));
}

#[test]
fn a_root_whose_successor_stalls_is_not_held_up_by_it_and_does_not_charge_it() {
    let mut c = Cluster::new(5, 2, 16, Mode::Honours);
    let ranked = c.ranked(0);
    let (root, successor) = (ranked[0], ranked[1]);
    c.nodes[successor].fault = Fault::Stalled;
    assert_eq!(c.read(root, None), End::Finish(c.expected(0, 15)));
    // Asked once (its short held-only head wait ran out), then remembered slow and skipped:
    // the other three blocks go straight to the origin.
    assert_eq!(c.nodes[successor].relay_requests, 1);
    assert_eq!(c.origin.fetches.len(), 4);
    let b = &c.nodes[root].engine.p2p().expect("p2p").breaker;
    assert_eq!(b.counters().soft, 0, "a held-only ask that ran out is not a verdict");
    assert_eq!(c.state_of(root, successor), CircuitState::Closed);
    assert!(c.nodes[root].engine.is_slow(&addr(successor), c.now), "remembered slow");
}

#[test]
fn a_relay_at_the_root_does_not_ask_the_successor() {
    // A relay read at the root serves the tree below it: in a healthy herd its requester is
    // often that very successor, and every block would pay the round trip.
    let mut c = Cluster::new(5, 2, 8, Mode::Honours);
    let ranked = c.ranked(0);
    let url = c.url.clone();
    let e = &c.nodes[ranked[0]].engine;
    let key = e.block_key(&e.identify(&url), 0);
    let read = c.nodes[ranked[0]].engine.begin_relay(key, Some(url), 1);
    assert_eq!(c.drive(ranked[0], read), End::Finish(c.expected(0, 3)));
    assert!(c.nodes.iter().all(|n| n.relay_requests == 0));
    assert_eq!(c.origin.fetches.len(), 1);
}

#[test]
fn a_chain_at_fanout_one_populates_every_node() {
    let mut c = Cluster::new(4, 1, 4, Mode::Honours);
    let ranked = c.ranked(0);
    assert_eq!(c.read(ranked[3], None), End::Finish(c.expected(0, 3)));
    for &i in &ranked {
        assert_eq!(c.nodes[i].cache.len(), 1, "node {i} holds the block");
    }
    assert_eq!(c.origin.fetches.len(), 1);
}

#[test]
fn a_dead_parent_opens_on_one_dial_and_later_reads_skip_it_with_zero_dials() {
    let mut c = Cluster::new(7, 2, 16, Mode::Honours);
    let ranked = c.ranked(0);
    let (leaf, parent, grand) = (ranked[6], ranked[4], ranked[0]);
    c.nodes[parent].fault = Fault::Dead;
    assert_eq!(c.read(leaf, Some("bytes=0-3")), End::Finish(c.expected(0, 3)));
    assert_eq!(c.nodes[parent].relay_requests, 1, "one dial");
    assert_eq!(c.state_of(leaf, parent), CircuitState::Open);
    assert_eq!(c.nodes[leaf].engine.stats().peer_failover, 1, "escalated to the grandparent");
    assert_eq!(c.nodes[grand].relay_requests, 1);
    for b in 1..4u64 {
        let r = format!("bytes={}-{}", b * 4, b * 4 + 3);
        assert_eq!(c.read(leaf, Some(&r)), End::Finish(c.expected(b * 4, b * 4 + 3)));
    }
    // The leaf never asks it again; the tree laid without it may route the leaf through a
    // member that has not seen it dead yet, which learns so on one dial of its own.
    assert_eq!(c.state_of(leaf, parent), CircuitState::Open);
    assert!(c.nodes[parent].relay_requests <= 2, "{} dials", c.nodes[parent].relay_requests);
    assert_eq!(c.nodes[leaf].engine.stats().block_source_peer, 4, "still served by the tree");
}

#[test]
fn a_child_that_meets_its_home_dead_asks_the_member_that_replaces_it_not_the_origin() {
    // Fanout 2 over 5 members: the home's children are positions 1 and 3, and position 3 has no
    // other ancestor. Laid again without the home, the tree puts position 2 above position 3 and
    // position 1 (the replacement) at the top, which reads the origin once for both (before,
    // position 3 read the origin itself and the replacement again: each child of a dead home
    // learned alone).
    let mut c = Cluster::new(5, 2, 4, Mode::Honours);
    let ranked = c.ranked(0);
    let (home, replacement) = c.dead_home(false);
    let (child, between) = (ranked[3], ranked[2]);
    assert_eq!(c.read(child, None), End::Finish(c.expected(0, 3)));
    assert_eq!(c.state_of(child, home), CircuitState::Open);
    assert_eq!(c.nodes[child].engine.stats().peer_reroutes, 1);
    assert_eq!(c.nodes[child].engine.stats().block_source_peer, 1);
    assert_eq!(c.nodes[between].relay_requests, 1, "the child asked its new parent");
    assert_eq!(c.nodes[replacement].relay_requests, 1, "which asked the replacement");
    assert_eq!(c.nodes[home].relay_requests, 2, "the child and the replacement: one dial each");
    assert_eq!(c.origin.fetches.len(), 1, "one origin read, by the replacement");
    assert_eq!(c.read(replacement, None), End::Finish(c.expected(0, 3)));
    assert_eq!(c.origin.fetches.len(), 1, "the replacement holds it");
    // The tree laid again names nobody new for the replacement itself (it is the top now).
    assert_eq!(c.nodes[replacement].engine.stats().peer_reroutes, 0);
}

#[test]
fn a_block_is_asked_of_a_re_laid_tree_once_and_never_of_a_peer_already_asked() {
    // Both ancestors stall (their circuits stay closed after one timeout each): the tree laid
    // again is the same tree, so nobody new is asked and the read goes to the origin.
    let mut c = Cluster::new(7, 2, 4, Mode::Honours);
    let ranked = c.ranked(0);
    let (leaf, parent, grand) = (ranked[6], ranked[4], ranked[0]);
    c.nodes[parent].fault = Fault::Stalled;
    c.nodes[grand].fault = Fault::Stalled;
    assert_eq!(c.read(leaf, None), End::Finish(c.expected(0, 3)));
    assert_eq!((c.nodes[parent].relay_requests, c.nodes[grand].relay_requests), (1, 1));
    assert_eq!(c.nodes[leaf].engine.stats().peer_reroutes, 0);
    assert_eq!(c.origin.fetches.len(), 1);
}

#[test]
fn a_parent_that_timed_out_on_one_block_is_asked_last_for_the_rest_of_the_read() {
    let mut c = Cluster::new(7, 2, 16, Mode::Honours);
    let ranked = c.ranked(0);
    let (leaf, parent, grand) = (ranked[6], ranked[4], ranked[0]);
    c.nodes[parent].fault = Fault::Stalled;
    // Four blocks in one read: one wait on the stalled parent, not one per block (which would
    // also be three timeouts, enough to open its circuit here).
    assert_eq!(c.read(leaf, None), End::Finish(c.expected(0, 15)));
    assert_eq!(c.nodes[parent].relay_requests, 1, "asked once, for the first block");
    assert_eq!(c.nodes[grand].relay_requests, 4, "the rest went to the grandparent first");
    assert_eq!(c.state_of(leaf, parent), CircuitState::Closed, "one timeout is not a verdict");
}

#[test]
fn a_peer_answering_a_short_block_is_not_trusted_and_nothing_wrong_is_cached() {
    let mut c = Cluster::new(7, 2, 12, Mode::Honours);
    let ranked = c.ranked(0);
    let (leaf, parent) = (ranked[6], ranked[4]);
    c.nodes[parent].fault = Fault::Short;
    assert_eq!(c.read(leaf, None), End::Finish(c.expected(0, 11)));
    assert_eq!(c.state_of(leaf, parent), CircuitState::Open, "a validation failure opens at once");
    let s = c.nodes[leaf].engine.stats();
    assert_eq!(s.peer_wrong_length, 1);
    assert_eq!(s.block_source_origin, 1, "the lied-about block came from the origin");
    assert_eq!(s.block_source_peer, 2, "later blocks skip the open parent for the grandparent");
    // Not asked again by the leaf; at most once by a relay the rebuilt tree routes through,
    // which opens its own circuit on it at once.
    assert!(c.nodes[parent].relay_requests <= 2, "{} asks", c.nodes[parent].relay_requests);
    for (key, data) in &c.nodes[leaf].cache {
        assert_eq!(data[..], c.expected(key.block * 4, key.block * 4 + 3)[..]);
    }
}

#[test]
fn an_expired_credential_through_a_relay_does_not_blame_the_relay() {
    let mut c = Cluster::new(3, 1, 4, Mode::RefusesBlocks);
    let ranked = c.ranked(0);
    let (tail, middle) = (ranked[2], ranked[1]);
    for _ in 0..5 {
        let End::Fail(f) = c.read(tail, None) else { panic!("the origin refuses everyone") };
        assert_eq!(f.status, 403, "the origin's refusal is the client's answer");
    }
    assert_eq!(c.state_of(tail, middle), CircuitState::Closed, "5 refusals at threshold 3");
    assert_eq!(c.nodes[tail].engine.p2p().expect("p2p").breaker.counters().soft, 0);
}

#[test]
fn genuine_relay_failures_still_open_the_circuit() {
    let mut c = Cluster::new(3, 1, 4, Mode::ServerError);
    // The control: a relay whose origin answers 500 returns 500, which is soft and counts.
    // (The probe itself fails on this origin, so drive the tail's peer requests by hand.)
    let ranked = c.ranked(0);
    let (tail, middle) = (ranked[2], ranked[1]);
    let e = &c.nodes[tail].engine;
    let key = e.block_key(&e.identify(&c.url), 0);
    for _ in 0..3 {
        let url = c.url.clone();
        let ask = Ask { key, url: &url, held_only: false, hop: 0, expected: 4, told: None };
        let answer = c.serve_peer(&addr(middle), ask);
        assert_eq!(answer, PeerAnswer::Failed(Observation::UnexpectedStatus(500)));
        let b = &mut c.nodes[tail].engine.p2p_mut().expect("p2p").breaker;
        let permit = b.begin_data(&addr(middle), c.now).permit().expect("admitted while closed");
        b.complete(permit, Observation::UnexpectedStatus(500).outcome(), c.now);
    }
    assert_eq!(c.state_of(tail, middle), CircuitState::Open);
}

#[test]
fn a_relay_declines_requests_it_must_not_serve_without_touching_the_origin() {
    let mut c = Cluster::new(3, 1, 8, Mode::Honours);
    let e = &c.nodes[0].engine;
    let key = e.block_key(&e.identify(&c.url), 0);
    let max = e.config().geometry.max_block_index();
    for block in [1u64 << 63, u64::MAX, max + 1] {
        let bad = BlockKey { chunk: key.chunk, block };
        assert_eq!(relay_check(e, bad, Some(&c.url), 0), Err(RelayDecline::IndexOverflow));
    }
    // A block past the object's end is declined after the probe, with no block fetch.
    let past = e.block_key(&e.identify(&c.url), 5);
    let url = c.url.clone();
    let read = c.nodes[0].engine.begin_relay(past, Some(url), 1);
    let End::Fail(f) = c.drive(0, read) else { panic!("declined") };
    assert_eq!((f.status, f.upstream_status), (404, None));
    assert!(c.origin.fetches.is_empty());
    // A cache-only request for a block not held is a clean 404.
    let read = c.nodes[0].engine.begin_relay(key, None, 0);
    let End::Fail(f) = c.drive(0, read) else { panic!("not held") };
    assert_eq!(f.status, 404);
}

#[test]
fn owned_blocks_are_charged_to_the_owned_budget_and_copies_to_borrowed() {
    let c = Cluster::new(5, 2, 8, Mode::Honours);
    let ranked = c.ranked(0);
    let e = &c.nodes[ranked[0]].engine;
    let key = e.block_key(&e.identify(&c.url), 0);
    assert_eq!(e.class_of(&key), BlockClass::Owned);
    assert_eq!(c.nodes[ranked[3]].engine.class_of(&key), BlockClass::Borrowed);
}

#[test]
fn every_member_reading_every_range_gets_exact_bytes_and_the_origin_sees_each_block_once() {
    let size = 40;
    let mut c = Cluster::new(6, 2, size, Mode::Honours);
    for at in 0..6 {
        for (a, b) in [(0u64, 39u64), (3, 17), (16, 33)] {
            let r = format!("bytes={a}-{b}");
            assert_eq!(c.read(at, Some(&r)), End::Finish(c.expected(a, b)), "node {at} {r}");
        }
    }
    assert_eq!(c.origin.fetches.len(), 10, "10 blocks, each fetched once cluster-wide");
}

#[test]
fn a_cut_through_relay_forwards_a_correct_stream_and_caches_it() {
    let mut c = Cluster::new(3, 1, 4, Mode::Honours);
    let ranked = c.ranked(0);
    assert_eq!(c.read(ranked[2], None), End::Finish(c.expected(0, 3)));
    let middle = &c.nodes[ranked[1]];
    assert_eq!(middle.cache.len(), 1, "the relay kept a copy of what it streamed");
    assert_eq!(middle.engine.stats().relay_served, 1);
    assert_eq!(middle.engine.stats().block_source_peer, 1, "streamed from the root");
}

#[test]
fn a_cut_through_relay_never_caches_a_short_stream_and_the_reader_still_gets_exact_bytes() {
    let mut c = Cluster::new(3, 1, 8, Mode::Honours);
    let ranked = c.ranked(0);
    let (tail, middle, root) = (ranked[2], ranked[1], ranked[0]);
    c.nodes[root].fault = Fault::Short;
    assert_eq!(c.read(tail, Some("bytes=0-3")), End::Finish(c.expected(0, 3)));
    assert!(c.nodes[middle].cache.is_empty(), "a short stream is forwarded, never cached");
    assert_eq!(c.state_of(middle, root), CircuitState::Open, "the liar's circuit opened");
    assert_eq!(c.nodes[middle].engine.stats().peer_wrong_length, 1);
    let s = c.nodes[tail].engine.stats();
    assert_eq!(s.block_source_origin, 1, "the tail fell through to the origin");
    assert_eq!(s.peer_failover, 1, "a truncated relay is a failure, not a miss");
    assert_eq!(
        c.nodes[tail]
            .cache
            .get(&c.nodes[tail].cache.keys().next().copied().expect("one"))
            .map(|b| b.to_vec()),
        Some(c.expected(0, 3))
    );
}

#[test]
fn after_its_peers_fail_a_read_looks_in_the_store_again_before_paying_the_origin() {
    let mut c = Cluster::new(2, 1, 4, Mode::Honours);
    let leaf = c.ranked(0)[1];
    let now = c.now;
    let request = ReadRequest {
        url: c.url.clone(),
        method: Method::Get,
        range: None,
        conditions: Default::default(),
    };
    let mut read = c.nodes[leaf].engine.begin_read(request, Instant::ZERO);
    let Some(Action::Probe { .. }) = read.poll_action() else { panic!("probe first") };
    let answer = c.origin.probe();
    read.handle_probe(&mut c.nodes[leaf].engine, answer, now);
    // The head is held until the first body bytes are in hand.
    let Some(Action::Lookup { key, window }) = read.poll_action() else { panic!("lookup") };
    read.handle_lookup(&mut c.nodes[leaf].engine, None, now);
    let Some(Action::FetchPeer(ask)) = read.poll_action() else { panic!("ask the root") };
    let permit = ask.permit;
    // While the root fails, a sibling read of this node caches the block.
    let sibling_copy = Bytes::from(c.expected(0, 3));
    let dead = PeerAnswer::Failed(Observation::DialFailed);
    read.handle_peer(&mut c.nodes[leaf].engine, Contender::Primary, Some(permit), dead, now);
    let Some(Action::Lookup { key: again, window: window_again }) = read.poll_action() else {
        panic!("the store is consulted again before the origin");
    };
    assert_eq!((again, window_again), (key, window));
    let answer = match window {
        Some(w) => w.slice(&sibling_copy),
        None => Some(sibling_copy),
    };
    read.handle_lookup(&mut c.nodes[leaf].engine, answer, now);
    let Some(Action::Respond(_)) = read.poll_action() else { panic!("the head, with the bytes") };
    let Some(Action::Emit(b)) = read.poll_action() else { panic!("served from the store") };
    assert_eq!(b[..], c.expected(0, 3)[..]);
    assert!(matches!(read.poll_action(), Some(Action::Finish)));
    assert!(c.origin.fetches.is_empty(), "no origin request");
    assert_eq!(c.nodes[leaf].engine.stats().block_source_cache, 1);
}

#[test]
fn a_recheck_that_still_misses_goes_to_the_origin_without_asking_the_peers_again() {
    let mut c = Cluster::new(3, 1, 4, Mode::Honours);
    let ranked = c.ranked(0);
    c.nodes[ranked[1]].fault = Fault::Dead;
    c.nodes[ranked[0]].fault = Fault::Dead;
    assert_eq!(c.read(ranked[2], None), End::Finish(c.expected(0, 3)));
    assert_eq!(c.nodes[ranked[1]].relay_requests + c.nodes[ranked[0]].relay_requests, 2);
    assert_eq!(c.origin.fetches.len(), 1);
}

#[test]
fn a_relay_does_not_serve_a_cached_block_of_the_wrong_length_when_it_knows_the_size() {
    let mut c = Cluster::new(2, 1, 8, Mode::Honours);
    let root = c.ranked(0)[0];
    let url = c.url.clone();
    // The root learns the size, then its store is corrupted for block 0.
    let read = c.nodes[root].engine.begin_read(
        ReadRequest {
            url: url.clone(),
            method: Method::Head,
            range: None,
            conditions: Default::default(),
        },
        Instant::ZERO,
    );
    assert!(matches!(c.drive(root, read), End::Finish(_)));
    let e = &c.nodes[root].engine;
    let key = e.block_key(&e.identify(&url), 0);
    c.nodes[root].cache.insert(key, Bytes::from_static(b"xy"));
    let read = c.nodes[root].engine.begin_relay(key, Some(url), 1);
    assert_eq!(c.drive(root, read), End::Finish(c.expected(0, 3)), "refetched, not the bad copy");
    assert_eq!(c.nodes[root].engine.stats().cache_corrupt, 1);
    assert_eq!(c.origin.fetches.len(), 1);
}

/// Declares the test object immutable at every node (any copy of a block is the block).
fn immutable(c: &mut Cluster) {
    for n in &mut c.nodes {
        n.engine.config.immutable_prefixes = vec!["http://origin.example/".into()];
    }
}

#[test]
fn a_substitute_root_asks_a_neighbour_before_the_origin_and_uses_the_block_it_holds() {
    let mut c = Cluster::new(5, 1, 8, Mode::Honours);
    immutable(&mut c);
    let ranked = c.ranked(0);
    // The dead home passed both blocks down before it died: every other member holds them.
    let (home, substitute) = c.dead_home(true);
    c.enable_neighbours(substitute, 4);
    assert_eq!(c.read(substitute, None), End::Finish(c.expected(0, 7)));
    assert!(c.origin.fetches.is_empty(), "the origin paid nothing: {:?}", c.origin.fetches);
    let stats = c.nodes[substitute].engine.stats();
    assert_eq!((stats.neighbour_asks, stats.neighbour_hits), (2, 2));
    let cache_only: usize = ranked[2..].iter().map(|&n| c.nodes[n].held_only_requests).sum();
    assert_eq!(cache_only, 2, "the neighbour was asked for what it holds only");
    assert_eq!(c.nodes[home].relay_requests, 1, "the dead home: one dial, then its circuit");
}

#[test]
fn a_neighbour_that_does_not_hold_the_block_costs_one_ask_and_is_not_blamed() {
    let mut c = Cluster::new(5, 1, 8, Mode::Honours);
    let (home, substitute) = c.dead_home(false);
    c.enable_neighbours(substitute, 4);
    assert_eq!(c.read(substitute, None), End::Finish(c.expected(0, 7)));
    assert_eq!(c.origin.fetches.len(), 2, "both blocks from the origin");
    let stats = c.nodes[substitute].engine.stats();
    assert_eq!((stats.neighbour_asks, stats.neighbour_hits), (2, 0));
    // A 404 is neither good nor bad: no neighbour lost score for it.
    let report = c.nodes[substitute].engine.neighbours().expect("on").report();
    for n in report.iter().filter(|n| n.id != id(home)) {
        assert_eq!(n.score, crate::overlay::SCORE_INITIAL, "{n:?}");
        assert_eq!(n.failures, 0, "{n:?}");
    }
}

#[test]
fn the_home_of_a_chunk_never_asks_a_neighbour() {
    let mut c = Cluster::new(5, 1, 8, Mode::Honours);
    let home = c.ranked(0)[0];
    c.enable_neighbours(home, 4);
    assert_eq!(c.read(home, None), End::Finish(c.expected(0, 7)));
    // Its successor only (held-only, one per block), never a scored neighbour.
    let successor = c.ranked(0)[1];
    let asked: Vec<usize> = (0..5).filter(|&i| c.nodes[i].relay_requests > 0).collect();
    assert_eq!(asked, vec![successor]);
    assert_eq!(c.nodes[home].engine.stats().neighbour_asks, 0);
}

#[test]
fn a_distrusted_object_never_asks_a_neighbour() {
    let mut c = Cluster::new(5, 1, 8, Mode::Honours);
    let ranked = c.ranked(0);
    let leaf = ranked[4];
    for &n in &ranked[..4] {
        c.plant(n, 0);
        c.plant(n, 1);
    }
    c.enable_neighbours(leaf, 4);
    let id = c.nodes[leaf].engine.identify(&c.url);
    let now = c.now;
    c.nodes[leaf].engine.distrust_peers(&id, now);
    assert_eq!(c.read(leaf, None), End::Finish(c.expected(0, 7)));
    assert!(c.nodes.iter().all(|n| n.relay_requests == 0), "no peer, no neighbour");
    assert_eq!(c.origin.fetches.len(), 2);
}

#[test]
fn a_neighbour_never_serves_a_held_block_of_an_object_whose_version_it_does_not_know() {
    // A mutable object: the holders' blocks came from somewhere (an earlier process, an evicted
    // entry) and nothing says which version they are. They decline; the origin pays.
    let mut c = Cluster::new(5, 1, 8, Mode::Honours);
    let ranked = c.ranked(0);
    let (_, substitute) = c.dead_home(true);
    c.enable_neighbours(substitute, 4);
    assert_eq!(c.read(substitute, None), End::Finish(c.expected(0, 7)));
    assert_eq!(c.origin.fetches.len(), 2, "both blocks from the origin");
    let stats = c.nodes[substitute].engine.stats();
    assert_eq!((stats.neighbour_asks, stats.neighbour_hits), (2, 0));
    let declined: u64 = ranked[2..].iter().map(|&n| c.nodes[n].engine.stats().relay_declined).sum();
    assert_eq!(declined, 2);
}
