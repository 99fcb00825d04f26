//! The registry mirror (`--registry`, spec/node.md §3) against a scripted registry on loopback:
//! blobs read through the cache with `Docker-Content-Digest` and a digest check of every whole
//! read, everything else under `/v2` proxied with its status, challenge and the client's exact
//! path, and the prefix API beside it. The real registry, skopeo and containerd are the
//! external tier's (`registry_real`).

use dart_core::registry::sha256_digest;
use dart_net_tokio::body::{self, ResponseBody};
use dart_net_tokio::origin_server::generate;
use dart_net_tokio::server::{serve, ServeOptions};
use dart_node::cli::NodeFlags;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

mod support;
use support::{sample, send, Reply, TempDir};

const SEED: u64 = 41;
const BLOCK: u64 = 64 << 10;
/// Three whole blocks and a tail.
const SIZE: u64 = 3 * BLOCK + 1234;
const MANIFEST: &str =
    r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#;
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CHALLENGE: &str =
    r#"Bearer realm="http://auth.invalid/token",service="reg",scope="repository:private/app:pull""#;

fn blob() -> Vec<u8> {
    generate(SEED, 0, SIZE as usize).to_vec()
}

/// What the registry was asked.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    /// The raw path, as it arrived.
    path: String,
    query: Option<String>,
    authorization: Option<String>,
    accept: Option<String>,
    forwarded_host: Option<String>,
    range: Option<String>,
}

