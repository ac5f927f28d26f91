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
//!   order and forgetting the single oldest cost two more misses per check.

use super::Privilege;
use crate::clock::Nanos;
use ahash::RandomState;
use hashbrown::HashTable;
use parking_lot::Mutex;
use prometheus::{IntCounter, Registry};
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;
use tollgate_protocol::{CheckResult, ErrorCode, IdempotencyKey, Pair};

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

/// Keys remembered in one stretch of time: their entries in the order
/// remembered, and an index from key to entry. Appending keeps the writes
/// of a full memory sequential (the line written next is fetched while
/// the check is evaluated, [`Generation::prepare`]); the index is small
/// (4 bytes a key) and stays in cache.
#[derive(Default)]
struct Generation {
    entries: Vec<Entry>,
    /// Positions in `entries`, by the key's hash.
    index: HashTable<u32>,
    /// The latest `at` of its entries: when it is older than the window,
    /// nothing in the generation is still answering retries.
    newest: Nanos,
}

impl Generation {
    fn find(&self, hash: u64, key: IdempotencyKey) -> Option<usize> {
        let entries = &self.entries;
        (self.index)
            .find(hash, |&at| entries[at as usize].key == key)
            .map(|&at| at as usize)
    }

    /// The entry of `key` if it is still inside `window` at `now`.
    fn live(&self, hash: u64, key: IdempotencyKey, now: Nanos, window: Nanos) -> Option<&Entry> {
        let entry = &self.entries[self.find(hash, key)?];
        (now.saturating_sub(entry.at) < window).then_some(entry)
    }

    /// Starts fetching where the next entry will be written.
    fn prepare(&self) {
        if self.entries.len() < self.entries.capacity() {
            let next = self.entries.as_ptr_range().end as usize;
            crate::prefetch::line_for_write(next);
            crate::prefetch::line_for_write(next + std::mem::size_of::<Entry>() - 1);
        }
    }

    /// Remembers `entry` (its key hashed to `hash`), over an entry of the
    /// same key if there is one.
    fn put(&mut self, hash: u64, entry: Entry, hasher: &RandomState) {
        self.newest = self.newest.max(entry.at);
        if let Some(at) = self.find(hash, entry.key) {
            self.entries[at] = entry;
            return;
        }
        let at = u32::try_from(self.entries.len()).expect("a shard holds under 2^32 keys");
        self.entries.push(entry);
        let entries = &self.entries;
        self.index
            .insert_unique(hash, at, |&at| hasher.hash_one(entries[at as usize].key));
    }

