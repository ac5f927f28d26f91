//! Sliding log: the exact rule "at most `limit` in any span of `W`", by
//! remembering when every unit was taken.
//!
//! The state is the sorted list of the timestamps `t_k` of the units still
//! in the window. An entry is live at `now` while `t_k + W > now`. With `u`
//! live entries, a request of cost `c` passes when `u + c <= limit` and adds
//! `c` entries at `now` (a cost of `c` takes `c` slots). When denied, the
//! request fits once the `u + c - limit` oldest live entries have left the
//! window: `retry_after = t_(u+c-limit) + W - now` (1-based, oldest first);
//! a cost above `limit` never fits. Everything is forgotten when the newest
//! entry leaves: `reset_after = t_newest + W - now`, which is also when the
//! state expires.
//!
//! Unlike the window counters there is no estimate and no boundary: the
//! limit holds over every span of length `W`. The price is memory, 8 bytes
//! per unit of the limit, so the log is for small limits only: the server
//! refuses a `limit` above its `max_log_entries` setting (default 1000) and
//! points to the sliding window counter, which gives a close approximation
//! in 24 bytes whatever the limit.
//!
//! Entries "from the future" (a clock that went back) are live until their
//! own time plus `W`, so going back in time grants nothing. Refund of `c`
//! units drops the `c` newest live entries, never more than there are.

use super::{Decision, State, Verdict};
use crate::clock::Nanos;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    limit: u64,
    /// Window length in nanoseconds (>= 1 ms, validated by `Policy`).
    window: Nanos,
}

/// The timestamps of the units taken, oldest first. Expired entries are
/// dropped whenever the log is rewritten.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogState {
    /// Sorted ascending. A boxed slice, not a `Vec`: 16 bytes in the state
    /// instead of 24, and the log is rebuilt on each charge anyway.
    entries: Box<[Nanos]>,
}

impl LogState {
    /// Bytes this log holds on the heap (for the store's memory accounting).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.entries)
    }

    /// A log of these timestamps (sorted here, so any order will do).
    pub fn new(mut entries: Vec<Nanos>) -> Self {
        entries.sort_unstable();
        Self {
            entries: entries.into_boxed_slice(),
        }
    }

    /// The timestamps, oldest first (expired ones included until the log is
    /// next rewritten).
    pub fn entries(&self) -> &[Nanos] {
        &self.entries
    }
}

impl SlidingLog {
    pub fn new(limit: u64, window: Nanos) -> Self {
        Self { limit, window }
    }

