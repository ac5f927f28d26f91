//! The tables inside one stripe, laid out for memory and kept within a budget.
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
//! when they grow or are compacted.
//!
//! Memory: [`Tables::memory_bytes`] is O(1): the slots both tables have
//! reserved (entry + control byte each) plus `heap_bytes`, the long keys and
//! the logs and lease lists owned by states, kept up to date on every change.
//! Before a new key would make a table grow past the stripe's budget,
//! [`Tables::make_room`] drops expired entries and then, by policy, evicts
//! the entries closest to expiry or refuses the key.

use super::{Entry, StoredKey};
use crate::algorithm::{State, Verdict};
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

impl Other {
    fn heap_bytes(&self) -> usize {
        self.key.heap_bytes() + self.entry.state.heap_bytes()
    }
}

/// Which table a state belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Buckets,
    Others,
}

impl Table {
    pub fn of(state: &State) -> Self {
        match state {
            State::TokenBucket { .. } => Table::Buckets,
            _ => Table::Others,
        }
    }
}

/// What a full stripe does with a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// Evict the entries closest to expiry (they carry the least state).
    Evict,
    /// Refuse the new key; existing keys keep working.
    Refuse,
}

/// How [`Tables::make_room`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Room {
    /// Expired entries dropped to make room.
    pub expired: usize,
    /// Live entries evicted to make room.
    pub evicted: usize,
    /// False when the new keys cannot be taken (policy `Refuse`).
    pub granted: bool,
}

/// Fraction of a full table evicted at once (1/8): evicting in batches keeps
/// the cost per new key O(1) amortized instead of a scan per insert.
const EVICT_SHIFT: u32 = 3;

/// A hash table and the capacity of its allocation. hashbrown's
/// `capacity()` counts only the free slots left, which removals turn into
/// tombstones, so the allocated size is tracked here: it changes only when an
/// insert grows the table and when [`Slots::rebuild`] runs.
#[derive(Debug)]
struct Slots<T> {
    table: HashTable<T>,
    /// Capacity of the allocation, as hashbrown reports it when fresh.
    full: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            full: 0,
        }
    }
}

impl<T> Slots<T> {
    fn insert(&mut self, hash: u64, item: T, rehash: impl Fn(&T) -> u64) {
        self.table.insert_unique(hash, item, rehash);
        self.full = self.full.max(self.table.capacity());
    }

    /// Bytes the allocation holds: an entry and a control byte per bucket.
    fn bytes(&self) -> usize {
        slot_bytes(self.full, std::mem::size_of::<T>())
    }

    /// Bytes once `new` more entries are in: an insert past the free slots
    /// makes hashbrown grow (or rehash in place; counting it as growth only
    /// errs on the safe side).
    fn bytes_after(&self, new: usize) -> usize {
        self.bytes_with(self.table.len() + new, self.table.capacity())
    }

    /// Bytes once every entry is gone (the allocation stays) and `new`
    /// entries are in.
    fn bytes_if_emptied(&self, new: usize) -> usize {
        self.bytes_with(new, self.full)
    }

    /// Bytes for `needed` entries when `room` fit without growing.
    fn bytes_with(&self, needed: usize, room: usize) -> usize {
        if needed <= room {
            return self.bytes();
        }
        let mut target = grown(self.full);
        while needed > target {
            target = grown(target);
        }
        slot_bytes(target, std::mem::size_of::<T>())
    }

    /// Whether removals left tombstones: hashbrown counts a tombstone
    /// neither as an entry nor as a free slot.
    fn has_tombstones(&self) -> bool {
        self.table.capacity() < self.full
    }

    /// Rebuilds the table in an allocation of the same size, without the
    /// tombstones removals left.
    fn rebuild(&mut self, hash: impl Fn(&T) -> u64) {
        let fresh = HashTable::with_capacity(self.full.max(self.table.len()));
        let old = std::mem::replace(&mut self.table, fresh);
        for item in old {
            self.table.insert_unique(hash(&item), item, &hash);
        }
        self.full = self.table.capacity();
    }
}

