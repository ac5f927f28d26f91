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
//! Usage made in another region (a global limit) is charged into the same
//! state by [`Store::absorb`], without a decision (`remote.rs`).
//!
//! The store never reads a clock: callers pass `now`, so tests control time.

mod changes;
mod group;
mod key;
mod merge;
mod refund;
mod remote;
mod tables;
mod update;

use crate::algorithm::State;
use crate::clock::Nanos;
use crate::slot::Slot;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};

use tollgate_protocol::Algorithm;

pub use changes::{
    CaptureStats, ChangedKey, Changes, Drained, KeyState, KeyWrite, Keys, LogBuffer, TableWrite,
    Written,
};
use changes::{Captured, ChangeLog};
pub use group::{clashing_states, Mode, ResolvedPair, Returned};
pub use key::{StoredKey, INLINE as MAX_INLINE_KEY};
pub use merge::MergeRefused;
pub use remote::{AbsorbError, RemoteUsage};
pub use tables::Full;
pub use tables::Hint as TableHint;
use tables::{Hints, Kind, Table, Tables};
pub use update::Update;

/// One key's state and the moment it may be forgotten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub state: State,
    pub expires_at: Nanos,
}

/// A key's slot and its hash under the store's hasher ([`Store::spot`]):
/// what finding its stripe and its entry takes, computed once per key
/// when a key is both prefetched and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spot {
    slot: Slot,
    hash: u64,
}

/// One lock and the keys of the slots mapped to it.
#[derive(Debug)]
struct Stripe {
    /// Taken through [`Stripe::lock`] only.
    mutex: Mutex<Locked>,
    /// Set under the lock when `changes` has something for the replication
    /// sender; cleared by the sender before it locks (see `changes`).
    pending: AtomicBool,
    /// Where the compact tables are, read without the lock to prefetch
    /// ([`Store::prefetch`]); held here rather than behind a pointer, and
    /// published by [`Guard`] when a table moved.
    hints: Hints,
}

impl Stripe {
    /// Starts fetching the lines a check of a state of `kind` reads under
    /// the stripe's lock before it reaches its entry: the lock word, the
    /// tables' headers and upkeep, and the change log while `capturing`.
    /// Each is one to three lines of a stripe's 600 bytes (every line a
    /// header touches: the stripes' stride is not a multiple of a line),
    /// read once per check at a random stripe of 1024: cold, and waited
    /// on one after another under the lock (taking the lock, and finding
    /// the table, were 3% and 7% of the server's CPU at 1M keys, in perf).
    /// Addresses only: nothing is read. (Under loom, whose mutex hides
    /// where its data is: nothing.)
    #[cfg(not(tollgate_loom))]
    #[inline]
    fn prefetch_locked(&self, kind: Kind, capturing: bool) {
        let mutex = std::ptr::addr_of!(self.mutex) as usize;
        let data = self.mutex.data_ptr() as usize;
        // The lock word sits before or after what it guards.
        let word = if data == mutex {
            data + size_of::<Locked>()
        } else {
            mutex
        };
        debug_assert!(word < mutex + std::mem::size_of_val(&self.mutex));
        crate::prefetch::line(word);
        let tables = data + std::mem::offset_of!(Locked, tables);
        for (at, len) in Tables::read_by(kind) {
            crate::prefetch::range(tables + at, len);
        }
        if capturing {
            crate::prefetch::line(data + std::mem::offset_of!(Locked, changes));
        }
    }

    #[cfg(tollgate_loom)]
    fn prefetch_locked(&self, _kind: Kind, _capturing: bool) {}

    /// Locks the stripe's tables.
    fn lock(&self) -> Guard<'_> {
        Guard {
            locked: self.mutex.lock(),
            hints: &self.hints,
        }
    }
}

/// A stripe's lock, held: derefs to what it guards and, as it unlocks,
/// publishes where the compact tables are when one of them moved
/// meanwhile (`tables/hint.rs`), so no path that writes can leave the
/// hints behind.
struct Guard<'s> {
    locked: MutexGuard<'s, Locked>,
    hints: &'s Hints,
}

impl std::ops::Deref for Guard<'_> {
    type Target = Locked;

    fn deref(&self) -> &Locked {
        &self.locked
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Locked {
        &mut self.locked
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.locked.tables.publish_hints(self.hints);
    }
}

/// What a stripe's lock guards: the tables, and the keys changed since the
/// replication sender last drained them. Derefs to the tables.
#[derive(Debug, Default)]
struct Locked {
    tables: Tables,
    changes: ChangeLog,
}

