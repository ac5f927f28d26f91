//! Leaky buckets in their own compact table, seen through the store: they
//! travel with snapshots, the change stream and handoffs, they are evicted
//! and capped like token buckets, and a key switching between a leaky
//! bucket and another algorithm keeps one state, started afresh.

use super::*;
use crate::algorithm::State;

fn lb(key: &str, burst: u64) -> ResolvedPair<'_> {
    pair(key, Algorithm::LeakyBucket, 10, 1000, burst, 1)
}

/// The write of one entry of a whole stripe (a snapshot unit).
fn write_of_entry(key: &StoredKey, entry: &Entry) -> KeyWrite {
    let put = TableWrite::Put(entry.clone());
    let (bucket, other) = match entry.state {
        State::TokenBucket { .. } => (put, TableWrite::Keep),
        _ => (TableWrite::Keep, put),
    };
    KeyWrite {
        key: Bytes::copy_from_slice(key.as_bytes()),
        bucket,
        other,
    }
}

/// Drains every stripe of `primary` into `standby`.
fn replicate(primary: &Store, standby: &Store, now: Nanos) {
    for i in 0..primary.stripe_count() {
        match primary.drain_stripe(i, now) {
            Drained::Nothing => {}
            Drained::Changes(changes) => changes
                .keys()
                .for_each(|k| standby.apply(&KeyWrite::from(k))),
            Drained::Whole(entries) => {
                let writes: Vec<KeyWrite> =
                    entries.iter().map(|(k, e)| write_of_entry(k, e)).collect();
                let stripes = primary.stripe_count() as u16;
                assert_eq!(standby.replace_slots(stripes, i as u16, &writes), 0);
            }
        }
    }
}

fn algorithms(s: &Store, key: &str) -> Vec<Algorithm> {
    s.entries(key.as_bytes(), S)
        .iter()
        .map(|e| e.state.algorithm())
        .collect()
}

#[test]
fn leaky_buckets_survive_a_snapshot_and_the_change_stream() {
    let primary = store();
    let keys: Vec<String> = (0..100).map(|i| format!("{{t{i}}}x")).collect();
    for k in &keys {
        assert!(decided(primary.check(&[lb(k, 1)], S, Mode::Charge)).allowed);
    }
    decided(primary.check(&[tb("{t0}x", 5, 1000, 5, 1)], S, Mode::Charge));
    primary.start_capture();
    let standby = Store::new(StoreConfig {
        stripes: 4,
        ..StoreConfig::default()
    });
    replicate(&primary, &standby, S);
    assert_eq!(standby.len(), primary.len());
    for k in &keys {
        assert_eq!(
            standby.entries(k.as_bytes(), S),
            primary.entries(k.as_bytes(), S)
        );
        // The copy denies what the primary denies: 100 ms spacing.
        let d = decided(standby.check(&[lb(k, 1)], S + 50 * MS, Mode::Peek));
        assert_eq!((d.allowed, d.retry_after_ms), (false, 50), "{k}");
    }
    assert_eq!(
        algorithms(&standby, "{t0}x"),
        [Algorithm::TokenBucket, Algorithm::LeakyBucket]
    );

    // The change stream: a window replaces the leaky bucket on the standby
    // too, then a leaky bucket the window, then a reset drops both states.
    decided(primary.check(&[fw("{t1}x", 5, 1000, 1)], S, Mode::Charge));
    replicate(&primary, &standby, S);
    assert_eq!(algorithms(&standby, "{t1}x"), [Algorithm::FixedWindow]);
    assert_eq!(standby.len(), primary.len());
    decided(primary.check(&[lb("{t1}x", 1)], S, Mode::Charge));
    replicate(&primary, &standby, S);
    assert_eq!(algorithms(&standby, "{t1}x"), [Algorithm::LeakyBucket]);
    assert!(primary.remove(b"{t0}x", S));
    replicate(&primary, &standby, S);
    assert!(algorithms(&standby, "{t0}x").is_empty());
    assert_eq!(standby.len(), primary.len());
}