#[derive(Debug, Default)]
pub struct Tables {
    buckets: Slots<Bucket>,
    others: Slots<Other>,
    /// Heap bytes owned by entries: long keys, logs, lease lists.
    heap_bytes: usize,
    upkeep: Upkeep,
}

/// When dropping expired entries and tombstones at the cap is worth a scan
/// of the stripe (see [`Tables::make_room`]).
#[derive(Debug, Default)]
struct Upkeep {
    /// No entry expires before this (a lower bound: lowered by every write,
    /// made exact by every scan). 0 until the first scan.
    next_expiry: Nanos,
    /// When the last scan ran.
    last: Nanos,
    /// Requests over the budget since then.
    misses: usize,
}

/// Least time between two scans of a stripe for expired entries at the cap
/// (100 ms), unless requests over the budget have paid for one (see
/// [`Tables::make_room`]).
pub const UPKEEP_GAP: Nanos = 100 * crate::clock::NANOS_PER_MS;

fn bucket_entry(b: &Bucket) -> Entry {
    Entry {
        state: State::TokenBucket { tat: b.tat },
        expires_at: b.tat,
    }
}

/// Bytes of the slots a table with `capacity` reserves: hashbrown keeps 1/8
/// of its buckets free (all but one when tiny), each bucket an entry plus a
/// control byte.
fn slot_bytes(capacity: usize, entry: usize) -> usize {
    let buckets = match capacity {
        0 => 0,
        1..=7 => capacity + 1,
        _ => capacity / 7 * 8,
    };
    buckets * (entry + 1)
}

/// What a table of `capacity` grows to when full (hashbrown doubles).
fn grown(capacity: usize) -> usize {
    match capacity {
        0 => 3,
        1..=3 => 7,
        _ => (capacity / 7 * 8 * 2) / 8 * 7,
    }
}

impl Tables {
    /// The entry of `key` in `table`, live or not.
    pub fn find(&self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        match table {
            Table::Buckets => self
                .buckets
                .table
                .find(hash, |b| b.key.as_bytes() == key)
                .map(bucket_entry),
            Table::Others => self
                .others
                .table
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

    /// Whether `put(.., entry)` for `key` would add an entry.
    pub fn is_new(&self, hash: u64, key: &[u8], state: &State) -> bool {
        self.find(Table::of(state), hash, key).is_none()
    }

    /// Stores `entry` for `key`, in the table its state belongs to.
    pub fn put(&mut self, hasher: &ahash::RandomState, hash: u64, key: &[u8], entry: Entry) {
        self.upkeep.wrote(entry.expires_at);
        let rehash = |k: &StoredKey| hasher.hash_one(k.as_bytes());
        match entry.state {
            State::TokenBucket { tat } => {
                match self
                    .buckets
                    .table
                    .find_mut(hash, |b| b.key.as_bytes() == key)
                {
                    Some(b) => b.tat = tat,
                    None => {
                        let key = StoredKey::new(key);
                        self.heap_bytes += key.heap_bytes();
                        self.buckets
                            .insert(hash, Bucket { key, tat }, |b| rehash(&b.key));
                    }
                }
            }
            _ => match self
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
                    self.others.insert(hash, other, |o| rehash(&o.key));
                }
            },
        }
    }

    pub fn remove(&mut self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        match table {
            Table::Buckets => {
                let found = self
                    .buckets
                    .table
                    .find_entry(hash, |b| b.key.as_bytes() == key);
                let (b, _) = found.ok()?.remove();
                self.heap_bytes -= b.key.heap_bytes();
                Some(bucket_entry(&b))
            }
            Table::Others => {
                let found = self
                    .others
                    .table
                    .find_entry(hash, |o| o.key.as_bytes() == key);
                let (o, _) = found.ok()?.remove();
                self.heap_bytes -= o.heap_bytes();
                Some(o.entry)
            }
        }
    }

