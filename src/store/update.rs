//! A read-modify-write of one key's state whose policy depends on the state
//! itself ([`Store::update`]): the RESP front end's counters, whose fixed
//! window is the one the counter already has.
//!
//! Same guarantees as a check: one stripe lock for the read, the decision
//! and the write; a new key goes through the memory cap (`make_room`) like
//! any; every write is recorded for the replication sender. The caller's
//! function is pure (an algorithm's evaluate or transform): it sees the
//! live state the key holds in the table of non-bucket states (None: none
//! or expired) and says what to keep.

use super::tables::Table;
use super::{Captured, Entry, Locked, Mode, Store};
use crate::clock::Nanos;
use crate::slot::Slot;
use tollgate_protocol::ErrorCode;

/// What [`Store::update`]'s function decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update<T> {
    /// Keep this entry (written; `expires_at <= now` removes the key) and
    /// answer `T`.
    Write(Entry, T),
    /// Change nothing and answer `T`.
    Keep(T),
}

impl Store {
    /// Reads the live non-bucket state of `key`, lets `f` decide, and
    /// writes what it returns, all under the key's stripe lock. A new key
    /// that the memory cap refuses is `StoreFull` and changes nothing.
    pub fn update<T>(
        &self,
        key: &[u8],
        now: Nanos,
        f: impl FnOnce(Option<&Entry>) -> Update<T>,
    ) -> Result<T, ErrorCode> {
        let hash = self.hash(key);
        let stripe = self.stripe(Slot::of(key));
        let mut locked = stripe.lock();
        let Locked { tables, changes } = &mut *locked;
        let current = tables.live(Table::Others, hash, key, now, &self.expired_on_access);
        let (entry, answer) = match f(current.as_ref()) {
            Update::Keep(answer) => return Ok(answer),
            Update::Write(entry, answer) => (entry, answer),
        };
        if entry.expires_at <= now {
            if current.is_some() {
                tables.remove(Table::Others, hash, key);
                self.record_change(stripe, changes, key, || Captured::Removed(Table::Others));
            }
            return Ok(answer);
        }
        // Room for a new key, or for a state moving to another table (a
        // counter written over a leaky bucket); `make_room` counts only
        // what adds an entry.
        let written = std::iter::once((key, &entry, hash));
        let (evicted, room) = self.make_room(tables, written, now, Mode::Charge);
        if evicted > 0 {
            // Refused or not, the standby must hear of them.
            self.record_eviction(stripe, changes);
        }
        room?;
        // Recorded first: the entry moves into the table.
        self.record_change(stripe, changes, key, || Captured::Put(entry.clone()));
        tables.put(&self.hasher, hash, key, entry);
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{FixedWindowState, State};
    use crate::store::{Full, StoreConfig};

    fn counter(count: u64, expires_at: Nanos) -> Entry {
        Entry {
            state: State::FixedWindow(FixedWindowState { index: 1, count }),
            expires_at,
        }
    }

    #[test]
    fn reads_decides_and_writes_under_one_lock() {
        let store = Store::new(StoreConfig::default());
        // Nothing there: the function sees None and may create the key.
        let seen = store
            .update(b"k", 10, |e| Update::Write(counter(1, 100), e.is_some()))
            .unwrap();
        assert!(!seen);
        assert_eq!(store.get(b"k", 10), Some(counter(1, 100)));
        // Keep changes nothing.
        let n = store
            .update(b"k", 20, |e| Update::Keep(e.map(|e| e.expires_at)))
            .unwrap();
        assert_eq!(n, Some(100));
        // An entry that expires now removes the key.
        store
            .update(b"k", 30, |_| Update::Write(counter(0, 30), ()))
            .unwrap();
        assert_eq!(store.get(b"k", 30), None);
        // An expired state is not shown to the function.
        store
            .update(b"k", 40, |_| Update::Write(counter(2, 50), ()))
            .unwrap();
        let seen = store
            .update(b"k", 60, |e| Update::Keep(e.cloned()))
            .unwrap();
        assert_eq!(seen, None);
    }

    #[test]
    fn a_token_bucket_of_the_same_key_is_left_alone() {
        use crate::store::ResolvedPair;
        use tollgate_protocol::{Algorithm, CheckResult, Limit};
        let store = Store::new(StoreConfig::default());
        let pair = ResolvedPair::new(
            b"k",
            Limit {
                algorithm: Algorithm::TokenBucket,
                count: 1,
                period_ms: 1000,
                burst: 1,
            },
            1,
        );
        let now = 1_000_000_000;
        assert!(matches!(
            store.check(&[pair], now, crate::store::Mode::Charge),
            CheckResult::Decision(d) if d.allowed
        ));
        let seen = store
            .update(b"k", now, |e| Update::Keep(e.cloned()))
            .unwrap();
        assert_eq!(seen, None);
        assert_eq!(store.entries(b"k", now).len(), 1);
    }

    #[test]
    fn new_keys_pass_the_memory_cap() {
        let store = Store::new(StoreConfig {
            stripes: 1,
            max_memory: Some(1),
            on_full: Full::Refuse,
            ..StoreConfig::default()
        });
        let r = store.update(b"k", 10, |_| Update::Write(counter(1, 100), ()));
        assert_eq!(r, Err(ErrorCode::StoreFull));
        assert_eq!(store.get(b"k", 10), None);
    }
}
