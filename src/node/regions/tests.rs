//! The regions layer without a network: at-most-once receipt, what is
//! skipped, the ceiling limit, and when a region counts as cut off.

use super::*;
use crate::store::{Mode, ResolvedPair, StoreConfig};
use bytes::Bytes;
use std::sync::Arc;
use tollgate_protocol::{Algorithm, CheckResult, UsageEntry};

const MS: u64 = 1_000_000;
const T0: Nanos = 1_000_000 * MS;

fn regions(peers: &[&str]) -> Regions {
    let config = RegionConfig {
        region: "us".into(),
        peers: peers
            .iter()
            .map(|p| RegionPeer {
                name: (*p).into(),
                addr: format!("{p}:7700"),
            })
            .collect(),
        interval: Duration::from_millis(500),
        stall_intervals: 4,
        max_message_bytes: 1 << 20,
        ceiling_share: None,
        cut_off: CutOff::Majority,
        journal_max_bytes: 64 << 20,
    };
    let store = Arc::new(Store::new(StoreConfig::default()));
    Regions::new(config, store, T0, &Registry::new()).unwrap()
}

fn bucket() -> Limit {
    Limit {
        algorithm: Algorithm::TokenBucket,
        count: 600,
        period_ms: 3_600_000,
        burst: 600,
    }
}

fn report(region: &str, session: u64, seq: u64, charged: u64, rule: &str) -> UsageReport {
    UsageReport {
        region: region.into(),
        session,
        seq,
        sent_at: T0,
        entries: vec![UsageEntry {
            key: Bytes::from_static(b"k"),
            rule: RuleName::try_from(rule).unwrap(),
            charged,
            refunded: 0,
            at: T0,
        }],
    }
}

/// The tests' key number `i`, in a hash tag like a tenant's.
fn key(i: u32) -> Bytes {
    Bytes::from(format!("rl:{{k{i}}}"))
}

/// Units charged and refunded, per key.
type Tally = std::collections::BTreeMap<Bytes, (u64, u64)>;

/// Adds `entries` to `tally`.
fn tally(tally: &mut Tally, entries: &[UsageEntry]) {
    for e in entries {
        let units = tally.entry(e.key.clone()).or_default();
        *units = (units.0 + e.charged, units.1 + e.refunded);
    }
}

/// What peer `i` is sent of the usage shared out to it, per key: the
/// units charged and refunded in its sealed messages, then in its journal
/// (sealed as its sender would). Empties both.
fn sent(r: &Regions, i: usize) -> Tally {
    let mut got = Tally::new();
    while let Some(mut frame) = r.take_sealed(i) {
        tally(&mut got, &journal::decoded(&mut frame).entries);
    }
    let mut journal = std::mem::take(&mut r.peers[i].outbox.lock().journal);
    while !journal.is_empty() {
        tally(&mut got, &journal.seal(1 << 20, 2).0);
    }
    got
}

fn remaining(r: &Regions) -> u64 {
    let check = ResolvedPair::new(b"k", bucket(), 1);
    match r.store.check(&[check], T0, Mode::Peek) {
        CheckResult::Decision(d) => d.remaining,
        CheckResult::Error(e) => panic!("{e}"),
    }
}

/// The receiver's rules: `api` is global for eu, anything else is not.
fn resolve(name: &RuleName, sender: &str) -> Option<Limit> {
    (name.as_bytes() == b"api" && sender == "eu").then(bucket)
}

#[test]
fn a_message_is_applied_once_per_session_and_seq() {
    let r = regions(&["eu", "ap"]);
    let ack = r
        .receive(&report("eu", 9, 1, 100, "api"), &resolve, T0)
        .unwrap();
    assert_eq!(
        (ack.region.as_str(), ack.seq, ack.duplicate),
        ("us", 1, false)
    );
    assert_eq!(remaining(&r), 600 - 100 - 1);
    // The same message again (a lost answer): nothing more is charged.
    let ack = r
        .receive(&report("eu", 9, 1, 100, "api"), &resolve, T0)
        .unwrap();
    assert!(ack.duplicate);
    assert_eq!(remaining(&r), 499);
    // The next one is applied; so is a new session's first.
    assert!(
        !r.receive(&report("eu", 9, 2, 50, "api"), &resolve, T0)
            .unwrap()
            .duplicate
    );
    assert!(
        !r.receive(&report("eu", 10, 1, 50, "api"), &resolve, T0)
            .unwrap()
            .duplicate
    );
    assert_eq!(remaining(&r), 399);
    let s = r.status(T0);
    let eu = s.peers.iter().find(|p| p.region == "eu").unwrap();
    assert_eq!((eu.units_imported, eu.keys_received), (200, 3));
}

