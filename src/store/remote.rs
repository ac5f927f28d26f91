//! Usage made elsewhere: charging what another region's clients used into
//! a key's state, without a decision of this store's own.
//!
//! A global limit is enforced by each region on its own counters; the
//! usage each region reports is charged here under the same stripe lock as
//! a check, into the same state (the algorithm's `absorb`), so the state a
//! check sees is local and remote usage together. Nothing is decided: the
//! state may pass the limit, and the key is then denied until it has
//! drained the excess. The write is recorded for the standby like any
//! other, and a new key respects the memory cap like a check's.
//!
//! Only the caller knows whether a report was applied before: the store
//! charges what it is given (the regions layer applies each report once).

use super::group::table_for;
use super::{Captured, Entry, Locked, Mode, Store};
use crate::algorithm::{InvalidLimit, Policy};
use crate::clock::Nanos;
use crate::slot::Slot;
use tollgate_protocol::Limit;

/// One key's usage under one limit, made in another region since its
/// previous report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteUsage {
    /// Units admitted there.
    pub charged: u64,
    /// Units refunded there.
    pub refunded: u64,
    /// That region's clock at the latest admission (ns since the UNIX
    /// epoch); usage of an expired window no longer counts.
    pub at: Nanos,
}

/// Why remote usage was not charged. Nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AbsorbError {
    #[error(transparent)]
    Limit(#[from] InvalidLimit),
    /// The key is new, the store is at its memory cap and refuses new keys.
    #[error("the store is full and refuses new keys")]
    StoreFull,
}

impl Store {
    /// Charges `usage` of `key`, made in another region under `limit`, into
    /// the key's state: `charged` at the usage's time, then `refunded` as a
    /// REFUND at `now` would. Returns whether the state changed.
    pub fn absorb(
        &self,
        key: &[u8],
        limit: &Limit,
        usage: RemoteUsage,
        now: Nanos,
    ) -> Result<bool, AbsorbError> {
        let policy = Policy::from_limit_with(limit, self.max_log_entries)?;
        let table = table_for(&policy);
        let hash = self.hash(key);
        let stripe = self.stripe(Slot::of(key));
        let mut locked = stripe.lock();
        let Locked { tables, changes } = &mut *locked;
        let current = tables.live(table, hash, key, now, &self.expired_on_access);
        let mut entry = current.clone();
        if let Some((state, expires_at)) = policy.absorb(
            entry.as_ref().map(|e| &e.state),
            usage.at,
            now,
            usage.charged,
        )? {
            entry = Some(Entry { state, expires_at });
        }
        // One refund of the whole amount, whatever it is: the algorithms'
        // refunds are O(1) in the amount and saturate at an empty state, so
        // a peer's `refunded = u64::MAX` costs what 1 does under the lock.
        if usage.refunded > 0 {
            if let Some(e) = &entry {
                let verdict = policy.refund(Some(&e.state), now, usage.refunded)?;
                entry = verdict.state.map(|state| Entry {
                    state,
                    expires_at: verdict.expires_at,
                });
            }
        }
        // Charged so long ago, or refunded so much, that nothing is left.
        let entry = entry.filter(|e| e.expires_at > now);
        if entry == current {
            return Ok(false);
        }
        match entry {
            Some(entry) => {
                if tables.is_new(hash, key, &entry) {
                    self.room_for((tables, changes), stripe, (key, hash), &entry, now)?;
                }
                // Recorded first: the entry moves into the table.
                self.record_change(stripe, changes, key, || Captured::Put(entry.clone()));
                tables.put(&self.hasher, hash, key, entry);
            }
            None => {
                tables.remove(table, hash, key);
                self.record_change(stripe, changes, key, || Captured::Removed(table));
            }
        }
        Ok(true)
    }

    /// Makes room for a new key's `entry` within the stripe's memory share,
    /// as a check adding a key would ([`Store::make_room`]: evicting or
    /// refusing by policy). Also what a HANDOFF's merge of a new key asks
    /// (`merge.rs`).
    pub(super) fn room_for(
        &self,
        (tables, changes): (&mut super::Tables, &mut super::ChangeLog),
        stripe: &super::Stripe,
        (key, hash): (&[u8], u64),
        entry: &Entry,
        now: Nanos,
    ) -> Result<(), AbsorbError> {
        let written = std::iter::once((key, entry, hash));
        let (evicted, room) = self.make_room(tables, written, now, Mode::Charge);
        if evicted > 0 {
            self.record_eviction(stripe, changes);
        }
        room.map_err(|_| AbsorbError::StoreFull)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Drained, Mode, ResolvedPair, StoreConfig};
    use tollgate_protocol::{Algorithm, CheckResult};

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn limit(algorithm: Algorithm, count: u64, period_ms: u64, burst: u64) -> Limit {
        Limit {
            algorithm,
            count,
            period_ms,
            burst,
        }
    }

    fn remaining(store: &Store, key: &str, limit: Limit, now: Nanos) -> u64 {
        let check = ResolvedPair::new(key.as_bytes(), limit, 1);
        match store.check(&[check], now, Mode::Peek) {
            CheckResult::Decision(d) => d.remaining,
            CheckResult::Error(e) => panic!("{e}"),
        }
    }