    /// Empties it, returning how many of its entries were still inside
    /// `window` at `now` (forgotten early). Walks the entries only when
    /// some may be, in order.
    fn forget(&mut self, now: Nanos, window: Nanos) -> usize {
        let early = if now.saturating_sub(self.newest) >= window {
            0
        } else {
            (self.entries.iter())
                .filter(|e| now.saturating_sub(e.at) < window)
                .count()
        };
        // Keeps the allocations: the next generation fills them again.
        self.entries.clear();
        self.index.clear();
        self.newest = 0;
        early
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

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
    /// the young generation; returns how many keys still inside the window
    /// were forgotten for it.
    fn make_room(&mut self, cap: usize, half: usize, now: Nanos, window: Nanos) -> usize {
        let young = self.young.len();
        if young < half && young + self.old.len() < cap {
            return 0;
        }
        let mut forgotten = self.old.forget(now, window);
        std::mem::swap(&mut self.young, &mut self.old);
        if self.old.len() >= cap {
            // A shard of one key: it has no room for an older generation.
            forgotten += self.old.forget(now, window);
        }
        forgotten
    }
}

/// CHECK2 answers by idempotency key, for a bounded window and memory.
pub(crate) struct RetryMemory {
    shards: Box<[Mutex<Shard>]>,
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
        let shards = (0..SHARDS).map(|_| Mutex::default()).collect();
        Self {
            shards,
            hasher: RandomState::new(),
            window: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            per_shard: capacity.div_ceil(SHARDS).max(1),
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
        let hash = self.hasher.hash_one(key);
        // The shard from bits the tables do not index by (they use the low
        // bits for the bucket and the top seven for the tag).
        let index = (hash >> 32) as usize % self.shards.len();
        let mut shard = self.shards[index].lock();
        // The young generation first: a key remembered again after it
        // expired has its newer entry there.
        let live = |g: &Generation| g.live(hash, key, now, self.window).copied();
        if let Some(entry) = live(&shard.young).or_else(|| live(&shard.old)) {
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
        let cap = self.per_shard;
        let forgotten = shard.make_room(cap, cap.div_ceil(2), now, self.window);
        self.metrics.evicted.inc_by(forgotten as u64);
        shard.young.prepare();
        let result = evaluate();
        if let CheckResult::Decision(_) = result {
            let entry = Entry {
                key,
                result,
                scope,
                at: now,
            };
            shard.young.put(hash, entry, &self.hasher);
        }
        Answered::Fresh(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_protocol::{Decision, ErrorCode};

    fn memory(window_ns: u64, capacity: usize) -> RetryMemory {
        let metrics = DedupMetrics::register(&Registry::new()).expect("metrics");
        RetryMemory::new(Duration::from_nanos(window_ns), capacity, metrics)
    }

    fn allowed(remaining: u64) -> CheckResult {
        CheckResult::Decision(Decision {
            allowed: true,
            shadow_denied: false,
            pair: 0,
            limit: 10,
            remaining,
            reset_after_ms: 1,
            retry_after_ms: 0,
            lease: None,
        })
    }

    /// The scope every check of these tests has, but where a test says.
    const S: u64 = 7;

    fn key(n: u128) -> IdempotencyKey {
        IdempotencyKey::from_u128(n)
    }

    #[test]
    fn a_retry_within_the_window_is_replayed_not_evaluated() {
        let m = memory(100, 1024);
        assert_eq!(
            m.once(key(1), S, 0, || allowed(9)),
            Answered::Fresh(allowed(9))
        );
        let replay = m.once(key(1), S, 99, || panic!("evaluated twice"));
        assert_eq!(replay, Answered::Replayed(allowed(9)));
        // Another key is its own check.
        assert_eq!(
            m.once(key(2), S, 99, || allowed(8)),
            Answered::Fresh(allowed(8))
        );
        // The window is over: evaluated again.
        assert_eq!(
            m.once(key(1), S, 100, || allowed(7)),
            Answered::Fresh(allowed(7))
        );
        assert_eq!(m.metrics.replayed.get(), 1);
    }

    #[test]
    fn errors_are_not_remembered() {
        let m = memory(100, 1024);
        let shed = CheckResult::Error(ErrorCode::Shed);
        assert_eq!(m.once(key(1), S, 0, || shed), Answered::Fresh(shed));
        assert_eq!(
            m.once(key(1), S, 1, || allowed(5)),
            Answered::Fresh(allowed(5))
        );
        assert_eq!(
            m.once(key(1), S, 2, || allowed(4)),
            Answered::Replayed(allowed(5))
        );
    }

    #[test]
    fn a_full_memory_forgets_its_oldest_keys_first() {
        // One key per shard: the second key of a shard evicts the first.
        let m = memory(1_000, 1);
        let mut evaluated = 0;
        for n in 0..(SHARDS as u128 * 4) {
            if let Answered::Fresh(_) = m.once(key(n), S, n as u64, || allowed(1)) {
                evaluated += 1;
            }
        }
        assert_eq!(evaluated, SHARDS * 4);
        let held: usize = m
            .shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.young.len() + s.old.len()
            })
            .sum();
        assert!(held <= SHARDS, "{held} keys held, at most one a shard");
        assert!(m.metrics.evicted.get() >= (SHARDS * 3) as u64);
        // The newest key is still remembered.
        let last = key(SHARDS as u128 * 4 - 1);
        assert!(matches!(
            m.once(last, S, 999, || allowed(0)),
            Answered::Replayed(_)
        ));
    }

    /// `n` keys that share one shard.
    fn same_shard(m: &RetryMemory, n: usize) -> Vec<IdempotencyKey> {
        let shard = |k: IdempotencyKey| (m.hasher.hash_one(k) >> 32) as usize % SHARDS;
        let first = shard(key(0));
        (0..)
            .map(key)
            .filter(|&k| shard(k) == first)
            .take(n)
            .collect()
    }

    #[test]
    fn a_full_shard_forgets_its_older_generation_whole() {
        // Four keys a shard: two generations of two.
        let m = memory(1_000, SHARDS * 4);
        let k = same_shard(&m, 6);
        for (at, &k) in k[..4].iter().enumerate() {
            assert!(matches!(
                m.once(k, S, at as u64, || allowed(1)),
                Answered::Fresh(_)
            ));
        }
        // All four are held: the shard is full, nothing forgotten yet.
        for &k in &k[..4] {
            assert!(matches!(
                m.once(k, S, 10, || panic!("evaluated")),
                Answered::Replayed(_)
            ));
        }
        assert_eq!(m.metrics.evicted.get(), 0);
        // A fifth forgets the two oldest, and only them.
        m.once(k[4], S, 11, || allowed(1));
        assert_eq!(m.metrics.evicted.get(), 2);
        for &k in &k[2..5] {
            assert!(matches!(
                m.once(k, S, 12, || panic!("evaluated")),
                Answered::Replayed(_)
            ));
        }
        assert!(matches!(
            m.once(k[0], S, 13, || allowed(1)),
            Answered::Fresh(_)
        ));
    }

    #[test]
    fn a_generation_forgotten_after_its_window_counts_no_eviction() {
        let m = memory(10, SHARDS * 2);
        let k = same_shard(&m, 4);
        m.once(k[0], S, 0, || allowed(1));
        m.once(k[1], S, 1, || allowed(1));
        // Both expired by 20: forgetting them evicts nothing early.
        m.once(k[2], S, 20, || allowed(1));
        m.once(k[3], S, 21, || allowed(1));
        assert_eq!(m.metrics.evicted.get(), 0);
    }

    #[test]
    fn no_shard_ever_holds_more_than_its_share() {
        for per_shard in [1, 2, 3, 5, 8] {
            let m = memory(u64::MAX, SHARDS * per_shard);
            let k = same_shard(&m, 40);
            for (at, &k) in k.iter().enumerate() {
                m.once(k, S, at as u64, || allowed(1));
                let held = m.shards.iter().map(|s| {
                    let s = s.lock();
                    s.young.len() + s.old.len()
                });
                assert!(held.max().unwrap() <= per_shard, "share {per_shard}");
            }
            // Every key not held was counted forgotten; the newest is held.
            let held: u64 = m
                .shards
                .iter()
                .map(|s| {
                    let s = s.lock();
                    (s.young.len() + s.old.len()) as u64
                })
                .sum();
            assert_eq!(m.metrics.evicted.get(), 40 - held);
            assert!(matches!(
                m.once(k[39], S, 99, || allowed(0)),
                Answered::Replayed(_)
            ));
        }
    }

    #[test]
    fn an_expired_key_is_evaluated_afresh_and_remembered_again() {
        let m = memory(10, 1024);
        m.once(key(1), S, 0, || allowed(3));
        assert_eq!(
            m.once(key(1), S, 10, || allowed(2)),
            Answered::Fresh(allowed(2))
        );
        assert_eq!(
            m.once(key(1), S, 15, || allowed(0)),
            Answered::Replayed(allowed(2))
        );
    }

    #[test]
    fn a_key_remembered_for_another_scope_is_refused_and_kept() {
        let m = memory(100, 1024);
        m.once(key(1), S, 0, || allowed(3));
        let other = m.once(key(1), S + 1, 1, || panic!("evaluated"));
        assert_eq!(other, Answered::Refused);
        assert_eq!(
            other.result(),
            CheckResult::Error(ErrorCode::IdempotencyKeyReused)
        );
        // The owner's own retry is still answered from memory.
        assert_eq!(
            m.once(key(1), S, 2, || panic!("evaluated")),
            Answered::Replayed(allowed(3))
        );
        assert_eq!(m.metrics.refused.get(), 1);
    }

    #[test]
    fn the_scope_tells_owners_and_checks_apart() {
        use bytes::Bytes;
        use tollgate_protocol::{Algorithm, Limit, LimitRef};
        let m = memory(100, 1024);
        let pair = |key: &'static str, count: u64, cost: u32| Pair {
            key: Bytes::from_static(key.as_bytes()),
            limit: LimitRef::Inline(Limit {
                algorithm: Algorithm::TokenBucket,
                count,
                period_ms: 1000,
                burst: count,
            }),
            cost,
        };
        let a = m.owner(Privilege::Client, b"token-a");
        let b = m.owner(Privilege::Client, b"token-b");
        assert_eq!(a, m.owner(Privilege::Client, b"token-a"));
        assert_ne!(a, b);
        let check = [pair("k", 10, 1)];
        let base = m.scope(a, &check);
        assert_eq!(base, m.scope(a, &[pair("k", 10, 1)]));
        assert_ne!(base, m.scope(b, &check));
        assert_ne!(base, m.scope(a, &[pair("j", 10, 1)]));
        assert_ne!(base, m.scope(a, &[pair("k", 11, 1)]));
        assert_ne!(base, m.scope(a, &[pair("k", 10, 2)]));
        assert_ne!(base, m.scope(a, &[pair("k", 10, 1), pair("k", 10, 1)]));
    }
}
