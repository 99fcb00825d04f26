//! Origin-only clusters: every node reads through its own engine straight from the origin.

use dart_core::engine::Method;
use dart_sim::origin::ObjectDef;
use dart_sim::*;
use std::time::Duration;

fn spec(nodes: usize, objects: Vec<ObjectDef>, workload: Workload, plan: FaultPlan) -> SimSpec {
    SimSpec {
        cluster: ClusterConfig::new(nodes, 64 << 10, objects).origin_only(),
        workload,
        plan,
        phases: Phases { safety: Duration::from_secs(30), liveness: Duration::from_secs(60) },
        check: CheckLevel::Full,
        record_trace: false,
    }
}

#[test]
fn one_node_reads_an_object_whole_and_every_byte_is_checked() {
    let w = Workload { safety: vec![ReadSpec::whole(Duration::ZERO, 0, 0)], liveness: vec![] };
    let r = run(spec(1, vec![ObjectDef::plain(1_000_000, 1)], w, FaultPlan::none()), 1);
    assert!(r.passed(), "{}", r.summary());
    assert_eq!(r.reads[0].outcome, ReadOutcome::Finished);
    assert_eq!(r.reads[0].bytes, 1_000_000);
    let blocks = 1_000_000u64.div_ceil(64 << 10);
    assert_eq!(r.origin.range_requests, blocks);
    assert_eq!(r.origin.probes, 1);
    assert_eq!(r.nodes[0].cached_blocks as u64, blocks);
}

#[test]
fn concurrent_reads_on_one_node_coalesce_to_one_origin_fetch_per_block() {
    let reads = (0..8).map(|i| ReadSpec::whole(Duration::from_micros(i), 0, 0)).collect();
    let w = Workload { safety: reads, liveness: vec![] };
    let r = run(spec(1, vec![ObjectDef::plain(2_000_000, 1)], w, FaultPlan::none()), 2);
    assert!(r.passed(), "{}", r.summary());
    assert!(r.reads.iter().all(|x| x.outcome == ReadOutcome::Finished));
    assert!(r.origin.per_window.values().all(|&n| n == 1), "{:?}", r.origin.per_window);
    // Each reader signs its own URL: each costs one 1-byte credential check (which also teaches
    // the size: there is no separate probe); the blocks are fetched once for all.
    assert_eq!(r.origin.probes, 8);
    assert!(r.blocks.iter().any(|b| b.source == BlockSource::Coalesced));
}

#[test]
fn random_ranges_and_heads_answer_exactly_what_the_oracle_says() {
    let sizes = [0u64, 1, 65_535, 65_536, 200_001];
    let objects = sizes.iter().enumerate().map(|(i, &s)| ObjectDef::plain(s, i as u64)).collect();
    let mut rng = dart_core::rng::from_seed(5);
    let reads = Workload::random_reads(&mut rng, 3, &sizes, 200, Duration::from_secs(5));
    assert!(reads.iter().any(|r| r.method == Method::Head));
    let w = Workload { safety: reads, liveness: vec![] };
    let r = run(spec(3, objects, w, FaultPlan::none()), 3);
    assert!(r.passed(), "{}", r.summary());
    assert!(r.reads.iter().all(|x| x.outcome == ReadOutcome::Finished), "{:?}", r.reads);
}

#[test]
fn the_same_seed_gives_the_same_trace_hash_and_another_seed_does_not() {
    let sizes = [300_000u64];
    let mk = |seed| {
        let mut rng = dart_core::rng::from_seed(seed);
        let reads = Workload::random_reads(&mut rng, 4, &sizes, 50, Duration::from_secs(5));
        let w = Workload { safety: reads, liveness: vec![] };
        run(spec(4, vec![ObjectDef::plain(300_000, 9)], w, FaultPlan::none()), seed)
    };
    let (a, b, c) = (mk(11), mk(11), mk(12));
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.events, b.events);
    assert_ne!(a.trace_hash, c.trace_hash);
}

fn fault(at_ms: u64, lasts_ms: u64, kind: FaultKind) -> Fault {
    Fault { at: Duration::from_millis(at_ms), lasts: Duration::from_millis(lasts_ms), kind }
}

