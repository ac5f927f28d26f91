//! A compact table split by key width: one table for keys that fit a
//! 16-byte [`ShortKey`] slot, one for the rest in a 24-byte [`StoredKey`].
//!
//! Which of the two holds a key is a function of the key's bytes alone
//! ([`Probe::of`]), so a lookup probes one table, as with a single one.
//! The short table saves 8 bytes an entry on the common short keys (a
//! 16-byte key and GCRA's `tat`: 24-byte entries instead of 32), and its
//! probes compare 16 bytes at once instead of a slice.

use super::compact::{Compact, Probe};
use super::slots::Slots;
use crate::store::key::{ShortKey, StoredKey};

/// The two tables of one kind of packed state `P`.
#[derive(Debug)]
pub(super) struct Split<P> {
    pub(super) short: Slots<Compact<ShortKey, P>>,
    pub(super) long: Slots<Compact<StoredKey, P>>,
}

impl<P> Default for Split<P> {
    fn default() -> Self {
        Self {
            short: Slots::default(),
            long: Slots::default(),
        }
    }
}

impl<P> Split<P> {
    /// Whether either table moved since its place was last published.
    pub(super) fn stale(&self) -> bool {
        self.short.stale() || self.long.stale()
    }

    /// Publishes the short and the long table's places to `hints` (see
    /// `hint`), those that changed.
    pub(super) fn publish(&mut self, hints: &[super::hint::Hint; 2]) {
        self.short.publish(&hints[0]);
        self.long.publish(&hints[1]);
    }

    #[inline]
    pub(super) fn get(&self, hash: u64, probe: Probe) -> Option<&P> {
        match probe {
            Probe::Short(k) => self
                .short
                .table
                .find(hash, |c| c.key == k)
                .map(|c| &c.state),
            Probe::Long(k) => self
                .long
                .table
                .find(hash, |c| c.key.is(k))
                .map(|c| &c.state),
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, hash: u64, probe: Probe) -> Option<&mut P> {
        match probe {
            Probe::Short(k) => self
                .short
                .table
                .find_mut(hash, |c| c.key == k)
                .map(|c| &mut c.state),
            Probe::Long(k) => self
                .long
                .table
                .find_mut(hash, |c| c.key.is(k))
                .map(|c| &mut c.state),
        }
    }

    /// Adds `key`, which the table does not hold; returns the heap bytes
    /// added.
    pub(super) fn insert(
        &mut self,
        hasher: &ahash::RandomState,
        hash: u64,
        probe: Probe,
        state: P,
    ) -> usize {
        match probe {
            Probe::Short(key) => {
                let rehash = |c: &Compact<ShortKey, P>| hasher.hash_one(c.key.as_bytes());
                self.short.insert(hash, Compact { key, state }, rehash);
                0
            }
            Probe::Long(key) => {
                let key = StoredKey::new(key);
                let heap = key.heap_bytes();
                let rehash = |c: &Compact<StoredKey, P>| hasher.hash_one(c.key.as_bytes());
                self.long.insert(hash, Compact { key, state }, rehash);
                heap
            }
        }
    }

    /// Sets the state of `key`, adding the key if new; returns the heap
    /// bytes added.
    pub(super) fn put(
        &mut self,
        hasher: &ahash::RandomState,
        hash: u64,
        probe: Probe,
        state: P,
    ) -> usize {
        if let Some(slot) = self.get_mut(hash, probe) {
            *slot = state;
            return 0;
        }
        self.insert(hasher, hash, probe, state)
    }

    /// Removes `key`: its state and the heap bytes freed.
    pub(super) fn take(&mut self, hash: u64, probe: Probe) -> Option<(P, usize)> {
        match probe {
            Probe::Short(k) => {
                let found = self.short.table.find_entry(hash, |c| c.key == k);
                found.ok().map(|f| (f.remove().0.state, 0))
            }
            Probe::Long(k) => {
                let found = self.long.table.find_entry(hash, |c| c.key.is(k));
                found.ok().map(|f| {
                    let c = f.remove().0;
                    let heap = c.key.heap_bytes();
                    (c.state, heap)
                })
            }
        }
    }

    /// Keeps the entries for which `keep(key, state)`; returns the heap
    /// bytes freed.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&[u8], &P) -> bool) -> usize {
        self.short
            .table
            .retain(|c| keep(c.key.as_bytes(), &c.state));
        let mut freed = 0;
        self.long.table.retain(|c| {
            let kept = keep(c.key.as_bytes(), &c.state);
            if !kept {
                freed += c.key.heap_bytes();
            }
            kept
        });
        freed
    }

    /// Calls `f` with every entry.
    pub(super) fn each(&self, mut f: impl FnMut(&[u8], &P)) {
        for c in &self.short.table {
            f(c.key.as_bytes(), &c.state);
        }
        for c in &self.long.table {
            f(c.key.as_bytes(), &c.state);
        }
    }

    /// Every entry's state.
    pub(super) fn states(&self) -> impl Iterator<Item = &P> + '_ {
        let short = self.short.table.iter().map(|c| &c.state);
        short.chain(self.long.table.iter().map(|c| &c.state))
    }

    pub(super) fn len(&self) -> usize {
        self.short.table.len() + self.long.table.len()
    }

    /// Bytes both allocations hold.
    pub(super) fn bytes(&self) -> usize {
        self.short.bytes() + self.long.bytes()
    }

    /// Bytes of the table keys of width `short` go to, now and with `new`
    /// more entries (`emptied`: once every entry is gone and `new` are in).
    pub(super) fn slot_bytes(&self, short: bool, new: usize, emptied: bool) -> (usize, usize) {
        match (short, emptied) {
            (true, false) => (self.short.bytes(), self.short.bytes_after(new)),
            (true, true) => (self.short.bytes(), self.short.bytes_if_emptied(new)),
            (false, false) => (self.long.bytes(), self.long.bytes_after(new)),
            (false, true) => (self.long.bytes(), self.long.bytes_if_emptied(new)),
        }
    }

    pub(super) fn has_tombstones(&self) -> bool {
        self.short.has_tombstones() || self.long.has_tombstones()
    }

    /// Gives back room a sweep left unused, or clears many tombstones
    /// (`Slots::tidy`).
    pub(super) fn tidy(&mut self, hasher: &ahash::RandomState) {
        self.short.tidy(|c| hasher.hash_one(c.key.as_bytes()));
        self.long.tidy(|c| hasher.hash_one(c.key.as_bytes()));
    }

    /// Clears the tombstones, if any (see `Tables::compact`).
    pub(super) fn compact(&mut self, hasher: &ahash::RandomState) {
        if self.short.has_tombstones() {
            self.short.rebuild(|c| hasher.hash_one(c.key.as_bytes()));
        }
        if self.long.has_tombstones() {
            self.long.rebuild(|c| hasher.hash_one(c.key.as_bytes()));
        }
    }
}
