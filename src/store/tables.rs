//! The tables inside one stripe, laid out for memory and kept within a budget.
//!
//! A key holds at most two states: its token bucket, and one state of any
//! other algorithm ([`Table`]). A key's state is looked up in the table of
//! the algorithm being checked, so one key may carry a bucket and a window
//! side by side; each expires on its own and RESET drops both.
//!
//! Where a state is stored ([`Place`]) is finer than that. GCRA's whole
//! state is its `tat`, which is also its expiry, so token buckets and leaky
//! buckets get tables of 32-byte entries (a 24-byte [`StoredKey`] and the
//! `tat`), one each: a leaky bucket's state is kept apart from a token
//! bucket's (switching a key between the two starts it afresh). Every other
//! algorithm's state lives in a general table with an explicit expiry. The
//! leaky table and the general table together hold a key's one "other"
//! state: a lookup of it checks both, and storing it in one removes the
//! key from the other.
//!
//! Hashes are computed once per key by the caller (one `ahash` for every
//! table of the store) and passed in; the tables never rehash keys except
//! when they grow or are compacted.
//!
//! Memory: [`Tables::memory_bytes`] is O(1): the slots every table has
//! reserved (entry + control byte each) plus `heap_bytes`, the long keys and
//! the logs and lease lists owned by states, kept up to date on every change.
//! The budget itself is kept by [`Tables::make_room`] (`budget`).

mod budget;
mod slots;

pub use budget::Full;

use super::{Entry, StoredKey};
use crate::algorithm::{State, Verdict};
use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};
use budget::Upkeep;
use slots::Slots;

/// A token or leaky bucket: the key and GCRA's theoretical arrival time,
/// which is also when the state expires.
#[derive(Debug)]
struct Gcra {
    key: StoredKey,
    tat: Nanos,
}

/// Any other algorithm's state.
#[derive(Debug)]
struct Other {
    key: StoredKey,
    entry: Entry,
}

impl Other {
    fn heap_bytes(&self) -> usize {
        self.key.heap_bytes() + self.entry.state.heap_bytes()
    }
}

/// Which of a key's two states: its token bucket, or its state of any
/// other algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Buckets,
    Others,
}

/// The table a state is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Token buckets (32-byte entries).
    Buckets,
    /// Leaky buckets (32-byte entries); part of [`Table::Others`].
    Leaky,
    /// Every other algorithm; part of [`Table::Others`].
    General,
}

impl Place {
    pub const ALL: [Place; 3] = [Place::Buckets, Place::Leaky, Place::General];

    pub fn of(state: &State) -> Self {
        match state {
            State::TokenBucket { .. } => Place::Buckets,
            State::LeakyBucket { .. } => Place::Leaky,
            _ => Place::General,
        }
    }
}

#[derive(Debug, Default)]
pub struct Tables {
    buckets: Slots<Gcra>,
    leaky: Slots<Gcra>,
    others: Slots<Other>,
    /// Heap bytes owned by entries: long keys, logs, lease lists.
    heap_bytes: usize,
    upkeep: Upkeep,
}

fn bucket_entry(g: &Gcra) -> Entry {
    Entry {
        state: State::TokenBucket { tat: g.tat },
        expires_at: g.tat,
    }
}

fn leaky_entry(g: &Gcra) -> Entry {
    Entry {
        state: State::LeakyBucket { tat: g.tat },
        expires_at: g.tat,
    }
}

/// Sets the `tat` of `key` in a GCRA table, adding the key if new; returns
/// the heap bytes added.
fn put_gcra(
    slots: &mut Slots<Gcra>,
    hasher: &ahash::RandomState,
    hash: u64,
    key: &[u8],
    tat: Nanos,
) -> usize {
    if let Some(g) = slots.table.find_mut(hash, |g| g.key.as_bytes() == key) {
        g.tat = tat;
        return 0;
    }
    let key = StoredKey::new(key);
    let heap = key.heap_bytes();
    slots.insert(hash, Gcra { key, tat }, |g| {
        hasher.hash_one(g.key.as_bytes())
    });
    heap
}

/// Keeps the entries of a GCRA table that satisfy `keep`; returns the heap
/// bytes freed.
fn retain_gcra(slots: &mut Slots<Gcra>, mut keep: impl FnMut(&Gcra) -> bool) -> usize {
    let mut freed = 0;
    slots.table.retain(|g| {
        let kept = keep(g);
        if !kept {
            freed += g.key.heap_bytes();
        }
        kept
    });
    freed
}

