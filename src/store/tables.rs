//! The tables inside one stripe, laid out for memory.
//!
//! Token buckets are the common case and their whole state is GCRA's `tat`,
//! which is also their expiry, so they get a table of 32-byte entries (a
//! 24-byte [`StoredKey`] and the `tat`). Every other algorithm's state lives
//! in a second table with an explicit expiry. A key's state is looked up in
//! the table of the algorithm being checked, so one key may carry a bucket
//! and a window side by side; each expires on its own and RESET drops both.
//!
//! Hashes are computed once per key by the caller (one `ahash` for every
//! table of the store) and passed in; the tables never rehash keys except
//! when they grow.

use super::{Entry, StoredKey};
use crate::algorithm::State;
use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};
use hashbrown::HashTable;

/// A token bucket: the key and GCRA's theoretical arrival time.
#[derive(Debug)]
struct Bucket {
    key: StoredKey,
    tat: Nanos,
}

/// Any other algorithm's state.
#[derive(Debug)]
struct Other {
    key: StoredKey,
    entry: Entry,
}

/// Which table a state belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Buckets,
    Others,
}

#[derive(Debug, Default)]
pub struct Tables {
    buckets: HashTable<Bucket>,
    others: HashTable<Other>,
}

impl Tables {
    /// The entry of `key` in `table`, live or not.
    pub fn find(&self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        match table {
            Table::Buckets => self
                .buckets
                .find(hash, |b| b.key.as_bytes() == key)
                .map(|b| Entry {
                    state: State::TokenBucket { tat: b.tat },
                    expires_at: b.tat,
                }),
            Table::Others => self
                .others
                .find(hash, |o| o.key.as_bytes() == key)
                .map(|o| o.entry.clone()),
        }
    }

    /// The live entry of `key` in `table`; an expired one is dropped on the
    /// spot and counted in `expired`.
    pub fn live(
        &mut self,
        table: Table,
        hash: u64,
        key: &[u8],
        now: Nanos,
        expired: &AtomicU64,
    ) -> Option<Entry> {
        let entry = self.find(table, hash, key)?;
        if entry.expires_at > now {
            return Some(entry);
        }
        self.remove(table, hash, key);
        // Relaxed: a statistic, read by the metrics only.
        expired.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// The entry of `key` in whichever table holds it (buckets first).
    pub fn find_any(&self, hash: u64, key: &[u8]) -> Option<Entry> {
        self.find(Table::Buckets, hash, key)
            .or_else(|| self.find(Table::Others, hash, key))
    }

    /// Stores `entry` for `key`, in the table its state belongs to.
    pub fn put(&mut self, hasher: &ahash::RandomState, hash: u64, key: &[u8], entry: Entry) {
        let rehash = |k: &StoredKey| hasher.hash_one(k.as_bytes());
        match entry.state {
            State::TokenBucket { tat } => {
                match self.buckets.find_mut(hash, |b| b.key.as_bytes() == key) {
                    Some(b) => b.tat = tat,
                    None => {
                        let bucket = Bucket {
                            key: StoredKey::new(key),
                            tat,
                        };
                        self.buckets.insert_unique(hash, bucket, |b| rehash(&b.key));
                    }
                }
            }
            _ => match self.others.find_mut(hash, |o| o.key.as_bytes() == key) {
                Some(o) => o.entry = entry,
                None => {
                    let other = Other {
                        key: StoredKey::new(key),
                        entry,
                    };
                    self.others.insert_unique(hash, other, |o| rehash(&o.key));
                }
            },
        }
    }

    pub fn remove(&mut self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        match table {
            Table::Buckets => self
                .buckets
                .find_entry(hash, |b| b.key.as_bytes() == key)
                .ok()
                .map(|e| {
                    let (b, _) = e.remove();
                    Entry {
                        state: State::TokenBucket { tat: b.tat },
                        expires_at: b.tat,
                    }
                }),
            Table::Others => self
                .others
                .find_entry(hash, |o| o.key.as_bytes() == key)
                .ok()
                .map(|e| e.remove().0.entry),
        }
    }

    /// Removes `key` from every table; true when any removed state was live.
    pub fn remove_all(&mut self, hash: u64, key: &[u8], now: Nanos) -> bool {
        [Table::Buckets, Table::Others]
            .into_iter()
            .filter_map(|t| self.remove(t, hash, key))
            .fold(false, |live, e| live | (e.expires_at > now))
    }

    /// Drops every expired entry; returns how many.
    pub fn retain_live(&mut self, now: Nanos) -> usize {
        let before = self.len();
        self.buckets.retain(|b| b.tat > now);
        self.others.retain(|o| o.entry.expires_at > now);
        before - self.len()
    }

    pub fn len(&self) -> usize {
        self.buckets.len() + self.others.len()
    }

    /// Reserved bytes: one control byte plus one entry per bucket slot, and
    /// the heap part of long keys.
    pub fn memory_bytes(&self) -> usize {
        // hashbrown keeps 1/8 of its buckets free (all but one when tiny).
        let slots = |cap: usize, size: usize| {
            let buckets = match cap {
                0 => 0,
                1..=7 => cap + 1,
                _ => cap / 7 * 8,
            };
            buckets * (size + 1)
        };
        slots(self.buckets.capacity(), std::mem::size_of::<Bucket>())
            + slots(self.others.capacity(), std::mem::size_of::<Other>())
            + self
                .buckets
                .iter()
                .map(|b| b.key.heap_bytes())
                .sum::<usize>()
            + self
                .others
                .iter()
                .map(|o| o.key.heap_bytes())
                .sum::<usize>()
    }
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 32);
