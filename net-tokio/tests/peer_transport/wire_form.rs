//! The server's wire form (peer.md §2): round trip, node header, explicit length, bad paths and
//! methods, and `X-DART-Hop` validation before the source runs.

use crate::support::*;
use dart_core::breaker::Observation;
use dart_core::codec::wire::block_path;
use dart_core::engine::{BlockClass, EngineStats, PeerAnswer};
use dart_core::hash::{BlockKey, ChunkKey};
use dart_core::node::Bounds as PeerConfig;
use dart_net_tokio::cache::BlockCache;
use dart_net_tokio::origin_server::Behaviour;
use tokio::io::AsyncWriteExt;

const SIZE: u64 = 5 * BLOCK + 100;

#[tokio::test]
async fn a_cached_block_comes_back_byte_exact_with_the_node_header_and_an_explicit_length() {
    // The origin URL names a dead port: anything served here can only come from the cache.
    let url = format!("http://{}/objects/held", closed_addr());
    let server = peer_server("holder").await;
    let client = peer_client(PeerConfig::default());
    for block in [0, 5] {
        let data = bytes::Bytes::from(block_bytes(SIZE, block));
        let key = key_of(&url, block);
        server.cache.put(key, &data, BlockClass::Owned);
        let len = data.len() as u64;
        let answer = client.fetch_block(&server.peer_addr(), key, &url, 0, len).await;
        assert_eq!(answer, PeerAnswer::Block(data.clone()), "block {block}");

        let got = get(server.addr, &block_path(key), &[("x-dart-origin", &url)]).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.header("x-dart-node"), Some("holder"));
        let wire = (len as usize + FOOTER).to_string();
        assert_eq!(got.header("content-length"), Some(wire.as_str()), "the block and its digest");
        assert_eq!(got.header("transfer-encoding"), None, "a block is never chunked");
        assert_eq!(got.header("x-dart-digest"), Some("xxh3-128"));
        assert_eq!(got.body, with_footer(&data));
    }
    assert_eq!(server.stats().relay_served, 4);
}

#[tokio::test]
async fn a_relay_the_source_cannot_serve_is_a_404_miss_and_not_an_error() {
    // Past the object's end: the relay probes, learns the size and declines.
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("short");
    let server = peer_server("holder").await;
    let key = key_of(&url, 6);
    let answer = peer_client(PeerConfig::default())
        .fetch_block(&server.peer_addr(), key, &url, 0, BLOCK)
        .await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::Miss));
    assert_eq!(Observation::Miss.outcome(), dart_core::breaker::Outcome::Answered);
    let got = get(server.addr, &block_path(key), &[("x-dart-origin", &url)]).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.header("x-dart-node"), Some("holder"));
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn malformed_block_paths_are_400_unknown_paths_404_and_the_source_never_runs() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("holder").await;
    let bad = [
        "/peer/v1/block/",
        "/peer/v1/block/ff",
        "/peer/v1/block/ff/",
        "/peer/v1/block/ff/0/",
        "/peer/v1/block/ff/0/1",
        "/peer/v1/block//0",
        "/peer/v1/block/zz/0",
        "/peer/v1/block/0xff/0",
        "/peer/v1/block/10000000000000000/0",
        "/peer/v1/block/ff/-1",
        "/peer/v1/block/ff/+1",
        "/peer/v1/block/ff/1.5",
        "/peer/v1/block/ff/18446744073709551616",
    ];
    for path in bad {
        let got = get(server.addr, path, &[("x-dart-origin", &url)]).await;
        assert_eq!(got.status, 400, "{path}");
        assert_eq!(got.header("x-dart-node"), Some("holder"), "{path}");
    }
    let unknown =
        ["/", "/peer/v1/block", "/peer/v1/rosters", "/peer/v2/block/ff/0", "/PEER/v1/block/ff/0"];
    for path in unknown {
        let got = get(server.addr, path, &[("x-dart-origin", &url)]).await;
        assert_eq!(got.status, 404, "{path}");
        assert_eq!(got.header("x-dart-node"), Some("holder"), "{path}");
    }
    assert_eq!(origin.requests(), 0);
    assert_eq!(server.stats(), EngineStats::default());
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn methods_other_than_get_are_405_with_allow_get() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("holder").await;
    let path = block_path(key_of(&url, 0));
    for method in [http::Method::POST, http::Method::PUT, http::Method::DELETE, http::Method::HEAD]
    {
        let got = send(server.addr, method.clone(), &path, &[("x-dart-origin", &url)]).await;
        assert_eq!(got.status, 405, "{method}");
        assert_eq!(got.header("allow"), Some("GET"), "{method}");
        assert_eq!(got.header("x-dart-node"), Some("holder"), "{method}");
    }
    assert_eq!(origin.requests(), 0);
    assert_eq!(server.stats(), EngineStats::default());
}

#[tokio::test]
async fn absent_plus_signed_negative_zero_and_sub_bound_hops_reach_the_source() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("relay").await;
    let key = key_of(&url, 1);
    let want = block_bytes(SIZE, 1);
    let hops: [Option<&str>; 7] =
        [None, Some("0"), Some("+5"), Some("-0"), Some("-000"), Some("007"), Some("63")];
    for hop in hops {
        let mut headers = vec![("x-dart-origin", url.as_str())];
        headers.extend(hop.map(|h| ("x-dart-hop", h)));
        let got = get(server.addr, &block_path(key), &headers).await;
        assert_eq!(got.status, 200, "hop {hop:?}");
        assert_eq!(got.body[..], with_footer(&want)[..], "hop {hop:?}");
    }
    assert_eq!(server.stats().relay_served, hops.len() as u64);
    assert_eq!(origin.requests(), 2, "one probe and one block fetch, then cache hits");
}

