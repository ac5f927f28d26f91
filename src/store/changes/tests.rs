//! The change capture's unit tests: what a drain sends after which writes.

use super::*;
use crate::algorithm::State;
use crate::store::{Mode, ResolvedPair, StoreConfig};
use tollgate_protocol::{Algorithm, Limit};

const S: u64 = 1_000_000_000;

fn store(stripes: usize, cap: usize) -> Store {
    Store::new(StoreConfig {
        stripes,
        change_buffer_cap: cap,
        ..StoreConfig::default()
    })
}

fn tb(key: &str) -> ResolvedPair<'_> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::TokenBucket,
            count: 10,
            period_ms: 1000,
            burst: 10,
        },
        1,
    )
}

fn fw(key: &str) -> ResolvedPair<'_> {
    ResolvedPair::new(
        key.as_bytes(),
        Limit {
            algorithm: Algorithm::FixedWindow,
            count: 10,
            period_ms: 1000,
            burst: 0,
        },
        1,
    )
}

fn stripe_of(store: &Store, key: &str) -> usize {
    usize::from(Slot::of(key.as_bytes()).get()) & store.mask
}

type Whole = Vec<(usize, Vec<(StoredKey, Entry)>)>;

fn owned(changed: ChangedKey<'_>) -> KeyState {
    KeyState {
        key: StoredKey::new(changed.key),
        bucket: changed.bucket.into(),
        other: changed.other.into(),
    }
}

/// Drains every stripe as the sender does (one recycled list handed from
/// stripe to stripe, each log read borrowed); the changes, and the entries
/// of whole stripes.
fn drain_all(store: &Store, now: Nanos) -> (Vec<KeyState>, Whole) {
    let mut changes = Vec::new();
    let mut whole = Vec::new();
    let mut spare = LogBuffer::default();
    for i in 0..store.stripe_count() {
        match store.drain_stripe_into(i, now, &mut spare) {
            Drained::Nothing => {}
            Drained::Changes(c) => {
                changes.extend(c.keys().map(owned));
                c.recycle(&mut spare);
            }
            Drained::Whole(w) => whole.push((i, w)),
        }
    }
    (changes, whole)
}

#[test]
fn nothing_is_recorded_until_capture_starts() {
    let s = store(16, 8);
    s.check(&[tb("a")], S, Mode::Charge);
    assert_eq!(drain_all(&s, S), (vec![], vec![]));
    assert_eq!(s.capture_stats().buffered, 0);
}

#[test]
fn capture_sends_every_stripe_whole_then_the_latest_state_of_each_changed_key() {
    let s = store(4, 8);
    s.check(&[tb("before")], S, Mode::Charge);
    s.start_capture();
    let (changes, whole) = drain_all(&s, S);
    assert!(changes.is_empty());
    assert_eq!(whole.len(), 4, "every stripe, even empty ones");
    let sent: Vec<_> = whole.iter().flat_map(|(_, w)| w.iter()).collect();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0.as_bytes(), b"before");

    // Three charges of one key and one of another: each key once, as
    // it is now.
    for _ in 0..3 {
        s.check(&[tb("{t}x")], S, Mode::Charge);
    }
    s.check(&[fw("{t}y")], S, Mode::Charge);
    s.check(&[tb("{t}x")], S, Mode::Peek);
    let (changes, whole) = drain_all(&s, S);
    assert!(whole.is_empty());
    assert_eq!(changes.len(), 2);
    let x = changes
        .iter()
        .find(|c| c.key.as_bytes() == b"{t}x")
        .unwrap();
    assert_eq!(x.bucket, TableWrite::Put(s.get(b"{t}x", S).unwrap()));
    assert_eq!(x.other, TableWrite::Keep, "a table not written is kept");
    let y = changes
        .iter()
        .find(|c| c.key.as_bytes() == b"{t}y")
        .unwrap();
    assert_eq!(y.bucket, TableWrite::Keep);
    assert!(matches!(
        &y.other,
        TableWrite::Put(Entry {
            state: State::FixedWindow(_),
            ..
        })
    ));
    assert_eq!(s.capture_stats().buffered, 0);
    // Nothing more until something changes.
    assert_eq!(drain_all(&s, S), (vec![], vec![]));

    // A reset is a deletion.
    assert!(s.remove(b"{t}x", S));
    let (changes, _) = drain_all(&s, S);
    assert_eq!(
        changes,
        vec![KeyState {
            key: StoredKey::new(b"{t}x"),
            bucket: TableWrite::Remove,
            other: TableWrite::Remove
        }]
    );
}

