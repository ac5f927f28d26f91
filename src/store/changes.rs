//! Change capture for replication: which keys changed since the last drain.
//!
//! ```text
//!   check (holds the stripe lock) --write--> tables
//!                                 --key----> ChangeLog (same lock)  --pending=true
//!   replication sender: pending.swap(false) -> lock: take the keys -> unlock
//!                       dedup -> lock: read each key's state now -> unlock -> frame
//! ```
//!
//! Invariants:
//! - a key is recorded under the stripe lock that its write holds, so
//!   capturing costs no extra lock; the capture switch is read under that
//!   lock too, so a write that comes after [`Store::start_capture`] marked
//!   its stripe is always recorded (or covered by the stripe's resync);
//! - the sender reads a key's state when it drains, under the lock, so it
//!   sends the *latest* state, and a write after that read records the key
//!   again (and sets `pending`) for the next drain: no change is lost, and
//!   per key the states drained are in the order they were written (the
//!   loom model `loom-tests/tests/replication.rs` checks both);
//! - a stripe's log holds at most `cap` keys: past it the keys are dropped
//!   and the stripe is marked for **resync** (sent whole by the next
//!   drain), so a slow standby can never grow the primary's memory; a
//!   stripe marked for resync records nothing more until it is sent.

use super::{Entry, Store, StoredKey, Tables};
use crate::clock::Nanos;
use crate::slot::Slot;
use crate::sync::Ordering;
use bytes::Bytes;

/// The keys of one stripe changed since the last drain. Lives under the
/// stripe's lock, beside the tables.
#[derive(Debug, Default)]
pub(super) struct ChangeLog {
    keys: Vec<StoredKey>,
    /// The stripe must be sent whole, and why. `keys` stays empty meanwhile.
    resync: Option<Resync>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resync {
    /// Capture (re)started: a full sync sends every stripe.
    Full,
    /// This stripe's log hit its cap.
    Overflow,
    /// The memory cap evicted live keys of this stripe.
    Evicted,
}

/// What recording one key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Nothing more to remember (already there, or the stripe will be sent
    /// whole).
    Nothing,
    Added,
    /// The log hit its cap: its keys were let go and the stripe is marked
    /// for resync.
    Overflowed,
}

impl ChangeLog {
    pub(super) fn record(&mut self, key: &[u8], cap: usize) -> Recorded {
        if self.resync.is_some() {
            return Recorded::Nothing;
        }
        // A hot key charged many times between two drains: keep one copy
        // without searching the whole log (the drain dedups the rest).
        if self.keys.last().is_some_and(|k| k.as_bytes() == key) {
            return Recorded::Nothing;
        }
        if self.keys.len() >= cap {
            // Free the memory, not only the length: this is the bound.
            self.keys = Vec::new();
            self.resync = Some(Resync::Overflow);
            return Recorded::Overflowed;
        }
        self.keys.push(StoredKey::new(key));
        Recorded::Added
    }
}

impl super::Stripe {
    /// Tells the sender this stripe has something, under its lock. A busy
    /// stripe is flagged already: then only a load, no write to the shared
    /// line on every check. If the load still reads `true` although the
    /// sender has just cleared the flag, the sender has not taken the lock
    /// yet (we hold it, and it locks after clearing), so it finds this key
    /// in the log. Setting it is a swap, not a store: the same here, and an
    /// RMW always sits last in the flag's modification order, which keeps
    /// the loom model's reasoning (and ours) simple.
    fn flag_pending(&self) {
        // Acquire/AcqRel: pair with the drain's `swap(false, Acquire)`; the
        // lock already orders the keys, the flag only spares the drain
        // from locking idle stripes.
        if !self.pending.load(Ordering::Acquire) {
            self.pending.swap(true, Ordering::AcqRel);
        }
    }
}

/// One key's states after a change (`None`: the key holds no such state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    pub key: StoredKey,
    /// The token-bucket state.
    pub bucket: Option<Entry>,
    /// The state of any other algorithm.
    pub other: Option<Entry>,
}

