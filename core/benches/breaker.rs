//! Breaker hot paths: admit + record on one peer, the same spread over 4096 tracked peers, and
//! creating a peer at the cap when every tracked entry is dirty (LRU eviction).
//!
//! Quick run: `cargo bench -p dart-core --bench breaker`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use dart_core::breaker::{Admission, Breaker, BreakerConfig, Outcome, TRACKED_PEERS_MAX};
use dart_core::time::Instant;

fn addr(i: usize) -> String {
    format!("10.{}.{}.{}:7070", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff)
}

/// One whole request: admit, then record an answer.
fn admit_and_record(b: &mut Breaker<String>, peer: &String, now: Instant) {
    match b.begin_data(peer, now) {
        Admission::Admitted(permit) => {
            black_box(b.complete(permit, Outcome::Answered, now));
        }
        Admission::Rejected => unreachable!("closed peers admit"),
    }
}

fn one_peer(c: &mut Criterion) {
    let mut b = Breaker::new(BreakerConfig::default()).unwrap();
    let peer = addr(1);
    let mut now = Instant::ZERO;
    c.bench_function("admit_record/1_peer", |bench| {
        bench.iter(|| {
            now += Duration::from_micros(1);
            admit_and_record(&mut b, &peer, now);
        })
    });
}

fn many_peers(c: &mut Criterion) {
    let mut b = Breaker::new(BreakerConfig::default()).unwrap();
    let peers: Vec<String> = (0..TRACKED_PEERS_MAX).map(addr).collect();
    let mut now = Instant::ZERO;
    for peer in &peers {
        // A soft failure keeps every entry dirty, so nothing is ever swept.
        let permit = b.begin_data(peer, now).permit().unwrap();
        b.complete(permit, Outcome::SoftFailure, now);
    }
    assert_eq!(b.tracked(), TRACKED_PEERS_MAX);
    let mut i = 0;
    c.bench_function("admit_record/4096_peers", |bench| {
        bench.iter(|| {
            now += Duration::from_micros(1);
            i = (i + 7919) % peers.len(); // a stride prime to 4096: every peer, scattered
            admit_and_record(&mut b, &peers[i], now);
        })
    });
    assert_eq!(b.tracked(), TRACKED_PEERS_MAX);
}

fn churn_at_cap(c: &mut Criterion) {
    let mut b = Breaker::new(BreakerConfig::default()).unwrap();
    let mut now = Instant::ZERO;
    let mut next = 0;
    let mut fail_new_peer = |b: &mut Breaker<String>, now: Instant| {
        let peer = addr(next);
        next += 1;
        let permit = b.begin_data(&peer, now).permit().unwrap();
        b.complete(permit, Outcome::SoftFailure, now);
    };
    for _ in 0..TRACKED_PEERS_MAX {
        fail_new_peer(&mut b, now);
    }
    c.bench_function("evict_lru/new_dirty_peer_at_cap", |bench| {
        bench.iter(|| {
            now += Duration::from_micros(1);
            fail_new_peer(&mut b, now);
        })
    });
    assert_eq!(b.tracked(), TRACKED_PEERS_MAX);
    while b.poll_event().is_some() {}
}

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = quick();
    targets = one_peer, many_peers, churn_at_cap
}
criterion_main!(benches);
