//! RAM-tier blocks read often are sealed and their answers sent without a copy
//! (`dart_net_tokio::sealed`), byte for byte, and a sealed block the tier lets go is closed.
//!
//! Its own test binary: the counters it reads are the process's, so no other test's node may add
//! to them.

use bytes::Bytes;
use dart_net_tokio::origin_server::{generate, Behaviour};
use dart_net_tokio::seam::{SeamConnector, TokioDialer};
use dart_node::cli::NodeFlags;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant};

mod support;

const BLOCK: u64 = 64 * 1024;

type C = Client<SeamConnector<TokioDialer>, Empty<Bytes>>;

async fn get(c: &C, url: &str, range: Option<(u64, u64)>) -> Bytes {
    let mut req = http::Request::builder().uri(url);
    if let Some((s, e)) = range {
        req = req.header(http::header::RANGE, format!("bytes={s}-{e}"));
    }
    let resp = c.request(req.body(Empty::new()).expect("request")).await.expect("response");
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// The value of metric `name` (a plain counter or gauge) on the node's admin plane.
async fn metric(c: &C, admin: std::net::SocketAddr, name: &str) -> u64 {
    let text = get(c, &format!("http://{admin}/metrics"), None).await;
    let text = String::from_utf8(text.to_vec()).expect("utf8");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Waits (bounded) until metric `name` satisfies `ok`; the sealing runs on the node's blocking
/// pool after the hit that made it due, so the test watches for its effect.
async fn until(c: &C, admin: std::net::SocketAddr, name: &str, ok: impl Fn(u64) -> bool) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = metric(c, admin, name).await;
        if ok(v) || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_read_often_are_sealed_and_sent_without_a_copy_then_closed_when_evicted() {
    const SEED_A: u64 = 7;
    const SEED_B: u64 = 8;
    let a_size = 3 * BLOCK;
    let b_size = 4 * BLOCK;
    let a = support::origin(SEED_A, Behaviour::Honours, a_size).await;
    let b = support::origin(SEED_B, Behaviour::Honours, b_size).await;
    let dir = support::temp_dir("sealed", "answers");
    let flags = NodeFlags {
        cache_size: 64 * BLOCK,
        mem_size: 4 * BLOCK,
        chunk_size: 4 * BLOCK,
        block_size: BLOCK,
        ..support::loopback_flags(&dir)
    };
    let n = dart_node::start(&flags).await.expect("node starts");
    let admin = n.admin_addr.expect("admin on");
    let c: C = Client::builder(TokioExecutor::new())
        .build(SeamConnector::new(TokioDialer, Duration::from_secs(2)));
    let url_a = format!("http://{}/dart/http://{}/a", n.client_addr, a.addr);
    let url_b = format!("http://{}/dart/http://{}/b", n.client_addr, b.addr);
    let want_a = generate(SEED_A, 0, a_size as usize);

    // A cold read, then two hits per block: every block of `a` is due to be sealed.
    for _ in 0..3 {
        assert!(get(&c, &url_a, None).await == want_a, "whole read, byte for byte");
    }
    let sealed = until(&c, admin, "dart_sealed_blocks", |v| v >= 3).await;
    assert_eq!(sealed, 3, "each block of a sealed once");
    assert_eq!(a.stats.requests(), 4, "a probe and three blocks: hits never went upstream");

    // Now its answers leave with sendfile: whole, a range inside a block, one across blocks.
    let sent0 = metric(&c, admin, "dart_sent_without_copy_bytes_total").await;
    assert!(get(&c, &url_a, None).await == want_a, "a sealed whole read, byte for byte");
    let (s, e) = (BLOCK / 2, BLOCK / 2 + 40_000 - 1);
    let got = get(&c, &url_a, Some((s, e))).await;
    assert!(got[..] == want_a[s as usize..=e as usize], "a range inside a block");
    let (s, e) = (BLOCK - 20_000, 2 * BLOCK + 30_000);
    let got = get(&c, &url_a, Some((s, e))).await;
    assert!(got[..] == want_a[s as usize..=e as usize], "a range across three blocks");
    let sent = metric(&c, admin, "dart_sent_without_copy_bytes_total").await - sent0;
    assert!(sent >= a_size + 40_000, "the answers went out without a copy: {sent} bytes");

    // `b` fills the tier (read once: not due), evicting every sealed block: their memory files
    // close once no answer holds them.
    let want_b = generate(SEED_B, 0, b_size as usize);
    assert!(get(&c, &url_b, None).await == want_b);
    let left = until(&c, admin, "dart_sealed_blocks", |v| v == 0).await;
    assert_eq!(left, 0, "evicted sealed blocks are closed");
    // And `a` still reads right, now from the disk tier.
    assert!(get(&c, &url_a, None).await == want_a);
}
