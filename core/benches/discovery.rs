//! A discovery round at the membership cap: a directory that knows `MEMBERS_MAX` members asks
//! each for its roster, offering the tag it last had, and every one answers unchanged (a 304),
//! the steady state of a large cluster. What grows here with the membership is the cost per
//! answer: each ask looks its address's tag up and each answer credits a member by address.
//!
//! Quick run: `cargo bench -p dart-core --bench discovery`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use dart_core::codec::roster::Roster;
use dart_core::discovery::{Directory, Seeds, Start, Timing, MEMBERS_MAX};
use dart_core::membership::Member;
use dart_core::time::Instant;

fn addr(i: usize) -> String {
    format!("10.{}.{}.{}:7070", i >> 16 & 0xff, i >> 8 & 0xff, i & 0xff)
}

fn asks(start: Start) -> Vec<String> {
    match start {
        Start::Ask(addrs) => addrs,
        Start::Resolve { .. } => unreachable!("static seeds"),
    }
}

/// A directory that met `n` members in its first round, each answering its whole roster (itself)
/// with a tag; returns it and the time after that round.
fn met(n: usize) -> (Directory, Instant) {
    let seeds: Vec<String> = (1..=n).map(addr).collect();
    let me = Member::ready("node-0", &addr(0));
    let timing = Timing::default();
    let mut now = Instant::ZERO;
    let mut dir = Directory::new(me, Seeds::Static(seeds), timing, now);
    for a in asks(dir.start_round(now)) {
        let id = format!("node-{}", a.replace(['.', ':'], "-"));
        let roster = Roster { epoch: 1, members: vec![Member::ready(&id, &a)], invalid: vec![] };
        dir.answered(&a, Ok((roster, Some(id))), now);
        dir.note_tag(&a, Some("\"t\"".to_owned()));
    }
    now += timing.interval;
    (dir, now)
}

fn steady_round(c: &mut Criterion) {
    let n = MEMBERS_MAX;
    let (mut dir, mut now) = met(n);
    let interval = Timing::default().interval;
    let mut group = c.benchmark_group("discovery");
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    group.bench_function(format!("round_all_304/{n}_members"), |bench| {
        bench.iter(|| {
            for a in asks(dir.start_round(now)) {
                let tag = dir.tag_for(&a).map(str::to_owned);
                black_box(tag);
                let id = format!("node-{}", a.replace(['.', ':'], "-"));
                black_box(dir.unchanged(&a, Some(&id), now));
            }
            now += interval;
        })
    });
    group.finish();
    assert_eq!(dir.contacts(now).len(), n, "every member still known");
}

criterion_group!(benches, steady_round);
criterion_main!(benches);
