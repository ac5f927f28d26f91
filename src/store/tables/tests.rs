//! The tables' contract seen from inside: where each state is stored (by
//! kind and key width), one other state per key across the leaky, windows
//! and general tables, and the byte accounting through moves between them.

use super::*;
use crate::algorithm::{FixedWindowState, LogState, WindowState};

const S: Nanos = 1_000_000_000;

fn leaky(tat: Nanos) -> Entry {
    Entry {
        state: State::LeakyBucket { tat },
        expires_at: tat,
    }
}

fn bucket(tat: Nanos) -> Entry {
    Entry {
        state: State::TokenBucket { tat },
        expires_at: tat,
    }
}

fn window(count: u64) -> Entry {
    Entry {
        state: State::FixedWindow(FixedWindowState { index: 1, count }),
        expires_at: 2 * S,
    }
}

/// A sliding window of 1 s in window 5 with a current count: it expires
/// when the next window ends.
fn sliding(prev: u64, cur: u64) -> Entry {
    Entry {
        state: State::SlidingWindow(WindowState {
            index: 5,
            prev,
            cur,
        }),
        expires_at: 7 * S,
    }
}

struct Fixture {
    hasher: ahash::RandomState,
    tables: Tables,
}

impl Fixture {
    fn new() -> Self {
        Self {
            hasher: ahash::RandomState::new(),
            tables: Tables::default(),
        }
    }

    fn put(&mut self, key: &[u8], entry: Entry) {
        let hash = self.hasher.hash_one(key);
        self.tables.put(&self.hasher, hash, key, entry);
    }

    fn find(&self, table: Table, key: &[u8]) -> Option<Entry> {
        self.tables.find(table, self.hasher.hash_one(key), key)
    }
}

#[test]
fn entries_are_24_bytes_for_buckets_and_32_for_windows_with_a_short_key() {
    let mut f: Vec<Fixture> = (0..4).map(|_| Fixture::new()).collect();
    for i in 0..1000u64 {
        // 16 bytes, the benchmark's key shape: the short slot.
        let key = format!("rl:{{{i:08x}}}:ab");
        f[0].put(key.as_bytes(), bucket(S + i));
        f[1].put(key.as_bytes(), leaky(S + i));
        f[2].put(key.as_bytes(), window(i));
        let log = State::SlidingLog(LogState::default());
        f[3].put(
            key.as_bytes(),
            Entry {
                state: log,
                expires_at: S,
            },
        );
    }
    let [buckets, leakies, windows, general] = &f[..] else {
        unreachable!()
    };
    assert_eq!(leakies.tables.len(), 1000);
    assert_eq!(leakies.tables.leaky.short.table.len(), 1000);
    assert_eq!(windows.tables.windows.short.table.len(), 1000);
    // Same number of slots in each table: bytes in the ratio of entry + 1
    // control byte.
    let bytes = |f: &Fixture| f.tables.memory_bytes();
    assert_eq!(bytes(leakies), bytes(buckets));
    assert_eq!(bytes(buckets) * 33, bytes(windows) * 25);
    assert_eq!(bytes(buckets) * 65, bytes(general) * 25);
    assert_eq!(
        leakies.find(Table::Others, b"rl:{00000007}:ab"),
        Some(leaky(S + 7))
    );
    assert_eq!(leakies.find(Table::Buckets, b"rl:{00000007}:ab"), None);
    assert_eq!(
        windows.find(Table::Others, b"rl:{00000007}:ab"),
        Some(window(7))
    );
}

