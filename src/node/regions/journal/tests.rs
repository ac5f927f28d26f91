//! The journal's own tests: room, merging, sharing and sealing.

use super::seal::FetchAhead;
use super::*;
use tollgate_protocol::usage_header_len;

const ROOM: usize = usize::MAX;

/// One hasher for every journal of a test, as for those of a node.
static HASHER: std::sync::OnceLock<JournalHasher> = std::sync::OnceLock::new();

fn add(j: &mut Journal, key: &[u8], usage: (u64, u64, Nanos), room: usize) -> bool {
    let hash = HASHER
        .get_or_init(JournalHasher::default)
        .hash(key, &rule());
    j.add((hash, key, &rule(), 1), usage, room)
}

impl Journal {
    /// Whether `key` under the tests' rule is here.
    fn find_key(&self, key: &[u8]) -> bool {
        let hash = HASHER
            .get_or_init(JournalHasher::default)
            .hash(key, &rule());
        let i = self.name_index(rule().as_bytes(), 1);
        i.is_some_and(|i| self.entries.find(hash, |e| e.is(key, i)).is_some())
    }
}

fn rule() -> RuleName {
    RuleName::try_from("api").unwrap()
}

#[test]
fn a_full_journal_drops_new_keys_and_keeps_adding_up_old_ones() {
    let mut j = Journal::default();
    let one = entry_bytes(b"key-0000", &rule());
    let room = |j: &Journal| (10 * one).saturating_sub(j.bytes());
    for i in 0..100 {
        let key = Bytes::from(format!("key-{i:04}"));
        let left = room(&j);
        assert_eq!(add(&mut j, &key, (1, 0, 5), left), i < 10, "{i}");
    }
    assert_eq!((j.len(), j.bytes()), (10, 10 * one));
    // A key already there still counts every unit.
    for _ in 0..5 {
        assert!(add(&mut j, &Bytes::from_static(b"key-0003"), (2, 1, 9), 0));
    }
    // Moving it into another journal (the sender's pending one) keeps
    // the count; a key in both is counted once.
    let mut pending = Journal::default();
    add(
        &mut pending,
        &Bytes::from_static(b"key-0003"),
        (1, 0, 1),
        ROOM,
    );
    pending.absorb(&mut j);
    assert_eq!((pending.len(), pending.bytes()), (10, 10 * one));
    let (entries, left) = pending.seal(1 << 20, 2);
    assert!(!left);
    assert_eq!(pending.bytes(), 0);
    let three = entries.iter().find(|e| &e.key[..] == b"key-0003").unwrap();
    assert_eq!((three.charged, three.refunded), (1 + 1 + 10, 5));
}

#[test]
fn journals_naming_rules_in_another_order_merge_by_name() {
    let hasher = JournalHasher::default();
    let (x, y) = (RuleName::from_static("x"), RuleName::from_static("y"));
    let put = |j: &mut Journal, rule: &RuleName, charged| {
        let hash = hasher.hash(b"k", rule);
        assert!(j.add((hash, b"k", rule, 1), (charged, 0, 1), ROOM));
    };
    // One key under two rules: two entries; each journal meets the
    // names in another order, so their indexes differ.
    let (mut a, mut b) = (Journal::default(), Journal::default());
    put(&mut a, &x, 1);
    put(&mut a, &y, 10);
    put(&mut b, &y, 100);
    put(&mut b, &x, 1000);
    put(&mut b, &x, 1000);
    let one = entry_bytes(b"k", &x);
    a.absorb(&mut b);
    assert_eq!((a.len(), a.bytes()), (2, 2 * one));
    let (entries, left) = a.seal(1 << 20, 2);
    assert!(!left);
    let charged = |r: &RuleName| entries.iter().find(|e| e.rule == *r).unwrap().charged;
    assert_eq!((charged(&x), charged(&y)), (2001, 110));
    // Emptied, it forgets the names too.
    assert!(a.names.is_empty());
}

/// The journal holds copies of its keys, short (inline) and long: a slice
/// of the request frame would keep the whole frame alive. (Read in the
/// journal itself: a sealed message's keys are decoded afresh anyway.)
#[test]
fn a_journaled_key_is_a_copy_not_a_slice_of_the_frame() {
    let frame = Bytes::from(vec![b'k'; 4096]);
    let mut j = Journal::default();
    add(&mut j, &frame.slice(0..8), (1, 0, 1), ROOM);
    add(&mut j, &frame.slice(100..140), (1, 0, 1), ROOM);
    assert_eq!(j.len(), 2);
    let start = frame.as_ptr() as usize;
    for e in j.entries.iter() {
        let at = e.key.as_bytes().as_ptr() as usize;
        assert!(
            !(start..start + frame.len()).contains(&at),
            "a key in the frame"
        );
    }
}

