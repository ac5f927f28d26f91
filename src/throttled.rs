//! The keys denied most in the recent past, in bounded memory, off any
//! shared lock on the deny path.
//!
//! A Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005): at most
//! `capacity` counters; a key already counted is incremented; a new key
//! takes a free counter, or else replaces the smallest one and inherits its
//! count (remembered as the key's `error`, the most its count can be over).
//! The counters sit in a min-heap by count, so an increment or a
//! replacement costs O(log capacity), never a scan.
//!
//! Shards per thread, merged on read: each thread records into its own
//! shard (picked once per thread; a thread that finds it busy, because a
//! reader or a thread sharing it holds it, takes the next free one), so two
//! threads denying at once never wait for each other, whichever keys they
//! deny. A key may therefore be counted in several shards, and a query
//! merges them as mergeable summaries do: per shard, a tracked key adds its
//! count and error; an untracked key of a full shard adds that shard's
//! smallest count to both (it can have been denied at most that often
//! there, unseen). Each shard has the full `capacity`, so the merged
//! sketch keeps Space-Saving's guarantees over all shards: any key denied
//! more than `total / capacity` times in a window is reported, and a
//! reported count is never below the true one nor more than `error` above.
//!
//! Recency: time is cut into windows of `window`; each shard keeps the
//! current window's sketch and the previous one's, and a query adds the two,
//! so it covers between one and two windows of the past. Memory is fixed by
//! construction: `shards × 2 × capacity` counters at most (shards: the
//! host's cores, at most [`MAX_SHARDS`]), each holding a key of at most the
//! server's `max_key_len` bytes; counters are allocated as keys arrive.

use crate::clock::Nanos;
use crate::sync::Mutex;
use hashbrown::HashTable;
use std::collections::HashMap;

/// Most shards of a sketch (a power of two): one per core up to this.
pub const MAX_SHARDS: usize = 8;

/// One tracked key and its counts over the windows kept.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Throttled {
    pub key: Vec<u8>,
    /// Denials counted (an over-estimate by at most `error`).
    pub denied: u64,
    /// How much of `denied` may belong to keys this counter replaced.
    pub error: u64,
}

#[derive(Debug)]
struct Counter {
    key: Box<[u8]>,
    count: u64,
    error: u64,
    /// Position of this counter in `SpaceSaving::heap`.
    slot: usize,
}

/// A Space-Saving sketch of fixed capacity.
#[derive(Debug)]
struct SpaceSaving {
    capacity: usize,
    counters: Vec<Counter>,
    /// Indexes into `counters`, a min-heap by count: the root is the
    /// counter a new key replaces.
    heap: Vec<usize>,
    /// Indexes into `counters` by key (the key is stored once, in the
    /// counter).
    index: HashTable<usize>,
    hasher: ahash::RandomState,
}

impl SpaceSaving {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            counters: Vec::new(),
            heap: Vec::new(),
            index: HashTable::new(),
            hasher: ahash::RandomState::new(),
        }
    }

    fn add(&mut self, key: &[u8]) {
        let hash = self.hasher.hash_one(key);
        let counters = &self.counters;
        if let Some(&i) = self.index.find(hash, |&i| *counters[i].key == *key) {
            self.counters[i].count += 1;
            self.sift_down(self.counters[i].slot);
            return;
        }
        let rehash = |counters: &[Counter], i: usize| self.hasher.hash_one(&counters[i].key);
        if self.counters.len() < self.capacity {
            let i = self.counters.len();
            self.counters.push(Counter {
                key: key.into(),
                count: 1,
                error: 0,
                slot: self.heap.len(),
            });
            let counters = &self.counters;
            self.index.insert_unique(hash, i, |&j| rehash(counters, j));
            self.heap.push(i);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Full: the new key takes over the smallest counter, at the root.
        let Some(&i) = self.heap.first() else {
            return; // capacity 0: counts nothing
        };
        let old = self.hasher.hash_one(&self.counters[i].key);
        if let Ok(found) = self.index.find_entry(old, |&j| j == i) {
            found.remove();
        }
        let counter = &mut self.counters[i];
        // Keys of an attack tend to have one length: reuse the buffer.
        if counter.key.len() == key.len() {
            counter.key.copy_from_slice(key);
        } else {
            counter.key = key.into();
        }
        counter.error = counter.count;
        counter.count += 1;
        let counters = &self.counters;
        self.index.insert_unique(hash, i, |&j| rehash(counters, j));
        self.sift_down(0);
    }

    /// The smallest count when full (what an untracked key may have had),
    /// 0 while there is room (an untracked key was never denied here).
    fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity {
            return 0;
        }
        self.heap.first().map_or(0, |&i| self.counters[i].count)
    }

    fn count(&self, at: usize) -> u64 {
        self.counters[self.heap[at]].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.counters[self.heap[a]].slot = a;
        self.counters[self.heap[b]].slot = b;
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count(parent) <= self.count(at) {
                return;
            }
            self.swap(parent, at);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if left < self.heap.len() && self.count(left) < self.count(least) {
                least = left;
            }
            if right < self.heap.len() && self.count(right) < self.count(least) {
                least = right;
            }
            if least == at {
                return;
            }
            self.swap(at, least);
            at = least;
        }
    }

    fn clear(&mut self) {
        self.counters.clear();
        self.heap.clear();
        self.index.clear();
    }

    fn len(&self) -> usize {
        self.counters.len()
    }
}

