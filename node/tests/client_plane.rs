//! End-to-end tests of a single node on loopback against real origin servers that honour Range,
//! ignore it, 404, hide the total, truncate, or accept only presigned GETs.

use bytes::Bytes;
use dart_net_tokio::origin_server::{generate, Behaviour};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_node::cli::NodeFlags;
use http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, TRANSFER_ENCODING};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

mod support;
use support::{Origin, TempDir};

async fn origin(behaviour: Behaviour, size: u64) -> Origin {
    support::origin(SEED, behaviour, size).await
}

fn temp_dir(name: &str) -> TempDir {
    support::temp_dir("it", name)
}

const SEED: u64 = 42;
const BLOCK: u64 = 64 * 1024;

/// The helper node's flags: small blocks and caches, a 2 s drain.
fn flags(dir: &TempDir) -> NodeFlags {
    NodeFlags {
        cache_size: 64 * BLOCK,
        mem_size: 8 * BLOCK,
        owned_fraction: None,
        chunk_size: 4 * BLOCK,
        block_size: BLOCK,
        drain_secs: 2,
        ..support::loopback_flags(dir)
    }
}

async fn node(dir: &TempDir) -> dart_node::Running {
    dart_node::start(&flags(dir)).await.expect("node starts")
}

type C = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

fn client() -> C {
    Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)))
}

struct Got {
    status: u16,
    headers: http::HeaderMap,
    body: Result<Bytes, String>,
}

async fn send(c: &C, method: http::Method, url: &str, range: Option<&str>) -> Got {
    let mut req = http::Request::builder().method(method).uri(url);
    if let Some(r) = range {
        req = req.header(http::header::RANGE, r);
    }
    let resp = c.request(req.body(Empty::new()).expect("request")).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.map(|b| b.to_bytes()).map_err(|e| e.to_string());
    Got { status, headers, body }
}

fn url(node: &dart_node::Running, origin: &Origin, suffix: &str) -> String {
    format!("http://{}/dart/http://{}/obj{suffix}", node.client_addr, origin.addr)
}

fn header(g: &Got, name: http::header::HeaderName) -> Option<&str> {
    g.headers.get(name).and_then(|v| v.to_str().ok())
}

#[tokio::test]
async fn full_get_returns_every_byte_with_content_length_and_never_chunked() {
    let size = 5 * BLOCK + 123;
    let o = origin(Behaviour::Honours, size).await;
    let d = temp_dir("full");
    let n = node(&d).await;
    let g = send(&client(), http::Method::GET, &url(&n, &o, ""), None).await;
    assert_eq!(g.status, 200);
    assert_eq!(header(&g, CONTENT_LENGTH), Some(size.to_string().as_str()));
    assert_eq!(header(&g, ACCEPT_RANGES), Some("bytes"));
    assert!(g.headers.get(TRANSFER_ENCODING).is_none(), "block path is never chunked");
    assert_eq!(g.body.expect("body")[..], generate(SEED, 0, size as usize)[..]);
}

#[tokio::test]
async fn ranges_return_206_with_exact_bytes_and_unsatisfiable_ones_416() {
    let size = 3 * BLOCK + 10;
    let o = origin(Behaviour::Honours, size).await;
    let d = temp_dir("ranges");
    let n = node(&d).await;
    let c = client();
    let u = url(&n, &o, "");
    let open_ended = format!("bytes={}-", BLOCK - 5);
    let cases: [(&str, u64, u64); 4] = [
        ("bytes=100-199", 100, 199),
        ("bytes=-10", size - 10, size - 1),
        (&open_ended, BLOCK - 5, size - 1),
        ("bytes=0-18446744073709551615", 0, size - 1),
    ];
    for (r, a, b) in cases {
        let g = send(&c, http::Method::GET, &u, Some(r)).await;
        assert_eq!(g.status, 206, "{r}");
        assert_eq!(
            header(&g, CONTENT_RANGE),
            Some(format!("bytes {a}-{b}/{size}").as_str()),
            "{r}"
        );
        let body = g.body.expect("body");
        assert_eq!(body[..], generate(SEED, a, (b - a + 1) as usize)[..], "{r}");
    }
    for r in
        ["bytes=18446744073709551615-", "bytes=0-1,5-6", "items=0-1", &format!("bytes={size}-")]
    {
        let g = send(&c, http::Method::GET, &u, Some(r)).await;
        assert_eq!(g.status, 416, "{r}");
        assert_eq!(header(&g, CONTENT_RANGE), Some(format!("bytes */{size}").as_str()), "{r}");
    }
}