#[test]
fn a_message_carries_short_and_long_keys_with_their_usage() {
    let mut j = Journal::default();
    // Inline (up to 22 bytes) and on the heap, each with its own usage.
    let keys: Vec<Vec<u8>> = (1..=40).map(|n| vec![b'a' + (n % 26) as u8; n]).collect();
    for (i, key) in keys.iter().enumerate() {
        add(&mut j, key, (i as u64 + 1, 0, 7), ROOM);
    }
    // Through a second journal, as a peer's share and a sender's
    // pending one take them.
    let mut pending = Journal::default();
    add(&mut pending, &keys[0], (100, 0, 3), ROOM);
    pending.absorb(&mut j);
    let (entries, left) = pending.seal(1 << 20, 2);
    assert!(!left);
    assert_eq!(entries.len(), keys.len());
    for (i, key) in keys.iter().enumerate() {
        let e = entries.iter().find(|e| e.key[..] == key[..]).unwrap();
        let extra = if i == 0 { 100 } else { 0 };
        assert_eq!(
            e.charged,
            i as u64 + 1 + extra,
            "key of {} bytes",
            key.len()
        );
    }
    assert_eq!((pending.len(), pending.bytes()), (0, 0));
}

#[test]
fn a_journal_emptied_by_sealing_has_its_whole_room_once_cleared() {
    let mut j = Journal::with_capacity(1000);
    let room = j.capacity();
    // Full to the last slot, then sealed empty: most slots are left
    // tombstones, which count against the room until cleared.
    for i in 0..room {
        add(&mut j, format!("key-{i}").as_bytes(), (1, 0, 5), ROOM);
    }
    assert_eq!(j.capacity(), room, "filled without growing");
    while !j.is_empty() {
        j.seal(1 << 20, 2);
    }
    j.clear();
    assert_eq!(j.capacity(), room);
}

#[test]
fn usage_of_one_key_adds_up_and_keeps_the_latest_time() {
    let mut j = Journal::default();
    let k = Bytes::from_static(b"rl:{a}");
    add(&mut j, &k, (2, 0, 10), ROOM);
    add(&mut j, &k, (3, 1, 30), ROOM);
    add(&mut j, &k, (0, 1, 40), ROOM);
    let (entries, left) = j.seal(1 << 20, 2);
    assert!(!left);
    assert_eq!(entries.len(), 1);
    let e = &entries[0];
    assert_eq!((e.charged, e.refunded, e.at), (5, 2, 30));
    assert_eq!(j.len(), 0);
}

/// Sealing passes over an entry too large for the room left and takes
/// smaller ones beyond it: each key still finds its own entry
/// afterwards (its usage adds up there, no second entry), and every
/// unit is sealed once.
#[test]
fn an_entry_too_large_for_a_message_is_passed_over_and_still_found() {
    let mut j = Journal::default();
    let long = vec![b'L'; 3000];
    // Twelve keys and a long one among them: a message takes ten short
    // ones at most and passes over the long one.
    let keys: Vec<Vec<u8>> = (0..12)
        .map(|i| format!("key-{i:04}").into_bytes())
        .collect();
    for (i, key) in keys.iter().enumerate() {
        add(&mut j, key, (1, 0, 5), ROOM);
        if i == 3 {
            add(&mut j, &long, (7, 0, 5), ROOM);
        }
    }
    // Room for ten short entries (38 bytes each), never the long one.
    let max = usage_header_len(2) + 38 * 10;
    let mut sealed: std::collections::HashMap<Vec<u8>, u64> = Default::default();
    let mut seal = |j: &mut Journal, max| {
        let (entries, left) = j.seal(max, 2);
        for e in entries {
            *sealed.entry(e.key.to_vec()).or_default() += e.charged;
        }
        left
    };
    // Every key again after each of the first messages: those still
    // here merge into their entries, the others come back new.
    for round in 0..4 {
        assert!(seal(&mut j, max), "the long entry is left");
        let before = j.len();
        let here = keys.iter().filter(|k| j.find_key(k)).count();
        assert!(here < keys.len(), "round {round}: nothing sealed");
        for key in &keys {
            add(&mut j, key, (1, 0, 5), ROOM);
        }
        assert_eq!(j.len(), before + (keys.len() - here), "round {round}");
        // The long entry, passed over, merges.
        add(&mut j, &long, (1, 0, 5), ROOM);
        assert_eq!(j.len(), before + (keys.len() - here), "round {round}");
    }
    let mut messages = 0;
    while j.len() > 1 {
        assert!(seal(&mut j, max), "the long entry is left");
        messages += 1;
        assert!(messages < 100, "sealing makes no headway");
    }
    assert!(!seal(&mut j, 1 << 20));
    assert!(j.is_empty());
    assert_eq!(sealed[&long], 7 + 4);
    for key in &keys {
        assert_eq!(sealed[key], 5, "{}", String::from_utf8_lossy(key));
    }
}

