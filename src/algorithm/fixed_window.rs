//! Fixed window counter: one count per window of the server clock.
//!
//! Time is cut into windows of length `W` aligned on the server clock
//! (window `i` is `[i*W, (i+1)*W)`). The state is the index of the window
//! last charged and its count `n`. A request of cost `c` at `now` in window
//! `i = now / W` passes when `n_i + c <= limit`, where `n_i` is the stored
//! count if the state is for window `i` and 0 otherwise; it then adds `c`.
//! `remaining = limit - n_i`, and everything resets at the window's end,
//! which is both `reset_after` and, when denied, `retry_after` (a cost above
//! the limit never passes).
//!
//! **Boundary burst.** The count does not look back across a boundary: a
//! caller can spend the whole limit at the very end of one window and the
//! whole limit again at the start of the next, so up to `2 * limit` pass
//! within a time as short as one request apart. That is the price of the
//! smallest state (16 bytes, one addition per check); use the sliding window
//! counter or the sliding log when the limit must hold over every span of
//! length `W`.
//!
//! A state from a later window than `now`'s (a clock that jumped back, or
//! state written by a node ahead of this one) is honoured as the current
//! window, not reset, so a clock going backwards never grants fresh quota;
//! it resets when its own window ends. Only up to
//! [`MAX_WINDOW_LEAD`](super::MAX_WINDOW_LEAD) ahead: a window starting
//! later than that was counted under another window length (a changed
//! rule) and starts afresh. Refund of `c` units takes them off
//! the current window's count, never below zero; units charged in an
//! earlier window are already forgotten.

use super::{later_window_honoured, Decision, State, Verdict};
use crate::clock::Nanos;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    /// Window length in nanoseconds (>= 1 ms, validated by `Policy`).
    window: Nanos,
}

/// The count of the window last charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindowState {
    /// `now / W` when the window was charged.
    pub index: u64,
    pub count: u64,
}

impl FixedWindowState {
    /// The window length of a state stored with `expires_at`: a charged
    /// window expires at its end, `(index + 1) * W`. None when that does
    /// not divide (not a state this algorithm wrote).
    pub fn window(&self, expires_at: Nanos) -> Option<Nanos> {
        let windows = self.index.checked_add(1)?;
        (expires_at % windows == 0).then(|| expires_at / windows)
    }
}

impl FixedWindow {
    pub fn new(limit: u64, window: Nanos) -> Self {
        Self { limit, window }
    }

    /// The window length, in nanoseconds.
    pub fn window(&self) -> Nanos {
        self.window
    }

    /// `state`'s count carried into the window of this length in force at
    /// `now` (a counter whose window is changed: the RESP front end's
    /// EXPIRE), and when that window ends.
    pub fn rewindow(&self, state: FixedWindowState, now: Nanos) -> (FixedWindowState, Nanos) {
        let index = now / self.window;
        (
            FixedWindowState {
                index,
                count: state.count,
            },
            self.window_end(index),
        )
    }

    /// The window in force at `now` and its count so far.
    fn current(&self, state: Option<FixedWindowState>, now: Nanos) -> FixedWindowState {
        let index = now / self.window;
        match state {
            Some(s) if s.index == index => s,
            Some(s) if s.index > index && later_window_honoured(s.index, self.window, now) => s,
            _ => FixedWindowState { index, count: 0 },
        }
    }

    /// End of window `index` (saturating: a state from far ahead must not
    /// overflow).
    fn window_end(&self, index: u64) -> Nanos {
        index.saturating_add(1).saturating_mul(self.window)
    }

    pub fn evaluate(&self, state: Option<FixedWindowState>, now: Nanos, cost: u64) -> Verdict {
        let cur = self.current(state, now);
        let end = self.window_end(cur.index);
        if cur.count + cost <= self.limit {
            let count = cur.count + cost;
            return Verdict {
                decision: Decision::allow(self.limit, self.limit - count, end - now),
                state: Some(State::FixedWindow(FixedWindowState {
                    index: cur.index,
                    count,
                })),
                expires_at: end,
            };
        }
        let expires_at = if cur.count > 0 { end } else { now };
        let decision = Decision {
            allowed: false,
            limit: self.limit,
            remaining: self.limit.saturating_sub(cur.count),
            reset_after: expires_at - now,
            retry_after: (cost <= self.limit).then_some(end - now),
            lease: None,
        };
        Verdict::denied(decision, expires_at)
    }

