//! The interval's share-out without a network: sealed messages for the
//! peers keeping up, a journal for each peer behind, messages folded back
//! when a peer stops answering, all within the bound.

use super::*;

/// Peers keeping up take the interval's usage as messages sealed once, the
/// same entries for each under its own numbers; a peer behind takes it as
/// a journal; what each is sent is exactly what was recorded, and what
/// waits is held against the bound until the sender takes it.
#[test]
fn peers_keeping_up_take_sealed_messages_and_one_behind_a_journal() {
    let mut r = regions(&["eu", "ap", "sa"]);
    r.config.max_message_bytes = 4096;
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned(), "ap".to_owned(), "sa".to_owned()];
    for i in 0..500 {
        r.record(&key(i), &rule, &listed, u64::from(i % 7) + 1, 0, T0);
        r.record(&key(i), &rule, &listed, 0, 1, T0);
    }
    // sa's sender holds usage: behind.
    r.set_pending_bytes(2, 1);
    r.share_out(T0);
    let held = |i: usize| r.peers[i].held.load(Ordering::Relaxed);
    let frames = |i: usize| r.peers[i].outbox.lock().sealed_len();
    assert!(frames(0) > 1, "more than one message: {}", frames(0));
    assert_eq!((frames(1), frames(2)), (frames(0), 0));
    assert_eq!(held(0), held(1));
    assert_eq!(r.peers[2].outbox.lock().journal.len(), 500);
    // The same bytes for eu and ap, each numbered by its sender.
    let mut a = r.take_sealed(0).unwrap();
    assert!(held(0) < held(1), "a message taken is no longer held");
    let mut b = r.take_sealed(1).unwrap();
    a.renumber(3, 1);
    b.renumber(3, 1);
    assert_eq!(a.frame(9).unwrap(), b.frame(9).unwrap());
    let first = journal::decoded(&mut a).entries;
    assert!(first.iter().all(|e| e.key.len() > 4));
    let want: Tally = (0..500)
        .map(|i| (key(i), (u64::from(i % 7) + 1, 1)))
        .collect();
    let taken = [first, journal::decoded(&mut b).entries, vec![]];
    for (i, taken) in taken.iter().enumerate() {
        let mut got = sent(&r, i);
        tally(&mut got, taken);
        assert_eq!(got, want, "peer {i}");
    }
    r.set_pending_bytes(2, 0);
    assert_eq!((held(0), held(1), held(2)), (0, 0, 0));
}

/// A peer whose last message went unanswered (it is down, say) has the
/// messages still waiting for it folded back into its journal with the
/// interval's usage: one entry per key, merged, within its bound, a key
/// new to it past the bound dropped, counted. A peer that answers keeps
/// taking sealed messages while they wait within half its bound.
#[test]
fn a_peer_falling_behind_has_its_waiting_messages_folded_into_its_journal() {
    let mut r = regions(&["eu", "ap"]);
    r.config.max_message_bytes = 4096;
    r.config.journal_max_bytes = 64 << 10;
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned(), "ap".to_owned()];
    let record = |r: &Regions, keys: std::ops::Range<u32>, units: u64| {
        for i in keys {
            let key = key(i);
            r.record(&key, &rule, &listed, units, 0, T0);
        }
    };
    record(&r, 0..200, 1);
    r.share_out(T0);
    let frames = |i: usize| r.peers[i].outbox.lock().sealed_len();
    let first = frames(1);
    assert!(first > 1, "{first}");
    // ap's sender takes one message, which goes unanswered; eu's takes
    // nothing yet.
    let mut unanswered = r.take_sealed(1).unwrap();
    let in_flight = journal::decoded(&mut unanswered).entries;
    r.set_unanswered(1, true);
    record(&r, 100..300, 2);
    r.share_out(T0 + 500 * MS);
    let journal = |i: usize| r.peers[i].outbox.lock().journal.len();
    assert!(frames(0) > first && journal(0) == 0, "eu keeps up");
    // ap: every key but those only in flight (of keys 0 to 99), merged.
    let only_in_flight = (0..100)
        .filter(|i| in_flight.iter().any(|e| e.key == key(*i)))
        .count();
    assert_eq!((frames(1), journal(1)), (0, 300 - only_in_flight));
    let held = r.peers[1].held.load(Ordering::Relaxed);
    assert!(held <= 64 << 10, "{held}");
    // Past its bound, a key new to ap is dropped, one it holds adds up.
    r.set_pending_bytes(1, 64 << 10);
    record(&r, 299..301, 5);
    r.share_out(T0 + 1000 * MS);
    let m = r.metrics.peer("ap");
    assert_eq!((m.entries_dropped.get(), m.units_dropped.get()), (1, 5));
    let mut got = sent(&r, 1);
    tally(&mut got, &in_flight);
    let units = |i: u32| got[&key(i)].0;
    assert_eq!((units(0), units(100), units(200), units(299)), (1, 3, 2, 7));
    assert_eq!(got.len(), 300);
    assert_eq!(sent(&r, 0).len(), 301);
}

