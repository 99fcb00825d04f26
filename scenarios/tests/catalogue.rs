//! The scenario suite inside `cargo test`: every committed seed of every scenario at test scale,
//! a same-seed double run for a sample, shrinking, a proptest property over fault plans, and the
//! HTML report.

use dart_scenarios::{catalogue, html, seeds, shrink, Check, Scale, Scenario};
use dart_sim::origin::ObjectDef;
use dart_sim::{
    CheckLevel, ClusterConfig, Fault, FaultKind, FaultPlan, Lie, OriginFault, Phases, ReadSpec,
    SimSpec, Workload,
};
use proptest::prelude::*;
use std::time::Duration;

#[test]
fn every_scenario_has_committed_seeds_and_every_committed_name_exists() {
    for s in catalogue::all() {
        assert!(!seeds::of(s.name).is_empty(), "{} has no committed seed", s.name);
    }
    for (name, _) in seeds::committed() {
        assert!(catalogue::find(&name).is_some(), "seeds.txt names unknown scenario {name}");
    }
}

#[test]
fn committed_seeds_pass_at_test_scale() {
    let mut failed = Vec::new();
    for (name, list) in seeds::committed() {
        let s = catalogue::find(&name).expect("known scenario");
        for seed in list {
            let o = s.run(seed, Scale::Test);
            if !o.passed() {
                failed.push(o.describe());
            }
        }
    }
    assert!(failed.is_empty(), "failing committed seeds:\n{}", failed.join("\n"));
}

#[test]
fn a_sample_of_seeds_replays_to_the_same_trace_hash() {
    for s in catalogue::all() {
        let seed = seeds::of(s.name)[0];
        let a = s.run(seed, Scale::Test);
        let b = s.run(seed, Scale::Test);
        let (ra, rb) = (a.report.as_ref().expect("no panic"), b.report.as_ref().expect("no panic"));
        assert_eq!(
            (ra.trace_hash, ra.events),
            (rb.trace_hash, rb.events),
            "{} seed {seed} is not deterministic; {}",
            s.name,
            a.replay_line()
        );
    }
}

fn small_cluster(plan: FaultPlan) -> SimSpec {
    let mut rng = dart_core::rng::from_seed(3);
    let safety = Workload::everyone_reads_everything(&mut rng, 8, 1, Duration::from_millis(5));
    SimSpec {
        cluster: ClusterConfig::new(8, 128 << 10, vec![ObjectDef::plain(1 << 20, 5)]),
        workload: Workload {
            safety,
            liveness: (0..8).map(|n| ReadSpec::whole(Duration::ZERO, n, 0)).collect(),
        },
        plan,
        phases: Phases { safety: Duration::from_secs(20), liveness: Duration::from_secs(90) },
        check: CheckLevel::Touched,
        record_trace: false,
    }
}

fn fault(at_ms: u64, lasts_ms: u64, kind: FaultKind) -> Fault {
    Fault { at: Duration::from_millis(at_ms), lasts: Duration::from_millis(lasts_ms), kind }
}

