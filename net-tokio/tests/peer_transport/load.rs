//! The pooled client under concurrent load (peer.md §5): one client shared by many tasks against
//! one server, every block byte-exact.

use crate::support::*;
use dart_core::engine::{BlockClass, PeerAnswer};
use dart_core::node::Bounds as PeerConfig;
use dart_net_tokio::cache::BlockCache;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const FETCHES: u64 = 64;
const SIZE: u64 = FETCHES * BLOCK;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_fetches_over_one_pooled_client_are_all_byte_exact() {
    // The origin URL names a dead port: every block must come from the server's cache.
    let url = format!("http://{}/objects/load", closed_addr());
    let server = peer_server("holder").await;
    for block in 0..FETCHES {
        server.cache.put(key_of(&url, block), &block_bytes(SIZE, block).into(), BlockClass::Owned);
    }
    let client = Arc::new(peer_client(PeerConfig::default()));
    for round in 0..2 {
        let mut tasks = tokio::task::JoinSet::new();
        for block in 0..FETCHES {
            let (client, url, addr) = (client.clone(), url.clone(), server.peer_addr());
            tasks.spawn(async move {
                let answer = client.fetch_block(&addr, key_of(&url, block), &url, 0, BLOCK).await;
                (block, answer)
            });
        }
        while let Some(done) = tasks.join_next().await {
            let (block, answer) = done.expect("fetch task");
            let want = PeerAnswer::Block(block_bytes(SIZE, block).into());
            assert!(answer == want, "round {round} block {block}: {answer:?}");
        }
        let accepts = server.accepts.load(Ordering::SeqCst);
        println!("round {round}: {accepts} connections accepted so far");
        assert!((1..=FETCHES * (round + 1)).contains(&accepts), "{accepts} connections");
    }
    assert_eq!(server.stats().relay_served, 2 * FETCHES);
}