#[test]
fn unknown_regions_and_rules_change_nothing() {
    let r = regions(&["eu"]);
    assert_eq!(
        r.receive(&report("mars", 1, 1, 100, "api"), &resolve, T0),
        Err(UsageRefusal::UnknownRegion("mars".into()))
    );
    assert_eq!(
        r.receive(&report("eu", 0, 1, 100, "api"), &resolve, T0),
        Err(UsageRefusal::ZeroSession)
    );
    // A rule that is not global for eu here: answered, skipped.
    let ack = r
        .receive(&report("eu", 1, 1, 100, "other"), &resolve, T0)
        .unwrap();
    assert!(!ack.duplicate);
    assert!(r.store.is_empty());
    assert_eq!(r.status(T0).peers[0].units_imported, 0);
}

#[test]
fn the_ceiling_is_the_share_of_count_and_burst() {
    let r = regions(&["eu", "ap"]);
    let c = r.ceiling(&bucket(), 3);
    assert_eq!((c.count, c.burst, c.period_ms), (200, 200, 3_600_000));
    // A rule shared by two regions: half of it each.
    let c = r.ceiling(&bucket(), 2);
    assert_eq!((c.count, c.burst), (300, 300));
    let window = Limit {
        algorithm: Algorithm::FixedWindow,
        count: 2,
        period_ms: 1000,
        burst: 0,
    };
    // Never below one unit, never a burst where there was none.
    let c = r.ceiling(&window, 3);
    assert_eq!((c.count, c.burst), (1, 0));
    // Rounded down: a third of 1000 is 333, of 1001 333 too.
    for (count, share) in [(1000, 333), (1001, 333), (1002, 334)] {
        let c = r.ceiling(&Limit { count, ..window }, 3);
        assert_eq!(c.count, share, "{count}");
    }
}

#[test]
fn a_region_is_cut_off_when_most_peers_are_stalled() {
    let r = regions(&["eu", "ap"]);
    let later = T0 + 2_001 * MS;
    assert!(!r.assess(T0 + 1_999 * MS));
    // eu still talks both ways: one of two stalled is not a majority.
    r.peers[0].last_acked.store(later, Ordering::Relaxed);
    r.peers[0].last_received.store(later, Ordering::Relaxed);
    assert!(!r.assess(later));
    assert!(r.status(later).peers[1].stalled);
    // Answers from eu but nothing received from it: stalled too.
    r.peers[0].last_received.store(T0, Ordering::Relaxed);
    assert!(r.assess(later));
    assert!(r.cut_off());
    assert_eq!(r.metrics.ceiling_activations.get(), 1);
    // Once again in step: the ceiling is lifted.
    r.peers[0].last_received.store(later, Ordering::Relaxed);
    r.peers[1].last_acked.store(later, Ordering::Relaxed);
    r.peers[1].last_received.store(later, Ordering::Relaxed);
    assert!(!r.assess(later));
}

