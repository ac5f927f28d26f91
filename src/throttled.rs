//! The keys denied most in the recent past, in bounded memory.
//!
//! A Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005): at most
//! `capacity` counters; a key already counted is incremented; a new key
//! takes a free counter, or else replaces the smallest one and inherits its
//! count (remembered as the key's `error`, the most its count can be over).
//! Any key denied more than `total / capacity` times in a window is
//! guaranteed to be in the sketch, and a reported count is never below the
//! true one nor more than `error` above it.
//!
//! Recency: time is cut into windows of `window`; each shard keeps the
//! current window's sketch and the previous one's, and a query adds the two,
//! so it covers between one and two windows of the past. Memory is fixed by
//! construction: `shards × 2 × capacity_per_shard` counters, each holding a
//! key of at most the server's `max_key_len` bytes.
//!
//! Sharding: a key always goes to the same shard (by hash), so shards count
//! disjoint keys and their answers merge exactly; a denial locks one shard
//! out of several, not one lock for the whole server.

use crate::clock::Nanos;
use crate::sync::Mutex;
use std::collections::HashMap;

/// Shards of the sketch (power of two).
const SHARDS: usize = 8;

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
}

/// A Space-Saving sketch of fixed capacity.
#[derive(Debug)]
struct SpaceSaving {
    capacity: usize,
    counters: Vec<Counter>,
    index: HashMap<Box<[u8]>, usize, ahash::RandomState>,
}

impl SpaceSaving {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            counters: Vec::with_capacity(capacity),
            index: HashMap::with_capacity_and_hasher(capacity, ahash::RandomState::new()),
        }
    }

    fn add(&mut self, key: &[u8]) {
        if let Some(&i) = self.index.get(key) {
            self.counters[i].count += 1;
            return;
        }
        let key: Box<[u8]> = key.into();
        if self.counters.len() < self.capacity {
            self.index.insert(key.clone(), self.counters.len());
            self.counters.push(Counter {
                key,
                count: 1,
                error: 0,
            });
            return;
        }
        // Full: the new key takes over the smallest counter. A linear scan
        // over a small shard is cheaper than keeping a heap up to date on
        // every increment.
        let Some((i, min)) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .map(|(i, c)| (i, c.count))
        else {
            return; // capacity 0: counts nothing
        };
        let old = std::mem::replace(
            &mut self.counters[i],
            Counter {
                key: key.clone(),
                count: min + 1,
                error: min,
            },
        );
        self.index.remove(&old.key);
        self.index.insert(key, i);
    }

    fn clear(&mut self) {
        self.counters.clear();
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
        if window == self.window {
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

/// Top denied keys; see the module docs.
#[derive(Debug)]
pub struct TopThrottled {
    shards: Box<[Mutex<Shard>]>,
    hasher: ahash::RandomState,
    window: Nanos,
    capacity: usize,
}

impl TopThrottled {
    /// A sketch tracking up to `capacity` keys per window (rounded up to a
    /// multiple of the shard count), counting over `window` nanoseconds.
    pub fn new(capacity: usize, window: Nanos) -> Self {
        let per_shard = capacity.div_ceil(SHARDS);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    window: 0,
                    current: SpaceSaving::new(per_shard),
                    previous: SpaceSaving::new(per_shard),
                })
            })
            .collect();
        Self {
            shards,
            hasher: ahash::RandomState::new(),
            window: window.max(1),
            capacity: per_shard * SHARDS,
        }
    }

    /// Keys tracked per window at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The length of one window, in nanoseconds.
    pub fn window(&self) -> Nanos {
        self.window
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard> {
        let h = self.hasher.hash_one(key) as usize;
        &self.shards[h & (SHARDS - 1)]
    }

    /// Counts one denial of `key` at `now`.
    pub fn record(&self, key: &[u8], now: Nanos) {
        let mut shard = self.shard(key).lock();
        shard.roll(now / self.window);
        shard.current.add(key);
    }

    /// Keys tracked right now, over both windows (at most twice capacity).
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
    /// windows, most denied first (ties by key).
    pub fn top(&self, n: usize, now: Nanos) -> Vec<Throttled> {
        let mut all: HashMap<Vec<u8>, (u64, u64)> = HashMap::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.roll(now / self.window);
            for c in shard
                .current
                .counters
                .iter()
                .chain(&shard.previous.counters)
            {
                let e = all.entry(c.key.to_vec()).or_default();
                e.0 += c.count;
                e.1 += c.error;
            }
        }
        let mut out: Vec<Throttled> = all
            .into_iter()
            .map(|(key, (denied, error))| Throttled { key, denied, error })
            .collect();
        out.sort_by(|a, b| b.denied.cmp(&a.denied).then_with(|| a.key.cmp(&b.key)));
        out.truncate(n);
        out
    }
}

#[cfg(test)]
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
        assert!(t.tracked() <= 64, "{} keys tracked", t.tracked());
        for shard in t.shards.iter() {
            let s = shard.lock();
            assert!(s.current.len() <= 8 && s.current.index.len() <= 8);
        }
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
}
