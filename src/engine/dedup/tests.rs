//! The retry memory's behaviours, as a CHECK2 sees them.

use super::*;
use tollgate_protocol::{Decision, ErrorCode};

fn memory(window_ns: u64, capacity: usize) -> RetryMemory {
    let metrics = DedupMetrics::register(&Registry::new()).expect("metrics");
    RetryMemory::new(Duration::from_nanos(window_ns), capacity, metrics)
}

fn allowed(remaining: u64) -> CheckResult {
    CheckResult::Decision(Decision {
        allowed: true,
        shadow_denied: false,
        pair: 0,
        limit: 10,
        remaining,
        reset_after_ms: 1,
        retry_after_ms: 0,
        lease: None,
    })
}

/// The scope every check of these tests has, but where a test says.
const S: u64 = 7;

fn key(n: u128) -> IdempotencyKey {
    IdempotencyKey::from_u128(n)
}

#[test]
fn a_retry_within_the_window_is_replayed_not_evaluated() {
    let m = memory(100, 1024);
    assert_eq!(
        m.once(key(1), S, 0, || allowed(9)),
        Answered::Fresh(allowed(9))
    );
    let replay = m.once(key(1), S, 99, || panic!("evaluated twice"));
    assert_eq!(replay, Answered::Replayed(allowed(9)));
    // Another key is its own check.
    assert_eq!(
        m.once(key(2), S, 99, || allowed(8)),
        Answered::Fresh(allowed(8))
    );
    // The window is over: evaluated again.
    assert_eq!(
        m.once(key(1), S, 100, || allowed(7)),
        Answered::Fresh(allowed(7))
    );
    assert_eq!(m.metrics.replayed.get(), 1);
}

#[test]
fn errors_are_not_remembered() {
    let m = memory(100, 1024);
    let shed = CheckResult::Error(ErrorCode::Shed);
    assert_eq!(m.once(key(1), S, 0, || shed), Answered::Fresh(shed));
    assert_eq!(
        m.once(key(1), S, 1, || allowed(5)),
        Answered::Fresh(allowed(5))
    );
    assert_eq!(
        m.once(key(1), S, 2, || allowed(4)),
        Answered::Replayed(allowed(5))
    );
}

#[test]
fn a_full_memory_forgets_its_oldest_keys_first() {
    // One key per shard: the second key of a shard evicts the first.
    let m = memory(1_000, 1);
    let mut evaluated = 0;
    for n in 0..(SHARDS as u128 * 4) {
        if let Answered::Fresh(_) = m.once(key(n), S, n as u64, || allowed(1)) {
            evaluated += 1;
        }
    }
    assert_eq!(evaluated, SHARDS * 4);
    let held: usize = m
        .shards
        .iter()
        .map(|s| {
            let s = s.shard.lock();
            s.young.len() + s.old.len()
        })
        .sum();
    assert!(held <= SHARDS, "{held} keys held, at most one a shard");
    assert!(m.metrics.evicted.get() >= (SHARDS * 3) as u64);
    // The newest key is still remembered.
    let last = key(SHARDS as u128 * 4 - 1);
    assert!(matches!(
        m.once(last, S, 999, || allowed(0)),
        Answered::Replayed(_)
    ));
}

/// `n` keys that share one shard.
fn same_shard(m: &RetryMemory, n: usize) -> Vec<IdempotencyKey> {
    let shard = |k: IdempotencyKey| (m.hasher.hash_one(k) >> 32) as usize % SHARDS;
    let first = shard(key(0));
    (0..)
        .map(key)
        .filter(|&k| shard(k) == first)
        .take(n)
        .collect()
}

#[test]
fn a_full_shard_forgets_its_older_generation_whole() {
    // Four keys a shard: two generations of two.
    let m = memory(1_000, SHARDS * 4);
    let k = same_shard(&m, 6);
    for (at, &k) in k[..4].iter().enumerate() {
        assert!(matches!(
            m.once(k, S, at as u64, || allowed(1)),
            Answered::Fresh(_)
        ));
    }
    // All four are held: the shard is full, nothing forgotten yet.
    for &k in &k[..4] {
        assert!(matches!(
            m.once(k, S, 10, || panic!("evaluated")),
            Answered::Replayed(_)
        ));
    }
    assert_eq!(m.metrics.evicted.get(), 0);
    // A fifth forgets the two oldest, and only them.
    m.once(k[4], S, 11, || allowed(1));
    assert_eq!(m.metrics.evicted.get(), 2);
    for &k in &k[2..5] {
        assert!(matches!(
            m.once(k, S, 12, || panic!("evaluated")),
            Answered::Replayed(_)
        ));
    }
    assert!(matches!(
        m.once(k[0], S, 13, || allowed(1)),
        Answered::Fresh(_)
    ));
}

#[test]
fn a_generation_forgotten_after_its_window_counts_no_eviction() {
    let m = memory(10, SHARDS * 2);
    let k = same_shard(&m, 4);
    m.once(k[0], S, 0, || allowed(1));
    m.once(k[1], S, 1, || allowed(1));
    // Both expired by 20: forgetting them evicts nothing early.
    m.once(k[2], S, 20, || allowed(1));
    m.once(k[3], S, 21, || allowed(1));
    assert_eq!(m.metrics.evicted.get(), 0);
}