/// A peer that answers but too slowly for the usage (its messages waiting
/// would pass half its bound) takes the next interval as a journal, its
/// waiting messages folded in: the same keys interval after interval add
/// up in place rather than in one message each.
#[test]
fn a_peer_whose_messages_pile_up_takes_a_journal() {
    let mut r = regions(&["eu"]);
    r.config.journal_max_bytes = 64 << 10;
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned()];
    let mut intervals = 0;
    // The same 200 keys each interval, some 7 KiB of messages.
    while r.peers[0].outbox.lock().journal.is_empty() {
        for i in 0..200 {
            let key = key(i);
            r.record(&key, &rule, &listed, 1, 0, T0);
        }
        r.share_out(T0 + intervals * 500 * MS);
        intervals += 1;
        assert!(intervals < 10, "never took a journal");
        let held = r.peers[0].held.load(Ordering::Relaxed);
        assert!(held <= 64 << 10, "{held}");
    }
    assert!(intervals > 2, "{intervals}");
    assert_eq!(r.peers[0].outbox.lock().sealed_len(), 0);
    assert_eq!(r.peers[0].outbox.lock().journal.len(), 200);
    let got = sent(&r, 0);
    assert_eq!(got.len(), 200);
    assert!(got.values().all(|&(charged, _)| charged == intervals));
    assert_eq!(r.metrics.peer("eu").entries_dropped.get(), 0);
}

/// The hint the frame's prefetch reads names the shared journal's table
/// as it grows and after each share-out puts another in its place.
#[test]
fn the_record_hint_follows_the_shared_journal() {
    let r = regions(&["eu"]);
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned()];
    for interval in 0..3u64 {
        for i in 0..5_000 {
            let key = Bytes::from(format!("rl:{{k{interval}-{i}}}"));
            r.prefetch_record(&key, &rule);
            r.record(&key, &rule, &listed, 1, 0, T0);
        }
        let checked = r.shared.lock().assert_hint(&r.shared_hint);
        assert!(checked > 2_500, "interval {interval}: {checked} of 5000");
        r.share_out(T0 + interval * 500 * MS);
        assert!(r.shared.lock().is_empty());
    }
}

