//! Fixtures: an in-test origin, real peer servers (a node driver serving its peer plane), reader
//! nodes whose misses go to a parent peer, a bare fetcher that asks one peer for one block
//! through the node machine, hand-written hostile servers on raw sockets, and dialers that count
//! or never finish.

use bytes::Bytes;
use dart_core::breaker::{BackoffPolicy, Breaker, BreakerConfig, BreakerCounters, CircuitState};
use dart_core::engine::resolve::UpstreamMode;
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig, EngineStats, P2p, PeerAnswer};
use dart_core::geometry::Geometry;
use dart_core::hash::BlockKey;
use dart_core::membership::{Member, View};
use dart_core::node::{Bounds, Headers, Inbound, Node, NodeConfig, Plane};
use dart_net_tokio::cache::{BlockCache, MemCache};
use dart_net_tokio::client::HttpClient;
use dart_net_tokio::driver::NodeDriver;
use dart_net_tokio::origin_server::{generate, serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::seam::{Dialer, Listener, SeamConnector, TokioDialer};
use dart_net_tokio::server::{serve, ServeOptions};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generator seed of every origin object.
pub const SEED: u64 = 0x5eed_da27;
/// Block size of every engine here: small, so objects of hundreds of blocks stay cheap.
pub const BLOCK: u64 = 4096;
/// Chunk size: four blocks.
pub const CHUNK: u64 = 4 * BLOCK;
/// Longest any fixture waits for a condition before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// The engine configuration every node here shares.
pub fn engine_config() -> EngineConfig {
    EngineConfig { geometry: Geometry::new(CHUNK, BLOCK).expect("geometry"), ..Default::default() }
}

/// The wire key of global block `block` of the object at `url`.
pub fn key_of(url: &str, block: u64) -> BlockKey {
    let engine = Engine::new(engine_config());
    engine.block_key(&engine.identify(url), block)
}

/// The exact bytes of block `block` of an origin object of `size` bytes.
pub fn block_bytes(size: u64, block: u64) -> Vec<u8> {
    let start = block * BLOCK;
    let len = BLOCK.min(size - start);
    generate(SEED, start, len as usize)
}

/// An address nothing listens on (bound once, then released).
pub fn closed_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

/// Peer bounds small enough for tests that need them to fire, `header` and `request` apart.
pub fn bounds(header: Duration, request: Duration) -> Bounds {
    Bounds { peer_head: header, peer_request: request, ..Bounds::default() }
}

/// Starts a driver for `node` whose timers run for the rest of the test.
fn drive<D: Dialer>(
    node: Node,
    store: Arc<dyn BlockCache>,
    dialer: D,
    b: &Bounds,
) -> Arc<NodeDriver<D>> {
    let client = HttpClient::new(dialer, None, b.pool_idle_per_host, b.pool_idle);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    NodeDriver::start(node, store, client, stopped)
}

fn node(engine: Engine, self_id: &str, advertise: &str, bounds: Bounds) -> Node {
    let config = NodeConfig {
        mode: UpstreamMode::prefix("dart"),
        bounds,
        self_id: self_id.to_owned(),
        advertise: advertise.to_owned(),
        access: dart_core::node::Access::trusting_loopback(),
    };
    Node::new(engine, config).expect("valid bounds")
}

/// A bare peer fetcher: one node (breaker disabled, so every request is sent) asking one peer for
/// one block through the node machine's peer path and the shell's client.
pub struct Fetcher<D: Dialer> {
    /// The fetching node.
    pub driver: Arc<NodeDriver<D>>,
}

impl<D: Dialer> Fetcher<D> {
    /// Asks the peer at `addr` for block `key` of `url` at relay depth `hop`, reading at most
    /// `expected + 1` body bytes.
    pub async fn fetch_block(
        &self,
        addr: &str,
        key: BlockKey,
        url: &str,
        hop: u64,
        expected: u64,
    ) -> PeerAnswer {
        let answer = self.driver.fetch_block(addr, key, url, hop, expected).await;
        answer.expect("the fetcher's breaker is disabled: every request is sent")
    }
}

/// A fetcher named `reader` dialing through `dialer` with `bounds`.
pub fn fetcher_with<D: Dialer>(dialer: D, bounds: Bounds) -> Fetcher<D> {
    let mut engine = Engine::new(engine_config());
    let placement = Placement::new(View::new(Vec::new()), "reader", 2, 1);
    let off = BreakerConfig { failure_threshold: 0, ..BreakerConfig::default() };
    let breaker = Breaker::new(off).expect("breaker");
    engine.enable_p2p(P2p { placement, breaker });
    let store: Arc<dyn BlockCache> = Arc::new(MemCache::default());
    let n = node(engine, "reader", "reader:9000", bounds);
    Fetcher { driver: drive(n, store, dialer, &bounds) }
}

/// A fetcher over real sockets.
pub fn peer_client(bounds: Bounds) -> Fetcher<TokioDialer> {
    fetcher_with(TokioDialer, bounds)
}

/// The generated-object origin.
pub struct Origin {
    pub addr: SocketAddr,
    pub stats: Arc<OriginStats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Origin {
    /// The URL of object `name` on this origin.
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/objects/{name}", self.addr)
    }

    /// Requests the origin has received (any verb).
    pub fn requests(&self) -> u64 {
        self.stats.requests()
    }
}

/// Serves one generated object of `size` bytes at every path.
pub async fn origin(behaviour: Behaviour, size: u64) -> Origin {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let addr = l.local_addr().expect("addr");
    let stats = Arc::new(OriginStats::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let object = OriginObject { seed: SEED, size, behaviour };
    let stopped = async {
        let _ = rx.await;
    };
    tokio::spawn(serve_origin(l, object, stats.clone(), stopped, ServeOptions::default()));
    Origin { addr, stats, _stop: tx }
}

/// A TCP listener that counts the connections it accepts.
pub struct CountingListener {
    inner: TcpListener,
    accepts: Arc<AtomicU64>,
}

impl Listener for CountingListener {
    type Io = TcpStream;

    async fn accept(&mut self) -> io::Result<(TcpStream, SocketAddr)> {
        let accepted = Listener::accept(&mut self.inner).await?;
        self.accepts.fetch_add(1, Ordering::SeqCst);
        Ok(accepted)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A real peer server: a node serving its peer plane; a tree root (no peer path) unless it has
/// parents, so a relay it cannot serve from its cache goes to the origin.
pub struct PeerServer {
    pub addr: SocketAddr,
    pub node: Arc<NodeDriver<TokioDialer>>,
    pub cache: Arc<MemCache>,
    pub accepts: Arc<AtomicU64>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl PeerServer {
    /// The server's engine counters.
    pub fn stats(&self) -> EngineStats {
        self.node.stats()
    }

    /// The server's peer-plane address as peers name it.
    pub fn peer_addr(&self) -> String {
        self.addr.to_string()
    }
}

/// A peer server named `self_id` on a fresh loopback port.
pub async fn peer_server(self_id: &str) -> PeerServer {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind peer");
    peer_server_on(l, self_id)
}

/// A peer server named `self_id` on `listener`.
pub fn peer_server_on(listener: TcpListener, self_id: &str) -> PeerServer {
    serve_peer(listener, self_id, &[])
}

/// A relay named `self_id` outside the view whose own misses go to `parent`.
pub async fn relay_with_parent(self_id: &str, parent: &str) -> PeerServer {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind peer");
    serve_peer(l, self_id, &[parent])
}

fn serve_peer(listener: TcpListener, self_id: &str, parents: &[&str]) -> PeerServer {
    let addr = listener.local_addr().expect("addr");
    let cache = Arc::new(MemCache::default());
    let breaker = breaker_config(3, Duration::from_secs(60));
    let node =
        node_driver(TokioDialer, self_id, cache.clone(), parents, breaker, Bounds::default());
    let d = node.clone();
    let handler = move |req| d.clone().handle(Plane::Peer, req);
    let accepts = Arc::new(AtomicU64::new(0));
    let counting = CountingListener { inner: listener, accepts: accepts.clone() };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async {
        let _ = rx.await;
    };
    tokio::spawn(serve(counting, handler, stopped, ServeOptions::default()));
    PeerServer { addr, node, cache, accepts, _stop: tx }
}

/// A breaker opening after `threshold` soft failures whose circuits stay open for `cooldown`
/// exactly (no jitter).
pub fn breaker_config(threshold: u32, cooldown: Duration) -> BreakerConfig {
    BreakerConfig {
        failure_threshold: threshold,
        backoff: BackoffPolicy::Fixed { cooldown },
        ..BreakerConfig::default()
    }
}

/// A node over `cache`: a tree root without `parents`; with them, a node outside the cluster
/// view (members `parent-0`, `parent-1`, ...), so every miss goes to the rank-0 member for its
/// chunk — with a single parent, always that parent.
fn node_driver<D: Dialer>(
    dialer: D,
    self_id: &str,
    cache: Arc<dyn BlockCache>,
    parents: &[&str],
    breaker: BreakerConfig,
    bounds: Bounds,
) -> Arc<NodeDriver<D>> {
    let mut engine = Engine::new(engine_config());
    if !parents.is_empty() {
        let members =
            parents.iter().enumerate().map(|(i, a)| Member::ready(&format!("parent-{i}"), a));
        let placement = Placement::new(View::new(members.collect()), self_id, 2, 1);
        let breaker = Breaker::new(breaker).expect("breaker config");
        engine.enable_p2p(P2p { placement, breaker });
    }
    let n = node(engine, self_id, "", bounds);
    drive(n, cache, dialer, &bounds)
}

/// A reader node whose every miss goes to `parent` (see [`node_driver`]).
pub fn reader_node<D: Dialer>(
    dialer: D,
    parent: &str,
    breaker: BreakerConfig,
    bounds: Bounds,
) -> Arc<NodeDriver<D>> {
    reader_of(dialer, &[parent], breaker, bounds)
}

/// A reader node whose misses go to the rank-0 parent of each chunk (see [`node_driver`]).
pub fn reader_of<D: Dialer>(
    dialer: D,
    parents: &[&str],
    breaker: BreakerConfig,
    bounds: Bounds,
) -> Arc<NodeDriver<D>> {
    let cache = Arc::new(MemCache::default());
    node_driver(dialer, "reader", cache, parents, breaker, bounds)
}

/// Which of `parents` a reader outside the view asks for block `block` of `url`.
pub fn parent_for(parents: &[&str], url: &str, block: u64) -> usize {
    let members = parents.iter().enumerate().map(|(i, a)| Member::ready(&format!("parent-{i}"), a));
    let placement = Placement::new(View::new(members.collect()), "reader", 2, 1);
    let ranked = placement.ranked(key_of(url, block).chunk);
    ranked[0].trim_start_matches("parent-").parse().expect("parent index")
}

/// The reader's view of its parent's circuit.
pub fn circuit<D: Dialer>(node: &NodeDriver<D>, parent: &str) -> CircuitState {
    let now = node.clock().now();
    node.with_node(|n| n.engine().p2p().expect("peer path").breaker.state(&parent.to_owned(), now))
}

/// The reader's breaker counters.
pub fn breaker_counters<D: Dialer>(node: &NodeDriver<D>) -> BreakerCounters {
    node.with_node(|n| n.engine().p2p().expect("peer path").breaker.counters().clone())
}

/// Whether the reader's breaker would admit a request to `parent` now.
pub fn healthy<D: Dialer>(node: &NodeDriver<D>, parent: &str) -> bool {
    let now = node.clock().now();
    node.with_node(|n| {
        n.engine().p2p().expect("peer path").breaker.healthy(&parent.to_owned(), now)
    })
}

/// A node's engine counters.
pub fn engine_stats<D: Dialer>(node: &NodeDriver<D>) -> EngineStats {
    node.stats()
}

/// Waits (bounded) until `parent`'s circuit would admit a probe again.
pub async fn wait_until_healthy<D: Dialer>(node: &NodeDriver<D>, parent: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !healthy(node, parent) {
        assert!(tokio::time::Instant::now() < deadline, "cooldown never elapsed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How a read through a node failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFailure {
    /// The status answered (the head's status when the body was cut short).
    pub status: u16,
    /// The head had been sent: the body was cut short.
    pub committed: bool,
    /// The error text.
    pub error: String,
}

/// A client GET of `range` (e.g. `bytes=0-4095`) of `url` through `node`'s client plane.
pub async fn read<D: Dialer>(
    node: &Arc<NodeDriver<D>>,
    url: &str,
    range: Option<String>,
) -> Result<Vec<u8>, ReadFailure> {
    let mut headers = Headers::new();
    if let Some(r) = range {
        headers.push("range", r);
    }
    let target = format!("/dart/{url}");
    let request = Inbound { method: "GET".into(), target, headers, body: Default::default() };
    let resp = node.clone().respond(Plane::Client, request).await;
    let status = resp.status().as_u16();
    match resp.into_body().collect().await {
        Ok(body) if status < 400 => Ok(body.to_bytes().to_vec()),
        Ok(body) => {
            let error = String::from_utf8_lossy(&body.to_bytes()).trim_end().to_owned();
            Err(ReadFailure { status, committed: false, error })
        }
        Err(e) => Err(ReadFailure { status, committed: true, error: e.to_string() }),
    }
}

/// The `Range` header value covering exactly block `block` of an object of `size` bytes.
pub fn block_range(size: u64, block: u64) -> Option<String> {
    let start = block * BLOCK;
    let end = (start + BLOCK).min(size) - 1;
    Some(format!("bytes={start}-{end}"))
}

/// A response as a plain HTTP client sees it.
pub struct Got {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Got {
    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends `method path` with `headers` to `addr` over a fresh plain HTTP/1.1 client.
pub async fn send(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Got {
    let client: Client<SeamConnector<TokioDialer>, Empty<Bytes>> =
        Client::builder(TokioExecutor::new())
            .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)));
    let mut req = http::Request::builder().method(method).uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = client.request(req.body(Empty::new()).expect("request")).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Got { status, headers, body }
}

/// A GET of `path` with `headers`.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Got {
    send(addr, http::Method::GET, path, headers).await
}

/// Writes `request` verbatim on a fresh connection and returns the response status code.
pub async fn raw_status(addr: SocketAddr, request: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out);
    let line = text.lines().next().unwrap_or_default();
    line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{text:?}"))
}

/// A hand-written server on a raw socket: every accepted connection runs `script`, which may
/// write whatever bytes it likes.
pub struct Hostile {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepts: Arc<AtomicU64>,
}

impl Hostile {
    /// The address as a peer name.
    pub fn peer_addr(&self) -> String {
        self.addr.to_string()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepts.load(Ordering::SeqCst)
    }
}

/// Starts a hostile server; `script` gets the connection's index (from 0) and the stream.
pub async fn hostile<F, Fut>(script: F) -> Hostile
where
    F: Fn(u64, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind hostile");
    let addr = l.local_addr().expect("addr");
    let accepts = Arc::new(AtomicU64::new(0));
    let counter = accepts.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = l.accept().await {
            let index = counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(script(index, stream));
        }
    });
    Hostile { addr, accepts }
}

/// Reads one request head (through the blank line); `None` if the peer closed first.
pub async fn read_head(s: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            Ok(_) | Err(_) => return None,
        }
        assert!(head.len() < 64 * 1024, "request head too long");
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Waits until the other side closes the connection (or it breaks), discarding what it sends.
pub async fn wait_for_close(s: &mut (impl tokio::io::AsyncRead + Unpin)) {
    let mut sink = [0u8; 4096];
    while let Ok(n) = s.read(&mut sink).await {
        if n == 0 {
            return;
        }
    }
}

/// A hostile script that answers every request on a connection with `response` verbatim.
pub fn answer_with(
    response: Vec<u8>,
) -> impl Fn(u64, TcpStream) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync {
    let response = Arc::new(response);
    move |_, mut s| {
        let response = response.clone();
        Box::pin(async move {
            while read_head(&mut s).await.is_some() {
                if s.write_all(&response).await.is_err() {
                    return;
                }
            }
        })
    }
}

/// A hostile script that answers the first request with `response` verbatim and closes.
pub fn answer_once(
    response: Vec<u8>,
) -> impl Fn(u64, TcpStream) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync {
    let response = Arc::new(response);
    move |_, mut s| {
        let response = response.clone();
        Box::pin(async move {
            if read_head(&mut s).await.is_some() {
                let _ = s.write_all(&response).await;
                let _ = s.shutdown().await;
            }
        })
    }
}

/// A `200` block answer head, digest header included (`dart_core::integrity`), with these
/// extra header lines.
pub fn ok_head(extra: &str) -> String {
    format!("HTTP/1.1 200 OK\r\nX-DART-Node: liar\r\nX-DART-Digest: xxh3-128\r\n{extra}\r\n")
}

/// A block's body as a current peer sends it: the block, then its digest footer.
pub fn with_footer(block: &[u8]) -> Vec<u8> {
    let mut out = block.to_vec();
    out.extend_from_slice(&dart_core::integrity::xxh3_128(block).footer());
    out
}

/// Bytes of the digest footer after a block.
pub const FOOTER: usize = dart_core::integrity::FOOTER_LEN as usize;

/// A dialer that counts dials per `host:port` and then dials for real.
#[derive(Clone, Default)]
pub struct CountingDialer {
    dials: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl CountingDialer {
    /// Dials made to `addr` so far.
    pub fn dials(&self, addr: &str) -> u64 {
        self.dials.lock().expect("dials lock").get(addr).copied().unwrap_or(0)
    }
}

impl Dialer for CountingDialer {
    type Io = TcpStream;

    async fn dial(&self, host: &str, port: u16) -> io::Result<TcpStream> {
        *self.dials.lock().expect("dials lock").entry(format!("{host}:{port}")).or_default() += 1;
        TokioDialer.dial(host, port).await
    }
}

/// A dialer whose connection attempts never finish: a host that is gone and sends no RST.
#[derive(Clone, Copy, Default)]
pub struct BlackHoleDialer;

impl Dialer for BlackHoleDialer {
    type Io = TcpStream;

    async fn dial(&self, _host: &str, _port: u16) -> io::Result<TcpStream> {
        std::future::pending().await
    }
}

/// A deterministic byte stream from `seed` (splitmix over `fmix64`), for seeded garbage.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| dart_core::hash::fmix64(seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))))
        .map(|z| z.to_le_bytes()[0])
        .collect()
}