/// A rule is capped by who among its own peers is stalled: a rule shared
/// with eu alone is capped once eu is stalled, whoever else is heard; one
/// shared with eu and ap only once both are (a majority), or once either
/// is under `--region-cut-off any`.
#[test]
fn each_rule_is_capped_by_its_own_peers() {
    let mut r = regions(&["eu", "ap"]);
    let later = T0 + 2_001 * MS;
    let (eu, both) = (
        r.peers_of(&["eu".into()]),
        r.peers_of(&["eu".into(), "ap".into()]),
    );
    assert!(!r.assess(T0 + 1_999 * MS));
    assert!(!r.capped(eu) && !r.capped(both));
    // ap still talks both ways, eu does not.
    r.peers[1].last_acked.store(later, Ordering::Relaxed);
    r.peers[1].last_received.store(later, Ordering::Relaxed);
    assert!(
        !r.assess(later),
        "one of two stalled: not cut off as a whole"
    );
    assert!(r.capped(eu), "the rule's only peer is stalled");
    assert!(
        !r.capped(both),
        "one of the rule's two peers is not a majority"
    );
    assert!(!r.capped(0), "a rule with no peer here is never capped");
    r.config.cut_off = CutOff::Any;
    assert!(r.assess(later), "any stalled peer cuts the region off");
    assert!(r.capped(eu) && r.capped(both));
    // In step again: nothing capped.
    r.peers[0].last_acked.store(later, Ordering::Relaxed);
    r.peers[0].last_received.store(later, Ordering::Relaxed);
    assert!(!r.assess(later));
    assert!(!r.capped(eu) && !r.capped(both));
}

#[test]
fn usage_is_journalled_for_the_peers_the_rule_lists() {
    let r = regions(&["eu", "ap", "sa"]);
    let rule = RuleName::try_from("api").unwrap();
    let k = Bytes::from_static(b"k");
    r.record(
        &k,
        &rule,
        &["us".into(), "eu".into(), "sa".into()],
        3,
        0,
        T0,
    );
    r.record(&k, &rule, &["ap".into()], 5, 0, T0);
    // Once in the shared journal per rule's peers, whatever their number.
    assert_eq!(r.shared.lock().len(), 2);
    // No peer is listed by both rules: none takes sealed messages.
    r.share_out(T0);
    assert!((0..3).all(|i| !r.has_sealed(i)));
    let charged = |i: usize| {
        let (entries, _) = r.peers[i].outbox.lock().journal.seal(1 << 20, 2);
        entries.iter().map(|e| e.charged).collect::<Vec<_>>()
    };
    // eu takes a copy, sa (the last) the journal itself: the same usage.
    assert_eq!(
        (charged(0), charged(1), charged(2)),
        (vec![3], vec![5], vec![3])
    );
    assert!(r.shared.lock().is_empty());
}

#[test]
fn a_peers_journal_and_pending_usage_stay_within_their_bound() {
    let mut r = regions(&["eu"]);
    r.config.journal_max_bytes = 64 << 10;
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned()];
    let record = |r: &Regions, i: u32| {
        let key = key(i);
        r.record(&key, &rule, &listed, 1, 0, T0);
    };
    // eu is behind (its sender holds a byte): it takes journals.
    r.set_pending_bytes(0, 1);
    for i in 0..10_000 {
        record(&r, i);
    }
    let dropped = || r.metrics.peer("eu").entries_dropped.get();
    let held = r.shared.lock().len();
    assert!(held > 100 && held < 10_000, "{held}");
    assert_eq!(dropped(), 10_000 - held as u64);
    assert_eq!(r.metrics.peer("eu").units_dropped.get(), dropped());
    // Handed to the sender, the journal's bytes still count as held until
    // the sender says otherwise: no new key fits.
    let mut pending = r.take_journal(0, T0);
    assert_eq!(pending.len(), held);
    record(&r, 20_000);
    assert_eq!(dropped(), 10_000 - held as u64 + 1);
    // Sent (sealed out of the pending usage): room again.
    while pending.seal(1 << 20, 2).1 {}
    r.set_pending_bytes(0, pending.bytes());
    record(&r, 20_001);
    assert_eq!(r.shared.lock().len(), 1);
}

