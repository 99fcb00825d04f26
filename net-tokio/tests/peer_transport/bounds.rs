//! The three bounds (peer.md §3.3): dial, response head, whole request. Real sockets run on real
//! time with small bounds far apart; the exact default deadlines run on tokio's paused clock over
//! in-memory streams, where nothing but timers can make progress.

use crate::support::*;
use dart_core::breaker::{HardReason, Observation, Outcome};
use dart_core::codec::wire::block_path;
use dart_core::engine::PeerAnswer;
use dart_core::hash::{BlockKey, ChunkKey};
use dart_core::node::Bounds;
use dart_net_tokio::seam::Dialer;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};

const KEY: BlockKey = BlockKey { chunk: ChunkKey(0xb0b0), block: 9 };
const URL: &str = "http://origin.invalid/objects/a";

#[tokio::test]
async fn the_client_speaks_http1_with_one_second_ten_second_and_thirty_second_bounds() {
    let config = Bounds::default();
    assert_eq!(config.peer_dial, Duration::from_secs(1));
    assert_eq!(config.peer_head, Duration::from_secs(10));
    assert_eq!(config.peer_request, Duration::from_secs(30));
    assert_eq!(config.pool_idle_per_host, 32);

    let (tx, rx) = oneshot::channel::<String>();
    let tx = Arc::new(Mutex::new(Some(tx)));
    let peer = hostile(move |_, mut s| {
        let tx = tx.clone();
        async move {
            let head = read_head(&mut s).await.expect("request");
            if let Some(tx) = tx.lock().expect("lock").take() {
                let _ = tx.send(head);
            }
            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n").await;
        }
    })
    .await;
    let answer = peer_client(config).fetch_block(&peer.peer_addr(), KEY, URL, 7, 4096).await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::Miss));
    let head = rx.await.expect("head").to_ascii_lowercase();
    let request_line = format!("get {} http/1.1\r\n", block_path(KEY));
    assert!(head.starts_with(&request_line), "not HTTP/1.1 or wrong path: {head:?}");
    assert!(head.contains(&format!("\r\nx-dart-origin: {URL}\r\n")), "{head:?}");
    assert!(head.contains("\r\nx-dart-hop: 7\r\n"), "{head:?}");
    assert!(head.contains("\r\nx-dart-node: reader\r\n"), "{head:?}");
}

#[tokio::test]
async fn a_closed_port_is_a_dial_failure_that_opens_the_circuit_at_once() {
    let addr = closed_addr().to_string();
    let answer = peer_client(Bounds::default()).fetch_block(&addr, KEY, URL, 0, 4096).await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::DialFailed));
    assert_eq!(Observation::DialFailed.outcome(), Outcome::HardFailure(HardReason::Dial));
}

#[tokio::test(start_paused = true)]
async fn a_host_that_never_answers_the_dial_is_given_up_on_at_the_dial_bound() {
    let config = Bounds::default();
    let client = fetcher_with(BlackHoleDialer, config);
    let started = tokio::time::Instant::now();
    let answer = client.fetch_block("gone.test:9000", KEY, URL, 0, 4096).await;
    let took = started.elapsed();
    assert_eq!(answer, PeerAnswer::Failed(Observation::DialFailed));
    assert!(took >= config.peer_dial, "gave up after {took:?}");
    assert!(took < config.peer_dial + Duration::from_millis(10), "gave up after {took:?}");
}

/// A peer that accepts and reads the request but never sends a byte.
async fn silent() -> Hostile {
    hostile(|_, mut s| async move {
        let _ = read_head(&mut s).await;
        wait_for_close(&mut s).await;
    })
    .await
}

/// A peer that sends a full response head, then stalls the body forever.
async fn stalls_body<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(mut s: S) {
    let _ = read_head(&mut s).await;
    let head = ok_head("Content-Length: 4112\r\n");
    let _ = s.write_all(head.as_bytes()).await;
    let _ = s.write_all(&[0x5a; 100]).await;
    wait_for_close(&mut s).await;
}