#[tokio::test]
async fn head_is_answered_without_ever_sending_head_upstream() {
    let size = 2 * BLOCK;
    let o = origin(Behaviour::PresignedGetOnly, size).await;
    let d = temp_dir("head");
    let n = node(&d).await;
    let g = send(&client(), http::Method::HEAD, &url(&n, &o, "?sig=good"), Some("bytes=0-9")).await;
    assert_eq!(g.status, 206);
    assert_eq!(header(&g, CONTENT_LENGTH), Some("10"));
    assert_eq!(o.stats.heads(), 0);
    assert_eq!(o.stats.requests(), 1, "one ranged GET probe");
}

#[tokio::test]
async fn a_range_blind_origin_is_proxied_verbatim_and_nothing_is_cached() {
    let size = 3 * BLOCK;
    let o = origin(Behaviour::IgnoresRange, size).await;
    let d = temp_dir("blind");
    let n = node(&d).await;
    let c = client();
    let g = send(&c, http::Method::GET, &url(&n, &o, ""), Some("bytes=0-9")).await;
    assert_eq!(g.status, 200, "the origin's own status");
    assert_eq!(g.body.expect("body")[..], generate(SEED, 0, size as usize)[..]);
    assert_eq!(o.stats.requests(), 2, "probe + proxied GET");
    let g = send(&c, http::Method::HEAD, &url(&n, &o, ""), None).await;
    assert_eq!((g.status, header(&g, CONTENT_LENGTH)), (200, Some(size.to_string().as_str())));
    assert_eq!(o.stats.requests(), 3, "the mark is remembered; HEAD goes upstream as GET");
    assert_eq!(o.stats.heads(), 0);
    let s = n.driver.store().stats();
    assert_eq!(s.owned_blocks + s.borrowed_blocks, 0);
}

#[tokio::test]
async fn an_upstream_404_reaches_the_client_as_404() {
    let o = origin(Behaviour::NotFound, 10).await;
    let d = temp_dir("404");
    let n = node(&d).await;
    assert_eq!(send(&client(), http::Method::GET, &url(&n, &o, ""), None).await.status, 404);
}

#[tokio::test]
async fn a_hidden_total_is_502_and_nothing_is_learnt() {
    let o = origin(Behaviour::HidesTotal, 10).await;
    let d = temp_dir("hidden");
    let n = node(&d).await;
    let c = client();
    assert_eq!(send(&c, http::Method::GET, &url(&n, &o, ""), None).await.status, 502);
    assert_eq!(send(&c, http::Method::GET, &url(&n, &o, ""), None).await.status, 502);
    assert_eq!(o.stats.requests(), 2, "each read probes again");
}

#[tokio::test]
async fn a_truncating_origin_gets_a_clean_502_and_poisons_nothing() {
    let o = origin(Behaviour::Truncates, 2 * BLOCK).await;
    let d = temp_dir("trunc");
    let n = node(&d).await;
    let g = send(&client(), http::Method::GET, &url(&n, &o, ""), None).await;
    // The head waits for the first block's bytes, so a first block that fails is a clean 502
    // with a reason, never a 200 followed by a cut body.
    assert_eq!(g.status, 502);
    let text = g.body.expect("a complete error body");
    assert!(String::from_utf8_lossy(&text).contains("body length"), "{text:?}");
    let s = n.driver.store().stats();
    assert_eq!(s.owned_blocks + s.borrowed_blocks, 0);
}

