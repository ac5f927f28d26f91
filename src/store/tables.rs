//! The tables inside one stripe, laid out for memory and kept within a budget.
//!
//! A key holds at most two states: its token bucket, and one state of any
//! other algorithm ([`Table`]). A key's state is looked up in the table of
//! the algorithm being checked, so one key may carry a bucket and a window
//! side by side; each expires on its own and RESET drops both.
//!
//! Where a state is stored ([`Place`]) is finer than that. States that
//! pack into a fixed size beside their key have compact tables with no
//! stored expiry, each split by key width (`split`): keys that fit a
//! 16-byte [`ShortKey`](super::key::ShortKey) slot in one table, the rest
//! in a 24-byte [`StoredKey`] in another. GCRA's whole state is its `tat`,
//! which is also its expiry, so token buckets and leaky buckets get tables
//! of 24-byte entries (32 with a long key), one each: a leaky bucket's
//! state is kept apart from a token bucket's (switching a key between the
//! two starts it afresh). Fixed and sliding windows share a table of
//! 32-byte entries (40 with a long key; `packed`). Every other state
//! (logs, leases, a window that does not pack) lives in a general table
//! with an explicit expiry (64-byte entries). The leaky, windows and
//! general tables together hold a key's one "other" state: a lookup of it
//! checks each, and storing it in one removes the key from the others.
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
mod compact;
mod hint;
mod packed;
mod slots;
mod split;

pub use budget::Full;
pub use hint::{Hint, Hints};

use super::{Entry, StoredKey};
use crate::algorithm::{State, Verdict};
use crate::clock::Nanos;
use crate::sync::{AtomicU64, Ordering};
use budget::Upkeep;
use compact::Probe;
use packed::Window;
use slots::Slots;
use split::Split;

/// A token or leaky bucket: GCRA's theoretical arrival time, which is also
/// when the state expires.
#[derive(Debug, Clone, Copy)]
struct Tat(Nanos);

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

/// Which kind of table a state is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Token buckets.
    Buckets,
    /// Leaky buckets; part of [`Table::Others`].
    Leaky,
    /// Fixed and sliding windows that pack; part of [`Table::Others`].
    Windows,
    /// Every other state; part of [`Table::Others`].
    General,
}

/// The table a state is stored in: its kind and, for a compact kind,
/// whether its key takes the short slot (the general table has one width;
/// its `short` is always false).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub kind: Kind,
    pub short: bool,
}

impl Place {
    /// Every table, each once.
    pub const ALL: [Place; 7] = [
        Place::compact(Kind::Buckets, true),
        Place::compact(Kind::Buckets, false),
        Place::compact(Kind::Leaky, true),
        Place::compact(Kind::Leaky, false),
        Place::compact(Kind::Windows, true),
        Place::compact(Kind::Windows, false),
        Place::GENERAL,
    ];

    const GENERAL: Place = Place {
        kind: Kind::General,
        short: false,
    };

    const fn compact(kind: Kind, short: bool) -> Self {
        Place { kind, short }
    }

    /// Where `entry` for `key` is stored.
    pub fn of(key: &[u8], entry: &Entry) -> Self {
        let kind = Kind::of(entry);
        match kind {
            Kind::General => Place::GENERAL,
            _ => Place::compact(kind, Probe::of(key).is_short()),
        }
    }
}

impl Kind {
    /// The kinds that make up [`Table::Others`], in lookup order.
    const OTHERS: [Kind; 3] = [Kind::Leaky, Kind::Windows, Kind::General];

    fn of(entry: &Entry) -> Self {
        match entry.state {
            State::TokenBucket { .. } => Kind::Buckets,
            State::LeakyBucket { .. } => Kind::Leaky,
            State::FixedWindow(_) | State::SlidingWindow(_)
                if Window::pack(entry, None).is_some() =>
            {
                Kind::Windows
            }
            _ => Kind::General,
        }
    }
}

