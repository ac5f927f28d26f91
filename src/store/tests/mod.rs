//! Store behaviour with exact numbers: groups, slots, peeks, expiry.

use super::*;
use bytes::Bytes;
use tollgate_protocol::{Algorithm, CheckResult, Decision, ErrorCode, Limit};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn tb(key: &str, count: u64, period_ms: u64, burst: u64, cost: u32) -> ResolvedPair<'_> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::TokenBucket,
            count,
            period_ms,
            burst,
        },
        cost,
    )
}

fn sw(key: &str, count: u64, period_ms: u64, cost: u32) -> ResolvedPair<'_> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::SlidingWindow,
            count,
            period_ms,
            burst: 0,
        },
        cost,
    )
}

fn decided(r: CheckResult) -> Decision {
    match r {
        CheckResult::Decision(d) => d,
        CheckResult::Error(e) => panic!("unexpected error {e}"),
    }
}

fn store() -> Store {
    Store::new(StoreConfig {
        stripes: 16,
        ..StoreConfig::default()
    })
}

/// The hints a stripe holds follow its tables as checks grow them, for
/// short and long keys of each compact kind: published when the stripe
/// unlocks, with no lock taken by whoever reads them.
#[cfg(not(tollgate_loom))]
#[test]
fn stripe_hints_follow_the_tables() {
    let s = Store::new(StoreConfig {
        stripes: 1,
        ..StoreConfig::default()
    });
    let limit = |algorithm| Limit {
        algorithm,
        count: 10,
        period_ms: 1000,
        burst: if algorithm == Algorithm::FixedWindow {
            0
        } else {
            10
        },
    };
    for i in 0..3_000 {
        let stripe = &s.stripes[0];
        for (algorithm, prefix) in [
            (Algorithm::TokenBucket, "b"),
            (Algorithm::LeakyBucket, "l"),
            (Algorithm::FixedWindow, "w"),
        ] {
            // 15 bytes (a short key) and 17 (a long one).
            for key in [format!("{prefix}:{i:013}"), format!("{prefix}:{i:015}")] {
                let check = ResolvedPair::new(key.as_bytes(), limit(algorithm), 1);
                assert!(decided(s.check(&[check], S, Mode::Charge)).allowed);
            }
        }
        if i == 5 || i == 2_999 {
            let guard = stripe.lock();
            assert!(guard.tables.assert_hints(&stripe.hints, &s.hasher) > i / 2);
        }
    }
}

#[test]
fn single_key_follows_the_token_bucket() {
    let s = store();
    let p = [tb("k", 5, 1000, 10, 1)];
    let allowed = (0..12)
        .filter(|_| decided(s.check(&p, S, Mode::Charge)).allowed)
        .count();
    assert_eq!(allowed, 10);
    let d = decided(s.check(&p, S, Mode::Charge));
    assert_eq!(d.retry_after_ms, 200);
    assert_eq!(d.reset_after_ms, 2000);
}

#[test]
fn group_is_all_or_nothing() {
    let s = store();
    let second = tb("rl:{k42}:second", 100, 1000, 200, 1);
    let day = tb("rl:{k42}:day", 3, 86_400_000, 3, 1);
    let group = [second, day];
    for _ in 0..3 {
        let d = decided(s.check(&group, S, Mode::Charge));
        assert!(d.allowed);
        // The day limit is the tighter one.
        assert_eq!(d.pair, 1);
    }
    let before = s.get(b"rl:{k42}:second", S).unwrap();
    let d = decided(s.check(&group, S, Mode::Charge));
    assert!(!d.allowed);
    assert_eq!(d.pair, 1);
    assert_eq!(d.retry_after_ms, 86_400_000 / 3);
    // The per-second pair passed on its own but was not charged.
    assert_eq!(s.get(b"rl:{k42}:second", S).unwrap(), before);
    let alone = decided(s.check(&[second], S, Mode::Charge));
    assert_eq!(alone.remaining, 200 - 3 - 1);
}

#[test]
fn denial_reports_the_longest_wait() {
    let s = store();
    // Exhaust both pairs, then the one with the longer refill wins.
    let a = tb("{t}a", 1, 1000, 1, 1);
    let b = tb("{t}b", 1, 5000, 1, 1);
    assert!(decided(s.check(&[a, b], S, Mode::Charge)).allowed);
    let d = decided(s.check(&[a, b], S, Mode::Charge));
    assert!(!d.allowed);
    assert_eq!((d.pair, d.retry_after_ms), (1, 5000));
}