#[tokio::test]
async fn bad_methods_and_targets_are_refused_clearly() {
    let o = origin(Behaviour::Honours, 10).await;
    let d = temp_dir("bad");
    let n = node(&d).await;
    let c = client();
    let g = send(&c, http::Method::POST, &url(&n, &o, ""), None).await;
    assert_eq!(g.status, 405);
    assert_eq!(header(&g, http::header::ALLOW), Some("GET, HEAD"));
    let g = send(&c, http::Method::GET, &format!("http://{}/nope/http://x/y", n.client_addr), None)
        .await;
    assert_eq!(g.status, 400);
    let g = send(&c, http::Method::GET, &format!("http://{}/dart/ftp://x/y", n.client_addr), None)
        .await;
    assert_eq!(g.status, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cold_readers_cost_one_origin_request_per_distinct_block() {
    let blocks = 12u64;
    let size = blocks * BLOCK;
    let o = origin(Behaviour::Honours, size).await;
    let d = temp_dir("herd");
    let n = node(&d).await;
    let c = client();
    let u = url(&n, &o, "");
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let (c, u) = (c.clone(), u.clone());
        // Overlapping windows: every reader covers blocks i%4 .. i%4+8.
        let a = (i % 4) * BLOCK + i;
        let b = a + 8 * BLOCK - 1;
        tasks.push(tokio::spawn(async move {
            let g = send(&c, http::Method::GET, &u, Some(&format!("bytes={a}-{b}"))).await;
            assert_eq!(g.body.expect("body")[..], generate(SEED, a, (b - a + 1) as usize)[..]);
        }));
    }
    for t in tasks {
        t.await.expect("reader");
    }
    // Distinct blocks touched: 0 ..= 3 + 8 (the last reader's window ends inside block 11).
    let distinct = 12;
    assert_eq!(o.stats.requests(), 1 + distinct, "one probe plus one fetch per distinct block");
    let metrics = n.driver.metrics().encode();
    assert!(metrics.contains("dart_block_source_total{source=\"origin\"}"), "{metrics}");
}

#[tokio::test]
async fn metrics_and_health_are_served_on_the_admin_plane() {
    let o = origin(Behaviour::Honours, 2 * BLOCK).await;
    let d = temp_dir("admin");
    let n = node(&d).await;
    let c = client();
    send(&c, http::Method::GET, &url(&n, &o, ""), None).await;
    send(&c, http::Method::GET, &url(&n, &o, ""), None).await;
    let admin = n.admin_addr.expect("admin on");
    let g = send(&c, http::Method::GET, &format!("http://{admin}/healthz"), None).await;
    assert_eq!((g.status, g.body.as_deref().ok()), (200, Some(&b"ok\n"[..])));
    let g = send(&c, http::Method::GET, &format!("http://{admin}/metrics"), None).await;
    let text = String::from_utf8(g.body.expect("body").to_vec()).expect("utf8");
    assert!(text.contains("dart_block_source_total{source=\"origin\"} 2"), "{text}");
    assert!(text.contains("dart_block_source_total{source=\"cache\"} 2"), "{text}");
    assert!(text.contains("dart_object_version_total{event=\"changed\"} 0"), "{text}");
    assert!(
        text.contains(&format!("dart_bytes_total{{direction=\"client\"}} {}", 4 * BLOCK)),
        "{text}"
    );
}

#[tokio::test]
async fn shutdown_force_closes_a_response_that_outlasts_the_drain_bound() {
    // 32 blocks at 512 KiB/s: about 4 s of body against the helper node's 2 s drain. The origin
    // paces each connection, so read-ahead (three windows at once) would cut it to about 1.4 s.
    let size = 32 * BLOCK;
    let o = origin(Behaviour::Slow { bytes_per_second: 512 * 1024 }, size).await;
    let d = temp_dir("force");
    let flags = NodeFlags { origin_read_ahead: 0, ..flags(&d) };
    let n = dart_node::start(&flags).await.expect("node starts");
    let req = http::Request::get(url(&n, &o, "")).body(Empty::new()).expect("request");
    let resp = client().request(req).await.expect("response head");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a first frame").expect("no error yet");
    assert!(first.is_data());

    assert_eq!(n.shutdown().await, dart_net_tokio::server::Drained::TimedOut);
    // The runtime lives on, so only an explicit abort can have closed the connection by now.
    let rest = tokio::time::timeout(Duration::from_secs(5), body.collect())
        .await
        .expect("the connection is already closed");
    assert!(rest.is_err(), "a force-closed response must not look complete");
}