    /// Charges `units` used at `at <= now` somewhere else (another region)
    /// without a decision, to the window in force when `at` falls in it;
    /// usage of an earlier window no longer counts (`None`: the state stays
    /// as it is). The count may pass the limit, never `MAX_COUNT`. Returns
    /// the new state and its expiry.
    pub fn absorb(
        &self,
        state: Option<FixedWindowState>,
        at: Nanos,
        now: Nanos,
        units: u64,
    ) -> Option<(FixedWindowState, Nanos)> {
        let cur = self.current(state, now);
        if at.min(now) / self.window < cur.index {
            return None;
        }
        let count = cur.count.saturating_add(units).min(super::MAX_COUNT);
        let state = FixedWindowState {
            index: cur.index,
            count,
        };
        Some((state, self.window_end(cur.index)))
    }

    /// Units counted in the window in force at `now`.
    pub fn in_use(&self, state: Option<FixedWindowState>, now: Nanos) -> u64 {
        state.map_or(0, |s| self.current(Some(s), now).count)
    }

    /// Gives `amount` units back to the current window, never below zero.
    /// No state: nothing to give back.
    pub fn refund(&self, state: Option<FixedWindowState>, now: Nanos, amount: u64) -> Verdict {
        let cur = self.current(state, now);
        let count = cur.count.saturating_sub(amount);
        let expires_at = if count > 0 {
            self.window_end(cur.index)
        } else {
            now
        };
        Verdict {
            decision: Decision::allow(
                self.limit,
                self.limit.saturating_sub(count),
                expires_at - now,
            ),
            state: state.map(|_| {
                State::FixedWindow(FixedWindowState {
                    index: cur.index,
                    count,
                })
            }),
            expires_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    /// Charges `n` requests of cost 1 at `now`; returns how many passed.
    fn charge(fw: &FixedWindow, st: &mut Option<FixedWindowState>, now: Nanos, n: u64) -> u64 {
        let mut ok = 0;
        for _ in 0..n {
            let v = fw.evaluate(*st, now, 1);
            if v.decision.allowed {
                match v.state {
                    Some(State::FixedWindow(s)) => *st = Some(s),
                    other => panic!("{other:?}"),
                }
                ok += 1;
            }
        }
        ok
    }

    #[test]
    fn absorbed_usage_counts_in_its_own_window_only() {
        let fw = FixedWindow::new(10, 60 * S);
        let (st, expires) = fw.absorb(None, 61 * S, 62 * S, 4).unwrap();
        assert_eq!(st, FixedWindowState { index: 1, count: 4 });
        assert_eq!(expires, 120 * S);
        let (st, _) = fw.absorb(Some(st), 62 * S, 62 * S, 9).unwrap();
        assert_eq!(st.count, 13);
        assert!(!fw.evaluate(Some(st), 62 * S, 1).decision.allowed);
        // Usage of the window before is forgotten with it.
        assert_eq!(fw.absorb(Some(st), 59 * S, 62 * S, 3), None);
        assert_eq!(fw.absorb(None, 59 * S, 62 * S, 3), None);
    }

    #[test]
    fn counts_within_a_window_and_resets_at_its_end() {
        // 10 per minute: windows [0, 60 s), [60 s, 120 s), ...
        let fw = FixedWindow::new(10, 60 * S);
        let mut st = None;
        let v = fw.evaluate(st, 15 * S, 3);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 7);
        assert_eq!(v.decision.limit, 10);
        assert_eq!(v.decision.reset_after, 45 * S);
        assert_eq!(v.expires_at, 60 * S);
        assert_eq!(charge(&fw, &mut st, 15 * S, 12), 10);
        let d = fw.evaluate(st, 20 * S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Some(40 * S));
        assert_eq!(d.reset_after, 40 * S);
        // One nanosecond before the boundary: still the old window.
        assert!(!fw.evaluate(st, 60 * S - 1, 1).decision.allowed);
        assert_eq!(fw.evaluate(st, 60 * S - 1, 1).decision.retry_after, Some(1));
        // At the boundary: a fresh window.
        let d = fw.evaluate(st, 60 * S, 1).decision;
        assert!(d.allowed);
        assert_eq!(d.remaining, 9);
    }

    #[test]
    fn boundary_burst_lets_twice_the_limit_through() {
        // The documented weakness: 10 at 59.999 s and 10 more at 60 s, i.e.
        // 20 within one millisecond under a limit of 10 per minute.
        let fw = FixedWindow::new(10, 60 * S);
        let mut st = None;
        assert_eq!(charge(&fw, &mut st, 60 * S - MS, 15), 10);
        assert_eq!(charge(&fw, &mut st, 60 * S, 15), 10);
        // ... and then nothing until the next boundary.
        assert_eq!(charge(&fw, &mut st, 119 * S, 1), 0);
    }

    #[test]
    fn cost_is_weighted_and_above_the_limit_is_never() {
        let fw = FixedWindow::new(10, 60 * S);
        let mut st = None;
        assert!(fw.evaluate(st, S, 10).decision.allowed);
        let d = fw.evaluate(st, S, 11).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        assert_eq!(d.remaining, 10);
        // Nothing stored: the denial expires at once.
        assert_eq!(fw.evaluate(st, S, 11).expires_at, S);
        let v = fw.evaluate(st, S, 7);
        st = match v.state {
            Some(State::FixedWindow(s)) => Some(s),
            other => panic!("{other:?}"),
        };
        let d = fw.evaluate(st, S, 4).decision;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 3);
        assert_eq!(d.retry_after, Some(59 * S));
        assert!(fw.evaluate(st, S, 3).decision.allowed);
        assert_eq!(
            fw.evaluate(st, S, u64::from(u32::MAX)).decision.retry_after,
            None
        );
    }