impl Tables {
    /// The entry of `key` in `place`, live or not.
    fn find_in(&self, place: Place, hash: u64, key: &[u8]) -> Option<Entry> {
        let eq = |g: &Gcra| g.key.as_bytes() == key;
        match place {
            Place::Buckets => self.buckets.table.find(hash, eq).map(bucket_entry),
            Place::Leaky => self.leaky.table.find(hash, eq).map(leaky_entry),
            Place::General => self
                .others
                .table
                .find(hash, |o| o.key.as_bytes() == key)
                .map(|o| o.entry.clone()),
        }
    }

    /// Whether `place` holds `key` (without copying its state).
    fn holds(&self, place: Place, hash: u64, key: &[u8]) -> bool {
        let eq = |k: &StoredKey| k.as_bytes() == key;
        match place {
            Place::Buckets => self.buckets.table.find(hash, |g| eq(&g.key)).is_some(),
            Place::Leaky => self.leaky.table.find(hash, |g| eq(&g.key)).is_some(),
            Place::General => self.others.table.find(hash, |o| eq(&o.key)).is_some(),
        }
    }

    /// The entry of `key` in `table`, live or not.
    pub fn find(&self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        match table {
            Table::Buckets => self.find_in(Place::Buckets, hash, key),
            Table::Others => self
                .find_in(Place::Leaky, hash, key)
                .or_else(|| self.find_in(Place::General, hash, key)),
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

    /// Evaluates the token bucket of `key` with one lookup: `evaluate` sees
    /// its live state (None when absent or expired) and, when `charge` and
    /// allowed, the new `tat` is written in place (or a new entry inserted).
    /// An expired entry counts in `expired` like one dropped by [`live`].
    #[allow(clippy::too_many_arguments)]
    pub fn bucket_in_place(
        &mut self,
        hasher: &ahash::RandomState,
        hash: u64,
        key: &[u8],
        now: Nanos,
        charge: bool,
        expired: &AtomicU64,
        evaluate: impl FnOnce(Option<&State>) -> Verdict,
    ) -> Verdict {
        let found = self
            .buckets
            .table
            .find_mut(hash, |b| b.key.as_bytes() == key);
        let Some(bucket) = found else {
            let verdict = evaluate(None);
            if let (true, true, Some(state)) = (charge, verdict.decision.allowed, &verdict.state) {
                let entry = Entry {
                    state: state.clone(),
                    expires_at: verdict.expires_at,
                };
                self.put(hasher, hash, key, entry);
            }
            return verdict;
        };
        let live = bucket.tat > now;
        let current = live.then_some(State::TokenBucket { tat: bucket.tat });
        let verdict = evaluate(current.as_ref());
        let written = match (&verdict.state, charge && verdict.decision.allowed) {
            (Some(State::TokenBucket { tat }), true) => {
                bucket.tat = *tat;
                self.upkeep.wrote(*tat);
                true
            }
            _ => false,
        };
        if !live {
            // Relaxed: a statistic, read by the metrics only.
            expired.fetch_add(1, Ordering::Relaxed);
            if !written {
                self.remove(Table::Buckets, hash, key);
            }
        }
        verdict
    }

    /// The entry of `key` in whichever table holds it (buckets first).
    pub fn find_any(&self, hash: u64, key: &[u8]) -> Option<Entry> {
        self.find(Table::Buckets, hash, key)
            .or_else(|| self.find(Table::Others, hash, key))
    }

    /// Whether `put(.., entry)` for `key` would add an entry to the place
    /// of `state` (switching a key's other state between the leaky table
    /// and the general one adds an entry to the new place).
    pub fn is_new(&self, hash: u64, key: &[u8], state: &State) -> bool {
        !self.holds(Place::of(state), hash, key)
    }

    /// Stores `entry` for `key`, in the place its state belongs to. A
    /// bucket's expiry is its `tat` (GCRA writes them equal). An other
    /// state replaces the key's other state wherever it was.
    pub fn put(&mut self, hasher: &ahash::RandomState, hash: u64, key: &[u8], entry: Entry) {
        self.upkeep.wrote(entry.expires_at);
        match entry.state {
            State::TokenBucket { tat } => {
                self.heap_bytes += put_gcra(&mut self.buckets, hasher, hash, key, tat);
            }
            State::LeakyBucket { tat } => {
                self.remove_in(Place::General, hash, key);
                self.heap_bytes += put_gcra(&mut self.leaky, hasher, hash, key, tat);
            }
            _ => {
                self.remove_in(Place::Leaky, hash, key);
                match self
                    .others
                    .table
                    .find_mut(hash, |o| o.key.as_bytes() == key)
                {
                    Some(o) => {
                        self.heap_bytes -= o.entry.state.heap_bytes();
                        self.heap_bytes += entry.state.heap_bytes();
                        o.entry = entry;
                    }
                    None => {
                        let other = Other {
                            key: StoredKey::new(key),
                            entry,
                        };
                        self.heap_bytes += other.heap_bytes();
                        self.others
                            .insert(hash, other, |o| hasher.hash_one(o.key.as_bytes()));
                    }
                }
            }
        }
    }

    /// Removes `key` from `place`, returning its entry.
    fn remove_in(&mut self, place: Place, hash: u64, key: &[u8]) -> Option<Entry> {
        let gcra = |slots: &mut Slots<Gcra>| {
            let found = slots.table.find_entry(hash, |g| g.key.as_bytes() == key);
            found.ok().map(|f| f.remove().0)
        };
        let (entry, freed) = match place {
            Place::Buckets => {
                gcra(&mut self.buckets).map(|g| (bucket_entry(&g), g.key.heap_bytes()))
            }
            Place::Leaky => gcra(&mut self.leaky).map(|g| (leaky_entry(&g), g.key.heap_bytes())),
            Place::General => {
                let found = self
                    .others
                    .table
                    .find_entry(hash, |o| o.key.as_bytes() == key);
                found.ok().map(|f| {
                    let (o, _) = f.remove();
                    let freed = o.heap_bytes();
                    (o.entry, freed)
                })
            }
        }?;
        self.heap_bytes -= freed;
        Some(entry)
    }

    /// Removes `key`'s state in `table`, returning it.
    pub fn remove(&mut self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        match table {
            Table::Buckets => self.remove_in(Place::Buckets, hash, key),
            Table::Others => {
                // A key has its other state in one place; both are cleared
                // so that nothing could outlive a removal.
                let leaky = self.remove_in(Place::Leaky, hash, key);
                let general = self.remove_in(Place::General, hash, key);
                leaky.or(general)
            }
        }
    }

    /// Removes `key` from every table; true when any removed state was live.
    pub fn remove_all(&mut self, hash: u64, key: &[u8], now: Nanos) -> bool {
        Place::ALL
            .into_iter()
            .filter_map(|p| self.remove_in(p, hash, key))
            .fold(false, |live, e| live | (e.expires_at > now))
    }

    /// The entries of `key` in both tables (token bucket, other), live or not.
    pub fn find_both(&self, hash: u64, key: &[u8]) -> (Option<Entry>, Option<Entry>) {
        (
            self.find(Table::Buckets, hash, key),
            self.find(Table::Others, hash, key),
        )
    }

    /// Calls `f` with every entry, live or not (one call per table a key
    /// has state in).
    pub fn for_each(&self, mut f: impl FnMut(&StoredKey, Entry)) {
        for g in &self.buckets.table {
            f(&g.key, bucket_entry(g));
        }
        for g in &self.leaky.table {
            f(&g.key, leaky_entry(g));
        }
        for o in &self.others.table {
            f(&o.key, o.entry.clone());
        }
    }

    /// Keeps only the entries whose key satisfies `keep`.
    pub fn retain_keys(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let mut freed = retain_gcra(&mut self.buckets, |g| keep(g.key.as_bytes()));
        freed += retain_gcra(&mut self.leaky, |g| keep(g.key.as_bytes()));
        self.others.table.retain(|o| {
            let kept = keep(o.key.as_bytes());
            if !kept {
                freed += o.heap_bytes();
            }
            kept
        });
        self.heap_bytes -= freed;
    }

    /// Drops every entry expiring at or before `cutoff`; returns how many.
    /// Learns the earliest expiry of what is kept.
    fn retain_after(&mut self, cutoff: Nanos) -> usize {
        let before = self.len();
        let mut earliest = Nanos::MAX;
        let mut keep = |expires_at: Nanos| {
            let kept = expires_at > cutoff;
            if kept {
                earliest = earliest.min(expires_at);
            }
            kept
        };
        let mut freed = retain_gcra(&mut self.buckets, |g| keep(g.tat));
        freed += retain_gcra(&mut self.leaky, |g| keep(g.tat));
        self.others.table.retain(|o| {
            let kept = keep(o.entry.expires_at);
            if !kept {
                freed += o.heap_bytes();
            }
            kept
        });
        self.heap_bytes -= freed;
        self.upkeep.next_expiry = earliest;
        before - self.len()
    }

    /// Drops every expired entry; returns how many.
    pub fn retain_live(&mut self, now: Nanos) -> usize {
        self.retain_after(now)
    }

    pub fn len(&self) -> usize {
        self.buckets.table.len() + self.leaky.table.len() + self.others.table.len()
    }
}

const _: () = assert!(std::mem::size_of::<Gcra>() == 32);

#[cfg(test)]
mod tests;
