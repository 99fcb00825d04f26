//! Helpers shared by the node's integration tests (each test binary uses a subset).
#![allow(dead_code)]

use dart_net_tokio::origin_server::{serve_origin, Behaviour, OriginObject, OriginStats};
use dart_net_tokio::server::ServeOptions;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// A directory removed when dropped.
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh, empty directory named after the test binary, the test and the process.
pub fn temp_dir(suite: &str, name: &str) -> TempDir {
    let p = std::env::temp_dir().join(format!("dart-{suite}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    TempDir(p)
}

/// A generated-object origin on loopback, stopped when dropped.
pub struct Origin {
    /// Its address.
    pub addr: SocketAddr,
    /// What it served.
    pub stats: Arc<OriginStats>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts an origin serving object `seed` of `size` bytes with `behaviour`.
pub async fn origin(seed: u64, behaviour: Behaviour, size: u64) -> Origin {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind origin");
    let addr = l.local_addr().expect("addr");
    let stats = Arc::new(OriginStats::default());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let object = OriginObject { seed, size, behaviour };
    let stop = async {
        let _ = rx.await;
    };
    tokio::spawn(serve_origin(l, object, stats.clone(), stop, ServeOptions::default()));
    Origin { addr, stats, _stop: tx }
}

/// A listener that counts the connections it accepted.
pub struct Counting<L> {
    inner: L,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl<L> Counting<L> {
    /// Wraps `inner`; `accepted` goes up by one for every connection accepted.
    pub fn new(inner: L, accepted: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        Counting { inner, accepted }
    }
}

impl<L: dart_net_tokio::seam::Listener> dart_net_tokio::seam::Listener for Counting<L> {
    type Io = L::Io;

    async fn accept(&mut self) -> std::io::Result<(Self::Io, SocketAddr)> {
        let accepted = self.inner.accept().await?;
        // Counted before the server reads a byte: whoever got an answer was counted first.
        self.accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(accepted)
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An answer read to its end.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: http::HeaderMap,
    /// The whole body.
    pub body: bytes::Bytes,
}

impl Reply {
    /// A header's value as text ("" when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// The body as (lossy) text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client that opens a new connection for every request (no pooling), so that a listener's
/// accept count is exactly the number of requests sent to it.
pub type OneShot = hyper_util::client::legacy::Client<
    dart_net_tokio::seam::SeamConnector<dart_net_tokio::seam::TokioDialer>,
    http_body_util::Empty<bytes::Bytes>,
>;

/// A [`OneShot`] client.
pub fn one_shot() -> OneShot {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(dart_net_tokio::seam::SeamConnector::new(
            dart_net_tokio::seam::TokioDialer,
            std::time::Duration::from_secs(2),
        ))
}

/// A keep-alive client (for timing warm reads without a handshake per read).
pub fn pooled() -> OneShot {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(
        dart_net_tokio::seam::SeamConnector::new(
            dart_net_tokio::seam::TokioDialer,
            std::time::Duration::from_secs(2),
        ),
    )
}

/// Sends `method url` with `headers` on `client` and reads the answer to its end, bounded by
/// ten seconds so that a hang is a failure, not a stuck test.
pub async fn send(
    client: &OneShot,
    method: http::Method,
    url: &str,
    headers: &[(&str, &str)],
) -> Reply {
    use http_body_util::BodyExt as _;
    let mut req = http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req.body(http_body_util::Empty::new()).expect("a request");
    let exchange = async {
        let resp = client.request(req).await.expect("a response");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.into_body().collect().await.expect("a whole body").to_bytes();
        Reply { status, headers, body }
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("{url}: no answer within 10 s"))
}

/// `GET url` with `headers` on a fresh connection.
pub async fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    send(&one_shot(), http::Method::GET, url, headers).await
}

/// The block a peer's block answer body carries, after checking that the body ends with that
/// block's digest footer (`dart_core::integrity`).
pub fn peer_block(body: &[u8]) -> &[u8] {
    let footer_len = dart_core::integrity::FOOTER_LEN as usize;
    assert!(body.len() >= footer_len, "a block answer of {} bytes has no footer", body.len());
    let (block, footer) = body.split_at(body.len() - footer_len);
    let digest = dart_core::integrity::xxh3_128(block).footer();
    assert!(footer == &digest[..], "the answer does not end with its block's digest");
    block
}

/// The value of the Prometheus sample `series` (`name{labels}`) in `metrics`.
pub fn sample(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in\n{metrics}"))
}

/// Flags of a test node on loopback: ephemeral client and admin ports, its cache in `dir`, and
/// loopback origins allowed and public (no credential check). Tests override the rest.
#[allow(dead_code)] // not every test binary that includes this module starts a node this way
pub fn loopback_flags(dir: &TempDir) -> dart_node::cli::NodeFlags {
    dart_node::cli::NodeFlags {
        allow_upstream: vec!["127.0.0.0/8".into()],
        public_upstream: vec!["127.0.0.0/8".into()],
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        cache_dir: dir.0.clone(),
        ..dart_node::cli::NodeFlags::default()
    }
}

/// A free loopback port (checked and released: a listener started next takes it), outside the
/// ephemeral range that running nodes' outbound connections draw from ([`dart_node::demo::free_port`]).
pub fn free_port() -> u16 {
    dart_node::demo::free_port().expect("a free loopback port")
}

/// The `dart` binary with its log at `warn` on the test's stderr and its banner on a pipe;
/// [`spawn_dart`] starts it.
pub fn dart_command() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_dart"));
    cmd.env("DART_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    cmd
}

/// A `dart` process a test started, killed and reaped when dropped.
pub struct DartProcess {
    /// The process.
    pub child: std::process::Child,
    /// Its client listener.
    pub client: SocketAddr,
    /// Its admin listener (`None` when off).
    pub admin: Option<SocketAddr>,
    /// Its start-up banner line.
    pub banner: String,
}

impl Drop for DartProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` (from [`dart_command`]) and reads its banner:
/// `dart client=<addr> | mode: ... | p2p: ... | admin: <addr>|off | ...`.
pub fn spawn_dart(cmd: &mut std::process::Command) -> DartProcess {
    use std::io::BufRead as _;
    let mut child = cmd.spawn().expect("spawn dart");
    let mut banner = String::new();
    let stdout = child.stdout.take().expect("stdout piped");
    std::io::BufReader::new(stdout).read_line(&mut banner).expect("banner");
    let field = |prefix: &str| -> Option<SocketAddr> {
        let part = banner.split(" | ").find_map(|p| p.trim().strip_prefix(prefix))?;
        part.split([' ', ',']).next()?.parse().ok()
    };
    let client = field("dart client=").unwrap_or_else(|| panic!("no client in {banner:?}"));
    let admin = field("admin: ");
    DartProcess { child, client, admin, banner }
}
