//! One generation of the retry memory: the keys remembered in one stretch
//! of time, their entries in the order remembered and an index from key to
//! entry.
//!
//! Invariants:
//! - the index is open-addressed with linear probing and never more than
//!   half full (a generation holds at most `half` keys and has at least
//!   `2 * half` slots), so every probe ends at an empty slot;
//! - a slot is 0 when empty, else the entry's position plus one in its low
//!   `bits` bits and the top of the key's hash above them; a key is never
//!   removed alone, only the whole generation is emptied (so no tombstones);
//! - a [`Probe`] is good only until the generation is changed: the caller
//!   probes again after [`Generation::forget`] (the retry memory's shard
//!   lock keeps any other check off the generation meanwhile).
//!
//! Why not hashbrown's table: a key not remembered costs one cache line of
//! this index per generation (tags and positions share the slot), and the
//! slot the probe ended at is the one written, already in cache; hashbrown
//! keeps tags and values apart, so the insert's value write was a second
//! line, fetched while the shard lock waited to be released.

use super::Entry;
use crate::clock::Nanos;
use tollgate_protocol::IdempotencyKey;

/// Where a probe for a key ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// The key's entry, at this position (inside its window or not).
    Found(usize),
    /// Not there: the empty slot it would go to.
    Vacant(usize),
}

/// Bytes of one slot of the index.
pub(super) const SLOT_SIZE: usize = std::mem::size_of::<u32>();

/// Slots of the index of a generation of `half` keys: a power of two, at
/// least twice as many.
pub(super) fn slots_for(half: usize) -> usize {
    (2 * half).next_power_of_two()
}

#[derive(Default)]
pub(super) struct Generation {
    entries: Vec<Entry>,
    /// The index ([module docs](self)); empty until the first key, so a
    /// server that never sees a CHECK2 allocates none.
    slots: Box<[u32]>,
    /// How many low bits of a slot hold a position: enough for `half`.
    bits: u32,
    /// The latest `at` of its entries: when it is older than the window,
    /// nothing in the generation is still answering retries.
    newest: Nanos,
    /// At most the earliest `at` of its entries (an entry put again over
    /// itself only moves later): when it is inside the window, every entry
    /// is. Forgetting a full memory within the window, the usual case
    /// under load, then counts without walking the entries (115 KB of
    /// cold lines per turn of a shard at the default capacity; 0.7% of
    /// the server's CPU under CHECK2 in perf).
    oldest: Nanos,
}

impl Generation {
    /// The slot's part that comes from the key's hash: the top of it, clear
    /// of the bits the home slot and the shard are taken from.
    fn tag(&self, hash: u64) -> u32 {
        ((hash >> 32) as u32) & !self.low()
    }

    fn low(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    fn home(&self, hash: u64) -> usize {
        hash as usize & (self.slots.len() - 1)
    }

    /// Where its index starts (0 before it has one), for a prefetch made
    /// without the shard's lock: the slot a probe for `hash` starts at is
    /// [`SLOT_SIZE`] times `hash & (slots_for(half) - 1)` past it.
    pub(super) fn base(&self) -> usize {
        if self.slots.is_empty() {
            0
        } else {
            self.slots.as_ptr() as usize
        }
    }

    /// Looks `key` (hashed to `hash`) up.
    pub(super) fn probe(&self, hash: u64, key: IdempotencyKey) -> Probe {
        if self.slots.is_empty() {
            // No index yet: `put` makes one and starts at the home slot.
            return Probe::Vacant(0);
        }
        let (mask, low, tag) = (self.slots.len() - 1, self.low(), self.tag(hash));
        let mut at = self.home(hash);
        loop {
            let slot = self.slots[at];
            if slot == 0 {
                return Probe::Vacant(at);
            }
            if slot & !low == tag {
                let position = (slot & low) as usize - 1;
                if self.entries[position].key == key {
                    return Probe::Found(position);
                }
            }
            at = (at + 1) & mask;
        }
    }

    /// The entry `probe` found, if it is still inside `window` at `now`.
    pub(super) fn live(&self, probe: Probe, now: Nanos, window: Nanos) -> Option<&Entry> {
        let Probe::Found(position) = probe else {
            return None;
        };
        let entry = &self.entries[position];
        (now.saturating_sub(entry.at) < window).then_some(entry)
    }

    /// Starts fetching where the next entry will be written.
    pub(super) fn prepare(&self) {
        if self.entries.len() < self.entries.capacity() {
            let next = self.entries.as_ptr_range().end as usize;
            crate::prefetch::range_for_write(next, std::mem::size_of::<Entry>());
        }
    }

    /// Remembers `entry` (its key hashed to `hash`) where `probe`, made
    /// since the generation last changed, ended: over the entry it found,
    /// or in the slot it found empty. The generation holds at most `half`
    /// keys.
    pub(super) fn put(&mut self, probe: Probe, hash: u64, entry: Entry, half: usize) {
        self.newest = self.newest.max(entry.at);
        self.oldest = if self.entries.is_empty() {
            entry.at
        } else {
            self.oldest.min(entry.at)
        };
        let slot = match probe {
            Probe::Found(position) => {
                self.entries[position] = entry;
                return;
            }
            Probe::Vacant(_) if self.slots.is_empty() => {
                self.allocate(half);
                self.home(hash)
            }
            Probe::Vacant(slot) => slot,
        };
        // More would leave a probe no empty slot to end at.
        assert!(self.entries.len() < half, "a generation holds `half` keys");
        let position = u32::try_from(self.entries.len() + 1).expect("under 2^31 keys");
        self.entries.push(entry);
        self.slots[slot] = self.tag(hash) | position;
    }

    /// Makes the index for `half` keys.
    fn allocate(&mut self, half: usize) {
        let bits = u32::try_from(half).ok().filter(|&h| h < 1 << 31);
        let bits = bits.expect("a shard holds under 2^31 keys");
        self.bits = u32::BITS - bits.leading_zeros();
        self.slots = vec![0; slots_for(half)].into_boxed_slice();
    }

    /// Empties it, returning how many of its entries were still inside
    /// `window` at `now` (forgotten early). Walks the entries only when
    /// some may be and some may not, in order.
    pub(super) fn forget(&mut self, now: Nanos, window: Nanos) -> usize {
        let early = if now.saturating_sub(self.newest) >= window {
            0
        } else if now.saturating_sub(self.oldest) < window {
            self.entries.len()
        } else {
            (self.entries.iter())
                .filter(|e| now.saturating_sub(e.at) < window)
                .count()
        };
        // Keeps the allocations: the next generation fills them again.
        if !self.entries.is_empty() {
            self.slots.fill(0);
        }
        self.entries.clear();
        self.newest = 0;
        self.oldest = 0;
        early
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}
