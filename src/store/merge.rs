//! Handing states from one node to another (a HANDOFF): reading a
//! stripe's live states for the sender ([`Store::live_states`]), dropping
//! the states of slots that moved away ([`Store::forget_slots`]), and
//! merging them on the receiver ([`Store::merge`]): key by key, table by
//! table, the copy with less quota left wins
//! ([`algorithm::merge`](crate::algorithm::merge)), so no unit either
//! node admitted is handed back.
//!
//! Invariants: a merge never deletes (an absent or unchanged table in the
//! handed state leaves ours alone), never lowers what a state has used, and
//! records the key for the replication sender like any write, under the
//! same stripe lock. A merge that adds an entry stays within `--max-memory`
//! as a check adding a key would: it evicts by `--on-full evict`, or, by
//! `--on-full refuse` (or when even an emptied stripe has no room), is
//! refused with [`MergeRefused`] and adds nothing.

use super::remote::AbsorbError;
use super::tables::Table;
use super::{Captured, Entry, KeyWrite, Locked, Store, StoredKey, TableWrite};
use crate::algorithm;
use crate::clock::Nanos;
use crate::slot::Slot;

impl Store {
    /// The live states of stripe `index` whose slot satisfies `wanted`
    /// (one entry per table a key has state in). Holds the stripe's lock
    /// while it copies them.
    pub fn live_states(
        &self,
        index: usize,
        now: Nanos,
        wanted: impl Fn(Slot) -> bool,
    ) -> Vec<(StoredKey, Entry)> {
        let locked = self.stripes[index & self.mask].lock();
        let mut out = Vec::new();
        locked.tables.for_each(|key, entry| {
            if entry.expires_at > now && wanted(Slot::of(key)) {
                out.push((StoredKey::new(key), entry));
            }
        });
        out
    }

    /// Forgets every state of the slots `wanted` selects (they moved to
    /// another shard), recording each key for the replication sender so a
    /// standby forgets them too. Returns how many keys went.
    pub fn forget_slots(&self, wanted: impl Fn(Slot) -> bool) -> usize {
        let mut forgotten = 0;
        for stripe in self.stripes.iter() {
            let mut locked = stripe.lock();
            let Locked { tables, changes } = &mut *locked;
            let mut keys: Vec<StoredKey> = Vec::new();
            tables.for_each(|key, _| {
                if wanted(Slot::of(key)) {
                    keys.push(StoredKey::new(key));
                }
            });
            keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            keys.dedup_by(|a, b| a.as_bytes() == b.as_bytes());
            for key in &keys {
                let key = key.as_bytes();
                tables.remove(Table::Buckets, self.hash(key), key);
                tables.remove(Table::Others, self.hash(key), key);
                self.record_change(stripe, changes, key, || Captured::RemovedAll);
            }
            forgotten += keys.len();
        }
        forgotten
    }

    /// Merges one handed-over key into ours. Returns whether any of our
    /// states changed; [`MergeRefused`] when a table's state is new here
    /// and the memory cap refuses it (a table merged before it stays
    /// merged, and recorded).
    pub fn merge(&self, write: &KeyWrite, now: Nanos) -> Result<bool, MergeRefused> {
        let hash = self.hash(&write.key);
        let stripe = self.stripe(Slot::of(&write.key));
        let mut locked = stripe.lock();
        let Locked { tables, changes } = &mut *locked;
        let cap = usize::try_from(self.max_log_entries).unwrap_or(usize::MAX);
        let mut changed = false;
        for (table, handed) in [
            (Table::Buckets, &write.bucket),
            (Table::Others, &write.other),
        ] {
            let TableWrite::Put(theirs) = handed else {
                continue;
            };
            if theirs.expires_at <= now {
                continue;
            }
            let ours = tables
                .find(table, hash, &write.key)
                .filter(|e| e.expires_at > now);
            let merged = match &ours {
                None => theirs.clone(),
                Some(ours) => merge_entries(ours, theirs, cap),
            };
            if ours.as_ref() == Some(&merged) {
                continue;
            }
            if tables.is_new(hash, &write.key, &merged) {
                let room =
                    self.room_for((tables, changes), stripe, (&write.key, hash), &merged, now);
                if let Err(AbsorbError::StoreFull) = room {
                    return Err(MergeRefused);
                }
            }
            // Each table merged is recorded as it is written (first: the
            // entry moves into the table).
            self.record_change(stripe, changes, &write.key, || {
                Captured::Put(merged.clone())
            });
            tables.put(&self.hasher, hash, &write.key, merged);
            changed = true;
        }
        Ok(changed)
    }
}

/// A handed-over state that would add an entry past the memory cap
/// (`--max-memory`) when the policy refuses new keys: it was not merged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the store is at its memory cap and refuses new keys")]
pub struct MergeRefused;

