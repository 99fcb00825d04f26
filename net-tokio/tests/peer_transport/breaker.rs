//! The transport and the breaker together (peer.md §3.5): a reader node's engine routes misses to
//! one parent over real sockets, and its circuit must open, stay open, recover, and ignore
//! answers it should ignore — caller cancellation, misses, late results of older generations.

use crate::support::*;
use dart_core::breaker::CircuitState;
use dart_core::codec::wire::parse_block_path;
use dart_core::node::Bounds as PeerConfig;
use dart_core::node::{Headers, Inbound, Plane};
use dart_net_tokio::origin_server::Behaviour;
use dart_net_tokio::seam::TokioDialer;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

const SIZE: u64 = 201 * BLOCK;
const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_millis(100);

/// What a scripted parent does with one request.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// The exact block.
    Good,
    /// The block minus its last byte, with a matching `Content-Length`.
    Short,
    /// `500`: a genuine relay fault.
    Fail,
    /// `404`.
    Miss,
    /// Wait for the test's release, then answer with the block.
    HoldThenGood,
    /// Wait for the test's release, then answer `500`.
    HoldThenFail,
}

/// A parent whose `n`-th request (counted across connections, from 0) gets `plan(n)`.
struct Scripted {
    peer: Hostile,
    requests: Arc<AtomicU64>,
    arrivals: mpsc::UnboundedReceiver<u64>,
    release: watch::Sender<bool>,
}

impl Scripted {
    /// Waits for the next request to arrive and returns its index.
    async fn arrival(&mut self) -> u64 {
        let next = tokio::time::timeout(PATIENCE, self.arrivals.recv());
        next.await.expect("a request arrives").expect("server alive")
    }

    fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn scripted(plan: fn(u64) -> Step) -> Scripted {
    let requests = Arc::new(AtomicU64::new(0));
    let (arrived, arrivals) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let counter = requests.clone();
    let peer = hostile(move |_, mut s| {
        let (counter, arrived, mut released) = (counter.clone(), arrived.clone(), released.clone());
        async move {
            while let Some(head) = read_head(&mut s).await {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let _ = arrived.send(n);
                let path = head.split(' ').nth(1).expect("request line");
                let block = parse_block_path(path).expect("block path").block;
                let step = plan(n);
                if matches!(step, Step::HoldThenGood | Step::HoldThenFail) {
                    let _ = released.wait_for(|r| *r).await;
                }
                let reply = match step {
                    Step::Good | Step::HoldThenGood => reply_with(&block_bytes(SIZE, block)),
                    Step::Short => {
                        let data = block_bytes(SIZE, block);
                        reply_with(&data[..data.len() - 1])
                    }
                    Step::Fail | Step::HoldThenFail => {
                        b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n".to_vec()
                    }
                    Step::Miss => b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                };
                if s.write_all(&reply).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    Scripted { peer, requests, arrivals, release }
}

/// A block answer carrying `block` and its digest.
fn reply_with(block: &[u8]) -> Vec<u8> {
    let body = with_footer(block);
    let mut out = ok_head(&format!("Content-Length: {}\r\n", body.len())).into_bytes();
    out.extend_from_slice(&body);
    out
}

async fn read_block<D: dart_net_tokio::seam::Dialer>(
    node: &Arc<dart_net_tokio::driver::NodeDriver<D>>,
    url: &str,
    block: u64,
) {
    let got = read(node, url, block_range(SIZE, block)).await;
    assert_eq!(got.expect("read completes"), block_bytes(SIZE, block), "block {block}");
}

/// A client GET of block `block` through `node`, run to its end.
async fn read_to_the_end<D: dart_net_tokio::seam::Dialer>(
    node: Arc<dart_net_tokio::driver::NodeDriver<D>>,
    url: &str,
    block: u64,
) -> u16 {
    let range = block_range(SIZE, block).expect("range");
    let headers = Headers::new().with("range", range);
    let target = format!("/dart/{url}");
    let request = Inbound { method: "GET".into(), target, headers, body: Default::default() };
    let resp = node.respond(Plane::Client, request).await;
    let status = resp.status().as_u16();
    let _ = resp.into_body().collect().await;
    status
}

#[tokio::test]
async fn a_caller_abandoning_a_peer_fetch_mid_request_charges_the_peer_nothing() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let mut parent = scripted(|n| if n == 0 { Step::HoldThenGood } else { Step::Good }).await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, LONG), PeerConfig::default());
    tokio::select! {
        out = read_to_the_end(reader.clone(), &url, 0) => panic!("finished while the parent stalls: {out:?}"),
        n = parent.arrival() => assert_eq!(n, 0),
    }
    // The client's request is gone mid-fetch: the node cancelled it and abandoned the permit.
    let counters = breaker_counters(&reader);
    assert_eq!(counters.abandoned, 1);
    let charged = (counters.answered, counters.soft, counters.hard, counters.validation);
    assert_eq!(charged, (0, 0, 0, 0), "{counters:?}");
    assert_eq!(circuit(&reader, &addr), CircuitState::Closed);
    assert_eq!(engine_stats(&reader).peer_failover, 0);

    // The parent is still asked, and answers.
    read_block(&reader, &url, 1).await;
    assert_eq!(engine_stats(&reader).block_source_peer, 1);
}

#[tokio::test]
async fn a_cancelled_half_open_probe_gives_its_slot_back() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let mut parent = scripted(|n| match n {
        0 => Step::Short,
        1 => Step::HoldThenGood,
        _ => Step::Good,
    })
    .await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, SHORT), PeerConfig::default());
    read_block(&reader, &url, 0).await;
    assert_eq!(parent.arrival().await, 0);
    assert_eq!(circuit(&reader, &addr), CircuitState::Open, "a lying parent opens at once");
    wait_until_healthy(&reader, &addr).await;

    tokio::select! {
        out = read_to_the_end(reader.clone(), &url, 1) => panic!("finished while the probe stalls: {out:?}"),
        n = parent.arrival() => assert_eq!(n, 1),
    }
    assert!(healthy(&reader, &addr), "the abandoned probe's slot is free again");
    assert_eq!(circuit(&reader, &addr), CircuitState::HalfOpen);

    read_block(&reader, &url, 2).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Closed, "the next probe recovered it");
    let counters = breaker_counters(&reader);
    assert_eq!((counters.abandoned, counters.recovered), (1, 1));
}

