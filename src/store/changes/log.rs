//! One stripe's change log: the states its writes left, in write order, and
//! how a drain folds them into one write per key.
//!
//! A write records what it left in the table(s) it wrote ([`Captured`]),
//! under the stripe lock it holds, so the log is the stripe's writes in the
//! order the lock serialised them. The drain keeps, per key and per table,
//! the last state recorded ([`Changes`]): the state the key holds now, as
//! long as every write is recorded. A log with no key twice (a fingerprint
//! per record tells) needs no folding and is sent as it is. Nothing is
//! read back from the tables, which is the point: the drain neither takes
//! the lock again nor probes the tables once per key (two cache misses per
//! key on a large store).

use super::{Entry, KeyState, StoredKey, TableWrite};
use crate::algorithm::State;
use crate::clock::Nanos;
use crate::store::tables::{Table, Tables};

/// What one write left in the tables of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) enum Captured {
    /// The key's state in the table of its algorithm (a token bucket's in
    /// [`Table::Buckets`], any other in [`Table::Others`]) is now this.
    Put(Entry),
    /// The key holds no state in this table any more.
    Removed(Table),
    /// The key holds no state at all (a reset, a slot moved away).
    RemovedAll,
}

impl Captured {
    /// What `key` holds in `table` now: for a write that cannot tell what
    /// it left (read under the same lock, just after the write).
    pub(in crate::store) fn current(tables: &Tables, table: Table, hash: u64, key: &[u8]) -> Self {
        match tables.find(table, hash, key) {
            Some(entry) => Captured::Put(entry),
            None => Captured::Removed(table),
        }
    }

    /// Whether this write says all that `earlier` said about the key (it
    /// writes every table `earlier` wrote), so `earlier` may be dropped.
    fn covers(&self, earlier: &Captured) -> bool {
        match self {
            Captured::RemovedAll => true,
            _ => match (self.table(), earlier.table()) {
                (Some(now), Some(then)) => now == then,
                _ => false,
            },
        }
    }

    /// The one table this write wrote (None: both).
    fn table(&self) -> Option<Table> {
        match self {
            Captured::Put(entry) => Some(table_of(entry)),
            Captured::Removed(table) => Some(*table),
            Captured::RemovedAll => None,
        }
    }
}

/// The table a state is stored in ([`super::super::tables`]).
fn table_of(entry: &Entry) -> Table {
    match entry.state {
        State::TokenBucket { .. } => Table::Buckets,
        _ => Table::Others,
    }
}

/// One recorded write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Change {
    key: StoredKey,
    captured: Captured,
}

// One cache line: what `--repl-buffer-cap` bounds, per record.
const _: () = assert!(std::mem::size_of::<Change>() == 64);

/// Most records of a taken log fetched at once before the sender reads
/// them (2 KB): a stripe's log holds a handful per pass, and a burst's
/// longer logs are read in order, which the CPU's own prefetcher follows.
/// More than a core's fill buffers hold at once: the later ones queue
/// behind the first, still ahead of the sender's reads.
const FETCH_RECORDS: usize = 32;

/// The writes of one stripe since the last drain. Lives under the stripe's
/// lock, beside the tables.
#[derive(Debug, Default)]
pub(in crate::store) struct ChangeLog {
    pub(super) changes: Vec<Change>,
    /// The stripe must be sent whole, and why. `changes` stays empty
    /// meanwhile.
    pub(super) resync: Option<Resync>,
    /// One bit per key fingerprint of the records in `changes`
    /// ([`fingerprint`]): a key recorded twice always finds its bit set,
    /// so a log in which no record found its bit set holds each key once,
    /// and the drain sends it as it is, unsorted ([`Taken::distinct`]).
    seen: [u64; 4],
    /// A record found its bit set: a key may be in the log twice.
    repeats: bool,
    /// The fingerprint of the last record's key (when there is one): a
    /// write of another key skips reading that record, a line that has
    /// usually left the cache since the stripe's previous write.
    last_bit: u8,
}

/// An emptied log's list, kept by the replication sender between drains
/// and handed to the next stripe it drains ([`Changes::recycle`]): with
/// 1024 stripes drained every `--repl-flush`, a new list per stripe and
/// pass was an allocation and a free per handful of changes.
#[derive(Debug, Default)]
pub struct LogBuffer(Vec<Change>);

