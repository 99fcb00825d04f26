//! The scenario catalogue: each scenario's cluster, workload, faults and expectation as code.
//!
//! Scenarios that expose a documented limitation of the core record it as a gap (printed with
//! the reason, not counted as a failure) so the catalogue stays green while saying exactly what
//! the core does not do yet.

use crate::{Check, Run, Scale, Scenario};
use dart_core::breaker::{CircuitState, HardReason, TransitionReason};
use dart_core::discovery::Timing;
use dart_core::rng;
use dart_sim::config::{SimDiscovery, SimSeeds};
use dart_sim::node::{member_addr, tree_order, PeerConfig};
use dart_sim::origin::ObjectDef;
use dart_sim::{
    BlockSource, CheckLevel, ClusterConfig, Fault, FaultClass, FaultKind, FaultPlan, Lie,
    OriginFault, Phase, Phases, ReadOutcome, ReadSpec, RunReport, SimSpec, SwarmSpace, Workload,
};
use std::collections::BTreeMap;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn fault(at: Duration, lasts: Duration, kind: FaultKind) -> Fault {
    Fault { at, lasts, kind }
}

/// Every scenario, in the order `list` prints them.
pub fn all() -> Vec<Scenario> {
    vec![
        herd(),
        herd_narrow_links(),
        dead_root(),
        dead_root_midread(),
        second_herd_dead_owner(),
        black_hole(),
        stalled_peer(),
        stalled_successor(),
        flapping(),
        expired_credential(),
        range_blind(),
        range_blind_midway(),
        lying_peer(),
        lying_peer_corrupt(),
        lying_requester(),
        breaker_churn(),
        crash_restart(),
        small_caches(),
        network_blip(),
        origin_errors(),
        chain(),
        deep_ranges(),
        partition_heals(),
        object_changes(),
        stale_if_error(),
        credentials_in_an_outage(),
        tail_at_scale(),
        object_changes_restart(),
        swarm(),
        reference(),
        discovery_boot(),
        member_dies(),
        member_drains(),
        pod_ip_reuse(),
        some_read(),
        some_read_tracked(),
        some_read_staggered(),
        dead_root_some_read(),
        dead_home_late_readers(),
        store_rots(),
        registry_herd(),
        registry_dead_root(),
    ]
}