/// Two live entries of one table of one key: the merged state expires at
/// the later of the two. States of different algorithms (the key was used
/// with one limit here, another there) cannot be combined: the one that
/// carries information longer stays.
fn merge_entries(ours: &Entry, theirs: &Entry, cap: usize) -> Entry {
    match algorithm::merge(&ours.state, &theirs.state, cap) {
        Some(state) => Entry {
            state,
            expires_at: ours.expires_at.max(theirs.expires_at),
        },
        None if theirs.expires_at > ours.expires_at => theirs.clone(),
        None => ours.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::{State, WindowState};
    use crate::store::StoreConfig;
    use bytes::Bytes;

    fn put(key: &'static str, bucket: Option<Entry>, other: Option<Entry>) -> KeyWrite {
        let write = |e: Option<Entry>| e.map_or(TableWrite::Keep, TableWrite::Put);
        KeyWrite {
            key: Bytes::from_static(key.as_bytes()),
            bucket: write(bucket),
            other: write(other),
        }
    }

    fn bucket(tat: Nanos) -> Entry {
        Entry {
            state: State::TokenBucket { tat },
            expires_at: tat,
        }
    }

    fn window(cur: u64, expires_at: Nanos) -> Entry {
        Entry {
            state: State::SlidingWindow(WindowState {
                index: 1,
                prev: 0,
                cur,
            }),
            expires_at,
        }
    }

    #[test]
    fn the_copy_with_less_left_wins_and_nothing_is_deleted() {
        let store = Store::new(StoreConfig::default());
        let now = 100;
        assert!(store
            .merge(&put("k", Some(bucket(500)), Some(window(3, 900))), now)
            .unwrap());
        assert_eq!(store.entries(b"k", now), [bucket(500), window(3, 900)]);
        // An older copy changes nothing.
        assert!(!store
            .merge(&put("k", Some(bucket(400)), Some(window(2, 800))), now)
            .unwrap());
        // A newer one moves each state forward.
        assert!(store
            .merge(&put("k", Some(bucket(600)), None), now)
            .unwrap());
        assert!(store
            .merge(&put("k", None, Some(window(5, 700))), now)
            .unwrap());
        assert_eq!(store.entries(b"k", now), [bucket(600), window(5, 900)]);
        // Absent in the handed state: ours stays.
        let absent = KeyWrite {
            key: Bytes::from_static(b"k"),
            bucket: TableWrite::Remove,
            other: TableWrite::Remove,
        };
        assert!(!store.merge(&absent, now).unwrap());
        assert_eq!(store.entries(b"k", now).len(), 2);
        // An expired handed state is ignored.
        assert!(!store.merge(&put("j", Some(bucket(50)), None), now).unwrap());
        assert!(store.entries(b"j", now).is_empty());
    }

    #[test]
    fn a_merge_is_captured_for_the_standby() {
        let store = Store::new(StoreConfig::default());
        store.start_capture();
        for i in 0..store.stripe_count() {
            store.drain_stripe(i, 0);
        }
        assert!(store.merge(&put("k", Some(bucket(500)), None), 0).unwrap());
        let drained: Vec<_> = (0..store.stripe_count())
            .map(|i| store.drain_stripe(i, 0))
            .filter(|d| *d != crate::store::Drained::Nothing)
            .collect();
        assert_eq!(drained.len(), 1, "{drained:?}");
        // What a sender reads back: the live state, for the slots asked.
        let slot = Slot::of(b"k");
        let index = usize::from(slot.get()) % store.stripe_count();
        assert_eq!(store.live_states(index, 0, |s| s == slot).len(), 1);
        assert!(store.live_states(index, 0, |s| s != slot).is_empty());
        assert!(store.live_states(index, 500, |_| true).is_empty());
        // Forgotten once the slot moved away, and the standby is told.
        assert_eq!(store.forget_slots(|s| s == slot), 1);
        assert!(store.get(b"k", 0).is_none());
        assert!((0..store.stripe_count())
            .any(|i| store.drain_stripe(i, 0) != crate::store::Drained::Nothing));
    }

    #[test]
    fn a_new_key_past_the_memory_cap_is_refused_or_evicts_by_policy() {
        let full = |on_full| {
            Store::new(StoreConfig {
                stripes: 1,
                max_memory: Some(16 << 10),
                on_full,
                ..StoreConfig::default()
            })
        };
        let now = 100;
        let refuse = full(crate::store::Full::Refuse);
        let key = |i: usize| Bytes::from(format!("rl:{{k{i}}}:x"));
        let write = |i: usize| KeyWrite {
            key: key(i),
            bucket: TableWrite::Put(bucket(1_000 + i as u64)),
            other: TableWrite::Keep,
        };
        let first_refused = (0..10_000)
            .find(|&i| refuse.merge(&write(i), now).is_err())
            .expect("a 16 KiB store fills up");
        assert!(
            refuse.memory_bytes() <= 16 << 10,
            "{}",
            refuse.memory_bytes()
        );
        assert!(refuse.entries(&key(first_refused), now).is_empty());
        assert!(refuse.refused() >= 1);
        // A key that holds state still merges.
        assert_eq!(refuse.merge(&write(0), now), Ok(false));
        let evict = full(crate::store::Full::Evict);
        for i in 0..10_000 {
            evict.merge(&write(i), now).expect("evicts instead");
        }
        assert!(evict.memory_bytes() <= 16 << 10, "{}", evict.memory_bytes());
        assert!(evict.evicted() > 0);
    }
}