/// The drained state of a key, found among the changes.
fn drained<'c>(changes: &'c [KeyState], key: &str) -> &'c KeyState {
    changes
        .iter()
        .find(|c| c.key.as_bytes() == key.as_bytes())
        .unwrap_or_else(|| panic!("{key} not drained"))
}

fn bucket_of(s: &Store, key: &str, now: Nanos) -> TableWrite {
    TableWrite::Put(s.get(key.as_bytes(), now).expect("a bucket"))
}

/// The states are captured at write time: the drain must send the last
/// one written, not the first, whether the key's writes were adjacent in
/// the log (folded in place) or apart (folded by the drain), and a write
/// after a drain goes out with the next drain.
#[test]
fn the_last_state_written_is_the_one_drained() {
    let s = store(1, 64);
    s.start_capture();
    drain_all(&s, S);

    // Two writes in a row to one key.
    s.check(&[tb("x")], S, Mode::Charge);
    let first = bucket_of(&s, "x", S);
    s.check(&[tb("x")], S + 1, Mode::Charge);
    let second = bucket_of(&s, "x", S + 1);
    assert_ne!(first, second);
    assert_eq!(s.capture_stats().buffered, 1, "folded in place");
    let (changes, _) = drain_all(&s, S + 1);
    assert_eq!(changes.len(), 1);
    assert_eq!(drained(&changes, "x").bucket, second);

    // Writes to one key with another key's between them.
    s.check(&[tb("x")], S + 2, Mode::Charge);
    s.check(&[tb("y")], S + 2, Mode::Charge);
    s.check(&[tb("x")], S + 3, Mode::Charge);
    let third = bucket_of(&s, "x", S + 3);
    assert_eq!(s.capture_stats().buffered, 3);
    let (changes, _) = drain_all(&s, S + 3);
    assert_eq!(changes.len(), 2, "each key once");
    assert_eq!(drained(&changes, "x").bucket, third);
    assert_eq!(drained(&changes, "y").bucket, bucket_of(&s, "y", S + 3));

    // A write after the drain: sent by the next one, alone.
    s.check(&[tb("x")], S + 4, Mode::Charge);
    let (changes, _) = drain_all(&s, S + 4);
    assert_eq!(changes.len(), 1);
    assert_eq!(drained(&changes, "x").bucket, bucket_of(&s, "x", S + 4));
    assert_eq!(drain_all(&s, S + 4), (vec![], vec![]));
}

/// A log that holds each key once is sent as it is, in log order (no
/// sort); one where keys repeat apart is folded, each key once with its
/// last state, however many keys share a fingerprint bit.
#[test]
fn a_log_of_distinct_keys_drains_in_log_order_and_repeats_are_folded() {
    let s = store(1, 4096);
    s.start_capture();
    drain_all(&s, S);
    for key in ["z", "a", "m"] {
        s.check(&[tb(key)], S, Mode::Charge);
    }
    let (changes, _) = drain_all(&s, S);
    let keys: Vec<&[u8]> = changes.iter().map(|c| c.key.as_bytes()).collect();
    assert_eq!(keys, [&b"z"[..], b"a", b"m"], "log order, not sorted");

    // 600 keys in 256 fingerprint bits, every one written twice, apart.
    let keys: Vec<String> = (0..600).map(|i| format!("rl:{{c{i}}}:s")).collect();
    for round in 0..2 {
        for key in &keys {
            s.check(&[tb(key)], S + round, Mode::Charge);
        }
    }
    let (changes, _) = drain_all(&s, S + 1);
    assert_eq!(changes.len(), keys.len(), "each key once");
    for key in &keys {
        assert_eq!(drained(&changes, key).bucket, bucket_of(&s, key, S + 1));
    }
}