#[test]
fn origin_errors_fail_reads_during_the_fault_and_liveness_reads_complete_after_it() {
    let obj = vec![ObjectDef::plain(500_000, 1)];
    let safety =
        (0..20).map(|i| ReadSpec::whole(Duration::from_millis(i * 100), i as usize % 3, 0));
    let liveness = (0..3).map(|n| ReadSpec::whole(Duration::ZERO, n, 0)).collect();
    let w = Workload { safety: safety.collect(), liveness };
    let err = FaultKind::Origin(OriginFault::Errors { status: 503, percent: 100 });
    let plan = FaultPlan { faults: vec![fault(0, 1_000, err)] };
    let r = run(spec(3, obj, w, plan), 4);
    assert!(r.passed(), "{}", r.summary());
    assert!(r
        .phase(Phase::Safety)
        .any(|x| matches!(x.outcome, ReadOutcome::Failed { status: 502, .. })));
    assert!(r.phase(Phase::Liveness).all(|x| x.outcome == ReadOutcome::Finished));
}

#[test]
fn a_crash_aborts_reads_keeps_or_loses_the_cache_and_the_restarted_node_serves_again() {
    for keep_cache in [true, false] {
        let obj = vec![ObjectDef::plain(4_000_000, 1)];
        let w = Workload {
            safety: vec![ReadSpec::whole(Duration::ZERO, 0, 0)],
            liveness: vec![ReadSpec::whole(Duration::ZERO, 0, 0)],
        };
        let plan =
            FaultPlan { faults: vec![fault(300, 2_000, FaultKind::Crash { node: 0, keep_cache })] };
        let mut s = spec(1, obj, w, plan);
        // Kept blocks are served only for objects that never change.
        s.cluster.immutable = true;
        let r = run(s, 5);
        assert!(r.passed(), "{}", r.summary());
        assert_eq!(r.reads[0].outcome, ReadOutcome::Aborted);
        assert_eq!(r.reads[1].outcome, ReadOutcome::Finished);
        let from_cache = r.blocks.iter().filter(|b| b.source == BlockSource::Cache).count();
        assert_eq!(
            from_cache > 0,
            keep_cache,
            "a kept cache serves the blocks fetched before the crash"
        );
    }
}

#[test]
fn a_cut_to_the_origin_costs_the_dial_or_header_bound_and_heals() {
    let obj = vec![ObjectDef::plain(300_000, 1)];
    let w = Workload {
        safety: vec![ReadSpec::whole(Duration::from_millis(10), 0, 0)],
        liveness: vec![ReadSpec::whole(Duration::ZERO, 0, 0)],
    };
    let plan = FaultPlan {
        faults: vec![fault(0, 20_000, FaultKind::CutOrigin { node: 0, one_way: false })],
    };
    let r = run(spec(1, obj, w, plan), 6);
    assert!(r.passed(), "{}", r.summary());
    let first = &r.reads[0];
    assert!(matches!(first.outcome, ReadOutcome::Failed { status: 502, committed: false, .. }));
    assert_eq!(first.latency(), Some(Duration::from_secs(10)), "the origin dial bound");
    assert_eq!(r.reads[1].outcome, ReadOutcome::Finished);
}

#[test]
fn swarm_plans_over_origin_only_clusters_keep_every_invariant() {
    let space = SwarmSpace {
        nodes: 4,
        window: Duration::from_secs(20),
        classes: vec![
            FaultClass::CutOrigin,
            FaultClass::Isolate,
            FaultClass::Crash,
            FaultClass::Slow,
            FaultClass::Loss,
            FaultClass::OriginErrors,
            FaultClass::OriginTruncates,
            FaultClass::OriginHidesTotal,
            FaultClass::OriginStall,
            FaultClass::OriginSlow,
            FaultClass::OriginRangeBlind,
        ],
        faults_max: 5,
    };
    let sizes = [700_000u64, 65_536];
    for seed in 0..24 {
        let mut rng = dart_core::rng::from_seed(seed);
        let plan = FaultPlan::swarm(&mut rng, &space);
        let reads = Workload::random_reads(&mut rng, 4, &sizes, 40, Duration::from_secs(25));
        let liveness =
            (0..4).map(|n| ReadSpec::whole(Duration::from_millis(n as u64), n, 0)).collect();
        let objects = sizes.iter().map(|&s| ObjectDef::plain(s, s)).collect();
        let mut s = spec(4, objects, Workload { safety: reads, liveness }, plan);
        s.phases = Phases { safety: Duration::from_secs(30), liveness: Duration::from_secs(400) };
        let r = run(s, seed);
        assert!(r.passed(), "seed {seed}: {}\nplan: {}", r.summary(), r.plan);
    }
}
