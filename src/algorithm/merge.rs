//! Merging two copies of one key's state, conservatively: the result has
//! no more quota left than either copy, so no unit that either copy
//! charged is handed back.
//!
//! Two copies of a key exist when two nodes both served it (a pair that
//! was split, a primary that stepped down, a slot that moved): each copy
//! saw some of the charges, and both saw those made before they diverged.
//! The merge keeps, per algorithm, the "more used" of the two:
//!
//! | algorithm | merged |
//! |---|---|
//! | token bucket, leaky bucket | the later `tat` |
//! | sliding window | the later window; same window: max `prev`, max `cur`; the window right after the other's: `prev` at least the other's `cur` |
//! | fixed window | the later window; same window: max `count` |
//! | sliding log | multiset union (a timestamp k times in one, m in the other: max(k, m) times), newest `max_entries` kept |
//! | concurrency | union of leases by id (same id: later expiry, more units), max `last_id`, newest-expiring `max_entries` kept |
//!
//! The shared history counts once (max, not sum): what both copies saw
//! before they diverged is in both. What each saw alone is lost only where
//! the max hides it (two copies charged 5 and 2 after the split end at 5),
//! which is the price of not counting the shared part twice; never below
//! either copy.

use super::{FixedWindowState, Lease, LeaseSet, LogState, State, WindowState};
use crate::clock::Nanos;

/// The conservative merge of `ours` and `theirs`, or `None` when they are
/// states of different algorithms (the caller decides; see the store).
/// Sliding logs and lease sets keep at most `max_entries` timestamps or
/// leases (the newest).
pub fn merge(ours: &State, theirs: &State, max_entries: usize) -> Option<State> {
    Some(match (ours, theirs) {
        (State::TokenBucket { tat: a }, State::TokenBucket { tat: b }) => {
            State::TokenBucket { tat: *a.max(b) }
        }
        (State::LeakyBucket { tat: a }, State::LeakyBucket { tat: b }) => {
            State::LeakyBucket { tat: *a.max(b) }
        }
        (State::SlidingWindow(a), State::SlidingWindow(b)) => {
            State::SlidingWindow(sliding_window(*a, *b))
        }
        (State::FixedWindow(a), State::FixedWindow(b)) => State::FixedWindow(fixed_window(*a, *b)),
        (State::SlidingLog(a), State::SlidingLog(b)) => {
            State::SlidingLog(log(a.entries(), b.entries(), max_entries))
        }
        (State::Concurrency(a), State::Concurrency(b)) => {
            State::Concurrency(leases(a, b, max_entries))
        }
        _ => return None,
    })
}

fn sliding_window(a: WindowState, b: WindowState) -> WindowState {
    let (late, early) = if a.index >= b.index { (a, b) } else { (b, a) };
    if late.index == early.index {
        WindowState {
            index: late.index,
            prev: late.prev.max(early.prev),
            cur: late.cur.max(early.cur),
        }
    } else if late.index == early.index + 1 {
        // The earlier copy's current window is the later one's previous.
        WindowState {
            prev: late.prev.max(early.cur),
            ..late
        }
    } else {
        late
    }
}

fn fixed_window(a: FixedWindowState, b: FixedWindowState) -> FixedWindowState {
    match a.index.cmp(&b.index) {
        std::cmp::Ordering::Greater => a,
        std::cmp::Ordering::Less => b,
        std::cmp::Ordering::Equal => FixedWindowState {
            index: a.index,
            count: a.count.max(b.count),
        },
    }
}

/// Multiset union of two sorted timestamp lists, newest `max` kept.
fn log(a: &[Nanos], b: &[Nanos], max: usize) -> LogState {
    let mut merged = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => {
                merged.push(*x);
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x < y => {
                merged.push(*x);
                i += 1;
            }
            (Some(_), Some(y)) => {
                merged.push(*y);
                j += 1;
            }
            (Some(x), None) => {
                merged.push(*x);
                i += 1;
            }
            (None, Some(y)) => {
                merged.push(*y);
                j += 1;
            }
            (None, None) => unreachable!("the loop condition"),
        }
    }
    let skip = merged.len().saturating_sub(max);
    LogState::new(merged.split_off(skip))
}