#[test]
fn no_shard_ever_holds_more_than_its_share() {
    for per_shard in [1, 2, 3, 5, 8] {
        let m = memory(u64::MAX, SHARDS * per_shard);
        let k = same_shard(&m, 40);
        for (at, &k) in k.iter().enumerate() {
            m.once(k, S, at as u64, || allowed(1));
            let held = m.shards.iter().map(|s| {
                let s = s.shard.lock();
                s.young.len() + s.old.len()
            });
            assert!(held.max().unwrap() <= per_shard, "share {per_shard}");
        }
        // Every key not held was counted forgotten; the newest is held.
        let held: u64 = m
            .shards
            .iter()
            .map(|s| {
                let s = s.shard.lock();
                (s.young.len() + s.old.len()) as u64
            })
            .sum();
        assert_eq!(m.metrics.evicted.get(), 40 - held);
        assert!(matches!(
            m.once(k[39], S, 99, || allowed(0)),
            Answered::Replayed(_)
        ));
    }
}

#[test]
fn an_expired_key_is_evaluated_afresh_and_remembered_again() {
    let m = memory(10, 1024);
    m.once(key(1), S, 0, || allowed(3));
    assert_eq!(
        m.once(key(1), S, 10, || allowed(2)),
        Answered::Fresh(allowed(2))
    );
    assert_eq!(
        m.once(key(1), S, 15, || allowed(0)),
        Answered::Replayed(allowed(2))
    );
}

#[test]
fn a_key_remembered_for_another_scope_is_refused_and_kept() {
    let m = memory(100, 1024);
    m.once(key(1), S, 0, || allowed(3));
    let other = m.once(key(1), S + 1, 1, || panic!("evaluated"));
    assert_eq!(other, Answered::Refused);
    assert_eq!(
        other.result(),
        CheckResult::Error(ErrorCode::IdempotencyKeyReused)
    );
    // The owner's own retry is still answered from memory.
    assert_eq!(
        m.once(key(1), S, 2, || panic!("evaluated")),
        Answered::Replayed(allowed(3))
    );
    assert_eq!(m.metrics.refused.get(), 1);
}

#[test]
fn the_scope_tells_owners_and_checks_apart() {
    use bytes::Bytes;
    use tollgate_protocol::{Algorithm, Limit, LimitRef};
    let m = memory(100, 1024);
    let pair = |key: &'static str, count: u64, cost: u32| Pair {
        key: Bytes::from_static(key.as_bytes()),
        limit: LimitRef::Inline(Limit {
            algorithm: Algorithm::TokenBucket,
            count,
            period_ms: 1000,
            burst: count,
        }),
        cost,
    };
    let a = m.owner(Privilege::Client, b"token-a");
    let b = m.owner(Privilege::Client, b"token-b");
    assert_eq!(a, m.owner(Privilege::Client, b"token-a"));
    assert_ne!(a, b);
    let check = [pair("k", 10, 1)];
    let base = m.scope(a, &check);
    assert_eq!(base, m.scope(a, &[pair("k", 10, 1)]));
    assert_ne!(base, m.scope(b, &check));
    assert_ne!(base, m.scope(a, &[pair("j", 10, 1)]));
    assert_ne!(base, m.scope(a, &[pair("k", 11, 1)]));
    assert_ne!(base, m.scope(a, &[pair("k", 10, 2)]));
    assert_ne!(base, m.scope(a, &[pair("k", 10, 1), pair("k", 10, 1)]));
}

/// A retry within the window is replayed, a key of another scope refused,
/// errors not remembered, and the older generation forgotten whole, exactly
/// as two plain lists of entries would have it: checks of a few keys of one
/// shard, at random, so that keys collide in the index, expire and come
/// back, and generations turn over while a key's lookup is in flight.
#[test]
fn the_memory_answers_as_two_plain_lists_of_entries_would() {
    let window = 50;
    let mut random = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |n: u64| {
        // xorshift64: deterministic, so a failure is replayed as it was.
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random % n
    };
    for per_shard in [1, 2, 3, 4, 7, 16] {
        let m = memory(window, SHARDS * per_shard);
        let keys = same_shard(&m, 3 * per_shard + 2);
        let half = per_shard.div_ceil(2);
        let (mut young, mut old) = (Vec::<Entry>::new(), Vec::<Entry>::new());
        let (mut now, mut evicted) = (0, 0);
        for step in 0..4000 {
            now += next(8);
            let k = keys[next(keys.len() as u64) as usize];
            let scope = S + u64::from(next(8) == 0);
            let result = match next(5) {
                0 => CheckResult::Error(ErrorCode::Shed),
                _ => allowed(step),
            };
            let live = |e: &&Entry| now - e.at < window;
            let find = |g: &[Entry]| g.iter().find(|e| e.key == k).filter(live).copied();
            let expected = match find(&young).or_else(|| find(&old)) {
                Some(e) if e.scope != scope => Answered::Refused,
                Some(e) => Answered::Replayed(e.result),
                None => {
                    if young.len() >= half || young.len() + old.len() >= per_shard {
                        evicted += old.iter().filter(live).count() as u64;
                        old = std::mem::take(&mut young);
                        if old.len() >= per_shard {
                            evicted += old.iter().filter(live).count() as u64;
                            old.clear();
                        }
                    }
                    if let CheckResult::Decision(_) = result {
                        let entry = Entry {
                            key: k,
                            result,
                            scope,
                            at: now,
                        };
                        match young.iter_mut().find(|e| e.key == k) {
                            Some(e) => *e = entry,
                            None => young.push(entry),
                        }
                    }
                    Answered::Fresh(result)
                }
            };
            let answered = m.once(k, scope, now, || result);
            assert_eq!(answered, expected, "share {per_shard}, step {step}");
        }
        assert_eq!(m.metrics.evicted.get(), evicted, "share {per_shard}");
    }
}