/// The scenario called `name`.
pub fn find(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

/// A cluster of `nodes` where every node reads every object whole, staggered over `spread`, and
/// reads it again after healing.
fn everyone_reads(
    seed: u64,
    nodes: usize,
    objects: Vec<ObjectDef>,
    block: u64,
    spread: Duration,
) -> SimSpec {
    let mut r = rng::from_seed(seed);
    let count = objects.len();
    let safety = Workload::everyone_reads_everything(&mut r, nodes, count, spread);
    let liveness = Workload::everyone_reads_everything(&mut r, nodes, count, ms(10));
    SimSpec {
        cluster: ClusterConfig::new(nodes, block, objects),
        workload: Workload { safety, liveness },
        plan: FaultPlan::none(),
        phases: Phases { safety: secs(40), liveness: secs(90) },
        check: CheckLevel::Touched,
        record_trace: false,
    }
}

fn pick(scale: Scale, test: u64, full: u64) -> u64 {
    match scale {
        Scale::Test => test,
        Scale::Full => full,
    }
}

/// Safety reads of nodes other than `except` all finished.
fn safety_reads_finish(run: &Run<'_>, check: &mut Check, except: &[usize]) {
    let bad: Vec<String> = run
        .report
        .phase(Phase::Safety)
        .filter(|r| !except.contains(&r.node) && r.outcome != ReadOutcome::Finished)
        .map(|r| format!("n{} {:?}", r.node, r.outcome))
        .collect();
    check.that(bad.is_empty(), format!("every safety read completes; not: {bad:?}"));
}

fn latencies(report: &RunReport, phase: Phase, except: &[usize]) -> Vec<Duration> {
    let mut v: Vec<Duration> = report
        .phase(phase)
        .filter(|r| !except.contains(&r.node) && r.outcome.is_complete())
        .filter_map(|r| r.latency())
        .collect();
    v.sort();
    v
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn note_latency(check: &mut Check, report: &RunReport, except: &[usize]) {
    let l = latencies(report, Phase::Safety, except);
    check.note(format!(
        "safety read latency p50 {:?} p99 {:?} max {:?}",
        quantile(&l, 0.5),
        quantile(&l, 0.99),
        l.last().copied().unwrap_or_default()
    ));
}

/// The same run without faults (a baseline for what a fault cost).
fn baseline(run: &Run<'_>) -> RunReport {
    let mut spec = run.spec.clone();
    spec.plan = FaultPlan::none();
    dart_sim::run(spec, run.report.seed)
}

/// One whole read of object 0 by `node` alone, on the same cluster under the same seed: the
/// time a herd's reader is compared with ("as fast as if it read alone").
fn solo(run: &Run<'_>, node: usize) -> Duration {
    let mut spec = run.spec.clone();
    spec.plan = FaultPlan::none();
    let read = dart_sim::ReadSpec::whole(Duration::ZERO, node, 0);
    spec.workload = Workload { safety: vec![read], liveness: Vec::new() };
    let report = dart_sim::run(spec, run.report.seed);
    latencies(&report, Phase::Safety, &[]).first().copied().unwrap_or(Duration::MAX)
}

/// Circuit transitions towards `addr`, across all nodes: (node, event).
fn circuits_to<'a>(
    report: &'a RunReport,
    addr: &'a str,
) -> impl Iterator<Item = (usize, &'a dart_core::breaker::BreakerEvent<String>)> + 'a {
    report.nodes.iter().enumerate().flat_map(move |(i, n)| {
        n.circuit_events.iter().filter(move |e| e.addr == addr).map(move |e| (i, e))
    })
}

/// Peer requests of the other nodes that timed out on nodes other than `dead` (honest relays
/// blamed for waiting on their own upstream). The faulty node's own requests are not counted: cut
/// off from everyone (a black hole), every ask it makes times out, which blames nobody the
/// cluster could have spared (and those of its asks that are held-only are not charged at all).
fn blamed_relays(report: &RunReport, dead: usize) -> u64 {
    report
        .peer_timeouts
        .iter()
        .filter(|((asker, peer), _)| *asker != dead && *peer != dead)
        .map(|(_, n)| n)
        .sum()
}

fn herd() -> Scenario {
    Scenario::new("herd", "thundering herd: every node reads one object at once", |seed, scale| {
        let nodes = pick(scale, 16, 100) as usize;
        let size = pick(scale, 2, 256) * MIB;
        let block = pick(scale, 128 << 10, 4 * MIB);
        everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(20))
    })
    .expect(herd_expectations)
}

/// `bench/herd-netns.sh`'s cluster: every NIC (nodes and origin) at 100 Mbit/s both ways, 100 µs
/// apart, where the links and not the origin's latency bound a read. Each reader must still be
/// about as fast as one alone (the default tree is a chain at this size; at fanout 2 the herd
/// takes about twice one read).
fn herd_narrow_links() -> Scenario {
    Scenario::new(
        "herd-narrow-links",
        "8 nodes on 100 Mbit/s links read one object at once (the real-process herd's cluster)",
        |seed, scale| {
            let size = pick(scale, 16, 128) * MIB;
            let mut spec =
                everyone_reads(seed, 8, vec![ObjectDef::plain(size, seed)], 4 * MIB, ms(20));
            let latency = dart_sim::net::Latency::Fixed(Duration::from_micros(100));
            let link = dart_sim::net::LinkSpec { latency, bandwidth: 12_500_000, loss: 0.0 };
            let net = &mut spec.cluster.net;
            (net.peer_link, net.origin_link) = (link, link);
            (net.node_egress, net.origin_egress) = (12_500_000, 12_500_000);
            spec
        },
    )
    .expect(herd_expectations)
}

/// What a herd must show: the origin sees each block window once and pays about the object, and
/// the herd's p99 is within 1.5 × one solo read by its slowest reader's node on the same cluster.
fn herd_expectations(run: &Run<'_>, check: &mut Check) {
    let r = run.report;
    let size = run.spec.cluster.objects[0].size;
    safety_reads_finish(run, check, &[]);
    check.that(
        r.origin.per_window.values().all(|&n| n == 1),
        "the origin sees each block window exactly once",
    );
    check.that(
        r.origin.body_bytes <= size + size / 100,
        format!("origin bytes {} ≈ object size {size}", r.origin.body_bytes),
    );
    let peer = r.blocks.iter().filter(|b| b.source == BlockSource::Peer).count();
    check.note(format!(
        "origin bytes {} for {} readers; {peer} blocks came from peers; {} client windows passed \
         on from the origin as they arrived",
        r.origin.body_bytes,
        run.spec.cluster.nodes,
        engine_total(r, |e| e.origin_streams),
    ));
    note_latency(check, r, &[]);
    // Every reader about as fast as if it read alone: the herd's p99 against the slowest
    // reader's node reading the object alone.
    let herd = latencies(r, Phase::Safety, &[]);
    let p99 = quantile(&herd, 0.99);
    let slowest = r
        .phase(Phase::Safety)
        .filter(|x| x.outcome.is_complete())
        .max_by_key(|x| x.latency())
        .map_or(0, |x| x.node);
    let alone = solo(run, slowest);
    check
        .note(format!("herd p99 / one solo read = {:.2}", p99.as_secs_f64() / alone.as_secs_f64()));
    // Held since a tree root reads ahead at an origin slow to answer and fast to send, for
    // its own read shared with its children's relays and for a stream it only relays
    // (`Node::origin_ahead`, `Node::relay_ahead`): before, such a root asked for one window per
    // round trip and every reader followed at that pace (2.02-2.22 x on 8 of 1,000 seeds at
    // test scale, where the slowest reader was the root; full-scale herd p99 2.50 s).
    check.that(
        p99.as_secs_f64() <= 1.5 * alone.as_secs_f64(),
        format!("herd p99 {p99:?} ≤ 1.5 × one solo read by n{slowest} ({alone:?})"),
    );
}

/// The tree root's machine vanishes `full_ms` (+ up to 99 ms) into the full-scale run (150 ms at
/// test scale).
fn dead_root_at(name: &'static str, summary: &'static str, full_ms: u64) -> Scenario {
    Scenario::new(name, summary, move |seed, scale| {
        let nodes = pick(scale, 12, 60) as usize;
        let size = pick(scale, 4, 128) * MIB;
        let block = pick(scale, 128 << 10, 4 * MIB);
        let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
        let root = tree_order(&spec.cluster, 0, 0)[0];
        let at = ms(pick(scale, 150, full_ms) + seed % 100);
        spec.plan = FaultPlan { faults: vec![fault(at, secs(60), FaultKind::BlackHole { node: root })] };
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        let root = tree_order(&run.spec.cluster, 0, 0)[0];
        safety_reads_finish(run, check, &[root]);
        let bounds = run.spec.cluster.bounds;
        let base = baseline(run);
        let worst = latencies(r, Phase::Safety, &[root]).last().copied().unwrap_or_default();
        let base_worst = latencies(&base, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let per_level = bounds.peer_head + bounds.peer_dial;
        let depth = (run.spec.cluster.nodes as f64).log2().floor() as u32;
        check.that(
            worst <= base_worst + per_level * depth + secs(2),
            format!("slowest read {worst:?} within baseline {base_worst:?} + one header and dial bound per tree level ({depth})"),
        );
        // Routing around the dead root costs the slowest reader at most a second: its cost, not
        // a multiple of the fault-free read, which read-ahead at the roots made shorter than the
        // cost (this was ≤ 1.5 × the fault-free read until then). Met since a child of the root
        // probes it and backs up to the origin when it is silent (`Read::handle_hedge_due`), and
        // a relay committed to a stream that the dead root stopped feeding finishes it from the
        // copy that lands in its node's store (`Read::resume_stream`): 0.47-0.55 s over 30 seeds
        // at test scale, 0.12-0.18 s at full scale 0.4 s in (`dead-root-midread`). About 0.4-1.3
        // s with the probe alone (relays ended only at their progress bound); about 2.4 s before
        // it (a dial bound plus a head wait on the dead root).
        check.that(
            worst <= base_worst + secs(1),
            format!("slowest read {worst:?} ≤ the fault-free {base_worst:?} + 1 s"),
        );
        let object = run.spec.cluster.objects[0].size;
        let origin_share = r.origin.body_bytes as f64 / object as f64;
        // Met since the home asks its successor before the origin: the readers converge on the
        // successor (one fetch per block), and the root, back after the fault, reads what the
        // successor fetched (1.75-1.88 x before, most of it that catch-up read).
        check.that(
            origin_share <= 1.25,
            format!("origin bytes {:.2} × the object ≤ 1.25", origin_share),
        );
        let blamed = blamed_relays(r, root);
        check.that(blamed == 0, format!("{blamed} timeouts charged to honest relays = 0"));
        check.note(format!(
            "slowest read {worst:?} vs {base_worst:?} without the fault; origin {} range requests vs {}; \
             {blamed} timeouts charged to honest relays; {} stale refetches; {} blocks asked of a \
             neighbour before the origin, {} held; {} asked of the home's successor, {} held",
            r.origin.range_requests,
            base.origin.range_requests,
            r.stale_refetches,
            engine_total(r, |e| e.neighbour_asks),
            engine_total(r, |e| e.neighbour_hits),
            engine_total(r, |e| e.successor_asks),
            engine_total(r, |e| e.successor_hits),
        ));
    })
}

/// The root vanishes early in the reads: 0.1-0.2 s in at full scale (reads of 128 MiB last
/// about 0.55 s), when the first blocks are on their way down. Issue 10 filed it at 1.5 s, which
/// once reads had become faster than that killed the root after they were done and tested
/// nothing at full scale (until 2026-12-06); `dead-root-midread` is the same fault 0.4 s in.
fn dead_root() -> Scenario {
    dead_root_at(
        "dead-root",
        "the tree root's machine vanishes early in the reads (0.1-0.2 s in at full scale)",
        100,
    )
}

fn dead_root_midread() -> Scenario {
    dead_root_at(
        "dead-root-midread",
        "the tree root's machine vanishes mid-read (0.4 s in at full scale, while reads are under way)",
        400,
    )
}

/// The real `dart demo`'s second herd: every node reads one object, the owner of a second
/// object's blocks dies, and the others read that one. The node that stands in for the dead
/// owner is no owner, so the blocks it fetches are borrowed, and its cache is full of the first
/// object's blocks, which were read more often: TinyLFU refuses every new one. Its own read and
/// the readers behind it must still get each block it fetched (read ahead included) without the
/// origin sending it again.
fn second_herd_dead_owner() -> Scenario {
    Scenario::new(
        "second-herd-dead-owner",
        "every node reads an object; the owner of a second one dies and the rest read it through full caches that refuse its blocks: the origin sends each window once",
        |seed, scale| {
            let nodes = pick(scale, 8, 24) as usize;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let objects =
                vec![ObjectDef::plain(32 * block, seed), ObjectDef::plain(32 * block, seed ^ 0xB)];
            let mut spec = everyone_reads(seed, nodes, objects, block, ms(20));
            let owner = tree_order(&spec.cluster, 1, 0)[0];
            let second = secs(pick(scale, 2, 4));
            for read in &mut spec.workload.safety {
                if read.object == 1 {
                    read.at += second;
                }
            }
            // As many blocks as one object: the first herd fills every cache (6 borrowed).
            spec.cluster.cache_blocks = 32;
            // The origin's count is the herds': nothing reads later.
            spec.workload.liveness.clear();
            let dies = second - ms(500);
            spec.plan = FaultPlan {
                faults: vec![fault(dies, secs(60), FaultKind::Crash { node: owner, keep_cache: false })],
            };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let owner = tree_order(&run.spec.cluster, 1, 0)[0];
        safety_reads_finish(run, check, &[owner]);
        let block = run.spec.cluster.geometry.block_bytes();
        let sent = |b: u64| r.origin.per_window.get(&(1, b * block)).copied().unwrap_or(0);
        // Block 0 is where each child of the dead owner meets it dead: refused, it lays its tree
        // again without the owner and asks the member that replaces it, which reads the origin
        // once for all of them (until `Read::reroute`, each child read it on its own: block 0
        // was sent twice or more on every seed at full scale).
        let twice: Vec<u64> = (0..32).filter(|&b| sent(b) > 1).collect();
        check.that(
            twice.is_empty(),
            format!("the origin sent each window of the second object once (more: blocks {twice:?})"),
        );
        let rejected: u64 = r.nodes.iter().map(|n| n.admit_rejected).sum();
        check.that(rejected > 0, "full caches refused borrowed blocks");
        let held: u64 = r.nodes.iter().map(|n| n.counters.held_hits).sum();
        let reroutes = engine_total(r, |e| e.peer_reroutes);
        check.note(format!(
            "{rejected} borrowed admissions refused; {held} look-ups answered from held blocks; \
             {reroutes} blocks asked of a tree laid again; origin {} range requests",
            r.origin.range_requests,
        ));
    })
}

fn black_hole() -> Scenario {
    Scenario::new(
        "black-hole",
        "an interior node is a black hole before anyone dials it: one dial bound, then no cost",
        |seed, scale| {
            let nodes = pick(scale, 12, 60) as usize;
            let size = pick(scale, 4, 128) * MIB;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
            for r in &mut spec.workload.safety {
                r.at += ms(100);
            }
            let hole = tree_order(&spec.cluster, 0, 0)[1];
            spec.plan = FaultPlan { faults: vec![fault(ms(0), secs(60), FaultKind::BlackHole { node: hole })] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let hole = tree_order(&run.spec.cluster, 0, 0)[1];
        safety_reads_finish(run, check, &[hole]);
        let base = baseline(run);
        let worst = latencies(r, Phase::Safety, &[hole]).last().copied().unwrap_or_default();
        let base_worst = latencies(&base, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let dial = run.spec.cluster.bounds.peer_dial;
        check.that(
            worst <= base_worst + dial + ms(500),
            format!("slowest read {worst:?} ≤ baseline {base_worst:?} + one dial bound {dial:?}"),
        );
        let addr = member_addr(hole);
        let opens: Vec<_> = circuits_to(r, &addr).filter(|(_, e)| e.to == CircuitState::Open).collect();
        check.that(
            // Or a failed probe of the open circuit: a data probe, or a neighbour's ping (a
            // roster fetch) while half-open.
            opens.iter().all(|(_, e)| {
                matches!(
                    e.reason,
                    TransitionReason::HardFailure(HardReason::Dial)
                        | TransitionReason::ProbeFailed
                        | TransitionReason::RosterFailed
                )
            }),
            "the hole's circuits open on the first dial failure",
        );
        let first: Vec<_> = opens.iter().filter(|(_, e)| e.reason == TransitionReason::HardFailure(HardReason::Dial)).collect();
        check.note(format!(
            "{} nodes opened the hole's circuit on a dial failure; slowest read {worst:?} vs {base_worst:?} without it",
            first.len()
        ));
    })
}

fn stalled_peer() -> Scenario {
    Scenario::new(
        "stalled-peer",
        "an interior node accepts requests and never answers them: what does routing around it cost?",
        |seed, scale| {
            let nodes = pick(scale, 12, 60) as usize;
            let size = pick(scale, 2, 64) * MIB;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
            let stalled = tree_order(&spec.cluster, 0, 0)[1];
            spec.plan = FaultPlan { faults: vec![fault(ms(0), secs(120), FaultKind::Stall { node: stalled })] };
            spec.phases.safety = secs(200);
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        safety_reads_finish(run, check, &[]);
        let stalled = tree_order(&run.spec.cluster, 0, 0)[1];
        let base = baseline(run);
        let worst = latencies(r, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let base_worst = latencies(&base, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let timeouts = r.peer_answers.get(&(stalled, "TimedOut".to_owned())).copied().unwrap_or(0);
        let opens = circuits_to(r, &member_addr(stalled)).filter(|(_, e)| e.to == CircuitState::Open).count();
        // The stall may cost one cold hedge wait: the bound is the stall-free read plus two (one
        // wait, and as much again for the runs' different draws), as in `stalled-successor`; not
        // a multiple of the stall-free read, which read-ahead at the roots made about as short
        // as one wait (this was ≤ 2 × the stall-free read until then). Met since a node without
        // an estimate hedges its first slow fetch (375 ms, one hedge banked at start) and a
        // block another read stored ends the waits on the stalled node: 0.26-0.35 s over 30
        // seeds at each scale. Before, each of its children paid the 1.5 s cold head wait.
        // Since 2026-12-06 a held-only ask waits a probe wait, not a hedge delay, and a node
        // without an estimate probes a slow parent after 150 ms and leaves a silent one for the
        // grandparent: 0.10-0.15 s at full scale (docs/tail.md).
        let wait = dart_core::engine::hedge::COLD_DELAY;
        check.that(
            worst <= base_worst + 2 * wait,
            format!("slowest read {worst:?} ≤ the stall-free {base_worst:?} + 2 × {wait:?}"),
        );
        check.that(
            blamed_relays(r, stalled) == 0,
            format!("no timeout charged to the stalled node's honest descendants ({})", blamed_relays(r, stalled)),
        );
        // Backups at another ancestor spend hedge credit; a held-only probe of a last ancestor
        // does not (`Read::handle_hedge_due`), and is noted.
        let probes = engine_total(r, |e| e.hedge_probes);
        let hedges = engine_total(r, |e| e.hedge_fired) - probes;
        let fetches = engine_total(r, |e| e.block_source_peer) + engine_total(r, |e| e.peer_failover);
        let allowed = run.spec.cluster.hedge_ratio * fetches as f64 + run.spec.cluster.nodes as f64;
        check.that(
            hedges as f64 <= allowed,
            format!("{hedges} backup requests ≤ hedge_ratio × {fetches} peer fetches + one banked per node"),
        );
        check.note(format!("{probes} held-only probes of a last ancestor"));
        check.note(format!(
            "{timeouts} requests timed out on the stalled node, {opens} circuits opened on it; slowest read {worst:?} vs {base_worst:?}; {} timeouts charged to its honest descendants",
            blamed_relays(r, stalled)
        ));
    })
}

fn stalled_successor() -> Scenario {
    Scenario::new(
        "stalled-successor",
        "the home of a chunk reads alone while the member ranked next, which it asks held-only before the origin, accepts and never answers",
        |seed, scale| {
            let nodes = pick(scale, 12, 60) as usize;
            let size = pick(scale, 2, 64) * MIB;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
            let order = tree_order(&spec.cluster, 0, 0);
            // Alone: in a herd, relay reads at the home fetch the blocks and end its waits.
            spec.workload.safety = vec![ReadSpec::whole(ms(0), order[0], 0)];
            spec.plan = FaultPlan { faults: vec![fault(ms(0), secs(30), FaultKind::Stall { node: order[1] })] };
            spec.phases.safety = secs(60);
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        safety_reads_finish(run, check, &[]);
        let order = tree_order(&run.spec.cluster, 0, 0);
        let base = baseline(run);
        let worst = latencies(r, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let base_worst = latencies(&base, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let asks = engine_total(r, |e| e.successor_asks);
        // Met since a held-only ask waits one hedge delay once connected, charges nothing and
        // remembers the peer slow: before, every block waited the 1.5 s cold head bound until
        // five timeouts opened the circuit (three real nodes: 7.7 s against 0.16 s). The stall
        // may cost one wait: the bound is the stall-free read plus two cold hedge delays (one
        // wait, and as much again for the runs' different draws), not a multiple of the
        // stall-free read, which origin read-ahead made shorter than one wait. Since 2026-12-06
        // a held-only ask waits a probe wait (100 ms cold), and the stall costs 0.08-0.10 s at
        // full scale (0.37 s before: the home's read-ahead waited on the successor).
        let wait = dart_core::engine::hedge::COLD_DELAY;
        check.that(
            worst <= base_worst + 2 * wait,
            format!("the home's read {worst:?} ≤ without the stall {base_worst:?} + 2 × {wait:?}"),
        );
        let opens = circuits_to(r, &member_addr(order[1])).filter(|(_, e)| e.to == CircuitState::Open).count();
        check.note(format!(
            "the home's read {worst:?} vs {base_worst:?} without the stall; {asks} held-only asks of the successor; {opens} circuits opened on it"
        ));
    })
}

fn flapping() -> Scenario {
    Scenario::new(
        "flapping",
        "an interior node is down 4 s, up 1 s, over and over, under steady reads",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let count = pick(scale, 8, 16);
            let size = pick(scale, 512 << 10, 4 * MIB);
            let objects: Vec<ObjectDef> =
                (0..count).map(|i| ObjectDef::plain(size, seed * 100 + i)).collect();
            let block = pick(scale, 64 << 10, MIB);
            let mut spec = everyone_reads(seed, nodes, objects, block, secs(1));
            let mut r = rng::from_seed(seed);
            let sizes = vec![size; count as usize];
            spec.workload.safety = Workload::random_reads(
                &mut r,
                nodes,
                &sizes,
                pick(scale, 400, 1500) as usize,
                secs(38),
            );
            let flapper = tree_order(&spec.cluster, 0, 0)[1];
            spec.plan = FaultPlan {
                faults: (0..8)
                    .map(|k| {
                        fault(
                            ms(500 + k * 5000),
                            secs(4),
                            FaultKind::Crash { node: flapper, keep_cache: true },
                        )
                    })
                    .collect(),
            };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let flapper = tree_order(&run.spec.cluster, 0, 0)[1];
        let addr = member_addr(flapper);
        let opens: Vec<_> =
            circuits_to(r, &addr).filter(|(_, e)| e.to == CircuitState::Open).collect();
        check.that(!opens.is_empty(), "the flapper's circuits open");
        let base = run
            .spec
            .cluster
            .peer
            .as_ref()
            .map_or(secs(5), |_| dart_core::breaker::DEFAULT_COOLDOWN);
        // Whether any probe lands in a down window is chance; what must hold is that every
        // failed recovery check (half-open -> open) backs the cooldown off to at least the base.
        let failed_checks: Vec<_> =
            opens.iter().filter(|(_, e)| e.from == CircuitState::HalfOpen).collect();
        let backed_off = failed_checks
            .iter()
            .all(|(_, e)| e.reopen_at.is_some_and(|u| u.saturating_duration_since(e.at) >= base));
        check.that(backed_off, "every failed recovery check backs the cooldown off past the base");
        check.note(format!("{} failed recovery checks", failed_checks.len()));
        // No lockstep: circuits opened together each draw their own cooldown jitter, so they do
        // not turn half-open together. (Judged on the drawn cooldowns, not on how far apart the
        // re-probes land: three equal-jitter draws fall within 10% of the cooldown about one
        // time in ten, which made the earlier spread check fail by chance.)
        let mut groups: Vec<Vec<Duration>> = Vec::new();
        let mut last_at = None;
        let mut sorted: Vec<_> = opens.iter().map(|(_, e)| (e.at, e.reopen_at)).collect();
        sorted.sort();
        for (at, reopen) in sorted {
            let new_group = last_at
                .is_none_or(|l: dart_core::time::Instant| at.saturating_duration_since(l) > ms(50));
            if new_group {
                groups.push(Vec::new());
            }
            groups
                .last_mut()
                .expect("pushed")
                .extend(reopen.map(|r| r.saturating_duration_since(at)));
            last_at = Some(at);
        }
        let together = groups.iter().filter(|g| g.len() >= 3).collect::<Vec<_>>();
        let lockstep = together.iter().filter(|g| {
            let lo = g.iter().min().expect("non-empty");
            let hi = g.iter().max().expect("non-empty");
            hi.saturating_sub(*lo) < ms(1)
        });
        check.that(
            lockstep.count() == 0,
            "circuits opened together draw cooldowns at least 1 ms apart (their own jitter)",
        );
        check.note(format!(
            "{} opens of the flapper's circuit, {} groups of ≥ 3 opened together",
            opens.len(),
            together.len()
        ));
    })
}

fn expired_credential() -> Scenario {
    Scenario::new(
        "expired-credential",
        "one node's presigned URLs expire mid-read: relays fetching on its behalf are refused by the origin, none is blamed",
        |seed, scale| {
            let nodes = pick(scale, 10, 40) as usize;
            let size = pick(scale, 2, 64) * MIB;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let objects = vec![ObjectDef::plain(size, seed), ObjectDef::plain(size, seed + 1)];
            let mut spec = everyone_reads(seed, nodes, objects, block, ms(5));
            let leaf = *tree_order(&spec.cluster, 0, 0).last().expect("nodes");
            // Object 0: everybody reads it, the leaf with a URL that expires after its probe;
            // object 1: only the leaf reads it, so no valid URL ever fetches its blocks.
            spec.workload.safety.retain(|r| r.object == 0 || r.node == leaf);
            for r in &mut spec.workload.safety {
                if r.node == leaf {
                    r.at = ms(0);
                    r.expires = Some(ms(40));
                } else {
                    r.at += ms(60);
                }
            }
            spec.workload.liveness.retain(|r| r.object == 0);
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let leaf = *tree_order(&run.spec.cluster, 0, 0).last().expect("nodes");
        safety_reads_finish(run, check, &[leaf]);
        let opened: usize = r.nodes.iter().map(|n| n.circuit_events.iter().filter(|e| e.to == CircuitState::Open).count()).sum();
        check.that(opened == 0, format!("no circuit opens for an upstream credential refusal ({opened} did)"));
        let refusals: u64 = r.peer_answers.iter().filter(|((_, k), _)| k.starts_with("UpstreamRefused")).map(|(_, n)| n).sum();
        check.that(refusals > 0, "relays reported the origin's refusal of the requester's credential");
        let alone = r.phase(Phase::Safety).find(|x| x.node == leaf && x.object == 1).map(|x| x.outcome.clone());
        check.that(
            matches!(alone, Some(ReadOutcome::Failed { status: 403, committed: false, .. })),
            format!("the expired reader's own object fails with the origin's 403, before its head ({alone:?})"),
        );
        let shared = r.phase(Phase::Safety).find(|x| x.node == leaf && x.object == 0).map(|x| x.outcome.clone());
        check.note(format!(
            "{refusals} refusals relayed as answers; the expired reader's shared object ended {shared:?} (coalesced with valid URLs), its own {alone:?}; {} origin 403s",
            r.origin.by_status.get(&403).copied().unwrap_or(0)
        ));
    })
}

fn range_blind() -> Scenario {
    Scenario::new(
        "range-blind",
        "the origin ignores Range: every read is proxied, nothing is cached",
        |seed, scale| {
            let nodes = pick(scale, 6, 30) as usize;
            let size = pick(scale, 1, 32) * MIB;
            let object = ObjectDef { range_blind: true, ..ObjectDef::plain(size, seed) };
            let mut spec =
                everyone_reads(seed, nodes, vec![object], pick(scale, 64 << 10, 4 * MIB), ms(50));
            let mut r = rng::from_seed(seed ^ 1);
            spec.workload.safety.extend(Workload::random_reads(
                &mut r,
                nodes,
                &[size],
                20,
                secs(2),
            ));
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        check.that(
            r.reads.iter().all(|x| matches!(x.outcome, ReadOutcome::Passthrough { .. })),
            "every read is a passthrough",
        );
        check.that(r.nodes.iter().all(|n| n.cached_blocks == 0), "nothing is cached anywhere");
        check.that(r.origin.range_requests == 0, "no block fetch reaches the origin");
        check.note(format!(
            "{} probes, {} passthrough requests",
            r.origin.probes, r.origin.passthrough
        ));
    })
}

fn range_blind_midway() -> Scenario {
    Scenario::new(
        "range-blind-midway",
        "the origin starts ignoring Range mid-read: served bytes are never cached, relays that learnt it decline",
        |seed, scale| {
            let nodes = pick(scale, 10, 40) as usize;
            let size = pick(scale, 2, 32) * MIB;
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], pick(scale, 128 << 10, 4 * MIB), ms(300));
            // Half the nodes read before the origin turns Range-blind, half well after it.
            for r in spec.workload.safety.iter_mut().filter(|r| r.node % 2 == 1) {
                r.at += ms(700 + 150 * r.node as u64);
            }
            spec.plan = FaultPlan { faults: vec![fault(ms(400), secs(60), FaultKind::Origin(OriginFault::RangeBlind))] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let complete = r.phase(Phase::Safety).filter(|x| x.outcome.is_complete()).count();
        check.that(complete == r.phase(Phase::Safety).count(), "every read completes (served or proxied)");
        let declined: u64 = r.nodes.iter().map(|n| n.engine.relay_declined).sum();
        let uncacheable: u64 = r.nodes.iter().map(|n| n.engine.uncacheable).sum();
        let passthrough: u64 = r.nodes.iter().map(|n| n.engine.passthrough).sum();
        let size = run.spec.cluster.objects[0].size;
        let late = r.phase(Phase::Safety).filter(|x| x.started.is_some_and(|t| t > dart_core::time::Instant::from_millis(400))).count() as u64;
        let amplification = r.origin.body_bytes as f64 / size as f64;
        // A block fetch that comes back Range-ignored marks the object, like a probe does.
        check.that(
            passthrough >= late,
            format!("every reader starting after the flip proxies ({passthrough} passthroughs for {late} readers)"),
        );
        check.note(format!(
            "{passthrough} passthroughs, {uncacheable} blocks served uncached, {declined} relay requests declined; origin sent {amplification:.1}x the object"
        ));
    })
}

fn lying_peer() -> Scenario {
    Scenario::new(
        "lying-peer",
        "an interior node answers blocks of the wrong length or garbage",
        |seed, scale| {
            let lie = if seed % 2 == 0 { Lie::WrongLength } else { Lie::Garbage };
            liar_spec(seed, scale, lie)
        },
    )
    .expect(|run, check| liar_routed_around(run, check, "WrongLength", "as wrong-length"))
}

/// Everyone reads one object while an interior node (the first below the root of chunk 0's
/// tree) tells `lie` for the first 60 s.
fn liar_spec(seed: u64, scale: Scale, lie: Lie) -> SimSpec {
    let nodes = pick(scale, 12, 50) as usize;
    let size = pick(scale, 2, 64) * MIB;
    let objects = vec![ObjectDef::plain(size, seed)];
    let mut spec = everyone_reads(seed, nodes, objects, pick(scale, 128 << 10, 4 * MIB), ms(5));
    let liar = tree_order(&spec.cluster, 0, 0)[1];
    spec.plan =
        FaultPlan { faults: vec![fault(ms(0), secs(60), FaultKind::Lies { node: liar, lie })] };
    spec
}

/// What a lying interior node's scenario must show: every read finishes, requesters open the
/// liar's circuit on a validation failure (or a failed probe of the open circuit), and some of
/// its answers were refused as `kind`.
fn liar_routed_around(run: &Run<'_>, check: &mut Check, kind: &str, how: &str) {
    let r = run.report;
    safety_reads_finish(run, check, &[]);
    let liar = tree_order(&run.spec.cluster, 0, 0)[1];
    let addr = member_addr(liar);
    let opens: Vec<_> = circuits_to(r, &addr).filter(|(_, e)| e.to == CircuitState::Open).collect();
    check.that(!opens.is_empty(), "requesters open the liar's circuit");
    check.that(
        opens.iter().all(|(_, e)| {
            matches!(
                e.reason,
                TransitionReason::HardFailure(HardReason::Validation)
                    | TransitionReason::ProbeFailed
                    // A neighbour's ping (a roster fetch) to the liar, while half-open.
                    | TransitionReason::RosterFailed
            )
        }),
        "on a validation failure (or a failed probe of the open circuit)",
    );
    let refused = answers_of(r, liar, kind);
    check.that(refused > 0, format!("the liar's answers were refused {how}"));
    check.note(format!(
        "{refused} lying answers refused {how}; {} circuits opened on the liar",
        opens.len()
    ));
}

/// Peer answers from `node` classified as `kind` (an `Observation` name), over every requester.
fn answers_of(r: &RunReport, node: usize, kind: &str) -> u64 {
    r.peer_answers.iter().filter(|((p, k), _)| *p == node && k == kind).map(|(_, n)| n).sum()
}

fn lying_peer_corrupt() -> Scenario {
    Scenario::new(
        "lying-peer-corrupt",
        "an interior node flips bytes in blocks of the right length",
        |seed, scale| liar_spec(seed, scale, Lie::Corrupt),
    )
    // Every block ends with its digest (dart_core::integrity): a flipped byte is refused by the
    // requester before anything is cached or served whole (the checker watches both).
    .expect(|run, check| liar_routed_around(run, check, "ValidationFailed", "for their digest"))
}

/// A reader that lies about the object in the relay requests it sends, to relays that do not
/// know the object (they would otherwise ask their parent under what it named: `Read::set_told`).
fn lying_requester() -> Scenario {
    Scenario::new(
        "lying-requester",
        "a reader names the object wrongly in its relay requests (seed even: its size, odd: its version) to relays that do not know it: they store nothing under the lie, blame no honest peer, and later readers get exact bytes",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let block = pick(scale, 256 << 10, 4 * MIB);
            let size = 6 * block + block / 3;
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(0));
            // Trees over every member: the liar's ancestors are relays that read nothing.
            spec.cluster.peer.get_or_insert_with(PeerConfig::default).reader_tree = None;
            let order = tree_order(&spec.cluster, 0, 0);
            let liar = *order.last().expect("nodes");
            // The liar reads first, cold: the object's tail (its last block is shorter, so a
            // wrong size gives it another length), then the whole object; then honest readers
            // at the bottom, the middle and the top of the same tree (one chunk), through the
            // relays it lied to.
            let honest = [order[order.len() - 2], order[order.len() / 2], order[1]];
            let tail = ReadSpec { range: dart_sim::RangeSpec::Suffix(block / 3), ..ReadSpec::whole(ms(0), liar, 0) };
            let mut reads = vec![tail, ReadSpec::whole(secs(1), liar, 0)];
            for (i, &n) in honest.iter().enumerate() {
                reads.push(ReadSpec::whole(secs(2) + ms(i as u64 * 300), n, 0));
            }
            spec.workload.safety = reads;
            spec.workload.liveness.retain(|r| r.node != liar);
            let lie = if seed % 2 == 0 { Lie::ToldSize } else { Lie::ToldVersion };
            spec.plan = FaultPlan { faults: vec![fault(ms(0), secs(200), FaultKind::Lies { node: liar, lie })] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        safety_reads_finish(run, check, &[]);
        let liar = *tree_order(&run.spec.cluster, 0, 0).last().expect("nodes");
        let honest = |n: &usize| *n != liar;
        let opened: Vec<String> = r
            .nodes
            .iter()
            .enumerate()
            .filter(|(n, _)| honest(n))
            .flat_map(|(n, node)| {
                node.circuit_events
                    .iter()
                    .filter(|e| e.to == CircuitState::Open)
                    .map(move |e| format!("n{n} opened {} ({:?})", e.addr, e.reason))
            })
            .collect();
        check.that(opened.is_empty(), format!("no honest node opens a circuit: {opened:?}"));
        let sum = |f: fn(&dart_core::engine::EngineStats) -> u64| -> u64 {
            r.nodes.iter().enumerate().filter(|(n, _)| honest(n)).map(|(_, n)| f(&n.engine)).sum()
        };
        let (told, unstored, refused) =
            (sum(|e| e.relay_told), sum(|e| e.relay_told_unstored), sum(|e| e.relay_told_refused));
        check.that(
            unstored + refused > 0,
            format!("relays met the lie: {told} relays under a told size, {unstored} blocks not stored, {refused} refusals"),
        );
        let object = run.spec.cluster.objects[0].size;
        let origin = r.origin.body_bytes as f64 / object as f64;
        check.note(format!(
            "{told} relays worked under a told size: {unstored} blocks not stored, {refused} declines or uncharged lengths; origin {origin:.2} x the object"
        ));
    })
}

fn breaker_churn() -> Scenario {
    Scenario::new(
        "breaker-churn",
        "failing peers churn through a breaker whose cap is scaled down: the map stays bounded",
        |seed, scale| {
            let nodes = pick(scale, 24, 96) as usize;
            let count = pick(scale, 16, 64);
            let objects: Vec<ObjectDef> = (0..count).map(|i| ObjectDef::plain(256 << 10, seed * 1000 + i)).collect();
            let mut spec = everyone_reads(seed, nodes, objects, 64 << 10, secs(20));
            let mut peer = PeerConfig::default();
            peer.breaker.tracked_peers_max = pick(scale, 4, 16) as usize;
            spec.cluster.peer = Some(peer);
            let dark = pick(scale, 6, 24) as usize;
            let mut r = rng::from_seed(seed);
            let mut faults = Vec::new();
            for k in 0..dark {
                use rand::Rng as _;
                let node = r.random_range(0..nodes);
                faults.push(fault(ms(k as u64 * 700), secs(8), FaultKind::BlackHole { node }));
            }
            spec.plan = FaultPlan { faults };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let cap = run.spec.cluster.peer.as_ref().map_or(0, |p| p.breaker.tracked_peers_max);
        let evicted: u64 = r.nodes.iter().filter_map(|n| n.breaker.as_ref()).map(|b| b.evicted + b.swept).sum();
        check.that(evicted > 0, format!("entries were swept or evicted at the cap of {cap}"));
        check.note(format!("{evicted} breaker entries swept or evicted at a cap of {cap} (production cap 4096; the logic is the same)"));
    })
}

fn crash_restart() -> Scenario {
    Scenario::new("crash-restart", "two nodes crash mid-read, one keeps its cache, one loses it (the object is declared immutable, so kept blocks may be served)", |seed, scale| {
        let nodes = pick(scale, 10, 40) as usize;
        let size = pick(scale, 4, 64) * MIB;
        let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], pick(scale, 128 << 10, 4 * MIB), ms(5));
        spec.cluster.immutable = true;
        let order = tree_order(&spec.cluster, 0, 0);
        let at = ms(pick(scale, 200, 300));
        spec.plan = FaultPlan {
            faults: vec![
                fault(at, secs(3), FaultKind::Crash { node: order[1], keep_cache: true }),
                fault(at + ms(37), secs(3), FaultKind::Crash { node: order[2], keep_cache: false }),
            ],
        };
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        let order = tree_order(&run.spec.cluster, 0, 0);
        safety_reads_finish(run, check, &[order[1], order[2]]);
        let kept = r.blocks.iter().filter(|b| b.node == order[1] && b.source == BlockSource::Cache).count();
        let lost = r.blocks.iter().filter(|b| b.node == order[2] && b.source == BlockSource::Cache).count();
        check.that(kept > 0, "the node that kept its cache serves from it after the restart");
        check.note(format!("after restart: kept-cache node served {kept} blocks from cache, lost-cache node {lost}"));
    })
}

fn small_caches() -> Scenario {
    Scenario::new(
        "small-caches",
        "caches far smaller than the working set: TinyLFU admission decides what stays",
        |seed, scale| {
            let nodes = pick(scale, 8, 32) as usize;
            let block = pick(scale, 64 << 10, MIB);
            let objects: Vec<ObjectDef> =
                (0..3).map(|i| ObjectDef::plain(32 * block, seed.wrapping_add(i))).collect();
            let mut spec = everyone_reads(seed, nodes, objects, block, ms(5));
            // Less than one object: every cache fills, evicts, and refuses borrowed copies.
            spec.cluster.cache_blocks = 24;
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        safety_reads_finish(run, check, &[]);
        let rejected: u64 = r.nodes.iter().map(|n| n.admit_rejected).sum();
        let evicted: u64 = r.nodes.iter().map(|n| n.evictions).sum();
        check.that(evicted > 0, "caches filled and evicted");
        check.that(rejected > 0, "TinyLFU refused borrowed copies less popular than their victims");
        check.note(format!(
            "{evicted} evictions, {rejected} borrowed admissions refused; origin {} range requests",
            r.origin.range_requests
        ));
    })
}

fn network_blip() -> Scenario {
    Scenario::new("network-blip", "a node's own network drops for 2-14 s mid-read: what origin load does it cause?", |seed, scale| {
        let nodes = pick(scale, 12, 60) as usize;
        let size = pick(scale, 4, 128) * MIB;
        let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], pick(scale, 128 << 10, 4 * MIB), ms(5));
        let node = tree_order(&spec.cluster, 0, 0)[1];
        let lasts = secs(2 + (seed % 4) * 4);
        spec.plan = FaultPlan { faults: vec![fault(ms(pick(scale, 150, 400)), lasts, FaultKind::Isolate { node })] };
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        let base = baseline(run);
        let blocks = run.spec.cluster.geometry.block_count(run.spec.cluster.objects[0].size);
        let extra = r.origin.range_requests.saturating_sub(base.origin.range_requests);
        let node = tree_order(&run.spec.cluster, 0, 0)[1];
        let opened_by_node = r.nodes[node].circuit_events.iter().filter(|e| e.to == CircuitState::Open).count();
        let opened_on_node = circuits_to(r, &member_addr(node)).filter(|(_, e)| e.to == CircuitState::Open).count();
        let guard = if extra * 10 > blocks { "a guard is worth it" } else { "no guard needed at this size" };
        let lasts = run.spec.plan.faults[0].lasts;
        check.note(format!(
            "a {lasts:?} blip cost the origin {extra} extra block requests ({:.0}% of the object's {blocks}); n{node} opened {opened_by_node} circuits, peers opened {opened_on_node} on it: {guard}",
            extra as f64 * 100.0 / blocks as f64
        ));
        check.that(extra <= 3 * blocks, "the extra origin load stays below three object copies");
    })
}

fn origin_errors() -> Scenario {
    Scenario::new("origin-errors", "the origin answers 5xx, truncates bodies and hides totals for a while", |seed, scale| {
        let nodes = pick(scale, 8, 30) as usize;
        let size = pick(scale, 2, 32) * MIB;
        let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed), ObjectDef::plain(size / 2 + 7, seed + 1)], pick(scale, 128 << 10, 4 * MIB), secs(6));
        spec.plan = FaultPlan {
            faults: vec![
                fault(ms(0), secs(2), FaultKind::Origin(OriginFault::Errors { status: 503, percent: 40 })),
                fault(ms(1500), secs(2), FaultKind::Origin(OriginFault::Truncates { percent: 50 })),
                fault(ms(3000), secs(2), FaultKind::Origin(OriginFault::HidesTotal)),
            ],
        };
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        let bad: Vec<_> = r
            .phase(Phase::Safety)
            .filter(|x| !matches!(x.outcome, ReadOutcome::Finished | ReadOutcome::Failed { status: 502, .. }))
            .map(|x| format!("{:?}", x.outcome))
            .collect();
        check.that(bad.is_empty(), format!("reads finish or fail with 502: {bad:?}"));
        let failed = r.phase(Phase::Safety).filter(|x| matches!(x.outcome, ReadOutcome::Failed { .. })).count();
        let opened: usize = r.nodes.iter().map(|n| n.circuit_events.iter().filter(|e| e.to == CircuitState::Open).count()).sum();
        check.note(format!("{failed} safety reads failed during origin faults; {opened} peer circuits opened on relays' origin errors"));
    })
}