#[test]
fn leaky_buckets_are_handed_off_and_merged() {
    let from = store();
    let to = store();
    // Three units used on the sender, one on the receiver: the merge keeps
    // the fuller bucket.
    for _ in 0..3 {
        decided(from.check(&[lb("{h}x", 5)], S, Mode::Charge));
    }
    decided(to.check(&[lb("{h}x", 5)], S, Mode::Charge));
    let slot = Slot::of(b"{h}x");
    let stripe = usize::from(slot.get()) & from.mask;
    let handed = from.live_states(stripe, S, |s| s == slot);
    assert_eq!(handed.len(), 1);
    let (key, entry) = &handed[0];
    assert_eq!(to.merge(&write_of_entry(key, entry), S), Ok(true));
    assert_eq!(to.entries(b"{h}x", S), from.entries(b"{h}x", S));
    assert_eq!(from.forget_slots(|s| s == slot), 1);
    assert!(from.is_empty());
}

#[test]
fn leaky_buckets_fill_the_cap_as_token_buckets_do() {
    // The same number of keys fits under the same cap: one 32-byte entry
    // each (in the general table a leaky bucket took twice that).
    let taken = |bucket: fn(&str) -> ResolvedPair<'_>| {
        let s = capped(16 << 10, Full::Refuse);
        (0..)
            .find(|i| {
                let r = s.check(&[bucket(&format!("k{i}"))], S, Mode::Charge);
                r == CheckResult::Error(ErrorCode::StoreFull)
            })
            .unwrap()
    };
    let token = taken(|k| tb(k, 10, 1000, 5, 1));
    let leaky = taken(|k| lb(k, 5));
    let window = taken(|k| fw(k, 10, 1000, 1));
    assert_eq!(leaky, token);
    assert!(leaky > window * 3 / 2, "{leaky} leaky vs {window} windows");
}

#[test]
fn memory_cap_evicts_the_leaky_buckets_closest_to_expiry() {
    let budget = 64 << 10;
    let s = capped(budget, Full::Evict);
    // Buckets that take a minute to drain, then a flood of ones empty
    // after 100 ms: the flood evicts its own kind.
    for i in 0..100 {
        let key = format!("min{i}");
        let p = pair(&key, Algorithm::LeakyBucket, 1, 60_000, 1, 1);
        assert!(decided(s.check(&[p], S, Mode::Charge)).allowed);
    }
    for i in 0..20_000 {
        assert!(decided(s.check(&[lb(&format!("f{i}"), 1)], S, Mode::Charge)).allowed);
        assert!(s.memory_bytes() <= budget, "over budget after {i}");
    }
    assert!(s.evicted() > 0);
    for i in 0..100 {
        assert!(s.get(format!("min{i}").as_bytes(), S).is_some(), "min{i}");
    }
    assert!(s.get(b"f19999", S).is_some());
}

#[test]
fn switching_between_a_leaky_bucket_and_a_window_starts_afresh() {
    let s = store();
    decided(s.check(&[tb("k", 5, 1000, 5, 1)], S, Mode::Charge));
    assert!(decided(s.check(&[lb("k", 1)], S, Mode::Charge)).allowed);
    assert!(!decided(s.check(&[lb("k", 1)], S, Mode::Charge)).allowed);
    let d = decided(s.check(&[sw("k", 3, 1000, 1)], S, Mode::Charge));
    assert_eq!((d.allowed, d.remaining), (true, 2));
    assert_eq!(
        algorithms(&s, "k"),
        [Algorithm::TokenBucket, Algorithm::SlidingWindow]
    );
    // Back to the leaky bucket: the window's state is gone, the bucket is
    // empty again.
    assert!(decided(s.check(&[lb("k", 1)], S, Mode::Charge)).allowed);
    assert_eq!(
        algorithms(&s, "k"),
        [Algorithm::TokenBucket, Algorithm::LeakyBucket]
    );
    assert_eq!(s.len(), 2);
    // The token bucket was charged once, before any of this.
    let d = decided(s.check(&[tb("k", 5, 1000, 5, 1)], S, Mode::Peek));
    assert_eq!(d.remaining, 3);
    assert!(s.remove(b"k", S));
    assert!(s.is_empty());
}