/// A share without the entries of rules that do not list its peer
/// finds its remaining keys where they are.
#[test]
fn a_share_finds_its_keys_after_others_are_left_out() {
    let hasher = JournalHasher::default();
    let (x, y) = (RuleName::from_static("x"), RuleName::from_static("y"));
    let mut j = Journal::default();
    for i in 0..50 {
        let key = format!("key-{i}");
        let rule = if i % 3 == 0 { &x } else { &y };
        let peers = if i % 3 == 0 { 0b01 } else { 0b11 };
        let hash = hasher.hash(key.as_bytes(), rule);
        assert!(j.add((hash, key.as_bytes(), rule, peers), (1, 0, 5), ROOM));
    }
    let mut share = j.into_share(1);
    assert_eq!(share.len(), 33);
    for i in (0..50).filter(|i| i % 3 != 0) {
        let key = format!("key-{i}");
        let hash = hasher.hash(key.as_bytes(), &y);
        assert!(share.add((hash, key.as_bytes(), &y, 0b11), (2, 0, 5), ROOM));
    }
    assert_eq!(share.len(), 33, "each key merged into its entry");
    let (entries, _) = share.seal(1 << 20, 2);
    assert!(entries.iter().all(|e| e.charged == 3 && e.rule == y));
}

#[test]
fn a_message_takes_what_fits_and_leaves_the_rest() {
    let mut j = Journal::default();
    for i in 0..100 {
        add(&mut j, &Bytes::from(format!("key-{i:04}")), (1, 0, 5), ROOM);
    }
    // Each entry: 2 + 8 + 1 + 3 + 24 = 38 bytes.
    let max = usage_header_len(2) + 38 * 30;
    let (first, left) = j.seal(max, 2);
    assert_eq!(first.len(), 30);
    assert!(left);
    assert_eq!(j.len(), 70);
    let mut rest = 0;
    while !j.is_empty() {
        rest += j.seal(max, 2).0.len();
    }
    assert_eq!(rest, 70);
}

/// Sealed in one walk, every entry goes into exactly one message, each
/// within the bound; an entry no message holds is left out and counted;
/// the journal is left empty with its room.
#[test]
fn sealing_everything_puts_each_entry_in_one_message_within_the_bound() {
    let mut j = Journal::default();
    for i in 0..100u64 {
        add(&mut j, format!("key-{i:04}").as_bytes(), (i, 1, 5), ROOM);
    }
    add(&mut j, &[b'L'; 3000], (7, 2, 5), ROOM);
    let room = j.capacity();
    // Room for thirty 38-byte entries a message, never the long one.
    let max = usage_header_len(2) + 38 * 30;
    let mut sealed = Vec::new();
    let mut next = || UsageFrame::new(BytesMut::new(), "us", (0, 0, 9)).ok();
    let left_out = j.seal_all((max, 2), &mut next, &mut sealed);
    assert_eq!(left_out, (1, 9));
    assert_eq!(sealed.len(), 4);
    // The bound is on the payload: the frame adds its length, opcode and
    // request id.
    assert!(
        sealed.iter().all(|m| m.len() <= 9 + max),
        "within the bound"
    );
    let mut got: Vec<(Vec<u8>, u64, u64)> = (sealed.iter_mut())
        .flat_map(|m| decoded(m).entries)
        .map(|e| (e.key.to_vec(), e.charged, e.refunded))
        .collect();
    got.sort();
    let want: Vec<_> = (0..100u64)
        .map(|i| (format!("key-{i:04}").into_bytes(), i, 1))
        .collect();
    assert_eq!(got, want);
    assert!(j.is_empty());
    assert_eq!((j.bytes(), j.capacity()), (0, room));
    // None to be had: everything is left out, counted.
    add(&mut j, b"k", (3, 0, 5), ROOM);
    let left_out = j.seal_all((max, 2), &mut || None, &mut sealed);
    assert_eq!((left_out, sealed.len()), ((1, 3), 4));
}

/// What the wire takes is what a message of the entries measures.
#[test]
fn the_wire_bytes_are_what_a_message_of_the_entries_takes() {
    let mut j = Journal::default();
    for i in 0..50 {
        let key = format!("key-{}", "x".repeat(i));
        add(&mut j, key.as_bytes(), (1, 0, 5), ROOM);
    }
    let wire = j.wire_bytes();
    let mut frame = UsageFrame::new(BytesMut::new(), "us", (0, 0, 9)).unwrap();
    assert!(!j.seal_into(1 << 20, 2, &mut frame));
    // The frame's length, opcode and request id, then the payload.
    assert_eq!(frame.len(), 9 + usage_header_len(2) + wire);
}

/// The seal's walk asks for each line below the entries it reads once, at
/// most `FetchAhead::BYTES` at a time: from the first entry, as it goes
/// down, and nothing for an entry met above what it asked for.
#[test]
fn the_seal_asks_for_the_lines_below_its_walk_once() {
    let bytes = FetchAhead::BYTES;
    let mut ahead = FetchAhead::default();
    let at = 1 << 20;
    assert_eq!(ahead.span(at), Some((at - bytes, bytes)));
    // One entry down: only the span not asked for yet.
    assert_eq!(ahead.span(at - 64), Some((at - 64 - bytes, 64)));
    // Up again (another layout): nothing more.
    assert_eq!(ahead.span(at + 4096), None);
    // Far below: a fresh span, no longer than BYTES.
    assert_eq!(ahead.span(at - 10 * bytes), Some((at - 11 * bytes, bytes)));
    // Near address 0: the span stops at 0.
    let mut low = FetchAhead::default();
    assert_eq!(low.span(100), Some((0, 100)));
}
