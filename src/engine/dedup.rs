//! The server's memory of CHECK2 answers by idempotency key, so that a
//! retried check is answered the same and never charged twice
//! (PROTOCOL.md §5, "Safe retries").
//!
//! Invariants:
//! - a key is looked up and, when unknown, evaluated and remembered under
//!   one lock (its shard's), so two copies of a check arriving at once on
//!   two connections are evaluated once; lock order is always this shard,
//!   then the store's stripes (the store never calls back here);
//! - only decisions are remembered: an error (status 2) charged nothing,
//!   so a retry is evaluated afresh;
//! - an answer is given back only to the check it answered, from the
//!   client it answered: each entry holds a fingerprint of the owner (what
//!   its connection authenticated with) and of the check (every pair's
//!   key, limit and cost); the same key with another fingerprint is
//!   refused IdempotencyKeyReused, neither answered nor evaluated, and the
//!   entry stays for its owner's retries;
//! - an entry answers retries for `window` after it was remembered (the
//!   time of the frame that charged it); after that it is as if unknown;
//! - memory is bounded: each shard holds at most its share of `capacity`
//!   keys, in two generations; when the young one holds half the share,
//!   the old one is forgotten whole (those inside their window counted)
//!   and the young one becomes the old. The keys forgotten are always
//!   older than every key kept, and a new key costs two lookups and an
//!   insert (one cache miss each at a full memory), where keeping keys in
//!   order and forgetting the single oldest cost two more misses per check;
//! - the insert goes where the young generation's lookup ended
//!   ([`generation::Probe`]), looked up again only when making room
//!   emptied it: no other check can remember the key in between, as both
//!   happen under the shard's lock.

use super::Privilege;
use crate::clock::Nanos;
use ahash::RandomState;
use generation::Generation;
use parking_lot::Mutex;
use prometheus::{IntCounter, Registry};
use std::hash::{BuildHasher, Hash, Hasher};
// std's atomics even under loom (`crate::sync`): a hint synchronises
// nothing.
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;
use tollgate_protocol::{CheckResult, ErrorCode, IdempotencyKey, Pair};

mod generation;

/// Shards of the memory: enough that connections on different cores rarely
/// wait for one another (a lock is held for one check's evaluation).
const SHARDS: usize = 64;

/// What the memory counts.
#[derive(Debug, Clone)]
pub(crate) struct DedupMetrics {
    /// `tollgate_dedup_replayed_total`: retries answered from memory.
    replayed: IntCounter,
    /// `tollgate_dedup_evicted_total`: keys forgotten inside their window
    /// because the memory was full.
    evicted: IntCounter,
    /// `tollgate_dedup_refused_total`: keys reused by another client or
    /// for another check, refused.
    refused: IntCounter,
}

impl DedupMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let replayed = IntCounter::new(
            "tollgate_dedup_replayed_total",
            "CHECK2 checks answered from memory because their idempotency key \
             was seen within the window (retries not charged again).",
        )?;
        let evicted = IntCounter::new(
            "tollgate_dedup_evicted_total",
            "Idempotency keys forgotten before their window ended because \
             the memory was full (--dedup-capacity).",
        )?;
        let refused = IntCounter::new(
            "tollgate_dedup_refused_total",
            "CHECK2 checks refused IdempotencyKeyReused: their key was \
             remembered for another client or another check.",
        )?;
        registry.register(Box::new(replayed.clone()))?;
        registry.register(Box::new(evicted.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        Ok(Self {
            replayed,
            evicted,
            refused,
        })
    }
}

/// One remembered answer, under its key.
#[derive(Clone, Copy)]
struct Entry {
    key: IdempotencyKey,
    result: CheckResult,
    /// Who asked, and what: [`RetryMemory::scope`].
    scope: u64,
    at: Nanos,
}

/// Whom a connection's remembered answers belong to: a fingerprint of
/// what it authenticated with (its HELLO token), set at the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Owner(u64);

/// One shard: the keys being remembered now, and the generation before.
/// Forgetting is by whole generations: when `young` is full (half the
/// shard) the older one is dropped and `young` takes its place, so a new
/// key costs two lookups and one insert, never a search for the oldest.
#[derive(Default)]
struct Shard {
    young: Generation,
    old: Generation,
}

impl Shard {
    /// Makes room for one more key within `cap` keys in all and `half` in
    /// the young generation; returns, when it had to (and so the young
    /// generation is a new, empty one), how many keys still inside the
    /// window were forgotten for it.
    fn make_room(&mut self, cap: usize, half: usize, now: Nanos, window: Nanos) -> Option<usize> {
        let young = self.young.len();
        if young < half && young + self.old.len() < cap {
            return None;
        }
        let mut forgotten = self.old.forget(now, window);
        std::mem::swap(&mut self.young, &mut self.old);
        if self.old.len() >= cap {
            // A shard of one key: it has no room for an older generation.
            forgotten += self.old.forget(now, window);
        }
        Some(forgotten)
    }
}

/// A shard, and where its generations' indexes start (young, old) for
/// [`RetryMemory::prefetch`] to read without the lock: written under the
/// lock whenever they move, read with relaxed loads. A stale one (the
/// generations turned over meanwhile) costs a wasted prefetch and nothing
/// else: a prefetch reads nothing into the program and never faults.
#[derive(Default)]
struct Striped {
    shard: Mutex<Shard>,
    hints: [AtomicUsize; 2],
}

impl Striped {
    fn publish(&self, shard: &Shard) {
        self.hints[0].store(shard.young.base(), Relaxed);
        self.hints[1].store(shard.old.base(), Relaxed);
    }
}

