//! A bounded map from keys to small per-key state, for the local limiters
//! (fallback buckets, leases): at most `max_keys` entries, the least
//! recently used evicted first (CLOCK: each entry has a "used" bit; the
//! oldest entry whose bit is clear goes, a set bit buys one more round).
//!
//! Sharded (up to 16 mutexes, by key hash) so gateway threads rarely meet,
//! but never below [`MIN_PER_SHARD`] keys a shard: a shard evicts when it
//! alone is full, so a small map split 16 ways would hold one key a shard
//! and two keys of one group could evict each other.
//! The eviction queue holds `(key, seq)`; an entry whose `seq` no longer
//! matches (removed or replaced) is skipped, and the queue is compacted
//! when it holds twice the map, so it never grows beyond `2 × max_keys`.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use parking_lot::Mutex;

const MAX_SHARDS: usize = 16;
/// The fewest keys a shard holds before the map is split further.
const MIN_PER_SHARD: usize = 64;

struct Entry<V> {
    value: V,
    used: bool,
    seq: u64,
}

struct Shard<V> {
    map: HashMap<Bytes, Entry<V>, ahash::RandomState>,
    order: VecDeque<(Bytes, u64)>,
    next_seq: u64,
}

pub(crate) struct KeyMap<V> {
    shards: Vec<Mutex<Shard<V>>>,
    per_shard: usize,
    hasher: ahash::RandomState,
}

impl<V> KeyMap<V> {
    pub(crate) fn new(max_keys: usize) -> Self {
        let count = (max_keys / MIN_PER_SHARD).clamp(1, MAX_SHARDS);
        Self {
            shards: (0..count)
                .map(|_| {
                    Mutex::new(Shard {
                        map: HashMap::with_hasher(ahash::RandomState::new()),
                        order: VecDeque::new(),
                        next_seq: 0,
                    })
                })
                .collect(),
            per_shard: (max_keys / count).max(1),
            hasher: ahash::RandomState::new(),
        }
    }

    fn shard(&self, key: &[u8]) -> &Mutex<Shard<V>> {
        let index = self.hasher.hash_one(key) as usize % self.shards.len();
        &self.shards[index]
    }

    /// Runs `f` on the entry of `key`, marking it used.
    pub(crate) fn get<R>(&self, key: &[u8], f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut shard = self.shard(key).lock();
        let entry = shard.map.get_mut(key)?;
        entry.used = true;
        Some(f(&mut entry.value))
    }

    /// Inserts or replaces `key`; returns the entry evicted to make room.
    pub(crate) fn insert(&self, key: Bytes, value: V) -> Option<(Bytes, V)> {
        let mut guard = self.shard(&key).lock();
        let shard = &mut *guard;
        if let Some(entry) = shard.map.get_mut(&key) {
            entry.value = value;
            entry.used = true;
            return None;
        }
        let evicted = if shard.map.len() >= self.per_shard {
            evict(shard)
        } else {
            None
        };
        let seq = shard.next_seq;
        shard.next_seq += 1;
        shard.order.push_back((Bytes::clone(&key), seq));
        shard.map.insert(
            key,
            Entry {
                value,
                used: false,
                seq,
            },
        );
        if shard.order.len() > 2 * shard.map.len().max(8) {
            let map = &shard.map;
            shard
                .order
                .retain(|(k, s)| map.get(k).is_some_and(|e| e.seq == *s));
        }
        evicted
    }

    #[cfg(test)]
    pub(crate) fn remove(&self, key: &[u8]) -> Option<V> {
        self.shard(key).lock().map.remove(key).map(|e| e.value)
    }

    /// Removes and returns every entry for which `expired` holds.
    pub(crate) fn drain_where(&self, mut expired: impl FnMut(&V) -> bool) -> Vec<(Bytes, V)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut shard = shard.lock();
            let keys: Vec<Bytes> = shard
                .map
                .iter()
                .filter(|(_, e)| expired(&e.value))
                .map(|(k, _)| Bytes::clone(k))
                .collect();
            for k in keys {
                if let Some(e) = shard.map.remove(&k) {
                    out.push((k, e.value));
                }
            }
        }
        out
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }
}

/// CLOCK eviction: the oldest live entry whose used bit is clear.
fn evict<V>(shard: &mut Shard<V>) -> Option<(Bytes, V)> {
    for _ in 0..2 * shard.order.len() + 1 {
        let (key, seq) = shard.order.pop_front()?;
        let Some(entry) = shard.map.get_mut(&key) else {
            continue;
        };
        if entry.seq != seq {
            continue;
        }
        if entry.used {
            entry.used = false;
            shard.order.push_back((key, seq));
            continue;
        }
        return shard.map.remove(&key).map(|e| (key, e.value));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_recently_used_entries_survive() {
        let map: KeyMap<u32> = KeyMap::new(4);
        // Bounded whatever is inserted.
        for i in 0..1000u32 {
            map.insert(Bytes::from(format!("k{i}")), i);
            assert!(map.len() <= 4);
        }
        // In one shard: a used entry gets a second chance.
        let one: KeyMap<u32> = KeyMap::new(1);
        one.insert(Bytes::from_static(b"a"), 1);
        assert_eq!(
            one.insert(Bytes::from_static(b"b"), 2),
            Some((Bytes::from_static(b"a"), 1))
        );
        assert_eq!(one.get(b"b", |v| *v), Some(2));
        assert_eq!(one.remove(b"b"), Some(2));
        assert_eq!(one.len(), 0);
    }

    #[test]
    fn a_small_map_holds_max_keys_before_it_evicts() {
        // Split 10 ways, 10 keys would have met in one shard and evicted
        // each other (a fallback group lost its charge that way).
        for max_keys in [2, 10, 100, 1000] {
            let map: KeyMap<usize> = KeyMap::new(max_keys);
            let per_shard = max_keys / map.shards.len();
            assert!(per_shard >= MIN_PER_SHARD.min(max_keys), "{max_keys}");
            let kept = max_keys.min(MIN_PER_SHARD);
            for i in 0..kept {
                assert_eq!(
                    map.insert(Bytes::from(format!("k{i}")), i),
                    None,
                    "{max_keys}"
                );
            }
            assert_eq!(map.len(), kept);
        }
        assert_eq!(KeyMap::<u8>::new(1 << 20).shards.len(), MAX_SHARDS);
    }

    #[test]
    fn the_eviction_queue_stays_bounded_under_churn() {
        let map: KeyMap<u32> = KeyMap::new(2);
        for i in 0..10_000u32 {
            map.insert(Bytes::from_static(b"x"), i);
            map.remove(b"x");
        }
        let shard = map.shard(b"x").lock();
        assert!(shard.order.len() <= 16, "{}", shard.order.len());
    }
}
