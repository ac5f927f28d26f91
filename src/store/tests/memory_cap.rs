//! The memory cap seen through the store: evicting the keys closest to
//! expiry, refusing new keys while old ones are served, and long keys and
//! logs counted.

use super::*;

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
        let key = format!("log{i}");
        let log = ResolvedPair::new(
            key.as_bytes(),
            Limit {
                algorithm: Algorithm::SlidingLog,
                count: 100,
                period_ms: 1000,
                burst: 0,
            },
            50,
        );
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

/// A check that evicts live keys and is then refused (even the emptied
/// stripe has no room for its new key) has still evicted them: the
/// standby must be told, or it keeps states the primary has let go
/// (found by the replication model test).
#[test]
fn keys_evicted_by_a_refused_check_reach_the_standby() {
    let s = capped(1024, Full::Evict);
    // Windows of 16-byte keys ending in a 0 byte (the long windows table)
    // and a two-month window of the empty key: the stripe's whole share.
    let mut keys: Vec<String> = (0..8).map(|i| format!("f{i:014}\0")).collect();
    for key in &keys {
        decided(s.check(&[fw(key, 3, 1000, 1)], S, Mode::Charge));
    }
    decided(s.check(&[fw("", 10, 60 * 86_400_000, 1)], S, Mode::Charge));
    keys.push(String::new());
    s.start_capture();
    assert!(matches!(s.drain_stripe(0, S), Drained::Whole(w) if w.len() == 9));
    // A short key needs the short windows table, which does not fit even
    // once every other key is gone.
    assert_eq!(
        s.check(&[fw("short", 3, 1000, 1)], S, Mode::Charge),
        CheckResult::Error(ErrorCode::StoreFull)
    );
    assert!(s.evicted() > 0, "the scenario evicts before refusing");
    let live = keys.iter().filter(|k| s.get(k.as_bytes(), S).is_some());
    match s.drain_stripe(0, S) {
        Drained::Whole(w) => assert_eq!(w.len(), live.count()),
        other => panic!("evictions not sent to the standby: {other:?}"),
    }
}