/// Median of `xs` (0 for none).
fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs.get(xs.len() / 2).copied().unwrap_or_default()
}

fn deep_ranges() -> Scenario {
    Scenario::new("deep-ranges", "random-access readers read small ranges deep in cold blocks of a slow origin: does a first byte wait for the bytes before it?", |seed, scale| {
        let nodes = pick(scale, 2, 3) as usize;
        let block = pick(scale, 256 << 10, 4 * MIB);
        let blocks = pick(scale, 6, 16);
        let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(blocks * block, seed)], block, ms(0));
        // Every node reads the origin itself (a single node, or a tree's root), over 20 MB/s, 10
        // ms away. The simulated origin sends large answers one after another (its egress is a
        // queue, not links that share), so the nodes take turns (300 ms apart, more than a
        // window and a span take) and the latency is fixed: a read's span, asked first,
        // arrives first, as it would beside the window on a real origin's link.
        spec.cluster = spec.cluster.origin_only();
        spec.cluster.net.origin_link.bandwidth = 20_000_000;
        spec.cluster.net.origin_link.latency = dart_sim::net::Latency::Fixed(ms(10));
        use rand::Rng as _;
        let mut r = rng::from_seed(seed ^ 0xdee9);
        let len = block / 16;
        // Each node reads one range of each block, in turn: somewhere in the block's second
        // half (a Parquet footer, a tensor by offset), every block cold when read.
        let mut reads = Vec::new();
        for n in 0..nodes {
            for b in 0..blocks {
                let first = b * block + block / 2 + r.random_range(0..block / 2 - len);
                let range = dart_sim::RangeSpec::Bounded(first, first + len - 1);
                let at = ms(1000 * b + 300 * n as u64);
                reads.push(ReadSpec { range, ..ReadSpec::whole(at, n, 0) });
            }
        }
        spec.workload.safety = reads;
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        safety_reads_finish(run, check, &[]);
        // Each safety read's first byte, by its place in the workload.
        let firsts = |rep: &RunReport| -> BTreeMap<usize, Duration> {
            rep.phase(Phase::Safety)
                .filter_map(|x| Some((x.index, x.first_byte_at?.saturating_duration_since(x.started?))))
                .collect()
        };
        let mut off = run.spec.clone();
        off.cluster.lead_in = false;
        let without_run = dart_sim::run(off, r.seed);
        let (with, without) = (firsts(r), firsts(&without_run));
        let c = &run.spec.cluster;
        let block = c.geometry.block_bytes();
        let bandwidth = c.net.origin_link.bandwidth;
        // What a read waits for without a lead-in: the window's bytes before its range.
        let mut saved = Vec::new();
        let mut before = Vec::new();
        for (i, w) in &with {
            let (Some(wo), dart_sim::RangeSpec::Bounded(first, _)) = (without.get(i), run.spec.workload.safety[*i].range) else { continue };
            saved.push(wo.saturating_sub(*w));
            before.push(Duration::from_nanos((first % block) * 1_000_000_000 / bandwidth));
        }
        let (saved, before) = (median(saved), median(before));
        let reads = r.phase(Phase::Safety).count() as u64;
        let lead_ins: u64 = r.nodes.iter().map(|n| n.counters.origin_lead_ins).sum();
        // Each node fetches each block's window once; a lead-in adds at most its read's span.
        let size = c.objects[0].size;
        let bound = size * c.nodes as u64 + reads * (block / 16);
        check.that(
            saved * 2 >= before,
            format!("lead-ins save a deep range's first byte at least half the wait for the bytes before it: median {saved:?} saved of {before:?}"),
        );
        check.that(lead_ins == reads, format!("every read led its block's window and asked for its span beside it: {lead_ins} lead-ins for {reads} reads"));
        check.that(
            r.origin.body_bytes <= bound,
            format!("origin bytes {} within the windows and the reads' spans ({bound})", r.origin.body_bytes),
        );
        check.note(format!(
            "{reads} reads of {} KiB in the second half of cold {} KiB blocks at 20 MB/s: first byte median {:?} with lead-ins, {:?} without (median saving {saved:?}, median wait for the bytes before {before:?}); origin bytes {} with, {} without",
            (block / 16) >> 10,
            block >> 10,
            median(with.values().copied().collect()),
            median(without.values().copied().collect()),
            r.origin.body_bytes,
            without_run.origin.body_bytes,
        ));
    })
}

