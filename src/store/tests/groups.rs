//! Groups mixing algorithms, leases and refunds, with exact numbers: all or
//! nothing for every algorithm, the binding pair named, a lease carried by
//! its group, refunds that never exceed the limit.

use super::*;

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
    let swapped = [next[1], next[0]];
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
        let group = [*p, blocker];
        let d = decided(s.check(&group, S, Mode::Charge));
        assert!(!d.allowed, "{p:?}");
        assert_eq!(d.pair, 1);
        assert_eq!(d.lease, None);
        assert!(s.get(p.key, S).is_none(), "{:?} was charged", p.limit);
        // And alone it passes (and is charged).
        let alone = decided(s.check(std::slice::from_ref(p), S, Mode::Charge));
        assert!(alone.allowed);
        assert_eq!(alone.remaining, 4);
        assert!(s.get(p.key, S).is_some());
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

/// `refund_refusal` finds every refusal a refund would meet (without a
/// lock or a change), and none for a refund that goes through: a global
/// rule's refund asks it before its ceiling keys give anything back.
#[test]
fn a_refunds_refusal_is_known_before_anything_is_given_back() {
    let s = store();
    let groups: [Vec<ResolvedPair<'_>>; 6] = [
        vec![tb("{a}:x", 10, 1000, 10, 1), tb("{b}:y", 10, 1000, 10, 1)],
        vec![tb("{a}:x", 10, 1000, 10, 1), cc("{a}:c", 2, 1000, 1)],
        vec![fw("{a}:w", 10, 1000, 1), sw("{a}:w", 10, 1000, 1)],
        vec![tb("{a}:x", 10, 1000, 10, 0)],
        vec![tb("{a}:x", 10, 1000, 10, 1), sw("{a}:w", 10, 1000, 2)],
        vec![],
    ];
    for group in &groups {
        let spots: Vec<_> = group.iter().map(|p| s.spot(p.key)).collect();
        let refusal = s.refund_refusal(group, &spots);
        let answer = s.refund_at(group, &spots, S);
        match answer {
            CheckResult::Error(code) => assert_eq!(refusal, Some(code), "{group:?}"),
            CheckResult::Decision(_) => assert_eq!(refusal, None, "{group:?}"),
        }
    }
    assert_eq!(
        s.refund_refusal(&groups[0], &[s.spot(b"{a}:x"), s.spot(b"{b}:y")]),
        Some(ErrorCode::CrossSlot)
    );
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
        let mut back = p;
        back.cost = 2;
        let d = decided(s.refund(std::slice::from_ref(&back), S));
        assert_eq!(d.remaining, 6, "{:?}", p.limit);
        // The refunded units can be taken again, and no more.
        let mut again = p;
        again.cost = 6;
        assert!(decided(s.check(std::slice::from_ref(&again), S, Mode::Charge)).allowed);
        let mut one = p;
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

#[test]
fn a_refund_returns_only_what_each_key_held() {
    let s = store();
    let returned_by = |checks: &[ResolvedPair<'_>], now| {
        let spots: Vec<_> = checks.iter().map(|c| s.spot(c.key)).collect();
        let mut returned = Returned::new();
        decided(s.refund_returning(checks, &spots, now, &mut returned));
        returned.into_vec()
    };
    for p in [
        tb("b", 10, 1000, 10, 6),
        sw("w", 10, 1000, 6),
        fw("f", 10, 1000, 6),
        log("l", 10, 1000, 6),
        pair("lb", Algorithm::LeakyBucket, 10, 1000, 10, 6),
    ] {
        decided(s.check(std::slice::from_ref(&p), S, Mode::Charge));
        // 6 held: a refund of 4 returns 4 (a millisecond later, the bucket's
        // partly refilled token still counts), one of 4 more only the 2 left.
        let mut four = p;
        four.cost = 4;
        assert_eq!(
            returned_by(std::slice::from_ref(&four), S + MS),
            [4],
            "{p:?}"
        );
        assert_eq!(
            returned_by(std::slice::from_ref(&four), S + MS),
            [2],
            "{p:?}"
        );
    }
    // A key never charged returns nothing, whatever was asked for, next to
    // one that does.
    decided(s.check(&[fw("{g}held", 10, 1000, 3)], S, Mode::Charge));
    let asked = [
        fw("{g}untouched", 10, 1000, u32::MAX),
        fw("{g}held", 10, 1000, 5),
    ];
    assert_eq!(returned_by(&asked, S), [0, 3]);
}

/// A key and a companion of its stripe charged under one lock: the
/// companion is charged only when the key is allowed and its own check
/// passes, and never denies the key; the answer is the key's, as a check
/// of it alone. Where the store cannot (another stripe, a capped store, a
/// state other than a bucket) nothing is done.
#[test]
fn a_companion_is_charged_with_an_allowed_key_and_never_denies_it() {
    let s = store();
    let (key, companion) = (tb("{t}k", 5, 1000, 5, 1), tb("{t}k\0c", 2, 1000, 2, 1));
    let charge = |now| {
        let (ks, cs) = (s.spot(key.key), s.spot(companion.key));
        decided(
            s.charge_with_companion((&key, ks), (&companion, cs), now)
                .expect("one stripe"),
        )
    };
    // What a check of one unit would leave.
    let peek = |pair: &ResolvedPair<'_>| decided(s.check(&[*pair], S, Mode::Peek)).remaining;
    // The companion runs out after two; the key goes on to its five.
    let answers: Vec<_> = (0..6).map(|_| charge(S)).collect();
    let allowed: Vec<_> = answers.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [true, true, true, true, true, false]);
    assert_eq!(answers[2].remaining, 2, "the key's own count");
    assert_eq!((peek(&key), peek(&companion)), (0, 0));
    // A key denied charges no companion: a fresh companion stays full.
    let fresh = tb("{t}k\0d", 2, 1000, 2, 1);
    let (ks, cs) = (s.spot(key.key), s.spot(fresh.key));
    assert!(
        !decided(
            s.charge_with_companion((&key, ks), (&fresh, cs), S)
                .unwrap()
        )
        .allowed
    );
    assert_eq!(peek(&fresh), 1, "untouched");
    // Where the store cannot, nothing is done.
    let other = (0..64)
        .map(|i| format!("other-{i}"))
        .find(|k| (s.spot(k.as_bytes()).slot.get() ^ ks.slot.get()) & 15 != 0)
        .unwrap();
    let other = tb(&other, 2, 1000, 2, 1);
    let window = sw("{t}k\0w", 2, 1000, 1);
    let fresh_key = tb("{t}fresh", 5, 1000, 5, 1);
    let fks = s.spot(fresh_key.key);
    for c in [other, window] {
        assert!(s
            .charge_with_companion((&fresh_key, fks), (&c, s.spot(c.key)), S)
            .is_none());
    }
    assert_eq!(peek(&fresh_key), 4, "untouched");
    let capped = capped(1 << 20, Full::Refuse);
    let spots = (capped.spot(key.key), capped.spot(companion.key));
    assert!(capped
        .charge_with_companion((&key, spots.0), (&companion, spots.1), S)
        .is_none());
    // An invalid limit of the key is its error, as a check would answer.
    let zero = tb("{t}z", 5, 1000, 5, 0);
    let c = (&companion, s.spot(companion.key));
    let answer = s.charge_with_companion((&zero, s.spot(zero.key)), c, S);
    assert_eq!(answer, Some(CheckResult::Error(ErrorCode::InvalidLimit)));
}