#[tokio::test]
async fn a_dead_parent_costs_one_dial_and_then_two_hundred_reads_make_none() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let dead = closed_addr().to_string();
    let dialer = CountingDialer::default();
    let reader = reader_node(dialer.clone(), &dead, breaker_config(5, LONG), PeerConfig::default());
    read_block(&reader, &url, 0).await;
    assert_eq!(dialer.dials(&dead), 1);
    assert_eq!(circuit(&reader, &dead), CircuitState::Open, "one dial failure opens it");
    let started = Instant::now();
    for block in 1..=200 {
        read_block(&reader, &url, block).await;
    }
    let took = started.elapsed();
    println!("200 reads around a dead parent took {took:?}");
    assert_eq!(dialer.dials(&dead), 1, "no read after the first dialed the dead parent");
    assert!(took < Duration::from_secs(10), "200 reads took {took:?}");
    let counters = breaker_counters(&reader);
    assert_eq!((counters.hard, counters.opened), (1, 1));
    assert_eq!(engine_stats(&reader).block_source_origin, 201);
}

#[tokio::test]
async fn without_a_breaker_every_read_redials_a_dead_parent() {
    // The contrast that shows the dial counter above is live.
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let dead = closed_addr().to_string();
    let dialer = CountingDialer::default();
    let reader = reader_node(dialer.clone(), &dead, breaker_config(0, LONG), PeerConfig::default());
    for block in 0..20 {
        read_block(&reader, &url, block).await;
    }
    assert_eq!(dialer.dials(&dead), 20);
}

#[tokio::test]
async fn a_dead_parent_opens_on_one_dial_and_is_used_again_once_it_is_back() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let addr = closed_addr();
    let reader = reader_node(
        TokioDialer,
        &addr.to_string(),
        breaker_config(5, SHORT),
        PeerConfig::default(),
    );
    read_block(&reader, &url, 0).await;
    assert_eq!(circuit(&reader, &addr.to_string()), CircuitState::Open);

    let listener = tokio::net::TcpListener::bind(addr).await.expect("rebind the parent's port");
    let parent = peer_server_on(listener, "parent");
    wait_until_healthy(&reader, &addr.to_string()).await;
    read_block(&reader, &url, 1).await;
    assert_eq!(circuit(&reader, &addr.to_string()), CircuitState::Closed);
    assert_eq!(engine_stats(&reader).block_source_peer, 1, "the recovered parent served it");
    assert_eq!(parent.stats().relay_served, 1);
    let counters = breaker_counters(&reader);
    assert_eq!((counters.hard, counters.opened, counters.recovered), (1, 1, 1));
}

#[tokio::test]
async fn twenty_consecutive_misses_leave_the_circuit_closed_and_the_parent_asked() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let parent = scripted(|_| Step::Miss).await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, LONG), PeerConfig::default());
    for block in 0..20 {
        read_block(&reader, &url, block).await;
    }
    assert_eq!(parent.requests(), 20, "every miss was asked of the parent");
    assert_eq!(circuit(&reader, &addr), CircuitState::Closed);
    let counters = breaker_counters(&reader);
    assert_eq!((counters.answered, counters.soft), (20, 0));
    assert_eq!(engine_stats(&reader).peer_failover, 0, "a miss is not a failover");
}

#[tokio::test]
async fn genuine_relay_faults_spend_budget_and_an_open_circuit_stops_every_request() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let parent = scripted(|_| Step::Fail).await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, LONG), PeerConfig::default());
    for block in 0..2 {
        read_block(&reader, &url, block).await;
        assert_eq!(circuit(&reader, &addr), CircuitState::Closed, "one hiccup is not ejection");
    }
    read_block(&reader, &url, 2).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Open, "the third fault opens it");
    for block in 3..10 {
        read_block(&reader, &url, block).await;
    }
    assert_eq!(parent.requests(), 3, "nothing reached the parent once open");
    let counters = breaker_counters(&reader);
    assert_eq!((counters.soft, counters.opened, counters.answered), (3, 1, 0));
}

