//! Where a key's entry would be in one table, readable without the
//! stripe's lock, so that a read's keys can be fetched into the cache
//! before they are checked one by one.
//!
//! With a million keys the tables are far larger than the caches: a lookup
//! waits on two loads from memory (the control group, then the entry), and
//! checked one after another, each check waits on its own. Prefetching
//! every key of a read first puts those waits side by side.
//!
//! A [`Hint`] is the table's control-byte address and bucket mask, held
//! inline in the stripe (the prefetch reads it from the stripe itself, not
//! through a pointer: one dependent load fewer per key). A table that
//! moved (grew, was rebuilt) or got its first entry is marked stale by
//! [`Slots`](super::slots::Slots); the stripe's lock guard publishes it
//! when it unlocks ([`Tables::publish_hints`](super::Tables::publish_hints)),
//! and [`Hint::prefetch`] reads it with relaxed loads. It relies on hashbrown's
//! layout (checked by `hint_finds_the_probe_start` below): the control
//! bytes start where the buckets end, bucket `i` lies `i + 1` entries before
//! that address, and a probe starts at bucket `hash & mask`. A stale or torn
//! hint (a table that grew meanwhile) names the wrong address, which costs
//! a wasted prefetch and nothing else: a prefetch reads nothing into the
//! program and never faults.

use super::compact::{Compact, Probe};
use super::{Kind, Tat};
use crate::store::key::{ShortKey, StoredKey};
use hashbrown::HashTable;
// std's atomics even under loom (`crate::sync`): a hint synchronises
// nothing, and loom's would only add operations to every model's inserts.
use std::sync::atomic::{AtomicUsize, Ordering};

/// The hints of one stripe's compact tables, short keys' then long keys'
/// for each kind; the general table has none (its states are rare).
#[derive(Debug)]
pub struct Hints {
    pub(super) buckets: [Hint; 2],
    pub(super) leaky: [Hint; 2],
    pub(super) windows: [Hint; 2],
}

impl Default for Hints {
    fn default() -> Self {
        Self {
            buckets: Self::pair::<Tat>(),
            leaky: Self::pair::<Tat>(),
            windows: Self::pair::<super::packed::Window>(),
        }
    }
}

impl Hints {
    /// The hints of a short and a long table of states `P`.
    fn pair<P>() -> [Hint; 2] {
        [
            Hint::new::<Compact<ShortKey, P>>(),
            Hint::new::<Compact<StoredKey, P>>(),
        ]
    }

    /// Starts fetching where a lookup of `key` (hashed to `hash`) in the
    /// tables of `kind` will look.
    #[inline]
    pub fn prefetch(&self, kind: Kind, key: &[u8], hash: u64) {
        let pair = match kind {
            Kind::Buckets => &self.buckets,
            Kind::Leaky => &self.leaky,
            Kind::Windows => &self.windows,
            Kind::General => return,
        };
        let width = usize::from(!Probe::of(key).is_short());
        pair[width].prefetch(hash);
    }
}

/// A table's control bytes and bucket mask (see the module docs); a `ctrl`
/// of 0 means no allocation worth prefetching (nothing is fetched). Any
/// hashbrown table can have one: the regions' journal does too
/// (`node/regions`).
#[derive(Debug)]
pub struct Hint {
    ctrl: AtomicUsize,
    mask: AtomicUsize,
    /// Bytes of one entry.
    entry: usize,
}

impl Hint {
    pub fn new<T>() -> Self {
        Self {
            ctrl: AtomicUsize::new(0),
            mask: AtomicUsize::new(0),
            entry: std::mem::size_of::<T>(),
        }
    }

    /// Whether a table's place is published.
    pub fn is_set(&self) -> bool {
        self.ctrl.load(Ordering::Relaxed) != 0
    }

    /// Records where `table`'s buckets are, from the address of any entry
    /// it holds (none: the hint is cleared until the next publish).
    pub fn publish<T>(&self, table: &HashTable<T>) {
        let place = table.iter_buckets().next().and_then(|i| {
            let entry: *const T = table.get_bucket(i)?;
            Some((entry as usize).wrapping_add((i + 1) * self.entry))
        });
        // Relaxed: a hint, read without ordering; a torn pair only names
        // a wrong address (see the module docs).
        match place {
            Some(ctrl) => {
                self.mask.store(table.num_buckets() - 1, Ordering::Relaxed);
                self.ctrl.store(ctrl, Ordering::Relaxed);
            }
            None => self.ctrl.store(0, Ordering::Relaxed),
        }
    }

    /// Starts fetching the control group and the first bucket a lookup of
    /// `hash` probes.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        let ctrl = self.ctrl.load(Ordering::Relaxed);
        if ctrl == 0 {
            return;
        }
        let pos = (hash as usize) & self.mask.load(Ordering::Relaxed);
        crate::prefetch::line(ctrl.wrapping_add(pos));
        crate::prefetch::line(ctrl.wrapping_sub((pos + 1).wrapping_mul(self.entry)));
    }

    /// Checks the hint against `table`: every entry sitting where its
    /// probe starts must be at the address the hint names for its hash.
    /// Returns how many entries were checked (for the layout tests).
    #[cfg(test)]
    pub fn assert_names<T>(&self, table: &HashTable<T>, hash: impl Fn(&T) -> u64) -> usize {
        let mask = table.num_buckets() - 1;
        let mut checked = 0;
        for index in table.iter_buckets() {
            let entry = table.get_bucket(index).unwrap();
            let h = hash(entry);
            if index == (h as usize) & mask {
                let pos = (h as usize) & self.mask.load(Ordering::Relaxed);
                let named = self.ctrl.load(Ordering::Relaxed) - (pos + 1) * self.entry;
                assert_eq!(named, entry as *const T as usize, "bucket {index}");
                checked += 1;
            }
        }
        checked
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    /// The layout the hint assumes is hashbrown's: for every key sitting at
    /// the start of its probe, the hint names its entry's address. A newer
    /// hashbrown that lays its table out otherwise fails here (prefetches
    /// would then be wasted, answers unchanged).
    #[test]
    fn hint_finds_the_probe_start() {
        let hasher = ahash::RandomState::new();
        let mut table: HashTable<[u64; 3]> = HashTable::new();
        let hint = Hint::new::<[u64; 3]>();
        for i in 0..5_000u64 {
            table.insert_unique(hasher.hash_one(i), [i, 0, 0], |v| hasher.hash_one(v[0]));
        }
        hint.publish(&table);
        assert!(hint.is_set());
        let at_start = hint.assert_names(&table, |v| hasher.hash_one(v[0]));
        // Most keys sit where their probe starts.
        assert!(at_start > 2_500, "{at_start} of 5000 at their probe start");
        // Prefetching any hash, or with no table, is harmless.
        for h in [0, 1, u64::MAX, hasher.hash_one(7)] {
            hint.prefetch(h);
        }
        table.clear();
        hint.publish(&table);
        assert!(!hint.is_set());
        hint.prefetch(3);
    }
}