#[test]
fn keys_take_the_short_slot_exactly_when_padding_is_unambiguous() {
    // (key, short slot): 15, 16 and 17 bytes, a trailing 0 byte, the empty
    // key, a key that is another's prefix.
    let keys: [(&[u8], bool); 8] = [
        (b"rl:{0000000}:ab", true),
        (b"rl:{00000000}:ab", true),
        (b"rl:{00000000}:abc", false),
        (b"rl:{0000000}:ab\0", false),
        (b"ab\0", false),
        (b"ab", true),
        (b"", true),
        (b"a\0b", true),
    ];
    let mut f = Fixture::new();
    for (i, (key, _)) in keys.iter().enumerate() {
        let i = i as u64;
        f.put(key, bucket(S + i));
        f.put(key, sliding(i, 1));
    }
    for (i, (key, short)) in keys.iter().enumerate() {
        let i = i as u64;
        assert_eq!(Place::of(key, &bucket(S)).short, *short, "{key:?}");
        assert_eq!(f.find(Table::Buckets, key), Some(bucket(S + i)), "{key:?}");
        assert_eq!(f.find(Table::Others, key), Some(sliding(i, 1)), "{key:?}");
    }
    let shorts = keys.iter().filter(|(_, short)| *short).count();
    assert_eq!(f.tables.buckets.short.table.len(), shorts);
    assert_eq!(f.tables.windows.short.table.len(), shorts);
    assert_eq!(f.tables.buckets.long.table.len(), keys.len() - shorts);
    // Inline long keys own no heap bytes.
    assert_eq!(f.tables.heap_bytes, 0);
    // Walks give every key back byte for byte.
    let mut seen = Vec::new();
    f.tables.for_each(|key, e| seen.push((key.to_vec(), e)));
    for (i, (key, _)) in keys.iter().enumerate() {
        let i = i as u64;
        assert!(seen.contains(&(key.to_vec(), bucket(S + i))), "{key:?}");
        assert!(seen.contains(&(key.to_vec(), sliding(i, 1))), "{key:?}");
    }
    assert_eq!(seen.len(), 2 * keys.len());
    // Removing one key leaves its neighbours (`ab` beside `ab\0`).
    let hash = f.hasher.hash_one(b"ab\0");
    assert!(f.tables.remove_all(hash, b"ab\0", 0));
    assert_eq!(f.find(Table::Buckets, b"ab\0"), None);
    assert_eq!(f.find(Table::Buckets, b"ab"), Some(bucket(S + 5)));
    f.tables.retain_keys(|k| !k.is_empty());
    assert_eq!(f.find(Table::Others, b""), None);
    assert_eq!(f.tables.len(), 2 * (keys.len() - 2));
}

#[test]
fn a_window_that_does_not_pack_lives_in_the_general_table() {
    let key = b"rl:{00000000}:ab";
    let mut f = Fixture::new();
    f.put(key, sliding(3, 1));
    assert_eq!(f.tables.windows.len(), 1);
    // A count past the packed field: the general table, and nowhere else.
    let big = sliding(3, 1 << 24);
    f.put(key, big.clone());
    assert_eq!(
        (f.tables.windows.len(), f.tables.others.table.len()),
        (0, 1)
    );
    assert_eq!(f.find(Table::Others, key), Some(big));
    // Packable again: back to the windows table.
    f.put(key, sliding(3, 2));
    assert_eq!(
        (f.tables.windows.len(), f.tables.others.table.len()),
        (1, 0)
    );
    assert_eq!(f.find(Table::Others, key), Some(sliding(3, 2)));
    // A window that is not whole milliseconds, an expiry the algorithm
    // would not write: kept whole.
    for odd in [
        Entry {
            state: State::FixedWindow(FixedWindowState { index: 1, count: 1 }),
            expires_at: 2 * (S + 1),
        },
        Entry {
            expires_at: 8 * S,
            ..sliding(1, 1)
        },
    ] {
        f.put(key, odd.clone());
        assert_eq!(
            (f.tables.windows.len(), f.tables.others.table.len()),
            (0, 1)
        );
        assert_eq!(f.find(Table::Others, key), Some(odd));
        let hash = f.hasher.hash_one(key);
        assert!(f.tables.is_new(hash, key, &window(1)));
        assert_eq!(Place::of(key, &window(1)).kind, Kind::Windows);
        f.put(key, window(1));
        assert_eq!(
            (f.tables.windows.len(), f.tables.others.table.len()),
            (1, 0)
        );
    }
    // Another window length (a changed rule): updated in place, once.
    let longer = Entry {
        state: State::FixedWindow(FixedWindowState { index: 0, count: 3 }),
        expires_at: 2 * S,
    };
    f.put(key, longer.clone());
    assert_eq!(
        (f.tables.windows.len(), f.tables.others.table.len()),
        (1, 0)
    );
    assert_eq!(f.find(Table::Others, key), Some(longer));
    // Expiry and walks read a packed window's expiry back.
    assert_eq!(f.tables.sweep(&f.hasher, 2 * S), 1);
    assert_eq!(f.tables.len(), 0);
}

