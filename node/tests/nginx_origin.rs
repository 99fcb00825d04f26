//! External-part tier: nginx as a real origin, on loopback. nginx serves static files with
//! `ETag`, `Last-Modified`, 304, 412 and `If-Range` built in. The cases compare the node's heads
//! and conditional answers with nginx's own for the same request, replace the object between and
//! during reads (in one node and through a peer) and assert exact bytes of one version, and make
//! nginx fail for stale-if-error.
//!
//! Run by `.ci/run` (which installs nginx with apt-get):
//!
//!     cargo test -p dart-node --features external-tests --test nginx_origin
//!
//! Each test starts its own nginx (`master_process off`, so one process that is ours to stop; it
//! runs as the invoking user and needs no `user` directive) on a free 127.0.0.1 port, serving a
//! fresh temporary directory. Without an nginx binary every test fails, naming the install.

use bytes::Bytes;
use dart_core::engine::route::Placement;
use dart_core::engine::{Engine, EngineConfig, EngineStats};
use dart_core::membership::{Member, View};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_node::cli::NodeFlags;
use http::header::{
    HeaderName, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_RANGE,
    CONTENT_TYPE, ETAG, LAST_MODIFIED,
};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

mod support;
use support::TempDir;

const BLOCK: u64 = 64 * 1024;
/// Six blocks, the last one short.
const SIZE: usize = 5 * BLOCK as usize + 1234;
/// Bound of one HTTP exchange made by a test.
const EXCHANGE_BOUND: Duration = Duration::from_secs(20);
/// Bound of nginx's start and stop.
const NGINX_BOUND: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// nginx

/// The nginx binary: `$NGINX`, else `nginx` on `PATH`, else Debian's `/usr/sbin/nginx`.
fn nginx_binary() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("NGINX") {
        Some(p) => vec![PathBuf::from(p)],
        None => std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).map(|d| d.join("nginx")).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .chain([PathBuf::from("/usr/sbin/nginx")])
            .collect(),
    };
    candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "nginx is required by this test tier and was not found (looked at {candidates:?}): \
             install it with `apt-get install -y nginx` (.ci/run does), or point $NGINX at it"
        )
    })
}

/// One nginx process serving `root` on 127.0.0.1, stopped when dropped.
struct Nginx {
    child: Option<Child>,
    addr: SocketAddr,
    root: PathBuf,
    prefix: TempDir,
}

/// The configuration: static files, nginx's defaults for validators (`etag on`), RFC 9110's
/// If-Modified-Since (`before`: 304 when the date is at or after Last-Modified; nginx's default
/// `exact` wants the very date), and locations that set `Cache-Control`.
fn nginx_conf(prefix: &Path, root: &Path, port: u16) -> String {
    let p = prefix.display();
    let r = root.display();
    format!(
        "daemon off;
master_process off;
error_log {p}/error.log info;
pid {p}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log {p}/access.log;
    client_body_temp_path {p}/client_body;
    proxy_temp_path {p}/proxy;
    fastcgi_temp_path {p}/fastcgi;
    uwsgi_temp_path {p}/uwsgi;
    scgi_temp_path {p}/scgi;
    types {{ text/plain txt; application/octet-stream bin; }}
    default_type application/octet-stream;
    etag on;
    if_modified_since before;
    server {{
        listen 127.0.0.1:{port};
        root {r};
        location /cc/ {{
            add_header Cache-Control \"public, max-age=300\";
            add_header Content-Disposition \"attachment; filename=\\\"obj.txt\\\"\";
        }}
        location /nocache/ {{
            add_header Cache-Control \"no-cache\";
        }}
        location /noetag/ {{
            etag off;
        }}
        location /flaky/ {{
            try_files $uri =503;
        }}
    }}
}}
"
    )
}

impl Nginx {
    /// Starts nginx on a free loopback port (a few attempts: the port is chosen before nginx
    /// binds it) and waits, bounded, until it serves this instance's marker file.
    async fn start(name: &str) -> Nginx {
        let binary = nginx_binary();
        let prefix = support::temp_dir("nginx", name);
        let root = prefix.0.join("www");
        for dir in ["cc", "nocache", "noetag", "flaky"] {
            std::fs::create_dir_all(root.join(dir)).expect("create the document root");
        }
        let marker = format!("{}\n", prefix.0.display());
        std::fs::write(root.join("ready.txt"), &marker).expect("write the marker");
        let mut nginx = Nginx { child: None, addr: ([127, 0, 0, 1], 0).into(), root, prefix };
        for _attempt in 0..3 {
            let port = free_port();
            let conf = nginx.prefix.0.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&nginx.prefix.0, &nginx.root, port))
                .expect("write nginx.conf");
            let stderr =
                std::fs::File::create(nginx.prefix.0.join("stderr.log")).expect("stderr file");
            let child = Command::new(&binary)
                .arg("-p")
                .arg(&nginx.prefix.0)
                .arg("-e")
                .arg(nginx.prefix.0.join("error.log"))
                .arg("-c")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
            nginx.child = Some(child);
            nginx.addr = ([127, 0, 0, 1], port).into();
            let url = nginx.url("ready.txt");
            let deadline = Instant::now() + NGINX_BOUND;
            loop {
                if let Some(Ok(Some(status))) = nginx.child.as_mut().map(Child::try_wait) {
                    // Most likely the port was taken meanwhile: try another.
                    eprintln!("nginx exited ({status}) on port {port}: {}", nginx.logs());
                    nginx.child = None;
                    break;
                }
                if let Ok(g) = request(&client(), &url, http::Method::GET, &[]).await {
                    if g.status == 200 && g.body[..] == *marker.as_bytes() {
                        return nginx;
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "nginx did not serve {url} within {NGINX_BOUND:?}: {}",
                    nginx.logs()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        panic!("nginx would not start in 3 attempts: {}", nginx.logs());
    }

    fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.prefix.0.join(f)).unwrap_or_default();
        format!("stderr: {} error.log: {}", read("stderr.log"), read("error.log"))
    }

