//! Change capture for replication: the states the writes left since the
//! last drain.
//!
//! ```text
//!   check (holds the stripe lock) --write--> tables
//!                                 --(key, state written)--> ChangeLog (same lock)
//!                                 --pending=true
//!   replication sender: pending.swap(false) -> lock: take the log -> unlock
//!                       fold: per key and table, the last state -> frame
//! ```
//!
//! Invariants:
//! - a write records the key and the state it left in the table(s) it
//!   wrote (`log::Captured`: an entry, or a removal) under the stripe lock
//!   that the write holds, so capturing costs no extra lock, and the log
//!   holds the stripe's writes in the order the lock serialised them; the
//!   capture switch is read under that lock too, so a write that comes
//!   after [`Store::start_capture`] marked its stripe is always recorded
//!   (or covered by the stripe's resync);
//! - every write to a table is recorded (a removal too), except the drop
//!   of an expired entry, which changes nothing a standby can see: so the
//!   last state recorded for a key and table is the state it holds, and
//!   the drain sends that without reading the tables again (no second
//!   lock, no probe per key); a table no record wrote is sent as "keep";
//! - the drain takes the whole log under the lock, so a write after that
//!   is recorded (and sets `pending`) for the next drain: no change is
//!   lost, and per key the states drained are in the order they were
//!   written (the loom model `loom-tests/tests/replication.rs` checks
//!   both; `tests/model/replication.rs` checks the standby's copy against
//!   the primary under random operations);
//! - a stripe's log holds at most `cap` records: past it the records are
//!   dropped and the stripe is marked for **resync** (sent whole by the
//!   next drain), so a slow standby can never grow the primary's memory;
//!   a stripe marked for resync records nothing more until it is sent.
//!   Keys the memory cap evicts are not recorded either: an eviction marks
//!   the stripe for resync.

mod log;

use super::{Entry, Guard, Spot, Store, StoredKey, Tables};
use crate::clock::Nanos;
use crate::slot::Slot;
use crate::sync::Ordering;
use bytes::Bytes;
pub(super) use log::{Captured, ChangeLog};
pub use log::{ChangedKey, Changes, Keys, LogBuffer, Written};
use log::{Recorded, Resync};
use tollgate_protocol::Algorithm;

impl super::Stripe {
    /// Tells the sender this stripe has something, under its lock. A busy
    /// stripe is flagged already: then only a load, no write to the shared
    /// line on every check. If the load still reads `true` although the
    /// sender has just cleared the flag, the sender has not taken the lock
    /// yet (we hold it, and it locks after clearing), so it finds this
    /// record in the log. Setting it is a swap, not a store: the same
    /// here, and an RMW always sits last in the flag's modification order,
    /// which keeps the loom model's reasoning (and ours) simple.
    fn flag_pending(&self) {
        // Acquire/AcqRel: pair with the drain's `swap(false, Acquire)`; the
        // lock already orders the records, the flag only spares the drain
        // from locking idle stripes.
        if !self.pending.load(Ordering::Acquire) {
            self.pending.swap(true, Ordering::AcqRel);
        }
    }
}

/// What the writes since the last drain left in one key's two tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    pub key: StoredKey,
    /// The token-bucket table: its state now, removed, or not written
    /// since the last drain (`Keep`).
    pub bucket: TableWrite,
    /// The table of any other algorithm, likewise.
    pub other: TableWrite,
}

impl KeyState {
    fn table_mut(&mut self, table: super::tables::Table) -> &mut TableWrite {
        match table {
            super::tables::Table::Buckets => &mut self.bucket,
            super::tables::Table::Others => &mut self.other,
        }
    }
}

/// What one stripe has for the replication sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    Nothing,
    /// The states the keys that changed hold now, each key once.
    Changes(Changes),
    /// Every live entry of the stripe: the standby replaces the stripe's
    /// slots with them. Each entry is one state of one key (a key may
    /// appear twice, once per table).
    Whole(Vec<(StoredKey, Entry)>),
}

/// A replicated write, as a standby applies it to one of a key's tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableWrite {
    Keep,
    Remove,
    Put(Entry),
}

/// A replicated key: what to do with each of its two states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyWrite {
    pub key: Bytes,
    /// Must hold a token-bucket state when `Put`.
    pub bucket: TableWrite,
    /// Must hold any other state when `Put`.
    pub other: TableWrite,
}

impl KeyWrite {
    /// The algorithm of the table this write will probe first, to fetch
    /// its slot ahead (None: only a removal from the other table, whose
    /// kind the write does not say).
    fn algorithm(&self) -> Option<Algorithm> {
        match (&self.bucket, &self.other) {
            (TableWrite::Put(_) | TableWrite::Remove, _) => Some(Algorithm::TokenBucket),
            (TableWrite::Keep, TableWrite::Put(entry)) => Some(entry.state.algorithm()),
            (TableWrite::Keep, _) => None,
        }
    }
}

/// How many keys ahead of the one it writes [`Store::apply_all`] fetches:
/// enough misses in flight to overlap (a core has about ten line fill
/// buffers), few enough that a fetched line is still there when its key's
/// turn comes.
const APPLY_AHEAD: usize = 8;

