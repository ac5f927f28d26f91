//! Keeping one stripe's tables within its share of the memory cap.
//!
//! Before a new key would make a table grow past the stripe's budget,
//! [`Tables::make_room`] drops expired entries and then, by policy, evicts
//! the entries closest to expiry (whatever table they are in) or refuses
//! the key. The accounting it relies on is O(1): each table's allocation
//! ([`Slots`](super::slots::Slots)) plus the heap bytes entries own.

use super::{Kind, Place, Tables};
use crate::clock::Nanos;

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

/// When dropping expired entries and tombstones at the cap is worth a scan
/// of the stripe (see [`Tables::make_room`]).
#[derive(Debug, Default)]
pub(super) struct Upkeep {
    /// No entry expires before this (a lower bound: lowered by every write,
    /// made exact by every scan). 0 until the first scan.
    pub(super) next_expiry: Nanos,
    /// When the last scan ran.
    last: Nanos,
    /// Requests over the budget since then.
    misses: usize,
}

impl Upkeep {
    /// An entry now expires at `expires_at`.
    pub(super) fn wrote(&mut self, expires_at: Nanos) {
        self.next_expiry = self.next_expiry.min(expires_at);
    }
}

/// Least time between two scans of a stripe for expired entries at the cap
/// (100 ms), unless requests over the budget have paid for one (see
/// [`Tables::make_room`]).
pub const UPKEEP_GAP: Nanos = 100 * crate::clock::NANOS_PER_MS;

impl Tables {
    /// Reserved bytes: the slots of every table and the heap bytes of
    /// entries.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.bytes()
            + self.leaky.bytes()
            + self.windows.bytes()
            + self.others.bytes()
            + self.heap_bytes
    }

    /// Bytes of `place`'s slots now, and with `new` more entries (`emptied`:
    /// once every entry is gone and `new` entries are in).
    fn slot_bytes(&self, place: Place, new: usize, emptied: bool) -> (usize, usize) {
        let short = place.short;
        match (place.kind, emptied) {
            (Kind::Buckets, _) => self.buckets.slot_bytes(short, new, emptied),
            (Kind::Leaky, _) => self.leaky.slot_bytes(short, new, emptied),
            (Kind::Windows, _) => self.windows.slot_bytes(short, new, emptied),
            (Kind::General, false) => (self.others.bytes(), self.others.bytes_after(new)),
            (Kind::General, true) => (self.others.bytes(), self.others.bytes_if_emptied(new)),
        }
    }

    /// Bytes after adding `new` entries to `place` (growing it if needed),
    /// `heap` of them on the heap.
    pub(super) fn memory_after(&self, place: Place, new: usize, heap: usize) -> usize {
        let (before, after) = self.slot_bytes(place, new, false);
        self.memory_bytes() - before + after + heap
    }

    /// Bytes once every entry is evicted and `new` entries (`heap` bytes on
    /// the heap) are in `place`.
    fn memory_if_emptied(&self, place: Place, new: usize, heap: usize) -> usize {
        let slots = self.memory_bytes() - self.heap_bytes;
        let (before, after) = self.slot_bytes(place, new, true);
        slots - before + after + heap
    }

    /// Makes sure `new` more entries (`heap` bytes of them on the heap) fit
    /// in `place` within `budget` bytes (the stripe's share): expired entries
    /// go first, then, by `full`, the live entries closest to expiry, or the
    /// request is refused. With `ask` (a peek) no live entry is evicted:
    /// the answer is whether the request would be granted.
    pub fn make_room(
        &mut self,
        hasher: &ahash::RandomState,
        place: Place,
        (new, heap): (usize, usize),
        (budget, full): (usize, Full),
        now: Nanos,
        ask: bool,
    ) -> Room {
        let mut room = Room {
            granted: true,
            ..Room::default()
        };
        if new == 0 || self.memory_after(place, new, heap) <= budget {
            return room;
        }
        if ask && full == Full::Evict {
            // The check would evict what it needs, unless even an emptied
            // stripe has no room.
            room.granted = self.memory_if_emptied(place, new, heap) <= budget;
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
        while self.memory_after(place, new, heap) > budget {
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
            || self.leaky.has_tombstones()
            || self.windows.has_tombstones()
            || self.others.has_tombstones();
        let paid = self.upkeep.misses.saturating_mul(1 << EVICT_SHIFT) >= self.len()
            || now >= self.upkeep.last.saturating_add(UPKEEP_GAP);
        maybe && paid
    }

    /// Evicts the 1/8 of entries (at least one) expiring soonest, from
    /// every table.
    fn evict_soonest(&mut self, now: Nanos) -> usize {
        let mut expiries: Vec<Nanos> = self
            .buckets
            .states()
            .chain(self.leaky.states())
            .map(|t| t.0)
            .chain(self.windows.states().map(|w| w.expires_at()))
            .chain(self.others.table.iter().map(|o| o.entry.expires_at))
            .collect();
        let n = (expiries.len() >> EVICT_SHIFT).max(1);
        let (_, cutoff, _) = expiries.select_nth_unstable(n - 1);
        // Ties at the cutoff go too: slightly more than 1/8, never less.
        self.retain_after((*cutoff).max(now))
    }

    /// Rebuilds the tables with tombstones at their current size: removals
    /// leave tombstones that hashbrown clears only by rehashing, and a
    /// rehash it starts on its own (when tombstones use up its free slots)
    /// doubles a table this full, past the budget. Rebuilding here keeps
    /// growth under our control. O(n), after a batch removal only.
    fn compact(&mut self, hasher: &ahash::RandomState) {
        self.buckets.compact(hasher);
        self.leaky.compact(hasher);
        self.windows.compact(hasher);
        self.note_moves();
        if self.others.has_tombstones() {
            self.others.rebuild(|o| hasher.hash_one(o.key.as_bytes()));
        }
    }
}