#[tokio::test]
async fn hops_at_or_past_the_relay_bound_are_valid_wire_values_the_engine_declines_without_origin()
{
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("relay").await;
    let key = key_of(&url, 1);
    let hops = ["64", "+64", "65", "1000", "9223372036854775807"];
    for hop in hops {
        let got =
            get(server.addr, &block_path(key), &[("x-dart-origin", &url), ("x-dart-hop", hop)])
                .await;
        assert_eq!(got.status, 404, "hop {hop} is declined, not refused as malformed");
    }
    let answer = peer_client(PeerConfig::default())
        .fetch_block(&server.peer_addr(), key, &url, 64, BLOCK)
        .await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::Miss));
    assert_eq!(origin.requests(), 0);
    assert_eq!(server.stats().relay_declined, hops.len() as u64 + 1);
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn negative_malformed_overflowing_and_empty_hops_are_400_before_the_source_runs() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("relay").await;
    let path = block_path(key_of(&url, 1));
    let hops = [
        "-1",
        "-64",
        "-9223372036854775808",
        "-99999999999999999999999",
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
        "",
        "1.5",
        "1 1",
        "1_000",
        "0x1",
        "1e3",
        "+",
        "-",
        "++1",
        "+-1",
        "one",
    ];
    for hop in hops {
        let got = get(server.addr, &path, &[("x-dart-origin", &url), ("x-dart-hop", hop)]).await;
        assert_eq!(got.status, 400, "hop {hop:?}");
        assert!(got.body.starts_with(b"dart: bad hop"), "hop {hop:?}: {:?}", got.body);
        assert_eq!(got.header("x-dart-node"), Some("relay"));
    }
    assert_eq!(origin.requests(), 0, "the source never ran");
    assert_eq!(server.stats(), EngineStats::default());
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn whitespace_around_a_hop_is_http_framing_and_never_part_of_the_value() {
    // A leading or trailing space (or tab) is optional whitespace that every HTTP/1.1 parser strips
    // (RFC 9110 §5.5), so ` 1` cannot reach the hop decoder; core's decoder tests refuse it there.
    let server = peer_server("relay").await;
    let path = block_path(key_of("http://origin.invalid/objects/a", 0));
    let request = |hop: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-DART-Hop:{hop}\r\nConnection: close\r\n\r\n")
    };
    // Valid once trimmed: a cache-only request for a block not held.
    assert_eq!(raw_status(server.addr, &request(" \t5\t ")).await, 404);
    assert_eq!(raw_status(server.addr, &request("  1")).await, 404);
    // Still negative or malformed once trimmed.
    assert_eq!(raw_status(server.addr, &request(" -1 ")).await, 400);
    assert_eq!(raw_status(server.addr, &request(" 1 1 ")).await, 400);
    assert_eq!(server.stats().relay_declined, 2);
}

#[tokio::test]
async fn a_transport_only_fetch_is_served_from_the_cache_and_a_block_not_held_is_a_miss() {
    // An empty URL means transport-only (peer.md §3.1): any key, nothing to fetch on behalf.
    let server = peer_server("holder").await;
    let client = peer_client(PeerConfig::default());
    let held = BlockKey { chunk: ChunkKey(0xabc), block: 7 };
    let data = bytes::Bytes::from(block_bytes(SIZE, 0));
    server.cache.put(held, &data, BlockClass::Owned);
    let answer = client.fetch_block(&server.peer_addr(), held, "", 0, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Block(data));
    let missing = BlockKey { chunk: ChunkKey(0xabc), block: 8 };
    let answer = client.fetch_block(&server.peer_addr(), missing, "", 0, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::Miss));
    let stats = server.stats();
    assert_eq!((stats.relay_served, stats.relay_declined), (1, 1));
}

#[tokio::test]
async fn a_transport_only_fetch_sends_no_origin_header() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let peer = hostile(move |_, mut s| {
        let tx = tx.clone();
        async move {
            while let Some(head) = read_head(&mut s).await {
                let _ = tx.send(head.to_ascii_lowercase());
                let reply = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
                if s.write_all(reply).await.is_err() {
                    return;
                }
            }
        }
    })
    .await;
    let client = peer_client(PeerConfig::default());
    let key = BlockKey { chunk: ChunkKey(0xabc), block: 7 };
    client.fetch_block(&peer.peer_addr(), key, "", 0, BLOCK).await;
    let head = rx.recv().await.expect("request head");
    assert!(!head.contains("x-dart-origin"), "{head:?}");
    client.fetch_block(&peer.peer_addr(), key, "http://o.test/a", 0, BLOCK).await;
    let head = rx.recv().await.expect("request head");
    assert!(head.contains("\r\nx-dart-origin: http://o.test/a\r\n"), "{head:?}");
}

#[tokio::test]
async fn an_empty_origin_header_means_cache_only_like_an_absent_one() {
    let server = peer_server("holder").await;
    let held = BlockKey { chunk: ChunkKey(0xabc), block: 7 };
    let data = bytes::Bytes::from(block_bytes(SIZE, 0));
    server.cache.put(held, &data, BlockClass::Owned);
    let got = get(server.addr, &block_path(held), &[("x-dart-origin", "")]).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.body, with_footer(&data));
    let missing = BlockKey { chunk: ChunkKey(0xabc), block: 8 };
    let got = get(server.addr, &block_path(missing), &[("x-dart-origin", "")]).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.body, &b"dart: block not held\n"[..]);
}