/// Counters of the change capture, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureStats {
    pub capturing: bool,
    /// Writes waiting in the logs now (a key written in a row counts once).
    pub buffered: usize,
    /// Times a stripe's log hit its cap and was dropped.
    pub overflows: u64,
    /// Stripes drained whole because their log overflowed (a full sync's
    /// stripes not included).
    pub stripe_resyncs: u64,
}

impl Store {
    /// Records, under the stripe lock the caller holds, what a write left
    /// for `key` (`captured` is called only when capturing: it may clone a
    /// state). Every write to a table must come here, after or before
    /// the write but under the same lock (see the header).
    #[inline]
    pub(super) fn record_change(
        &self,
        stripe: &super::Stripe,
        log: &mut ChangeLog,
        key: &[u8],
        captured: impl FnOnce() -> Captured,
    ) {
        // Relaxed: read under the stripe lock, which `start_capture` took
        // after setting the switch, so the mutex orders the two.
        if !self.capture.load(Ordering::Relaxed) {
            return;
        }
        self.record_captured(stripe, log, key, captured);
    }

    #[inline(never)]
    fn record_captured(
        &self,
        stripe: &super::Stripe,
        log: &mut ChangeLog,
        key: &[u8],
        captured: impl FnOnce() -> Captured,
    ) {
        // No store-wide counter is touched per write (it would bounce one
        // cache line between every core): the statistics below count the
        // logs when asked.
        match log.record(key, self.change_cap, captured) {
            Recorded::Nothing => return,
            Recorded::Added => {}
            Recorded::Overflowed => {
                // Relaxed: a statistic; overflows are rare by design.
                self.overflows.fetch_add(1, Ordering::Relaxed);
            }
        }
        stripe.flag_pending();
    }

    /// Records, under the stripe lock the caller holds, that the stripe
    /// evicted live keys: it is sent whole.
    pub(super) fn record_eviction(&self, stripe: &super::Stripe, log: &mut ChangeLog) {
        if !self.capture.load(Ordering::Relaxed) || log.resync.is_some() {
            return;
        }
        log.clear(Some(Resync::Evicted));
        stripe.flag_pending();
    }

    /// Starts recording changes and marks every stripe for a resync, so the
    /// next drains send the whole store, then the changes made since each
    /// stripe was sent. Idempotent; also how a full sync starts over.
    pub fn start_capture(&self) {
        // Relaxed: published to checks by the stripe locks taken below.
        self.capture.store(true, Ordering::Relaxed);
        for stripe in self.stripes.iter() {
            let mut locked = stripe.lock();
            locked.changes.clear(Some(Resync::Full));
            stripe.pending.store(true, Ordering::Release);
        }
    }

    /// Stops recording and drops every log.
    pub fn stop_capture(&self) {
        self.capture.store(false, Ordering::Relaxed);
        for stripe in self.stripes.iter() {
            let mut locked = stripe.lock();
            locked.changes.clear(None);
            stripe.pending.store(false, Ordering::Relaxed);
        }
    }

    /// The capture's numbers. Counts the logs stripe by stripe (one lock
    /// each): for status and metrics, not the request path.
    pub fn capture_stats(&self) -> CaptureStats {
        let buffered = self.stripes.iter().map(|s| s.lock().changes.len()).sum();
        // Relaxed: statistics.
        CaptureStats {
            capturing: self.capture.load(Ordering::Relaxed),
            buffered,
            overflows: self.overflows.load(Ordering::Relaxed),
            stripe_resyncs: self.stripe_resyncs.load(Ordering::Relaxed),
        }
    }

    /// The most records the change logs may hold in all.
    pub fn change_capacity(&self) -> usize {
        self.change_cap.saturating_mul(self.stripes.len())
    }

    /// Takes what stripe `index` has for the replication sender: per key
    /// that changed since the last drain, the last state recorded in each
    /// table it wrote, or the whole stripe when it is marked for resync.
    /// Holds the stripe lock once, only to take the log (or copy the
    /// stripe); the tables are not read for a log.
    pub fn drain_stripe(&self, index: usize, now: Nanos) -> Drained {
        self.drain_stripe_into(index, now, &mut LogBuffer::default())
    }

    /// [`Store::drain_stripe`], leaving the list of `spare` (a log an
    /// earlier drain emptied, [`Changes::recycle`]) as the stripe's next
    /// log: what the sender calls, pass after pass.
    pub fn drain_stripe_into(&self, index: usize, now: Nanos, spare: &mut LogBuffer) -> Drained {
        let stripe = &self.stripes[index & self.mask];
        // Acquire: pairs with the Release in `record_change`. Cleared
        // before locking, so a write recorded after our lock is flagged
        // anew. A plain load first: most stripes are idle, and a load
        // leaves the line shared with the checkers. A stale `false` only
        // delays the stripe to the next pass (the flag stays set).
        if !stripe.pending.load(Ordering::Relaxed) || !stripe.pending.swap(false, Ordering::Acquire)
        {
            return Drained::Nothing;
        }
        let changes = {
            let mut locked = stripe.lock();
            if let Some(cause) = locked.changes.resync.take() {
                let whole = live_entries(&locked.tables, now);
                drop(locked);
                if cause == Resync::Overflow {
                    self.stripe_resyncs.fetch_add(1, Ordering::Relaxed);
                }
                return Drained::Whole(whole);
            }
            let room = log::room_after(locked.changes.len()).min(self.change_cap);
            locked.changes.take(room, spare)
        };
        if changes.changes.is_empty() {
            return Drained::Nothing;
        }
        // Folded outside the lock: the checks wait for none of it.
        Drained::Changes(Changes::new(changes, now))
    }