/// The sender hands one emptied list from stripe to stripe: a stripe whose
/// next log is the list another stripe's log filled sends only its own
/// writes since; a folded log's list comes back too; and a list a burst
/// grew is let go rather than handed round.
#[test]
fn a_recycled_log_list_carries_no_record_to_the_next_stripe() {
    let s = store(4, 4096);
    s.start_capture();
    drain_all(&s, S);
    let (a, b) = ("{a}k", "{b}k");
    let (sa, sb) = (stripe_of(&s, a), stripe_of(&s, b));
    assert_ne!(sa, sb, "two stripes");
    let drain = |stripe: usize, now: Nanos, spare: &mut LogBuffer| -> Vec<Vec<u8>> {
        match s.drain_stripe_into(stripe, now, spare) {
            Drained::Changes(c) => {
                let keys = c.keys().map(|k| k.key.to_vec()).collect();
                c.recycle(spare);
                keys
            }
            other => panic!("changes expected, got {other:?}"),
        }
    };
    let mut spare = LogBuffer::default();
    let only_b = [b.as_bytes().to_vec()];

    // Stripe a: keys written twice, apart, so its log is folded.
    let many: Vec<String> = (0..40).map(|i| format!("{{a}}k{i}")).collect();
    for round in 0..2 {
        for key in &many {
            s.check(&[tb(key)], S + round, Mode::Charge);
        }
    }
    assert_eq!(drain(sa, S + 1, &mut spare).len(), many.len());
    assert!(
        spare.capacity() >= 2 * many.len(),
        "the folded log's list came back"
    );
    // Stripe b's next log is the list stripe a's log filled.
    s.check(&[tb(b)], S + 2, Mode::Charge);
    assert_eq!(drain(sb, S + 2, &mut spare), only_b);
    s.check(&[tb(b)], S + 3, Mode::Charge);
    assert_eq!(
        drain(sb, S + 3, &mut spare),
        only_b,
        "none of stripe a's records"
    );

    // A burst on stripe a: its list goes to stripe b, which needs little,
    // and is let go after one drain instead of going round.
    let burst: Vec<String> = (0..600).map(|i| format!("{{a}}burst{i}")).collect();
    for key in &burst {
        s.check(&[tb(key)], S + 4, Mode::Charge);
    }
    assert_eq!(drain(sa, S + 4, &mut spare).len(), burst.len());
    assert!(spare.capacity() >= burst.len());
    for now in [S + 5, S + 6] {
        s.check(&[tb(b)], now, Mode::Charge);
        assert_eq!(drain(sb, now, &mut spare), only_b);
    }
    let room = s.stripes[sb].lock().changes.changes.capacity();
    assert!(
        spare.capacity() < 64 && room < 64,
        "lists of {} and {room} records left",
        spare.capacity()
    );
}

/// A key's two tables are folded apart: each table's last write wins, a
/// reset removes both, and a write after the reset puts its own table
/// back while the other stays removed.
#[test]
fn each_table_of_a_key_drains_its_own_last_write() {
    let s = store(1, 64);
    s.start_capture();
    drain_all(&s, S);
    s.check(&[tb("k")], S, Mode::Charge);
    s.check(&[fw("k")], S, Mode::Charge);
    s.check(&[tb("k")], S + 1, Mode::Charge);
    let (changes, _) = drain_all(&s, S + 1);
    let k = drained(&changes, "k");
    let [bucket, other] = [0, 1].map(|i| s.entries(b"k", S + 1)[i].clone());
    assert!(matches!(bucket.state, State::TokenBucket { .. }));
    assert_eq!(k.bucket, TableWrite::Put(bucket));
    assert_eq!(k.other, TableWrite::Put(other));

    // Put, reset, put again.
    s.check(&[fw("k")], S + 2, Mode::Charge);
    assert!(s.remove(b"k", S + 2));
    s.check(&[tb("k")], S + 3, Mode::Charge);
    let (changes, _) = drain_all(&s, S + 3);
    let k = drained(&changes, "k");
    assert_eq!(k.bucket, bucket_of(&s, "k", S + 3));
    assert_eq!(k.other, TableWrite::Remove);
}

