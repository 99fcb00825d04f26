//! Peers that lie (peer.md §3.4): wrong lengths, oversized announcements, endless bodies,
//! broken framing and garbage. Every answer is a classified failure: never a panic, never a
//! block of the wrong bytes, and never more than `expected + 1` bytes buffered.

use crate::support::*;
use dart_core::breaker::{HardReason, Observation, Outcome};
use dart_core::engine::PeerAnswer;
use dart_core::hash::{BlockKey, ChunkKey};
use dart_core::node::Bounds as PeerConfig;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

const KEY: BlockKey = BlockKey { chunk: ChunkKey(0xd0d0), block: 3 };
const URL: &str = "http://origin.invalid/objects/a";

/// Long enough that a client waiting for a body that never ends would visibly time out instead.
fn patient() -> PeerConfig {
    bounds(Duration::from_secs(10), Duration::from_secs(10))
}

async fn fetch(peer: &Hostile, expected: u64) -> PeerAnswer {
    peer_client(patient()).fetch_block(&peer.peer_addr(), KEY, URL, 0, expected).await
}

fn with_body(head: &str, body: &[u8]) -> Vec<u8> {
    let mut out = head.as_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

#[tokio::test]
async fn a_short_body_with_a_matching_short_content_length_is_a_wrong_length() {
    let body = seeded_bytes(1, 4095);
    let peer = hostile(answer_with(with_body(&ok_head("Content-Length: 4095\r\n"), &body))).await;
    assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
    // A body running past its short Content-Length: the framing wins, the extra byte is not
    // taken to make up the block.
    let longer = seeded_bytes(1, 4096);
    let reply = with_body(&ok_head("Content-Length: 4095\r\n"), &longer);
    let peer = hostile(answer_once(reply)).await;
    assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
    assert_eq!(
        Observation::WrongLength.outcome(),
        Outcome::HardFailure(HardReason::Validation),
        "a lying peer's circuit opens at once"
    );
}

#[tokio::test]
async fn a_content_length_above_the_block_is_refused_without_reading_a_body_byte() {
    // The peer announces 1 GiB and sends nothing more until the client hangs up: if the client
    // waited for the body it would time out instead.
    let hung_up_before_body = Arc::new(AtomicBool::new(false));
    let flag = hung_up_before_body.clone();
    let peer = hostile(move |_, mut s| {
        let flag = flag.clone();
        async move {
            read_head(&mut s).await.expect("request");
            s.write_all(ok_head("Content-Length: 1073741824\r\n").as_bytes()).await.expect("head");
            wait_for_close(&mut s).await;
            flag.store(true, Ordering::SeqCst);
        }
    })
    .await;
    let started = Instant::now();
    assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
    assert!(started.elapsed() < Duration::from_secs(5), "answered without waiting for the body");
    let deadline = Instant::now() + PATIENCE;
    while !hung_up_before_body.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the client kept the 1 GiB response open");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn an_endless_chunked_body_is_a_wrong_length_after_at_most_one_byte_past_the_block_and_its_digest(
) {
    let written = Arc::new(AtomicU64::new(0));
    let counter = written.clone();
    let peer = hostile(move |_, mut s| {
        let counter = counter.clone();
        async move {
            read_head(&mut s).await.expect("request");
            let head = ok_head("Transfer-Encoding: chunked\r\n");
            s.write_all(head.as_bytes()).await.expect("head");
            let chunk = with_body("400\r\n", &[0xAB; 0x400]);
            while s.write_all(&chunk).await.is_ok() && s.write_all(b"\r\n").await.is_ok() {
                counter.fetch_add(0x400, Ordering::SeqCst);
            }
        }
    })
    .await;
    let started = Instant::now();
    assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
    assert!(started.elapsed() < Duration::from_secs(5), "stopped reading an endless body");
    println!("the endless peer got {} body bytes into the socket", written.load(Ordering::SeqCst));
}

#[tokio::test]
async fn an_over_long_chunked_body_is_judged_at_one_byte_past_the_block_without_its_end() {
    // The peer sends exactly the block, its digest and one byte more, and then nothing, not even
    // the last chunk: the client must decide on those bytes alone, or it would wait out the
    // request bound.
    let peer = hostile(|_, mut s| async move {
        read_head(&mut s).await.expect("request");
        let mut reply = ok_head("Transfer-Encoding: chunked\r\n").into_bytes();
        reply.extend_from_slice(format!("{:x}\r\n", 4096 + FOOTER).as_bytes());
        reply.extend_from_slice(&with_footer(&seeded_bytes(8, 4096)));
        reply.extend_from_slice(b"\r\n1\r\nX\r\n");
        s.write_all(&reply).await.expect("reply");
        wait_for_close(&mut s).await;
    })
    .await;
    let started = Instant::now();
    assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
    assert!(started.elapsed() < Duration::from_secs(5), "waited for the end of the body");
}

#[tokio::test]
async fn chunked_bodies_from_older_peers_are_judged_by_their_length() {
    let block = seeded_bytes(2, 4096);
    let chunked = |body: &[u8]| {
        let mut out = ok_head("Transfer-Encoding: chunked\r\n").into_bytes();
        for part in body.chunks(1000) {
            out.extend_from_slice(format!("{:x}\r\n", part.len()).as_bytes());
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    };
    let exact = hostile(answer_with(chunked(&with_footer(&block)))).await;
    assert_eq!(fetch(&exact, 4096).await, PeerAnswer::Block(block.clone().into()));
    let short = hostile(answer_with(chunked(&with_footer(&block[..4095])))).await;
    assert_eq!(fetch(&short, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
    let long = hostile(answer_with(chunked(&with_footer(&seeded_bytes(3, 4097))))).await;
    assert_eq!(fetch(&long, 4096).await, PeerAnswer::Failed(Observation::WrongLength));
}

#[tokio::test]
async fn bytes_past_the_content_length_are_never_part_of_a_block_nor_the_next_answer() {
    // Connection 0 answers with the block and then smuggles a complete second response into the
    // same stream; later connections answer honestly. The smuggled bytes must never come back.
    let block = seeded_bytes(4, 4096);
    let forged = seeded_bytes(5, 4096);
    let head = ok_head("Content-Length: 4112\r\n");
    let honest = with_body(&head, &with_footer(&block));
    let mut smuggling = honest.clone();
    smuggling.extend_from_slice(&with_body(&head, &with_footer(&forged)));
    let peer = hostile(move |index, mut s| {
        let reply = if index == 0 { smuggling.clone() } else { honest.clone() };
        async move {
            while read_head(&mut s).await.is_some() {
                if s.write_all(&reply).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let client = peer_client(patient());
    let first = client.fetch_block(&peer.peer_addr(), KEY, URL, 0, 4096).await;
    assert_eq!(first, PeerAnswer::Block(block.clone().into()), "framed by Content-Length");
    for round in 1..=3 {
        let next = client.fetch_block(&peer.peer_addr(), KEY, URL, 0, 4096).await;
        assert_ne!(next, PeerAnswer::Block(forged.clone().into()), "round {round}: smuggled");
        assert_eq!(next, PeerAnswer::Block(block.clone().into()), "round {round}");
    }
    println!("{} connections for 4 fetches", peer.accepted());
}

#[tokio::test]
async fn a_body_cut_off_mid_way_keeps_its_transport_class() {
    let peer = hostile(move |_, mut s| async move {
        read_head(&mut s).await.expect("request");
        let reply = with_body(&ok_head("Content-Length: 4112\r\n"), &seeded_bytes(6, 2000));
        s.write_all(&reply).await.expect("partial");
        // Dropping the stream closes it 2112 bytes short.
    })
    .await;
    assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(Observation::BodyInterrupted));
    assert_eq!(Observation::BodyInterrupted.outcome(), Outcome::SoftFailure);
}

#[tokio::test]
async fn statuses_are_classified_miss_refusal_or_unexpected() {
    let cases: [(&str, Observation); 7] = [
        ("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", Observation::Miss),
        (
            "HTTP/1.1 502 Bad Gateway\r\nX-DART-Upstream-Status: 401\r\nContent-Length: 0\r\n\r\n",
            Observation::UpstreamRefused { status: 401 },
        ),
        (
            "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n",
            Observation::UnexpectedStatus(502),
        ),
        (
            "HTTP/1.1 502 Bad Gateway\r\nX-DART-Upstream-Status: lots\r\nContent-Length: 0\r\n\r\n",
            Observation::UnexpectedStatus(502),
        ),
        ("HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", Observation::UnexpectedStatus(500)),
        ("HTTP/1.1 299 Odd\r\nContent-Length: 0\r\n\r\n", Observation::UnexpectedStatus(299)),
        (
            "HTTP/1.1 302 Found\r\nLocation: /\r\nContent-Length: 0\r\n\r\n",
            Observation::UnexpectedStatus(302),
        ),
    ];
    for (reply, want) in cases {
        let peer = hostile(answer_with(reply.as_bytes().to_vec())).await;
        assert_eq!(fetch(&peer, 4096).await, PeerAnswer::Failed(want), "{reply:?}");
    }
}

#[tokio::test]
async fn broken_http_is_a_classified_failure_and_never_a_block() {
    let block = seeded_bytes(7, 4096);
    let cases: Vec<Vec<u8>> = vec![
        b"NOT HTTP AT ALL\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n".to_vec(),
        with_body("HTTP/1.1 200 OK\r\nContent-Length: 4096\r\nContent-Length: 10\r\n\r\n", &block),
        with_body("HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 4096\r\n\r\n", &block),
        with_body("HTTP/9.9 200 OK\r\nContent-Length: 4096\r\n\r\n", &block),
        with_body("HTTP/1.1 2000 OK\r\nContent-Length: 4096\r\n\r\n", &block),
        with_body("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", &block),
        Vec::new(), // closes without a byte
    ];
    for reply in cases {
        let peer = hostile(answer_once(reply.clone())).await;
        let answer = fetch(&peer, 4096).await;
        let text = String::from_utf8_lossy(&reply[..reply.len().min(60)]).into_owned();
        assert!(matches!(answer, PeerAnswer::Failed(_)), "{text:?} -> {answer:?}");
        assert_ne!(answer, PeerAnswer::Failed(Observation::Miss), "{text:?}");
        println!("{text:?} -> {answer:?}");
    }
}

#[tokio::test]
async fn seeded_garbage_answers_never_panic_and_never_pass_as_a_block() {
    let root: u64 = 0x9a7b_a9e0;
    println!("garbage seeds {root:#x}..{:#x}", root + 32);
    for seed in root..root + 32 {
        // Half the cases wear a plausible status line so the garbage reaches header parsing.
        let mut reply = if seed % 2 == 0 { b"HTTP/1.1 200 OK\r\n".to_vec() } else { Vec::new() };
        reply.extend_from_slice(&seeded_bytes(seed, 64 + (seed % 512) as usize));
        let peer = hostile(answer_once(reply)).await;
        let answer = peer_client(bounds(Duration::from_millis(500), Duration::from_secs(2)))
            .fetch_block(&peer.peer_addr(), KEY, URL, 0, 4096)
            .await;
        assert!(matches!(answer, PeerAnswer::Failed(_)), "seed {seed:#x}: {answer:?}");
    }
}