    /// Applies a replicated key (standby side).
    pub fn apply(&self, write: &KeyWrite) {
        let hash = self.hash(&write.key);
        let mut locked = self.stripe(Slot::of(&write.key)).lock();
        apply_to(&mut locked.tables, &self.hasher, hash, write);
    }

    /// Applies a frame's replicated keys in order (standby side), as
    /// [`Store::apply`] one by one would, but with each key's table slot
    /// fetched a few keys (`APPLY_AHEAD`) before it is written. Keys of a
    /// large store are a cache miss each, and a standby applying them one
    /// after the other waited on every miss in turn: half of its CPU,
    /// which was 31% of a core at 615,000 checks a second.
    pub fn apply_all(&self, writes: &[KeyWrite]) {
        let spots: Vec<Spot> = writes.iter().map(|w| self.spot(&w.key)).collect();
        let fetch = |i: usize| {
            if let (Some(write), Some(&spot)) = (writes.get(i), spots.get(i)) {
                if let Some(algorithm) = write.algorithm() {
                    self.prefetch(&write.key, spot, algorithm);
                }
            }
        };
        (0..APPLY_AHEAD).for_each(fetch);
        // A stripe's keys come together (the primary drains stripe by
        // stripe): one lock for each run of them, not one per key. Runs
        // only coalesce when this store has no more stripes than the
        // primary's; with more, each key still gets its own right lock.
        let mut held: Option<(usize, Guard<'_>)> = None;
        for (i, (write, spot)) in writes.iter().zip(&spots).enumerate() {
            fetch(i + APPLY_AHEAD);
            let index = usize::from(spot.slot.get()) & self.mask;
            if held.as_ref().is_none_or(|(at, _)| *at != index) {
                // The last run's lock is let go before the next is taken
                // (never two stripes held at once).
                drop(held.take());
                held = Some((index, self.stripes[index].lock()));
            }
            let (_, locked) = held.as_mut().expect("locked just above");
            apply_to(&mut locked.tables, &self.hasher, spot.hash, write);
        }
    }

    /// Replaces everything held for the slots `s` with `s % slot_mod ==
    /// slot_rem` by `writes` (standby side: a snapshot unit). Writes whose
    /// key is not in those slots are skipped and counted in the result.
    pub fn replace_slots(&self, slot_mod: u16, slot_rem: u16, writes: &[KeyWrite]) -> usize {
        let slot_mod = usize::from(slot_mod.max(1));
        let slot_rem = usize::from(slot_rem) % slot_mod;
        let in_set = |key: &[u8]| usize::from(Slot::of(key).get()) % slot_mod == slot_rem;
        let n = self.stripes.len();
        // Stripes that hold slots of the set: those congruent to slot_rem
        // modulo the smaller of the two powers of two.
        let step = slot_mod.min(n);
        let mut skipped = 0;
        let mut by_stripe: Vec<Vec<&KeyWrite>> = vec![Vec::new(); n / step];
        for write in writes {
            if !in_set(&write.key) {
                skipped += 1;
                continue;
            }
            let stripe = usize::from(Slot::of(&write.key).get()) & self.mask;
            by_stripe[stripe / step].push(write);
        }
        for (k, index) in (slot_rem % step..n).step_by(step).enumerate() {
            let mut locked = self.stripes[index].lock();
            locked.tables.retain_keys(|key| !in_set(key));
            for write in &by_stripe[k] {
                let hash = self.hash(&write.key);
                apply_to(&mut locked.tables, &self.hasher, hash, write);
            }
        }
        skipped
    }
}

fn apply_to(tables: &mut Tables, hasher: &ahash::RandomState, hash: u64, write: &KeyWrite) {
    use super::tables::Table;
    for (table, change) in [
        (Table::Buckets, &write.bucket),
        (Table::Others, &write.other),
    ] {
        match change {
            TableWrite::Keep => {}
            TableWrite::Remove => {
                tables.remove(table, hash, &write.key);
            }
            TableWrite::Put(entry) => tables.put(hasher, hash, &write.key, entry.clone()),
        }
    }
}

/// Copies every live entry of one stripe.
fn live_entries(tables: &Tables, now: Nanos) -> Vec<(StoredKey, Entry)> {
    let mut out = Vec::with_capacity(tables.len());
    tables.for_each(|key, entry| {
        if entry.expires_at > now {
            out.push((StoredKey::new(key), entry));
        }
    });
    out
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests;
