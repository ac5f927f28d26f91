//! Micro-benchmarks of the in-process store: one check per iteration on a
//! hot key and over 1M keys, per algorithm, on one thread and on two
//! threads sharing the store (the throughput per element is for both).
//! The single-thread checks run twice: with 19-byte keys
//! (`rl:{user00000000}:s`, `hot_key` and `1M_keys`), which the compact
//! tables hold in their long key slot, and with 16-byte keys
//! (`rl:{0000abcd}:ab`, `hot_short_key` and `1M_short_keys`), which take
//! the 16-byte short slot.
//!
//! Also: the rewrite of expired states alone (`store_rewrite`), checks at
//! the memory cap with `--on-full refuse` (new keys refused
//! against existing keys admitted), and the throttled-keys sketch's deny
//! path on one and two threads.
//!
//! `cargo bench --bench store`. With `BENCH_CLOCK=cpu` every figure is the
//! process's CPU time instead of wall time (`CLOCK_PROCESS_CPUTIME_ID`):
//! on a shared, loaded machine wall time mostly measures the other
//! tenants, CPU time what the code costs (for the two-thread cases: both
//! threads' CPU per element). Figures go to docs/BENCHMARKS.md with the
//! machine they came from; nothing here is asserted.

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};
use tollgate::store::{Full, Mode, ResolvedPair, Store, StoreConfig};
use tollgate::throttled::TopThrottled;
use tollgate_protocol::{Algorithm, Limit, LimitRef, Pair};

const KEYS: usize = 1_000_000;

/// The process's CPU time so far.
fn cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill in.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// How long `run` takes: wall time, or CPU time with `BENCH_CLOCK=cpu`.
fn timed(run: impl FnOnce()) -> Duration {
    if std::env::var("BENCH_CLOCK").is_ok_and(|c| c == "cpu") {
        let start = cpu_time();
        run();
        cpu_time() - start
    } else {
        let start = Instant::now();
        run();
        start.elapsed()
    }
}

/// A pair as the store takes it (the benches' pairs are all inline).
fn as_check(pair: &Pair) -> ResolvedPair<'_> {
    match pair.limit {
        LimitRef::Inline(limit) => ResolvedPair::new(&pair.key, limit, pair.cost),
        LimitRef::Rule(_) => unreachable!("the benches' limits are inline"),
    }
}

fn limit(algorithm: Algorithm) -> Limit {
    // High limits so the hot key keeps passing; the sliding log and the
    // concurrency limit are capped by max_log_entries (1000 by default), so
    // their hot key mostly measures the full-log / full-lease-set path.
    let (count, burst) = match algorithm {
        Algorithm::TokenBucket | Algorithm::LeakyBucket => (1_000_000, 1_000_000),
        Algorithm::SlidingWindow | Algorithm::FixedWindow => (1_000_000, 0),
        Algorithm::SlidingLog | Algorithm::Concurrency => (1000, 0),
    };
    Limit {
        algorithm,
        count,
        period_ms: 1000,
        burst,
    }
}

/// `n` pairs with 19-byte keys (the long key slot).
fn pairs(algorithm: Algorithm, n: usize) -> Vec<Pair> {
    keyed_pairs(algorithm, n, |i| format!("rl:{{user{i:08}}}:s"))
}

/// `n` pairs with 16-byte keys, shaped as the memory bench's (the short
/// key slot).
fn short_pairs(algorithm: Algorithm, n: usize) -> Vec<Pair> {
    let pairs = keyed_pairs(algorithm, n, |i| format!("rl:{{{i:08x}}}:ab"));
    assert!(pairs.iter().all(|p| p.key.len() == 16));
    pairs
}

fn keyed_pairs(algorithm: Algorithm, n: usize, key: impl Fn(usize) -> String) -> Vec<Pair> {
    (0..n)
        .map(|i| Pair {
            key: Bytes::from(key(i)),
            limit: limit(algorithm).into(),
            cost: 1,
        })
        .collect()
}

fn check(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_check");
    group.throughput(Throughput::Elements(1));
    for algorithm in Algorithm::ALL {
        let cases = [
            (
                "hot_key",
                "1M_keys",
                pairs as fn(Algorithm, usize) -> Vec<Pair>,
            ),
            ("hot_short_key", "1M_short_keys", short_pairs),
        ];
        for (hot_name, many_name, make) in cases {
            let store = Store::new(StoreConfig::default());
            let hot = make(algorithm, 1);
            let mut now = 1_000_000_000u64;
            group.bench_function(BenchmarkId::new(hot_name, algorithm.name()), |b| {
                b.iter_custom(|iters| {
                    timed(|| {
                        for _ in 0..iters {
                            now += 1_000;
                            black_box(store.check(
                                black_box(&[as_check(&hot[0])]),
                                now,
                                Mode::Charge,
                            ));
                        }
                    })
                })
            });

            let store = Store::new(StoreConfig::default());
            let many = make(algorithm, KEYS);
            for p in &many {
                store.check(&[as_check(p)], now, Mode::Charge);
            }
            let mut i = 0usize;
            group.bench_function(BenchmarkId::new(many_name, algorithm.name()), |b| {
                b.iter_custom(|iters| {
                    timed(|| {
                        for _ in 0..iters {
                            // A large odd stride walks the keys in a
                            // cache-unfriendly order.
                            i = (i + 7_919) % KEYS;
                            now += 1_000;
                            let pair = &[as_check(&many[i])];
                            black_box(store.check(pair, now, Mode::Charge));
                        }
                    })
                })
            });
        }
    }
    group.finish();
}

