//! `dart demo --nodes N` (N ≥ 2): an embedded origin and N `dart` processes on loopback (this
//! binary, started again with node flags). Each knows only the next one's peer address
//! (`--discover static:`, a cyclic seed list); the demo waits until every view holds all N, then
//! every node reads one object at once and the table shows where each node's blocks came from
//! and what the origin served. Then the node that read the most from the origin (the tree root of
//! most blocks) is killed with SIGKILL and the survivors read a second object at once: the reads
//! still complete, routed around the dead node. Every byte is checked against the origin's
//! generator.

use super::{get, DemoClient, Origin, OBJECT_SEED};
use crate::cli::DemoFlags;
use anyhow::Context as _;
use dart_net_tokio::origin_server::{generate, OriginStats};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Refresh interval of the demo's nodes: short, so the views converge in a few seconds.
const INTERVAL: &str = "1s";
/// Forget-after of the demo's nodes: the killed node leaves the views this long after it died.
const FORGET: Duration = Duration::from_secs(3);
/// How long the views may take to converge before the demo gives up.
const CONVERGE_BOUND: Duration = Duration::from_secs(30);

/// A `dart` process the demo started; killed when dropped.
struct Child {
    id: String,
    process: std::process::Child,
    client: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

fn spawn(
    i: usize,
    flags: &DemoFlags,
    dir: &Path,
    port: u16,
    seed_port: u16,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding the dart binary")?;
    let id = format!("demo-{i}");
    let cache = dir.join(&id);
    let cache_size = (flags.object_size + flags.block_size) * 3;
    let mut process = std::process::Command::new(exe)
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--peer-listen", &format!("127.0.0.1:{port}")])
        .args(["--self-id", &id])
        .args(["--discover", &format!("static:127.0.0.1:{seed_port}")])
        .args(["--discover-interval", INTERVAL])
        .args(["--forget-after", &format!("{}s", FORGET.as_secs())])
        .args(["--block-size", &flags.block_size.to_string()])
        .args(["--chunk-size", &(flags.block_size * 64).to_string()])
        .args(["--cache-size", &cache_size.to_string(), "--mem-size", "0"])
        // The embedded origin listens on loopback, which the upstream policy refuses unless it
        // is named; public: its objects are shared between nodes without a credential check.
        .args(["--allow-upstream", "127.0.0.1", "--public-upstream", "127.0.0.1"])
        .arg("--cache-dir")
        .arg(&cache)
        .env("DART_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting a dart node")?;
    let mut banner = String::new();
    let stdout = process.stdout.take().context("the node's stdout")?;
    std::io::BufReader::new(stdout).read_line(&mut banner).context("reading the node's banner")?;
    let field = |prefix: &str| -> Option<SocketAddr> {
        let part = banner.split(" | ").find_map(|p| p.trim().strip_prefix(prefix))?;
        part.split([' ', ',']).next()?.parse().ok()
    };
    let (Some(client), Some(admin)) = (field("dart client="), field("admin: ")) else {
        let _ = process.kill();
        let status = process.wait().ok();
        anyhow::bail!("{id} did not start ({status:?}); its banner: {banner:?}");
    };
    Ok(Child { id, process, client, admin })
}

/// A node's member ids, from `/admin/members`.
async fn members(client: &DemoClient, child: &Child) -> anyhow::Result<Vec<String>> {
    let (status, body) =
        get(client, &format!("http://{}/admin/members", child.admin), None).await?;
    anyhow::ensure!(status == 200, "{}: /admin/members status {status}", child.id);
    let v: serde_json::Value = serde_json::from_slice(&body)?;
    let list = v["members"].as_array().context("a members list")?;
    Ok(list.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
}

/// Block reads of a node by source so far, its own and those it made for the peers it relays
/// to, and the blocks it relayed, from `/metrics`: (cache, peer, origin, relayed).
async fn sources(client: &DemoClient, child: &Child) -> anyhow::Result<[u64; 4]> {
    let (status, body) = get(client, &format!("http://{}/metrics", child.admin), None).await?;
    anyhow::ensure!(status == 200, "{}: /metrics status {status}", child.id);
    let text = String::from_utf8_lossy(&body);
    let sample = |series: &str| {
        let series = format!("{series} ");
        text.lines().find_map(|l| l.strip_prefix(&series)?.trim().parse().ok()).unwrap_or(0)
    };
    Ok([
        sample("dart_block_source_total{source=\"cache\"}"),
        sample("dart_block_source_total{source=\"peer\"}"),
        sample("dart_block_source_total{source=\"origin\"}"),
        sample("dart_relay_total{result=\"served\"}"),
    ])
}

/// Every node in `nodes` reads `url_path` whole at once; prints one row per node and the origin's
/// share. Returns the index (into `nodes`) of the node that read the most blocks from the origin.
async fn herd(
    client: &DemoClient,
    nodes: &[Child],
    origin: SocketAddr,
    stats: &OriginStats,
    url_path: &str,
    (size, block): (u64, u64),
) -> anyhow::Result<usize> {
    let upstream = format!("http://{origin}{url_path}");
    let before_origin = stats.bytes();
    let mut before = Vec::new();
    for n in nodes {
        before.push(sources(client, n).await?);
    }
    let t0 = Instant::now();
    let reads = nodes.iter().map(|n| {
        let (client, url) = (client.clone(), format!("http://{}/dart/{upstream}", n.client));
        tokio::spawn(async move {
            let r = get(&client, &url, None).await;
            (r, t0.elapsed())
        })
    });
    let reads: Vec<_> = reads.collect();
    let want = generate(OBJECT_SEED, 0, size as usize);
    let blocks = size.div_ceil(block);
    println!(
        "{blocks} blocks each; block reads count those a node made for the peers it relays to"
    );
    println!(
        "{:<10} {:>8} {:>8} {:>12} {:>12} {:>12} {:>9}",
        "node", "ms", "MB/s", "block reads", "block reads", "block reads", "blocks"
    );
    println!(
        "{:<10} {:>8} {:>8} {:>12} {:>12} {:>12} {:>9}",
        "", "", "", "from cache", "from peers", "from origin", "relayed"
    );
    let mut most = (0, 0);
    for (i, (read, n)) in reads.into_iter().zip(nodes).enumerate() {
        let (result, took) = read.await?;
        let (status, body) = result.with_context(|| format!("{}: the read failed", n.id))?;
        anyhow::ensure!(status == 200, "{}: status {status}", n.id);
        anyhow::ensure!(body[..] == want[..], "{}: bytes differ from the origin's", n.id);
        let after = sources(client, n).await?;
        let got: Vec<u64> = after.iter().zip(&before[i]).map(|(a, b)| a - b).collect();
        if got[2] > most.1 {
            most = (i, got[2]);
        }
        let secs = took.as_secs_f64();
        println!(
            "{:<10} {:>8.0} {:>8.1} {:>12} {:>12} {:>12} {:>9}",
            n.id,
            secs * 1e3,
            size as f64 / secs / 1e6,
            got[0],
            got[1],
            got[2],
            got[3]
        );
    }
    let paid = stats.bytes() - before_origin;
    println!(
        "every byte verified; the origin served {paid} bytes: {:.2} x the object for {} readers\n",
        paid as f64 / size as f64,
        nodes.len()
    );
    Ok(most.0)
}

/// Waits until every node in `nodes` lists exactly `want` members; returns how long it took.
async fn converge(
    client: &DemoClient,
    nodes: &[Child],
    want: usize,
    bound: Duration,
) -> anyhow::Result<Duration> {
    let t0 = Instant::now();
    loop {
        let mut done = true;
        for n in nodes {
            done &= members(client, n).await?.len() == want;
        }
        if done {
            return Ok(t0.elapsed());
        }
        anyhow::ensure!(
            t0.elapsed() < bound,
            "the views did not reach {want} members in {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the demo with `flags.nodes` processes, their caches under `dir`.
pub(super) async fn run(flags: &DemoFlags, dir: &Path) -> anyhow::Result<()> {
    let n = usize::from(flags.nodes);
    let size = flags.object_size;
    let served = Origin::start(size, flags.origin_wait).await?;
    let (origin, stats) = (served.addr, served.stats.clone());
    let client: DemoClient = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(5)));

    let ports = (0..n).map(|_| super::free_port()).collect::<std::io::Result<Vec<u16>>>()?;
    let mut nodes = Vec::new();
    for i in 0..n {
        nodes.push(spawn(i, flags, dir, ports[i], ports[(i + 1) % n])?);
    }
    println!(
        "started {n} dart nodes on loopback; each knows only the next one's address \
         (--discover static:<next>, every {INTERVAL})"
    );
    let took = converge(&client, &nodes, n, CONVERGE_BOUND).await?;
    println!("every view holds all {n} members after {:.1} s\n", took.as_secs_f64());

    println!(
        "all {n} nodes read one {size}-byte object at once (origin http://{origin}/models/a.bin):"
    );
    let root =
        herd(&client, &nodes, origin, &stats, "/models/a.bin", (size, flags.block_size)).await?;

    let dead = nodes.remove(root);
    let dead_id = dead.id.clone();
    drop(dead); // SIGKILL
    println!(
        "killed {dead_id} (SIGKILL), the node that read the most from the origin; the other {} \
         read another object at once:",
        nodes.len()
    );
    herd(&client, &nodes, origin, &stats, "/models/b.bin", (size, flags.block_size)).await?;

    let bound = FORGET + Duration::from_secs(5);
    let took = converge(&client, &nodes, n - 1, bound).await?;
    println!(
        "{dead_id} left every view {:.1} s after the second reads (forget-after {} s)",
        took.as_secs_f64(),
        FORGET.as_secs()
    );
    println!(
        "the origin served {} requests, {} bytes in all, for {} reads of two {size}-byte objects",
        stats.requests(),
        stats.bytes(),
        2 * n - 1
    );
    drop(nodes);
    served.stop().await;
    Ok(())
}
