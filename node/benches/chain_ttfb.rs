//! Chain time-to-first-byte: a fanout-1 chain of `dart` nodes whose every link (origin → root,
//! and each peer hop) is rate-limited by an in-process TCP proxy on loopback. A cold read at
//! depth d measures how long the client waits for its first byte. With cut-through relays the
//! time stays about flat in depth; store-and-forward relays would add one block time per hop.
//!
//! Run: `cargo bench -p dart-node --bench chain_ttfb` (prints a table; no assertion).

use bytes::Bytes;
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig};
use dart_core::membership::{Member, View};
use dart_net_tokio::origin_server::{serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_net_tokio::server::ServeOptions;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BLOCK: u64 = 1 << 20;
const RATE_BYTES_PER_SEC: u64 = 8 << 20;
const NODES: usize = 4;

/// Forwards `listen` → `target`, limiting target→client bytes to `RATE_BYTES_PER_SEC`.
async fn throttled_proxy(listen: tokio::net::TcpListener, target: SocketAddr) {
    loop {
        let Ok((mut down, _)) = listen.accept().await else { return };
        tokio::spawn(async move {
            let Ok(mut up) = tokio::net::TcpStream::connect(target).await else { return };
            let (mut ur, mut uw) = up.split();
            let (mut dr, mut dw) = down.split();
            let to_up = tokio::io::copy(&mut dr, &mut uw);
            let to_down = async {
                let mut buf = vec![0u8; 64 * 1024];
                // A pacer that saves up at most a few milliseconds of idle time (enough to absorb
                // timer overshoot, too little to burst a block through).
                let credit = Duration::from_millis(5);
                let mut next = tokio::time::Instant::now();
                loop {
                    let n = ur.read(&mut buf).await?;
                    if n == 0 {
                        return Ok::<_, std::io::Error>(());
                    }
                    let cost = Duration::from_secs_f64(n as f64 / RATE_BYTES_PER_SEC as f64);
                    next = next.max(tokio::time::Instant::now() - credit) + cost;
                    tokio::time::sleep_until(next).await;
                    dw.write_all(&buf[..n]).await?;
                }
            };
            let _ = tokio::join!(to_up, to_down);
        });
    }
}

async fn proxy_to(target: SocketAddr) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
    let addr = l.local_addr().expect("addr");
    tokio::spawn(throttled_proxy(l, target));
    addr
}

struct Proc(Child, SocketAddr, std::path::PathBuf);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.2);
    }
}

/// A free port outside the ephemeral range ([`dart_node::demo::free_port`]): one the kernel hands
/// out for `:0` may be taken by an outbound connection before the node binds it.
fn free_port() -> u16 {
    dart_node::demo::free_port().expect("a free loopback port")
}

fn spawn(i: usize, peer_port: u16, peers: &str, store_and_forward: bool) -> Proc {
    let dir = std::env::temp_dir().join(format!("dart-chain-{}-{i}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_dart"))
        .args(["--listen", "127.0.0.1:0", "--admin", "", "--fanout", "1"])
        .args(["--peer-listen", &format!("127.0.0.1:{peer_port}")])
        .args(["--self-id", &format!("n{i}"), "--peers", peers])
        .args(["--block-size", "1MiB", "--chunk-size", "64MiB", "--cache-size", "64MiB"])
        .args(["--mem-size", "0"])
        .args(store_and_forward.then_some("--store-and-forward"))
        .arg("--cache-dir")
        .arg(&dir)
        .env("DART_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dart");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("banner");
    let client = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("client="))
        .and_then(|a| a.parse().ok())
        .expect("client address");
    Proc(child, client, dir)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let ol = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let origin = ol.local_addr().expect("addr");
    let stats = Arc::new(OriginStats::default());
    let obj = OriginObject { seed: 3, size: 16 * BLOCK, behaviour: Behaviour::Honours };
    let (_stop, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve_origin(
        ol,
        obj,
        stats,
        async {
            let _ = rx.await;
        },
        ServeOptions::default(),
    ));
    let origin_proxy = proxy_to(origin).await;

    // Every peer is reached through its own throttled proxy.
    let ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect();
    let mut proxied = Vec::new();
    for &p in &ports {
        proxied.push(proxy_to(SocketAddr::from(([127, 0, 0, 1], p))).await);
    }
    let peers: Vec<String> = (0..NODES).map(|i| format!("n{i}@{}", proxied[i])).collect();
    let peers = peers.join(",");
    for mode in ["cut-through", "store-and-forward"] {
        let saf = mode == "store-and-forward";
        run_chain(mode, &peers, &ports, &proxied, origin_proxy, saf).await;
    }
}

async fn run_chain(
    mode: &str,
    peers: &str,
    ports: &[u16],
    proxied: &[SocketAddr],
    origin_proxy: SocketAddr,
    store_and_forward: bool,
) {
    let procs: Vec<Proc> =
        (0..NODES).map(|i| spawn(i, ports[i], peers, store_and_forward)).collect();
    let view = View::new(
        (0..NODES).map(|i| Member::ready(&format!("n{i}"), &proxied[i].to_string())).collect(),
    );
    let c: Client<SeamConnector<TokioDialer>, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)));

    let block_time = BLOCK as f64 / RATE_BYTES_PER_SEC as f64;
    println!("\n{mode}: chain of {NODES} nodes, fanout 1, block {BLOCK} B, every link {RATE_BYTES_PER_SEC} B/s");
    println!("one block time on a link: {:.0} ms", block_time * 1e3);
    println!("{:>6} {:>14} {:>16}", "depth", "ttfb ms", "ttfb / block time");
    for depth in 1..NODES {
        // A fresh object per depth, so every read is cold along the whole chain.
        let upstream = format!("http://{origin_proxy}/{mode}-{depth}.bin");
        let engine = Engine::new(EngineConfig::default());
        let key = engine.block_key(&engine.identify(&upstream), 0);
        let placement = Placement::new(view.clone(), "n0", 1, 1);
        let ranked = placement.ranked(key.chunk);
        let at: usize = ranked[depth].trim_start_matches('n').parse().expect("index");
        let url = format!("http://{}/dart/{upstream}", procs[at].1);
        let req = http::Request::get(url).header("range", format!("bytes=0-{}", BLOCK - 1));
        let t0 = Instant::now();
        let resp = c.request(req.body(Empty::new()).expect("req")).await.expect("response");
        let mut body = resp.into_body();
        let first = loop {
            match body.frame().await {
                Some(Ok(f)) if f.data_ref().is_some_and(|d| !d.is_empty()) => break t0.elapsed(),
                Some(Ok(_)) => continue,
                other => panic!("no body: {other:?}"),
            }
        };
        while body.frame().await.is_some() {}
        let ms = first.as_secs_f64() * 1e3;
        println!("{depth:>6} {ms:>14.0} {:>16.2}", first.as_secs_f64() / block_time);
    }
}
