//! The counter store: lock-striped tables of per-key limiter state.
//!
//! ```text
//!   key --hash tag--> Slot (CRC16 % 16384) --& mask--> Stripe (Mutex<map>)
//! ```
//! Invariants:
//! - the stripe of a key is a function of its slot alone, so every key of an
//!   atomic group (one slot, checked by [`Store::check`]) lives under one
//!   lock and the group is evaluated and charged in one critical section;
//! - a group is all-or-nothing: state is written only when every pair passes
//!   and the mode charges; a denial, an error or a peek writes nothing;
//! - an entry whose `expires_at <= now` carries no information and is treated
//!   as absent; it is dropped when met on access and by [`Store::sweep`],
//!   which bounds its work to a number of stripes per call.
//!
//! The store never reads a clock: callers pass `now`, so tests control time.

mod group;

use crate::algorithm::State;
use crate::clock::Nanos;
use crate::slot::Slot;
use crate::sync::{AtomicU64, AtomicUsize, Mutex, Ordering};
use std::collections::HashMap;

pub use group::Mode;

type Map = HashMap<Box<[u8]>, Entry, ahash::RandomState>;

/// One key's state and the moment it may be forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub state: State,
    pub expires_at: Nanos,
}

/// One lock and the keys of the slots mapped to it.
#[derive(Debug)]
struct Stripe {
    map: Mutex<Map>,
}

/// Store-wide settings.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    /// Number of stripes, a power of two between 1 and 16384.
    pub stripes: usize,
    /// Most pairs in one atomic group (sizes the stack buffers of a check).
    pub max_group: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            stripes: 1024,
            max_group: 16,
        }
    }
}

#[derive(Debug)]
pub struct Store {
    stripes: Box<[Stripe]>,
    /// `stripes.len() - 1`; stripe of a slot is `slot & mask`.
    mask: usize,
    /// Next stripe the sweeper visits; only the sweeper advances it, the
    /// atomic makes `sweep` callable through `&self`.
    sweep_cursor: AtomicUsize,
    /// Expired entries dropped when a check met them (the sweeper's own
    /// count is what `sweep` returns). Read for metrics.
    expired_on_access: AtomicU64,
}

impl Store {
    pub fn new(config: StoreConfig) -> Self {
        let n = config
            .stripes
            .clamp(1, usize::from(crate::slot::SLOT_COUNT))
            .next_power_of_two();
        let stripes = (0..n)
            .map(|_| Stripe {
                map: Mutex::new(Map::default()),
            })
            .collect();
        Self {
            stripes,
            mask: n - 1,
            sweep_cursor: AtomicUsize::new(0),
            expired_on_access: AtomicU64::new(0),
        }
    }

    pub fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    fn stripe(&self, slot: Slot) -> &Stripe {
        &self.stripes[usize::from(slot.get()) & self.mask]
    }

    /// The live state of one key, if any (for inspection and tests).
    pub fn get(&self, key: &[u8], now: Nanos) -> Option<Entry> {
        let map = self.stripe(Slot::of(key)).map.lock();
        map.get(key).copied().filter(|e| e.expires_at > now)
    }

    /// Forgets `key`. Returns whether it held live state.
    pub fn remove(&self, key: &[u8], now: Nanos) -> bool {
        let mut map = self.stripe(Slot::of(key)).map.lock();
        map.remove(key).is_some_and(|e| e.expires_at > now)
    }

    /// Expired entries dropped by checks that met them, since the start.
    pub fn expired_on_access(&self) -> u64 {
        // Relaxed: a statistic; no other memory is read through it.
        self.expired_on_access.load(Ordering::Relaxed)
    }

    /// Number of entries held, expired-but-unswept ones included.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.map.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops expired entries from the next `stripes` stripes (round robin).
    /// Holds one stripe lock at a time. Returns how many entries it removed.
    pub fn sweep(&self, stripes: usize, now: Nanos) -> usize {
        let mut removed = 0;
        for _ in 0..stripes.min(self.stripes.len()) {
            // Relaxed: the cursor only spreads work; any interleaving of two
            // sweepers still visits valid stripes.
            let i = self.sweep_cursor.fetch_add(1, Ordering::Relaxed) & self.mask;
            let mut map = self.stripes[i].map.lock();
            let before = map.len();
            map.retain(|_, e| e.expires_at > now);
            removed += before - map.len();
        }
        removed
    }
}

#[cfg(test)]
mod tests;