    /// The entries still in the window at `now`.
    fn live<'a>(&self, log: Option<&'a LogState>, now: Nanos) -> &'a [Nanos] {
        let entries = log.map_or(&[][..], |l| &l.entries[..]);
        // Sorted, so the expired ones are a prefix.
        let expired = entries.partition_point(|&t| t.saturating_add(self.window) <= now);
        &entries[expired..]
    }

    /// When the newest of `entries` leaves the window (`now` if none).
    fn expiry(&self, entries: &[Nanos], now: Nanos) -> Nanos {
        entries.last().map_or(now, |&t| t + self.window)
    }

    pub fn evaluate(&self, log: Option<&LogState>, now: Nanos, cost: u64) -> Verdict {
        let live = self.live(log, now);
        let used = live.len() as u64;
        if cost <= self.limit && used + cost <= self.limit {
            // Insert at `now`'s place: entries from the future stay last.
            let at = live.partition_point(|&t| t <= now);
            let mut entries = Vec::with_capacity(live.len() + cost as usize);
            entries.extend_from_slice(&live[..at]);
            entries.extend(std::iter::repeat_n(now, cost as usize));
            entries.extend_from_slice(&live[at..]);
            let expires_at = self.expiry(&entries, now);
            return Verdict {
                decision: Decision::allow(self.limit, self.limit - used - cost, expires_at - now),
                state: Some(State::SlidingLog(LogState {
                    entries: entries.into_boxed_slice(),
                })),
                expires_at,
            };
        }
        let retry_after = (cost <= self.limit).then(|| {
            // 1 <= excess <= used: cost <= limit < used + cost.
            let excess = (used + cost - self.limit) as usize;
            live[excess - 1] + self.window - now
        });
        let expires_at = self.expiry(live, now);
        let decision = Decision {
            allowed: false,
            limit: self.limit,
            remaining: self.limit.saturating_sub(used),
            reset_after: expires_at - now,
            retry_after,
            lease: None,
        };
        Verdict::denied(decision, expires_at)
    }

    /// Entries still in the window at `now`.
    pub fn in_use(&self, log: Option<&LogState>, now: Nanos) -> u64 {
        self.live(log, now).len() as u64
    }

    /// Gives `amount` units back by dropping the newest live entries.
    /// No state: nothing to give back.
    pub fn refund(&self, log: Option<&LogState>, now: Nanos, amount: u64) -> Verdict {
        let live = self.live(log, now);
        let keep = live.len() - (amount.min(live.len() as u64) as usize);
        let live = &live[..keep];
        let expires_at = self.expiry(live, now);
        Verdict {
            decision: Decision::allow(
                self.limit,
                self.limit.saturating_sub(live.len() as u64),
                expires_at - now,
            ),
            state: log.map(|_| State::SlidingLog(LogState::new(live.to_vec()))),
            expires_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    /// Applies a verdict: keeps its state when allowed.
    fn apply(log: &mut Option<LogState>, v: &Verdict) -> Decision {
        if v.decision.allowed {
            match &v.state {
                Some(State::SlidingLog(l)) => *log = Some(l.clone()),
                other => panic!("{other:?}"),
            }
        }
        v.decision
    }

    fn take(sl: &SlidingLog, log: &mut Option<LogState>, now: Nanos, cost: u64) -> Decision {
        let v = sl.evaluate(log.as_ref(), now, cost);
        apply(log, &v)
    }

    #[test]
    fn exact_over_every_span() {
        // 3 per 10 s, taken at 1 s, 4 s and 8 s.
        let sl = SlidingLog::new(3, 10 * S);
        let mut log = None;
        assert_eq!(take(&sl, &mut log, S, 1).remaining, 2);
        assert_eq!(take(&sl, &mut log, 4 * S, 1).remaining, 1);
        let d = take(&sl, &mut log, 8 * S, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.reset_after, 10 * S, "the 8 s entry leaves at 18 s");
        // Full: the next fits when the 1 s entry leaves, at 11 s.
        let d = take(&sl, &mut log, 9 * S, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(2 * S));
        assert_eq!(d.remaining, 0);
        assert!(!take(&sl, &mut log, 11 * S - 1, 1).allowed);
        // At the window boundary of the oldest entry exactly one fits.
        assert!(take(&sl, &mut log, 11 * S, 1).allowed);
        assert!(!take(&sl, &mut log, 11 * S, 1).allowed);
        assert_eq!(
            log.as_ref().unwrap().entries(),
            &[4 * S, 8 * S, 11 * S],
            "the expired entry was dropped"
        );
    }

    #[test]
    fn no_boundary_burst() {
        // Where a fixed window lets 2x through across a boundary, the log
        // holds: 10 at 59.999 s leave no room at 60 s.
        let sl = SlidingLog::new(10, 60 * S);
        let mut log = None;
        for _ in 0..10 {
            assert!(take(&sl, &mut log, 60 * S - MS, 1).allowed);
        }
        let d = take(&sl, &mut log, 60 * S, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(60 * S - MS));
    }

    #[test]
    fn cost_takes_that_many_slots() {
        let sl = SlidingLog::new(5, 10 * S);
        let mut log = None;
        assert_eq!(take(&sl, &mut log, S, 2).remaining, 3);
        assert_eq!(take(&sl, &mut log, 3 * S, 2).remaining, 1);
        assert_eq!(log.as_ref().unwrap().entries(), &[S, S, 3 * S, 3 * S]);
        // Cost 3 needs two slots freed: both 1 s entries leave at 11 s.
        let d = take(&sl, &mut log, 4 * S, 3);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(7 * S));
        // Cost 4 needs three: the first 3 s entry leaves at 13 s.
        let d = take(&sl, &mut log, 4 * S, 4);
        assert_eq!(d.retry_after, Some(9 * S));
        // Above the limit: never, and the state stays as it was.
        let v = sl.evaluate(log.as_ref(), 4 * S, 6);
        assert_eq!(v.decision.retry_after, None);
        assert_eq!(v.decision.remaining, 1);
        assert_eq!(v.state, None);
        assert_eq!(v.expires_at, 13 * S);
    }

    #[test]
    fn clock_jumps() {
        let sl = SlidingLog::new(2, 10 * S);
        let mut log = None;
        take(&sl, &mut log, S, 2);
        // Far forward: everything expired, and the rewritten log holds only
        // the new entry.
        let far = S + 5 * 365 * 24 * 3600 * S;
        let mut later = log.clone();
        assert_eq!(take(&sl, &mut later, far, 1).remaining, 1);
        assert_eq!(later.unwrap().entries(), &[far]);
        // Entries from the future (the clock went back): still live until
        // their own time + W; a new entry goes before them.
        let future = Some(LogState::new(vec![20 * S]));
        let v = sl.evaluate(future.as_ref(), 5 * S, 1);
        assert!(v.decision.allowed);
        assert_eq!(
            v.state,
            Some(State::SlidingLog(LogState::new(vec![5 * S, 20 * S])))
        );
        assert_eq!(v.expires_at, 30 * S);
        let full = Some(LogState::new(vec![20 * S, 20 * S]));
        let d = sl.evaluate(full.as_ref(), 5 * S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(25 * S));
    }

    #[test]
    fn state_expires_when_the_newest_entry_leaves() {
        let sl = SlidingLog::new(3, 10 * S);
        let mut log = None;
        take(&sl, &mut log, S, 1);
        let v = sl.evaluate(log.as_ref(), 4 * S, 1);
        assert_eq!(v.expires_at, 14 * S);
        // A denial on a fresh key stores nothing and expires at once.
        let v = sl.evaluate(None, 4 * S, 9);
        assert_eq!(v.expires_at, 4 * S);
    }

    #[test]
    fn refund_drops_the_newest_entries() {
        let sl = SlidingLog::new(5, 10 * S);
        let log = Some(LogState::new(vec![S, 2 * S, 3 * S, 4 * S]));
        let v = sl.refund(log.as_ref(), 5 * S, 2);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 3);
        assert_eq!(
            v.state,
            Some(State::SlidingLog(LogState::new(vec![S, 2 * S])))
        );
        assert_eq!(v.expires_at, 12 * S);
        assert_eq!(v.decision.reset_after, 7 * S);
        // Expired entries are not refundable: at 11.5 s only 2 s.. are live.
        let v = sl.refund(log.as_ref(), 11 * S + 500 * MS, 10);
        assert_eq!(v.decision.remaining, 5);
        assert_eq!(v.state, Some(State::SlidingLog(LogState::default())));
        assert_eq!(v.expires_at, 11 * S + 500 * MS);
        assert_eq!(sl.refund(None, S, 1).state, None);
    }
}
