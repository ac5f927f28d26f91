//! Store states <-> replication records (`PROTOCOL.md` §13).
//!
//! The conversions are exact both ways (a test round-trips every
//! algorithm), so a standby holds bit for bit what the primary held.

use crate::algorithm::{FixedWindowState, Lease, LeaseSet, LogState, State, WindowState};
use crate::store::{Entry, KeyWrite, StoredKey, TableWrite, Written};
use bytes::Bytes;
use tollgate_protocol::{LeaseState, Record, StateEntry, StateValue, TableState};

pub(crate) fn to_wire(entry: &Entry) -> StateEntry {
    let state = match &entry.state {
        State::TokenBucket { tat } => StateValue::TokenBucket { tat: *tat },
        State::SlidingWindow(w) => StateValue::SlidingWindow {
            index: w.index,
            prev: w.prev,
            cur: w.cur,
        },
        State::FixedWindow(w) => StateValue::FixedWindow {
            index: w.index,
            count: w.count,
        },
        State::SlidingLog(log) => StateValue::SlidingLog {
            entries: log.entries().to_vec(),
        },
        State::LeakyBucket { tat } => StateValue::LeakyBucket { tat: *tat },
        State::Concurrency(set) => StateValue::Concurrency {
            last_id: set.last_id(),
            leases: set
                .leases()
                .iter()
                .map(|l| LeaseState {
                    id: l.id,
                    expires_at: l.expires_at,
                    units: l.units,
                })
                .collect(),
        },
    };
    StateEntry {
        expires_at: entry.expires_at,
        state,
    }
}

pub(crate) fn from_wire(entry: &StateEntry) -> Entry {
    let state = match &entry.state {
        StateValue::TokenBucket { tat } => State::TokenBucket { tat: *tat },
        StateValue::SlidingWindow { index, prev, cur } => State::SlidingWindow(WindowState {
            index: *index,
            prev: *prev,
            cur: *cur,
        }),
        StateValue::FixedWindow { index, count } => State::FixedWindow(FixedWindowState {
            index: *index,
            count: *count,
        }),
        StateValue::SlidingLog { entries } => State::SlidingLog(LogState::new(entries.clone())),
        StateValue::LeakyBucket { tat } => State::LeakyBucket { tat: *tat },
        StateValue::Concurrency { last_id, leases } => State::Concurrency(LeaseSet::new(
            *last_id,
            leases
                .iter()
                .map(|l| Lease {
                    id: l.id,
                    expires_at: l.expires_at,
                    units: l.units,
                })
                .collect(),
        )),
    };
    // A token bucket's expiry is its `tat` (the table stores only that).
    let expires_at = match state {
        State::TokenBucket { tat } => tat,
        _ => entry.expires_at,
    };
    Entry { state, expires_at }
}

/// A drained table write as the stream carries it (`Unchanged`: a table
/// the key did not write since the last drain).
pub(crate) fn table_state(write: Written<'_>) -> TableState {
    match write {
        Written::Keep => TableState::Unchanged,
        Written::Remove => TableState::Absent,
        Written::Put(e) => TableState::Present(to_wire(e)),
    }
}

/// One entry of a stripe sent whole: its own table set, the other left
/// alone (the key's other state, if any, is another entry of the unit).
pub(crate) fn snapshot_record(key: &StoredKey, entry: &Entry) -> Record {
    let present = TableState::Present(to_wire(entry));
    let (token_bucket, other) = match entry.state {
        State::TokenBucket { .. } => (present, TableState::Unchanged),
        _ => (TableState::Unchanged, present),
    };
    Record {
        key: Bytes::copy_from_slice(key.as_bytes()),
        token_bucket,
        other,
    }
}

/// What a standby does with a record. The decoder has already checked that
/// each state is in its own table.
pub(crate) fn key_write(record: &Record) -> KeyWrite {
    write_of(record.key.clone(), &record.token_bucket, &record.other)
}

/// [`key_write`] of a record no longer needed: its key is moved, not
/// cloned (a clone and a drop are two atomic updates of the frame's
/// reference count per key, 16% of a standby's CPU).
pub(crate) fn into_key_write(record: Record) -> KeyWrite {
    write_of(record.key, &record.token_bucket, &record.other)
}

fn write_of(key: Bytes, token_bucket: &TableState, other: &TableState) -> KeyWrite {
    let write = |t: &TableState| match t {
        TableState::Unchanged => TableWrite::Keep,
        TableState::Absent => TableWrite::Remove,
        TableState::Present(e) => TableWrite::Put(from_wire(e)),
    };
    KeyWrite {
        key,
        bucket: write(token_bucket),
        other: write(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_round_trips_exactly() {
        let entries = [
            Entry {
                state: State::TokenBucket { tat: 5 },
                expires_at: 5,
            },
            Entry {
                state: State::SlidingWindow(WindowState {
                    index: 3,
                    prev: 4,
                    cur: 5,
                }),
                expires_at: 9,
            },
            Entry {
                state: State::FixedWindow(FixedWindowState { index: 1, count: 2 }),
                expires_at: 10,
            },
            Entry {
                state: State::SlidingLog(LogState::new(vec![1, 2, 3])),
                expires_at: 11,
            },
            Entry {
                state: State::LeakyBucket { tat: 12 },
                expires_at: 12,
            },
            Entry {
                state: State::Concurrency(LeaseSet::new(
                    40,
                    vec![Lease {
                        id: 40,
                        expires_at: 50,
                        units: 2,
                    }],
                )),
                expires_at: 50,
            },
        ];
        for entry in entries {
            assert_eq!(from_wire(&to_wire(&entry)), entry);
        }
    }
}
