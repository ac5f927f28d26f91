//! Store behaviour with exact numbers: groups, slots, peeks, expiry.

use super::*;
use bytes::Bytes;
use tollgate_protocol::{Algorithm, CheckResult, Decision, ErrorCode, Limit, Pair};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

fn tb(key: &str, count: u64, period_ms: u64, burst: u64, cost: u32) -> Pair {
    Pair {
        key: Bytes::copy_from_slice(key.as_bytes()),
        limit: Limit {
            algorithm: Algorithm::TokenBucket,
            count,
            period_ms,
            burst,
        }
        .into(),
        cost,
    }
}

fn sw(key: &str, count: u64, period_ms: u64, cost: u32) -> Pair {
    Pair {
        key: Bytes::copy_from_slice(key.as_bytes()),
        limit: Limit {
            algorithm: Algorithm::SlidingWindow,
            count,
            period_ms,
            burst: 0,
        }
        .into(),
        cost,
    }
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
    let group = [second.clone(), day.clone()];
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
    assert!(decided(s.check(&[a.clone(), b.clone()], S, Mode::Charge)).allowed);
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
    let d = decided(s.check(&[p.clone(), p.clone()], S, Mode::Charge));
    assert!(!d.allowed);
    assert!(s.is_empty());
    let q = tb("dup", 1, 1000, 3, 1);
    assert!(decided(s.check(&[q.clone(), q.clone(), q.clone()], S, Mode::Charge)).allowed);
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
fn a_named_rule_must_be_resolved_before_the_store() {
    let s = store();
    let named = Pair::rule(
        Bytes::from_static(b"k"),
        tollgate_protocol::RuleName::from_static("api"),
        1,
    );
    assert_eq!(
        s.check(std::slice::from_ref(&named), S, Mode::Charge),
        CheckResult::Error(ErrorCode::UnknownRule)
    );
    assert_eq!(
        s.refund(std::slice::from_ref(&named), S),
        CheckResult::Error(ErrorCode::UnknownRule)
    );
    assert!(s.is_empty());
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
) -> Pair {
    Pair {
        key: Bytes::copy_from_slice(key.as_bytes()),
        limit: Limit {
            algorithm,
            count,
            period_ms,
            burst,
        }
        .into(),
        cost,
    }
}

fn fw(key: &str, count: u64, period_ms: u64, cost: u32) -> Pair {
    pair(key, Algorithm::FixedWindow, count, period_ms, 0, cost)
}

fn log(key: &str, count: u64, period_ms: u64, cost: u32) -> Pair {
    pair(key, Algorithm::SlidingLog, count, period_ms, 0, cost)
}

fn cc(key: &str, count: u64, ttl_ms: u64, cost: u32) -> Pair {
    pair(key, Algorithm::Concurrency, count, ttl_ms, 0, cost)
}

const DAY_MS: u64 = 86_400_000;

/// The seed scenario: 100/s burst 200 (token bucket) and 10,000/day (fixed
/// window) on one API key, checked as one group.
fn api_key_group(cost: u32) -> [Pair; 2] {
    [
        tb("rl:{k}:s", 100, 1000, 200, cost),
        fw("rl:{k}:d", 10_000, DAY_MS, cost),
    ]
}

#[test]
fn mixed_group_denied_by_the_day_window_charges_nothing() {
    let s = store();
    // Spend the day's 10,000 in 50 checks of 200, 2 s apart so that the
    // bucket refills between them. Day window 0 is [0, 1 day).
    for i in 0..50 {
        let d = decided(s.check(&api_key_group(200), S + i * 2 * S, Mode::Charge));
        assert!(d.allowed);
    }
    // One second after the last charge the bucket holds 100 tokens again.
    let now = S + 49 * 2 * S + S;
    assert_eq!(
        decided(s.check(&api_key_group(1)[..1], now, Mode::Peek)).remaining,
        99
    );
    let bucket_before = s.get(b"rl:{k}:s", now).unwrap();
    let day_before = s.get(b"rl:{k}:d", now).unwrap();
    let d = decided(s.check(&api_key_group(1), now, Mode::Charge));
    assert!(!d.allowed);
    assert_eq!(d.pair, 1, "the day window denied");
    assert_eq!(d.limit, 10_000);
    assert_eq!(d.remaining, 0);
    assert_eq!(d.retry_after_ms, (DAY_MS * MS - now) / MS);
    assert_eq!(d.lease, None);
    // The bucket passed on its own but was not charged; nor was the day.
    assert_eq!(s.get(b"rl:{k}:s", now).unwrap(), bucket_before);
    assert_eq!(s.get(b"rl:{k}:d", now).unwrap(), day_before);
    // The next day the group passes again; the bucket (200 - 1) has less
    // left than the day (10,000 - 1), so the decision describes it.
    let tomorrow = DAY_MS * MS;
    let d = decided(s.check(&api_key_group(1), tomorrow, Mode::Charge));
    assert!(d.allowed);
    assert_eq!((d.pair, d.remaining), (0, 199));
}

#[test]
fn when_several_pairs_deny_the_longest_wait_is_named() {
    let s = store();
    let now = S;
    // Empty the bucket (200) and the day window (200 of a 200/day) at once.
    let group = [
        tb("rl:{k}:s", 100, 1000, 200, 200),
        fw("rl:{k}:d", 200, DAY_MS, 200),
    ];
    assert!(decided(s.check(&group, now, Mode::Charge)).allowed);
    let next = [
        tb("rl:{k}:s", 100, 1000, 200, 1),
        fw("rl:{k}:d", 200, DAY_MS, 1),
    ];
    let d = decided(s.check(&next, now, Mode::Charge));
    assert!(!d.allowed);
    // Both deny: the bucket in 10 ms, the day window at its end.
    assert_eq!(d.pair, 1);
    assert_eq!(d.retry_after_ms, DAY_MS - 1000);
    // The same pairs in the other order: still the day window, now index 0.
    let swapped = [next[1].clone(), next[0].clone()];
    let d = decided(s.check(&swapped, now, Mode::Charge));
    assert_eq!((d.pair, d.retry_after_ms), (0, DAY_MS - 1000));
    // A cost no pair can ever take: "never" wins over any wait.
    let never = [
        fw("rl:{k}:d", 200, DAY_MS, 1),
        tb("rl:{k}:s", 100, 1000, 200, 201),
    ];
    let d = decided(s.check(&never, now, Mode::Charge));
    assert_eq!(
        (d.pair, d.retry_after_ms),
        (1, tollgate_protocol::RETRY_NEVER)
    );
}

#[test]
fn every_algorithm_is_all_or_nothing_in_a_group() {
    // Each algorithm as the pair that passes, next to a pair that denies:
    // its state must not change.
    let s = store();
    let blocker = fw("{g}blocker", 1, 1000, 1);
    assert!(decided(s.check(std::slice::from_ref(&blocker), S, Mode::Charge)).allowed);
    let passing = [
        tb("{g}tb", 5, 1000, 5, 1),
        sw("{g}sw", 5, 1000, 1),
        fw("{g}fw", 5, 1000, 1),
        log("{g}log", 5, 1000, 1),
        pair("{g}leaky", Algorithm::LeakyBucket, 5, 1000, 5, 1),
        cc("{g}cc", 5, 1000, 1),
    ];
    for p in &passing {
        let group = [p.clone(), blocker.clone()];
        let d = decided(s.check(&group, S, Mode::Charge));
        assert!(!d.allowed, "{p:?}");
        assert_eq!(d.pair, 1);
        assert_eq!(d.lease, None);
        assert!(s.get(&p.key, S).is_none(), "{:?} was charged", p.limit);
        // And alone it passes (and is charged).
        let alone = decided(s.check(std::slice::from_ref(p), S, Mode::Charge));
        assert!(alone.allowed);
        assert_eq!(alone.remaining, 4);
        assert!(s.get(&p.key, S).is_some());
    }
}

#[test]
fn an_allowed_concurrency_check_returns_its_lease_and_release_frees_it() {
    let s = store();
    let p = [cc("jobs", 2, 30_000, 1)];
    let a = decided(s.check(&p, S, Mode::Charge));
    let b = decided(s.check(&p, S, Mode::Charge));
    let (Some(a_lease), Some(b_lease)) = (a.lease, b.lease) else {
        panic!("allowed acquires hold leases: {a:?} {b:?}")
    };
    assert_ne!(a_lease, b_lease);
    assert_eq!((a.limit, a.remaining, b.remaining), (2, 1, 0));
    assert_eq!(a.reset_after_ms, 30_000);
    let full = decided(s.check(&p, S, Mode::Charge));
    assert!(!full.allowed);
    assert_eq!(full.lease, None);
    assert_eq!(full.retry_after_ms, 30_000);
    // A peek answers as an acquire would, but acquires nothing.
    assert!(s.release(b"jobs", a_lease, S));
    let peek = decided(s.check(&p, S, Mode::Peek));
    assert!(peek.allowed);
    assert_eq!(peek.lease, None);
    assert_eq!(peek.remaining, 0);
    // Releasing twice, an unknown id, another key: nothing.
    assert!(!s.release(b"jobs", a_lease, S));
    assert!(!s.release(b"jobs", 12345, S));
    assert!(!s.release(b"other", b_lease, S));
    let c = decided(s.check(&p, S, Mode::Charge));
    assert!(c.allowed && c.lease.is_some());
    // Leases not released expire: 30 s later both slots are free.
    let later = S + 30 * S;
    assert!(!s.release(b"jobs", b_lease, later), "expired");
    assert_eq!(decided(s.check(&p, later, Mode::Peek)).remaining, 1);
    // A key with the last lease released is forgotten once its ids are past.
    let d = decided(s.check(&[cc("one", 1, 1000, 1)], later, Mode::Charge));
    assert!(s.release(b"one", d.lease.unwrap(), later + 1));
    assert!(s.get(b"one", later + 1).is_none());
}

#[test]
fn a_group_carries_the_lease_of_its_concurrency_pair() {
    let s = store();
    let group = [
        tb("{u1}:rate", 10, 1000, 10, 1),
        cc("{u1}:inflight", 3, 60_000, 1),
    ];
    let d = decided(s.check(&group, S, Mode::Charge));
    assert!(d.allowed);
    // The concurrency pair has the least remaining (2 vs 9) ...
    assert_eq!((d.pair, d.remaining), (1, 2));
    let lease = d.lease.expect("a lease");
    // ... but the lease comes with the group's decision whichever pair it
    // describes: here the bucket, once it is the tighter one.
    let tight = [
        tb("{u1}:rate", 10, 1000, 10, 8),
        cc("{u1}:inflight", 3, 60_000, 1),
    ];
    let d = decided(s.check(&tight, S, Mode::Charge));
    assert_eq!((d.pair, d.remaining), (0, 1));
    assert!(d.lease.is_some());
    assert!(s.release(b"{u1}:inflight", lease, S));
    // Two concurrency pairs in one group: refused, nothing charged.
    let two = [cc("{u1}:a", 3, 1000, 1), cc("{u1}:b", 3, 1000, 1)];
    assert_eq!(
        s.check(&two, S, Mode::Charge),
        CheckResult::Error(ErrorCode::InvalidLimit)
    );
    assert!(s.get(b"{u1}:a", S).is_none());
}

#[test]
fn refund_gives_back_and_never_exceeds_the_limit() {
    let s = store();
    // Charged 4000 tokens of a 100,000/min budget up front, used 1200.
    let charge = [tb("llm:{org}", 100_000, 60_000, 100_000, 4000)];
    assert_eq!(decided(s.check(&charge, S, Mode::Charge)).remaining, 96_000);
    let back = [tb("llm:{org}", 100_000, 60_000, 100_000, 2800)];
    let d = decided(s.refund(&back, S));
    assert!(d.allowed);
    assert_eq!(d.remaining, 98_800);
    assert_eq!(d.retry_after_ms, 0);
    assert_eq!(d.lease, None);
    // Over-refunding stops at full, and a full bucket is forgotten.
    let d = decided(s.refund(&back, S));
    assert_eq!(d.remaining, 100_000);
    assert!(s.get(b"llm:{org}", S).is_none());
    // A key with no state: no-op, answered as full, nothing stored.
    let d = decided(s.refund(&[fw("fresh", 10, 1000, 3)], S));
    assert_eq!((d.allowed, d.remaining, d.limit), (true, 10, 10));
    assert!(s.is_empty());
}

#[test]
fn refund_on_each_algorithm() {
    let s = store();
    for p in [
        sw("w", 10, 1000, 6),
        fw("f", 10, 1000, 6),
        log("l", 10, 1000, 6),
        pair("b", Algorithm::LeakyBucket, 10, 1000, 10, 6),
    ] {
        assert_eq!(
            decided(s.check(std::slice::from_ref(&p), S, Mode::Charge)).remaining,
            4
        );
        let mut back = p.clone();
        back.cost = 2;
        let d = decided(s.refund(std::slice::from_ref(&back), S));
        assert_eq!(d.remaining, 6, "{:?}", p.limit);
        // The refunded units can be taken again, and no more.
        let mut again = p.clone();
        again.cost = 6;
        assert!(decided(s.check(std::slice::from_ref(&again), S, Mode::Charge)).allowed);
        let mut one = p.clone();
        one.cost = 1;
        assert!(!decided(s.check(std::slice::from_ref(&one), S, Mode::Charge)).allowed);
    }
    // Concurrency slots are released, not refunded.
    decided(s.check(&[cc("c", 2, 1000, 1)], S, Mode::Charge));
    assert_eq!(
        s.refund(&[cc("c", 2, 1000, 1)], S),
        CheckResult::Error(ErrorCode::InvalidLimit)
    );
    // A refund of another algorithm's key leaves that state alone.
    let before = s.get(b"w", S).unwrap();
    decided(s.refund(&[tb("w", 10, 1000, 10, 5)], S));
    assert_eq!(s.get(b"w", S).unwrap(), before);
}

#[test]
fn a_refund_group_is_atomic_and_answered_by_the_least_remaining() {
    let s = store();
    let group = [fw("{r}a", 10, 1000, 5), fw("{r}b", 10, 1000, 8)];
    decided(s.check(&group, S, Mode::Charge));
    let back = [fw("{r}a", 10, 1000, 1), fw("{r}b", 10, 1000, 1)];
    let d = decided(s.refund(&back, S));
    assert_eq!((d.pair, d.remaining), (1, 3));
    assert_eq!(
        decided(s.check(&[fw("{r}a", 10, 1000, 1)], S, Mode::Peek)).remaining,
        5
    );
    // One invalid pair: nothing refunded.
    let bad = [fw("{r}a", 10, 1000, 1), fw("{r}b", 10, 1000, 0)];
    assert_eq!(
        s.refund(&bad, S),
        CheckResult::Error(ErrorCode::InvalidLimit)
    );
    assert_eq!(
        decided(s.check(&[fw("{r}a", 10, 1000, 1)], S, Mode::Peek)).remaining,
        5
    );
}

#[test]
fn sliding_log_above_the_cap_is_invalid() {
    let s = store();
    assert_eq!(
        s.check(&[log("l", 1001, 1000, 1)], S, Mode::Charge),
        CheckResult::Error(ErrorCode::InvalidLimit)
    );
    assert!(decided(s.check(&[log("l", 1000, 1000, 1)], S, Mode::Charge)).allowed);
    let small = Store::new(StoreConfig {
        stripes: 4,
        max_log_entries: 10,
        ..StoreConfig::default()
    });
    for p in [log("l", 11, 1000, 1), cc("c", 11, 1000, 1)] {
        assert_eq!(
            small.check(std::slice::from_ref(&p), S, Mode::Charge),
            CheckResult::Error(ErrorCode::InvalidLimit)
        );
    }
    assert!(decided(small.check(&[log("l", 10, 1000, 1)], S, Mode::Charge)).allowed);
}

#[test]
fn new_algorithms_expire_when_their_state_stops_mattering() {
    let s = store();
    decided(s.check(&[fw("f", 10, 1000, 1)], S + 300 * MS, Mode::Charge));
    decided(s.check(&[log("l", 10, 1000, 1)], S + 300 * MS, Mode::Charge));
    decided(s.check(
        &[pair("b", Algorithm::LeakyBucket, 10, 1000, 5, 2)],
        S,
        Mode::Charge,
    ));
    decided(s.check(&[cc("c", 10, 5000, 1)], S, Mode::Charge));
    // Leaky bucket: empty 200 ms later. Fixed window: its window ends at 2 s.
    // Sliding log: the entry leaves at 2.3 s. Concurrency: the lease at 6 s.
    assert_eq!(s.sweep(s.stripe_count(), S + 200 * MS - 1), 0);
    assert_eq!(s.sweep(s.stripe_count(), S + 200 * MS), 1);
    assert_eq!(s.sweep(s.stripe_count(), 2 * S), 1);
    assert!(s.get(b"l", 2 * S).is_some());
    assert_eq!(s.sweep(s.stripe_count(), 2 * S + 300 * MS), 1);
    assert_eq!(s.sweep(s.stripe_count(), 6 * S - 1), 0);
    assert_eq!(s.sweep(s.stripe_count(), 6 * S), 1);
    assert!(s.is_empty());
}

fn capped(max_memory: usize, on_full: Full) -> Store {
    Store::new(StoreConfig {
        stripes: 1,
        max_memory: Some(max_memory),
        on_full,
        ..StoreConfig::default()
    })
}

#[test]
fn memory_cap_evicts_the_keys_closest_to_expiry() {
    let budget = 64 << 10;
    let s = capped(budget, Full::Evict);
    // Long-lived keys first (a day to refill), then a flood of short-lived
    // ones (full again after 1 s): the flood must evict its own kind.
    for i in 0..100 {
        let d = decided(s.check(
            &[tb(&format!("day{i}"), 1, 86_400_000, 10, 1)],
            S,
            Mode::Charge,
        ));
        assert!(d.allowed);
    }
    for i in 0..20_000 {
        let d = decided(s.check(&[tb(&format!("sec{i}"), 10, 1000, 10, 1)], S, Mode::Charge));
        assert!(d.allowed, "a new key is always taken under evict");
        assert!(
            s.memory_bytes() <= budget,
            "over budget after {i}: {}",
            s.memory_bytes()
        );
    }
    assert!(s.evicted() > 0);
    assert_eq!(s.refused(), 0);
    for i in 0..100 {
        assert!(
            s.get(format!("day{i}").as_bytes(), S).is_some(),
            "day{i} was evicted"
        );
    }
    // The newest key survived its own insertion.
    assert!(s.get(b"sec19999", S).is_some());
}

#[test]
fn memory_cap_refuses_new_keys_and_keeps_serving_old_ones() {
    let budget = 16 << 10;
    let s = capped(budget, Full::Refuse);
    let mut admitted = Vec::new();
    let mut refused_at = None;
    for i in 0..10_000 {
        match s.check(&[tb(&format!("k{i}"), 1, 1000, 5, 1)], S, Mode::Charge) {
            CheckResult::Decision(d) => {
                assert!(d.allowed);
                admitted.push(i);
            }
            CheckResult::Error(ErrorCode::StoreFull) => {
                refused_at = Some(i);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    let refused_at = refused_at.expect("the cap was reached");
    assert!(s.memory_bytes() <= budget);
    assert_eq!(s.refused(), 1);
    assert_eq!(s.evicted(), 0);
    // Refused: nothing charged, the key holds no state.
    assert!(s.get(format!("k{refused_at}").as_bytes(), S).is_none());
    // Keys with state keep working, at full accuracy.
    let d = decided(s.check(&[tb("k0", 1, 1000, 5, 1)], S, Mode::Charge));
    assert_eq!((d.allowed, d.remaining), (true, 3));
    // A group adding a new key is refused whole: its old key is not charged.
    // ("k1" and "{k1}new" share a slot through the hash tag.)
    let before = s.get(b"k1", S).unwrap();
    let group = [tb("k1", 1, 1000, 5, 1), tb("{k1}new", 1, 1000, 5, 1)];
    assert_eq!(
        s.check(&group, S, Mode::Charge),
        CheckResult::Error(ErrorCode::StoreFull)
    );
    assert_eq!(s.get(b"k1", S).unwrap(), before);
    // Once the old keys expire, they make room for new ones.
    let later = S + 5 * S;
    let d = decided(s.check(&[tb("fresh", 1, 1000, 5, 1)], later, Mode::Charge));
    assert!(d.allowed);
    assert!(s.len() < admitted.len());
}

#[test]
fn memory_cap_counts_long_keys_and_logs() {
    let budget = 32 << 10;
    let s = capped(budget, Full::Evict);
    let long = "x".repeat(200);
    for i in 0..2_000 {
        let key = format!("{long}{i}");
        decided(s.check(&[tb(&key, 10, 1000, 10, 1)], S, Mode::Charge));
        let log = Pair {
            key: Bytes::from(format!("log{i}")),
            limit: Limit {
                algorithm: Algorithm::SlidingLog,
                count: 100,
                period_ms: 1000,
                burst: 0,
            }
            .into(),
            cost: 50,
        };
        decided(s.check(&[log], S, Mode::Charge));
        assert!(s.memory_bytes() <= budget, "{}", s.memory_bytes());
    }
    assert!(s.evicted() > 0);
}

#[test]
fn single_bucket_fast_path_answers_like_the_general_path() {
    // An uncapped store takes the fast path for single token-bucket pairs;
    // a store with a (never reached) cap takes the general one.
    let fast = store();
    let general = Store::new(StoreConfig {
        stripes: 16,
        max_memory: Some(1 << 30),
        ..StoreConfig::default()
    });
    let script: Vec<(&str, u64, u32, Mode)> = vec![
        ("a", 0, 1, Mode::Charge),
        ("a", 0, 9, Mode::Charge),
        ("a", 0, 1, Mode::Peek),
        ("a", 0, 1, Mode::Charge),
        ("a", 150, 1, Mode::Charge),
        ("a", 5_000, 1, Mode::Peek),
        ("a", 5_000, 11, Mode::Charge),
        ("b", 10, 3, Mode::Charge),
        ("b", 3_000, 1, Mode::Charge),
    ];
    for (key, at_ms, cost, mode) in script {
        let now = S + at_ms * MS;
        let p = [tb(key, 5, 1000, 10, cost)];
        assert_eq!(
            fast.check(&p, now, mode),
            general.check(&p, now, mode),
            "{key} at {at_ms} ms"
        );
        assert_eq!(
            fast.get(key.as_bytes(), now),
            general.get(key.as_bytes(), now)
        );
    }
    assert_eq!(fast.len(), general.len());
    assert_eq!(fast.expired_on_access(), general.expired_on_access());
}

mod compact;
mod states;
