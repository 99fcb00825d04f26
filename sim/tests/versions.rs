//! Objects that change at the origin: the origin serves every answer from one version, and the
//! oracle holds every delivered and cached byte to the version it must be of.

use dart_sim::origin::ObjectDef;
use dart_sim::*;
use std::time::Duration;

const BLOCK: u64 = 128 << 10;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn replace(at: Duration, size: Option<u64>) -> Fault {
    Fault { at, lasts: ms(1), kind: FaultKind::ReplaceObject { object: 0, size } }
}

/// `nodes` nodes read a 2 MiB object at about `at` and again in the liveness phase.
fn spec(nodes: usize, object: ObjectDef, faults: Vec<Fault>) -> SimSpec {
    let mut rng = dart_core::rng::from_seed(11);
    let safety = Workload::everyone_reads_everything(&mut rng, nodes, 1, ms(300));
    let liveness = (0..nodes).map(|n| ReadSpec::whole(ms(n as u64), n, 0)).collect();
    let mut cluster = ClusterConfig::new(nodes, BLOCK, vec![object]);
    cluster.revalidate_after = Duration::from_secs(1);
    SimSpec {
        cluster,
        workload: Workload { safety, liveness },
        plan: FaultPlan { faults },
        phases: Phases { safety: Duration::from_secs(8), liveness: Duration::from_secs(30) },
        check: CheckLevel::Full,
        record_trace: true,
    }
}

fn assert_converged(r: &RunReport) {
    assert!(r.passed(), "{}", r.summary());
    let newest = r.versions[0].len() - 1;
    for x in r.phase(Phase::Liveness) {
        assert_eq!((&x.outcome, x.version), (&ReadOutcome::Finished, Some(newest)), "{x:?}");
    }
}

#[test]
fn an_object_replaced_mid_read_is_served_one_version_per_response_and_readers_converge() {
    let r = run(spec(10, ObjectDef::plain(2 << 20, 4), vec![replace(ms(120), None)]), 1);
    assert_converged(&r);
    assert_eq!(r.versions[0].len(), 2);
    assert_eq!(r.versions[0][1].etag, "\"o0v1\"");
    let lines = r.trace.as_ref().expect("recorded");
    assert!(lines.iter().any(|l| l.contains("version o0 v1 2097152B \"o0v1\"")));
    assert!(lines.iter().any(|l| l.contains("206") && l.ends_with(" v1")), "answers of v1");
    // Every safety read is complete (of one version: checked byte by byte) or failed cleanly.
    for x in r.phase(Phase::Safety) {
        match &x.outcome {
            ReadOutcome::Finished => assert!(x.version.is_some()),
            ReadOutcome::Failed { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    let changes: u64 = r.nodes.iter().map(|n| n.engine.object_changes).sum();
    assert!(changes > 0);
}

#[test]
fn a_resized_version_and_a_last_modified_only_origin_converge_too() {
    // Without an ETag, Last-Modified tells the versions apart; the second version is smaller and
    // not a whole number of blocks.
    let object = ObjectDef { etag: false, ..ObjectDef::plain(2 << 20, 5) };
    let faults = vec![replace(ms(100), None), replace(ms(900), Some((2 << 20) - BLOCK / 2 - 3))];
    let r = run(spec(8, object, faults), 2);
    assert_converged(&r);
    assert_eq!(r.versions[0][2].shape.size, (2 << 20) - BLOCK / 2 - 3);
    assert!(r.phase(Phase::Liveness).all(|x| x.bytes == (2 << 20) - BLOCK / 2 - 3));
}

#[test]
fn the_origin_down_while_validators_are_stale_serves_the_cached_version() {
    let mut s = spec(6, ObjectDef::plain(1 << 20, 6), Vec::new());
    // A public origin: late readers sign new URLs, which a private origin's outage would refuse
    // (credentials-in-an-outage covers that).
    s.cluster.public_origin = true;
    let down = FaultKind::Origin(OriginFault::Errors { status: 503, percent: 100 });
    s.plan.faults = vec![
        Fault { at: Duration::from_secs(2), lasts: Duration::from_secs(6), kind: down },
        replace(Duration::from_secs(3), None),
    ];
    s.workload.safety.extend((0..6).map(|n| ReadSpec::whole(Duration::from_secs(4), n, 0)));
    let r = run(s, 3);
    assert_converged(&r);
    let late: Vec<_> = r.phase(Phase::Safety).skip(6).collect();
    assert!(late.iter().all(|x| x.outcome == ReadOutcome::Finished && x.version == Some(0)));
    let stale: u64 = r.nodes.iter().map(|n| n.engine.stale_served).sum();
    assert!(stale >= 6, "{stale}");
}

#[test]
fn a_warm_cache_of_an_old_version_after_a_restart_is_never_served() {
    // A node that restarts with its cache (a verified warm start) has forgotten which version
    // its blocks are of. The object changed meanwhile: the machine was told which blocks were
    // kept, refuses them for an object that may change, and reads the new version afresh. (Before
    // it was told, the oracle caught the old blocks served under the new version's head.)
    let mut s = spec(6, ObjectDef::plain(1 << 20, 7), Vec::new());
    let crash = FaultKind::Crash { node: 2, keep_cache: true };
    s.plan.faults = vec![
        Fault { at: Duration::from_secs(2), lasts: Duration::from_secs(2), kind: crash },
        replace(Duration::from_secs(3), None),
    ];
    s.workload.safety.push(ReadSpec::whole(Duration::from_secs(5), 2, 0));
    let r = run(s, 4);
    assert!(r.violation.is_none(), "{:?}", r.violation);
    let last = r.phase(Phase::Safety).filter(|x| x.node == 2).last().expect("its read");
    assert_eq!((last.outcome.clone(), last.version), (ReadOutcome::Finished, Some(1)));
}
