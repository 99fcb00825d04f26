//! Relays (peer.md §2, §3.6; engine.md §7): declines before any work, fetch-on-behalf, source
//! errors, and the origin's credential refusal carried back without blaming the relay.

use crate::support::*;
use dart_core::breaker::{CircuitState, Observation, Outcome};
use dart_core::codec::wire::block_path;
use dart_core::engine::{BlockClass, PeerAnswer};
use dart_core::hash::BlockKey;
use dart_core::node::Bounds as PeerConfig;
use dart_net_tokio::cache::BlockCache;
use dart_net_tokio::origin_server::Behaviour;
use dart_net_tokio::seam::TokioDialer;
use std::time::Duration;

const SIZE: u64 = 6 * BLOCK + 100;

#[tokio::test]
async fn block_indices_above_the_geometry_maximum_are_declined_before_cache_probe_or_origin() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("relay").await;
    let client = peer_client(PeerConfig::default());
    let first_overflowing = engine_config().geometry.max_block_index() + 1;
    let chunk = key_of(&url, 0).chunk;
    let mut declined = 0;
    for block in [1u64 << 63, u64::MAX, first_overflowing] {
        let key = BlockKey { chunk, block };
        // Even a block somehow held under that key is not served: the check comes first.
        server.cache.put(key, &bytes::Bytes::from_static(b"poison"), BlockClass::Owned);
        let answer = client.fetch_block(&server.peer_addr(), key, &url, 0, BLOCK).await;
        assert_eq!(answer, PeerAnswer::Failed(Observation::Miss), "block {block}");
        let got = get(server.addr, &block_path(key), &[]).await;
        assert_eq!(got.status, 404, "cache-only request for block {block}");
        declined += 2;
    }
    assert_eq!(origin.requests(), 0);
    assert_eq!(server.stats().relay_declined, declined);
    assert_eq!(server.stats().relay_served, 0);

    // The control: a legitimate index of the same object still relays.
    let answer = client.fetch_block(&server.peer_addr(), key_of(&url, 1), &url, 0, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Block(block_bytes(SIZE, 1).into()));
}

#[tokio::test]
async fn a_chunk_key_that_disagrees_with_the_origin_url_is_declined_before_the_cache() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let (url, other) = (origin.url("a"), origin.url("b"));
    let server = peer_server("relay").await;
    let client = peer_client(PeerConfig::default());
    let of_other = key_of(&other, 0);
    server.cache.put(of_other, &block_bytes(SIZE, 0).into(), BlockClass::Owned);
    let wrong_chunk = BlockKey { chunk: key_of(&url, 0).chunk, block: 4 }; // block 4 is chunk 1
    for key in [of_other, wrong_chunk] {
        let answer = client.fetch_block(&server.peer_addr(), key, &url, 0, BLOCK).await;
        assert_eq!(answer, PeerAnswer::Failed(Observation::Miss), "{key}");
    }
    assert_eq!(origin.requests(), 0);
    assert_eq!(server.stats().relay_declined, 2);
    assert_eq!(server.stats().relay_served, 0, "the held block was not served for the wrong URL");
    // The consistent pair is served from that same cache entry, once the relay has learnt which
    // version of the object it holds (one 1-byte probe: a held block is served only for a known
    // version).
    let answer = client.fetch_block(&server.peer_addr(), of_other, &other, 0, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Block(block_bytes(SIZE, 0).into()));
    assert_eq!(origin.requests(), 1);
}

#[tokio::test]
async fn a_range_blind_object_is_declined_and_once_learnt_costs_no_further_origin_request() {
    let origin = origin(Behaviour::IgnoresRange, SIZE).await;
    let url = origin.url("blind");
    let server = peer_server("relay").await;
    let client = peer_client(PeerConfig::default());
    let key = key_of(&url, 1);
    let answer = client.fetch_block(&server.peer_addr(), key, &url, 0, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::Miss));
    assert_eq!(origin.requests(), 1, "the relay's size probe taught it the object ignores Range");
    for block in [1, 2, 3] {
        let key = key_of(&url, block);
        let answer = client.fetch_block(&server.peer_addr(), key, &url, 0, BLOCK).await;
        assert_eq!(answer, PeerAnswer::Failed(Observation::Miss), "block {block}");
    }
    assert_eq!(origin.requests(), 1);
    assert_eq!(server.stats().relay_declined, 4);
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn an_empty_relay_fetches_on_behalf_caches_and_serves_then_answers_from_its_cache() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let server = peer_server("relay").await;
    let client = peer_client(PeerConfig::default());
    for block in [2, 6] {
        let want = bytes::Bytes::from(block_bytes(SIZE, block));
        let key = key_of(&url, block);
        let len = want.len() as u64;
        let answer = client.fetch_block(&server.peer_addr(), key, &url, 0, len).await;
        assert_eq!(answer, PeerAnswer::Block(want.clone()), "block {block}");
        assert_eq!(server.cache.get(&key), Some(want.clone()), "block {block} cached");
    }
    assert_eq!(origin.requests(), 3, "one probe and two block fetches");
    let stats = server.stats();
    assert_eq!((stats.relay_served, stats.block_source_origin), (2, 2));

    let again = client.fetch_block(&server.peer_addr(), key_of(&url, 2), &url, 0, BLOCK).await;
    assert_eq!(again, PeerAnswer::Block(block_bytes(SIZE, 2).into()));
    assert_eq!(origin.requests(), 3, "the second request is a cache hit");
    assert_eq!(server.stats().relay_served, 3);
}