#[derive(Debug, Default)]
pub struct Tables {
    buckets: Split<Tat>,
    leaky: Split<Tat>,
    windows: Split<Window>,
    others: Slots<Other>,
    /// Heap bytes owned by entries: long keys, logs, lease lists.
    heap_bytes: usize,
    upkeep: Upkeep,
    /// Some compact table moved since the hints were last published.
    hints_stale: bool,
}

fn bucket_entry(tat: Tat) -> Entry {
    Entry {
        state: State::TokenBucket { tat: tat.0 },
        expires_at: tat.0,
    }
}

fn leaky_entry(tat: Tat) -> Entry {
    Entry {
        state: State::LeakyBucket { tat: tat.0 },
        expires_at: tat.0,
    }
}

impl Tables {
    /// Where, from the start of the tables, a check of a state of `kind`
    /// reads under the lock besides the entry itself: its tables'
    /// headers (the split pair) and the upkeep every write lowers, each an
    /// (offset, bytes), for the stripe's prefetch (`Store::prefetch`).
    #[cfg_attr(tollgate_loom, allow(dead_code))]
    pub fn read_by(kind: Kind) -> [(usize, usize); 2] {
        let split = match kind {
            Kind::Buckets => (
                std::mem::offset_of!(Tables, buckets),
                size_of::<Split<Tat>>(),
            ),
            Kind::Leaky => (std::mem::offset_of!(Tables, leaky), size_of::<Split<Tat>>()),
            Kind::Windows => (
                std::mem::offset_of!(Tables, windows),
                size_of::<Split<Window>>(),
            ),
            Kind::General => (
                std::mem::offset_of!(Tables, others),
                size_of::<Slots<Other>>(),
            ),
        };
        [
            split,
            (std::mem::offset_of!(Tables, upkeep), size_of::<Upkeep>()),
        ]
    }

    /// Publishes where the compact tables are to `hints` (the stripe's,
    /// read without the lock to prefetch), for those that moved since the
    /// last publish; called by the stripe's lock guard as it unlocks.
    #[inline]
    pub fn publish_hints(&mut self, hints: &Hints) {
        if !self.hints_stale {
            return;
        }
        self.buckets.publish(&hints.buckets);
        self.leaky.publish(&hints.leaky);
        self.windows.publish(&hints.windows);
        self.hints_stale = false;
    }

    /// Checks `hints` against the compact tables (`Hint::assert_names`);
    /// returns how many entries were checked.
    #[cfg(all(test, not(tollgate_loom)))]
    pub fn assert_hints(&self, hints: &Hints, hasher: &ahash::RandomState) -> usize {
        let h = |key: &[u8]| hasher.hash_one(key);
        let mut checked = 0;
        for (split, pair) in [(&self.buckets, &hints.buckets), (&self.leaky, &hints.leaky)] {
            checked += pair[0].assert_names(&split.short.table, |c| h(c.key.as_bytes()));
            checked += pair[1].assert_names(&split.long.table, |c| h(c.key.as_bytes()));
        }
        let windows = &self.windows;
        checked += hints.windows[0].assert_names(&windows.short.table, |c| h(c.key.as_bytes()));
        checked += hints.windows[1].assert_names(&windows.long.table, |c| h(c.key.as_bytes()));
        checked
    }

    /// Notes that a compact table may have moved (after a compaction), for
    /// [`Tables::publish_hints`].
    fn note_moves(&mut self) {
        for kind in [Kind::Buckets, Kind::Leaky, Kind::Windows] {
            self.note_moves_in(kind);
        }
    }

    /// Notes that `kind`'s tables may have moved (after an insert into
    /// them: only an insert or a compaction moves a table). The other
    /// kinds' headers are lines a check has no other reason to read, and
    /// would miss (a new key's look at all of them was 1% of the server's
    /// CPU).
    fn note_moves_in(&mut self, kind: Kind) {
        self.hints_stale |= match kind {
            Kind::Buckets => self.buckets.stale(),
            Kind::Leaky => self.leaky.stale(),
            Kind::Windows => self.windows.stale(),
            Kind::General => false,
        };
    }