    fn usage(charged: u64, refunded: u64, at: Nanos) -> RemoteUsage {
        RemoteUsage {
            charged,
            refunded,
            at,
        }
    }

    #[test]
    fn remote_usage_and_local_checks_share_one_state() {
        let s = Store::new(StoreConfig::default());
        let now = 100 * S;
        for l in [
            limit(Algorithm::TokenBucket, 1, 60_000, 10),
            limit(Algorithm::SlidingWindow, 10, 60_000, 0),
            limit(Algorithm::FixedWindow, 10, 60_000, 0),
        ] {
            let key = format!("rl:{{k}}:{}", l.algorithm.name());
            // A PEEK answers after one more unit: 10 - 1 with nothing used.
            assert_eq!(remaining(&s, &key, l, now), 9);
            assert!(s
                .absorb(key.as_bytes(), &l, usage(4, 0, now - S), now)
                .unwrap());
            assert_eq!(remaining(&s, &key, l, now), 5, "{l:?}");
            // Local checks add to it.
            let check = ResolvedPair::new(key.as_bytes(), l, 2);
            assert!(
                matches!(s.check(&[check], now, Mode::Charge), CheckResult::Decision(d) if d.allowed)
            );
            assert_eq!(remaining(&s, &key, l, now), 3);
            // A refund made there gives units back here.
            assert!(s.absorb(key.as_bytes(), &l, usage(0, 3, now), now).unwrap());
            assert_eq!(remaining(&s, &key, l, now), 6);
        }
    }

    #[test]
    fn a_huge_remote_refund_empties_the_key_in_one_step() {
        let s = Store::new(StoreConfig::default());
        let now = 100 * S;
        for l in [
            limit(Algorithm::TokenBucket, 1, 60_000, 10),
            limit(Algorithm::SlidingWindow, 10, 60_000, 0),
            limit(Algorithm::FixedWindow, 10, 60_000, 0),
        ] {
            let key = format!("rl:{{huge}}:{}", l.algorithm.name());
            s.absorb(key.as_bytes(), &l, usage(4, 0, now), now).unwrap();
            assert_eq!(remaining(&s, &key, l, now), 5, "{l:?}");
            // Before: 2^32 steps of u32::MAX under the stripe lock (this
            // test ran for minutes); now one refund, which leaves the key
            // empty (and removed).
            assert!(s
                .absorb(key.as_bytes(), &l, usage(u64::MAX, u64::MAX, now), now)
                .unwrap());
            assert_eq!(remaining(&s, &key, l, now), 9, "{l:?}");
        }
        // On a key that was never charged: nothing to give back.
        let l = limit(Algorithm::FixedWindow, 10, 60_000, 0);
        assert!(!s
            .absorb(b"untouched", &l, usage(0, u64::MAX, now), now)
            .unwrap());
    }

    #[test]
    fn usage_that_no_longer_counts_changes_nothing() {
        let s = Store::new(StoreConfig::default());
        let now = 100 * S;
        let window = limit(Algorithm::FixedWindow, 10, 1000, 0);
        assert!(!s
            .absorb(b"w", &window, usage(3, 0, now - 2 * S), now)
            .unwrap());
        let bucket = limit(Algorithm::TokenBucket, 10, 1000, 10);
        // Two tokens used 1 s ago have refilled already.
        assert!(!s.absorb(b"b", &bucket, usage(2, 0, now - S), now).unwrap());
        assert!(s.is_empty());
        let log = limit(Algorithm::SlidingLog, 10, 1000, 0);
        assert!(matches!(
            s.absorb(b"l", &log, usage(1, 0, now), now),
            Err(AbsorbError::Limit(InvalidLimit::NotGlobal { .. }))
        ));
    }

    #[test]
    fn absorbed_usage_is_recorded_for_the_standby() {
        let s = Store::new(StoreConfig {
            stripes: 1,
            ..StoreConfig::default()
        });
        s.start_capture();
        assert!(matches!(s.drain_stripe(0, S), Drained::Whole(_)));
        let l = limit(Algorithm::SlidingWindow, 10, 60_000, 0);
        s.absorb(b"rl:{a}:x", &l, usage(1, 0, 100 * S), 100 * S)
            .unwrap();
        match s.drain_stripe(0, 100 * S) {
            Drained::Changes(keys) => {
                let keys: Vec<_> = keys.keys().collect();
                assert_eq!(keys.len(), 1);
                assert_eq!(keys[0].key, b"rl:{a}:x");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_full_store_refuses_new_remote_keys_with_refuse() {
        let s = Store::new(StoreConfig {
            stripes: 1,
            max_memory: Some(16 << 10),
            on_full: crate::store::Full::Refuse,
            ..StoreConfig::default()
        });
        let l = limit(Algorithm::TokenBucket, 1, 60_000, 10);
        let now = 100 * S;
        let mut refused = None;
        for i in 0..10_000 {
            let key = format!("rl:{{k{i}}}:x");
            if let Err(e) = s.absorb(key.as_bytes(), &l, usage(1, 0, now), now) {
                refused = Some(e);
                break;
            }
        }
        assert_eq!(refused, Some(AbsorbError::StoreFull));
        assert!(s.refused() >= 1);
    }
}