fn leases(a: &LeaseSet, b: &LeaseSet, max: usize) -> LeaseSet {
    let mut all: Vec<Lease> = a.leases().to_vec();
    for lease in b.leases() {
        match all.iter_mut().find(|l| l.id == lease.id) {
            Some(same) => {
                same.expires_at = same.expires_at.max(lease.expires_at);
                same.units = same.units.max(lease.units);
            }
            None => all.push(*lease),
        }
    }
    all.sort_by_key(|l| l.expires_at);
    let skip = all.len().saturating_sub(max);
    LeaseSet::new(a.last_id().max(b.last_id()), all.split_off(skip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(index: u64, prev: u64, cur: u64) -> State {
        State::SlidingWindow(WindowState { index, prev, cur })
    }

    #[test]
    fn buckets_keep_the_later_tat_and_windows_the_higher_counts() {
        let m = |a: &State, b: &State| merge(a, b, 10).unwrap();
        let tb = |tat| State::TokenBucket { tat };
        assert_eq!(m(&tb(5), &tb(9)), tb(9));
        assert_eq!(m(&tb(9), &tb(5)), tb(9));
        let lb = |tat| State::LeakyBucket { tat };
        assert_eq!(m(&lb(3), &lb(2)), lb(3));
        assert_eq!(m(&sw(4, 1, 7), &sw(4, 3, 2)), sw(4, 3, 7));
        assert_eq!(m(&sw(5, 0, 1), &sw(4, 3, 6)), sw(5, 6, 1));
        assert_eq!(m(&sw(4, 3, 6), &sw(5, 9, 1)), sw(5, 9, 1));
        assert_eq!(m(&sw(9, 0, 1), &sw(4, 3, 6)), sw(9, 0, 1));
        let fw = |index, count| State::FixedWindow(FixedWindowState { index, count });
        assert_eq!(m(&fw(2, 5), &fw(2, 8)), fw(2, 8));
        assert_eq!(m(&fw(3, 1), &fw(2, 8)), fw(3, 1));
        assert_eq!(merge(&tb(1), &lb(2), 10), None);
    }

    #[test]
    fn logs_are_a_multiset_union_capped_at_the_newest() {
        let a = State::SlidingLog(LogState::new(vec![1, 2, 2, 5]));
        let b = State::SlidingLog(LogState::new(vec![2, 3, 5, 5]));
        let State::SlidingLog(m) = merge(&a, &b, 100).unwrap() else {
            panic!()
        };
        assert_eq!(m.entries(), [1, 2, 2, 3, 5, 5]);
        let State::SlidingLog(capped) = merge(&a, &b, 3).unwrap() else {
            panic!()
        };
        assert_eq!(capped.entries(), [3, 5, 5]);
    }

    #[test]
    fn leases_are_united_by_id() {
        let lease = |id, expires_at, units| Lease {
            id,
            expires_at,
            units,
        };
        let a = State::Concurrency(LeaseSet::new(7, vec![lease(5, 50, 1), lease(7, 70, 1)]));
        let b = State::Concurrency(LeaseSet::new(9, vec![lease(7, 75, 2), lease(9, 90, 1)]));
        let State::Concurrency(m) = merge(&a, &b, 10).unwrap() else {
            panic!()
        };
        assert_eq!(m.last_id(), 9);
        assert_eq!(
            m.leases(),
            [lease(5, 50, 1), lease(7, 75, 2), lease(9, 90, 1)]
        );
        let State::Concurrency(capped) = merge(&a, &b, 2).unwrap() else {
            panic!()
        };
        assert_eq!(capped.leases(), [lease(7, 75, 2), lease(9, 90, 1)]);
    }
}