    /// The entry of `key` in the tables of `kind`, live or not.
    fn find_in(&self, kind: Kind, hash: u64, key: &[u8], probe: Probe) -> Option<Entry> {
        match kind {
            Kind::Buckets => self.buckets.get(hash, probe).copied().map(bucket_entry),
            Kind::Leaky => self.leaky.get(hash, probe).copied().map(leaky_entry),
            Kind::Windows => self.windows.get(hash, probe).map(|w| w.entry()),
            Kind::General => self
                .others
                .table
                .find(hash, |o| o.key.is(key))
                .map(|o| o.entry.clone()),
        }
    }

    /// Whether the tables of `kind` hold `key` (without copying its state).
    fn holds(&self, kind: Kind, hash: u64, key: &[u8]) -> bool {
        let probe = Probe::of(key);
        match kind {
            Kind::Buckets => self.buckets.get(hash, probe).is_some(),
            Kind::Leaky => self.leaky.get(hash, probe).is_some(),
            Kind::Windows => self.windows.get(hash, probe).is_some(),
            Kind::General => self.others.table.find(hash, |o| o.key.is(key)).is_some(),
        }
    }

    /// The entry of `key` in `table`, live or not, and the kind of table
    /// holding it.
    fn find_kind(&self, table: Table, hash: u64, key: &[u8]) -> Option<(Entry, Kind)> {
        let probe = Probe::of(key);
        let kinds: &[Kind] = match table {
            Table::Buckets => &[Kind::Buckets],
            Table::Others => &Kind::OTHERS,
        };
        kinds
            .iter()
            .find_map(|&k| Some((self.find_in(k, hash, key, probe)?, k)))
    }