#[cfg(all(test, not(tollgate_loom)))]
impl LogBuffer {
    /// Records the list has room for.
    pub(super) fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

/// The room a drain of `taken` records leaves the stripe's next log
/// (before the cap): the next pass likely records about as many, give or
/// take, and with as many again of room the log seldom regrows, and
/// copies, under the lock, and a list handed on from another stripe
/// seldom falls short.
pub(super) fn room_after(taken: usize) -> usize {
    2 * taken + 8
}

/// A log taken by the drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Taken {
    pub changes: Vec<Change>,
    /// Each key is in `changes` once (false: maybe not).
    pub distinct: bool,
}

/// One of 256 bits for `key`, from its length and its first and last
/// (up to) eight bytes, where rate-limit keys differ: a few nanoseconds,
/// no full hash. Equal keys always get the same bit.
fn fingerprint(key: &[u8]) -> usize {
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w[..b.len()].copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let n = key.len();
    let head = word(&key[..n.min(8)]);
    let tail = word(&key[n.saturating_sub(8)..]);
    let mixed = (head ^ tail.rotate_left(29) ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (mixed >> 56) as usize
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resync {
    /// Capture (re)started: a full sync sends every stripe.
    Full,
    /// This stripe's log hit its cap.
    Overflow,
    /// The memory cap evicted live keys of this stripe.
    Evicted,
}

/// What recording one write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recorded {
    /// Nothing more to tell the sender: the write replaced the log's last
    /// record (the sender has not taken it yet: it takes the log under the
    /// lock this write holds), or the stripe will be sent whole.
    Nothing,
    Added,
    /// The log hit its cap: its records were let go and the stripe is
    /// marked for resync.
    Overflowed,
}

impl ChangeLog {
    /// Appends what a write left. `captured` is called only when the
    /// write is to be recorded (it may clone a state).
    pub(super) fn record(
        &mut self,
        key: &[u8],
        cap: usize,
        captured: impl FnOnce() -> Captured,
    ) -> Recorded {
        if self.resync.is_some() {
            return Recorded::Nothing;
        }
        // A hot key written many times between two drains: the newer
        // state replaces the last record in place when it says all the
        // older one said, without searching the whole log (the drain
        // folds the rest).
        let bit = fingerprint(key);
        if usize::from(self.last_bit) == bit {
            if let Some(last) = self.changes.last_mut() {
                if last.key.is(key) {
                    let captured = captured();
                    if captured.covers(&last.captured) {
                        last.captured = captured;
                        return Recorded::Nothing;
                    }
                    return self.push(key, bit, captured, cap);
                }
            }
        }
        self.push(key, bit, captured(), cap)
    }

    /// Appends a record of `key`, whose fingerprint is `bit`.
    fn push(&mut self, key: &[u8], bit: usize, captured: Captured, cap: usize) -> Recorded {
        if self.changes.len() >= cap {
            // Free the memory, not only the length: this is the bound.
            self.clear(Some(Resync::Overflow));
            return Recorded::Overflowed;
        }
        if self.changes.len() == self.changes.capacity() {
            // Grown by doubling, but never past the cap: the cap bounds the
            // memory a log holds, not only its length.
            let more = self.changes.len().max(4).min(cap - self.changes.len());
            self.changes.reserve_exact(more);
        }
        let (word, mask) = (bit / 64, 1u64 << (bit % 64));
        self.repeats |= self.seen[word] & mask != 0;
        self.seen[word] |= mask;
        // A fingerprint is one of 256 values.
        self.last_bit = bit as u8;
        // The key is written into the record where it stays (see
        // `StoredKey::fill`).
        self.changes.push(Change {
            key: StoredKey::EMPTY,
            captured,
        });
        if let Some(last) = self.changes.last_mut() {
            last.key.fill(key);
        }
        Recorded::Added
    }

    /// Takes the records for the drain, leaving in their place the empty
    /// list `spare` (a list an earlier drain emptied: no allocation per
    /// stripe and pass), or a new one with room for `room` records when
    /// `spare` has less.
    pub(super) fn take(&mut self, room: usize, spare: &mut LogBuffer) -> Taken {
        let distinct = !std::mem::take(&mut self.repeats);
        self.seen = [0; 4];
        let mut next = std::mem::take(&mut spare.0);
        debug_assert!(next.is_empty(), "a spare list still holds records");
        next.clear();
        if next.capacity() < room {
            next = Vec::with_capacity(room);
        }
        Taken {
            changes: std::mem::replace(&mut self.changes, next),
            distinct,
        }
    }

    /// Records waiting for the sender.
    pub(super) fn len(&self) -> usize {
        self.changes.len()
    }

    /// Drops every record and whatever resync was due.
    pub(super) fn clear(&mut self, resync: Option<Resync>) {
        self.changes = Vec::new();
        self.resync = resync;
        self.seen = [0; 4];
        self.repeats = false;
    }
}

/// What a stripe's writes left since the last drain, one write per key:
/// per table, the last state recorded; a table no record wrote is left as
/// it is ([`TableWrite::Keep`]). A state that has expired by the drain is
/// sent as a removal (an expired state is absent everywhere). A log that
/// holds each key once is folded record by record as it is iterated, in
/// log order, with no copy of the log; any other is folded at once, its
/// keys sorted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changes(Folding);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Folding {
    Distinct {
        changes: Vec<Change>,
        now: Nanos,
    },
    /// `log`: the taken list, its keys' states moved into `states` (the
    /// records left are placeholders), kept to be cleared and recycled.
    Folded {
        states: Vec<KeyState>,
        log: Vec<Change>,
    },
}