#[tokio::test]
async fn a_silent_peer_is_cut_loose_at_the_header_bound_well_before_the_request_bound() {
    let peer = silent().await;
    let (header, request) = (Duration::from_millis(100), Duration::from_secs(10));
    let started = Instant::now();
    let answer = peer_client(bounds(header, request))
        .fetch_block(&peer.peer_addr(), KEY, URL, 0, 4096)
        .await;
    let took = started.elapsed();
    assert_eq!(answer, PeerAnswer::Failed(Observation::TimedOut));
    assert_eq!(Observation::TimedOut.outcome(), Outcome::SoftFailure);
    assert!(took >= header, "timed out after {took:?}");
    assert!(took < request / 2, "timed out after {took:?}");
}

#[tokio::test]
async fn a_peer_stalling_mid_body_is_cut_loose_at_the_request_bound() {
    let peer = hostile(|_, s| stalls_body(s)).await;
    let (header, request) = (Duration::from_millis(100), Duration::from_millis(400));
    let started = Instant::now();
    let answer = peer_client(bounds(header, request))
        .fetch_block(&peer.peer_addr(), KEY, URL, 0, 4096)
        .await;
    let took = started.elapsed();
    assert_eq!(answer, PeerAnswer::Failed(Observation::TimedOut));
    // Past the header bound: the head had arrived, so only the request bound can have fired.
    assert!(took >= request, "timed out after {took:?}");
    assert!(took < Duration::from_secs(5), "timed out after {took:?}");
}

/// Dials in-memory streams and hands each server end to the test.
#[derive(Clone)]
struct DuplexDialer {
    accepted: mpsc::UnboundedSender<DuplexStream>,
}

impl Dialer for DuplexDialer {
    type Io = DuplexStream;

    async fn dial(&self, _host: &str, _port: u16) -> io::Result<DuplexStream> {
        let (client, server) = tokio::io::duplex(64 * 1024);
        self.accepted.send(server).map_err(|_| io::Error::other("no server"))?;
        Ok(client)
    }
}

/// A paused-clock peer running `script` on every in-memory connection.
fn in_memory<F, Fut>(script: F) -> Fetcher<DuplexDialer>
where
    F: Fn(DuplexStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(s) = rx.recv().await {
            tokio::spawn(script(s));
        }
    });
    fetcher_with(DuplexDialer { accepted: tx }, Bounds::default())
}

#[tokio::test(start_paused = true)]
async fn with_default_bounds_a_fresh_node_gives_a_silent_peer_one_and_a_half_head_floors() {
    // A fresh node has no estimate of peer fetch times: it waits 1.5 × the 1 s floor, not the
    // 10 s cap, so a stalled peer met cold costs a read 1.5 s.
    let client = in_memory(|mut s| async move {
        let _ = read_head(&mut s).await;
        wait_for_close(&mut s).await;
    });
    let started = tokio::time::Instant::now();
    let answer = client.fetch_block("peer.test:9000", KEY, URL, 0, 4096).await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::TimedOut));
    let took = started.elapsed();
    let b = Bounds::default();
    let bound = b.cold_peer_head();
    assert_eq!(bound, Duration::from_millis(1500));
    assert!(took >= bound && took < bound + Duration::from_millis(10), "after {took:?}");
}

#[tokio::test(start_paused = true)]
async fn with_default_bounds_a_stalled_body_times_out_at_the_progress_bound() {
    // A body that stops moving is cut off after the estimated block time plus the margin; with
    // no estimate yet (a fresh node), twice the margin — not the 30 s whole-request bound.
    let client = in_memory(stalls_body);
    let started = tokio::time::Instant::now();
    let answer = client.fetch_block("peer.test:9000", KEY, URL, 0, 4096).await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::TimedOut));
    let took = started.elapsed();
    let bound = 2 * Bounds::default().peer_progress_margin;
    assert!(took >= bound && took < bound + Duration::from_millis(10), "after {took:?}");
    assert!(took < Bounds::default().peer_request);
}