#[test]
fn a_failing_plan_shrinks_to_its_one_guilty_fault() {
    // Every node is an upstream of somebody for some block, so any node flipping bytes is caught:
    // its blocks fail their digest (the scenario's expectation, made to fail on that).
    let plan = FaultPlan {
        faults: vec![
            fault(0, 4000, FaultKind::Slow { node: 3, extra_ms: 40, divisor: 3 }),
            fault(100, 9000, FaultKind::Lies { node: 5, lie: Lie::Corrupt }),
            fault(200, 3000, FaultKind::Origin(OriginFault::Errors { status: 503, percent: 20 })),
            fault(50, 2000, FaultKind::Partition { a: 1, b: 6, one_way: false }),
        ],
    };
    let spec = small_cluster(plan);
    let scenario =
        Scenario::new("shrink-me", "a corrupting peer among noise", |_, _| unreachable!()).expect(
            |run, check| {
                let refused: u64 = run
                    .report
                    .peer_answers
                    .iter()
                    .filter(|((_, kind), _)| kind == "ValidationFailed")
                    .map(|(_, n)| n)
                    .sum();
                check.that(refused == 0, "no peer block failed its digest");
            },
        );
    let first = scenario.run_spec(spec.clone(), 4, Scale::Test);
    assert!(!first.passed(), "the corrupted block must be caught");
    assert!(first.report.as_ref().is_some_and(|r| r.violation.is_none()), "and never cached");
    let shrunk = shrink::shrink_spec(&scenario, spec, 4, Scale::Test, 400).expect("it fails");
    assert_eq!(shrunk.spec.plan.faults.len(), 1, "minimal plan: {}", shrunk.spec.plan);
    assert!(matches!(shrunk.spec.plan.faults[0].kind, FaultKind::Lies { lie: Lie::Corrupt, .. }));
    assert!(shrunk.spec.workload.safety.len() < 8, "reads shrink too: {:?}", shrunk.spec.workload);
    assert_eq!(shrink::signature(&shrunk.outcome), shrink::signature(&first));
}

#[test]
fn a_passing_run_has_nothing_to_shrink() {
    let s = catalogue::find("herd").expect("herd");
    assert!(shrink::shrink(&s, 1, Scale::Test, 10).is_none());
}

#[test]
fn expectations_record_failures_gaps_and_notes() {
    let mut c = Check::default();
    c.that(true, "fine");
    c.that(false, "broken");
    c.gap(false, "not yet", "because");
    c.gap(true, "now", "because");
    c.note("measured");
    assert_eq!(c.failures, vec!["broken".to_owned()]);
    assert_eq!(c.gaps, vec!["not yet — because".to_owned()]);
    assert_eq!(c.notes.len(), 2);
}

#[test]
fn the_report_page_plots_timelines_latency_and_origin_bytes() {
    let s = catalogue::find("dead-root").expect("dead-root");
    let o = s.run(1, Scale::Test);
    let page = html::page(std::slice::from_ref(&o));
    assert_eq!(page.matches("<svg").count(), 3);
    for needle in
        ["per-node timeline", "read latency CDF", "origin bytes over time", "#fcc", "heal"]
    {
        assert!(page.contains(needle), "report lacks {needle}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Any fault plan over an 8-node cluster keeps every invariant and lets every liveness read
    /// complete; a counterexample shrinks to a minimal plan.
    #[test]
    fn any_fault_plan_keeps_every_invariant_and_heals(
        plan in dart_sim::fault::strategy::fault_plan(8, Duration::from_secs(15), 5)
    ) {
        let spec = small_cluster(plan);
        let r = dart_sim::run(spec, 11);
        prop_assert!(r.passed(), "{}\nplan: {}", r.summary(), r.plan);
    }
}

#[test]
fn run_writes_junit_xml_and_refuses_an_unwritable_path_before_running() {
    let dir = std::env::temp_dir().join(format!("dart-junit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("scenarios.xml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dart-scenarios"))
        .args(["run", "--scenario", "black-hole", "--small", "--seed", "3", "--junit"])
        .arg(&path)
        .output()
        .expect("run dart-scenarios");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let xml = std::fs::read_to_string(&path).expect("the report");
    assert!(xml.contains("<testsuite name=\"black-hole\" tests=\"1\" failures=\"0\""), "{xml}");
    assert!(xml.contains("name=\"seed 3 small\""), "{xml}");
    let bad = dir.join("missing").join("scenarios.xml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dart-scenarios"))
        .args(["run", "--scenario", "black-hole", "--small", "--seed", "3", "--junit"])
        .arg(&bad)
        .output()
        .expect("run dart-scenarios");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--junit"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("runs,"), "nothing ran");
    let _ = std::fs::remove_dir_all(&dir);
}
