//! A hashbrown table that knows the size of its allocation, for the memory
//! budget of [`Tables`](super::Tables).
//!
//! hashbrown reports only the free slots left, which removals turn into
//! tombstones, so [`Slots`] tracks the allocated capacity itself and predicts
//! what an insert would grow it to ([`grown`]), so that a stripe can make
//! room *before* an insert would push it past its share.

use super::hint::Hint;
use hashbrown::HashTable;

/// A hash table and the capacity of its allocation. hashbrown's
/// `capacity()` counts only the free slots left, which removals turn into
/// tombstones, so the allocated size is tracked here: it changes only when an
/// insert grows the table and when [`Slots::rebuild`] runs.
#[derive(Debug)]
pub(super) struct Slots<T> {
    pub(super) table: HashTable<T>,
    /// Capacity of the allocation, as hashbrown reports it when fresh.
    full: usize,
    /// The allocation moved (or got its first entry) since its place was
    /// last published to the stripe's hint ([`Slots::publish`]).
    stale: bool,
    /// The last publish named an allocation (false: none, or empty).
    hinted: bool,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            table: HashTable::new(),
            full: 0,
            stale: false,
            hinted: false,
        }
    }
}

impl<T> Slots<T> {
    pub(super) fn insert(&mut self, hash: u64, item: T, rehash: impl Fn(&T) -> u64) {
        let buckets = self.table.num_buckets();
        self.table.insert_unique(hash, item, rehash);
        self.full = self.full.max(self.table.capacity());
        // The table moved when it grew; one rebuilt while empty has no
        // hint left until its first entry.
        if self.table.num_buckets() != buckets || !self.hinted {
            self.stale = true;
        }
    }

    /// Whether the table's place changed since it was last published.
    pub(super) fn stale(&self) -> bool {
        self.stale
    }

    /// Publishes the table's place to `hint` when it changed (see `hint`).
    pub(super) fn publish(&mut self, hint: &Hint) {
        if self.stale {
            hint.publish(&self.table);
            self.hinted = hint.is_set();
            self.stale = false;
        }
    }

    /// Bytes the allocation holds: an entry and a control byte per bucket.
    pub(super) fn bytes(&self) -> usize {
        slot_bytes(self.full, std::mem::size_of::<T>())
    }

    /// Bytes once `new` more entries are in: an insert past the free slots
    /// makes hashbrown grow (or rehash in place; counting it as growth only
    /// errs on the safe side).
    pub(super) fn bytes_after(&self, new: usize) -> usize {
        self.bytes_with(self.table.len() + new, self.table.capacity())
    }

    /// Bytes once every entry is gone (the allocation stays) and `new`
    /// entries are in.
    pub(super) fn bytes_if_emptied(&self, new: usize) -> usize {
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
    pub(super) fn has_tombstones(&self) -> bool {
        self.table.capacity() < self.full
    }

    /// Rebuilds the table in an allocation of the same size, without the
    /// tombstones removals left.
    pub(super) fn rebuild(&mut self, hash: impl Fn(&T) -> u64) {
        self.rebuild_for(self.full.max(self.table.len()), hash);
    }

    /// After a sweep removed entries: gives back an allocation that holds
    /// far fewer entries than it has room for (at most 1/8 of it: the table
    /// is rebuilt for twice its entries, or freed when empty), or clears
    /// the tombstones when they take over 1/4 of it. Either way an insert
    /// later does not find hashbrown doubling a table whose live entries
    /// never needed it (it rehashes on its own only once tombstones have
    /// used up the free slots, and then doubles a table over half full).
    /// A table that never grew past [`TIDY_MIN`] entries is left alone.
    /// Returns whether the table was rebuilt.
    pub(super) fn tidy(&mut self, hash: impl Fn(&T) -> u64) -> bool {
        let (len, full) = (self.table.len(), self.full);
        if full <= TIDY_MIN {
            return false;
        }
        if len.saturating_mul(8) <= full {
            self.rebuild_for(len * 2, hash);
            return true;
        }
        let tombstones = full.saturating_sub(self.table.capacity());
        if tombstones.saturating_mul(4) > full {
            self.rebuild(hash);
            return true;
        }
        false
    }

    /// Moves the entries into a fresh allocation for `capacity` entries
    /// (none for 0).
    fn rebuild_for(&mut self, capacity: usize, hash: impl Fn(&T) -> u64) {
        let fresh = HashTable::with_capacity(capacity.max(self.table.len()));
        let old = std::mem::replace(&mut self.table, fresh);
        for item in old {
            self.table.insert_unique(hash(&item), item, &hash);
        }
        self.stale = true;
        self.full = self.table.capacity();
    }
}

/// Capacity up to which [`Slots::tidy`] leaves a table alone: 32 buckets,
/// under 2 KiB for the widest compact entry; freeing and regrowing tables
/// this small would only churn the allocator.
const TIDY_MIN: usize = 28;

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

