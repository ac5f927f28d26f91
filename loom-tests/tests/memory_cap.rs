//! Models of the memory cap under concurrent checks: a stripe with room
//! for three token buckets, two already held, and two threads each adding
//! a new key.
//!
//! Under every interleaving: with `refuse`, exactly one new key is taken
//! and the other refused (StoreFull, nothing charged); with `evict`, both
//! are taken and live keys are evicted to make room; either way the stripe
//! stays within its budget, and with the change capture on, what the
//! sender drains (evictions send the stripe whole) replays to the store's
//! final state.
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use std::collections::HashMap;
use tollgate::store::{Drained, Entry, Full, Mode, ResolvedPair, Store, StoreConfig, Written};
use tollgate_protocol::{Algorithm, CheckResult, ErrorCode, Limit};

const NOW: u64 = 1_000_000_000;
/// What a table of three token buckets with short keys reserves: four
/// hashbrown buckets (three usable) of a 24-byte entry (the 16-byte short
/// key slot and the `tat`) and a control byte. A fourth key would double
/// the table.
const ROOM_FOR_THREE: usize = 4 * 25;
const KEYS: [&str; 4] = ["{t}old1", "{t}old2", "{t}new1", "{t}new2"];

fn charge(key: &'static str) -> ResolvedPair<'static> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::TokenBucket,
            count: 1,
            period_ms: 60_000,
            burst: 5,
        },
        1,
    )
}

fn store(on_full: Full) -> Arc<Store> {
    let s = Arc::new(Store::new(StoreConfig {
        stripes: 1,
        max_group: 2,
        max_memory: Some(ROOM_FOR_THREE),
        on_full,
        change_buffer_cap: 8,
        ..StoreConfig::default()
    }));
    for key in &KEYS[..2] {
        assert!(matches!(
            s.check(&[charge(key)], NOW, Mode::Charge),
            CheckResult::Decision(d) if d.allowed
        ));
    }
    assert_eq!(s.memory_bytes(), ROOM_FOR_THREE);
    s
}

/// The standby's copy: each key's token-bucket entry.
type Copy = HashMap<Vec<u8>, Entry>;

/// Drains the one stripe onto the copy.
fn drain(s: &Store, copy: &mut Copy) {
    match s.drain_stripe(0, NOW) {
        Drained::Nothing => {}
        Drained::Changes(changes) => {
            for c in changes.keys() {
                match c.bucket {
                    Written::Put(e) => copy.insert(c.key.to_vec(), e.clone()),
                    Written::Remove => copy.remove(c.key),
                    Written::Keep => None,
                };
            }
        }
        Drained::Whole(entries) => {
            copy.clear();
            copy.extend(entries.into_iter().map(|(k, e)| (k.as_bytes().to_vec(), e)));
        }
    }
}

fn add_both_new_keys(s: &Arc<Store>) -> Vec<CheckResult> {
    let handles: Vec<_> = KEYS[2..]
        .iter()
        .map(|&key| {
            let s = s.clone();
            thread::spawn(move || s.check(&[charge(key)], NOW, Mode::Charge))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn refusing_at_the_cap_takes_exactly_the_keys_that_fit() {
    loom::model(|| {
        let s = store(Full::Refuse);
        let results = add_both_new_keys(&s);
        let refused = results
            .iter()
            .filter(|r| **r == CheckResult::Error(ErrorCode::StoreFull))
            .count();
        assert_eq!(refused, 1, "{results:?}");
        assert_eq!(s.refused(), 1);
        assert_eq!(s.len(), 3);
        assert!(s.memory_bytes() <= ROOM_FOR_THREE);
        // The refused key holds nothing; the old keys keep their charge.
        let held = KEYS.iter().filter(|k| s.get(k.as_bytes(), NOW).is_some());
        assert_eq!(held.count(), 3);
    });
}

#[test]
fn evicting_at_the_cap_takes_every_key_and_replicates_the_evictions() {
    loom::model(|| {
        let s = store(Full::Evict);
        s.start_capture();
        let mut copy = Copy::new();
        drain(&s, &mut copy);
        let results = add_both_new_keys(&s);
        assert!(
            results
                .iter()
                .all(|r| matches!(r, CheckResult::Decision(d) if d.allowed)),
            "{results:?}"
        );
        assert!(s.evicted() > 0);
        assert!(s.memory_bytes() <= ROOM_FOR_THREE);
        drain(&s, &mut copy);
        for key in KEYS {
            assert_eq!(
                copy.get(key.as_bytes()),
                s.get(key.as_bytes(), NOW).as_ref(),
                "{key}"
            );
        }
    });
}