/// A registry on loopback: `/v2/` ping, one manifest, one good blob, one blob whose bytes do
/// not match its name, a private repository that challenges, and 404 for the rest.
struct Registry {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    good: String,
    bad: String,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Registry {
    async fn start() -> Registry {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind registry");
        let addr = l.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let good = sha256_digest(&blob());
        // Named by the digest of other bytes: the registry (or a disk under it) is corrupt.
        let bad = sha256_digest(b"the bytes this blob was pushed with");
        let (g, b) = (good.clone(), bad.clone());
        let handler = move |req: Request<Incoming>| {
            let (log, g, b) = (log.clone(), g.clone(), b.clone());
            async move { answer(&req, &log, &g, &b) }
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async {
            let _ = rx.await;
        };
        tokio::spawn(serve(l, handler, stop, ServeOptions::default()));
        Registry { addr, seen, good, bad, _stop: tx }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }

    fn blob_requests(&self, digest: &str) -> usize {
        self.seen().iter().filter(|s| s.path.ends_with(digest)).count()
    }
}

fn answer(
    req: &Request<Incoming>,
    log: &Mutex<Vec<Seen>>,
    good: &str,
    bad: &str,
) -> Response<ResponseBody> {
    let header = |n: &str| req.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
    log.lock().expect("log").push(Seen {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        query: req.uri().query().map(str::to_owned),
        authorization: header("authorization"),
        accept: header("accept"),
        forwarded_host: header("x-forwarded-host"),
        range: header("range"),
    });
    let path = req.uri().path();
    let mut r = match path {
        "/v2/" => body::plain(200, "{}"),
        "/v2/lib/app/manifests/latest" | "/v2/we%3Fird/manifests/latest" => {
            let mut r = Response::new(body::full(MANIFEST));
            let h = r.headers_mut();
            h.insert("content-type", OCI_MANIFEST.parse().expect("header"));
            h.insert(
                "docker-content-digest",
                sha256_digest(MANIFEST.as_bytes()).parse().expect("header"),
            );
            h.insert("content-length", MANIFEST.len().into());
            r
        }
        "/v2/private/app/manifests/latest" if header("authorization").is_none() => {
            let mut r = body::plain(401, r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#);
            r.headers_mut().insert("www-authenticate", CHALLENGE.parse().expect("header"));
            r
        }
        "/v2/private/app/manifests/latest" => body::plain(200, MANIFEST),
        p if p == format!("/v2/lib/app/blobs/{good}") => ranged(req, &blob()),
        p if p == format!("/v2/private/app/blobs/{good}") && header("authorization").is_none() => {
            let mut r = body::plain(401, r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#);
            r.headers_mut().insert("www-authenticate", CHALLENGE.parse().expect("header"));
            r
        }
        p if p == format!("/v2/private/app/blobs/{good}") => ranged(req, &blob()),
        p if p == format!("/v2/cdn/app/blobs/{good}") => {
            let mut r = body::plain(307, "");
            let location = format!("http://127.0.0.1:9/cdn/{good}");
            r.headers_mut().insert("location", location.parse().expect("header"));
            r
        }
        p if p == format!("/v2/lib/app/blobs/{bad}") => ranged(req, &blob()),
        _ => body::plain(404, r#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#),
    };
    r.headers_mut()
        .insert("docker-distribution-api-version", "registry/2.0".parse().expect("header"));
    r
}

/// `data` with single ranges, as a registry serves a blob.
fn ranged(req: &Request<Incoming>, data: &[u8]) -> Response<ResponseBody> {
    use dart_core::codec::range::{resolve_range, RangeOutcome};
    let size = data.len() as u64;
    let range = req.headers().get("range").map(|v| v.as_bytes());
    let (status, start, end) = match resolve_range(range, size) {
        Ok(RangeOutcome::Whole) => (200, 0, size - 1),
        Ok(RangeOutcome::Partial { start, end }) => (206, start, end),
        Err(_) => return body::plain(416, "unsatisfiable"),
    };
    let slice = bytes::Bytes::copy_from_slice(&data[start as usize..=end as usize]);
    let mut r = Response::new(body::full(slice));
    *r.status_mut() = http::StatusCode::from_u16(status).expect("status");
    let h = r.headers_mut();
    h.insert("content-length", (end - start + 1).into());
    h.insert("content-type", "application/octet-stream".parse().expect("header"));
    if status == 206 {
        h.insert("content-range", format!("bytes {start}-{end}/{size}").parse().expect("header"));
    }
    r
}

struct Node {
    running: dart_node::Running,
    _dir: TempDir,
}

impl Node {
    async fn start(name: &str, registry: &Registry) -> Node {
        let dir = support::temp_dir("registry", name);
        let flags = NodeFlags {
            registry: format!("http://{}", registry.addr),
            cache_size: 64 * BLOCK,
            mem_size: 8 * BLOCK,
            block_size: BLOCK,
            chunk_size: 4 * BLOCK,
            drain_secs: 1,
            ..support::loopback_flags(&dir)
        };
        let running = dart_node::start(&flags).await.expect("node starts");
        Node { running, _dir: dir }
    }

    fn url(&self, target: &str) -> String {
        format!("http://{}{target}", self.running.client_addr)
    }

    async fn get(&self, target: &str, headers: &[(&str, &str)]) -> Reply {
        support::get(&self.url(target), headers).await
    }

    async fn metrics(&self) -> String {
        let admin = self.running.admin_addr.expect("admin on");
        support::get(&format!("http://{admin}/metrics"), &[]).await.text()
    }
}

/// `GET url` read as far as it goes: the status, the announced length and the bytes that came
/// before the body ended or broke, and whether it broke.
async fn get_partial(url: &str) -> (u16, u64, Vec<u8>, bool) {
    let req = http::Request::get(url)
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .expect("request");
    let resp = support::one_shot().request(req).await.expect("a response head");
    let status = resp.status().as_u16();
    let length = resp
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("a content-length");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let mut broke = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    (status, length, got, broke)
}

#[tokio::test]
async fn a_blob_is_read_through_the_cache_with_its_digest_and_checked_when_read_whole() {
    let registry = Registry::start().await;
    let node = Node::start("blob", &registry).await;
    let target = format!("/v2/lib/app/blobs/{}", registry.good);

    let cold = node.get(&target, &[]).await;
    assert_eq!(cold.status, 200, "{}", cold.text());
    assert!(cold.body[..] == blob()[..], "cold read: wrong bytes");
    assert_eq!(cold.header("docker-content-digest"), registry.good);
    assert_eq!(cold.header("content-type"), "application/octet-stream");
    let asked = registry.blob_requests(&registry.good);
    assert!(asked >= 1, "the registry was asked for the blob");

    let warm = node.get(&target, &[]).await;
    assert!(warm.body[..] == blob()[..], "warm read: wrong bytes");
    let ranged = node.get(&target, &[("range", "bytes=100-70000")]).await;
    assert_eq!(ranged.status, 206);
    assert!(ranged.body[..] == blob()[100..=70000], "ranged read: wrong bytes");
    assert_eq!(ranged.header("docker-content-digest"), registry.good);
    let head = send(&support::one_shot(), http::Method::HEAD, &node.url(&target), &[]).await;
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(head.header("docker-content-digest"), registry.good);
    assert_eq!(head.header("content-length"), SIZE.to_string());
    assert_eq!(registry.blob_requests(&registry.good), asked, "warm reads come from the cache");
    let fetches = registry.seen();
    let whole = fetches.iter().filter(|s| s.path.ends_with(&registry.good) && s.range.is_none());
    assert_eq!(whole.count(), 0, "the engine asks for blocks, never the whole blob at once");

    let metrics = node.metrics().await;
    assert_eq!(sample(&metrics, "dart_registry_blob_digest_total{result=\"verified\"}"), 2);
    assert_eq!(sample(&metrics, "dart_registry_blob_digest_total{result=\"mismatch\"}"), 0);
}

#[tokio::test]
async fn a_blob_whose_bytes_do_not_match_its_digest_is_cut_short_and_not_kept() {
    let registry = Registry::start().await;
    let node = Node::start("mismatch", &registry).await;
    let target = format!("/v2/lib/app/blobs/{}", registry.bad);

    let (status, length, got, broke) = get_partial(&node.url(&target)).await;
    assert_eq!((status, length), (200, SIZE));
    assert!(broke, "the response must fail, not end cleanly");
    assert!((got.len() as u64) < SIZE, "the last byte is never released: got {}", got.len());
    let asked = registry.blob_requests(&registry.bad);

    // Nothing of it was kept: the next read fetches again, and fails again.
    let (_, _, again, broke) = get_partial(&node.url(&target)).await;
    assert!(broke && (again.len() as u64) < SIZE);
    assert!(
        registry.blob_requests(&registry.bad) > asked,
        "the second read asked the registry again"
    );

    // A ranged read is served: a range cannot be checked.
    let ranged = node.get(&target, &[("range", "bytes=0-99")]).await;
    assert_eq!(ranged.status, 206);
    assert!(ranged.body[..] == blob()[..100]);

    let metrics = node.metrics().await;
    assert_eq!(sample(&metrics, "dart_registry_blob_digest_total{result=\"mismatch\"}"), 2);
}

#[tokio::test]
async fn everything_else_under_v2_is_proxied_with_its_status_headers_and_exact_path() {
    let registry = Registry::start().await;
    let node = Node::start("proxy", &registry).await;

    let ping = node.get("/v2/", &[]).await;
    assert_eq!(ping.status, 200);
    assert_eq!(ping.header("docker-distribution-api-version"), "registry/2.0");

    let manifest = node
        .get(
            "/v2/lib/app/manifests/latest",
            &[("accept", OCI_MANIFEST), ("authorization", "Bearer client")],
        )
        .await;
    assert_eq!(manifest.status, 200);
    assert_eq!(manifest.text(), MANIFEST);
    assert_eq!(manifest.header("content-type"), OCI_MANIFEST);
    assert_eq!(manifest.header("docker-content-digest"), sha256_digest(MANIFEST.as_bytes()));
    let seen = registry.seen();
    let asked = seen.last().expect("the registry was asked");
    assert_eq!(asked.accept.as_deref(), Some(OCI_MANIFEST));
    assert_eq!(asked.authorization.as_deref(), Some("Bearer client"));
    assert_eq!(
        asked.forwarded_host.as_deref(),
        Some(node.running.client_addr.to_string().as_str())
    );

    // Manifests are proxied every time.
    node.get("/v2/lib/app/manifests/latest", &[]).await;
    let manifests =
        registry.seen().iter().filter(|s| s.path.ends_with("/manifests/latest")).count();
    assert_eq!(manifests, 2);

    let missing = node.get("/v2/lib/app/manifests/nope", &[]).await;
    assert_eq!(missing.status, 404, "an upstream 404 stays 404");
    assert!(missing.text().contains("MANIFEST_UNKNOWN"));

    let challenged = node.get("/v2/private/app/manifests/latest", &[]).await;
    assert_eq!(challenged.status, 401, "an upstream 401 stays 401");
    assert_eq!(challenged.header("www-authenticate"), CHALLENGE);

    let weird = node.get("/v2/we%3Fird/manifests/latest", &[]).await;
    assert_eq!(weird.status, 200);
    let asked = registry.seen().last().cloned().expect("asked");
    assert_eq!(
        (asked.path.as_str(), asked.query.as_deref()),
        ("/v2/we%3Fird/manifests/latest", None)
    );

    let tags = node.get("/v2/lib/app/tags/list?n=10&last=a", &[]).await;
    assert_eq!(tags.status, 404);
    let asked = registry.seen().last().cloned().expect("asked");
    assert_eq!(
        (asked.path.as_str(), asked.query.as_deref()),
        ("/v2/lib/app/tags/list", Some("n=10&last=a"))
    );

    // HEAD of a manifest: the head only.
    let head = send(
        &support::one_shot(),
        http::Method::HEAD,
        &node.url("/v2/lib/app/manifests/latest"),
        &[],
    )
    .await;
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(head.header("docker-content-digest"), sha256_digest(MANIFEST.as_bytes()));
}

#[tokio::test]
async fn pull_only_and_v2_only_with_the_prefix_api_beside_it() {
    let registry = Registry::start().await;
    let node = Node::start("methods", &registry).await;
    let before = registry.seen().len();
    for method in [http::Method::POST, http::Method::PUT, http::Method::DELETE, http::Method::PATCH]
    {
        let r = send(
            &support::one_shot(),
            method.clone(),
            &node.url("/v2/lib/app/blobs/uploads/"),
            &[],
        )
        .await;
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(r.header("allow"), "GET, HEAD");
    }
    assert_eq!(registry.seen().len(), before, "a refused method is never forwarded");

    for target in ["/", "/v1/x", "/v2x", "/other/thing"] {
        let r = node.get(target, &[]).await;
        assert_eq!(r.status, 404, "{target}: {}", r.text());
    }
    assert_eq!(registry.seen().len(), before);

    // The prefix API still reads any allowed URL.
    let url = format!("http://{}/v2/lib/app/blobs/{}", registry.addr, registry.good);
    let r = node.get(&format!("/dart/{url}"), &[("range", "bytes=0-9")]).await;
    assert_eq!(r.status, 206);
    assert!(r.body[..] == blob()[..10]);
    assert_eq!(r.header("docker-content-digest"), "", "the prefix API is not the mirror");
    let r = node.get("/dart/ftp://x/y", &[]).await;
    assert_eq!(r.status, 400);
    assert!(registry.seen().iter().skip(before).all(|s| s.method == "GET" || s.method == "HEAD"));
}

#[tokio::test]
async fn start_up_refuses_a_bad_registry_flag() {
    let dir = support::temp_dir("registry", "flags");
    let cases: [(&str, &str, &str, &str); 4] = [
        ("ftp://reg", "", "dart", "http:// or https://"),
        ("http://", "", "dart", "no host"),
        ("http://reg", "http://origin/x", "dart", "--origin"),
        ("http://reg", "", "/v2/", "--prefix v2"),
    ];
    for (registry, origin, prefix, needle) in cases {
        let flags = NodeFlags {
            registry: registry.into(),
            origin: origin.into(),
            prefix: prefix.into(),
            ..support::loopback_flags(&dir)
        };
        let err = match dart_node::start(&flags).await {
            Ok(_) => panic!("{registry} {origin} {prefix}: started"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(needle), "{registry} {origin} {prefix}: {err}");
    }
}

#[tokio::test]
async fn a_private_blob_answers_the_registry_s_challenge_and_is_read_with_the_client_s_credential()
{
    let registry = Registry::start().await;
    let node = Node::start("private-blob", &registry).await;
    let target = format!("/v2/private/app/blobs/{}", registry.good);
    let refused = node.get(&target, &[]).await;
    assert_eq!(refused.status, 401, "{}", refused.text());
    assert_eq!(refused.header("www-authenticate"), CHALLENGE);
    let read = node.get(&target, &[("authorization", "Bearer client")]).await;
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(read.body[..] == blob()[..]);
    let fetches = registry.seen();
    let with = fetches.iter().filter(|s| s.path == target && s.authorization.is_some()).count();
    assert!(with >= 1, "the blob was fetched with the client's credential");
}

#[tokio::test]
async fn a_blob_redirect_is_not_followed_and_fails_clearly() {
    let registry = Registry::start().await;
    let node = Node::start("redirect", &registry).await;
    let r = node.get(&format!("/v2/cdn/app/blobs/{}", registry.good), &[]).await;
    assert_eq!(r.status, 502, "{}", r.text());
}
