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
/// The operator's credential (`u:p`) and the token it buys.
const BASIC: &str = "Basic dTpw";
const TOKEN: &str = "good-token";
const BEARER: &str = "Bearer good-token";
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
            async move {
                if req.uri().path() == "/slow-token" {
                    // Long enough for a requester to give up while the exchange runs.
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                }
                answer(&req, &log, &g, &b, addr)
            }
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
    addr: SocketAddr,
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
    let authorization = header("authorization");
    let challenge = |realm: &str| {
        let mut r = body::plain(401, r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#);
        let value = format!(r#"Bearer realm="http://{addr}/{realm}",service="reg""#);
        r.headers_mut().insert("www-authenticate", value.parse().expect("header"));
        r
    };
    let mut r = match path {
        // The token server: Basic u:p buys a token.
        "/token" | "/slow-token" if authorization.as_deref() == Some(BASIC) => {
            body::plain(200, &format!(r#"{{"token":"{TOKEN}","expires_in":300}}"#))
        }
        "/token" | "/slow-token" => body::plain(401, "bad credentials"),
        // Repositories behind the token server, and one behind Basic.
        p if p.starts_with("/v2/tok/") && authorization.as_deref() != Some(BEARER) => {
            challenge("token")
        }
        p if p.starts_with("/v2/slowtok/") && authorization.as_deref() != Some(BEARER) => {
            challenge("slow-token")
        }
        p if p.starts_with("/v2/basic/") && authorization.as_deref() != Some(BASIC) => {
            let mut r = body::plain(401, "basic auth required");
            r.headers_mut()
                .insert("www-authenticate", r#"Basic realm="reg""#.parse().expect("header"));
            r
        }
        p if p.ends_with("/manifests/latest")
            && ["/v2/tok/", "/v2/slowtok/", "/v2/basic/"].iter().any(|r| p.starts_with(r)) =>
        {
            body::plain(200, MANIFEST)
        }
        p if p == format!("/v2/tok/app/blobs/{good}") => ranged(req, &blob()),
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
        p if p.starts_with("/v2/limited/") => {
            body::plain(429, r#"{"errors":[{"code":"TOOMANYREQUESTS"}]}"#)
        }
        p if p.starts_with("/v2/broken/") => body::plain(500, "internal error"),
        p if p == format!("/v2/private/app/blobs/{good}") && header("authorization").is_none() => {
            let mut r = body::plain(401, r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#);
            r.headers_mut().insert("www-authenticate", CHALLENGE.parse().expect("header"));
            r
        }
        p if p == format!("/v2/private/app/blobs/{good}") => ranged(req, &blob()),
        // Blobs in a CDN: the registry redirects to another host (the same server under the
        // name localhost), which serves them to anyone with the URL.
        p if p == format!("/v2/cdn/app/blobs/{good}") => {
            redirect(&format!("http://localhost:{}/cdn/{good}?sig=1", addr.port()))
        }
        p if p == format!("/cdn/{good}") => ranged(req, &blob()),
        p if p == format!("/v2/metadata/app/blobs/{bad}") => {
            redirect("http://169.254.169.254/latest/meta-data/")
        }
        p if p == format!("/v2/loop/app/blobs/{bad}") => redirect(p),
        p if p == format!("/v2/lib/app/blobs/{bad}") => ranged(req, &blob()),
        _ => body::plain(404, r#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#),
    };
    r.headers_mut()
        .insert("docker-distribution-api-version", "registry/2.0".parse().expect("header"));
    r
}

/// A `307` to `location`.
fn redirect(location: &str) -> Response<ResponseBody> {
    let mut r = body::plain(307, "");
    r.headers_mut().insert("location", location.parse().expect("header"));
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
        Node::start_with(name, registry, |_, _| {}).await
    }

    async fn start_with(
        name: &str,
        registry: &Registry,
        extra: impl FnOnce(&mut NodeFlags, &std::path::Path),
    ) -> Node {
        let dir = support::temp_dir("registry", name);
        std::fs::create_dir_all(&dir.0).expect("node dir");
        let mut flags = NodeFlags {
            registry: format!("http://{}", registry.addr),
            cache_size: 64 * BLOCK,
            mem_size: 8 * BLOCK,
            block_size: BLOCK,
            chunk_size: 4 * BLOCK,
            drain_secs: 1,
            ..support::loopback_flags(&dir)
        };
        extra(&mut flags, &dir.0);
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
    assert_eq!(sample(&metrics, "dart_objects_distrusted_total"), 2);
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
async fn a_blob_redirect_is_followed_without_the_credential_and_never_to_a_refused_address() {
    let registry = Registry::start().await;
    let node = credentialed("redirect", &registry).await;
    let target = format!("/v2/cdn/app/blobs/{}", registry.good);
    let read = node.get(&target, &[]).await;
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(read.body[..] == blob()[..], "the CDN's bytes, checked against the digest");
    assert_eq!(read.header("docker-content-digest"), registry.good);
    let seen = registry.seen();
    let cdn: Vec<_> = seen.iter().filter(|s| s.path.starts_with("/cdn/")).collect();
    assert!(!cdn.is_empty(), "the blocks came from the CDN");
    assert!(cdn.iter().all(|s| s.authorization.is_none()), "the CDN got a credential: {cdn:#?}");
    assert!(cdn.iter().all(|s| s.range.is_some()), "the CDN was asked for blocks");
    let asked = seen.iter().filter(|s| s.path == target);
    assert!(asked.clone().all(|s| s.authorization.as_deref() == Some(BASIC)), "{seen:#?}");

    // A redirect to a cloud metadata address is refused like a direct read of it. (Another
    // digest: the good one is cached now, whatever repository names it.)
    let metadata = node.get(&format!("/v2/metadata/app/blobs/{}", registry.bad), &[]).await;
    assert_eq!(metadata.status, 403, "{}", metadata.text());
    assert!(!metadata.header("x-dart-refused").is_empty());
    // A redirect loop ends after ten hops with the registry's last answer: no size, 502.
    let looped = node.get(&format!("/v2/loop/app/blobs/{}", registry.bad), &[]).await;
    assert_eq!(looped.status, 502, "{}", looped.text());
    let hops = registry.seen().iter().filter(|s| s.path.starts_with("/v2/loop/")).count();
    assert_eq!(hops, 11, "the first request and ten redirects");
}

/// A node with `--registry-auth` naming the registry's `host:port` with `u:p`.
async fn credentialed(name: &str, registry: &Registry) -> Node {
    let key = registry.addr.to_string();
    Node::start_with(name, registry, |flags, dir| {
        let file = dir.join("auth.json");
        let json = format!(r#"{{"{key}": {{"username": "u", "password": "p"}}}}"#);
        std::fs::write(&file, json).expect("auth file");
        flags.registry_auth = Some(file);
    })
    .await
}

impl Registry {
    fn token_requests(&self) -> usize {
        self.seen().iter().filter(|s| s.path.ends_with("token")).count()
    }
}

#[tokio::test]
async fn the_bearer_exchange_buys_one_token_per_repository_and_reuses_it() {
    let registry = Registry::start().await;
    let node = credentialed("bearer", &registry).await;
    let blob_path = format!("/v2/tok/app/blobs/{}", registry.good);
    let read = node.get(&blob_path, &[]).await;
    assert_eq!(read.status, 200, "{}", read.text());
    assert!(read.body[..] == blob()[..]);
    let manifest = node.get("/v2/tok/app/manifests/latest", &[]).await;
    assert_eq!((manifest.status, manifest.text().trim()), (200, MANIFEST));
    assert_eq!(registry.token_requests(), 1, "one token for the repository, then the cache");
    let token = registry.seen().into_iter().find(|s| s.path == "/token").expect("asked");
    assert_eq!(token.authorization.as_deref(), Some(BASIC));
    assert_eq!(token.query.as_deref(), Some("service=reg&scope=repository%3Atok%2Fapp%3Apull"));

    // Eight cold requests for another repository at once: one exchange.
    let url = node.url("/v2/tok/other/manifests/latest");
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { support::get(&url, &[]).await })
        })
        .collect();
    for read in reads {
        let r = read.await.expect("a read task");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(registry.token_requests(), 2, "one exchange for eight cold requests");
    let admin = node.running.admin_addr.expect("admin on");
    let metrics = support::get(&format!("http://{admin}/metrics"), &[]).await.text();
    assert_eq!(sample(&metrics, "dart_registry_token_exchanges_total{result=\"ok\"}"), 2);
    assert_eq!(sample(&metrics, "dart_registry_token_exchanges_total{result=\"failed\"}"), 0);
}

#[tokio::test]
async fn a_requester_that_leaves_mid_exchange_fails_nobody_else() {
    let registry = Registry::start().await;
    let node = credentialed("leader", &registry).await;
    // The leader gives up while the (slow) token exchange runs.
    let leader = node.get("/v2/slowtok/app/manifests/latest", &[]);
    let gave_up = tokio::time::timeout(std::time::Duration::from_millis(100), leader).await;
    assert!(gave_up.is_err(), "the token server is slower than the leader's patience");
    let follower = node.get("/v2/slowtok/app/manifests/latest", &[]).await;
    assert_eq!(follower.status, 200, "{}", follower.text());
    assert_eq!(registry.token_requests(), 1, "the follower joined the leader's exchange");
}

#[tokio::test]
async fn basic_credentials_answer_a_basic_challenge() {
    let registry = Registry::start().await;
    let node = credentialed("basic", &registry).await;
    let r = node.get("/v2/basic/app/manifests/latest", &[]).await;
    assert_eq!((r.status, r.text().trim()), (200, MANIFEST));
    assert_eq!(registry.token_requests(), 0);
    let sent: Vec<_> =
        registry.seen().into_iter().filter(|s| s.path.starts_with("/v2/basic/")).collect();
    assert_eq!(sent.last().and_then(|s| s.authorization.as_deref()), Some(BASIC));
}

#[tokio::test]
async fn the_client_s_own_authorization_wins_and_its_401_is_returned() {
    let registry = Registry::start().await;
    let node = credentialed("client-wins", &registry).await;
    // Warm the token cache for the repository first.
    assert_eq!(node.get("/v2/tok/app/manifests/latest", &[]).await.status, 200);
    let exchanges = registry.token_requests();
    let r =
        node.get("/v2/tok/app/manifests/latest", &[("authorization", "Bearer client-token")]).await;
    assert_eq!(r.status, 401, "the client's refused credential is answered as is");
    assert!(r.header("www-authenticate").starts_with("Bearer realm="));
    let last = registry.seen().into_iter().rfind(|s| s.path.starts_with("/v2/tok/"));
    assert_eq!(last.and_then(|s| s.authorization).as_deref(), Some("Bearer client-token"));
    assert_eq!(registry.token_requests(), exchanges, "no exchange on the client's behalf");
}

#[tokio::test]
async fn another_host_never_gets_the_credential() {
    let registry = Registry::start().await;
    let node = credentialed("other-host", &registry).await;
    // The same server under another name (as a CDN would be): the key names 127.0.0.1:<port>.
    let other = format!("http://localhost:{}/v2/basic/app/manifests/latest", registry.addr.port());
    let r = node.get(&format!("/dart/{other}"), &[("range", "bytes=0-9")]).await;
    assert_eq!(r.status, 401, "{}", r.text());
    let asked: Vec<_> =
        registry.seen().into_iter().filter(|s| s.path.starts_with("/v2/basic/")).collect();
    assert!(!asked.is_empty());
    assert!(asked.iter().all(|s| s.authorization.is_none()), "{asked:#?}");
}

#[tokio::test]
async fn a_bad_credentials_file_stops_the_start() {
    let registry = Registry::start().await;
    for (name, text, needle) in [
        ("missing", None, "reading --registry-auth"),
        ("not-json", Some("{"), "invalid --registry-auth"),
        ("empty-host", Some(r#"{"": {"username": "u"}}"#), "empty host"),
        ("empty-entry", Some(r#"{"h": {}}"#), "neither username nor password"),
    ] {
        let dir = support::temp_dir("registry", &format!("auth-{name}"));
        std::fs::create_dir_all(&dir.0).expect("dir");
        let file = dir.0.join("auth.json");
        if let Some(text) = text {
            std::fs::write(&file, text).expect("write");
        }
        let flags = NodeFlags {
            registry: format!("http://{}", registry.addr),
            registry_auth: Some(file),
            ..support::loopback_flags(&dir)
        };
        let err = match dart_node::start(&flags).await {
            Ok(_) => panic!("{name}: started"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(needle), "{name}: {err}");
    }
}

#[tokio::test]
async fn upstream_statuses_keep_their_meaning_on_both_routes() {
    let registry = Registry::start().await;
    let node = Node::start("statuses", &registry).await;
    let digest = &registry.good;
    for (path, blob, manifest) in [("limited", 429, 429), ("broken", 502, 500), ("nope", 404, 404)]
    {
        let r = node.get(&format!("/v2/{path}/app/blobs/{digest}"), &[]).await;
        assert_eq!(r.status, blob, "blob of {path}: {}", r.text());
        let r = node.get(&format!("/v2/{path}/app/manifests/latest"), &[]).await;
        assert_eq!(r.status, manifest, "manifest of {path}: {}", r.text());
    }
}