fn chain() -> Scenario {
    Scenario::new("chain", "fanout 1 over slow links: when does the tail see its first byte?", |seed, scale| {
        let nodes = pick(scale, 6, 12) as usize;
        let block = pick(scale, 256 << 10, 4 * MIB);
        let size = 8 * block;
        let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(0));
        spec.cluster.peer = Some(PeerConfig { fanout: 1, ..PeerConfig::default() });
        // Peer links of 20 MB/s make a block take visible time per hop.
        spec.cluster.net.peer_link.bandwidth = 20_000_000;
        spec.cluster.net.node_egress = 20_000_000;
        let tail = *tree_order(&spec.cluster, 0, 0).last().expect("nodes");
        // Every node learns the size first (HEAD), then the tail reads: a warm chain.
        let mut reads: Vec<ReadSpec> = (0..nodes)
            .map(|n| ReadSpec { method: dart_core::engine::Method::Head, ..ReadSpec::whole(ms(0), n, 0) })
            .collect();
        reads.push(ReadSpec::whole(secs(2), tail, 0));
        spec.workload.safety = reads;
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        safety_reads_finish(run, check, &[]);
        let c = &run.spec.cluster;
        let block_time = Duration::from_nanos(c.geometry.block_bytes() * 1_000_000_000 / c.net.peer_link.bandwidth.min(c.net.node_egress));
        let ttfb = |rep: &RunReport| {
            rep.phase(Phase::Safety)
                .filter(|x| x.bytes > 0)
                .find_map(|x| Some(x.first_byte_at?.saturating_duration_since(x.started?)))
                .unwrap_or_default()
        };
        let first = ttfb(r);
        let mut sf = run.spec.clone();
        sf.cluster.cut_through = false;
        let store_forward = ttfb(&dart_sim::run(sf, r.seed));
        let mut cold = run.spec.clone();
        cold.workload.safety.retain(|x| x.method == dart_core::engine::Method::Get);
        let cold_run = dart_sim::run(cold, r.seed);
        let cold_first = ttfb(&cold_run);
        let told: u64 = cold_run.nodes.iter().map(|n| n.engine.relay_told).sum();
        let unstored: u64 = cold_run.nodes.iter().map(|n| n.engine.relay_told_unstored).sum();
        let hops = c.nodes as u32 - 1;
        check.that(
            first <= block_time * 2 + ms(100),
            format!("cut-through: the tail's first byte {first:?} within about one block time ({block_time:?}) plus the origin round trip"),
        );
        check.that(first < store_forward, "cut-through beats store-and-forward");
        // Cold, the tail probes before it asks; every relay above it, the root included, goes
        // on at once under the size the tail told (its parent, the root the origin's window)
        // and probes beside it.
        check.that(
            cold_first <= first + ms(150),
            format!("a cold chain's first byte {cold_first:?} within the warm one {first:?} plus the tail's probe and a margin (150 ms), not a probe per relay"),
        );
        check.that(told >= u64::from(hops), format!("every relay above the tail, the root included, went on under the told size at once: {told} of {hops}"));
        check.that(unstored == 0, format!("every such relay's background probe answered before its block was whole, so it stored the block: {unstored} blocks not stored"));
        check.note(format!(
            "{hops} hops, {block_time:?} per block per hop: first byte {first:?} cut-through, {store_forward:?} store-and-forward; \
             a cold chain (no relay knows the size) {cold_first:?}: relays ask upstream under the size their requester told them while they probe ({told} relay requests so)"
        ));
    })
}