    /// The entry of `key` in `table`, live or not.
    pub fn find(&self, table: Table, hash: u64, key: &[u8]) -> Option<Entry> {
        self.find_kind(table, hash, key).map(|(entry, _)| entry)
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
        let (entry, kind) = self.find_kind(table, hash, key)?;
        if entry.expires_at > now {
            return Some(entry);
        }
        // A key's other state is in one place: where it was found.
        self.remove_in(kind, hash, key);
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
        let probe = Probe::of(key);
        let Some(bucket) = self.buckets.get_mut(hash, probe) else {
            let verdict = evaluate(None);
            match (charge && verdict.decision.allowed, &verdict.state) {
                // Absent, as just looked up: inserted without a second
                // lookup (`put` would look again).
                (true, &Some(State::TokenBucket { tat })) => {
                    self.upkeep.wrote(verdict.expires_at);
                    self.heap_bytes += self.buckets.insert(hasher, hash, probe, Tat(tat));
                    self.note_moves_in(Kind::Buckets);
                }
                (true, Some(state)) => {
                    let entry = Entry {
                        state: state.clone(),
                        expires_at: verdict.expires_at,
                    };
                    self.put(hasher, hash, key, entry);
                }
                _ => {}
            }
            return verdict;
        };
        let live = bucket.0 > now;
        let current = live.then_some(State::TokenBucket { tat: bucket.0 });
        let verdict = evaluate(current.as_ref());
        let written = match (&verdict.state, charge && verdict.decision.allowed) {
            (Some(State::TokenBucket { tat }), true) => {
                bucket.0 = *tat;
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

    /// Whether `put(.., entry)` for `key` would add an entry to the place
    /// of `entry` (a key's other state moving to another place, say from a
    /// leaky bucket to a window, adds an entry there).
    pub fn is_new(&self, hash: u64, key: &[u8], entry: &Entry) -> bool {
        !self.holds(Kind::of(entry), hash, key)
    }

    /// Stores `entry` for `key`, in the place it belongs to. A compact
    /// entry's expiry is its state's (GCRA's `tat`, a window's end: the
    /// algorithms write them so; a window that does not pack goes to the
    /// general table). An other state replaces the key's other state
    /// wherever it was.
    pub fn put(&mut self, hasher: &ahash::RandomState, hash: u64, key: &[u8], entry: Entry) {
        self.put_hinted(hasher, hash, key, entry, None);
    }

    /// [`Tables::put`], told the window length (ns) of the policy that
    /// wrote `entry` when it is a fixed or sliding window: packing it then
    /// multiplies where it would divide (a new key, or one whose expired
    /// state was just dropped). A wrong `window` costs the division only.
    pub fn put_hinted(
        &mut self,
        hasher: &ahash::RandomState,
        hash: u64,
        key: &[u8],
        entry: Entry,
        window: Option<Nanos>,
    ) {
        self.upkeep.wrote(entry.expires_at);
        let probe = Probe::of(key);
        let (added, kind) = match entry.state {
            State::TokenBucket { tat } => (
                self.buckets.put(hasher, hash, probe, Tat(tat)),
                Kind::Buckets,
            ),
            State::LeakyBucket { tat } => {
                if let Some(slot) = self.leaky.get_mut(hash, probe) {
                    *slot = Tat(tat);
                    return;
                }
                self.remove_others_but(Kind::Leaky, hash, key);
                (
                    self.leaky.insert(hasher, hash, probe, Tat(tat)),
                    Kind::Leaky,
                )
            }
            State::FixedWindow(_) | State::SlidingWindow(_) => {
                let held = self.windows.get_mut(hash, probe);
                let hint = window.or_else(|| held.as_deref().map(|w| w.window()));
                match (held, Window::pack(&entry, hint)) {
                    (Some(slot), Some(window)) => {
                        *slot = window;
                        return;
                    }
                    (None, Some(window)) => {
                        self.remove_others_but(Kind::Windows, hash, key);
                        let added = self.windows.insert(hasher, hash, probe, window);
                        (added, Kind::Windows)
                    }
                    // Out of the windows table too (`put_general`).
                    (_, None) => {
                        self.put_general(hasher, hash, key, entry);
                        (0, Kind::General)
                    }
                }
            }
            _ => {
                self.put_general(hasher, hash, key, entry);
                (0, Kind::General)
            }
        };
        self.heap_bytes += added;
        self.note_moves_in(kind);
    }

    /// Removes `key`'s other state from every place but `kind` (only a key
    /// new to `kind` can have one elsewhere).
    fn remove_others_but(&mut self, kind: Kind, hash: u64, key: &[u8]) {
        for other in Kind::OTHERS.into_iter().filter(|&k| k != kind) {
            self.remove_in(other, hash, key);
        }
    }

    fn put_general(&mut self, hasher: &ahash::RandomState, hash: u64, key: &[u8], entry: Entry) {
        let found = self.others.table.find_mut(hash, |o| o.key.is(key));
        if let Some(o) = found {
            self.heap_bytes -= o.entry.state.heap_bytes();
            self.heap_bytes += entry.state.heap_bytes();
            o.entry = entry;
            return;
        }
        self.remove_others_but(Kind::General, hash, key);
        let other = Other {
            key: StoredKey::new(key),
            entry,
        };
        self.heap_bytes += other.heap_bytes();
        self.others
            .insert(hash, other, |o| hasher.hash_one(o.key.as_bytes()));
    }

    /// Removes `key` from the tables of `kind`, returning its entry.
    fn remove_in(&mut self, kind: Kind, hash: u64, key: &[u8]) -> Option<Entry> {
        let probe = Probe::of(key);
        let (entry, freed) = match kind {
            Kind::Buckets => self
                .buckets
                .take(hash, probe)
                .map(|(t, heap)| (bucket_entry(t), heap)),
            Kind::Leaky => self
                .leaky
                .take(hash, probe)
                .map(|(t, heap)| (leaky_entry(t), heap)),
            Kind::Windows => self
                .windows
                .take(hash, probe)
                .map(|(w, heap)| (w.entry(), heap)),
            Kind::General => {
                let found = self.others.table.find_entry(hash, |o| o.key.is(key));
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
            Table::Buckets => self.remove_in(Kind::Buckets, hash, key),
            // A key has its other state in one place; every place is
            // cleared so that nothing could outlive a removal.
            Table::Others => Kind::OTHERS
                .into_iter()
                .filter_map(|k| self.remove_in(k, hash, key))
                .reduce(|first, _| first),
        }
    }

    /// Removes `key` from every table; true when any removed state was live.
    pub fn remove_all(&mut self, hash: u64, key: &[u8], now: Nanos) -> bool {
        [Kind::Buckets, Kind::Leaky, Kind::Windows, Kind::General]
            .into_iter()
            .filter_map(|k| self.remove_in(k, hash, key))
            .fold(false, |live, e| live | (e.expires_at > now))
    }

    /// Calls `f` with every entry, live or not (one call per table a key
    /// has state in).
    pub fn for_each(&self, mut f: impl FnMut(&[u8], Entry)) {
        self.buckets.each(|k, &t| f(k, bucket_entry(t)));
        self.leaky.each(|k, &t| f(k, leaky_entry(t)));
        self.windows.each(|k, w| f(k, w.entry()));
        for o in &self.others.table {
            f(o.key.as_bytes(), o.entry.clone());
        }
    }

    /// Keeps the entries for which `keep(key, expires_at)`; returns the
    /// heap bytes freed.
    fn retain_by(&mut self, mut keep: impl FnMut(&[u8], Nanos) -> bool) -> usize {
        let mut freed = self.buckets.retain(|k, t| keep(k, t.0));
        freed += self.leaky.retain(|k, t| keep(k, t.0));
        freed += self.windows.retain(|k, w| keep(k, w.expires_at()));
        self.others.table.retain(|o| {
            let kept = keep(o.key.as_bytes(), o.entry.expires_at);
            if !kept {
                freed += o.heap_bytes();
            }
            kept
        });
        freed
    }

    /// Keeps only the entries whose key satisfies `keep`.
    pub fn retain_keys(&mut self, mut keep: impl FnMut(&[u8]) -> bool) {
        self.heap_bytes -= self.retain_by(|k, _| keep(k));
    }

    /// Drops every entry expiring at or before `cutoff`; returns how many.
    /// Learns the earliest expiry of what is kept.
    fn retain_after(&mut self, cutoff: Nanos) -> usize {
        let before = self.len();
        let mut earliest = Nanos::MAX;
        self.heap_bytes -= self.retain_by(|_, expires_at| {
            let kept = expires_at > cutoff;
            if kept {
                earliest = earliest.min(expires_at);
            }
            kept
        });
        self.upkeep.next_expiry = earliest;
        before - self.len()
    }

    /// The sweeper's visit: drops every expired entry (returns how many),
    /// then gives back the room of tables that hold far fewer entries than
    /// they once did, and clears tombstones before hashbrown would double
    /// a table for them (`Slots::tidy`). Without it a table keeps the
    /// largest size it ever had, and tombstones left by expiries double it
    /// under a steady key set: memory grew with no more keys held.
    pub fn sweep(&mut self, hasher: &ahash::RandomState, now: Nanos) -> usize {
        let removed = self.retain_after(now);
        self.buckets.tidy(hasher);
        self.leaky.tidy(hasher);
        self.windows.tidy(hasher);
        self.note_moves();
        self.others.tidy(|o| hasher.hash_one(o.key.as_bytes()));
        removed
    }

    pub fn len(&self) -> usize {
        self.buckets.len() + self.leaky.len() + self.windows.len() + self.others.table.len()
    }
}

const _: () =
    assert!(std::mem::size_of::<compact::Compact<crate::store::key::ShortKey, Tat>>() == 24);
const _: () = assert!(std::mem::size_of::<compact::Compact<StoredKey, Tat>>() == 32);
const _: () =
    assert!(std::mem::size_of::<compact::Compact<crate::store::key::ShortKey, Window>>() == 32);
const _: () = assert!(std::mem::size_of::<compact::Compact<StoredKey, Window>>() == 40);

#[cfg(test)]
mod tests;
