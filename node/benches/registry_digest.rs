//! What the registry mirror's digest check costs: warm reads of one cached blob through a node
//! with `--registry`, a whole `GET` (checked against the digest as it is served) beside a
//! `Range: bytes=0-` read of the same bytes (a range is never checked), alternated in one run.
//! Prints each side's median time and MB/s and the ratio.
//!
//! Run: `cargo bench -p dart-node --bench registry_digest` (docs/registry-mirror.md).
//! Environment: `DART_BENCH_MIB` (blob size, default 256), `DART_BENCH_ROUNDS` (default 15).

use bytes::Bytes;
use dart_core::registry::sha256_digest;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_net_tokio::server::ServeOptions;
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::{Duration, Instant};

type C = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Reads `url` to its end; returns the time and the byte count.
async fn read(client: &C, url: &str, range: Option<&str>) -> (Duration, u64) {
    let mut req = http::Request::get(url);
    if let Some(r) = range {
        req = req.header("range", r);
    }
    let started = Instant::now();
    let resp = client.request(req.body(Empty::new()).expect("request")).await.expect("response");
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    let mut body = resp.into_body();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("a whole body").into_data() {
            n += data.len() as u64;
        }
    }
    (started.elapsed(), n)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mib: u64 = env_or("DART_BENCH_MIB", 256);
    let rounds: usize = env_or("DART_BENCH_ROUNDS", 15);
    let size = mib << 20;
    let seed = 0x5EED;
    let digest = sha256_digest(&generate(seed, 0, size as usize));

    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let registry = l.local_addr().expect("addr");
    let object = OriginObject { seed, size, behaviour: Behaviour::Honours };
    let stats = Arc::new(OriginStats::default());
    tokio::spawn(serve_origin(l, object, stats, std::future::pending(), ServeOptions::default()));

    let dir = std::env::temp_dir().join(format!("dart-bench-registry-{}", std::process::id()));
    let flags = NodeFlags {
        registry: format!("http://{registry}"),
        allow_upstream: vec!["127.0.0.0/8".into()],
        public_upstream: vec!["127.0.0.0/8".into()],
        listen: "127.0.0.1:0".into(),
        admin: String::new(),
        cache_dir: dir.clone(),
        cache_size: size * 2,
        mem_size: size * 2,
        ..NodeFlags::default()
    };
    let node = dart_node::start(&flags).await.expect("node starts");
    let url = format!("http://{}/v2/bench/blob/blobs/{digest}", node.client_addr);
    let client: C = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)));

    // Warm the cache (and check the digest once, cold).
    let (cold, n) = read(&client, &url, None).await;
    assert_eq!(n, size);
    let (mut checked, mut unchecked) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        checked.push(read(&client, &url, None).await.0);
        unchecked.push(read(&client, &url, Some("bytes=0-")).await.0);
    }
    let (c, u) = (median(checked), median(unchecked));
    let mbs = |d: Duration| size as f64 / d.as_secs_f64() / 1e6;
    println!("registry blob of {mib} MiB, warm (RAM tier), {rounds} rounds alternated; cold read {cold:.2?}");
    println!("  whole GET, digest checked : median {c:>9.2?}  {:>8.0} MB/s", mbs(c));
    println!("  Range bytes=0-, unchecked : median {u:>9.2?}  {:>8.0} MB/s", mbs(u));
    println!("  checked / unchecked time  : {:.2}", c.as_secs_f64() / u.as_secs_f64());
    let started = Instant::now();
    let _ = sha256_digest(&generate(seed, 0, 64 << 20));
    let hash = started.elapsed();
    // generate() is in the timing: this is an upper bound of sha256 alone.
    println!("  (sha256 + generation of 64 MiB on this machine: {hash:.2?})");
    let _ = std::fs::remove_dir_all(dir);
}
