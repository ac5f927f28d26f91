//! Models of starting and stopping the change capture while checks run.
//!
//! Starting marks every stripe to be sent whole; a check racing it is
//! either in the whole stripe the sender copies or recorded after it. The
//! property, under every interleaving: replaying every drain onto an empty
//! copy gives exactly the store's final state. Stopping drops every log: a
//! check racing it leaves nothing buffered and nothing flagged, and a
//! restart resyncs the whole store again.
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use std::collections::HashMap;
use tollgate::store::{Drained, Entry, Mode, ResolvedPair, Store, StoreConfig, Written};
use tollgate_protocol::{Algorithm, Limit};

const NOW: u64 = 1_000_000_000;
/// Keys in different slots, so with two stripes they may land apart.
const KEYS: [&str; 2] = ["a", "b"];

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

fn store() -> Arc<Store> {
    Arc::new(Store::new(StoreConfig {
        stripes: 2,
        max_group: 2,
        change_buffer_cap: 8,
        ..StoreConfig::default()
    }))
}

/// The standby's copy, per stripe: each key's token-bucket entry.
type Copy = HashMap<Vec<u8>, (usize, Entry)>;

/// Drains every stripe once onto the copy.
fn drain(store: &Store, copy: &mut Copy) {
    for stripe in 0..store.stripe_count() {
        match store.drain_stripe(stripe, NOW) {
            Drained::Nothing => {}
            Drained::Changes(changes) => {
                for c in changes.keys() {
                    let key = c.key.to_vec();
                    match c.bucket {
                        Written::Put(entry) => copy.insert(key, (stripe, entry.clone())),
                        Written::Remove => copy.remove(&key),
                        Written::Keep => None,
                    };
                }
            }
            Drained::Whole(entries) => {
                copy.retain(|_, (s, _)| *s != stripe);
                for (key, entry) in entries {
                    copy.insert(key.as_bytes().to_vec(), (stripe, entry));
                }
            }
        }
    }
}

fn assert_same(store: &Store, copy: &Copy) {
    for key in KEYS {
        assert_eq!(
            copy.get(key.as_bytes()).map(|(_, e)| e),
            store.get(key.as_bytes(), NOW).as_ref(),
            "{key}"
        );
    }
}

/// Checks racing `start_capture` (and a drain right after it): the first
/// full sync plus the changes after it rebuild the store exactly.
#[test]
fn checks_racing_the_start_of_capture_are_all_sent() {
    loom::model(|| {
        let s = store();
        s.check(&[charge("a")], NOW, Mode::Charge);
        let writer = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("a")], NOW, Mode::Charge);
                s.check(&[charge("b")], NOW, Mode::Charge);
            })
        };
        s.start_capture();
        let mut copy = Copy::new();
        drain(&s, &mut copy);
        writer.join().unwrap();
        drain(&s, &mut copy);
        assert_same(&s, &copy);
        assert_eq!(s.capture_stats().buffered, 0);
    });
}

/// A check racing `stop_capture` leaves nothing behind: no key buffered,
/// no stripe flagged for the sender. Starting again sends the whole store.
#[test]
fn a_check_racing_the_stop_of_capture_leaves_nothing_behind() {
    loom::model(|| {
        let s = store();
        s.start_capture();
        let mut copy = Copy::new();
        drain(&s, &mut copy);
        let writer = {
            let s = s.clone();
            thread::spawn(move || {
                s.check(&[charge("a")], NOW, Mode::Charge);
            })
        };
        s.stop_capture();
        writer.join().unwrap();
        let stats = s.capture_stats();
        assert!(!stats.capturing);
        assert_eq!(stats.buffered, 0);
        for stripe in 0..s.stripe_count() {
            assert_eq!(s.drain_stripe(stripe, NOW), Drained::Nothing);
        }
        // A new standby: everything again, from scratch.
        s.start_capture();
        let mut fresh = Copy::new();
        drain(&s, &mut fresh);
        assert_same(&s, &fresh);
    });
}