    /// `http://<nginx>/<path>`.
    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// Writes `data` as `path` with modification time `mtime`, replacing any earlier file
    /// atomically (a rename), so a request sees one version or the other. nginx's ETag is
    /// `"<mtime hex>-<size hex>"`: a same-size replacement needs a new mtime to get a new one.
    fn put(&self, path: &str, data: &[u8], mtime: SystemTime) {
        let tmp = self.root.join(format!(".{}.tmp", path.replace('/', "_")));
        let f = std::fs::File::create(&tmp).expect("create");
        std::io::Write::write_all(&mut &f, data).expect("write");
        f.set_modified(mtime).expect("set mtime");
        drop(f);
        std::fs::rename(&tmp, self.root.join(path)).expect("rename into place");
    }

    /// Removes `path`: nginx answers 404 for it, or 503 under `/flaky/`.
    fn remove(&self, path: &str) {
        std::fs::remove_file(self.root.join(path)).expect("remove");
    }

    /// Stops nginx (one process: `master_process off`) and waits, bounded, until its port
    /// refuses connections.
    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + NGINX_BOUND;
        while std::net::TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
            assert!(Instant::now() < deadline, "nginx still accepts on {} after stop", self.addr);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free port outside the ephemeral range ([`support::free_port`]): one the kernel hands out for
/// `:0` may be taken by an outbound connection before nginx or the node binds it.
fn free_port() -> u16 {
    support::free_port()
}

// ---------------------------------------------------------------------------------------------
// Objects

/// Version `v` (0 or 1) of the object: lowercase text, and the two versions differ at every
/// byte, so any mix of them is visible at the first byte of the other.
fn version(v: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| b'a' + ((i + i / 7 + 13 * v) % 26) as u8).collect()
}

/// The modification time of version `v` (whole seconds, distinct per version).
fn mtime(v: usize) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + 1000 * v as u64)
}

/// `t` as an IMF-fixdate (RFC 9110 §5.6.7), e.g. `Tue, 14 Nov 2023 22:13:20 GMT`.
fn http_date(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).expect("after 1970").as_secs();
    dart_core::codec::conditional::format_http_date(secs)
}

/// Which version `body` is a prefix of (a truncated response is a prefix), if exactly one.
fn prefix_version(body: &[u8], versions: &[Vec<u8>]) -> Option<usize> {
    let matching: Vec<usize> = (0..versions.len())
        .filter(|&v| versions[v].len() >= body.len() && versions[v][..body.len()] == *body)
        .collect();
    match matching[..] {
        [v] => Some(v),
        _ => None,
    }
}

/// Where the first byte differs between `body` and `want` (for failure messages).
fn first_difference(body: &[u8], want: &[u8]) -> Option<usize> {
    body.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or_else(|| (body.len() != want.len()).then_some(body.len().min(want.len())))
}

fn assert_bytes(body: &[u8], want: &[u8], what: &str) {
    assert!(
        body == want,
        "{what}: {} bytes, want {}; first difference at {:?}",
        body.len(),
        want.len(),
        first_difference(body, want)
    );
}

// ---------------------------------------------------------------------------------------------
// Nodes

fn flags(dir: &TempDir, revalidate_after: Option<Duration>) -> NodeFlags {
    let mut f = NodeFlags {
        admin: String::new(),
        cache_size: 64 * BLOCK,
        mem_size: 8 * BLOCK,
        chunk_size: 1 << 20,
        block_size: BLOCK,
        drain_secs: 1,
        ..support::loopback_flags(dir)
    };
    if let Some(d) = revalidate_after {
        f.revalidate_after = d;
    }
    f
}

async fn node(dir: &TempDir, revalidate_after: Option<Duration>) -> dart_node::Running {
    dart_node::start(&flags(dir, revalidate_after)).await.expect("node starts")
}

