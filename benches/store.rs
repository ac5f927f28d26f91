//! Micro-benchmarks of the in-process store: one check per iteration on a
//! hot key and over 1M keys, per algorithm.
//!
//! `cargo bench --bench store`. Figures go to docs/BENCHMARKS.md with the
//! machine they came from; nothing here is asserted.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tollgate::store::{Mode, Store, StoreConfig};
use tollgate_protocol::{Algorithm, Limit, Pair};

const KEYS: usize = 1_000_000;

fn limit(algorithm: Algorithm) -> Limit {
    match algorithm {
        Algorithm::TokenBucket => Limit {
            algorithm,
            count: 1_000_000,
            period_ms: 1000,
            burst: 1_000_000,
        },
        Algorithm::SlidingWindow => Limit {
            algorithm,
            count: 1_000_000,
            period_ms: 1000,
            burst: 0,
        },
    }
}

fn pairs(algorithm: Algorithm, n: usize) -> Vec<Pair> {
    (0..n)
        .map(|i| Pair {
            key: Bytes::from(format!("rl:{{user{i:08}}}:s")),
            limit: limit(algorithm).into(),
            cost: 1,
        })
        .collect()
}

fn check(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_check");
    group.throughput(Throughput::Elements(1));
    for algorithm in [Algorithm::TokenBucket, Algorithm::SlidingWindow] {
        let store = Store::new(StoreConfig::default());
        let hot = pairs(algorithm, 1);
        let mut now = 1_000_000_000u64;
        group.bench_function(BenchmarkId::new("hot_key", algorithm.name()), |b| {
            b.iter(|| {
                now += 1_000;
                black_box(store.check(black_box(&hot[..1]), now, Mode::Charge))
            })
        });

        let store = Store::new(StoreConfig::default());
        let many = pairs(algorithm, KEYS);
        for p in &many {
            store.check(std::slice::from_ref(p), now, Mode::Charge);
        }
        let mut i = 0usize;
        group.bench_function(BenchmarkId::new("1M_keys", algorithm.name()), |b| {
            b.iter(|| {
                // A large odd stride walks the keys in a cache-unfriendly order.
                i = (i + 7_919) % KEYS;
                now += 1_000;
                black_box(store.check(std::slice::from_ref(&many[i]), now, Mode::Charge))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, check);
criterion_main!(benches);
