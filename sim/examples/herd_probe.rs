//! A herd against one solo read on the same simulated cluster under the same seed: every node
//! reads one object at once, and one node reads it alone; prints both and their ratio.
//!
//! ```text
//! cargo run --release -p dart-sim --example herd_probe -- NODES SIZE_MIB BLOCK_KIB
//! ```
//!
//! The network is the data-centre default unless `BW` (bytes per second of every NIC, nodes
//! and origin, both ways) and `LAT_US` (one-way latency) describe another; `FANOUT`,
//! `CHUNK_BLOCKS` (blocks per chunk: one distribution tree per chunk), `READ_AHEAD` and
//! `SOLO_NODE` (default: the last node) change the cluster. `docs/benchmarks.md` compares its
//! figures with the real-process herd (`bench/herd-netns.sh`).
use dart_sim::origin::ObjectDef;
use dart_sim::*;
use std::time::Duration;

fn spec(nodes: usize, size: u64, block: u64, readers: &[usize]) -> SimSpec {
    let mut cluster = ClusterConfig::new(nodes, block, vec![ObjectDef::plain(size, 7)]);
    cluster.public_origin = true;
    if let Ok(v) = std::env::var("FANOUT") {
        cluster.peer.as_mut().unwrap().fanout = v.parse().unwrap();
    }
    if let Ok(v) = std::env::var("BW") {
        // Every NIC (nodes and origin) at this many bytes per second, latency LAT_US.
        let bw: u64 = v.parse().unwrap();
        let lat: u64 = std::env::var("LAT_US").map_or(200, |v| v.parse().unwrap());
        let latency = dart_sim::net::Latency::Fixed(Duration::from_micros(lat));
        cluster.net.peer_link = dart_sim::net::LinkSpec { latency, bandwidth: bw, loss: 0.0 };
        cluster.net.origin_link = dart_sim::net::LinkSpec { latency, bandwidth: bw, loss: 0.0 };
        cluster.net.node_egress = bw;
        cluster.net.origin_egress = bw;
    }
    if let Ok(v) = std::env::var("READ_AHEAD") {
        cluster.read_ahead = v.parse().unwrap();
    }
    if let Ok(v) = std::env::var("CHUNK_BLOCKS") {
        let c: u64 = v.parse().unwrap();
        cluster.geometry = dart_core::geometry::Geometry::new(block * c, block).unwrap();
    }
    let safety = readers.iter().map(|&n| ReadSpec::whole(Duration::ZERO, n, 0)).collect();
    SimSpec {
        cluster,
        workload: Workload { safety, liveness: vec![] },
        plan: FaultPlan::none(),
        phases: Phases { safety: Duration::from_secs(120), liveness: Duration::from_secs(1) },
        check: CheckLevel::Sampled { every: 1000 },
        record_trace: false,
    }
}

fn times(r: &RunReport) -> Vec<f64> {
    let mut t: Vec<f64> = r
        .reads
        .iter()
        .filter_map(|x| Some(x.done_at?.saturating_duration_since(x.started?).as_secs_f64()))
        .collect();
    t.sort_by(f64::total_cmp);
    t
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (nodes, mib, block_kib) = (args[0] as usize, args[1], args[2]);
    let size = mib << 20;
    let block = block_kib << 10;
    let solo_node = std::env::var("SOLO_NODE").map_or(nodes - 1, |v| v.parse().unwrap());
    let solo = run(spec(nodes, size, block, &[solo_node]), 1);
    let all: Vec<usize> = (0..nodes).collect();
    let herd = run(spec(nodes, size, block, &all), 1);
    let s = times(&solo);
    let h = times(&herd);
    println!(
        "solo {:.3}s  herd n={} p50 {:.3}s p99 {:.3}s max {:.3}s  ratio p99/solo {:.2}  origin {:.2}x",
        s[0],
        h.len(),
        h[h.len() / 2],
        h[(h.len() * 99) / 100],
        h[h.len() - 1],
        h[(h.len() * 99) / 100] / s[0],
        herd.origin.body_bytes as f64 / size as f64
    );
}