/// One key of [`Changes`], borrowed: what to send for each of its tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangedKey<'a> {
    pub key: &'a [u8],
    /// The token-bucket table.
    pub bucket: Written<'a>,
    /// The table of any other algorithm.
    pub other: Written<'a>,
}

/// A [`TableWrite`], borrowed from the log it was folded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written<'a> {
    Keep,
    Remove,
    Put(&'a Entry),
}

#[cfg(test)]
impl From<Written<'_>> for TableWrite {
    /// An owned copy.
    fn from(written: Written<'_>) -> Self {
        match written {
            Written::Keep => TableWrite::Keep,
            Written::Remove => TableWrite::Remove,
            Written::Put(entry) => TableWrite::Put(entry.clone()),
        }
    }
}

#[cfg(test)]
impl From<ChangedKey<'_>> for super::KeyWrite {
    /// An owned copy, to apply as a standby would.
    fn from(changed: ChangedKey<'_>) -> Self {
        Self {
            key: bytes::Bytes::copy_from_slice(changed.key),
            bucket: changed.bucket.into(),
            other: changed.other.into(),
        }
    }
}

impl<'a> From<&'a TableWrite> for Written<'a> {
    fn from(write: &'a TableWrite) -> Self {
        match write {
            TableWrite::Keep => Written::Keep,
            TableWrite::Remove => Written::Remove,
            TableWrite::Put(entry) => Written::Put(entry),
        }
    }
}

impl Changes {
    pub(super) fn new(taken: Taken, now: Nanos) -> Self {
        // Written by checks up to a pass ago, these records have mostly
        // left the cache; fetched together, the sender waits on them
        // together rather than record after record (reading them was 2.0%
        // of the server's CPU with a standby attached, nearly all of it
        // waiting). A key too long to be held inline is a miss of its own,
        // not fetched here (rare: over 22 bytes).
        let records = taken.changes.len().min(FETCH_RECORDS);
        crate::prefetch::range(
            taken.changes.as_ptr() as usize,
            records * std::mem::size_of::<Change>(),
        );
        Self(if taken.distinct {
            // The usual case (a stripe sees a few keys per pass): nothing
            // to fold, so no sort and no key comparisons.
            Folding::Distinct {
                changes: taken.changes,
                now,
            }
        } else {
            let mut log = taken.changes;
            let states = coalesce(&mut log, now);
            Folding::Folded { states, log }
        })
    }

    /// Each key once, borrowed from the log: what the sender encodes, with
    /// no record moved out of the log or dropped one by one (the log's
    /// list is recycled whole, [`Changes::recycle`]).
    pub fn keys(&self) -> Keys<'_> {
        Keys(match &self.0 {
            Folding::Distinct { changes, now } => KeysOf::Distinct(changes.iter(), *now),
            Folding::Folded { states, .. } => KeysOf::Folded(states.iter()),
        })
    }

    /// Empties the log into `spare`, for the next stripe's drain, unless
    /// `spare` already holds a list at least as large. A list more than
    /// four times as large as this drain called for (the room a drain
    /// leaves, twice its records and some) is let go instead, here,
    /// outside any lock: lists are handed from stripe to stripe, and one a
    /// burst grew would otherwise go round for good.
    pub fn recycle(self, spare: &mut LogBuffer) {
        let mut log = match self.0 {
            Folding::Distinct { changes, .. } => changes,
            Folding::Folded { log, .. } => log,
        };
        let called_for = room_after(log.len());
        if log.capacity() / 4 > called_for {
            return;
        }
        if log.capacity() >= spare.0.capacity() {
            log.clear();
            spare.0 = log;
        }
    }
}