#[tokio::test]
async fn a_late_failure_from_before_the_opening_cannot_undo_the_recovery() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let mut parent = scripted(|n| match n {
        0 => Step::HoldThenFail,
        1 => Step::Short,
        _ => Step::Good,
    })
    .await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, SHORT), PeerConfig::default());
    let late = tokio::spawn({
        let (reader, url) = (reader.clone(), url.clone());
        async move { read(&reader, &url, block_range(SIZE, 0)).await }
    });
    assert_eq!(parent.arrival().await, 0);
    read_block(&reader, &url, 1).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Open);
    wait_until_healthy(&reader, &addr).await;
    read_block(&reader, &url, 2).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Closed, "recovered by a current probe");

    parent.release.send(true).expect("release");
    let got = late.await.expect("late read task").expect("late read completes from the origin");
    assert_eq!(got, block_bytes(SIZE, 0));
    assert_eq!(circuit(&reader, &addr), CircuitState::Closed, "the stale failure was ignored");
    let counters = breaker_counters(&reader);
    assert_eq!((counters.soft, counters.stale, counters.recovered), (0, 1, 1));
}

#[tokio::test]
async fn a_late_success_from_before_the_quarantine_cannot_clear_it() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let mut parent = scripted(|n| match n {
        0 => Step::HoldThenGood,
        1 => Step::Short,
        _ => Step::Good,
    })
    .await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, LONG), PeerConfig::default());
    let late = tokio::spawn({
        let (reader, url) = (reader.clone(), url.clone());
        async move { read(&reader, &url, block_range(SIZE, 0)).await }
    });
    assert_eq!(parent.arrival().await, 0);
    read_block(&reader, &url, 1).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Open, "quarantined for lying");

    parent.release.send(true).expect("release");
    let got = late.await.expect("late read task").expect("late read completes");
    assert_eq!(got, block_bytes(SIZE, 0));
    assert_eq!(circuit(&reader, &addr), CircuitState::Open, "the stale success was ignored");
    let counters = breaker_counters(&reader);
    assert_eq!((counters.answered, counters.validation, counters.stale), (0, 1, 1));
}

#[tokio::test]
async fn a_failed_probe_reopens_the_circuit_and_requests_stop_again() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let parent = scripted(|_| Step::Short).await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, SHORT), PeerConfig::default());
    read_block(&reader, &url, 0).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Open);
    wait_until_healthy(&reader, &addr).await;
    read_block(&reader, &url, 1).await;
    assert_eq!(circuit(&reader, &addr), CircuitState::Open, "the lying probe reopened it");
    read_block(&reader, &url, 2).await;
    assert_eq!(parent.requests(), 2, "the reopened circuit admits nothing");
    let counters = breaker_counters(&reader);
    assert_eq!((counters.opened, counters.probe_failed, counters.validation), (2, 1, 2));
}

#[tokio::test]
async fn faults_interleaved_with_answers_never_open_the_circuit() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let parent = scripted(|n| if n % 3 == 2 { Step::Good } else { Step::Fail }).await;
    let addr = parent.peer.peer_addr();
    let reader = reader_node(TokioDialer, &addr, breaker_config(3, LONG), PeerConfig::default());
    for block in 0..12 {
        read_block(&reader, &url, block).await;
        assert_eq!(circuit(&reader, &addr), CircuitState::Closed, "after block {block}");
    }
    assert_eq!(parent.requests(), 12);
    let counters = breaker_counters(&reader);
    assert_eq!((counters.soft, counters.answered, counters.opened), (8, 4, 0));
}

#[tokio::test]
async fn one_dead_parent_does_not_stop_another_from_serving_its_chunks() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let dead = closed_addr().to_string();
    let alive = peer_server("alive").await;
    let alive_addr = alive.peer_addr();
    let parents = [dead.as_str(), alive_addr.as_str()];
    let dialer = CountingDialer::default();
    let reader =
        reader_of(dialer.clone(), &parents, breaker_config(5, LONG), PeerConfig::default());
    let blocks = 0..40;
    let to_alive = blocks.clone().filter(|&b| parent_for(&parents, &url, b) == 1).count() as u64;
    assert!((1..40).contains(&to_alive), "both parents own chunks ({to_alive} of 40 blocks)");
    for block in blocks {
        read_block(&reader, &url, block).await;
    }
    assert_eq!(dialer.dials(&dead), 1);
    assert_eq!(circuit(&reader, &dead), CircuitState::Open);
    assert_eq!(circuit(&reader, &alive_addr), CircuitState::Closed);
    assert_eq!(engine_stats(&reader).block_source_peer, to_alive);
    assert_eq!(alive.stats().relay_served, to_alive);
}