/// What one stripe has for the replication sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    Nothing,
    /// The current states of the keys that changed, each key once.
    Changes(Vec<KeyState>),
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

/// Counters of the change capture, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaptureStats {
    pub capturing: bool,
    /// Keys waiting in the logs now.
    pub buffered: usize,
    /// Times a stripe's log hit its cap and was dropped.
    pub overflows: u64,
    /// Stripes drained whole because their log overflowed (a full sync's
    /// stripes not included).
    pub stripe_resyncs: u64,
}

impl Store {
    /// Records, under the stripe lock the caller holds, that `key` changed.
    pub(super) fn record_change(&self, stripe: &super::Stripe, log: &mut ChangeLog, key: &[u8]) {
        // Relaxed: read under the stripe lock, which `start_capture` took
        // after setting the switch, so the mutex orders the two.
        if !self.capture.load(Ordering::Relaxed) {
            return;
        }
        // No store-wide counter is touched per write (it would bounce one
        // cache line between every core): the statistics below count the
        // logs when asked.
        match log.record(key, self.change_cap) {
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
        log.keys = Vec::new();
        log.resync = Some(Resync::Evicted);
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
            locked.changes.keys = Vec::new();
            locked.changes.resync = Some(Resync::Full);
            stripe.pending.store(true, Ordering::Release);
        }
    }

    /// Stops recording and drops every log.
    pub fn stop_capture(&self) {
        self.capture.store(false, Ordering::Relaxed);
        for stripe in self.stripes.iter() {
            let mut locked = stripe.lock();
            locked.changes.keys = Vec::new();
            locked.changes.resync = None;
            stripe.pending.store(false, Ordering::Relaxed);
        }
    }

    /// The capture's numbers. Counts the logs stripe by stripe (one lock
    /// each): for status and metrics, not the request path.
    pub fn capture_stats(&self) -> CaptureStats {
        let buffered = self
            .stripes
            .iter()
            .map(|s| s.lock().changes.keys.len())
            .sum();
        // Relaxed: statistics.
        CaptureStats {
            capturing: self.capture.load(Ordering::Relaxed),
            buffered,
            overflows: self.overflows.load(Ordering::Relaxed),
            stripe_resyncs: self.stripe_resyncs.load(Ordering::Relaxed),
        }
    }

    /// The most keys the change logs may hold in all.
    pub fn change_capacity(&self) -> usize {
        self.change_cap.saturating_mul(self.stripes.len())
    }

    /// Takes what stripe `index` has for the replication sender: the
    /// current state of each key that changed since the last drain, or the
    /// whole stripe when it is marked for resync. Holds the stripe lock
    /// twice, each time only for the copying.
    pub fn drain_stripe(&self, index: usize, now: Nanos) -> Drained {
        let stripe = &self.stripes[index & self.mask];
        // Acquire: pairs with the Release in `record_change`. Cleared
        // before locking, so a key recorded after our lock is flagged anew.
        // A plain load first: most stripes are idle, and a load leaves the
        // line shared with the checkers. A stale `false` only delays the
        // stripe to the next pass (the flag stays set).
        if !stripe.pending.load(Ordering::Relaxed) || !stripe.pending.swap(false, Ordering::Acquire)
        {
            return Drained::Nothing;
        }
        let mut keys = {
            let mut locked = stripe.lock();
            if let Some(cause) = locked.changes.resync.take() {
                let whole = live_entries(&locked.tables, now);
                drop(locked);
                if cause == Resync::Overflow {
                    self.stripe_resyncs.fetch_add(1, Ordering::Relaxed);
                }
                return Drained::Whole(whole);
            }
            std::mem::take(&mut locked.changes.keys)
        };
        if keys.is_empty() {
            return Drained::Nothing;
        }
        // Coalesce outside the lock: each key once, its state read below.
        keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        keys.dedup_by(|a, b| a.as_bytes() == b.as_bytes());
        let hashes: Vec<u64> = keys.iter().map(|k| self.hash(k.as_bytes())).collect();
        let locked = stripe.lock();
        let states = keys
            .into_iter()
            .zip(hashes)
            .map(|(key, hash)| {
                let (bucket, other) = locked.tables.find_both(hash, key.as_bytes());
                let live = |e: Option<Entry>| e.filter(|e| e.expires_at > now);
                KeyState {
                    key,
                    bucket: live(bucket),
                    other: live(other),
                }
            })
            .collect();
        Drained::Changes(states)
    }