    #[test]
    fn clock_jumps() {
        let fw = FixedWindow::new(2, 10 * S);
        let mut st = None;
        assert_eq!(charge(&fw, &mut st, 5 * S, 2), 2);
        // Far forward: the old window is long gone, a full quota.
        let far = 5 * S + 10 * 365 * 24 * 3600 * S;
        assert_eq!(charge(&fw, &mut st.clone(), far, 3), 2);
        // A state from a later window (the clock went back): honoured, so
        // going back in time grants nothing; it resets when its window ends.
        let future = Some(FixedWindowState { index: 3, count: 2 });
        let d = fw.evaluate(future, 5 * S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(35 * S));
        assert_eq!(fw.evaluate(future, 5 * S, 1).expires_at, 40 * S);
        assert!(fw.evaluate(future, 40 * S, 1).decision.allowed);
        // Up to an hour ahead is a clock behind; further ahead is another
        // window length (a rule changed from 10 s to 1 h: the old index
        // read as hours starts decades from now): afresh.
        let hour = 3600 * S;
        let ahead = Some(FixedWindowState {
            index: (5 * S + hour) / (10 * S),
            count: 2,
        });
        assert!(!fw.evaluate(ahead, 5 * S, 1).decision.allowed);
        let beyond = Some(FixedWindowState {
            index: (5 * S + hour) / (10 * S) + 1,
            count: 2,
        });
        assert!(fw.evaluate(beyond, 5 * S, 1).decision.allowed);
        let lengthened = FixedWindow::new(2, hour);
        let now = 1_700_000_000 * S;
        let old = Some(FixedWindowState {
            index: now / (10 * S),
            count: 2,
        });
        let v = lengthened.evaluate(old, now, 1);
        assert!(v.decision.allowed);
        assert_eq!(v.expires_at, (now / hour + 1) * hour);
        // Absurd indexes do not overflow.
        let absurd = Some(FixedWindowState {
            index: u64::MAX,
            count: 2,
        });
        assert!(fw.evaluate(absurd, 5 * S, 1).decision.allowed);
    }

    #[test]
    fn a_states_window_is_read_back_and_changed() {
        let fw = FixedWindow::new(100, 10 * S);
        let v = fw.evaluate(None, 23 * S, 4);
        let Some(State::FixedWindow(st)) = v.state else {
            panic!("{v:?}")
        };
        assert_eq!(st.window(v.expires_at), Some(10 * S));
        assert_eq!(st.window(v.expires_at + 1), None);
        // Into 60 s windows: the count stays, the window is 60 s's.
        let (moved, end) = FixedWindow::new(100, 60 * S).rewindow(st, 23 * S);
        assert_eq!(moved, FixedWindowState { index: 0, count: 4 });
        assert_eq!(end, 60 * S);
        assert_eq!(moved.window(end), Some(60 * S));
    }

    #[test]
    fn state_expires_at_the_window_end() {
        let fw = FixedWindow::new(5, 10 * S);
        let v = fw.evaluate(None, 23 * S, 1);
        assert_eq!(v.expires_at, 30 * S);
        assert_eq!(v.decision.reset_after, 7 * S);
    }

    #[test]
    fn refund_decrements_the_current_window_only() {
        let fw = FixedWindow::new(10, 60 * S);
        let st = Some(FixedWindowState { index: 0, count: 8 });
        let v = fw.refund(st, 30 * S, 3);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 5);
        assert_eq!(v.decision.retry_after, Some(0));
        assert_eq!(
            v.state,
            Some(State::FixedWindow(FixedWindowState { index: 0, count: 5 }))
        );
        assert_eq!(v.expires_at, 60 * S);
        // Never below zero: the state then carries nothing and expires now.
        let v = fw.refund(st, 30 * S, 100);
        assert_eq!(v.decision.remaining, 10);
        assert_eq!(v.expires_at, 30 * S);
        // A charge of an earlier window is already forgotten.
        let v = fw.refund(st, 61 * S, 3);
        assert_eq!(v.decision.remaining, 10);
        assert_eq!(v.expires_at, 61 * S);
        // No state: nothing to store.
        assert_eq!(fw.refund(None, 30 * S, 1).state, None);
    }
}
