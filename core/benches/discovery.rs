//! A discovery round at the membership cap: a directory that knows `MEMBERS_MAX` members asks
//! each for its roster, offering the tag it last had, and every one answers unchanged (a 304),
//! the steady state of a large cluster. What grows here with the membership is the cost per
//! answer: each ask looks its address's tag up and each answer credits a member by address.
//!
//! Also: answering a roster fetch at the cap, encoded every time against the view's memo.
//!
//! Quick run: `cargo bench -p dart-core --bench discovery`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use dart_core::codec::roster::{encode_roster, roster_body, Roster};
use dart_core::discovery::{Directory, Seeds, Start, Timing, MEMBERS_MAX};
use dart_core::membership::{Member, View};
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

/// Answering a roster fetch at the membership cap: the roster of a view of `MEMBERS_MAX` members
/// encoded and hashed for the answer (what every fetch cost before the memo), against the
/// answer from the view's memo (what every fetch after the first of a view costs).
fn roster_answer(c: &mut Criterion) {
    let n = MEMBERS_MAX;
    let members: Vec<Member> =
        (0..n).map(|i| Member::ready(&format!("node-{i}"), &addr(i))).collect();
    let me = members[0].clone();
    let view = View::new(members);
    let mut group = c.benchmark_group("discovery");
    group.sample_size(20).measurement_time(Duration::from_secs(5));
    group.bench_function(format!("roster_encode/{n}_members"), |bench| {
        bench.iter(|| {
            let body = encode_roster(&view, &me);
            let mut hash = dart_core::hash::Fnv1a::default();
            hash.write(body.as_bytes());
            black_box((body, hash.finish()))
        })
    });
    group.bench_function(format!("roster_memo/{n}_members"), |bench| {
        bench.iter(|| black_box(roster_body(&view, &me)))
    });
    group.finish();
    assert_eq!(roster_body(&view, &me).0, encode_roster(&view, &me).as_bytes());
}

criterion_group!(benches, steady_round, roster_answer);
criterion_main!(benches);
