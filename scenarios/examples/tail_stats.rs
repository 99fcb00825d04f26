//! Diagnostic, not a test: runs one `tail-at-scale` seed at full scale and prints the engine
//! statistics summed over its nodes (block sources, relays, told relays), for comparing two
//! builds side by side.
//!
//!     cargo run --release -p dart-scenarios --example tail_stats -- <seed>

use dart_scenarios::{catalogue, Scale};

fn main() {
    let seed: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let scenario = catalogue::find("tail-at-scale").expect("the tail-at-scale scenario");
    let spec = catalogue::tail_at_scale_spec(seed, Scale::Full);
    let outcome = scenario.run_spec(spec, seed, Scale::Full);
    let report = outcome.report.as_ref().expect("the run panicked");
    let sum = |f: fn(&dart_core::engine::EngineStats) -> u64| -> u64 {
        report.nodes.iter().map(|n| f(&n.engine)).sum()
    };
    println!("seed {seed}");
    println!("block_source_cache   {}", sum(|s| s.block_source_cache));
    println!("block_source_peer    {}", sum(|s| s.block_source_peer));
    println!("block_source_origin  {}", sum(|s| s.block_source_origin));
    println!("relay_served         {}", sum(|s| s.relay_served));
    println!("relay_declined       {}", sum(|s| s.relay_declined));
    println!("relay_told           {}", sum(|s| s.relay_told));
    println!("relay_told_unstored  {}", sum(|s| s.relay_told_unstored));
    println!("relay_told_refused   {}", sum(|s| s.relay_told_refused));
    println!("probes               {}", sum(|s| s.probes));
    println!("origin_bytes         {}", sum(|s| s.origin_bytes));
}