    /// Applies a replicated key (standby side).
    pub fn apply(&self, write: &KeyWrite) {
        let hash = self.hash(&write.key);
        let mut locked = self.stripe(Slot::of(&write.key)).lock();
        apply_to(&mut locked.tables, &self.hasher, hash, write);
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
mod tests {
    use super::*;
    use crate::algorithm::State;
    use crate::store::{Mode, ResolvedPair, StoreConfig};
    use tollgate_protocol::{Algorithm, Limit};

    const S: u64 = 1_000_000_000;

    fn store(stripes: usize, cap: usize) -> Store {
        Store::new(StoreConfig {
            stripes,
            change_buffer_cap: cap,
            ..StoreConfig::default()
        })
    }

    fn tb(key: &str) -> ResolvedPair<'_> {
        ResolvedPair::new(
            key.as_bytes(),
            Limit {
                algorithm: Algorithm::TokenBucket,
                count: 10,
                period_ms: 1000,
                burst: 10,
            },
            1,
        )
    }

    fn fw(key: &str) -> ResolvedPair<'_> {
        ResolvedPair::new(
            key.as_bytes(),
            Limit {
                algorithm: Algorithm::FixedWindow,
                count: 10,
                period_ms: 1000,
                burst: 0,
            },
            1,
        )
    }

    fn stripe_of(store: &Store, key: &str) -> usize {
        usize::from(Slot::of(key.as_bytes()).get()) & store.mask
    }

    type Whole = Vec<(usize, Vec<(StoredKey, Entry)>)>;

    /// Drains every stripe; the changes, and the entries of whole stripes.
    fn drain_all(store: &Store, now: Nanos) -> (Vec<KeyState>, Whole) {
        let mut changes = Vec::new();
        let mut whole = Vec::new();
        for i in 0..store.stripe_count() {
            match store.drain_stripe(i, now) {
                Drained::Nothing => {}
                Drained::Changes(c) => changes.extend(c),
                Drained::Whole(w) => whole.push((i, w)),
            }
        }
        (changes, whole)
    }

    #[test]
    fn nothing_is_recorded_until_capture_starts() {
        let s = store(16, 8);
        s.check(&[tb("a")], S, Mode::Charge);
        assert_eq!(drain_all(&s, S), (vec![], vec![]));
        assert_eq!(s.capture_stats().buffered, 0);
    }

    #[test]
    fn capture_sends_every_stripe_whole_then_the_latest_state_of_each_changed_key() {
        let s = store(4, 8);
        s.check(&[tb("before")], S, Mode::Charge);
        s.start_capture();
        let (changes, whole) = drain_all(&s, S);
        assert!(changes.is_empty());
        assert_eq!(whole.len(), 4, "every stripe, even empty ones");
        let sent: Vec<_> = whole.iter().flat_map(|(_, w)| w.iter()).collect();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0.as_bytes(), b"before");

        // Three charges of one key and one of another: each key once, as
        // it is now.
        for _ in 0..3 {
            s.check(&[tb("{t}x")], S, Mode::Charge);
        }
        s.check(&[fw("{t}y")], S, Mode::Charge);
        s.check(&[tb("{t}x")], S, Mode::Peek);
        let (changes, whole) = drain_all(&s, S);
        assert!(whole.is_empty());
        assert_eq!(changes.len(), 2);
        let x = changes
            .iter()
            .find(|c| c.key.as_bytes() == b"{t}x")
            .unwrap();
        assert_eq!(x.bucket, s.get(b"{t}x", S));
        assert_eq!(x.other, None);
        let y = changes
            .iter()
            .find(|c| c.key.as_bytes() == b"{t}y")
            .unwrap();
        assert!(matches!(
            y.other.as_ref().unwrap().state,
            State::FixedWindow(_)
        ));
        assert_eq!(s.capture_stats().buffered, 0);
        // Nothing more until something changes.
        assert_eq!(drain_all(&s, S), (vec![], vec![]));