/// A state recorded live but expired by the time it is drained is sent
/// as a removal, as the tables would answer.
#[test]
fn a_state_expired_at_the_drain_is_sent_as_removed() {
    let s = store(1, 64);
    s.start_capture();
    drain_all(&s, S);
    s.check(&[tb("k")], S, Mode::Charge);
    let (changes, _) = drain_all(&s, 100 * S);
    assert_eq!(drained(&changes, "k").bucket, TableWrite::Remove);
}

#[test]
fn an_overflowing_stripe_drops_its_keys_and_is_sent_whole() {
    let s = store(4, 2);
    s.start_capture();
    drain_all(&s, S);
    for k in ["{t}1", "{t}2", "{t}3", "{t}4"] {
        s.check(&[tb(k)], S, Mode::Charge);
    }
    let stats = s.capture_stats();
    assert_eq!(stats.overflows, 1);
    assert_eq!(stats.buffered, 0, "the overflowing log was dropped");
    let (changes, whole) = drain_all(&s, S);
    assert!(changes.is_empty());
    assert_eq!(whole.len(), 1);
    assert_eq!(whole[0].0, stripe_of(&s, "{t}1"));
    assert_eq!(whole[0].1.len(), 4);
    assert_eq!(s.capture_stats().stripe_resyncs, 1);
    // Recording resumes after the stripe was sent.
    s.check(&[tb("{t}1")], S, Mode::Charge);
    let (changes, _) = drain_all(&s, S);
    assert_eq!(changes.len(), 1);
}

#[test]
fn stop_capture_drops_everything() {
    let s = store(4, 8);
    s.start_capture();
    s.check(&[tb("a")], S, Mode::Charge);
    s.stop_capture();
    assert_eq!(s.capture_stats().buffered, 0);
    assert_eq!(drain_all(&s, S), (vec![], vec![]));
}

/// A standby with another stripe count rebuilds the primary's content
/// from its whole stripes, and loses what the primary does not hold.
#[test]
fn replacing_slots_copies_the_primary_whatever_the_stripe_counts() {
    let primary = store(16, 8);
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        let pair = if i % 2 == 0 { tb(k) } else { fw(k) };
        primary.check(std::slice::from_ref(&pair), S, Mode::Charge);
        primary.check(&[pair], S, Mode::Charge);
    }
    primary.start_capture();
    let (_, whole) = drain_all(&primary, S);
    for standby_stripes in [1, 4, 16, 64] {
        let standby = store(standby_stripes, 8);
        // Stale state the primary no longer holds.
        standby.check(&[tb("gone")], S, Mode::Charge);
        standby.check(&[fw("k1")], S, Mode::Charge);
        for (i, entries) in &whole {
            let writes: Vec<KeyWrite> = entries
                .iter()
                .map(|(k, e)| {
                    let put = TableWrite::Put(e.clone());
                    let (bucket, other) = match e.state {
                        State::TokenBucket { .. } => (put, TableWrite::Keep),
                        _ => (TableWrite::Keep, put),
                    };
                    KeyWrite {
                        key: Bytes::copy_from_slice(k.as_bytes()),
                        bucket,
                        other,
                    }
                })
                .collect();
            let skipped = standby.replace_slots(16, *i as u16, &writes);
            assert_eq!(skipped, 0);
        }
        for k in &keys {
            assert_eq!(
                standby.get(k.as_bytes(), S),
                primary.get(k.as_bytes(), S),
                "{k} with {standby_stripes} stripes"
            );
        }
        assert_eq!(standby.get(b"gone", S), None);
        assert_eq!(standby.len(), primary.len());
    }
}