/// Two peered nodes; returns them as (tree root of `upstream`'s first chunk, the other).
async fn pair(
    name: &str,
    upstream: &str,
) -> ((dart_node::Running, TempDir), (dart_node::Running, TempDir)) {
    let addrs = [free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
    let ids = ["a", "b"];
    let peers = format!("a@{},b@{}", addrs[0], addrs[1]);
    let root = {
        let view = View::new(ids.iter().zip(&addrs).map(|(id, a)| Member::ready(id, a)).collect());
        let engine = Engine::new(EngineConfig::default());
        let key = engine.block_key(&engine.identify(upstream), 0);
        Placement::new(view, "a", 2, 1).ranked(key.chunk)[0].to_owned()
    };
    let mut nodes = Vec::new();
    for (id, addr) in ids.iter().zip(&addrs) {
        let d = support::temp_dir("nginx", &format!("{name}-{id}"));
        let f = NodeFlags {
            self_id: (*id).into(),
            peer_listen: addr.clone(),
            peers: peers.clone(),
            ..flags(&d, None)
        };
        let n = dart_node::start(&f).await.expect("peered node starts");
        nodes.push((id.to_string(), n, d));
    }
    let other = nodes.iter().position(|(id, _, _)| *id != root).expect("two nodes");
    let (_, o, od) = nodes.remove(other);
    let (_, r, rd) = nodes.remove(0);
    ((r, rd), (o, od))
}

fn via(n: &dart_node::Running, upstream: &str) -> String {
    format!("http://{}/dart/{upstream}", n.client_addr)
}

fn stats(n: &dart_node::Running) -> EngineStats {
    n.driver.stats()
}

// ---------------------------------------------------------------------------------------------
// HTTP

type C = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

/// Request header fields, by name.
type Fields<'a> = Vec<(&'a str, &'a str)>;

fn client() -> C {
    // A fresh connection per request: reusing one that nginx is closing (it did so after a 412
    // once in CI) fails the next request with a transport error that says nothing about us.
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)))
}

/// An answer: status, head, the body bytes received, and whether the body ended cleanly (a
/// response cut short has `complete: Err`).
struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: Bytes,
    complete: Result<(), String>,
}

impl Got {
    fn header(&self, name: HeaderName) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// One exchange, bounded by [`EXCHANGE_BOUND`]; `Err` when no response head came.
async fn request(
    c: &C,
    url: &str,
    method: http::Method,
    headers: &[(&str, &str)],
) -> Result<Got, String> {
    let mut req = http::Request::builder().method(method).uri(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let req = req.body(Empty::new()).map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = c.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let mut body = resp.into_body();
        let mut bytes = Vec::new();
        let mut complete = Ok(());
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Some(d) = f.data_ref() {
                        bytes.extend_from_slice(d);
                    }
                }
                Err(e) => {
                    complete = Err(e.to_string());
                    break;
                }
            }
        }
        Ok(Got { status, headers, body: Bytes::from(bytes), complete })
    };
    tokio::time::timeout(EXCHANGE_BOUND, exchange)
        .await
        .unwrap_or_else(|_| panic!("{url}: no answer within {EXCHANGE_BOUND:?}"))
}

