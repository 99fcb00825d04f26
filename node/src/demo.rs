//! `dart demo`: an embedded origin serving a generated object, nodes in front of it, reads
//! through them, and a report of where the bytes came from. Needs no external service. With
//! `--nodes 1` one node runs in this process; with more (the default is 3) see [`cluster`].

use crate::cli::{DemoFlags, NodeFlags};
use bytes::Bytes;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_net_tokio::server::ServeOptions;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;
use std::time::{Duration, Instant};

const OBJECT_SEED: u64 = 0xDA27;

type DemoClient = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

struct Phase {
    name: String,
    bytes: u64,
    seconds: f64,
    origin_requests: u64,
    cache_blocks: u64,
    origin_blocks: u64,
}

async fn get(
    client: &DemoClient,
    url: &str,
    range: Option<(u64, u64)>,
) -> anyhow::Result<(u16, Bytes)> {
    let mut req = http::Request::get(url);
    if let Some((a, b)) = range {
        req = req.header(http::header::RANGE, format!("bytes={a}-{b}"));
    }
    let resp = client.request(req.body(Empty::new())?).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

mod cluster;

/// A loopback port no listener holds, for a process started next to bind: tried below the
/// kernel's usual ephemeral range (32768–60999 on Linux), where outbound connections of nodes
/// already running never take it between the check and the bind, then anywhere.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let spread = std::process::id().wrapping_mul(7919);
    for _ in 0..64 {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (spread.wrapping_add(k.wrapping_mul(104_729)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Runs the demo.
pub async fn run(flags: DemoFlags) -> anyhow::Result<()> {
    if flags.serve && flags.nodes > 1 {
        anyhow::bail!("--serve keeps one node running: give --nodes 1 with it");
    }
    let dir = std::env::temp_dir().join(format!("dart-demo-{}", std::process::id()));
    let result =
        if flags.nodes > 1 { cluster::run(&flags, &dir).await } else { run_in(&flags, &dir).await };
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run_in(flags: &DemoFlags, dir: &std::path::Path) -> anyhow::Result<()> {
    let size = flags.object_size;
    let origin = Origin::start(size, flags.origin_wait).await?;
    let (origin_addr, stats) = (origin.addr, origin.stats.clone());

    let node_flags = NodeFlags {
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        cache_dir: dir.to_path_buf(),
        cache_size: (size + flags.block_size).max(2 * flags.block_size) * 2,
        mem_size: 0,
        owned_fraction: None,
        chunk_size: flags.block_size * 64,
        block_size: flags.block_size,
        drain_secs: 5,
        // The embedded origin listens on loopback, which the upstream policy refuses unless it is
        // named explicitly.
        allow_upstream: vec![origin_addr.ip().to_string()],
        ..NodeFlags::default()
    };
    let node = crate::start(&node_flags).await?;
    println!("{}", node.banner);
    let upstream = format!("http://{origin_addr}/models/demo.bin");
    let url = format!("http://{}/dart/{upstream}", node.client_addr);
    println!("demo object: {upstream} ({size} bytes), read through {url}\n");

    let client: DemoClient = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(5)));
    let mut phases = Vec::new();
    let mi = 1u64 << 20;
    let reads: Vec<(String, Option<(u64, u64)>)> = vec![
        ("cold full read".into(), None),
        ("warm full read".into(), None),
        (
            "1 MiB across a block boundary".into(),
            Some((flags.block_size - mi / 2, flags.block_size + mi / 2 - 1)),
        ),
        ("last 100 bytes".into(), Some((size.saturating_sub(100), size - 1))),
    ];
    for (name, range) in reads {
        let (range, want_start) = match range {
            Some((a, b)) if b < size && a <= b => (Some((a, b)), a),
            Some(_) => continue,
            None => (None, 0),
        };
        let before = (stats.requests(), node.driver.stats());
        let t0 = Instant::now();
        let (status, body) = get(&client, &url, range).await?;
        let seconds = t0.elapsed().as_secs_f64();
        let after = (stats.requests(), node.driver.stats());
        let want = generate(OBJECT_SEED, want_start, body.len());
        anyhow::ensure!(status == 200 || status == 206, "{name}: status {status}");
        anyhow::ensure!(body[..] == want[..], "{name}: bytes differ from the origin's");
        phases.push(Phase {
            name,
            bytes: body.len() as u64,
            seconds,
            origin_requests: after.0 - before.0,
            cache_blocks: after.1.block_source_cache - before.1.block_source_cache,
            origin_blocks: after.1.block_source_origin - before.1.block_source_origin,
        });
    }
    println!(
        "{:<32} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "read", "bytes", "ms", "MB/s", "origin", "blocks", "blocks"
    );
    println!(
        "{:<32} {:>12} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "", "", "", "", "reqs", "cache", "origin"
    );
    for p in &phases {
        let mbps = p.bytes as f64 / p.seconds / 1e6;
        println!(
            "{:<32} {:>12} {:>10.1} {:>10.1} {:>8} {:>8} {:>8}",
            p.name,
            p.bytes,
            p.seconds * 1e3,
            mbps,
            p.origin_requests,
            p.cache_blocks,
            p.origin_blocks
        );
    }
    println!("\nevery byte verified against the origin's generator");
    println!(
        "origin served {} requests, {} body bytes for a {size}-byte object",
        stats.requests(),
        stats.bytes()
    );
    println!("\nfrom /metrics:");
    for line in node.driver.metrics().encode().lines() {
        if line.starts_with("dart_block_source") || line.starts_with("dart_bytes") {
            println!("  {line}");
        }
    }
    if flags.serve {
        let admin = node.admin_addr.map(|a| a.to_string()).unwrap_or_default();
        println!("\nserving until ctrl-c; try:\n  curl -r 0-99 {url} | xxd | head\n  curl http://{admin}/metrics");
        let _ = tokio::signal::ctrl_c().await;
    }
    node.shutdown().await;
    origin.stop().await;
    Ok(())
}

/// The demo's origin: a generated object on loopback.
struct Origin {
    addr: std::net::SocketAddr,
    stats: Arc<OriginStats>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<dart_net_tokio::server::Drained>,
}

impl Origin {
    /// Serves object [`OBJECT_SEED`] of `size` bytes on an ephemeral loopback port, answering
    /// each request `wait` after it arrived.
    async fn start(size: u64, wait: Duration) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stats = Arc::new(OriginStats::default());
        let behaviour = if wait.is_zero() {
            Behaviour::Honours
        } else {
            Behaviour::Waits { wait_ms: wait.as_millis().try_into().unwrap_or(u64::MAX) }
        };
        let object = OriginObject { seed: OBJECT_SEED, size, behaviour };
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stop_rx.await;
        };
        let options = ServeOptions::default();
        let task = tokio::spawn(serve_origin(listener, object, stats.clone(), stopped, options));
        Ok(Origin { addr, stats, stop, task })
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}
