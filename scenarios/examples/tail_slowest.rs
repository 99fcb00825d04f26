//! Diagnostic, not a test: runs one `tail-at-scale` seed at full scale with the trace kept and
//! prints its slowest reads, each with the trace lines of its node (and of the nodes named in
//! `$EXTRA`, comma-separated, e.g. `EXTRA=n95,n46`) while it ran, then the stall plan.
//!
//!     cargo run --release -p dart-scenarios --example tail_slowest -- <seed> <hedge ratio> <reads> [<skip>]
//!
//! With `<skip>`, the reads after the `<skip>` slowest (`100` for those about the p99 of 10,000).
//!
//! The trace keeps its first 2,000,000 lines: reads late in the run may show none.

use dart_scenarios::{catalogue, Scale};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seed: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let ratio: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(0.05);
    let top: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3);
    let skip: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0);
    let extra: Vec<String> = std::env::var("EXTRA")
        .unwrap_or_default()
        .split(',')
        .filter(|e| !e.is_empty())
        .map(|e| format!(" {e} "))
        .collect();
    let scenario = catalogue::find("tail-at-scale").expect("the tail-at-scale scenario");
    let mut spec = catalogue::tail_at_scale_spec(seed, Scale::Full);
    spec.cluster.hedge_ratio = ratio;
    spec.record_trace = true;
    let plan: Vec<String> = spec.plan.faults.iter().map(|f| format!("{f:?}")).collect();
    println!("seed {seed}, hedge ratio {ratio}");
    let outcome = scenario.run_spec(spec, seed, Scale::Full);
    let report = outcome.report.as_ref().expect("the run panicked");
    let mut reads: Vec<_> = report
        .reads
        .iter()
        .filter_map(|x| Some((x.done_at?.as_nanos() - x.started?.as_nanos(), x)))
        .collect();
    reads.sort_by_key(|(latency, _)| std::cmp::Reverse(*latency));
    let trace = report.trace.as_ref().expect("a kept trace");
    for (latency, x) in reads.iter().skip(skip).take(top) {
        let (start, end) = (x.started.expect("started"), x.done_at.expect("done"));
        let (start, end) = (start.as_nanos(), end.as_nanos());
        println!(
            "=== read r{} n{} o{} at {:.3} s took {:.3} s",
            x.index,
            x.node,
            x.object,
            start as f64 / 1e9,
            *latency as f64 / 1e9
        );
        let own = format!(" n{} ", x.node);
        for line in trace {
            let t: u64 = line.split_whitespace().next().and_then(|t| t.parse().ok()).unwrap_or(0);
            let shown = line.contains(&own) || extra.iter().any(|e| line.contains(e.as_str()));
            if (start..=end).contains(&t) && shown {
                println!("{line}");
            }
        }
    }
    println!("stalls:\n{}", plan.join("\n"));
}