/// The keys of [`Changes`], each once, borrowed ([`Changes::keys`]).
pub struct Keys<'a>(KeysOf<'a>);

enum KeysOf<'a> {
    Distinct(std::slice::Iter<'a, Change>, Nanos),
    Folded(std::slice::Iter<'a, KeyState>),
}

impl<'a> Iterator for Keys<'a> {
    type Item = ChangedKey<'a>;

    fn next(&mut self) -> Option<ChangedKey<'a>> {
        match &mut self.0 {
            KeysOf::Distinct(changes, now) => changes.next().map(|change| change.written(*now)),
            KeysOf::Folded(states) => states.next().map(|state| ChangedKey {
                key: state.key.as_bytes(),
                bucket: (&state.bucket).into(),
                other: (&state.other).into(),
            }),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.0 {
            KeysOf::Distinct(changes, _) => changes.size_hint(),
            KeysOf::Folded(states) => states.size_hint(),
        }
    }
}

impl Change {
    /// What this record alone says of its key's tables, at a drain at
    /// `now` (as [`fold`] of it into a key with no other record).
    fn written(&self, now: Nanos) -> ChangedKey<'_> {
        // As `fold` does: a state expired by the drain is sent as a
        // removal.
        let (table, written) = match &self.captured {
            Captured::Put(entry) if entry.expires_at > now => {
                (Some(table_of(entry)), Written::Put(entry))
            }
            Captured::Put(entry) => (Some(table_of(entry)), Written::Remove),
            Captured::Removed(table) => (Some(*table), Written::Remove),
            Captured::RemovedAll => (None, Written::Remove),
        };
        let (bucket, other) = match table {
            Some(Table::Buckets) => (written, Written::Keep),
            Some(Table::Others) => (Written::Keep, written),
            None => (written, written),
        };
        ChangedKey {
            key: self.key.as_bytes(),
            bucket,
            other,
        }
    }
}

/// Folds a log that may hold a key several times, in log order, into one
/// write per key (see [`Changes`]). Keys come out sorted.
fn coalesce(changes: &mut [Change], now: Nanos) -> Vec<KeyState> {
    // Sorted by key then log position: each key's records together, in
    // log order. Positions are sorted, not the records: a record is 64
    // bytes to move, a position 4.
    // On the stack for the usual handful: no allocation per stripe drained.
    let mut order: smallvec::SmallVec<[u32; 64]> = (0..changes.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| {
        let key = |i: u32| changes[i as usize].key.as_bytes();
        key(a).cmp(key(b)).then(a.cmp(&b))
    });
    let mut out: Vec<KeyState> = Vec::with_capacity(changes.len());
    for i in order {
        let Change { key, captured } = &mut changes[i as usize];
        // Taken out of the log, which is dropped after: no clone.
        let captured = std::mem::replace(captured, Captured::RemovedAll);
        if out
            .last()
            .is_none_or(|s| s.key.as_bytes() != key.as_bytes())
        {
            out.push(KeyState {
                key: std::mem::replace(
                    key,
                    StoredKey::Inline {
                        len: 0,
                        bytes: [0; super::super::key::INLINE],
                    },
                ),
                bucket: TableWrite::Keep,
                other: TableWrite::Keep,
            });
        }
        let state = out.last_mut().expect("a key's state, pushed above");
        fold(state, captured, now);
    }
    out
}

/// Folds one record, the latest so far, into its key's state.
fn fold(state: &mut KeyState, captured: Captured, now: Nanos) {
    match captured {
        Captured::Put(entry) => {
            let table = table_of(&entry);
            *state.table_mut(table) = if entry.expires_at > now {
                TableWrite::Put(entry)
            } else {
                TableWrite::Remove
            };
        }
        Captured::Removed(table) => *state.table_mut(table) = TableWrite::Remove,
        Captured::RemovedAll => {
            state.bucket = TableWrite::Remove;
            state.other = TableWrite::Remove;
        }
    }
}
