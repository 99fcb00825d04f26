//! A panic in one request must not take the node down: a driver bug injected into one read's
//! exchange fails that read alone; the node keeps serving the others, its invariants hold, and a
//! re-read of the same object returns correct bytes.

use crate::support::*;
use dart_core::node::{Endpoint, Input, IoEvent};
use dart_net_tokio::origin_server::{generate, Behaviour};
use dart_net_tokio::seam::TokioDialer;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const SIZE: u64 = 8 * BLOCK;

/// An origin whose first connection accepts a request and never answers; every later one answers
/// ranges of the generated object correctly.
async fn stalls_once() -> Hostile {
    hostile(|index, mut s| async move {
        if index == 0 {
            let _ = read_head(&mut s).await;
            wait_for_close(&mut s).await;
            return;
        }
        while let Some(head) = read_head(&mut s).await {
            let range = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("range: bytes=").map(str::to_owned))
                .expect("a ranged GET");
            let (a, b) = range.trim().split_once('-').expect("a-b");
            let (a, b): (u64, u64) = (a.parse().expect("start"), b.parse().expect("end"));
            let b = b.min(SIZE - 1);
            let body = generate(SEED, a, (b - a + 1) as usize);
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {a}-{b}/{SIZE}\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            if s.write_all(head.as_bytes()).await.is_err() || s.write_all(&body).await.is_err() {
                return;
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_panicking_request_fails_alone_and_the_node_keeps_serving() {
    // Object a's origin stalls its first exchange (the size probe), keeping the read in flight.
    let stalling = stalls_once().await;
    let fast = origin(Behaviour::Honours, SIZE).await;
    let node = reader_of(
        TokioDialer,
        &[],
        breaker_config(3, PATIENCE),
        dart_core::node::Bounds::default(),
    );
    let a = format!("http://{}/objects/a", stalling.addr);
    let reading = tokio::spawn({
        let (node, a) = (node.clone(), a.clone());
        async move { read(&node, &a, None).await }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let io = loop {
        assert!(tokio::time::Instant::now() < deadline, "the probe was never sent");
        let origin_io = node.with_node(|n| {
            n.exchanges().into_iter().find(|x| x.1 == Endpoint::Origin).map(|x| x.0)
        });
        if let (Some(io), 1) = (origin_io, stalling.accepted()) {
            break io;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    // The shell "reports" body bytes before any head for that exchange: a contract violation the
    // core asserts on.
    let event = IoEvent::Body(bytes::Bytes::from_static(b"out of turn"));
    node.feed(Input::Io { id: io, event });
    assert_eq!(node.counters().panics, 1, "the assertion fired inside the node");
    node.with_node(|n| n.check_invariants());
    let failed = tokio::time::timeout(PATIENCE, reading).await.expect("ends").expect("task");
    let failure = failed.expect_err("the read that panicked is failed");
    assert_eq!((failure.status, failure.committed), (500, false), "{failure:?}");

    // The node goes on serving others, and the same object again, byte for byte.
    let b = read(&node, &fast.url("b"), None).await.expect("another read");
    assert_eq!(b, generate(SEED, 0, SIZE as usize));
    let again = read(&node, &a, None).await.expect("a re-read of the same object");
    assert_eq!(again, generate(SEED, 0, SIZE as usize));
    node.with_node(|n| n.check_invariants());
    assert_eq!(node.with_node(|n| n.live_requests()), 0);
}
