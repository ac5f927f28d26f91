//! Models of the store under concurrent checks.
#![cfg(tollgate_loom)]

use loom::sync::Arc;
use loom::thread;
use tollgate::store::{Mode, ResolvedPair, Store, StoreConfig};
use tollgate_protocol::{Algorithm, CheckResult, Limit};

const NOW: u64 = 1_000_000_000;

fn pair(key: &'static str, burst: u64) -> ResolvedPair<'static> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::TokenBucket,
            count: 1,
            period_ms: 1000,
            burst,
        },
        1,
    )
}

fn allowed(r: CheckResult) -> bool {
    matches!(r, CheckResult::Decision(d) if d.allowed)
}

fn store() -> Arc<Store> {
    Arc::new(Store::new(StoreConfig {
        stripes: 2,
        max_group: 4,
        ..StoreConfig::default()
    }))
}

/// A concurrency limit of `count` in flight, leases living 30 s.
fn slots(key: &'static str, count: u64) -> ResolvedPair<'static> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::Concurrency,
            count,
            period_ms: 30_000,
            burst: 0,
        },
        1,
    )
}

fn lease(r: CheckResult) -> Option<u64> {
    match r {
        CheckResult::Decision(d) if d.allowed => {
            Some(d.lease.expect("an allowed acquire holds a lease"))
        }
        _ => None,
    }
}

/// Two threads charging one key with one token: exactly one wins, whatever
/// the interleaving, and the stored state is the winner's.
#[test]
fn one_token_two_threads_never_over_admits() {
    loom::model(|| {
        let s = store();
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || allowed(s.check(&[pair("k", 1)], NOW, Mode::Charge)))
            })
            .collect();
        let wins = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&w| w)
            .count();
        assert_eq!(wins, 1);
        assert!(!allowed(s.check(&[pair("k", 1)], NOW, Mode::Charge)));
    });
}

/// A group and a single check racing on a shared key: the group is
/// all-or-nothing, so the second key is charged exactly when the group won.
#[test]
fn group_racing_a_single_check_is_all_or_nothing() {
    loom::model(|| {
        let s = store();
        let s2 = s.clone();
        let group = thread::spawn(move || {
            allowed(s2.check(&[pair("{t}a", 1), pair("{t}b", 1)], NOW, Mode::Charge))
        });
        let single = allowed(s.check(&[pair("{t}a", 1)], NOW, Mode::Charge));
        let group_won = group.join().unwrap();
        assert!(group_won != single, "exactly one takes the token of a");
        let b_charged = !allowed(s.check(&[pair("{t}b", 1)], NOW, Mode::Peek));
        assert_eq!(b_charged, group_won);
    });
}

/// The sweeper racing a check never removes live state.
#[test]
fn sweep_racing_a_check_keeps_live_state() {
    loom::model(|| {
        let s = store();
        let s2 = s.clone();
        let sweeper = thread::spawn(move || s2.sweep(2, NOW));
        assert!(allowed(s.check(&[pair("k", 1)], NOW, Mode::Charge)));
        sweeper.join().unwrap();
        assert!(s.get(b"k", NOW).is_some());
    });
}

/// Two threads acquiring the last free slot of a concurrency limit: exactly
/// one gets a lease, whatever the interleaving, and the limit is then full.
#[test]
fn two_threads_acquiring_the_last_slot_exactly_one_gets_a_lease() {
    loom::model(|| {
        let s = store();
        // 2 in flight, one already held: one slot left.
        let held = lease(s.check(&[slots("jobs", 2)], NOW, Mode::Charge)).expect("first");
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let s = s.clone();
                thread::spawn(move || lease(s.check(&[slots("jobs", 2)], NOW, Mode::Charge)))
            })
            .collect();
        let leases: Vec<u64> = handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect();
        assert_eq!(leases.len(), 1, "exactly one thread gets the last slot");
        assert_ne!(leases[0], held);
        assert!(lease(s.check(&[slots("jobs", 2)], NOW, Mode::Charge)).is_none());
        // And the winner's lease is the one the store holds.
        assert!(s.release(b"jobs", leases[0], NOW));
    });
}

/// A release racing an acquire on a full limit: the acquire gets the slot
/// only if the release came first, and the slot is never handed out twice.
#[test]
fn release_racing_an_acquire_never_over_admits() {
    loom::model(|| {
        let s = store();
        let held = lease(s.check(&[slots("one", 1)], NOW, Mode::Charge)).expect("first");
        let s2 = s.clone();
        let releaser = thread::spawn(move || s2.release(b"one", held, NOW));
        let acquired = lease(s.check(&[slots("one", 1)], NOW, Mode::Charge));
        assert!(releaser.join().unwrap(), "the held lease is released");
        // One slot: taken by the acquire if it won, free otherwise.
        let again = lease(s.check(&[slots("one", 1)], NOW, Mode::Charge));
        assert_eq!(acquired.is_some(), again.is_none());
    });
}