async fn get(c: &C, url: &str, headers: &[(&str, &str)]) -> Got {
    request(c, url, http::Method::GET, headers).await.unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

async fn head(c: &C, url: &str, headers: &[(&str, &str)]) -> Got {
    request(c, url, http::Method::HEAD, headers).await.unwrap_or_else(|e| panic!("HEAD {url}: {e}"))
}

/// A whole GET that must succeed with exactly `want`.
async fn get_exact(c: &C, url: &str, want: &[u8], what: &str) -> Got {
    let g = get(c, url, &[]).await;
    assert_eq!(g.status, 200, "{what}: status");
    assert_eq!(g.complete, Ok(()), "{what}: the body ends cleanly");
    assert_bytes(&g.body, want, what);
    g
}

/// A whole GET that raced a replacement: its bytes are one version's (all of it, or a prefix
/// when the response was cut short or refused), never two versions'. Returns the version.
fn assert_one_version(g: &Got, versions: &[Vec<u8>], what: &str) -> Option<usize> {
    match g.status {
        200 => {
            let v = prefix_version(&g.body, versions).unwrap_or_else(|| {
                let d: Vec<_> = versions.iter().map(|v| first_difference(&g.body, v)).collect();
                panic!("{what}: bytes of no single version (first difference per version {d:?})")
            });
            let whole = g.body.len() == versions[v].len();
            assert_eq!(whole, g.complete.is_ok(), "{what}: complete iff every byte came");
            if whole {
                assert_eq!(
                    g.header(CONTENT_LENGTH),
                    Some(versions[v].len().to_string().as_str()),
                    "{what}"
                );
            }
            Some(v)
        }
        // A clean refusal before the head (e.g. a first block that failed): no bytes.
        502 | 503 => None,
        s => panic!("{what}: unexpected status {s}"),
    }
}

/// The fields a block-path head carries from the origin, compared between the node's answer
/// and nginx's own for the same request.
fn assert_same_head(node: &Got, nginx: &Got, what: &str) {
    assert_eq!(node.status, nginx.status, "{what}: status (node vs nginx)");
    for name in [ETAG, LAST_MODIFIED, CONTENT_TYPE, CONTENT_LENGTH, CONTENT_RANGE, CACHE_CONTROL] {
        assert_eq!(
            node.header(name.clone()),
            nginx.header(name.clone()),
            "{what}: {name} (node vs nginx)"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Cases

#[tokio::test]
async fn full_ranged_and_head_reads_carry_nginx_own_validators_type_and_length() {
    let ngx = Nginx::start("heads").await;
    let body = version(0, SIZE);
    ngx.put("obj.txt", &body, mtime(0));
    let d = support::temp_dir("nginx", "heads-node");
    let n = node(&d, None).await;
    let c = client();
    let upstream = ngx.url("obj.txt");
    let through = via(&n, &upstream);
    let span = format!("bytes=100-{}", 2 * BLOCK + 17);
    let cases: [(&str, http::Method, Fields); 5] = [
        ("full GET", http::Method::GET, vec![]),
        ("ranged GET across blocks", http::Method::GET, vec![("range", span.as_str())]),
        ("suffix GET", http::Method::GET, vec![("range", "bytes=-10")]),
        ("HEAD", http::Method::HEAD, vec![]),
        ("ranged HEAD", http::Method::HEAD, vec![("range", "bytes=0-9")]),
    ];
    // Twice: the first pass fills the cache, the second is answered from it.
    for pass in ["cold", "cached"] {
        for (what, method, headers) in &cases {
            let what = format!("{what} ({pass})");
            let direct = request(&c, &upstream, method.clone(), headers).await.expect("nginx");
            let got = request(&c, &through, method.clone(), headers).await.expect("node");
            assert_same_head(&got, &direct, &what);
            assert_eq!(got.header(ACCEPT_RANGES), Some("bytes"), "{what}");
            assert_eq!(got.header(CONTENT_TYPE), Some("text/plain"), "{what}: nginx's type");
            assert!(got.header(ETAG).is_some_and(|e| e.starts_with('"')), "{what}: strong ETag");
            assert!(got.header(LAST_MODIFIED).is_some(), "{what}");
            assert_eq!(got.complete, Ok(()), "{what}");
            assert_bytes(&got.body, &direct.body, &what);
        }
    }
    let s = stats(&n);
    assert!(s.block_source_cache > 0, "the second pass read the cache: {s:?}");

    // A Cache-Control and Content-Disposition set by nginx are passed on, cold and cached.
    let upstream = ngx.url("cc/obj.txt");
    ngx.put("cc/obj.txt", &body, mtime(0));
    for pass in ["cold", "cached"] {
        let direct = get(&c, &upstream, &[("range", "bytes=5-70000")]).await;
        let got = get(&c, &via(&n, &upstream), &[("range", "bytes=5-70000")]).await;
        let what = format!("Cache-Control location ({pass})");
        assert_same_head(&got, &direct, &what);
        assert_eq!(got.header(CACHE_CONTROL), Some("public, max-age=300"), "{what}");
        assert_eq!(
            got.header(CONTENT_DISPOSITION),
            direct.header(CONTENT_DISPOSITION),
            "{what}: Content-Disposition"
        );
        assert_eq!(got.header(CONTENT_DISPOSITION), Some("attachment; filename=\"obj.txt\""));
        assert_bytes(&got.body, &body[5..=70000], &what);
    }
    let etag = get(&c, &upstream, &[]).await.header(ETAG).expect("ETag").to_owned();
    let direct = get(&c, &upstream, &[("if-none-match", &etag)]).await;
    let got = get(&c, &via(&n, &upstream), &[("if-none-match", &etag)]).await;
    assert_eq!((direct.status, got.status), (304, 304));
    assert_eq!(got.header(CACHE_CONTROL), direct.header(CACHE_CONTROL), "a 304's Cache-Control");
    assert_eq!(got.header(ETAG), direct.header(ETAG), "a 304's ETag");
}

#[tokio::test]
async fn each_conditional_form_is_answered_at_the_node_as_nginx_answers_it() {
    let ngx = Nginx::start("conditional").await;
    let body = version(0, SIZE);
    ngx.put("obj.txt", &body, mtime(0));
    let d = support::temp_dir("nginx", "conditional-node");
    let n = node(&d, None).await;
    let c = client();
    let upstream = ngx.url("obj.txt");
    let through = via(&n, &upstream);
    let warm = get_exact(&c, &through, &body, "warm-up read").await;
    let etag = warm.header(ETAG).expect("ETag").to_owned();
    let lm = warm.header(LAST_MODIFIED).expect("Last-Modified").to_owned();
    let weak = format!("W/{etag}");
    let stale = "\"6553f000-50ad2\"";
    let day = http_date;
    let earlier = day(mtime(0) - Duration::from_secs(86_400));
    let later = day(mtime(0) + Duration::from_secs(86_400));
    assert_eq!(lm, day(mtime(0)), "nginx's Last-Modified is the file's mtime");
    let range = "bytes=10-99";
    // (what, request fields, status the RFC asks for, of the range or the whole object)
    let cases: Vec<(&str, Fields, u16)> = vec![
        ("If-None-Match: current ETag", vec![("if-none-match", &etag)], 304),
        ("If-None-Match: weak current ETag", vec![("if-none-match", &weak)], 304),
        ("If-None-Match: another ETag", vec![("if-none-match", stale)], 200),
        ("If-None-Match: *", vec![("if-none-match", "*")], 304),
        ("If-Modified-Since: Last-Modified", vec![("if-modified-since", &lm)], 304),
        ("If-Modified-Since: a day later", vec![("if-modified-since", &later)], 304),
        ("If-Modified-Since: a day earlier", vec![("if-modified-since", &earlier)], 200),
        ("If-Match: wrong ETag", vec![("if-match", stale)], 412),
        ("If-Match: current ETag", vec![("if-match", &etag)], 200),
        ("If-Unmodified-Since: before Last-Modified", vec![("if-unmodified-since", &earlier)], 412),
        ("If-Unmodified-Since: Last-Modified", vec![("if-unmodified-since", &lm)], 200),
        ("If-Range: current ETag", vec![("range", range), ("if-range", &etag)], 206),
        ("If-Range: stale ETag", vec![("range", range), ("if-range", stale)], 200),
        ("If-Range: weak current ETag", vec![("range", range), ("if-range", &weak)], 200),
        ("If-Range: Last-Modified", vec![("range", range), ("if-range", &lm)], 206),
        ("If-Range: another date", vec![("range", range), ("if-range", &earlier)], 200),
        (
            "If-None-Match: current, with a Range",
            vec![("range", range), ("if-none-match", &etag)],
            304,
        ),
        ("If-Match: wrong, with a Range", vec![("range", range), ("if-match", stale)], 412),
    ];
    let before = stats(&n);
    for (what, fields, want) in &cases {
        let direct = get(&c, &upstream, fields).await;
        let got = get(&c, &through, fields).await;
        println!(
            "{what}: nginx {} (ETag {:?}, {} body bytes) | node {} (ETag {:?}, {} body bytes)",
            direct.status,
            direct.header(ETAG),
            direct.body.len(),
            got.status,
            got.header(ETAG),
            got.body.len()
        );
        assert_eq!(direct.status, *want, "{what}: nginx");
        assert_eq!(got.status, *want, "{what}: node");
        assert_eq!(got.complete, Ok(()), "{what}");
        match want {
            304 => {
                assert!(got.body.is_empty(), "{what}: a 304 has no body");
                assert_eq!(got.header(ETAG), direct.header(ETAG), "{what}: ETag (node vs nginx)");
                assert_eq!(got.header(ETAG), Some(etag.as_str()), "{what}");
                assert_eq!(got.header(LAST_MODIFIED), direct.header(LAST_MODIFIED), "{what}");
            }
            // nginx adds its HTML error page to a 412; the node answers without a body.
            412 => assert!(got.body.is_empty(), "{what}: the node's 412 has no body"),
            _ => {
                assert_same_head(&got, &direct, what);
                assert_bytes(&got.body, &direct.body, what);
                let want_body = if *want == 206 { &body[10..=99] } else { &body[..] };
                assert_bytes(&got.body, want_body, what);
            }
        }
    }
    // HEAD with preconditions: the same statuses, no body.
    for (fields, want) in [
        (vec![("if-none-match", etag.as_str())], 304),
        (vec![("if-match", stale)], 412),
        (vec![("if-modified-since", lm.as_str())], 304),
    ] {
        let direct = head(&c, &upstream, &fields).await;
        let got = head(&c, &through, &fields).await;
        assert_eq!((direct.status, got.status), (want, want), "HEAD {fields:?}");
        assert!(got.body.is_empty());
    }
    let after = stats(&n);
    assert_eq!(after.probes, before.probes, "every precondition was judged at the node");
    assert_eq!(after.block_source_origin, before.block_source_origin, "no block was refetched");
}

/// Between reads, nginx's file is replaced by one of the same size and other bytes and mtime.
async fn replaced_between_reads(path: &str, revalidate_after: Option<Duration>, name: &str) {
    let ngx = Nginx::start(name).await;
    let v = [version(0, SIZE), version(1, SIZE)];
    ngx.put(path, &v[0], mtime(0));
    let d = support::temp_dir("nginx", &format!("{name}-node"));
    let n = node(&d, revalidate_after).await;
    let c = client();
    let upstream = ngx.url(path);
    let through = via(&n, &upstream);
    let old = get_exact(&c, &through, &v[0], "first read").await;
    let old_etag = old.header(ETAG).map(str::to_owned);
    let old_lm = old.header(LAST_MODIFIED).expect("Last-Modified").to_owned();
    ngx.put(path, &v[1], mtime(1));
    let new = get(&c, &upstream, &[]).await;
    assert_ne!(new.header(LAST_MODIFIED), Some(old_lm.as_str()), "nginx names the new version");
    if old_etag.is_some() {
        assert_ne!(new.header(ETAG), old_etag.as_deref(), "nginx names the new version");
    }

    let got = get_exact(&c, &through, &v[1], "read after the replacement").await;
    assert_same_head(&got, &new, "read after the replacement");
    let r = get(&c, &through, &[("range", "bytes=70000-70099")]).await;
    assert_eq!(r.status, 206);
    assert_bytes(&r.body, &v[1][70000..70100], "ranged read after the replacement");
    let h = head(&c, &through, &[]).await;
    assert_same_head(&h, &new, "HEAD after the replacement");

    // A client holding the old version's validators gets the new version, as from nginx
    // (without an ETag, If-None-Match carries one nginx never made).
    let old_tag = old_etag.clone().unwrap_or_else(|| "\"0-0\"".to_owned());
    let old_validator = old_etag.clone().unwrap_or_else(|| old_lm.clone());
    let stale_forms: [(&str, Fields); 3] = [
        ("If-None-Match: the old ETag", vec![("if-none-match", &old_tag)]),
        ("If-Modified-Since: the old Last-Modified", vec![("if-modified-since", &old_lm)]),
        ("If-Range: the old validator", vec![("range", "bytes=0-9"), ("if-range", &old_validator)]),
    ];
    for (what, fields) in &stale_forms {
        let direct = get(&c, &upstream, fields).await;
        let got = get(&c, &through, fields).await;
        println!("after the replacement, {what}: nginx {} | node {}", direct.status, got.status);
        assert_eq!(direct.status, 200, "{what}: nginx");
        assert_same_head(&got, &direct, what);
        assert_bytes(&got.body, &v[1], what);
    }
    let s = stats(&n);
    assert!(s.object_changes >= 1, "the change was seen: {s:?}");
    assert!(s.revalidations >= 1, "{s:?}");
}

#[tokio::test]
async fn with_revalidate_after_zero_a_replaced_object_is_read_anew_on_the_next_read() {
    replaced_between_reads("obj.txt", Some(Duration::ZERO), "between-zero").await;
}

#[tokio::test]
async fn with_cache_control_no_cache_from_nginx_a_replaced_object_is_read_anew_on_the_next_read() {
    replaced_between_reads("nocache/obj.txt", None, "between-nocache").await;
}

#[tokio::test]
async fn without_an_etag_a_replaced_object_is_told_by_its_last_modified_and_read_anew() {
    replaced_between_reads("noetag/obj.txt", Some(Duration::ZERO), "between-noetag").await;
}

#[tokio::test]
async fn with_default_freshness_a_read_after_a_replacement_is_entirely_one_version() {
    let ngx = Nginx::start("between-fresh").await;
    let v = [version(0, SIZE), version(1, SIZE)];
    ngx.put("obj.txt", &v[0], mtime(0));
    let d = support::temp_dir("nginx", "between-fresh-node");
    let n = node(&d, None).await;
    let c = client();
    let upstream = ngx.url("obj.txt");
    let through = via(&n, &upstream);
    let etags =
        [get_exact(&c, &through, &v[0], "first read").await.header(ETAG).map(str::to_owned)];
    ngx.put("obj.txt", &v[1], mtime(1));
    let new_etag = get(&c, &upstream, &[]).await.header(ETAG).map(str::to_owned);
    for what in ["second read", "third read"] {
        let g = get(&c, &through, &[]).await;
        let version = assert_one_version(&g, &v, what).expect("a cached object is served");
        assert_eq!(g.complete, Ok(()), "{what}: whole");
        let etag = if version == 0 { &etags[0] } else { &new_etag };
        assert_eq!(g.header(ETAG), etag.as_deref(), "{what}: the ETag names the bytes' version");
        println!("{what}: version {version} (trusted for 60 s)");
    }
}

#[tokio::test]
async fn a_read_whose_first_block_meets_a_replaced_object_starts_over_and_returns_the_new_one() {
    let ngx = Nginx::start("restart").await;
    let v = [version(0, SIZE), version(1, SIZE)];
    ngx.put("obj.txt", &v[0], mtime(0));
    let d = support::temp_dir("nginx", "restart-node");
    let n = node(&d, None).await;
    let c = client();
    let upstream = ngx.url("obj.txt");
    let through = via(&n, &upstream);
    // A HEAD learns the size and validators and caches no block.
    let h = head(&c, &through, &[]).await;
    assert_eq!(h.status, 200);
    ngx.put("obj.txt", &v[1], mtime(1));
    let new_etag = get(&c, &upstream, &[]).await.header(ETAG).map(str::to_owned);
    // Validators still fresh: block 0's window comes back with another ETag before any byte was
    // sent, so the read starts over from a probe and serves the new version whole.
    let g = get_exact(&c, &through, &v[1], "read after the replacement").await;
    assert_eq!(g.header(ETAG), new_etag.as_deref());
    let s = stats(&n);
    assert!(s.object_changes >= 1, "{s:?}");
    assert_eq!(s.revalidations, 0, "found by block 0's answer, not by a revalidation: {s:?}");
    assert_eq!(s.probes, 2, "the HEAD's probe and the restarted read's: {s:?}");
}

/// Block 0 is cached (old version), then nginx's file is replaced, then the whole object is
/// read: block 0 comes from the cache, block 1 from nginx (new).
async fn replaced_during_a_read(path: &str, name: &str) {
    let ngx = Nginx::start(name).await;
    let v = [version(0, SIZE), version(1, SIZE)];
    ngx.put(path, &v[0], mtime(0));
    let d = support::temp_dir("nginx", &format!("{name}-node"));
    let n = node(&d, None).await;
    let c = client();
    let upstream = ngx.url(path);
    let through = via(&n, &upstream);
    let first = format!("bytes=0-{}", BLOCK - 1);
    let g = get(&c, &through, &[("range", first.as_str())]).await;
    assert_eq!(g.status, 206);
    assert_bytes(&g.body, &v[0][..BLOCK as usize], "block 0");
    ngx.put(path, &v[1], mtime(1));
    let g = get(&c, &through, &[]).await;
    let during = assert_one_version(&g, &v, "read during the replacement");
    println!(
        "{path}: read during the replacement: status {}, version {during:?}, {} of {SIZE} bytes, {:?}",
        g.status,
        g.body.len(),
        g.complete
    );
    // Then the node knows: the next read is the new version, whole.
    let g = get_exact(&c, &through, &v[1], "next read").await;
    let new = get(&c, &upstream, &[]).await;
    assert_same_head(&g, &new, "next read");
    let s = stats(&n);
    assert!(s.object_changes >= 1, "{s:?}");
    assert_eq!(s.revalidations, 0, "found by block 1's answer, not by a revalidation: {s:?}");
}

#[tokio::test]
async fn an_object_replaced_during_a_read_never_yields_two_versions_and_the_next_read_converges() {
    replaced_during_a_read("obj.txt", "during").await;
}

#[tokio::test]
async fn without_an_etag_a_replacement_during_a_read_is_told_by_last_modified_and_never_mixed() {
    replaced_during_a_read("noetag/obj.txt", "during-noetag").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_holding_the_old_version_is_refused_and_the_reader_gets_the_new_one_whole() {
    let ngx = Nginx::start("peer-old").await;
    let v = [version(0, SIZE), version(1, SIZE)];
    ngx.put("obj.txt", &v[0], mtime(0));
    let upstream = ngx.url("obj.txt");
    let ((root, _rd), (reader, _od)) = pair("peer-old", &upstream).await;
    let c = client();
    // The tree root reads the old version whole from nginx and trusts it for 60 s.
    get_exact(&c, &via(&root, &upstream), &v[0], "root's read").await;
    ngx.put("obj.txt", &v[1], mtime(1));
    // The other node has never seen the object: its probe learns the new version; the root's
    // blocks name the old one and are refused, so nginx serves them.
    let g = get_exact(&c, &via(&reader, &upstream), &v[1], "reader's read").await;
    let new_etag = get(&c, &upstream, &[]).await.header(ETAG).map(str::to_owned);
    assert_eq!(g.header(ETAG), new_etag.as_deref());
    let s = stats(&reader);
    assert!(s.peer_version_mismatch >= 1, "the root's old blocks were refused: {s:?}");
    assert_eq!(s.block_source_peer, 0, "no old block was taken from the root: {s:?}");
    get_exact(&c, &via(&reader, &upstream), &v[1], "reader's second read").await;
    // The root itself still trusts what it knew: whatever it serves is one version, whole.
    let g = get(&c, &via(&root, &upstream), &[]).await;
    let version = assert_one_version(&g, &v, "root's second read");
    assert_eq!(g.complete, Ok(()));
    println!("root's second read: version {version:?}; reader stats {s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_replaced_during_a_read_through_a_peer_never_mixes_versions_and_converges() {
    let ngx = Nginx::start("peer-during").await;
    let v = [version(0, SIZE), version(1, SIZE)];
    ngx.put("obj.txt", &v[0], mtime(0));
    let upstream = ngx.url("obj.txt");
    let ((root, _rd), (reader, _od)) = pair("peer-during", &upstream).await;
    let c = client();
    // The reader reads block 0 through the root: both cache the old version of it.
    let first = format!("bytes=0-{}", BLOCK - 1);
    let g = get(&c, &via(&reader, &upstream), &[("range", first.as_str())]).await;
    assert_eq!(g.status, 206);
    assert_bytes(&g.body, &v[0][..BLOCK as usize], "block 0 through the root");
    assert!(stats(&reader).block_source_peer >= 1, "block 0 came from the root");
    // The root relayed block 0 on what the reader told it and probes nginx beside it; a probe
    // still in flight when the object is replaced would teach it the new version first, and it
    // would then never see a change. Its own read of block 0 waits for that probe: afterwards
    // the root knows the old version, before the replacement.
    let g = get(&c, &via(&root, &upstream), &[("range", first.as_str())]).await;
    assert_eq!(g.status, 206);
    assert_bytes(&g.body, &v[0][..BLOCK as usize], "block 0 read at the root");
    ngx.put("obj.txt", &v[1], mtime(1));
    // The whole read meets the replacement at block 1 (through the root, then nginx).
    let g = get(&c, &via(&reader, &upstream), &[]).await;
    let during = assert_one_version(&g, &v, "read during the replacement");
    println!(
        "read through a peer during the replacement: status {}, version {during:?}, {} of {SIZE} bytes, {:?}",
        g.status,
        g.body.len(),
        g.complete
    );
    // Both nodes converge on the new version.
    let new_etag = get(&c, &upstream, &[]).await.header(ETAG).map(str::to_owned);
    let g = get_exact(&c, &via(&reader, &upstream), &v[1], "reader's next read").await;
    assert_eq!(g.header(ETAG), new_etag.as_deref());
    let g = get_exact(&c, &via(&root, &upstream), &v[1], "root's next read").await;
    assert_eq!(g.header(ETAG), new_etag.as_deref());
    let (r, o) = (stats(&root), stats(&reader));
    assert!(o.object_changes + o.peer_version_mismatch >= 1, "the reader saw the change: {o:?}");
    // The root saw the change, or (if its probe of the old version was still in flight when
    // the object was replaced, which the read above makes unlikely) it learnt the new version
    // first and stored no block of the old one.
    let first_new = r.object_changes == 0 && r.relay_told_unstored >= 1;
    assert!(r.object_changes >= 1 || first_new, "the root saw the change: {r:?}");
    println!("root stats {r:?}\nreader stats {o:?}");
}

#[tokio::test]
async fn when_nginx_is_down_a_read_after_the_validators_went_stale_is_served_from_the_cache() {
    let mut ngx = Nginx::start("stale-if-error").await;
    let body = version(0, SIZE);
    ngx.put("obj.txt", &body, mtime(0));
    let d = support::temp_dir("nginx", "stale-if-error-node");
    let stale_after = Duration::from_secs(1);
    let n = node(&d, Some(stale_after)).await;
    let c = client();
    let upstream = ngx.url("obj.txt");
    let through = via(&n, &upstream);
    let first = get_exact(&c, &through, &body, "read while nginx is up").await;
    let read_at = Instant::now();
    ngx.stop().await;
    // What is under test is the passage of time itself: wait until the validators went stale.
    tokio::time::sleep_until((read_at + stale_after + Duration::from_millis(200)).into()).await;
    let g = get_exact(&c, &through, &body, "read while nginx is down").await;
    assert_eq!(g.header(ETAG), first.header(ETAG), "the cached version's validators");
    let s = stats(&n);
    assert!(s.revalidations >= 1, "{s:?}");
    assert!(s.stale_served >= 1, "served stale because nginx was down: {s:?}");
    assert_eq!(s.block_source_cache, 6, "every block of the second read came from the cache");
    assert_eq!(s.block_source_origin, 6, "and none was fetched again: {s:?}");
}

/// Reads the object, makes nginx answer `path` with an error, waits until the node's validators
/// went stale, and reads again.
async fn read_after_staleness_with_nginx_answering(path: &str, name: &str) -> (Got, EngineStats) {
    let ngx = Nginx::start(name).await;
    let body = version(0, SIZE);
    ngx.put(path, &body, mtime(0));
    let d = support::temp_dir("nginx", &format!("{name}-node"));
    let stale_after = Duration::from_secs(1);
    let n = node(&d, Some(stale_after)).await;
    let c = client();
    let upstream = ngx.url(path);
    let through = via(&n, &upstream);
    get_exact(&c, &through, &body, "read while the file is there").await;
    let read_at = Instant::now();
    ngx.remove(path);
    let direct = get(&c, &upstream, &[]).await;
    println!("{path} removed: nginx answers {}", direct.status);
    // What is under test is the passage of time itself: wait until the validators went stale.
    tokio::time::sleep_until((read_at + stale_after + Duration::from_millis(200)).into()).await;
    let g = get(&c, &through, &[]).await;
    let s = stats(&n);
    // Put back, the same version is served again from the cache once nginx has it.
    ngx.put(path, &body, mtime(0));
    get_exact(&c, &through, &body, "read once the file is back").await;
    let after = stats(&n);
    assert_eq!(after.object_changes, 0, "the same version came back: {after:?}");
    assert_eq!(after.block_source_origin, 6, "and was not fetched again: {after:?}");
    (g, s)
}

#[tokio::test]
async fn when_nginx_answers_503_a_read_after_the_validators_went_stale_is_served_from_the_cache() {
    let (g, s) = read_after_staleness_with_nginx_answering("flaky/obj.txt", "stale-503").await;
    assert_eq!(g.status, 200, "stale-if-error");
    assert_eq!(g.complete, Ok(()));
    assert_bytes(&g.body, &version(0, SIZE), "read while nginx answers 503");
    assert!(s.stale_served >= 1, "served stale because nginx answered 503: {s:?}");
}

#[tokio::test]
async fn when_nginx_answers_404_after_the_validators_went_stale_the_node_answers_404_not_stale() {
    let (g, s) = read_after_staleness_with_nginx_answering("obj.txt", "stale-404").await;
    assert_eq!(g.status, 404, "a 404 is the origin's answer, not an outage");
    assert_eq!(s.stale_served, 0, "{s:?}");
}
