//! Clusters on the peer path: the real core routes misses through the distribution tree.

use dart_sim::origin::ObjectDef;
use dart_sim::*;
use std::time::Duration;

fn spec(nodes: usize, size: u64, plan: FaultPlan) -> SimSpec {
    let mut rng = dart_core::rng::from_seed(7);
    let safety = Workload::everyone_reads_everything(&mut rng, nodes, 1, Duration::from_millis(5));
    let liveness = (0..nodes).map(|n| ReadSpec::whole(Duration::ZERO, n, 0)).collect();
    SimSpec {
        cluster: ClusterConfig::new(nodes, 128 << 10, vec![ObjectDef::plain(size, 1)]),
        workload: Workload { safety, liveness },
        plan,
        phases: Phases { safety: Duration::from_secs(30), liveness: Duration::from_secs(90) },
        check: CheckLevel::Full,
        record_trace: false,
    }
}

fn one(kind: FaultKind) -> FaultPlan {
    FaultPlan {
        faults: vec![Fault {
            at: Duration::from_millis(150),
            lasts: Duration::from_secs(20),
            kind,
        }],
    }
}

#[test]
fn a_herd_costs_the_origin_one_request_per_block() {
    let r = run(spec(16, 2 << 20, FaultPlan::none()), 1);
    assert!(r.passed(), "{}", r.summary());
    assert_eq!(r.origin.range_requests, 16, "2 MiB in 128 KiB blocks");
    assert!(r.origin.per_window.values().all(|&n| n == 1));
    assert_eq!(r.origin.body_bytes, 2 << 20);
    // Only the root's 16 blocks came from the origin; every other client block came from a peer,
    // or from the cache a peer's block filled (a child reading ahead through this node as its
    // relay brought it in before this node's own read reached it).
    let from_origin = |b: &&dart_sim::report::BlockEvent| {
        matches!(b.source, BlockSource::Origin | BlockSource::Coalesced)
    };
    assert!(r.blocks.iter().filter(from_origin).count() <= 16);
    assert!(r.blocks.iter().filter(|b| b.source == BlockSource::Peer).count() >= 8 * 16);
}

#[test]
fn a_black_holed_peer_is_routed_around_and_every_liveness_read_completes() {
    let r = run(spec(12, 2 << 20, one(FaultKind::BlackHole { node: 3 })), 2);
    assert!(r.passed(), "{}", r.summary());
    assert!(r.phase(Phase::Liveness).all(|x| x.outcome == ReadOutcome::Finished));
}

#[test]
fn wrong_length_and_garbage_answers_poison_nothing() {
    for lie in [Lie::WrongLength, Lie::Garbage] {
        let r = run(spec(12, 2 << 20, one(FaultKind::Lies { node: 5, lie })), 3);
        assert!(r.passed(), "{lie:?}: {}", r.summary());
        assert!(r.reads.iter().all(|x| x.outcome == ReadOutcome::Finished), "{lie:?}");
    }
}

#[test]
fn a_right_length_corrupted_block_fails_its_digest_and_is_never_cached() {
    // A peer that flips bytes in blocks of the right length: every such block fails the digest
    // that ends it (dart_core::integrity), so the checker, which compares every cached and served
    // byte, finds nothing wrong.
    let r = run(spec(12, 2 << 20, one(FaultKind::Lies { node: 5, lie: Lie::Corrupt })), 4);
    assert!(r.violation.is_none(), "{}", r.summary());
    let refused: u64 = r
        .peer_answers
        .iter()
        .filter(|((p, kind), _)| *p == 5 && kind == "ValidationFailed")
        .map(|(_, n)| n)
        .sum();
    assert!(refused > 0, "the liar's blocks were refused: {:?}", r.peer_answers);
    let mismatches: u64 = r.nodes.iter().map(|n| n.engine.peer_digest_mismatch).sum();
    assert_eq!(mismatches, refused, "every refusal is a counted digest mismatch");
}

#[test]
fn peer_path_runs_replay_from_their_seed() {
    let plan = one(FaultKind::Crash { node: 2, keep_cache: true });
    let a = run(spec(10, 1 << 20, plan.clone()), 9);
    let b = run(spec(10, 1 << 20, plan), 9);
    assert_eq!((a.trace_hash, a.events), (b.trace_hash, b.events));
    assert!(a.passed(), "{}", a.summary());
}

#[test]
fn breaker_probe_deadlines_fire_as_node_timers_without_busy_loops() {
    // A probe deadline (500 ms) shorter than any peer head wait (at least the 1 s floor): probes
    // sent to a stalled peer are reclaimed by the breaker's timer, and their late answers are
    // stale.
    let mut s = spec(10, 2 << 20, FaultPlan::none());
    let stalled = dart_sim::node::tree_order(&s.cluster, 0, 0)[1];
    // A binary tree, as this test was written for: the stalled node is an ancestor of half the
    // cluster (at 10 members the default is a chain, where only two nodes ever ask it).
    let mut peer = dart_sim::node::PeerConfig { fanout: 2, ..Default::default() };
    peer.breaker.probe_deadline = Duration::from_millis(500);
    peer.breaker.failure_threshold = 1;
    peer.breaker.backoff =
        dart_core::breaker::BackoffPolicy::Fixed { cooldown: Duration::from_secs(1) };
    s.cluster.peer = Some(peer);
    // Hedging off: a child of a chunk's root that its hedge finds silent routes around it for a
    // while (`dart_core::engine::SILENT_MEMORY`), which keeps the data requests this test needs
    // away from the stalled peer's half-open circuits.
    s.cluster.hedge_ratio = 0.0;
    // Four objects read at spread-out times, so that requests keep reaching the stalled peer
    // after circuits on it open and turn half-open (a relay whose requester hangs up abandons its
    // own upstream request uncharged, so the requesters' own fetches must do the probing).
    // Spread past the time a node keeps asking a peer it found slow last (`SLOW_MEMORY`), so
    // that the stalled peer is asked first again while its circuits are half-open.
    s.cluster.objects = (0..8).map(|i| ObjectDef::plain(2 << 20, 1 + i)).collect();
    s.phases.safety = Duration::from_secs(70);
    let mut rng = dart_core::rng::from_seed(3);
    s.workload.safety =
        Workload::everyone_reads_everything(&mut rng, 10, 8, Duration::from_secs(60));
    s.plan = one(FaultKind::Stall { node: stalled });
    s.plan.faults[0].at = Duration::ZERO;
    s.plan.faults[0].lasts = Duration::from_secs(70);
    // (Seeds 1-5 all send a probe to the stalled peer while a circuit on it is half-open.)
    let r = run(s, 1);
    assert!(r.passed(), "{}", r.summary());
    let expired: u64 =
        r.nodes.iter().filter_map(|n| n.breaker.as_ref()).map(|b| b.probe_expired).sum();
    let reasons: Vec<String> = r
        .nodes
        .iter()
        .flat_map(|n| n.circuit_events.iter().map(|e| e.reason.to_string()))
        .collect();
    assert!(expired > 0 || reasons.iter().any(|x| x == "probe expired"), "{reasons:?}");
}