    /// Once published, for every key sitting where its probe starts, the
    /// hint names its entry.
    fn assert_hint_current(t: &mut Slots<u64>, hint: &Hint, h: impl Fn(&u64) -> u64) {
        t.publish(hint);
        assert!(!t.stale());
        assert!(hint.assert_names(&t.table, h) > 0);
    }

    /// The hint names the current allocation after each growth and after
    /// a rebuild moved the table (prefetches of a stale one are wasted).
    #[test]
    fn the_hint_follows_the_table() {
        let hasher = ahash::RandomState::new();
        let h = |v: &u64| hasher.hash_one(v);
        let mut t: Slots<u64> = Slots::default();
        let hint = Hint::new::<u64>();
        t.publish(&hint);
        assert!(!hint.is_set());
        for i in 0..3_000u64 {
            t.insert(h(&i), i, h);
            if i.is_power_of_two() {
                assert_hint_current(&mut t, &hint, h);
            }
        }
        assert_hint_current(&mut t, &hint, h);
        t.table.retain(|v| *v % 3 == 0);
        t.rebuild(h);
        assert!(t.stale());
        assert_hint_current(&mut t, &hint, h);
    }

    /// A steady set of keys, half of it replaced between sweeps: tidying
    /// after each sweep keeps the table at the size its live keys need.
    /// Left to hashbrown, the tombstones of the removed keys use up the
    /// free slots, and it then doubles the table (over half full at that
    /// moment) on its own: memory grew with no more keys held.
    #[test]
    fn tidy_keeps_a_churning_table_at_its_size() {
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let h = |v: &u64| hasher.hash_one(v);
        let mut t: Slots<u64> = Slots::default();
        let mut next = 0u64;
        let mut settled = 0;
        for round in 0..2_000 {
            // 150 new keys between sweeps; a sweep keeps the newest 100.
            for _ in 0..150 {
                t.insert(h(&next), next, h);
                next += 1;
            }
            let oldest_kept = next - 100;
            t.table.retain(|v| *v >= oldest_kept);
            t.tidy(h);
            // The first rounds grow it to hold 250 keys.
            if round == 10 {
                settled = t.full;
            } else if round > 10 {
                assert!(
                    t.full <= settled,
                    "grew from {settled} to {} with 100-250 keys",
                    t.full
                );
            }
        }
        assert_eq!(t.table.len(), 100);
    }

    /// A table far larger than its entries is rebuilt for twice them, and
    /// freed when empty; a small one is left alone.
    #[test]
    fn tidy_gives_back_room_no_longer_used() {
        let hasher = ahash::RandomState::with_seeds(1, 2, 3, 4);
        let h = |v: &u64| hasher.hash_one(v);
        let mut t: Slots<u64> = Slots::default();
        for i in 0..10_000u64 {
            t.insert(h(&i), i, h);
        }
        let big = t.bytes();
        t.table.retain(|v| *v < 500);
        assert!(t.tidy(h));
        assert!(t.bytes() * 8 <= big, "{} of {big}", t.bytes());
        assert!(t.full >= 1000);
        for i in 0..500u64 {
            assert!(t.table.find(h(&i), |v| *v == i).is_some());
        }
        t.table.clear();
        assert!(t.tidy(h));
        assert_eq!((t.full, t.bytes()), (0, 0));
        for i in 0..20u64 {
            t.insert(h(&i), i, h);
        }
        t.table.retain(|v| *v < 1);
        assert!(!t.tidy(h));
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