#[test]
fn a_key_holds_one_other_state_wherever_it_is_stored() {
    // Long enough to live on the heap: its bytes are counted once per entry.
    let key = b"rl:{a-key-long-enough-for-the-heap}:leaky";
    let mut f = Fixture::new();
    f.put(key, bucket(5 * S));
    f.put(key, leaky(3 * S));
    assert_eq!(f.tables.len(), 2);
    assert_eq!(f.tables.heap_bytes, 2 * key.len());
    // A window replaces the leaky bucket: it leaves the leaky table.
    f.put(key, window(4));
    assert_eq!(f.tables.len(), 2);
    assert_eq!(f.tables.leaky.len(), 0);
    assert_eq!(f.tables.windows.long.table.len(), 1);
    assert_eq!(f.find(Table::Others, key), Some(window(4)));
    assert_eq!(f.tables.heap_bytes, 2 * key.len());
    // And back: the window leaves the windows table.
    f.put(key, leaky(4 * S));
    assert_eq!(f.tables.len(), 2);
    assert_eq!(f.tables.windows.len(), 0);
    assert_eq!(f.find(Table::Others, key), Some(leaky(4 * S)));
    // The token bucket beside it was never touched.
    assert_eq!(f.find(Table::Buckets, key), Some(bucket(5 * S)));
    let hash = f.hasher.hash_one(key);
    assert!(!f.tables.is_new(hash, key, &leaky(S)));
    assert!(f.tables.is_new(hash, key, &window(1)));
    assert_eq!(
        f.tables.remove(Table::Others, hash, key),
        Some(leaky(4 * S))
    );
    assert_eq!(f.find(Table::Others, key), None);
    assert_eq!(f.tables.heap_bytes, key.len());
    assert!(f.tables.remove_all(hash, key, S));
    assert_eq!((f.tables.len(), f.tables.heap_bytes), (0, 0));
}

#[test]
fn every_walk_covers_the_leaky_table() {
    let mut f = Fixture::new();
    for i in 0..10u64 {
        f.put(format!("k{i}").as_bytes(), leaky(S + i * S));
    }
    let mut seen = Vec::new();
    f.tables
        .for_each(|key, entry| seen.push((key.to_vec(), entry)));
    assert_eq!(seen.len(), 10);
    assert!(seen
        .iter()
        .all(|(_, e)| matches!(e.state, State::LeakyBucket { .. })));
    // Expired at 5 s: k0..k4 (tat 1..5 s).
    assert_eq!(f.tables.sweep(&f.hasher, 5 * S), 5);
    assert_eq!(f.find(Table::Others, b"k4"), None);
    assert_eq!(f.find(Table::Others, b"k5"), Some(leaky(6 * S)));
    f.tables.retain_keys(|k| k != b"k9");
    assert_eq!(f.tables.len(), 4);
    assert_eq!(f.find(Table::Others, b"k9"), None);
}

#[test]
fn the_budget_evicts_leaky_buckets_closest_to_expiry() {
    // 56 entries fill a table of capacity 56: one more would double it.
    let mut f = Fixture::new();
    for i in 0..56u64 {
        f.put(format!("k{i:02}").as_bytes(), leaky(S + i * S));
    }
    let budget = f.tables.memory_bytes();
    let room = f.tables.make_room(
        &f.hasher,
        Place::compact(Kind::Leaky, true),
        (1, 0),
        (budget, Full::Evict),
        0,
        false,
    );
    assert!(room.granted);
    // 1/8 of them, the soonest to expire.
    assert_eq!(room.evicted, 7, "{room:?}");
    assert_eq!(f.find(Table::Others, b"k06"), None);
    assert_eq!(f.find(Table::Others, b"k07"), Some(leaky(8 * S)));
    assert!(
        f.tables
            .memory_after(Place::compact(Kind::Leaky, true), 1, 0)
            <= budget
    );
    // Under `refuse` nothing live goes.
    let len = f.tables.len();
    let budget = f.tables.memory_bytes();
    let room = f.tables.make_room(
        &f.hasher,
        Place::compact(Kind::Leaky, true),
        (len + 1, 0),
        (budget, Full::Refuse),
        0,
        false,
    );
    assert!(!room.granted);
    assert_eq!(f.tables.len(), len);
}
