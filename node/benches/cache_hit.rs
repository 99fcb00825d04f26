//! Cache-hit throughput of a `dart` node on loopback, beside the origin it caches and an
//! in-memory HTTP server (the ceiling of this machine's loopback + hyper stack).
//!
//! Run: `cargo bench -p dart-node --bench cache_hit` (see docs/benchmarks.md). Environment:
//! `DART_BENCH_SEED` (offsets; printed), `DART_BENCH_REQUESTS` (per cell, default 200),
//! `DART_BENCH_BLOCK` (the node's block size, default 4MiB).

use bytes::Bytes;
use dart_core::hash::fmix64;
use dart_net_tokio::body;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_net_tokio::server::{serve, ServeOptions};
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEFAULT_SEED: u64 = 0xCAC4_E41D;
const DEFAULT_REQUESTS: usize = 200;
const MIB: u64 = 1 << 20;
const OBJECT_SIZE: u64 = 64 * MIB;
const OBJECT_SEED: u64 = 0xB3_4C;
const DEFAULT_BLOCK_SIZE: u64 = 4 * MIB;
const RANGES: [(&str, u64); 2] = [("1 MiB", MIB), ("64 KiB", 64 * 1024)];
const CLIENTS: [usize; 2] = [1, 4];

type C = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

/// Something to read ranges from: a base URL and a name for the table.
struct Target {
    name: &'static str,
    url: String,
}

/// One measured cell: `requests` reads of `len` bytes by `clients` keep-alive clients.
struct Cell {
    seconds: f64,
    bytes: u64,
    latencies: Vec<Duration>,
}

impl Cell {
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e6
    }

    fn percentile(&self, p: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        let rank = ((p / 100.0) * l.len() as f64).ceil() as usize;
        l[rank.clamp(1, l.len()) - 1]
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The `i`-th random offset of a cell: a pure function of the seed, so every target reads the
/// same ranges in the same order.
fn offset(seed: u64, cell: u64, i: u64, len: u64) -> u64 {
    fmix64(seed ^ fmix64(cell) ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) % (OBJECT_SIZE - len + 1)
}

fn client() -> C {
    Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(5)))
}

async fn get(c: &C, url: &str, start: u64, len: u64) -> Bytes {
    let req = http::Request::get(url)
        .header(http::header::RANGE, format!("bytes={start}-{}", start + len - 1))
        .body(Empty::new())
        .expect("request");
    let resp = c.request(req).await.expect("response");
    assert_eq!(resp.status(), 206, "{url}");
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(body.len() as u64, len, "{url}");
    body
}