fn partition_heals() -> Scenario {
    Scenario::new("partition-heals", "the cluster splits in two for 10 s; after healing circuits close and reads complete", |seed, scale| {
        let nodes = pick(scale, 10, 40) as usize;
        let size = pick(scale, 1, 16) * MIB;
        let objects: Vec<ObjectDef> = (0..6).map(|i| ObjectDef::plain(size, seed * 10 + i)).collect();
        let mut spec = everyone_reads(seed, nodes, objects, pick(scale, 128 << 10, 4 * MIB), secs(4));
        spec.workload.safety.retain(|r| r.object == 0);
        // Wave 1 right after the heal reads object 0; wave 2, after the longest cooldown, reads
        // objects 1..6, whose blocks cross many trees again and so probe half-open circuits.
        let wave2 = dart_core::breaker::DEFAULT_COOLDOWN_CAP + secs(5);
        for r in &mut spec.workload.liveness {
            if r.object != 0 {
                r.at += wave2;
            }
        }
        spec.phases.liveness = wave2 + secs(60);
        let half = nodes / 2;
        spec.plan = FaultPlan {
            faults: (0..half)
                .flat_map(|a| (half..nodes).map(move |b| (a, b)))
                .map(|(a, b)| fault(ms(300), secs(10), FaultKind::Partition { a, b, one_way: false }))
                .collect(),
        };
        spec
    })
    .expect(|run, check| {
        let r = run.report;
        let settle = r.heal_at + secs(2);
        let late: Vec<_> = r
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.circuit_events.iter().filter(move |e| e.to == CircuitState::Open && e.at > settle).map(move |e| format!("n{i}: {e}")))
            .collect();
        check.that(late.is_empty(), format!("no circuit opens once the partition healed: {late:?}"));
        let open: Vec<_> = r
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.unclosed.iter().filter(|(_, s)| *s == CircuitState::Open).map(move |(a, _)| format!("n{i}->{a}")))
            .collect();
        check.that(open.is_empty(), format!("no circuit is open at the end: {open:?}"));
        let half_open: usize = r.nodes.iter().map(|n| n.unclosed.len()).sum();
        let opened: usize = r.nodes.iter().map(|n| n.circuit_events.iter().filter(|e| e.to == CircuitState::Open).count()).sum();
        let closed: usize = r.nodes.iter().map(|n| n.circuit_events.iter().filter(|e| e.to == CircuitState::Closed && e.at > r.heal_at).count()).sum();
        check.note(format!("{opened} circuits opened, {closed} closed after the heal; {half_open} half-open at the end (never asked again)"));
    })
}

/// Engine counters summed over the cluster.
fn engine_total(report: &RunReport, f: impl Fn(&dart_core::engine::EngineStats) -> u64) -> u64 {
    report.nodes.iter().map(|n| f(&n.engine)).sum()
}

/// Reads of `phase` that finished, by the version their head named.
fn finished_by_version(
    report: &RunReport,
    phase: Phase,
) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for r in report.phase(phase).filter(|r| r.outcome == ReadOutcome::Finished) {
        let v = r.version.map_or("none (416)".to_owned(), |k| format!("v{k}"));
        *out.entry(v).or_default() += 1;
    }
    out
}

/// Liveness reads all finished with the newest version of their object.
fn liveness_on_newest_version(run: &Run<'_>, check: &mut Check) {
    let r = run.report;
    let stale: Vec<String> = r
        .phase(Phase::Liveness)
        .filter(|x| {
            let newest = r.versions[x.object].len() - 1;
            x.outcome != ReadOutcome::Finished || x.version != Some(newest)
        })
        .map(|x| format!("n{} o{} {:?} {:?}", x.node, x.object, x.version, x.outcome))
        .collect();
    check.that(
        stale.is_empty(),
        format!("every liveness read finishes with the newest version; not: {stale:?}"),
    );
}

fn object_changes() -> Scenario {
    Scenario::new(
        "object-changes",
        "the origin replaces the object mid-read (seed even: twice, the second time resized): every response is one version, readers converge on the newest",
        |seed, scale| {
            let nodes = pick(scale, 16, 48) as usize;
            let block = pick(scale, 128 << 10, MIB);
            let size = pick(scale, 4, 64) * MIB;
            let mut spec =
                everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(400));
            // A second wave once the first wave's validators are stale (revalidated after 1 s).
            let mut r = rng::from_seed(seed ^ 0x0B1E_C7ED);
            let wave2 = Workload::everyone_reads_everything(&mut r, nodes, 1, secs(2));
            spec.workload.safety.extend(wave2.into_iter().map(|x| ReadSpec { at: x.at + secs(3), ..x }));
            // Ranges (some HEADs) all along: short ones finish before the change, some span it,
            // some fall past the end of a smaller version.
            let ranged = pick(scale, 32, 120) as usize;
            spec.workload.safety.extend(Workload::random_reads(&mut r, nodes, &[size], ranged, secs(5)));
            spec.cluster.revalidate_after = secs(1);
            let at = ms(pick(scale, 150, 400) + seed % 7 * 20);
            let mut faults = vec![fault(at, secs(1), FaultKind::ReplaceObject { object: 0, size: None })];
            if seed % 2 == 0 {
                // A second version of another size, not a whole number of blocks.
                let resized = size - block / 2 - 1;
                faults.push(fault(at + ms(1700), secs(1), FaultKind::ReplaceObject { object: 0, size: Some(resized) }));
            }
            spec.plan = FaultPlan { faults };
            spec.phases = Phases { safety: secs(12), liveness: secs(60) };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let replaced = run.spec.plan.faults.len();
        check.that(r.versions[0].len() == replaced + 1, format!("the origin served {} versions", r.versions[0].len()));
        // A safety read ends complete (of one version: the simulator checked every byte against
        // the version its head named) or cleanly failed; never anything else.
        let odd: Vec<String> = r
            .phase(Phase::Safety)
            .filter(|x| !matches!(x.outcome, ReadOutcome::Finished | ReadOutcome::Failed { .. }))
            .map(|x| format!("n{} {:?}", x.node, x.outcome))
            .collect();
        check.that(odd.is_empty(), format!("safety reads finish or fail cleanly; not: {odd:?}"));
        liveness_on_newest_version(run, check);
        let changes = engine_total(r, |e| e.object_changes);
        check.that(changes > 0, "nodes saw the object change");
        let failed = |committed: bool| {
            r.phase(Phase::Safety)
                .filter(|x| matches!(x.outcome, ReadOutcome::Failed { committed: c, .. } if c == committed))
                .count()
        };
        check.note(format!(
            "safety reads finished by version {:?}, {} failed before their head, {} truncated; liveness {:?}",
            finished_by_version(r, Phase::Safety),
            failed(false),
            failed(true),
            finished_by_version(r, Phase::Liveness),
        ));
        check.note(format!(
            "{changes} object changes seen, {} peer answers of another version refused, {} revalidations, {} stale served; origin {} probes, {} range requests ({} blocks per version)",
            engine_total(r, |e| e.peer_version_mismatch),
            engine_total(r, |e| e.revalidations),
            engine_total(r, |e| e.stale_served),
            r.origin.probes,
            r.origin.range_requests,
            run.spec.cluster.geometry.block_count(run.spec.cluster.objects[0].size),
        ));
    })
}

fn stale_if_error() -> Scenario {
    Scenario::new(
        "stale-if-error",
        "the origin goes down (seed odd: 503s, even: stalls) while the readers' validators go stale and the object changes: reads complete from cached blocks, then converge on the new version (the origin is public: a presigned URL never seen before cannot be vouched for while the origin is down, so a private object's new readers are refused, as `credentials-in-an-outage` checks)",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let block = pick(scale, 128 << 10, MIB);
            let size = pick(scale, 2, 32) * MIB;
            let mut spec =
                everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(200));
            // Wave 2 reads while the origin is down, long after the validators went stale.
            let mut r = rng::from_seed(seed ^ 0x57a1e);
            let wave2 = Workload::everyone_reads_everything(&mut r, nodes, 1, secs(2));
            spec.workload.safety.extend(wave2.into_iter().map(|x| ReadSpec { at: x.at + secs(4), ..x }));
            spec.cluster.revalidate_after = secs(1);
            spec.cluster.public_origin = true;
            // A stalled origin costs a read one head bound before it goes on stale.
            spec.cluster.bounds.origin_head = secs(3);
            let down = if seed % 2 == 1 {
                OriginFault::Errors { status: 503, percent: 100 }
            } else {
                OriginFault::Stall
            };
            let wave1_end = pick(scale, 3, 10);
            spec.plan = FaultPlan {
                faults: vec![
                    fault(secs(wave1_end), secs(60), FaultKind::Origin(down)),
                    fault(secs(wave1_end) + ms(500), secs(1), FaultKind::ReplaceObject { object: 0, size: None }),
                ],
            };
            for x in spec.workload.safety.iter_mut().skip(nodes) {
                x.at += secs(wave1_end);
            }
            spec.phases = Phases { safety: secs(wave1_end + 10), liveness: secs(60) };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let nodes = run.spec.cluster.nodes;
        let down_at = run.spec.plan.faults[0].at;
        let wave1: Vec<_> = r.phase(Phase::Safety).take(nodes).collect();
        let wave2: Vec<_> = r.phase(Phase::Safety).skip(nodes).collect();
        let late = wave1.iter().filter(|x| x.done_at.is_none_or(|t| t.saturating_duration_since(dart_core::time::Instant::ZERO) > down_at)).count();
        check.that(late == 0, format!("wave 1 finished before the origin went down ({late} did not)"));
        let bad: Vec<String> = wave2
            .iter()
            .filter(|x| x.outcome != ReadOutcome::Finished || x.version != Some(0))
            .map(|x| format!("n{} {:?} {:?}", x.node, x.version, x.outcome))
            .collect();
        check.that(bad.is_empty(), format!("every read while the origin is down finishes with the cached version; not: {bad:?}"));
        let stale = engine_total(r, |e| e.stale_served);
        check.that(stale >= wave2.len() as u64, format!("every read while the origin is down went on stale ({stale} for {})", wave2.len()));
        liveness_on_newest_version(run, check);
        let worst = wave2.iter().filter_map(|x| x.latency()).max().unwrap_or_default();
        check.note(format!(
            "{stale} reads served stale while the origin was down (slowest {worst:?}); {} revalidations, {} object changes seen after the heal; liveness {:?}",
            engine_total(r, |e| e.revalidations),
            engine_total(r, |e| e.object_changes),
            finished_by_version(r, Phase::Liveness),
        ));
    })
}

