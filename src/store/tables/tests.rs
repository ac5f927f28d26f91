//! The tables' contract seen from inside: where each state is stored, one
//! other state per key across the leaky and general tables, and the byte
//! accounting through moves between them.

use super::*;
use crate::algorithm::FixedWindowState;

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
fn leaky_buckets_take_as_little_room_as_token_buckets() {
    let (mut buckets, mut leakies, mut windows) = (Fixture::new(), Fixture::new(), Fixture::new());
    for i in 0..1000u64 {
        let key = format!("rl:{{{i:08x}}}:ab");
        buckets.put(key.as_bytes(), bucket(S + i));
        leakies.put(key.as_bytes(), leaky(S + i));
        windows.put(key.as_bytes(), window(i));
    }
    assert_eq!(leakies.tables.len(), 1000);
    assert_eq!(leakies.tables.leaky.table.len(), 1000);
    assert_eq!(
        leakies.tables.memory_bytes(),
        buckets.tables.memory_bytes(),
        "a leaky bucket is one 32-byte entry, as a token bucket"
    );
    assert!(leakies.tables.memory_bytes() < windows.tables.memory_bytes() * 2 / 3);
    assert_eq!(
        leakies.find(Table::Others, b"rl:{00000007}:ab"),
        Some(leaky(S + 7))
    );
    assert_eq!(leakies.find(Table::Buckets, b"rl:{00000007}:ab"), None);
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
    assert_eq!(f.tables.leaky.table.len(), 0);
    assert_eq!(f.find(Table::Others, key), Some(window(4)));
    assert_eq!(f.tables.heap_bytes, 2 * key.len());
    // And back: the window leaves the general table.
    f.put(key, leaky(4 * S));
    assert_eq!(f.tables.len(), 2);
    assert_eq!(f.tables.others.table.len(), 0);
    assert_eq!(f.find(Table::Others, key), Some(leaky(4 * S)));
    // The token bucket beside it was never touched.
    assert_eq!(f.find(Table::Buckets, key), Some(bucket(5 * S)));
    let hash = f.hasher.hash_one(key);
    assert!(!f.tables.is_new(hash, key, &leaky(S).state));
    assert!(f.tables.is_new(hash, key, &window(1).state));
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
        .for_each(|key, entry| seen.push((key.clone(), entry)));
    assert_eq!(seen.len(), 10);
    assert!(seen
        .iter()
        .all(|(_, e)| matches!(e.state, State::LeakyBucket { .. })));
    // Expired at 5 s: k0..k4 (tat 1..5 s).
    assert_eq!(f.tables.retain_live(5 * S), 5);
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
        Place::Leaky,
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
    assert!(f.tables.memory_after(Place::Leaky, 1, 0) <= budget);
    // Under `refuse` nothing live goes.
    let len = f.tables.len();
    let budget = f.tables.memory_bytes();
    let room = f.tables.make_room(
        &f.hasher,
        Place::Leaky,
        (len + 1, 0),
        (budget, Full::Refuse),
        0,
        false,
    );
    assert!(!room.granted);
    assert_eq!(f.tables.len(), len);
}