/// The rewrite path alone: 1024 short keys in turn, the clock moving 2 ms
/// a check, so each key is revisited 2 s later, past its state's expiry
/// (a 1 s window, a leaky bucket's `tat`): every check drops an expired
/// state and inserts a new one, with every line in cache (unlike
/// `1M_keys`, whose cache misses hide a few nanoseconds either way).
fn rewrite(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_rewrite");
    group.throughput(Throughput::Elements(1));
    for algorithm in [Algorithm::FixedWindow, Algorithm::LeakyBucket] {
        let store = Store::new(StoreConfig::default());
        let keys = short_pairs(algorithm, 1024);
        let (mut now, mut i) = (1_000_000_000u64, 0usize);
        group.bench_function(BenchmarkId::new("1k_expired", algorithm.name()), |b| {
            b.iter_custom(|iters| {
                timed(|| {
                    for _ in 0..iters {
                        i = (i + 1) % keys.len();
                        now += 2_000_000;
                        let pair = &[as_check(&keys[i])];
                        black_box(store.check(pair, now, Mode::Charge));
                    }
                })
            })
        });
    }
    group.finish();
}

/// Two threads checking at once: the hot key contends on one stripe, the
/// 1M keys spread over all of them.
fn check_two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_check_2_threads");
    group.throughput(Throughput::Elements(1));
    let algorithm = Algorithm::TokenBucket;
    let hot = pairs(algorithm, 1);
    let many = pairs(algorithm, KEYS);
    let store = Store::new(StoreConfig::default());
    for p in &many {
        store.check(&[as_check(p)], 1, Mode::Charge);
    }
    for (name, keys) in [("hot_key", &hot), ("1M_keys", &many)] {
        group.bench_function(BenchmarkId::new(name, algorithm.name()), |b| {
            b.iter_custom(|iters| {
                timed(|| {
                    std::thread::scope(|s| {
                        for t in 0..2u64 {
                            let (store, keys) = (&store, &keys);
                            s.spawn(move || {
                                let mut i = t as usize * 4_999;
                                for n in 0..iters / 2 {
                                    i = (i + 7_919) % keys.len();
                                    let now = 2_000_000_000 + n * 1_000;
                                    black_box(store.check(
                                        &[as_check(&keys[i])],
                                        now,
                                        Mode::Charge,
                                    ));
                                }
                            });
                        }
                    })
                })
            })
        });
    }
    group.finish();
}

/// A store at its memory cap with policy `refuse`: a check of a new key is
/// refused (StoreFull), a check of a key already held is admitted. The two
/// should cost about the same: a refusal must not be the slow path an
/// attacker flooding new keys can aim at.
fn at_the_cap(c: &mut Criterion) {
    let mut group = c.benchmark_group("store_at_cap_refuse");
    group.throughput(Throughput::Elements(1));
    let store = Store::new(StoreConfig {
        stripes: 64,
        max_memory: Some(64 * 64 * 1024),
        on_full: Full::Refuse,
        ..StoreConfig::default()
    });
    let now = 1_000_000_000u64;
    // One token an hour, a burst of a million: every key outlives the
    // bench's clock (1 µs per iteration) and every held key keeps passing.
    let hourly = Limit {
        algorithm: Algorithm::TokenBucket,
        count: 1,
        period_ms: 3_600_000,
        burst: 1_000_000,
    };
    let keyed = |prefix: &str, i: usize| Pair {
        key: Bytes::from(format!("rl:{{{prefix}{i:08}}}:s")),
        limit: hourly.into(),
        cost: 1,
    };
    // Fill until new keys are refused; keep what was admitted.
    let mut held = Vec::new();
    for p in (0..100_000).map(|i| keyed("user", i)) {
        if let tollgate_protocol::CheckResult::Decision(_) =
            store.check(&[as_check(&p)], now, Mode::Charge)
        {
            held.push(p);
        }
    }
    let fresh: Vec<Pair> = (0..KEYS).map(|i| keyed("new", i)).collect();
    let mut t = now;
    for (name, keys) in [("refused_new_key", &fresh), ("admitted_held_key", &held)] {
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                timed(|| {
                    for _ in 0..iters {
                        i = (i + 7_919) % keys.len();
                        t += 1_000;
                        let pair = &[as_check(&keys[i])];
                        black_box(store.check(pair, t, Mode::Charge));
                    }
                })
            })
        });
    }
    group.finish();
}

/// The deny path's bookkeeping: one denial recorded in the throttled-keys
/// sketch, for a few hot keys and for a flood of distinct keys, on one
/// thread and on two at once.
fn throttled_record(c: &mut Criterion) {
    let mut group = c.benchmark_group("throttled_record");
    group.throughput(Throughput::Elements(1));
    let flood: Vec<Bytes> = (0..KEYS)
        .map(|i| Bytes::from(format!("rl:{{user{i:08}}}:s")))
        .collect();
    let hot: Vec<Bytes> = flood[..8].to_vec();
    for (name, keys) in [("hot_keys", &hot), ("flood", &flood)] {
        let sketch = TopThrottled::new(1024, 60_000_000_000);
        for threads in [1u64, 2] {
            group.bench_function(BenchmarkId::new(name, format!("{threads}_threads")), |b| {
                b.iter_custom(|iters| {
                    timed(|| {
                        std::thread::scope(|s| {
                            for t in 0..threads {
                                let (sketch, keys) = (&sketch, &keys);
                                s.spawn(move || {
                                    let mut i = t as usize * 4_999;
                                    for _ in 0..iters / threads {
                                        i = (i + 7_919) % keys.len();
                                        sketch.record(&keys[i], 1_000_000_000);
                                    }
                                });
                            }
                        })
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    check,
    rewrite,
    check_two_threads,
    at_the_cap,
    throttled_record
);
criterion_main!(benches);