fn credentials_in_an_outage() -> Scenario {
    Scenario::new(
        "credentials-in-an-outage",
        "a private object (every read vouched for by the origin) is read, then the origin goes down (seed odd: 503s, even: stalls) past the credential TTL: clients re-reading with credentials the origin accepted are served from cache (stale-if-error for credentials), new presigned URLs are refused with 502 and never get a byte",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let block = pick(scale, 128 << 10, MIB);
            let size = pick(scale, 2, 16) * MIB;
            let mut spec =
                everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(200));
            let wave1_end = pick(scale, 3, 10);
            // Wave 1: each client reads with its own credential.
            for (k, x) in spec.workload.safety.iter_mut().enumerate() {
                x.signer = Some(k as u32);
            }
            let wave1 = spec.workload.safety.clone();
            // Wave 2, while the origin is down and long after the TTL: the same clients again.
            let again = wave1.iter().map(|x| ReadSpec { at: x.at + secs(wave1_end + 4), ..*x });
            // Wave 3, at the same time: new presigned URLs nobody vouched for.
            let fresh = wave1
                .iter()
                .map(|x| ReadSpec { at: x.at + secs(wave1_end + 4), signer: None, ..*x });
            spec.workload.safety.extend(again.chain(fresh).collect::<Vec<_>>());
            spec.cluster.credential_ttl = secs(1);
            spec.cluster.revalidate_after = secs(1);
            spec.cluster.bounds.origin_head = secs(3);
            let down = if seed % 2 == 1 {
                OriginFault::Errors { status: 503, percent: 100 }
            } else {
                OriginFault::Stall
            };
            spec.plan = FaultPlan { faults: vec![fault(secs(wave1_end), secs(60), FaultKind::Origin(down))] };
            spec.phases = Phases { safety: secs(wave1_end + 12), liveness: secs(60) };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let nodes = run.spec.cluster.nodes;
        let reads: Vec<_> = r.phase(Phase::Safety).collect();
        let (wave1, rest) = reads.split_at(nodes);
        let (again, fresh) = rest.split_at(nodes);
        let unfinished = wave1.iter().filter(|x| x.outcome != ReadOutcome::Finished).count();
        check.that(unfinished == 0, format!("wave 1 finished ({unfinished} did not)"));
        let bad: Vec<String> = again
            .iter()
            .filter(|x| x.outcome != ReadOutcome::Finished)
            .map(|x| format!("n{} {:?}", x.node, x.outcome))
            .collect();
        check.that(bad.is_empty(), format!("a client the origin accepted keeps reading through the outage; not: {bad:?}"));
        let leaked: Vec<String> = fresh
            .iter()
            .filter(|x| !matches!(&x.outcome, ReadOutcome::Failed { status: 502, committed: false, .. }) || x.bytes > 0)
            .map(|x| format!("n{} {:?} {} bytes", x.node, x.outcome, x.bytes))
            .collect();
        check.that(leaked.is_empty(), format!("a credential nobody vouched for gets 502 and no byte while the origin is down; not: {leaked:?}"));
        liveness_on_newest_version(run, check);
        let stale = engine_total(r, |e| e.stale_served);
        check.note(format!(
            "{} re-reads served through the outage, {} new URLs refused; {stale} reads went on stale validators",
            again.len() - bad.len(),
            fresh.len() - leaked.len(),
        ));
    })
}

/// The Tail-at-Scale set-up (Dean and Barroso): 100 nodes, 1 % of them stalled 5 s at a time
/// (a different node every 5 s), 10,000 reads of random ranges of 40 objects.
pub fn tail_at_scale_spec(seed: u64, scale: Scale) -> SimSpec {
    let nodes = pick(scale, 20, 100) as usize;
    let reads = pick(scale, 600, 10_000) as usize;
    let span = secs(pick(scale, 20, 100));
    let block = pick(scale, 128 << 10, MIB);
    let objects: Vec<ObjectDef> =
        (0..40).map(|i| ObjectDef::plain(8 * block, seed.wrapping_add(i))).collect();
    let sizes: Vec<u64> = objects.iter().map(|o| o.size).collect();
    let mut r = rng::from_seed(seed ^ 0x7a11);
    let safety = Workload::random_reads(&mut r, nodes, &sizes, reads, span);
    let episodes = (span.as_secs() / 5) as usize;
    let faults = (0..episodes)
        .map(|k| {
            use rand::Rng as _;
            let node = r.random_range(0..nodes);
            fault(secs(5 * k as u64), secs(5), FaultKind::Stall { node })
        })
        .collect();
    let mut cluster = ClusterConfig::new(nodes, block, objects);
    // The origin is public here: the table measures peer routing, not credential checks.
    cluster.public_origin = true;
    SimSpec {
        cluster,
        workload: Workload { safety, liveness: Vec::new() },
        plan: FaultPlan { faults },
        phases: Phases { safety: span + secs(40), liveness: secs(10) },
        check: CheckLevel::Touched,
        record_trace: false,
    }
}

/// What one tail-at-scale run measured: read latency quantiles and the extra peer requests.
#[derive(Clone, Debug)]
pub struct TailFigures {
    /// Reads that completed, of all reads.
    pub completed: usize,
    /// All reads.
    pub reads: usize,
    /// p50, p99, p99.9 and max of the completed reads' latency.
    pub p50: Duration,
    /// p99.
    pub p99: Duration,
    /// p99.9.
    pub p999: Duration,
    /// The slowest read.
    pub max: Duration,
    /// Backup requests launched.
    pub hedges: u64,
    /// Blocks that came from a peer.
    pub peer_blocks: u64,
}

/// Measures one run of [`tail_at_scale_spec`].
pub fn tail_figures(r: &RunReport) -> TailFigures {
    let l = latencies(r, Phase::Safety, &[]);
    TailFigures {
        completed: l.len(),
        reads: r.phase(Phase::Safety).count(),
        p50: quantile(&l, 0.5),
        p99: quantile(&l, 0.99),
        p999: quantile(&l, 0.999),
        max: l.last().copied().unwrap_or_default(),
        hedges: engine_total(r, |e| e.hedge_fired),
        peer_blocks: engine_total(r, |e| e.block_source_peer),
    }
}

fn tail_at_scale() -> Scenario {
    Scenario::new(
        "tail-at-scale",
        "100 nodes, 1% of them stalled for 5 s at a time, 10,000 random reads: hedged peer fetches keep the tail short (dart-scenarios tail prints the table with hedging off and on)",
        tail_at_scale_spec,
    )
    .expect(|run, check| {
        let f = tail_figures(run.report);
        let (hedges, peer) = (f.hedges, f.peer_blocks);
        check.that(
            f.completed == f.reads,
            format!("every read completes ({} of {})", f.completed, f.reads),
        );
        let share = hedges as f64 / peer.max(1) as f64;
        check.that(
            share <= run.spec.cluster.hedge_ratio + 0.01,
            format!("hedges stay within the ratio ({hedges} for {peer} peer blocks)"),
        );
        check.note(format!(
            "read latency p50 {:?} p99 {:?} p99.9 {:?} max {:?}; {hedges} hedges for {peer} peer blocks",
            f.p50, f.p99, f.p999, f.max
        ));
    })
}

fn object_changes_restart() -> Scenario {
    Scenario::new(
        "object-changes-restart",
        "a node restarts with its cache while the object changes: the kept blocks, of no version it knows, are never served under the new one",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let block = pick(scale, 128 << 10, MIB);
            let size = pick(scale, 2, 32) * MIB;
            let mut spec =
                everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(200));
            spec.cluster.revalidate_after = secs(1);
            let node = tree_order(&spec.cluster, 0, 0)[1];
            let down = secs(pick(scale, 3, 10));
            spec.plan = FaultPlan {
                faults: vec![
                    fault(down, secs(2), FaultKind::Crash { node, keep_cache: true }),
                    fault(down + secs(1), secs(1), FaultKind::ReplaceObject { object: 0, size: None }),
                ],
            };
            spec.workload.safety.push(ReadSpec::whole(down + secs(3), node, 0));
            spec.phases = Phases { safety: down + secs(10), liveness: secs(60) };
            spec
        },
    )
    // The version oracle checks every byte; a kept block served under the new head fails the run
    // (it did before the node learnt which blocks a warm start kept).
    .expect(|run, check| {
        let r = run.report;
        let node = tree_order(&run.spec.cluster, 0, 0)[1];
        let last = r.phase(Phase::Safety).filter(|x| x.node == node).last();
        check.that(
            last.is_some_and(|x| x.outcome == ReadOutcome::Finished),
            format!("the restarted node's read finishes: {:?}", last.map(|x| &x.outcome)),
        );
        liveness_on_newest_version(run, check);
    })
}

fn swarm() -> Scenario {
    Scenario::new(
        "swarm",
        "each seed draws its own fault mix (every class, corrupted blocks included)",
        |seed, scale| {
            let mut r = rng::from_seed(seed);
            let nodes = 3 + (seed % pick(scale, 10, 40)) as usize;
            let classes: Vec<FaultClass> = FaultClass::ALL.to_vec();
            let space = SwarmSpace { nodes, window: secs(20), classes, faults_max: 6 };
            let plan = FaultPlan::swarm(&mut r, &space);
            let sizes = [pick(scale, 3, 24) * MIB, 200_000];
            let safety = Workload::random_reads(
                &mut r,
                nodes,
                &sizes,
                pick(scale, 40, 200) as usize,
                secs(25),
            );
            let liveness = (0..nodes).map(|n| ReadSpec::whole(ms(n as u64), n, 0)).collect();
            let objects = sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| ObjectDef::plain(s, seed * 7 + i as u64))
                .collect();
            SimSpec {
                cluster: ClusterConfig::new(nodes, pick(scale, 128 << 10, MIB), objects),
                workload: Workload { safety, liveness },
                plan,
                phases: Phases { safety: secs(30), liveness: secs(120) },
                check: CheckLevel::Touched,
                record_trace: false,
            }
        },
    )
}

fn reference() -> Scenario {
    Scenario::new(
        "reference",
        "100 nodes read one 1 GiB object, 60 s simulated, a dead root and a slow parent (the speed benchmark)",
        |seed, scale| {
            let nodes = pick(scale, 10, 100) as usize;
            let size = pick(scale, 16, 1024) * MIB;
            let block = pick(scale, 512 << 10, 4 * MIB);
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(50));
            spec.phases = Phases { safety: secs(45), liveness: secs(15) };
            let order = tree_order(&spec.cluster, 0, 0);
            spec.plan = FaultPlan {
                faults: vec![
                    fault(secs(2), secs(60), FaultKind::BlackHole { node: order[0] }),
                    fault(ms(0), secs(60), FaultKind::Slow { node: order[1], extra_ms: 20, divisor: 4 }),
                ],
            };
            spec
        },
    )
    .expect(|run, check| {
        let order = tree_order(&run.spec.cluster, 0, 0);
        safety_reads_finish(run, check, &[order[0]]);
        note_latency(check, run.report, &[order[0]]);
        check.note(format!("origin served {} bytes for a {} byte object", run.report.origin.body_bytes, run.spec.cluster.objects[0].size));
    })
}

// ---- membership (live discovery) ---------------------------------------------------------------

/// `spec`'s cluster with live membership: every node starts knowing only itself.
fn with_discovery(spec: &mut SimSpec, seeds: SimSeeds, new_id_on_restart: bool) {
    let peer = spec.cluster.peer.get_or_insert_with(PeerConfig::default);
    peer.discovery = Some(SimDiscovery { seeds, timing: Timing::default(), new_id_on_restart });
}

/// When `id` left node `n`'s view after `since` and stayed out until `until`: `Ok(None)` if it
/// was not in the view at `since`, `Err` if it is in it at `until`.
fn left_view(
    r: &RunReport,
    n: usize,
    id: &str,
    since: Duration,
    until: Duration,
) -> Result<Option<Duration>, String> {
    let node = &r.nodes[n];
    let at = |c: &(dart_core::time::Instant, Vec<String>)| Duration::from_nanos(c.0.as_nanos());
    let holds = |ids: &Vec<String>| ids.iter().any(|m| m == id);
    let view_at = |t: Duration| node.view_changes.iter().rev().find(|c| at(c) <= t).map(|c| &c.1);
    if view_at(until).is_some_and(holds) {
        return Err(format!("n{n} still lists {id} at {until:?}"));
    }
    if !view_at(since).is_some_and(holds) {
        return Ok(None);
    }
    let left = node
        .view_changes
        .iter()
        .filter(|c| at(c) > since && at(c) <= until && !holds(&c.1))
        .map(at)
        .next();
    Ok(left)
}