impl std::ops::Deref for Locked {
    type Target = Tables;

    fn deref(&self) -> &Tables {
        &self.tables
    }
}

impl std::ops::DerefMut for Locked {
    fn deref_mut(&mut self) -> &mut Tables {
        &mut self.tables
    }
}

/// Default [`StoreConfig::stripes`].
pub const DEFAULT_STRIPES: usize = 1024;

/// Default [`StoreConfig::change_buffer_cap`]: with 1024 stripes, at most
/// a million writes (64 bytes each with its state: about 64 MiB) wait for
/// the sender in all.
pub const DEFAULT_CHANGE_BUFFER_CAP: usize = 1024;

/// Store-wide settings.
#[derive(Debug, Clone, Copy)]
pub struct StoreConfig {
    /// Number of stripes, a power of two between 1 and 16384.
    pub stripes: usize,
    /// Most pairs in one atomic group (sizes the stack buffers of a check).
    pub max_group: usize,
    /// Most timestamps one key may hold: the largest `count` of a sliding
    /// log or a concurrency limit.
    pub max_log_entries: u64,
    /// Most writes (key and state) one stripe remembers for the replication
    /// sender before it drops them and marks the stripe for a resync.
    pub change_buffer_cap: usize,
    /// Bytes the tables may reserve in all (None: no cap). Each stripe gets
    /// an equal share.
    pub max_memory: Option<usize>,
    /// What a stripe at its share does with a new key.
    pub on_full: Full,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            stripes: DEFAULT_STRIPES,
            max_group: usize::from(tollgate_protocol::DEFAULT_MAX_GROUP),
            max_log_entries: crate::algorithm::DEFAULT_MAX_LOG_ENTRIES,
            change_buffer_cap: DEFAULT_CHANGE_BUFFER_CAP,
            max_memory: None,
            on_full: Full::Evict,
        }
    }
}