#[tokio::test]
async fn a_relay_whose_source_fails_answers_500_which_the_client_counts_against_it() {
    let url = format!("http://{}/objects/a", closed_addr());
    let server = peer_server("relay").await;
    let key = key_of(&url, 0);
    let got = get(server.addr, &block_path(key), &[("x-dart-origin", &url)]).await;
    assert_eq!(got.status, 500);
    assert_eq!(got.header("x-dart-upstream-status"), None);
    assert_eq!(got.header("x-dart-node"), Some("relay"));
    let answer = peer_client(PeerConfig::default())
        .fetch_block(&server.peer_addr(), key, &url, 0, BLOCK)
        .await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::UnexpectedStatus(500)));
    assert_eq!(Observation::UnexpectedStatus(500).outcome(), Outcome::SoftFailure);
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn an_origin_refusing_the_requesters_credential_makes_the_relay_answer_502_with_its_status() {
    let origin = origin(Behaviour::PresignedGetOnly, SIZE).await;
    let url = format!("{}?sig=expired", origin.url("signed"));
    let server = peer_server("relay").await;
    let key = key_of(&url, 0);
    let got = get(server.addr, &block_path(key), &[("x-dart-origin", &url)]).await;
    assert_eq!(got.status, 502);
    assert_eq!(got.header("x-dart-upstream-status"), Some("403"));
    assert_eq!(got.header("x-dart-node"), Some("relay"));
    let answer = peer_client(PeerConfig::default())
        .fetch_block(&server.peer_addr(), key, &url, 0, BLOCK)
        .await;
    assert_eq!(answer, PeerAnswer::Failed(Observation::UpstreamRefused { status: 403 }));
    assert_eq!(Observation::UpstreamRefused { status: 403 }.outcome(), Outcome::Answered);
    assert!(server.cache.is_empty());
}

#[tokio::test]
async fn five_credential_refusals_relayed_by_a_healthy_peer_leave_its_circuit_closed() {
    let origin = origin(Behaviour::PresignedGetOnly, SIZE).await;
    let good = format!("{}?sig=good", origin.url("signed"));
    let expired = format!("{}?sig=expired", origin.url("signed"));
    let relay = peer_server("relay").await;
    let parent = relay.peer_addr();
    let reader = reader_node(
        TokioDialer,
        &parent,
        breaker_config(3, Duration::from_secs(60)),
        PeerConfig::default(),
    );
    // A valid signature first: both nodes learn the object's size (its identity has no query).
    let got = read(&reader, &good, block_range(SIZE, 0)).await.expect("signed read");
    assert_eq!(got, block_bytes(SIZE, 0));
    for block in 1..=5 {
        let failure = read(&reader, &expired, block_range(SIZE, block)).await.expect_err("403");
        assert_eq!(failure.status, 403, "block {block}: the origin's refusal of the reader's URL");
        assert!(!failure.committed, "the head waits for the block: a clean status");
        assert_eq!(circuit(&reader, &parent), CircuitState::Closed, "after refusal {block}");
    }
    let counters = breaker_counters(&reader);
    assert_eq!((counters.answered, counters.soft, counters.opened), (6, 0, 0));
    assert_eq!(engine_stats(&reader).peer_failover, 5, "each refusal still escalated");
}

#[tokio::test]
async fn a_miss_relayed_down_a_three_node_chain_is_cached_by_every_node() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let root = peer_server("root").await;
    let middle = relay_with_parent("middle", &root.peer_addr()).await;
    let reader = reader_node(
        TokioDialer,
        &middle.peer_addr(),
        breaker_config(3, Duration::from_secs(60)),
        PeerConfig::default(),
    );
    let got = read(&reader, &url, block_range(SIZE, 6)).await.expect("tail read");
    assert_eq!(got, block_bytes(SIZE, 6));
    let key = key_of(&url, 6);
    for (name, cache) in [("root", &root.cache), ("middle", &middle.cache)] {
        assert_eq!(cache.get(&key).as_deref(), Some(&got[..]), "{name} cached the block");
    }
    assert_eq!(reader.store().get(&key).as_deref(), Some(&got[..]), "the reader cached it");
    assert_eq!(engine_stats(&reader).block_source_peer, 1);
    assert_eq!(middle.stats().block_source_peer, 1, "the middle got it from the root");
    assert_eq!(root.stats().block_source_origin, 1, "only the root went to the origin");
    assert_eq!(origin.requests(), 4, "three size probes and one block fetch");
}

#[tokio::test]
async fn a_relay_sends_hop_plus_one_so_the_bound_stops_the_chain_at_the_next_node() {
    let origin = origin(Behaviour::Honours, SIZE).await;
    let url = origin.url("a");
    let root = peer_server("root").await;
    let middle = relay_with_parent("middle", &root.peer_addr()).await;
    let client = peer_client(PeerConfig::default());

    // Hop 63 is below the bound at the middle, which asks the root with 64: declined there, so
    // the middle fetches the origin itself.
    let key = key_of(&url, 1);
    let answer = client.fetch_block(&middle.peer_addr(), key, &url, 63, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Block(block_bytes(SIZE, 1).into()));
    assert_eq!(root.stats().relay_declined, 1);
    assert_eq!(root.stats().relay_served, 0);
    assert!(root.cache.is_empty());
    assert_eq!(middle.stats().block_source_origin, 1);

    // Hop 62 reaches the root as 63: it relays.
    let key = key_of(&url, 2);
    let answer = client.fetch_block(&middle.peer_addr(), key, &url, 62, BLOCK).await;
    assert_eq!(answer, PeerAnswer::Block(block_bytes(SIZE, 2).into()));
    assert_eq!(root.stats().relay_served, 1);
    assert!(root.cache.get(&key).is_some());
}