/// Checks that `id`, dead at `died`, left the view of every node but `except` within
/// forget-after plus one interval (+1 s of roster bounds); returns when it left the last.
fn check_departure(
    r: &RunReport,
    check: &mut Check,
    id: &str,
    died: Duration,
    except: &[usize],
) -> Duration {
    let timing = Timing::default();
    let bound = died + timing.forget_after + timing.interval + secs(1);
    let mut latest = Duration::ZERO;
    let mut problems = Vec::new();
    for n in (0..r.nodes.len()).filter(|n| !except.contains(n)) {
        match left_view(r, n, id, died, bound) {
            Ok(Some(t)) => latest = latest.max(t),
            Ok(None) => {}
            Err(e) => problems.push(e),
        }
    }
    check.that(
        problems.is_empty(),
        format!("{id} left every view by {bound:?}: its death at {died:?} + forget-after + one interval (+1 s of roster bounds) ({problems:?})"),
    );
    latest
}

/// Every running node's final view holds exactly the running nodes' ids.
fn views_agree(r: &RunReport, check: &mut Check) {
    let mut want: Vec<String> =
        r.nodes.iter().filter(|n| !n.view_ids().is_empty()).map(|n| n.member_id.clone()).collect();
    want.sort();
    let odd: Vec<String> = r
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (i, n.view_ids()))
        .filter(|(_, ids)| !ids.is_empty() && *ids != want)
        .map(|(i, ids)| format!("n{i}: {ids:?}"))
        .collect();
    check.that(
        odd.is_empty(),
        format!(
            "every running node's view is the {} running nodes ({} differ: {:?})",
            want.len(),
            odd.len(),
            odd.iter().take(3).collect::<Vec<_>>()
        ),
    );
}

/// The first time every node's view held all `nodes` ids.
fn converged_at(r: &RunReport, nodes: usize) -> Option<Duration> {
    r.nodes
        .iter()
        .map(|n| {
            n.view_changes
                .iter()
                .find(|(_, ids)| ids.len() == nodes)
                .map(|c| Duration::from_nanos(c.0.as_nanos()))
        })
        .try_fold(Duration::ZERO, |acc, t| t.map(|t| acc.max(t)))
}

fn discovery_boot() -> Scenario {
    Scenario::new(
        "discovery-boot",
        "a boot storm: every node knows only the next one (a cyclic seed list) and reads at once while views converge",
        |seed, scale| {
            let nodes = pick(scale, 8, 32) as usize;
            let size = pick(scale, 2, 64) * MIB;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(20));
            with_discovery(&mut spec, SimSeeds::Ring, false);
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let nodes = run.spec.cluster.nodes;
        safety_reads_finish(run, check, &[]);
        views_agree(r, check);
        let interval = Timing::default().interval;
        let at = converged_at(r, nodes);
        check.that(
            at.is_some_and(|t| t <= interval * 3),
            format!("every view held all {nodes} members within 3 refresh intervals (at {at:?})"),
        );
        // Quick rounds while views are far from whole, and pings that do not stand in for a
        // round's rosters: 27-76 ms on seeds 1-12 (5-10 s before, two or three intervals).
        check.that(
            at.is_some_and(|t| t <= secs(1)),
            format!("every view held all {nodes} members within 1 s (at {at:?})"),
        );
        let object = run.spec.cluster.objects[0].size;
        // Whole views before most reads reach their trees: 1.00 x on seeds 1-12 at both scales
        // (7.00-9.31 x at full scale before, every partial view electing its own roots).
        let share = r.origin.body_bytes as f64 / object as f64;
        check.that(share <= 1.5, format!("origin {share:.2} x the object ≤ 1.5"));
        check.note(format!(
            "views converged at {at:?}; origin {:.2} x the object while they converged",
            r.origin.body_bytes as f64 / object as f64
        ));
    })
}

/// Every node reads one object (4 MiB / 128 MiB at test / full scale) with discovery by DNS;
/// the first round (t = 0) converges every view, and the reads start one second in.
fn discovery_herd(seed: u64, scale: Scale, full_nodes: u64) -> SimSpec {
    let nodes = pick(scale, 12, full_nodes) as usize;
    let size = pick(scale, 4, 128) * MIB;
    let block = pick(scale, 128 << 10, 4 * MIB);
    let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
    with_discovery(&mut spec, SimSeeds::Dns, false);
    for r in &mut spec.workload.safety {
        r.at += secs(1);
    }
    spec
}

