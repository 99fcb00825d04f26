//! The block digest beside the alternatives, side by side in one run: XXH3-128 (what the peer
//! plane uses, `dart_core::integrity`), SHA-256 (ring, as the registry check uses) and a plain
//! copy of the block (the floor any serving path pays), over one 4 MiB block. Criterion prints
//! each one's throughput; the ratio to the copy is the figure to read, since absolute speeds
//! move with the machine.
//!
//! `cargo bench -p dart-core --bench digest`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BLOCK: usize = 4 << 20;

fn digests(c: &mut Criterion) {
    let block: Vec<u8> = (0..BLOCK).map(|i| (i as u64).wrapping_mul(0x9e37_79b9) as u8).collect();
    let mut copy = vec![0u8; BLOCK];
    let mut g = c.benchmark_group("4 MiB block");
    g.throughput(Throughput::Bytes(BLOCK as u64));
    g.bench_function("copy", |b| {
        b.iter(|| {
            copy.copy_from_slice(black_box(&block));
            black_box(&copy);
        })
    });
    g.bench_function("xxh3-128", |b| {
        b.iter(|| black_box(dart_core::integrity::xxh3_128(black_box(&block))))
    });
    g.sample_size(20);
    g.bench_function("sha-256", |b| {
        b.iter(|| black_box(ring::digest::digest(&ring::digest::SHA256, black_box(&block))))
    });
    g.finish();
}

criterion_group!(benches, digests);
criterion_main!(benches);