#[derive(Debug)]
struct Shard {
    /// Index of the window `current` counts.
    window: u64,
    current: SpaceSaving,
    previous: SpaceSaving,
}

impl Shard {
    /// Moves the windows forward to the one holding `now`.
    fn roll(&mut self, window: u64) {
        if window <= self.window {
            return;
        }
        if window == self.window + 1 {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.clear();
        } else {
            self.current.clear();
            self.previous.clear();
        }
        self.window = window;
    }
}

/// Hands out each thread's home shard: threads in turn. A `std` atomic,
/// not one from `crate::sync`: a static cannot hold loom's, and this is
/// only a hint spreading threads (any shard is correct).
static NEXT_HOME: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

std::thread_local! {
    /// This thread's home shard (modulo the shard count of each sketch).
    static HOME: usize = NEXT_HOME.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Top denied keys; see the module docs.
#[derive(Debug)]
pub struct TopThrottled {
    shards: Box<[Mutex<Shard>]>,
    window: Nanos,
    capacity: usize,
}

impl TopThrottled {
    /// A sketch tracking up to `capacity` keys per window, counting over
    /// `window` nanoseconds, with a shard per core (at most
    /// [`MAX_SHARDS`]).
    pub fn new(capacity: usize, window: Nanos) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_shards(capacity, window, cores)
    }

    /// Like [`new`](Self::new), with `shards` shards (rounded up to a power
    /// of two, between 1 and [`MAX_SHARDS`]).
    pub fn with_shards(capacity: usize, window: Nanos, shards: usize) -> Self {
        let n = shards.clamp(1, MAX_SHARDS).next_power_of_two();
        let shards = (0..n)
            .map(|_| {
                Mutex::new(Shard {
                    window: 0,
                    current: SpaceSaving::new(capacity),
                    previous: SpaceSaving::new(capacity),
                })
            })
            .collect();
        Self {
            shards,
            window: window.max(1),
            capacity,
        }
    }

    /// Keys tracked per window at most (in each shard; merged answers are
    /// bounded by it too).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The length of one window, in nanoseconds.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// Counts one denial of `key` at `now`. Never waits for another thread
    /// while a shard is free.
    pub fn record(&self, key: &[u8], now: Nanos) {
        let mask = self.shards.len() - 1;
        let home = HOME.with(|h| *h);
        let window = now / self.window;
        for i in 0..self.shards.len() {
            if let Some(mut shard) = self.shards[(home + i) & mask].try_lock() {
                shard.roll(window);
                shard.current.add(key);
                return;
            }
        }
        // Every shard busy (more threads than shards, or a query): wait
        // for this thread's own.
        let mut shard = self.shards[home & mask].lock();
        shard.roll(window);
        shard.current.add(key);
    }

    /// Counters in use right now, over every shard and both windows.
    pub fn tracked(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.current.len() + s.previous.len()
            })
            .sum()
    }

    /// The `n` keys with the most denials over the current and previous
    /// windows, most denied first (ties by key). Locks one shard at a time.
    pub fn top(&self, n: usize, now: Nanos) -> Vec<Throttled> {
        // Every sketch adds its floor for keys it does not track; a key it
        // tracks adds its own count and error instead.
        let mut floors = 0u64;
        // Per key: its counts, errors, and the floors of the sketches that
        // track it (which it does not get on top of its own count).
        let mut seen: HashMap<Vec<u8>, (u64, u64, u64)> = HashMap::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.roll(now / self.window);
            for sketch in [&shard.current, &shard.previous] {
                let floor = sketch.floor();
                floors += floor;
                for c in &sketch.counters {
                    let e = seen.entry(c.key.to_vec()).or_default();
                    e.0 += c.count;
                    e.1 += c.error;
                    e.2 += floor;
                }
            }
        }
        let mut out: Vec<Throttled> = seen
            .into_iter()
            .map(|(key, (count, error, own))| Throttled {
                key,
                denied: count + (floors - own),
                error: error + (floors - own),
            })
            .collect();
        out.sort_by(|a, b| b.denied.cmp(&a.denied).then_with(|| a.key.cmp(&b.key)));
        out.truncate(n);
        out
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    #[test]
    fn counts_exactly_while_there_is_room() {
        let t = TopThrottled::new(64, 60 * S);
        for (key, n) in [("a", 5), ("b", 3), ("c", 9)] {
            for _ in 0..n {
                t.record(key.as_bytes(), 10 * S);
            }
        }
        let top = t.top(2, 10 * S);
        assert_eq!(
            top,
            vec![
                Throttled {
                    key: b"c".to_vec(),
                    denied: 9,
                    error: 0
                },
                Throttled {
                    key: b"a".to_vec(),
                    denied: 5,
                    error: 0
                },
            ]
        );
    }

    #[test]
    fn memory_is_bounded_whatever_the_number_of_keys() {
        let t = TopThrottled::new(64, 60 * S);
        assert_eq!(t.capacity(), 64);
        // A flood of distinct keys, and two heavy hitters among them.
        for i in 0..100_000u32 {
            t.record(format!("noise:{i}").as_bytes(), S);
            if i % 10 == 0 {
                t.record(b"heavy:1", S);
            }
            if i % 20 == 0 {
                t.record(b"heavy:2", S);
            }
        }
        for shard in t.shards.iter() {
            let s = shard.lock();
            assert!(s.current.len() <= 64 && s.current.index.len() == s.current.len());
            assert_eq!(s.current.heap.len(), s.current.len());
        }
        assert!(t.tracked() <= 64 * t.shards.len());
        let top = t.top(2, S);
        assert_eq!(top[0].key, b"heavy:1");
        assert_eq!(top[1].key, b"heavy:2");
        // Never under the true count, never more than `error` over it.
        assert!(top[0].denied >= 10_000 && top[0].denied - top[0].error <= 10_000);
        assert!(top[1].denied >= 5_000 && top[1].denied - top[1].error <= 5_000);
    }

    #[test]
    fn old_windows_are_forgotten() {
        let t = TopThrottled::new(16, 60 * S);
        t.record(b"old", 10 * S);
        t.record(b"old", 10 * S);
        t.record(b"new", 70 * S);
        // Window 1 sees window 0 as the previous one.
        let top = t.top(10, 70 * S);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].key, b"old");
        // Two windows on, window 0 is gone.
        let top = t.top(10, 130 * S);
        assert_eq!(
            top.iter().map(|t| t.key.as_slice()).collect::<Vec<_>>(),
            [b"new"]
        );
        assert!(t.top(10, 500 * S).is_empty());
    }

    /// The min-heap keeps Space-Saving's replacement rule: a new key always
    /// takes over a counter with the smallest count.
    #[test]
    fn a_new_key_replaces_a_smallest_counter() {
        let mut s = SpaceSaving::new(3);
        for (key, n) in [("a", 3), ("b", 1), ("c", 2)] {
            for _ in 0..n {
                s.add(key.as_bytes());
            }
        }
        s.add(b"d");
        let counts: HashMap<&[u8], (u64, u64)> = s
            .counters
            .iter()
            .map(|c| (&*c.key, (c.count, c.error)))
            .collect();
        assert_eq!(counts.get(&b"d"[..]), Some(&(2, 1)));
        assert!(!counts.contains_key(&b"b"[..]));
        assert_eq!(s.floor(), 2);
        // Heap positions are consistent.
        for (slot, &i) in s.heap.iter().enumerate() {
            assert_eq!(s.counters[i].slot, slot);
        }
    }

    /// Threads denying at once land in different shards; the merged answer
    /// is exact while no shard is full, and within its error bound when
    /// they are (each key counted in every shard).
    #[test]
    fn shards_merge_to_the_true_counts() {
        let t = TopThrottled::with_shards(8, 60 * S, 4);
        std::thread::scope(|scope| {
            for thread in 0..4u32 {
                let t = &t;
                scope.spawn(move || {
                    for i in 0..1_000u32 {
                        t.record(b"hot", S);
                        if i % 4 == 0 {
                            t.record(b"warm", S);
                        }
                        t.record(format!("cold:{thread}:{i}").as_bytes(), S);
                    }
                });
            }
        });
        let top = t.top(2, S);
        assert_eq!(top[0].key, b"hot");
        assert_eq!(top[1].key, b"warm");
        for (entry, truth) in top.iter().zip([4_000, 1_000]) {
            assert!(entry.denied >= truth, "{entry:?}");
            assert!(entry.denied - entry.error <= truth, "{entry:?}");
        }
    }
}