#[test]
fn cross_slot_group_is_refused_and_charges_nothing() {
    let s = store();
    let group = [
        tb("rl:{a}:x", 5, 1000, 10, 1),
        tb("rl:{b}:x", 5, 1000, 10, 1),
    ];
    assert_eq!(
        s.check(&group, S, Mode::Charge),
        CheckResult::Error(ErrorCode::CrossSlot)
    );
    assert!(s.is_empty());
}

#[test]
fn duplicate_key_in_a_group_counts_twice() {
    let s = store();
    let p = tb("dup", 1, 1000, 3, 2);
    // 2 + 2 > 3: the second sees the first's charge, so the group is denied.
    let d = decided(s.check(&[p, p], S, Mode::Charge));
    assert!(!d.allowed);
    assert!(s.is_empty());
    let q = tb("dup", 1, 1000, 3, 1);
    assert!(decided(s.check(&[q, q, q], S, Mode::Charge)).allowed);
    assert!(!decided(s.check(&[q], S, Mode::Charge)).allowed);
}

#[test]
fn peek_answers_without_charging() {
    let s = store();
    let p = [tb("p", 1, 1000, 2, 1)];
    for _ in 0..5 {
        let d = decided(s.check(&p, S, Mode::Peek));
        assert!(d.allowed);
        assert_eq!(d.remaining, 1);
    }
    assert!(s.is_empty());
    decided(s.check(&p, S, Mode::Charge));
    decided(s.check(&p, S, Mode::Charge));
    assert!(!decided(s.check(&p, S, Mode::Peek)).allowed);
}

#[test]
fn invalid_limits_are_typed_errors_that_charge_nothing() {
    let s = store();
    let bad = [
        tb("x", 0, 1000, 1, 1),
        tb("x", 1, 0, 1, 1),
        tb("x", 1, 1000, 0, 1),
        tb("x", 1, 1000, 1, 0),
        tb("x", u64::MAX, 1000, 1, 1),
        tb("x", 1, u64::MAX, 1, 1),
        tb("x", 1, 1000, u64::MAX, 1),
        sw("x", 0, 1000, 1),
    ];
    for p in bad {
        assert_eq!(
            s.check(std::slice::from_ref(&p), S, Mode::Charge),
            CheckResult::Error(ErrorCode::InvalidLimit),
            "{p:?}"
        );
    }
    // One bad pair poisons its whole group, and nothing is charged.
    let group = [tb("{g}ok", 5, 1000, 10, 1), tb("{g}bad", 5, 1000, 0, 1)];
    assert_eq!(
        s.check(&group, S, Mode::Charge),
        CheckResult::Error(ErrorCode::InvalidLimit)
    );
    assert!(s.is_empty());
}

#[test]
fn switching_algorithm_on_a_key_starts_fresh() {
    let s = store();
    decided(s.check(&[tb("k", 1, 1000, 1, 1)], S, Mode::Charge));
    let d = decided(s.check(&[sw("k", 3, 1000, 1)], S, Mode::Charge));
    assert!(d.allowed);
    assert_eq!(d.remaining, 2);
}

#[test]
fn idle_keys_expire_lazily_and_by_the_sweeper() {
    let s = store();
    for i in 0..100 {
        decided(s.check(&[tb(&format!("k{i}"), 10, 1000, 10, 1)], S, Mode::Charge));
    }
    decided(s.check(&[sw("w", 10, 1000, 1)], S, Mode::Charge));
    assert_eq!(s.len(), 101);
    // Each bucket is full again 100 ms later.
    let later = S + 100 * MS;
    assert!(s.get(b"k0", later - 1).is_some());
    assert!(s.get(b"k0", later).is_none());
    // A sweep over a part of the stripes removes only from those.
    let partial = s.sweep(4, later);
    assert!(partial < 100, "swept {partial}");
    let rest = s.sweep(s.stripe_count(), later);
    assert_eq!(partial + rest, 100);
    // The window key outlives them: charged in window 1, kept through window 2.
    assert_eq!(s.len(), 1);
    assert_eq!(s.sweep(s.stripe_count(), 3 * S - 1), 0);
    assert_eq!(s.sweep(s.stripe_count(), 3 * S), 1);
    assert!(s.is_empty());
}