/// CHECK2 answers by idempotency key, for a bounded window and memory.
pub(crate) struct RetryMemory {
    shards: Box<[Striped]>,
    /// `hash & mask` is the slot a key's probe starts at, in every index.
    mask: usize,
    hasher: RandomState,
    window: Nanos,
    per_shard: usize,
    metrics: DedupMetrics,
}

/// How a keyed check was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answered {
    /// Evaluated now (and remembered if it was a decision).
    Fresh(CheckResult),
    /// A retry: the answer remembered under its key.
    Replayed(CheckResult),
    /// The key is remembered for another owner or another check: refused
    /// (IdempotencyKeyReused), nothing evaluated.
    Refused,
}

impl Answered {
    /// What the check is answered.
    pub fn result(self) -> CheckResult {
        match self {
            Self::Fresh(result) | Self::Replayed(result) => result,
            Self::Refused => CheckResult::Error(ErrorCode::IdempotencyKeyReused),
        }
    }
}

impl RetryMemory {
    pub fn new(window: Duration, capacity: usize, metrics: DedupMetrics) -> Self {
        let shards = (0..SHARDS).map(|_| Striped::default()).collect();
        let per_shard = capacity.div_ceil(SHARDS).max(1);
        Self {
            shards,
            mask: generation::slots_for(per_shard.div_ceil(2)) - 1,
            hasher: RandomState::new(),
            window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            per_shard,
            metrics,
        }
    }

    /// The owner of a connection that authenticated as `privilege` with
    /// `token`. A client is its token (every client of a server that
    /// requires none, with none, is one owner); nodes are one owner (their
    /// proofs differ per connection).
    pub fn owner(&self, privilege: Privilege, token: &[u8]) -> Owner {
        Owner(match privilege {
            Privilege::Client => self.hasher.hash_one((0u8, token)),
            Privilege::Node | Privilege::Region => self.hasher.hash_one(1u8),
        })
    }

    /// The fingerprint of `owner` asking for the check `pairs`: every
    /// pair's key, limit and cost, in order.
    pub fn scope(&self, owner: Owner, pairs: &[Pair]) -> u64 {
        let mut h = self.hasher.build_hasher();
        owner.0.hash(&mut h);
        pairs.len().hash(&mut h);
        for pair in pairs {
            pair.key.hash(&mut h);
            pair.limit.hash(&mut h);
            pair.cost.hash(&mut h);
        }
        h.finish()
    }

    /// The hash of `key` and its shard.
    fn shard_of(&self, key: IdempotencyKey) -> (u64, &Striped) {
        let hash = self.hasher.hash_one(key);
        // The shard from bits the generations' indexes do not use (the low
        // ones choose the home slot, the top ones are the tag).
        (hash, &self.shards[(hash >> 32) as usize % SHARDS])
    }

    /// Starts fetching, without taking a lock, the index slots that
    /// [`RetryMemory::once`] for `key` will look at first: a new key misses
    /// in both generations, and a frame's checks are prefetched before any
    /// is evaluated, so these waits overlap the store's.
    pub fn prefetch(&self, key: IdempotencyKey) {
        let (hash, striped) = self.shard_of(key);
        let offset = (hash as usize & self.mask) * generation::SLOT_SIZE;
        for hint in &striped.hints {
            let base = hint.load(Relaxed);
            if base != 0 {
                crate::prefetch::line(base + offset);
            }
        }
    }

    /// The answer remembered under `key` within the window for the same
    /// `scope` ([`RetryMemory::scope`]), a refusal when it is remembered
    /// for another, or else what `evaluate` says now (remembered, as of
    /// `now`, when it is a decision).
    pub fn once(
        &self,
        key: IdempotencyKey,
        scope: u64,
        now: Nanos,
        evaluate: impl FnOnce() -> CheckResult,
    ) -> Answered {
        let (hash, striped) = self.shard_of(key);
        let mut guard = striped.shard.lock();
        let shard = &mut *guard;
        // The young generation first: a key remembered again after it
        // expired has its newer entry there.
        let mut young = shard.young.probe(hash, key);
        let live = (shard.young.live(young, now, self.window))
            .or_else(|| shard.old.live(shard.old.probe(hash, key), now, self.window));
        if let Some(entry) = live {
            if entry.scope != scope {
                self.metrics.refused.inc();
                return Answered::Refused;
            }
            self.metrics.replayed.inc();
            return Answered::Replayed(entry.result);
        }
        // Room is made before evaluating, so the line the answer goes to is
        // fetched meanwhile (a check that ends in an error, remembered not,
        // only made it a little early).
        let (cap, half) = (self.per_shard, self.per_shard.div_ceil(2));
        if let Some(forgotten) = shard.make_room(cap, half, now, self.window) {
            // The young generation is another: the probe was of the one
            // now old (the key is not in the new one, which is empty, so
            // this lookup only finds its slot).
            young = shard.young.probe(hash, key);
            striped.publish(shard);
            if forgotten > 0 {
                self.metrics.evicted.inc_by(forgotten as u64);
            }
        }
        shard.young.prepare();
        let result = evaluate();
        if let CheckResult::Decision(_) = result {
            let entry = Entry {
                key,
                result,
                scope,
                at: now,
            };
            let first = shard.young.len() == 0;
            shard.young.put(young, hash, entry, half);
            if first {
                // Its index may be new.
                striped.publish(shard);
            }
        }
        Answered::Fresh(result)
    }
}

#[cfg(test)]
mod tests;