/// Reads `requests` ranges of `len` bytes from `url` with `clients` concurrent keep-alive
/// clients; each client's connection is opened (and its first answer checked byte for byte)
/// before the clock starts.
async fn measure(
    url: &str,
    seed: u64,
    cell: u64,
    len: u64,
    clients: usize,
    requests: usize,
) -> Cell {
    let per_client = requests / clients;
    let mut warmed = Vec::new();
    for k in 0..clients {
        let c = client();
        let start = offset(seed, cell, (k * per_client) as u64, len);
        let body = get(&c, url, start, len).await;
        assert!(body[..] == generate(OBJECT_SEED, start, len as usize)[..], "{url}: bytes differ");
        warmed.push(c);
    }
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (k, c) in warmed.into_iter().enumerate() {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let start = offset(seed, cell, (k * per_client + i) as u64, len);
                let r0 = Instant::now();
                get(&c, &url, start, len).await;
                latencies.push(r0.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::with_capacity(requests);
    for t in tasks {
        latencies.extend(t.await.expect("client task"));
    }
    let seconds = t0.elapsed().as_secs_f64();
    Cell { seconds, bytes: latencies.len() as u64 * len, latencies }
}

async fn start_origin() -> (SocketAddr, Arc<OriginStats>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let addr = l.local_addr().expect("addr");
    let stats = Arc::new(OriginStats::default());
    let object =
        OriginObject { seed: OBJECT_SEED, size: OBJECT_SIZE, behaviour: Behaviour::Honours };
    let forever = std::future::pending::<()>();
    tokio::spawn(serve_origin(l, object, stats.clone(), forever, ServeOptions::default()));
    (addr, stats)
}

/// An HTTP server answering ranges of the object from one in-memory buffer (zero-copy slices):
/// what loopback and hyper alone can do on this machine.
async fn start_memory_server() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind memory server");
    let addr = l.local_addr().expect("addr");
    let object = Bytes::from(generate(OBJECT_SEED, 0, OBJECT_SIZE as usize));
    let handler = move |req: http::Request<hyper::body::Incoming>| {
        let object = object.clone();
        async move {
            let range = req.headers().get(http::header::RANGE).map(|v| v.as_bytes());
            let (start, end) = match dart_core::codec::range::resolve_range(range, OBJECT_SIZE) {
                Ok(dart_core::codec::range::RangeOutcome::Partial { start, end }) => (start, end),
                _ => (0, OBJECT_SIZE - 1),
            };
            let slice = object.slice(start as usize..=end as usize);
            let mut r = http::Response::new(body::full(slice));
            *r.status_mut() = http::StatusCode::PARTIAL_CONTENT;
            let cr = format!("bytes {start}-{end}/{OBJECT_SIZE}");
            r.headers_mut().insert(http::header::CONTENT_RANGE, cr.parse().expect("ascii"));
            r
        }
    };
    tokio::spawn(serve(l, handler, std::future::pending(), ServeOptions::default()));
    addr
}

fn node_flags(dir: &std::path::Path, mem_size: u64, block_size: u64) -> NodeFlags {
    NodeFlags {
        allow_upstream: vec!["127.0.0.0/8".into()],
        public_upstream: vec!["127.0.0.0/8".into()],
        listen: "127.0.0.1:0".into(),
        admin: String::new(),
        cache_dir: dir.to_path_buf(),
        cache_size: 2 * OBJECT_SIZE,
        mem_size,
        chunk_size: 64 * block_size,
        block_size,
        drain_secs: 2,
        ..NodeFlags::default()
    }
}

/// The knobs of one bench run, all printed in its header.
#[derive(Clone, Copy, Debug)]
struct Config {
    seed: u64,
    requests: usize,
    block_size: u64,
}

/// Starts a node and reads the whole object through it once, so every later read is a hit.
async fn warm_node(
    dir: &std::path::Path,
    mem_size: u64,
    block_size: u64,
    origin: SocketAddr,
) -> (dart_node::Running, String) {
    let node = dart_node::start(&node_flags(dir, mem_size, block_size)).await.expect("node starts");
    let url = format!("http://{}/dart/http://{origin}/bench.bin", node.client_addr);
    let c = client();
    let req = http::Request::get(&url).body(Empty::new()).expect("request");
    let body = c.request(req).await.expect("warm read").into_body().collect().await;
    let body = body.expect("warm body").to_bytes();
    assert!(
        body[..] == generate(OBJECT_SEED, 0, OBJECT_SIZE as usize)[..],
        "warm read: bytes differ"
    );
    (node, url)
}

/// Indices into the targets table of the two references.
const ORIGIN: usize = 2;
const CEILING: usize = 3;

fn print_row(range: &str, clients: usize, target: &str, cell: &Cell, origin: f64, ceiling: f64) {
    println!(
        "{range:<7} {clients:>7}  {target:<23} {:>8.1} {:>7.0} {:>7.3} {:>7.3} {:>9.2} {:>10.2}",
        cell.mb_per_s(),
        cell.latencies.len() as f64 / cell.seconds,
        cell.percentile(50.0).as_secs_f64() * 1e3,
        cell.percentile(99.0).as_secs_f64() * 1e3,
        cell.mb_per_s() / origin,
        cell.mb_per_s() / ceiling,
    );
}

async fn run(config: Config) {
    let (origin, stats) = start_origin().await;
    let memory = start_memory_server().await;
    let base = std::env::temp_dir().join(format!("dart-bench-{}", std::process::id()));
    let block = config.block_size;
    let (ram_node, ram_url) = warm_node(&base.join("ram"), 2 * OBJECT_SIZE, block, origin).await;
    let (disk_node, disk_url) = warm_node(&base.join("disk"), 0, block, origin).await;
    let targets = [
        Target { name: "node, RAM tier", url: ram_url },
        Target { name: "node, disk tier", url: disk_url },
        Target { name: "origin (generates)", url: format!("http://{origin}/bench.bin") },
        Target { name: "memory server (ceiling)", url: format!("http://{memory}/bench.bin") },
    ];
    println!(
        "{:<7} {:>7}  {:<23} {:>8} {:>7} {:>7} {:>7} {:>9} {:>10}",
        "range",
        "clients",
        "target",
        "MB/s",
        "req/s",
        "p50 ms",
        "p99 ms",
        "vs origin",
        "vs ceiling"
    );
    for (cell, ((range_name, len), clients)) in
        RANGES.iter().flat_map(|r| CLIENTS.iter().map(move |c| (*r, *c))).enumerate()
    {
        let mut cells = Vec::new();
        for t in &targets {
            let origin_before = stats.requests();
            let m = measure(&t.url, config.seed, cell as u64, len, clients, config.requests).await;
            if t.name.starts_with("node") {
                let after = stats.requests();
                assert_eq!(after, origin_before, "{}: a cache-hit read went to the origin", t.name);
            }
            cells.push(m);
        }
        let (o, c) = (cells[ORIGIN].mb_per_s(), cells[CEILING].mb_per_s());
        for (t, m) in targets.iter().zip(&cells) {
            print_row(range_name, clients, t.name, m, o, c);
        }
    }
    ram_node.shutdown().await;
    disk_node.shutdown().await;
    let _ = std::fs::remove_dir_all(&base);
}

fn main() {
    let seed = env_or("DART_BENCH_SEED", DEFAULT_SEED);
    let requests = env_or("DART_BENCH_REQUESTS", DEFAULT_REQUESTS).max(CLIENTS[1]);
    let block_size = std::env::var("DART_BENCH_BLOCK")
        .ok()
        .map(|v| dart_core::codec::size::parse_byte_size(&v).expect("DART_BENCH_BLOCK: a size"))
        .unwrap_or(DEFAULT_BLOCK_SIZE);
    let build = if cfg!(debug_assertions) {
        "debug build: figures are NOT meaningful"
    } else {
        "optimised build"
    };
    println!(
        "dart cache-hit bench: seed {seed} (DART_BENCH_SEED={seed}), {requests} requests per cell, \
         {} MiB object, {} KiB blocks, {build}",
        OBJECT_SIZE / MIB,
        block_size >> 10
    );
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(run(Config { seed, requests, block_size }));
}