#[derive(Debug)]
pub struct Store {
    stripes: Box<[Stripe]>,
    /// `stripes.len() - 1`; stripe of a slot is `slot & mask`.
    mask: usize,
    /// One hasher for every table, so a key hashes the same in all of them.
    hasher: ahash::RandomState,
    /// Next stripe the sweeper visits; only the sweeper advances it, the
    /// atomic makes `sweep` callable through `&self`.
    sweep_cursor: AtomicUsize,
    /// Cap on a sliding log's or a concurrency limit's `count`.
    max_log_entries: u64,
    /// Whether writes record their keys for the replication sender (a
    /// standby is attached, or may resume).
    capture: AtomicBool,
    /// `StoreConfig::change_buffer_cap`, at least 1.
    change_cap: usize,
    /// Times a change log overflowed.
    overflows: AtomicU64,
    /// Stripes drained whole after an overflow.
    stripe_resyncs: AtomicU64,
    /// Bytes one stripe's tables may reserve (`usize::MAX`: no cap).
    stripe_budget: usize,
    on_full: Full,
    /// Live keys evicted to stay within `max_memory`.
    evicted: AtomicU64,
    /// New keys refused at the cap (policy `Refuse`).
    refused: AtomicU64,
    /// Expired entries dropped when a check, refund or release met them
    /// (the sweeper's own count is what `sweep` returns). Read for metrics.
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
                mutex: Mutex::new(Locked::default()),
                pending: AtomicBool::new(false),
                hints: Hints::default(),
            })
            .collect();
        Self {
            stripes,
            mask: n - 1,
            hasher: ahash::RandomState::new(),
            sweep_cursor: AtomicUsize::new(0),
            max_log_entries: config.max_log_entries,
            capture: AtomicBool::new(false),
            change_cap: config.change_buffer_cap.max(1),
            overflows: AtomicU64::new(0),
            stripe_resyncs: AtomicU64::new(0),
            stripe_budget: config.max_memory.map_or(usize::MAX, |m| m / n),
            on_full: config.on_full,
            evicted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            expired_on_access: AtomicU64::new(0),
        }
    }

    /// Live keys evicted so far to stay within the memory cap.
    pub fn evicted(&self) -> u64 {
        // Relaxed: a statistic, read on its own.
        self.evicted.load(Ordering::Relaxed)
    }

    /// New keys refused so far at the memory cap.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub fn stripe_count(&self) -> usize {
        self.stripes.len()
    }

    fn stripe(&self, slot: Slot) -> &Stripe {
        &self.stripes[usize::from(slot.get()) & self.mask]
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Where `key` lives in this store: its slot and its hash, computed
    /// once by a caller that both prefetches and checks the key (a frame's
    /// keys), and handed to [`Store::prefetch`] and [`Store::check_at`].
    #[inline]
    pub fn spot(&self, key: &[u8]) -> Spot {
        Spot {
            slot: Slot::of(key),
            hash: self.hash(key),
        }
    }

    /// The spot of `key`, whose slot the caller knows to be `of`'s (`key`
    /// is `of`'s key with bytes added after its hash tag): its hash alone
    /// is computed.
    #[inline]
    pub fn spot_beside(&self, key: &[u8], of: Spot) -> Spot {
        debug_assert_eq!(Slot::of(key), of.slot, "a key of another slot");
        Spot {
            slot: of.slot,
            hash: self.hash(key),
        }
    }

    /// Starts fetching into the cache what a check of `key` (at `spot`)
    /// under `algorithm` will read, without taking any lock: called for
    /// each key of a read before the keys are checked one by one, it lets
    /// their cache misses overlap instead of each check waiting on its own
    /// (see `tables/hint.rs`). Changes nothing; a stale hint costs only a
    /// wasted fetch.
    // Always: called per key of a frame, and kept inline by the compiler
    // until its line loops made it look large.
    #[inline(always)]
    pub fn prefetch(&self, key: &[u8], spot: Spot, algorithm: Algorithm) {
        let kind = match algorithm {
            Algorithm::TokenBucket => Kind::Buckets,
            Algorithm::LeakyBucket => Kind::Leaky,
            Algorithm::FixedWindow | Algorithm::SlidingWindow => Kind::Windows,
            // The general table: rare states, no hint.
            Algorithm::SlidingLog | Algorithm::Concurrency => return,
        };
        debug_assert_eq!(spot, self.spot(key), "a spot of another key");
        let stripe = self.stripe(spot.slot);
        // Relaxed: a hint; a check racing the switch only fetches a line
        // more or less.
        stripe.prefetch_locked(kind, self.capture.load(Ordering::Relaxed));
        stripe.hints.prefetch(kind, key, spot.hash);
    }

    /// The live state of one key, if any: its token bucket, else its
    /// state of any other algorithm (for inspection and tests). An expired
    /// bucket still held is absent, as everywhere.
    pub fn get(&self, key: &[u8], now: Nanos) -> Option<Entry> {
        self.entries(key, now).into_iter().next()
    }

    /// Every live state of one key: its token bucket, then its state of
    /// any other algorithm (a key may hold both, see `tables`). For the
    /// admin API's usage report; charges nothing.
    pub fn entries(&self, key: &[u8], now: Nanos) -> Vec<Entry> {
        let hash = self.hash(key);
        let tables = self.stripe(Slot::of(key)).lock();
        [Table::Buckets, Table::Others]
            .into_iter()
            .filter_map(|t| tables.find(t, hash, key))
            .filter(|e| e.expires_at > now)
            .collect()
    }

    /// Forgets every state `key` holds. Returns whether any of it was live.
    pub fn remove(&self, key: &[u8], now: Nanos) -> bool {
        let stripe = self.stripe(Slot::of(key));
        let mut locked = stripe.lock();
        let Locked { tables, changes } = &mut *locked;
        let removed = tables.remove_all(self.hash(key), key, now);
        if removed {
            self.record_change(stripe, changes, key, || Captured::RemovedAll);
        }
        removed
    }

    /// Expired entries dropped by checks, refunds and releases that met
    /// them, since the start.
    pub fn expired_on_access(&self) -> u64 {
        // Relaxed: a statistic; no other memory is read through it.
        self.expired_on_access.load(Ordering::Relaxed)
    }

    /// Number of entries held, expired-but-unswept ones included.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the tables have reserved (entries, control bytes, heap keys).
    /// Walks every stripe: for metrics and reports, not the hot path.
    pub fn memory_bytes(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().memory_bytes()).sum()
    }

    /// Drops expired entries from the next `stripes` stripes (round robin).
    /// Holds one stripe lock at a time. Returns how many entries it removed.
    pub fn sweep(&self, stripes: usize, now: Nanos) -> usize {
        let mut removed = 0;
        for _ in 0..stripes.min(self.stripes.len()) {
            // Relaxed: the cursor only spreads work; any interleaving of two
            // sweepers still visits valid stripes.
            let i = self.sweep_cursor.fetch_add(1, Ordering::Relaxed) & self.mask;
            removed += self.stripes[i].lock().sweep(&self.hasher, now);
        }
        removed
    }
}

#[cfg(test)]
mod tests;