        // A reset is a deletion.
        assert!(s.remove(b"{t}x", S));
        let (changes, _) = drain_all(&s, S);
        assert_eq!(
            changes,
            vec![KeyState {
                key: StoredKey::new(b"{t}x"),
                bucket: None,
                other: None
            }]
        );
    }

    #[test]
    fn an_overflowing_stripe_drops_its_keys_and_is_sent_whole() {
        let s = store(4, 2);
        s.start_capture();
        drain_all(&s, S);
        for k in ["{t}1", "{t}2", "{t}3", "{t}4"] {
            s.check(&[tb(k)], S, Mode::Charge);
        }
        let stats = s.capture_stats();
        assert_eq!(stats.overflows, 1);
        assert_eq!(stats.buffered, 0, "the overflowing log was dropped");
        let (changes, whole) = drain_all(&s, S);
        assert!(changes.is_empty());
        assert_eq!(whole.len(), 1);
        assert_eq!(whole[0].0, stripe_of(&s, "{t}1"));
        assert_eq!(whole[0].1.len(), 4);
        assert_eq!(s.capture_stats().stripe_resyncs, 1);
        // Recording resumes after the stripe was sent.
        s.check(&[tb("{t}1")], S, Mode::Charge);
        let (changes, _) = drain_all(&s, S);
        assert_eq!(changes.len(), 1);
    }

    #[test]
    fn stop_capture_drops_everything() {
        let s = store(4, 8);
        s.start_capture();
        s.check(&[tb("a")], S, Mode::Charge);
        s.stop_capture();
        assert_eq!(s.capture_stats().buffered, 0);
        assert_eq!(drain_all(&s, S), (vec![], vec![]));
    }

    /// A standby with another stripe count rebuilds the primary's content
    /// from its whole stripes, and loses what the primary does not hold.
    #[test]
    fn replacing_slots_copies_the_primary_whatever_the_stripe_counts() {
        let primary = store(16, 8);
        let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            let pair = if i % 2 == 0 { tb(k) } else { fw(k) };
            primary.check(std::slice::from_ref(&pair), S, Mode::Charge);
            primary.check(&[pair], S, Mode::Charge);
        }
        primary.start_capture();
        let (_, whole) = drain_all(&primary, S);
        for standby_stripes in [1, 4, 16, 64] {
            let standby = store(standby_stripes, 8);
            // Stale state the primary no longer holds.
            standby.check(&[tb("gone")], S, Mode::Charge);
            standby.check(&[fw("k1")], S, Mode::Charge);
            for (i, entries) in &whole {
                let writes: Vec<KeyWrite> = entries
                    .iter()
                    .map(|(k, e)| {
                        let put = TableWrite::Put(e.clone());
                        let (bucket, other) = match e.state {
                            State::TokenBucket { .. } => (put, TableWrite::Keep),
                            _ => (TableWrite::Keep, put),
                        };
                        KeyWrite {
                            key: Bytes::copy_from_slice(k.as_bytes()),
                            bucket,
                            other,
                        }
                    })
                    .collect();
                let skipped = standby.replace_slots(16, *i as u16, &writes);
                assert_eq!(skipped, 0);
            }
            for k in &keys {
                assert_eq!(
                    standby.get(k.as_bytes(), S),
                    primary.get(k.as_bytes(), S),
                    "{k} with {standby_stripes} stripes"
                );
            }
            assert_eq!(standby.get(b"gone", S), None);
            assert_eq!(standby.len(), primary.len());
        }
    }
}