#[test]
fn expired_entries_met_on_access_are_dropped_and_counted() {
    let s = store();
    decided(s.check(&[tb("b", 10, 1000, 10, 1)], S, Mode::Charge));
    decided(s.check(&[sw("w", 10, 1000, 1)], S, Mode::Charge));
    decided(s.check(&[cc("c", 1, 1000, 1)], S, Mode::Charge));
    assert_eq!((s.len(), s.expired_on_access()), (3, 0));
    // Live entries met by a check are not counted.
    decided(s.check(&[tb("b", 10, 1000, 10, 1)], S, Mode::Charge));
    assert_eq!(s.expired_on_access(), 0);
    // Later every entry has expired: each table counts what it drops, for a
    // check, a peek or a release alike; the sweeper finds nothing left.
    let later = 10 * S;
    decided(s.check(&[tb("b", 10, 1000, 10, 1)], later, Mode::Peek));
    assert_eq!(s.expired_on_access(), 1);
    decided(s.check(&[sw("w", 10, 1000, 1)], later, Mode::Charge));
    assert_eq!(s.expired_on_access(), 2);
    assert!(!s.release(b"c", 1, later));
    assert_eq!(s.expired_on_access(), 3);
    assert_eq!(s.sweep(s.stripe_count(), later), 0);
    // Keys never seen are not expiries.
    decided(s.check(&[tb("new", 10, 1000, 10, 1)], later, Mode::Charge));
    assert_eq!(s.expired_on_access(), 3);
}

#[test]
fn entries_lists_both_tables_of_a_key() {
    let s = store();
    assert!(s.entries(b"k", S).is_empty());
    decided(s.check(&[sw("k", 10, 1000, 1)], S, Mode::Charge));
    decided(s.check(&[tb("k", 10, 1000, 10, 1)], S, Mode::Charge));
    let algorithms: Vec<_> = s
        .entries(b"k", S)
        .iter()
        .map(|e| e.state.algorithm())
        .collect();
    assert_eq!(
        algorithms,
        [Algorithm::TokenBucket, Algorithm::SlidingWindow]
    );
    // The bucket is full again 100 ms later; the window lasts longer.
    let algorithms: Vec<_> = s
        .entries(b"k", S + 100 * MS)
        .iter()
        .map(|e| e.state.algorithm())
        .collect();
    assert_eq!(algorithms, [Algorithm::SlidingWindow]);
}

#[test]
fn remove_forgets_a_key() {
    let s = store();
    let p = [tb("r", 1, 1000, 1, 1)];
    decided(s.check(&p, S, Mode::Charge));
    assert!(!decided(s.check(&p, S, Mode::Charge)).allowed);
    assert!(s.remove(b"r", S));
    assert!(!s.remove(b"r", S));
    assert!(decided(s.check(&p, S, Mode::Charge)).allowed);
}

#[test]
fn stripe_count_is_a_power_of_two_within_slots() {
    for (asked, got) in [(0, 1), (1, 1), (3, 4), (1000, 1024), (1 << 20, 16384)] {
        let s = Store::new(StoreConfig {
            stripes: asked,
            ..StoreConfig::default()
        });
        assert_eq!(s.stripe_count(), got);
    }
}

fn pair(
    key: &str,
    algorithm: Algorithm,
    count: u64,
    period_ms: u64,
    burst: u64,
    cost: u32,
) -> ResolvedPair<'_> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm,
            count,
            period_ms,
            burst,
        },
        cost,
    )
}

fn fw(key: &str, count: u64, period_ms: u64, cost: u32) -> ResolvedPair<'_> {
    pair(key, Algorithm::FixedWindow, count, period_ms, 0, cost)
}

fn log(key: &str, count: u64, period_ms: u64, cost: u32) -> ResolvedPair<'_> {
    pair(key, Algorithm::SlidingLog, count, period_ms, 0, cost)
}

fn cc(key: &str, count: u64, ttl_ms: u64, cost: u32) -> ResolvedPair<'_> {
    pair(key, Algorithm::Concurrency, count, ttl_ms, 0, cost)
}

const DAY_MS: u64 = 86_400_000;

/// The seed scenario: 100/s burst 200 (token bucket) and 10,000/day (fixed
/// window) on one API key, checked as one group.
fn api_key_group(cost: u32) -> [ResolvedPair<'static>; 2] {
    [
        tb("rl:{k}:s", 100, 1000, 200, cost),
        fw("rl:{k}:d", 10_000, DAY_MS, cost),
    ]
}

/// A one-stripe store capped at `max_memory`.
fn capped(max_memory: usize, on_full: Full) -> Store {
    Store::new(StoreConfig {
        stripes: 1,
        max_memory: Some(max_memory),
        on_full,
        ..StoreConfig::default()
    })
}

mod compact;
mod groups;
mod memory_cap;
#[cfg(not(tollgate_loom))]
mod model;
mod states;