    /// Removes `key` from every table; true when any removed state was live.
    pub fn remove_all(&mut self, hash: u64, key: &[u8], now: Nanos) -> bool {
        [Table::Buckets, Table::Others]
            .into_iter()
            .filter_map(|t| self.remove(t, hash, key))
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
        for b in &self.buckets.table {
            f(&b.key, bucket_entry(b));
        }
        for o in &self.others.table {
            f(&o.key, o.entry.clone());
        }
    }

    /// Keeps only the entries whose key satisfies `keep`.
    pub fn retain_keys(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        let mut freed = 0;
        self.buckets.table.retain(|b| {
            let kept = keep(b.key.as_bytes());
            if !kept {
                freed += b.key.heap_bytes();
            }
            kept
        });
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
        let mut freed = 0;
        let mut earliest = Nanos::MAX;
        self.buckets.table.retain(|b| {
            let keep = b.tat > cutoff;
            if keep {
                earliest = earliest.min(b.tat);
            } else {
                freed += b.key.heap_bytes();
            }
            keep
        });
        self.others.table.retain(|o| {
            let keep = o.entry.expires_at > cutoff;
            if keep {
                earliest = earliest.min(o.entry.expires_at);
            } else {
                freed += o.heap_bytes();
            }
            keep
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
        self.buckets.table.len() + self.others.table.len()
    }

    /// Reserved bytes: slots of both tables and the heap bytes of entries.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.bytes() + self.others.bytes() + self.heap_bytes
    }

    /// Bytes after adding `new` entries to `table` (growing it if needed),
    /// `heap` of them on the heap.
    fn memory_after(&self, table: Table, new: usize, heap: usize) -> usize {
        let (before, after) = match table {
            Table::Buckets => (self.buckets.bytes(), self.buckets.bytes_after(new)),
            Table::Others => (self.others.bytes(), self.others.bytes_after(new)),
        };
        self.memory_bytes() - before + after + heap
    }

    /// Bytes once every entry is evicted and `new` entries (`heap` bytes on
    /// the heap) are in `table`.
    fn memory_if_emptied(&self, table: Table, new: usize, heap: usize) -> usize {
        let slots = match table {
            Table::Buckets => self.buckets.bytes_if_emptied(new) + self.others.bytes(),
            Table::Others => self.buckets.bytes() + self.others.bytes_if_emptied(new),
        };
        slots + heap
    }

    /// Makes sure `new` more entries (`heap` bytes of them on the heap) fit
    /// in `table` within `budget` bytes (the stripe's share): expired entries
    /// go first, then, by `full`, the live entries closest to expiry, or the
    /// request is refused. With `ask` (a peek) no live entry is evicted:
    /// the answer is whether the request would be granted.
    pub fn make_room(
        &mut self,
        hasher: &ahash::RandomState,
        table: Table,
        (new, heap): (usize, usize),
        (budget, full): (usize, Full),
        now: Nanos,
        ask: bool,
    ) -> Room {
        let mut room = Room {
            granted: true,
            ..Room::default()
        };
        if new == 0 || self.memory_after(table, new, heap) <= budget {
            return room;
        }
        if ask && full == Full::Evict {
            // The check would evict what it needs, unless even an emptied
            // stripe has no room.
            room.granted = self.memory_if_emptied(table, new, heap) <= budget;
            return room;
        }
        if self.upkeep_due(now) {
            room.expired = self.retain_after(now);
            self.compact(hasher);
            self.upkeep.last = now;
            self.upkeep.misses = 0;
        } else {
            self.upkeep.misses += 1;
        }
        while self.memory_after(table, new, heap) > budget {
            if full == Full::Refuse || self.len() == 0 {
                room.granted = false;
                return room;
            }
            room.evicted += self.evict_soonest(now);
            self.compact(hasher);
        }
        room
    }

    /// Whether a request over the budget scans the stripe for expired
    /// entries and tombstones first. Only when there may be some (an entry
    /// may have expired, or removals left tombstones), and then only when
    /// the requests over the budget since the last scan number 1/8 of the
    /// entries (so a flood of refused new keys pays O(1) each for the
    /// scans) or [`UPKEEP_GAP`] has passed (so a lone new key finds the
    /// room expiries made within that time; the sweeper makes it too).
    fn upkeep_due(&self, now: Nanos) -> bool {
        let maybe = now >= self.upkeep.next_expiry
            || self.buckets.has_tombstones()
            || self.others.has_tombstones();
        let paid = self.upkeep.misses.saturating_mul(1 << EVICT_SHIFT) >= self.len()
            || now >= self.upkeep.last.saturating_add(UPKEEP_GAP);
        maybe && paid
    }

    /// Evicts the 1/8 of entries (at least one) expiring soonest.
    fn evict_soonest(&mut self, now: Nanos) -> usize {
        let mut expiries: Vec<Nanos> = self
            .buckets
            .table
            .iter()
            .map(|b| b.tat)
            .chain(self.others.table.iter().map(|o| o.entry.expires_at))
            .collect();
        let n = (expiries.len() >> EVICT_SHIFT).max(1);
        let (_, cutoff, _) = expiries.select_nth_unstable(n - 1);
        // Ties at the cutoff go too: slightly more than 1/8, never less.
        self.retain_after((*cutoff).max(now))
    }

    /// Rebuilds the tables at their current size (those with tombstones):
    /// removals leave tombstones
    /// that hashbrown clears only by rehashing, and a rehash it starts on its
    /// own (when tombstones use up its free slots) doubles a table this full,
    /// past the budget. Rebuilding here keeps growth under our control.
    /// O(n), after a batch removal only.
    fn compact(&mut self, hasher: &ahash::RandomState) {
        if self.buckets.has_tombstones() {
            self.buckets.rebuild(|b| hasher.hash_one(b.key.as_bytes()));
        }
        if self.others.has_tombstones() {
            self.others.rebuild(|o| hasher.hash_one(o.key.as_bytes()));
        }
    }
}

impl Upkeep {
    /// An entry now expires at `expires_at`.
    fn wrote(&mut self, expires_at: Nanos) {
        self.next_expiry = self.next_expiry.min(expires_at);
    }
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 32);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuild_keeps_the_allocation_and_clears_tombstones() {
        let hasher = ahash::RandomState::new();
        let h = |v: &u64| hasher.hash_one(v);
        let mut t: Slots<u64> = Slots::default();
        for i in 0..28u64 {
            t.insert(h(&i), i, h);
        }
        assert_eq!((t.table.capacity(), t.full), (28, 28));
        let bytes = t.bytes();
        t.table.retain(|v| *v % 2 == 0);
        // Tombstones may hide free slots; the allocation is unchanged.
        assert!(t.table.capacity() <= 28);
        assert_eq!(t.bytes(), bytes);
        t.rebuild(h);
        assert_eq!((t.table.len(), t.table.capacity(), t.full), (14, 28, 28));
        assert_eq!(t.bytes(), bytes);
        for i in 0..14u64 {
            assert!(t.table.find(h(&(i * 2)), |v| *v == i * 2).is_some());
        }
        // 14 free slots now: no growth predicted until they are used.
        assert_eq!(t.bytes_after(14), bytes);
        assert!(t.bytes_after(15) > bytes);
    }

    #[test]
    fn growth_follows_hashbrown() {
        // The capacities hashbrown reports as a table doubles.
        let hasher = ahash::RandomState::new();
        let mut t: HashTable<u64> = HashTable::new();
        let mut cap = t.capacity();
        for i in 0..10_000u64 {
            if t.len() == t.capacity() {
                let predicted = grown(t.capacity());
                t.insert_unique(hasher.hash_one(i), i, |v| hasher.hash_one(v));
                assert_eq!(t.capacity(), predicted, "from {cap}");
                cap = t.capacity();
            } else {
                t.insert_unique(hasher.hash_one(i), i, |v| hasher.hash_one(v));
            }
        }
    }
}