/// The member that roots block 0's tree crashes for good after the reads begin (discovery by
/// DNS, the `dead-root` fault as a death): it must leave every view, and reads go on.
fn member_dies() -> Scenario {
    Scenario::new(
        "member-dies",
        "with discovery on, the tree root dies for good mid-read: it leaves every view within forget-after + one interval",
        |seed, scale| {
            let mut spec = discovery_herd(seed, scale, 60);
            let root = tree_order(&spec.cluster, 0, 0)[0];
            let at = secs(1) + ms(pick(scale, 150, 400) + seed % 100);
            // Dead until the faults heal (80 s): past forget-after plus one interval.
            spec.phases.safety = secs(80);
            spec.plan = FaultPlan { faults: vec![fault(at, secs(79), FaultKind::Crash { node: root, keep_cache: false })] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let root = tree_order(&run.spec.cluster, 0, 0)[0];
        safety_reads_finish(run, check, &[root]);
        views_agree(r, check);
        let died = run.spec.plan.faults[0].at;
        let latest = check_departure(r, check, &format!("n{root}"), died, &[root]);
        check.that(latest > died, "it was in the views when it died");
        let liveness_ok = r.phase(Phase::Liveness).all(|x| x.outcome.is_complete());
        check.that(liveness_ok, "reads after it came back all complete");
        let object = run.spec.cluster.objects[0].size;
        let heal = dart_core::time::Instant::ZERO + run.spec.phases.safety;
        let safety_bytes = r.origin.bytes_timeline.iter().take_while(|(t, _)| *t < heal).last().map_or(0, |s| s.1);
        check.note(format!(
            "the dead root left the last view {:?} after it died; origin {:.2} x the object before it came back (dead-root with discovery on)",
            latest.saturating_sub(died),
            safety_bytes as f64 / object as f64
        ));
    })
}

/// A member is stopped gracefully: it announces its departure to its broadcast targets, which
/// drop it at once; everyone else forgets it as they would a dead member.
fn member_drains() -> Scenario {
    Scenario::new(
        "member-drains",
        "with discovery on, a member is stopped gracefully mid-read: its broadcast targets drop it from their views at once, the others within forget-after + one interval",
        |seed, scale| {
            // Smaller than member-dies at full scale: every member asks every other each round.
            let mut spec = discovery_herd(seed, scale, 30);
            let nodes = spec.cluster.nodes;
            // Not the tree root: a node whose own reads have ended by then.
            let leaver = tree_order(&spec.cluster, 0, 0)[nodes / 2];
            spec.workload.safety.retain(|r| r.node != leaver);
            spec.workload.liveness.retain(|r| r.node != leaver);
            spec.phases.safety = secs(80);
            let at = secs(10) + ms(seed % 100);
            spec.plan = FaultPlan { faults: vec![fault(at, secs(1), FaultKind::Drain { node: leaver })] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let nodes = run.spec.cluster.nodes;
        let leaver = tree_order(&run.spec.cluster, 0, 0)[nodes / 2];
        safety_reads_finish(run, check, &[leaver]);
        let drained = run.spec.plan.faults[0].at;
        let id = format!("n{leaver}");
        let latest = check_departure(r, check, &id, drained, &[leaver]);
        let soon = drained + dart_core::node::LEAVE_BOUND;
        let fast: Vec<usize> = (0..nodes)
            .filter(|&n| n != leaver)
            .filter(|&n| matches!(left_view(r, n, &id, drained, soon), Ok(Some(_))))
            .collect();
        let keep = dart_core::overlay::targets::KEEP_DEFAULT;
        check.that(
            fast.len() >= keep.min(nodes - 1),
            format!("{} members dropped it within the leave bound (at least {keep}, its targets)", fast.len()),
        );
        check.note(format!(
            "{} of {} members dropped the drained member within {:?} of its SIGTERM (its broadcast targets); the last {:?} after",
            fast.len(),
            nodes - 1,
            dart_core::node::LEAVE_BOUND,
            latest.saturating_sub(drained)
        ));
    })
}

/// A member dies and its address comes back under another id (a pod IP reused by another pod).
fn pod_ip_reuse() -> Scenario {
    Scenario::new(
        "pod-ip-reuse",
        "a member dies and a new member takes its address: the dead id leaves every view, the new one joins",
        |seed, scale| {
            let nodes = pick(scale, 8, 24) as usize;
            let size = pick(scale, 2, 32) * MIB;
            let block = pick(scale, 128 << 10, 4 * MIB);
            let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
            with_discovery(&mut spec, SimSeeds::Dns, true);
            for r in &mut spec.workload.safety {
                r.at += secs(1);
            }
            let victim = tree_order(&spec.cluster, 0, 0)[1];
            spec.plan = FaultPlan {
                faults: vec![fault(secs(1) + ms(200 + seed % 100), secs(3), FaultKind::Crash { node: victim, keep_cache: false })],
            };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let victim = tree_order(&run.spec.cluster, 0, 0)[1];
        safety_reads_finish(run, check, &[victim]);
        views_agree(r, check);
        let new_id = r.nodes[victim].member_id.clone();
        check.that(new_id != format!("n{victim}"), format!("the restarted process took a new id ({new_id})"));
        let died = run.spec.plan.faults[0].at;
        let latest = check_departure(r, check, &format!("n{victim}"), died, &[]);
        check.note(format!(
            "the old id at the reused address left the last view {:?} after it died (displaced when the new owner answered there)",
            latest.saturating_sub(died)
        ));
    })
}

/// `readers` of `nodes` members, drawn by the seed, read one object whole at once (the rest
/// read nothing), with the reader tree on (`tick`) or off.
fn some_read_spec(seed: u64, scale: Scale, tick: Option<Duration>) -> SimSpec {
    let nodes = pick(scale, 20, 50) as usize;
    let readers = pick(scale, 5, 10) as usize;
    // Reads that outlast the first renewal (half the 6 s lease) by seconds: the trees move onto
    // the readers only then. 3 GiB reads take about 11-12 s at either scale; the 1 GiB of
    // before took about 4 s once tree roots read ahead at the origin, and non-readers then
    // relayed 1.09-1.50 blocks per reader block (`some-read-tracked`'s bound is 1).
    let size = pick(scale, 768, 3072) * MIB;
    let block = pick(scale, MIB, 4 * MIB);
    let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
    use rand::Rng as _;
    let mut r = rng::from_seed(seed ^ 0x5EAD);
    let mut chosen: Vec<usize> = (0..nodes).collect();
    for i in 0..readers {
        let j = r.random_range(i..nodes);
        chosen.swap(i, j);
    }
    chosen.truncate(readers);
    for phase in [&mut spec.workload.safety, &mut spec.workload.liveness] {
        phase.retain(|read| chosen.contains(&read.node));
    }
    spec.cluster.peer.get_or_insert_with(PeerConfig::default).reader_tree = tick;
    spec
}

/// The nodes that read in `spec`'s safety phase.
fn readers_of(spec: &SimSpec) -> Vec<usize> {
    let mut v: Vec<usize> = spec.workload.safety.iter().map(|r| r.node).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What a run of [`some_read_spec`] measured, as a note: origin, slowest read, and the blocks
/// that nodes which read nothing relayed for the readers.
fn some_read_figures(run: &Run<'_>, check: &mut Check) -> (f64, Duration, u64, u64) {
    let r = run.report;
    let readers = readers_of(run.spec);
    let object = run.spec.cluster.objects[0].size;
    let origin = r.origin.body_bytes as f64 / object as f64;
    let slowest = latencies(r, Phase::Safety, &[]).last().copied().unwrap_or_default();
    let relays = |keep: &dyn Fn(usize) -> bool| -> u64 {
        r.nodes
            .iter()
            .enumerate()
            .filter(|(n, _)| keep(*n))
            .map(|(_, n)| n.engine.relay_served)
            .sum()
    };
    let by_others = relays(&|n| !readers.contains(&n));
    let by_readers = relays(&|n| readers.contains(&n));
    check.note(format!(
        "{} of {} members read: origin {origin:.2} x the object, slowest read {slowest:?}, blocks relayed by non-readers {by_others}, by readers {by_readers}",
        readers.len(),
        run.spec.cluster.nodes
    ));
    (origin, slowest, by_others, by_readers)
}

/// A fifth of the members read one object cold, the tree laid over every member: the baseline
/// of `some-read-tracked`.
fn some_read() -> Scenario {
    Scenario::new(
        "some-read",
        "a fifth of the members read one object at once; its trees span every member (the reader tree off)",
        |seed, scale| some_read_spec(seed, scale, None),
    )
    .expect(|run, check| {
        safety_reads_finish(run, check, &[]);
        let (origin, ..) = some_read_figures(run, check);
        check.that(origin <= 1.25, format!("origin {origin:.2} x the object (at most 1.25)"));
    })
}

/// `some-read`'s cluster (a fifth of the members read, and the trees span every member), whose
/// first chunk's root vanishes while the reads are under way: the root's children are mostly
/// members that read nothing, relays with no read of their own that could probe the root.
fn dead_root_some_read() -> Scenario {
    Scenario::new(
        "dead-root-some-read",
        "a fifth of the members read; the first chunk's root vanishes mid-read, its children mostly pure relays",
        |seed, scale| {
            let mut spec = some_read_spec(seed, scale, None);
            let root = tree_order(&spec.cluster, 0, 0)[0];
            let at = ms(pick(scale, 150, 400) + seed % 100);
            spec.plan = FaultPlan { faults: vec![fault(at, secs(60), FaultKind::BlackHole { node: root })] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let root = tree_order(&run.spec.cluster, 0, 0)[0];
        safety_reads_finish(run, check, &[root]);
        let base = baseline(run);
        let worst = latencies(r, Phase::Safety, &[root]).last().copied().unwrap_or_default();
        let base_worst = latencies(&base, Phase::Safety, &[]).last().copied().unwrap_or_default();
        let object = run.spec.cluster.objects[0].size;
        let origin = r.origin.body_bytes as f64 / object as f64;
        check.that(origin <= 1.25, format!("origin {origin:.2} x the object (at most 1.25)"));
        // 0.99-1.12 x over 30 seeds at full scale, 1.03-1.16 x at test scale: these 3 GiB reads
        // take about 12 s, and what the dead root costs (up to 1.5 s at full scale, 1.7 s at
        // test scale, a stall in each tree it was in: docs/simulation.md, "Findings about the
        // core") is a small part of that.
        check.that(
            worst.as_secs_f64() <= 1.25 * base_worst.as_secs_f64(),
            format!("slowest read {worst:?} ≤ 1.25 × the fault-free {base_worst:?}"),
        );
        let blamed = blamed_relays(r, root);
        // Hard again since a relay that joins a peer fetch begun for another read keeps its own
        // progress bound on it (`Reader::progress`): with the fetch's longer bound, the abort
        // could reach its requester just after the requester's bound fired (seeds 141476409 and
        // 141476503 at full scale, about 1 in 100 seeds of these 3 GiB reads, were recorded as
        // a known gap until then).
        check.that(blamed == 0, format!("{blamed} timeouts charged to honest relays = 0"));
        check.note(format!(
            "slowest read {worst:?} vs {base_worst:?} without the fault ({:.2} x); origin {origin:.2} x; \
             {blamed} timeouts charged to honest relays; {} relay streams resumed",
            worst.as_secs_f64() / base_worst.as_secs_f64().max(1e-9),
            engine_total(r, |e| e.streams_resumed),
        ));
    })
}

/// The same with the reader tree on: after the trackers' first tick the trees span the readers,
/// so nodes that read nothing stop relaying (the first tick routes over every member: the
/// first JOINs see a set that names only the first joiner).
fn some_read_tracked() -> Scenario {
    Scenario::new(
        "some-read-tracked",
        "a fifth of the members read one object at once with the reader tree on: the trees move onto the readers",
        |seed, scale| some_read_spec(seed, scale, Some(Duration::ZERO)),
    )
    .expect(|run, check| {
        safety_reads_finish(run, check, &[]);
        let (origin, _, by_others, _) = some_read_figures(run, check);
        check.that(origin <= 1.25, format!("origin {origin:.2} x the object (at most 1.25)"));
        // Over every member each reader's blocks pass about two non-readers (1.95 per reader
        // block at full scale, seed 1); over the readers none do after the first renewal.
        let readers = readers_of(run.spec);
        let blocks = run.spec.cluster.objects[0].size / run.spec.cluster.geometry.block_bytes();
        let per_block = by_others as f64 / (readers.len() as u64 * blocks) as f64;
        check.that(
            per_block < 1.0,
            format!("non-readers relayed {per_block:.2} blocks per reader block (below 1)"),
        );
        let joined: u64 = readers.iter().map(|&n| run.report.nodes[n].counters.tracker_joins).sum();
        let failed: u64 =
            run.report.nodes.iter().map(|n| n.counters.tracker_join_failed).sum();
        check.that(
            joined >= 2 * readers.len() as u64 && failed == 0,
            format!("every reader joined and renewed ({joined} JOINs), none failed ({failed})"),
        );
    })
}
/// Half the readers read the object, and the other half read it again after the first half's
/// leases have lapsed: the trees of the second half span other readers than the first's, so
/// the bytes must still be found among the members instead of at the origin.
fn some_read_staggered() -> Scenario {
    Scenario::new(
        "some-read-staggered",
        "with the reader tree on, half the readers read an object and the other half read it 20 s later: the origin still pays about once",
        |seed, scale| {
            let mut spec = some_read_spec(seed, scale, Some(Duration::ZERO));
            let readers = readers_of(&spec);
            let late = &readers[readers.len() / 2..];
            for read in &mut spec.workload.safety {
                if late.contains(&read.node) {
                    read.at += secs(20);
                }
            }
            spec
        },
    )
    .expect(|run, check| {
        safety_reads_finish(run, check, &[]);
        let (origin, ..) = some_read_figures(run, check);
        check.that(origin <= 1.25, format!("origin {origin:.2} x the object (at most 1.25)"));
    })
}

/// A third of the members read an object (one chunk; the blocks spread over the cluster), its
/// home dies, the next-ranked member restarts with an empty cache, then it and another third read
/// the object: the new home holds nothing, and asks a neighbour for each block before the origin.
fn dead_home_late_readers_spec(seed: u64, scale: Scale) -> (SimSpec, usize) {
    let nodes = pick(scale, 12, 40) as usize;
    let size = pick(scale, 4, 64) * MIB;
    let block = pick(scale, 128 << 10, MIB);
    let mut spec = everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(5));
    let order = tree_order(&spec.cluster, 0, 0);
    let (home, successor) = (order[0], order[1]);
    // A third of the others read first; the successor and another third 20 s later. The
    // successor restarts with an empty cache in between: when it reads, it is the new home and
    // holds nothing, so without neighbours it reads the whole object from the origin again.
    use rand::seq::SliceRandom as _;
    let mut others: Vec<usize> = (0..nodes).filter(|n| *n != home && *n != successor).collect();
    others.shuffle(&mut rng::from_seed(seed ^ 0x4E16));
    let third = nodes / 3;
    let early = &others[..third];
    let late: Vec<usize> =
        others[third..2 * third].iter().copied().chain(std::iter::once(successor)).collect();
    spec.workload.liveness.clear();
    spec.workload.safety.retain(|read| early.contains(&read.node) || late.contains(&read.node));
    for read in &mut spec.workload.safety {
        if late.contains(&read.node) {
            read.at += secs(20);
        }
    }
    spec.plan = FaultPlan {
        faults: vec![
            fault(secs(10), secs(60), FaultKind::BlackHole { node: home }),
            fault(secs(12), secs(2), FaultKind::Crash { node: successor, keep_cache: false }),
        ],
    };
    (spec, home)
}

fn dead_home_late_readers() -> Scenario {
    Scenario::new(
        "dead-home-late-readers",
        "a third of the members read an object, its home dies, the next-ranked member restarts empty and reads it with another third: the new home asks a neighbour for each block before the origin",
        |seed, scale| dead_home_late_readers_spec(seed, scale).0,
    )
    .expect(|run, check| {
        let r = run.report;
        let home = tree_order(&run.spec.cluster, 0, 0)[0];
        safety_reads_finish(run, check, &[home]);
        let object = run.spec.cluster.objects[0].size as f64;
        let origin = r.origin.body_bytes as f64 / object;
        // The same run with the neighbours off, side by side.
        let mut off = run.spec.clone();
        off.cluster.peer.get_or_insert_with(PeerConfig::default).neighbours = None;
        let off = dart_sim::run(off, r.seed);
        let origin_off = off.origin.body_bytes as f64 / object;
        let (asks, held) =
            (engine_total(r, |e| e.neighbour_asks), engine_total(r, |e| e.neighbour_hits));
        check.that(
            origin <= origin_off,
            format!("origin {origin:.2} x the object with neighbours ≤ {origin_off:.2} without"),
        );
        check.that(origin <= 2.0, format!("origin {origin:.2} x the object ≤ 2 (once per wave)"));
        check.note(format!(
            "origin {origin:.2} x the object with neighbours, {origin_off:.2} without; {asks} blocks \
             asked of a neighbour before the origin, {held} held"
        ));
    })
}

fn store_rots() -> Scenario {
    Scenario::new(
        "store-rots",
        "an object's home reads it, then one byte of every block in its store changes in place; the home and every other member read it again later (the others through the home): the home drops each rotten block and reads it afresh, and neither a client nor a peer ever receives one",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let size = pick(scale, 4, 64) * MIB;
            let block = pick(scale, 128 << 10, MIB);
            let objects = vec![ObjectDef::plain(size, seed)];
            let mut spec = everyone_reads(seed, nodes, objects, block, ms(5));
            let home = tree_order(&spec.cluster, 0, 0)[0];
            // The home reads first; everyone else, and the home once more, 20 s later (whole
            // reads: a range read inside a block is not checked against its digest).
            spec.workload.liveness.clear();
            let mut again = Vec::new();
            for read in &mut spec.workload.safety {
                if read.node == home {
                    let mut later = *read;
                    later.at += secs(20);
                    again.push(later);
                } else {
                    read.at += secs(20);
                }
            }
            spec.workload.safety.extend(again);
            spec.plan =
                FaultPlan { faults: vec![fault(secs(10), secs(1), FaultKind::Rot { node: home })] };
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let home = tree_order(&run.spec.cluster, 0, 0)[0];
        safety_reads_finish(run, check, &[]);
        let dropped = r.nodes[home].counters.rotten_blocks_dropped;
        let blocks = run.spec.cluster.objects[0].size.div_ceil(run.spec.cluster.geometry.block_bytes());
        check.that(dropped > 0, format!("the home dropped {dropped} rotten blocks (> 0)"));
        check.that(dropped <= blocks, format!("{dropped} rotten blocks dropped ≤ {blocks}, once each"));
        let refused = answers_of(r, home, "ValidationFailed");
        check.that(refused == 0, format!("{refused} of the home's blocks refused for their digest = 0: no peer got a rotten one"));
        let origin = r.origin.body_bytes as f64 / run.spec.cluster.objects[0].size as f64;
        check.that(origin <= 2.1, format!("origin {origin:.2} x the object ≤ 2.1 (once, then once more after the rot)"));
        check.note(format!(
            "{dropped} of {blocks} blocks found rotten at the home and read afresh; origin {origin:.2} x the object; {refused} rotten blocks reached a peer"
        ));
    })
}

/// What every registry-mode run must show: no whole blob read failed its digest (a false
/// mismatch would fail a good pull), and every whole read that finished was checked.
fn registry_digests(run: &Run<'_>, check: &mut Check) {
    let r = run.report;
    let mismatches: u64 = r.nodes.iter().map(|n| n.counters.blob_digest_mismatches).sum();
    let verified: u64 = r.nodes.iter().map(|n| n.counters.blob_digests_verified).sum();
    let finished = r
        .reads
        .iter()
        .filter(|read| read.outcome == ReadOutcome::Finished && read.attempts == 1)
        .count() as u64;
    check.that(mismatches == 0, format!("{mismatches} whole blob reads failed their digest = 0"));
    check.that(
        verified >= finished,
        format!(
            "{verified} digests verified >= {finished} whole reads finished at the first attempt"
        ),
    );
    check.note(format!("{verified} whole blob reads verified against their digest"));
}

fn registry_herd() -> Scenario {
    Scenario::new(
        "registry-herd",
        "every node pulls one blob through the registry mirror at once: digest-checked, origin paid once",
        |seed, scale| {
            // Every whole read hashes its blob (about 1 GB/s of real CPU): sizes stay small.
            let nodes = pick(scale, 12, 50) as usize;
            let size = pick(scale, 2, 16) * MIB;
            let block = pick(scale, 128 << 10, MIB);
            let mut spec =
                everyone_reads(seed, nodes, vec![ObjectDef::plain(size, seed)], block, ms(20));
            spec.cluster = spec.cluster.registry();
            spec
        },
    )
    .expect(|run, check| {
        let r = run.report;
        let size = run.spec.cluster.objects[0].size;
        safety_reads_finish(run, check, &[]);
        registry_digests(run, check);
        let share = r.origin.body_bytes as f64 / size as f64;
        check.that(share <= 1.05, format!("origin bytes {share:.2} × the blob ≤ 1.05"));
    })
}

fn registry_dead_root() -> Scenario {
    Scenario::new(
        "registry-dead-root",
        "a blob pull through the registry mirror whose tree root dies mid-read: failovers, no false digest mismatch",
        |seed, scale| {
            let nodes = pick(scale, 12, 40) as usize;
            let size = pick(scale, 4, 16) * MIB;
            let block = pick(scale, 128 << 10, MIB);
            let objects = vec![ObjectDef::plain(size, seed)];
            let mut spec = everyone_reads(seed, nodes, objects, block, ms(5));
            spec.cluster = spec.cluster.registry();
            let root = tree_order(&spec.cluster, 0, 0)[0];
            let at = ms(pick(scale, 150, 400) + seed % 100);
            spec.plan =
                FaultPlan { faults: vec![fault(at, secs(60), FaultKind::BlackHole { node: root })] };
            spec
        },
    )
    .expect(|run, check| {
        let root = tree_order(&run.spec.cluster, 0, 0)[0];
        safety_reads_finish(run, check, &[root]);
        registry_digests(run, check);
    })
}
