//! Models of the replication change capture: checking threads record the
//! state each write left in their stripe's change log (under the stripe
//! lock they already hold) while the replication sender drains the logs
//! and folds them, per key and table, to the last state recorded.
//!
//! The property, under every interleaving: replaying what the sender
//! drained, in order, onto an empty copy gives exactly the store's final
//! state. So no change is lost (the latest state of every key reaches the
//! sender: a state captured at write time and then overwritten in the log
//! or folded away would leave the copy behind) and none is reordered (a
//! key's states arrive in write order: a token bucket's `tat` never goes
//! back).
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use std::collections::HashMap;
use tollgate::algorithm::State;
use tollgate::store::{Drained, Entry, LogBuffer, Mode, ResolvedPair, Store, StoreConfig, Written};
use tollgate_protocol::{Algorithm, Limit};

const NOW: u64 = 1_000_000_000;

fn charge(key: &'static str) -> ResolvedPair<'static> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::TokenBucket,
            count: 1,
            period_ms: 1000,
            burst: 10,
        },
        1,
    )
}

fn store(change_buffer_cap: usize) -> Arc<Store> {
    Arc::new(Store::new(StoreConfig {
        stripes: 1,
        max_group: 2,
        change_buffer_cap,
        ..StoreConfig::default()
    }))
}

/// The standby's view: each key's token-bucket entry.
type Copy = HashMap<Vec<u8>, Entry>;

/// Applies one drain to the copy, checking that no key goes back in time.
fn replay(copy: &mut Copy, spare: &mut LogBuffer, drained: Drained) {
    let tat = |e: &Entry| match e.state {
        State::TokenBucket { tat } => tat,
        ref other => panic!("unexpected state {other:?}"),
    };
    match drained {
        Drained::Nothing => {}
        Drained::Changes(changes) => {
            // As the sender reads them: borrowed from the log.
            for change in changes.keys() {
                let key = change.key.to_vec();
                // Only buckets here (a reset removes the other table too).
                assert!(!matches!(change.other, Written::Put(_)));
                match change.bucket {
                    Written::Put(entry) => {
                        if let Some(old) = copy.get(&key) {
                            assert!(tat(entry) >= tat(old), "a state went back in time");
                        }
                        copy.insert(key, entry.clone());
                    }
                    Written::Remove => {
                        copy.remove(&key);
                    }
                    Written::Keep => panic!("a key drained without a write"),
                }
            }
            changes.recycle(spare);
        }
        Drained::Whole(entries) => {
            // One stripe: the whole store.
            copy.clear();
            for (key, entry) in entries {
                copy.insert(key.as_bytes().to_vec(), entry);
            }
        }
    }
}

/// Drains the store's one stripe as the sender does (onto the list the
/// last drain left) and applies it to the copy.
fn sync(store: &Store, copy: &mut Copy, spare: &mut LogBuffer) {
    let drained = store.drain_stripe_into(0, NOW, spare);
    replay(copy, spare, drained);
}

/// Asserts the copy holds exactly what the store holds.
fn assert_same(store: &Store, copy: &Copy, keys: &[&str]) {
    for key in keys {
        assert_eq!(
            copy.get(key.as_bytes()),
            store.get(key.as_bytes(), NOW).as_ref(),
            "{key}"
        );
    }
}

/// Two threads charge (and one resets) while the sender drains twice; a
/// last drain after they finish must leave the copy equal to the store.
#[test]
fn drained_changes_replay_to_the_final_state() {
    loom::model(|| {
        let s = store(8);
        s.start_capture();
        let mut copy = Copy::new();
        let mut spare = LogBuffer::default();
        sync(&s, &mut copy, &mut spare);

        let a = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("{t}a")], NOW, Mode::Charge);
                s.check(&[charge("{t}b")], NOW, Mode::Charge);
            })
        };
        let b = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("{t}a")], NOW, Mode::Charge);
                s.remove(b"{t}b", NOW);
            })
        };
        sync(&s, &mut copy, &mut spare);
        a.join().unwrap();
        b.join().unwrap();
        sync(&s, &mut copy, &mut spare);
        assert_same(&s, &copy, &["{t}a", "{t}b"]);
        assert_eq!(s.capture_stats().buffered, 0);
    });
}

/// With a cap of one key, a second key overflows the log: the stripe is
/// then sent whole, and the replay still ends equal to the store.
#[test]
fn an_overflow_racing_the_drain_loses_nothing() {
    loom::model(|| {
        let s = store(1);
        s.start_capture();
        let mut copy = Copy::new();
        let mut spare = LogBuffer::default();
        sync(&s, &mut copy, &mut spare);

        let writer = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("{t}a")], NOW, Mode::Charge);
                s.check(&[charge("{t}b")], NOW, Mode::Charge);
            })
        };
        sync(&s, &mut copy, &mut spare);
        writer.join().unwrap();
        sync(&s, &mut copy, &mut spare);
        assert_same(&s, &copy, &["{t}a", "{t}b"]);
        assert_eq!(s.capture_stats().buffered, 0);
    });
}

/// One thread writes a key, another key, then the first again (two
/// records of one key apart in the log, folded by the drain), while a
/// second thread writes the first key (a record that may replace the last
/// one in place): whichever interleaving, the drain sends each key's last
/// state.
#[test]
fn a_key_written_again_drains_its_last_state() {
    loom::model(|| {
        let s = store(8);
        s.start_capture();
        let mut copy = Copy::new();
        let mut spare = LogBuffer::default();
        sync(&s, &mut copy, &mut spare);

        let a = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("{t}a")], NOW, Mode::Charge);
                s.check(&[charge("{t}b")], NOW, Mode::Charge);
                s.check(&[charge("{t}a")], NOW, Mode::Charge);
            })
        };
        let b = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("{t}a")], NOW, Mode::Charge);
            })
        };
        sync(&s, &mut copy, &mut spare);
        a.join().unwrap();
        b.join().unwrap();
        sync(&s, &mut copy, &mut spare);
        assert_same(&s, &copy, &["{t}a", "{t}b"]);
        assert_eq!(s.capture_stats().buffered, 0);
    });
}