/// A peer that stops answering with more messages waiting than its
/// journal has room for (journal entries take more room than the wire)
/// folds in the messages that fit whole and keeps the rest queued: no
/// usage that was accepted is dropped, what waits stays within the bound,
/// and only keys new past the bound are dropped, counted.
#[test]
fn messages_a_journal_has_no_room_for_stay_queued_not_dropped() {
    let mut r = regions(&["eu"]);
    r.config.max_message_bytes = 4096;
    r.config.journal_max_bytes = 64 << 10;
    let rule = RuleName::try_from("api").unwrap();
    let listed = ["eu".to_owned()];
    // Two intervals of 300 new keys each, the peer answering slowly: 600
    // entries wait as messages (some 23 KiB; as journal entries 100 KiB).
    for interval in 0..2 {
        for i in interval * 300..(interval + 1) * 300 {
            r.record(&key(i), &rule, &listed, 2, 0, T0);
        }
        r.share_out(T0 + u64::from(interval) * 500 * MS);
    }
    assert_eq!(r.metrics.peer("eu").entries_dropped.get(), 0);
    let frames = |r: &Regions| r.peers[0].outbox.lock().sealed_len();
    let sealed = frames(&r);
    assert!(sealed > 4, "{sealed}");
    r.set_unanswered(0, true);
    for i in 1000..1100 {
        r.record(&key(i), &rule, &listed, 1, 0, T0);
    }
    r.share_out(T0 + 1000 * MS);
    let left = frames(&r);
    assert!(left > 0 && left < sealed, "{left} of {sealed} left queued");
    assert!(r.peers[0].held.load(Ordering::Relaxed) <= 64 << 10);
    let dropped = r.metrics.peer("eu").entries_dropped.get();
    assert!(dropped > 0 && dropped < 100, "only new keys: {dropped}");
    let got = sent(&r, 0);
    assert!(
        (0..600).all(|i| got.get(&key(i)) == Some(&(2, 0))),
        "every accepted key"
    );
    assert_eq!(got.len() as u64, 600 + 100 - dropped);
}

/// Folded back, a message's entries go under their own rule's peers, so
/// they merge with the same rule's entries shared out since, even where
/// rules list different peers.
#[test]
fn folded_entries_merge_with_their_rules_entries() {
    let r = regions(&["eu", "ap", "sa"]);
    let (r1, r2) = (
        RuleName::try_from("r1").unwrap(),
        RuleName::try_from("r2").unwrap(),
    );
    let two = ["eu".to_owned(), "ap".to_owned()];
    let three = ["eu".to_owned(), "ap".to_owned(), "sa".to_owned()];
    let k = Bytes::from_static(b"rl:{k}");
    let record = |r: &Regions| {
        r.record(&k, &r1, &two, 1, 0, T0);
        r.record(&k, &r2, &three, 1, 0, T0);
    };
    record(&r);
    r.share_out(T0);
    assert!(r.has_sealed(0), "eu keeps up");
    r.set_unanswered(0, true);
    record(&r);
    r.share_out(T0 + 500 * MS);
    // One entry per rule: the folded ones merged with the share's.
    assert_eq!(r.peers[0].outbox.lock().journal.len(), 2);
    let (entries, _) = r.peers[0].outbox.lock().journal.seal(1 << 20, 2);
    assert!(entries.iter().all(|e| e.charged == 2), "{entries:?}");
}

/// A journal handed to its sender still counts as waiting for the peer
/// (as the sender's pending usage) until the sender says what it holds:
/// the peer is not taken for one keeping up meanwhile.
#[test]
fn a_journal_taken_by_its_sender_is_held_until_the_sender_says() {
    let r = regions(&["eu"]);
    let rule = RuleName::try_from("api").unwrap();
    r.set_pending_bytes(0, 1);
    r.record(
        &Bytes::from_static(b"k"),
        &rule,
        &["eu".to_owned()],
        1,
        0,
        T0,
    );
    r.share_out(T0);
    let held = r.peers[0].held.load(Ordering::Relaxed);
    r.set_pending_bytes(0, 0);
    let journal = r.take_journal(0, T0);
    assert_eq!(journal.len(), 1);
    assert!(!r.peers[0].outbox.lock().keeps_up(0, usize::MAX));
    assert!(r.peers[0].outbox.lock().held() >= held - 1);
    r.set_pending_bytes(0, 0);
    assert!(r.peers[0].outbox.lock().keeps_up(0, usize::MAX));
}