#[test]
fn a_full_peer_drops_new_keys_as_it_takes_its_share_and_the_others_keep_them() {
    let mut r = regions(&["eu", "ap"]);
    r.config.journal_max_bytes = 64 << 10;
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned(), "ap".to_owned()];
    r.record(&key(0), &rule, &listed, 2, 0, T0);
    // ap is behind (its sender holds usage): it takes a journal, eu a
    // sealed message.
    r.set_pending_bytes(1, 1);
    r.share_out(T0);
    assert!(r.has_sealed(0) && !r.has_sealed(1));
    // ap's sender holds a full journal's worth (a peer that is down).
    r.set_pending_bytes(1, 64 << 10);
    // eu has room: the shared journal takes new keys, and a key ap holds
    // already keeps adding up there.
    r.record(&key(1), &rule, &listed, 1, 0, T0);
    r.record(&key(0), &rule, &listed, 4, 0, T0);
    assert_eq!(r.shared.lock().len(), 2);
    // Shared out once an interval: a sender ticking soon after the one
    // that shared out finds its share waiting and shares nothing more.
    r.share_out(T0 + 100 * MS);
    assert_eq!(r.shared.lock().len(), 2);
    r.share_out(T0 + 500 * MS);
    assert!(r.shared.lock().is_empty());
    let sealed = |i: usize| {
        (sent(&r, i).into_iter())
            .map(|(k, (charged, _))| (k, charged))
            .collect::<Vec<_>>()
    };
    // eu: two messages, key 0 in each; ap: one journal, merged.
    assert_eq!(sealed(0), vec![(key(0), 6), (key(1), 1)]);
    assert_eq!(sealed(1), vec![(key(0), 6)]);
    let dropped = |p: &str| {
        let m = r.metrics.peer(p);
        (m.entries_dropped.get(), m.units_dropped.get())
    };
    assert_eq!((dropped("eu"), dropped("ap")), ((0, 0), (1, 1)));
}

#[test]
fn an_older_session_is_refused_while_the_newer_one_is_live() {
    let r = regions(&["eu"]);
    assert!(r
        .receive(&report("eu", 20, 1, 10, "api"), &resolve, T0)
        .is_ok());
    // A late message of the primary before (or a spoofer's made-up one).
    assert_eq!(
        r.receive(&report("eu", 19, 7, 100, "api"), &resolve, T0 + MS),
        Err(UsageRefusal::OlderSession {
            region: "eu".into(),
            session: 19,
            newest: 20
        })
    );
    assert_eq!(remaining(&r), 600 - 10 - 1);
    // The newer session carries on.
    assert!(r
        .receive(&report("eu", 20, 2, 10, "api"), &resolve, T0 + MS)
        .is_ok());
    // Silent for the stall period (4 x 500 ms): an older session is taken
    // (a sender restarted with its clock stepped back).
    let later = T0 + MS + 2_001 * MS;
    assert!(r
        .receive(&report("eu", 5, 1, 10, "api"), &resolve, later)
        .is_ok());
    assert_eq!(remaining(&r), 600 - 30 - 1);
}

#[test]
fn the_tables_one_interval_empties_hold_the_next_ones_usage() {
    let r = regions(&["eu", "ap"]);
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned(), "ap".to_owned()];
    let mut pending = [Journal::default(), Journal::default()];
    // Three intervals of the same 1,000 keys, each charged `units` once;
    // what each sender seals is exactly that interval's usage. ap is
    // behind (its sender holds usage), so it takes journals, swapped into
    // its pending usage; eu keeps up and takes sealed messages.
    r.set_pending_bytes(1, 1);
    for (interval, units) in [(0, 1), (1, 2), (2, 3)] {
        for i in 0..1000 {
            let key = key(i);
            r.record(&key, &rule, &listed, units, 0, T0);
        }
        let now = T0 + interval * 500 * MS;
        for (i, pending) in pending.iter_mut().enumerate() {
            let mut fresh = r.take_journal(i, now);
            pending.absorb(&mut fresh);
            r.recycle(fresh);
            let mut entries = pending.seal(1 << 20, 2).0;
            while let Some(mut frame) = r.take_sealed(i) {
                entries.extend(journal::decoded(&mut frame).entries);
            }
            assert_eq!(entries.len(), 1000, "interval {interval}, peer {i}");
            assert!(entries.iter().all(|e| e.charged == units));
        }
        // From the second interval on, the tables the senders emptied are
        // kept for the next interval, and the shared journal's replacement
        // has room for all the keys.
        if interval > 0 {
            assert!(r.shared.lock().capacity() >= 1000, "interval {interval}");
            assert!(r.spares.len() > 0, "interval {interval}");
        }
    }
}

mod share;