/// A log's memory stays within its cap of records, however it grew: the
/// cap is what `--repl-buffer-cap` documents as the bound.
#[test]
fn a_log_never_holds_room_past_its_cap() {
    for cap in [1, 5, 700, 1024] {
        let mut log = ChangeLog::default();
        for i in 0..cap {
            let key = format!("k{i}");
            assert_eq!(
                log.record(key.as_bytes(), cap, || Captured::RemovedAll),
                log::Recorded::Added
            );
            assert!(log.changes.capacity() <= cap, "cap {cap}, {i} records");
        }
    }
}

/// A standby applies a frame with each key's slot fetched a few keys
/// ahead: what it ends with must be what applying the writes one by one,
/// in order, leaves (a key written twice in the frame keeps its last
/// write; removals and both tables included; more keys than the fetch
/// runs ahead, so the tail is applied after the fetches end).
#[test]
fn a_frame_applied_with_its_keys_fetched_ahead_ends_as_applied_one_by_one() {
    let keys: Vec<String> = (0..25).map(|i| format!("user:{i}")).collect();
    let source = store(16, 64);
    for k in &keys {
        source.check(&[tb(k)], S, Mode::Charge);
        source.check(&[fw(k)], S, Mode::Charge);
    }
    let writes: Vec<KeyWrite> = (0..3 * keys.len() + 1)
        .map(|i| {
            let key = &keys[i % keys.len()];
            let entries = source.entries(key.as_bytes(), S);
            let (bucket, other) = match i % 4 {
                0 => (TableWrite::Put(entries[0].clone()), TableWrite::Keep),
                1 => (TableWrite::Keep, TableWrite::Put(entries[1].clone())),
                2 => (TableWrite::Remove, TableWrite::Keep),
                _ => (TableWrite::Keep, TableWrite::Remove),
            };
            KeyWrite {
                key: Bytes::copy_from_slice(key.as_bytes()),
                bucket,
                other,
            }
        })
        .collect();
    let (one_by_one, ahead) = (store(16, 64), store(4, 64));
    for target in [&one_by_one, &ahead] {
        // Earlier state, for the removals to remove.
        for k in keys.iter().step_by(2) {
            target.check(&[tb(k)], 2 * S, Mode::Charge);
            target.check(&[fw(k)], 2 * S, Mode::Charge);
        }
    }
    writes.iter().for_each(|w| one_by_one.apply(w));
    ahead.apply_all(&writes);
    for k in &keys {
        assert_eq!(
            ahead.entries(k.as_bytes(), S),
            one_by_one.entries(k.as_bytes(), S),
            "{k}"
        );
    }
    assert_eq!(ahead.len(), one_by_one.len());
}

/// A key and its companion charged under one lock are both recorded for
/// the standby, each as it is now.
#[test]
fn a_key_and_its_companion_charged_together_are_both_captured() {
    let s = store(4, 8);
    s.start_capture();
    drain_all(&s, S);
    let (key, companion) = (tb("{t}k"), tb("{t}k\0c"));
    let spots = (s.spot(key.key), s.spot(companion.key));
    let answer = s.charge_with_companion((&key, spots.0), (&companion, spots.1), S);
    assert!(matches!(answer, Some(tollgate_protocol::CheckResult::Decision(d)) if d.allowed));
    let (changes, whole) = drain_all(&s, S);
    assert!(whole.is_empty());
    let mut keys: Vec<_> = changes.iter().map(|c| c.key.as_bytes().to_vec()).collect();
    keys.sort();
    assert_eq!(keys, [b"{t}k".to_vec(), b"{t}k\0c".to_vec()]);
}
