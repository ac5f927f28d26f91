//! Sliding window counter: two fixed windows blended by overlap.
//!
//! Time is cut into windows of length `W`. The state keeps the index of the
//! current window and the counts of that window and the one before. The
//! estimated usage at offset `o` into the current window is
//! `prev * (W - o) / W + cur`: the previous window counts for the part of it
//! that still overlaps the last `W`. A request of cost `c` passes when
//! `estimate + c <= limit`. All arithmetic is exact (integers scaled by `W`,
//! in `u128`), so boundaries behave the same every time.
//!
//! A state from a later window than `now`'s (a clock that went back, or
//! state written by a node whose clock is ahead, met after a failover) is
//! honoured, not reset: it is read as at the start of its own window, and
//! a charge or refund applies to that window. So going back in time never
//! grants fresh quota; the state resets when its own windows end, as the
//! other algorithms' states do. A window starting more than
//! [`MAX_WINDOW_LEAD`](super::MAX_WINDOW_LEAD) ahead was counted under
//! another window length (a changed rule) and starts afresh.
//!
//! Refund of `c` units takes them off the current window's count, and what
//! the current window does not hold off the previous one (a request charged
//! just before a boundary and refunded just after it gets its units back),
//! never below zero.

use super::{later_window_honoured, Decision, State, Verdict};
use crate::clock::Nanos;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    limit: u64,
    /// Window length in nanoseconds (>= 1 ms, validated by `Policy`).
    window: Nanos,
}

/// Counts of the current and previous windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowState {
    /// Index of the current window: `now / W` when it was last charged.
    pub index: u64,
    pub prev: u64,
    pub cur: u64,
}

impl SlidingWindow {
    /// The window length, in nanoseconds.
    pub fn window(&self) -> Nanos {
        self.window
    }

    pub fn new(limit: u64, window: Nanos) -> Self {
        Self { limit, window }
    }

    pub fn evaluate(&self, state: Option<WindowState>, now: Nanos, cost: u64) -> Verdict {
        let w = self.window;
        let Window {
            index,
            prev,
            cur,
            at,
        } = self.in_force(state, now);
        let offset = at % w;
        let lead = at - now;
        let wide = |x: u64| u128::from(x);
        let capacity = wide(self.limit) * wide(w);
        let used = wide(prev) * wide(w - offset) + wide(cur) * wide(w);
        let charge = wide(cost) * wide(w);
        let window_end = self.window_end(index);

        if used + charge <= capacity {
            let cur = cur + cost;
            let used = used + charge;
            let state = WindowState { index, prev, cur };
            // `cur > 0` now, so the state matters until the next window ends.
            let expires_at = window_end.saturating_add(w);
            return Verdict {
                decision: Decision::allow(
                    self.limit,
                    ((capacity - used) / wide(w)) as u64,
                    expires_at - now,
                ),
                state: Some(State::SlidingWindow(state)),
                expires_at,
            };
        }

        let retry_after = self
            .retry_after(prev, cur, offset, cost)
            .map(|r| r.saturating_add(lead));
        let expires_at = expiry(prev, cur, window_end, w, now);
        let decision = Decision {
            allowed: false,
            limit: self.limit,
            remaining: (capacity.saturating_sub(used) / wide(w)) as u64,
            reset_after: expires_at - now,
            retry_after,
            lease: None,
        };
        Verdict::denied(decision, expires_at)
    }

    /// Charges `units` used at `at <= now` somewhere else (another region)
    /// without a decision, to the window holding `at`: the current one or
    /// the previous one; usage older than that no longer counts (`None`:
    /// the state stays as it is). Counts may pass the limit (the key is
    /// denied until they weigh less), never `MAX_COUNT`. Returns the new
    /// state and its expiry.
    pub fn absorb(
        &self,
        state: Option<WindowState>,
        at: Nanos,
        now: Nanos,
        units: u64,
    ) -> Option<(WindowState, Nanos)> {
        let w = self.window;
        // The windows in force (a state from a later window stays as it is).
        let Window {
            index,
            mut prev,
            mut cur,
            ..
        } = self.in_force(state, now);
        let add = |count: u64| count.saturating_add(units).min(super::MAX_COUNT);
        match index.saturating_sub(at.min(now) / w) {
            0 => cur = add(cur),
            1 => prev = add(prev),
            _ => return None,
        }
        let expires_at = expiry(prev, cur, self.window_end(index), w, now);
        Some((WindowState { index, prev, cur }, expires_at))
    }

    /// Units counted in the two windows in force at `now` (what a refund
    /// can take back from).
    pub fn in_use(&self, state: Option<WindowState>, now: Nanos) -> u64 {
        state.map_or(0, |s| {
            let w = self.in_force(Some(s), now);
            w.prev.saturating_add(w.cur)
        })
    }

    /// Gives `amount` units back: off the current window first, then off the
    /// previous one, never below zero. No state: nothing to give back.
    pub fn refund(&self, state: Option<WindowState>, now: Nanos, amount: u64) -> Verdict {
        let w = self.window;
        let Window {
            index,
            prev,
            cur,
            at,
        } = self.in_force(state, now);
        let offset = at % w;
        let from_cur = amount.min(cur);
        let from_prev = (amount - from_cur).min(prev);
        let (prev, cur) = (prev - from_prev, cur - from_cur);
        let wide = |x: u64| u128::from(x);
        let capacity = wide(self.limit) * wide(w);
        let used = wide(prev) * wide(w - offset) + wide(cur) * wide(w);
        let expires_at = expiry(prev, cur, self.window_end(index), w, now);
        Verdict {
            decision: Decision::allow(
                self.limit,
                (capacity.saturating_sub(used) / wide(w)) as u64,
                expires_at - now,
            ),
            state: state.map(|_| State::SlidingWindow(WindowState { index, prev, cur })),
            expires_at,
        }
    }

    /// The stored windows rolled forward to `now`'s window. A state older
    /// than the previous window counts as empty. A state from a *later*
    /// window than `now`'s (written by a node whose clock is ahead, or
    /// before this clock went back) is honoured as it stands, read as at
    /// the start of its own window: going back in time never grants quota
    /// (up to [`MAX_WINDOW_LEAD`](super::MAX_WINDOW_LEAD) ahead; further
    /// is another window length, and starts afresh).
    fn in_force(&self, state: Option<WindowState>, now: Nanos) -> Window {
        let index = now / self.window;
        let (index, prev, cur) = match state {
            Some(s) if s.index == index => (s.index, s.prev, s.cur),
            Some(s) if s.index > index && later_window_honoured(s.index, self.window, now) => {
                (s.index, s.prev, s.cur)
            }
            Some(s) if s.index.checked_add(1) == Some(index) => (index, s.cur, 0),
            _ => (index, 0, 0),
        };
        let at = now.max(index.saturating_mul(self.window));
        Window {
            index,
            prev,
            cur,
            at,
        }
    }

    /// End of window `index` (saturating: a state from far ahead must not
    /// overflow).
    fn window_end(&self, index: u64) -> Nanos {
        index.saturating_add(1).saturating_mul(self.window)
    }

    /// Time until a request of `cost` would pass, if nothing else is charged.
    fn retry_after(&self, prev: u64, cur: u64, offset: Nanos, cost: u64) -> Option<Nanos> {
        if cost > self.limit {
            return None;
        }
        let w = u128::from(self.window);
        // Smallest offset `o` within a window where `p * (W - o) <= budget`.
        let first_fit = |p: u64, budget: u128| -> u128 {
            // No weight left to decay (p == 0): fits from the window's start.
            budget
                .checked_div(u128::from(p))
                .map_or(0, |room| w - room.min(w))
        };
        if cur + cost <= self.limit {
            // Waiting inside this window: the previous window's weight decays.
            let budget = u128::from(self.limit - cur - cost) * w;
            let at = first_fit(prev, budget);
            Some((at - u128::from(offset)) as Nanos)
        } else {
            // Only the next window helps, where `cur` becomes the weighted part.
            let budget = u128::from(self.limit - cost) * w;
            let at = first_fit(cur, budget);
            Some((w - u128::from(offset) + at) as Nanos)
        }
    }
}

/// The windows a request is evaluated against.
struct Window {
    /// The current window's index: `now`'s, or a later one a state holds.
    index: u64,
    prev: u64,
    cur: u64,
    /// The moment they are read at: `now`, or the start of a later window.
    at: Nanos,
}

/// When counts `prev` and `cur` of the window ending at `window_end` stop
/// mattering: the current count weighs until the next window ends, the
/// previous one until this window ends.
fn expiry(prev: u64, cur: u64, window_end: Nanos, w: Nanos, now: Nanos) -> Nanos {
    if cur > 0 {
        window_end.saturating_add(w)
    } else if prev > 0 {
        window_end
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn charge(sw: &SlidingWindow, st: &mut Option<WindowState>, now: Nanos, n: u64) -> u64 {
        let mut ok = 0;
        for _ in 0..n {
            let v = sw.evaluate(*st, now, 1);
            if v.decision.allowed {
                if let Some(State::SlidingWindow(s)) = v.state {
                    *st = Some(s);
                }
                ok += 1;
            }
        }
        ok
    }

    #[test]
    fn seed_example_boundary_weighting() {
        // seeds/002: limit 100 per 60 s; 100 at the end of window 0, then
        // 10% into window 1 only 10 fit, 90% into window 1 80 more fit.
        let sw = SlidingWindow::new(100, 60 * S);
        let mut st = None;
        assert_eq!(charge(&sw, &mut st, 59 * S, 100), 100);
        assert_eq!(charge(&sw, &mut st, 66 * S, 100), 10);
        assert_eq!(charge(&sw, &mut st, 114 * S, 100), 80);
    }

    #[test]
    fn absorbed_usage_lands_in_the_window_it_was_made_in() {
        let sw = SlidingWindow::new(100, 60 * S);
        // 30 used elsewhere late in window 1, learnt early in window 2.
        let (st, expires) = sw.absorb(None, 119 * S, 126 * S, 30).unwrap();
        assert_eq!(
            st,
            WindowState {
                index: 2,
                prev: 30,
                cur: 0
            }
        );
        assert_eq!(expires, 180 * S);
        // It weighs as the previous window does: 90% of 30 is 27.
        let v = sw.evaluate(Some(st), 126 * S, 1);
        assert_eq!(v.decision.remaining, 100 - 27 - 1);
        // Usage of this window adds to the current count, past the limit
        // if need be: nothing passes until it weighs less.
        let (st, _) = sw.absorb(Some(st), 125 * S, 126 * S, 90).unwrap();
        assert_eq!((st.prev, st.cur), (30, 90));
        assert!(!sw.evaluate(Some(st), 126 * S, 1).decision.allowed);
        // Older usage no longer counts.
        assert_eq!(sw.absorb(Some(st), 59 * S, 126 * S, 5), None);
    }

    #[test]
    fn seed_example_estimate() {
        // seeds/003: 40 s into the minute, prev 80, cur 30: estimate 56.67,
        // so 43 more fit under 100.
        let sw = SlidingWindow::new(100, 60 * S);
        let mut st = Some(WindowState {
            index: 1,
            prev: 80,
            cur: 30,
        });
        let v = sw.evaluate(st, 100 * S, 1);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 42);
        assert_eq!(charge(&sw, &mut st, 100 * S, 100), 43);
    }

    #[test]
    fn a_state_from_a_later_window_is_honoured() {
        // A node whose clock is behind (after a failover, or a clock that
        // went back) meets state charged in window 3 while its own clock is
        // in window 0: the state is read as at the start of its own window,
        // never as empty, so going back in time grants nothing.
        let sw = SlidingWindow::new(10, 10 * S);
        let full = Some(WindowState {
            index: 3,
            prev: 4,
            cur: 10,
        });
        let v = sw.evaluate(full, 5 * S, 1);
        assert!(!v.decision.allowed);
        assert_eq!(v.decision.remaining, 0);
        // Read at 30 s (its window's start): cur = 10 must decay to 9 in
        // window 4, i.e. 1 s into it, at 41 s: 36 s from now.
        assert_eq!(v.decision.retry_after, Some(41 * S - 5 * S));
        // Its count matters until window 4 ends.
        assert_eq!(v.expires_at, 50 * S);
        assert_eq!(v.decision.reset_after, 45 * S);
        // A later state with room: charged in its own window, which stays.
        let room = Some(WindowState {
            index: 3,
            prev: 0,
            cur: 2,
        });
        let v = sw.evaluate(room, 5 * S, 1);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 7);
        assert_eq!(
            v.state,
            Some(State::SlidingWindow(WindowState {
                index: 3,
                prev: 0,
                cur: 3
            }))
        );
        assert_eq!(v.expires_at, 50 * S);
        // A refund takes from that window too.
        let v = sw.refund(room, 5 * S, 1);
        assert_eq!(
            v.state,
            Some(State::SlidingWindow(WindowState {
                index: 3,
                prev: 0,
                cur: 1
            }))
        );
        assert_eq!(v.decision.remaining, 9);
        // Further ahead than an hour: counted under another window length
        // (a rule lengthened from 10 s to 1 min), so afresh. Absurd indexes
        // do not overflow.
        let lengthened = SlidingWindow::new(10, 60 * S);
        let now = 1_700_000_000 * S;
        for index in [now / (10 * S), u64::MAX] {
            let old = Some(WindowState {
                index,
                prev: 10,
                cur: 10,
            });
            let v = lengthened.evaluate(old, now, 1);
            assert!(v.decision.allowed, "{index}");
            assert_eq!(v.decision.remaining, 9);
        }
    }

    #[test]
    fn retry_after_inside_the_window() {
        // limit 10 per 10 s, 10 used in window 0; at 10 s + 0: prev 10 weight 1.
        let sw = SlidingWindow::new(10, 10 * S);
        let mut st = None;
        assert_eq!(charge(&sw, &mut st, 5 * S, 10), 10);
        let d = sw.evaluate(st, 10 * S, 1).decision;
        assert!(!d.allowed);
        // Needs prev*(W-o)/W <= 9: o >= 1 s.
        assert_eq!(d.retry_after, Some(S));
        // And indeed at 11 s one passes, the next one does not.
        assert_eq!(charge(&sw, &mut st, 11 * S, 2), 1);
    }

    #[test]
    fn retry_after_needs_next_window() {
        let sw = SlidingWindow::new(10, 10 * S);
        let mut st = None;
        assert_eq!(charge(&sw, &mut st, 2 * S, 10), 10);
        let d = sw.evaluate(st, 4 * S, 3).decision;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        // Next window starts at 10 s (6 s away); there cur=10 weighs
        // 10*(W-o)/W <= 7 from o = 3 s: 9 s in total.
        assert_eq!(d.retry_after, Some(9 * S));
        assert!(!sw.evaluate(st, 13 * S - 1, 3).decision.allowed);
        assert!(sw.evaluate(st, 13 * S, 3).decision.allowed);
    }

    #[test]
    fn idle_windows_reset_and_expire() {
        let sw = SlidingWindow::new(5, 10 * S);
        let mut st = None;
        let v = sw.evaluate(st, 3 * S, 2);
        // Charged in window 0: matters until window 1 ends.
        assert_eq!(v.expires_at, 20 * S);
        assert_eq!(v.decision.reset_after, 17 * S);
        charge(&sw, &mut st, 3 * S, 5);
        // Two windows later everything is forgotten.
        assert_eq!(charge(&sw, &mut st, 25 * S, 5), 5);
    }

    #[test]
    fn cost_above_limit_is_never() {
        let sw = SlidingWindow::new(5, 10 * S);
        let d = sw.evaluate(None, S, 6).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        assert_eq!(d.remaining, 5);
        assert!(sw.evaluate(None, S, 5).decision.allowed);
    }

    #[test]
    fn lowered_limit_does_not_underflow() {
        // State charged under a limit of 100, now checked under 10.
        let sw = SlidingWindow::new(10, 10 * S);
        let st = Some(WindowState {
            index: 0,
            prev: 0,
            cur: 50,
        });
        let d = sw.evaluate(st, S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn refund_takes_from_the_current_window_then_the_previous() {
        let sw = SlidingWindow::new(10, 10 * S);
        let mut st = None;
        assert_eq!(charge(&sw, &mut st, 8 * S, 6), 6);
        // Same window: back to 4 used.
        let v = sw.refund(st, 9 * S, 2);
        assert_eq!(
            v.state,
            Some(State::SlidingWindow(WindowState {
                index: 0,
                prev: 0,
                cur: 4
            }))
        );
        assert_eq!(v.decision.remaining, 6);
        assert!(v.decision.allowed);
        // Just after the boundary the charge sits in the previous window:
        // at 12 s it weighs 80%, 6 * 0.8 = 4.8 -> 5 left; refunding 3 of it
        // leaves 3 * 0.8 = 2.4 -> 7 left.
        let v = sw.refund(st, 12 * S, 3);
        assert_eq!(
            v.state,
            Some(State::SlidingWindow(WindowState {
                index: 1,
                prev: 3,
                cur: 0
            }))
        );
        assert_eq!(v.decision.remaining, 7);
        assert_eq!(v.expires_at, 20 * S);
        // More than was charged: stops at empty, the state expires now.
        let v = sw.refund(st, 9 * S, 100);
        assert_eq!(v.decision.remaining, 10);
        assert_eq!(v.expires_at, 9 * S);
        assert_eq!(v.decision.reset_after, 0);
        // No state: no-op, answered as empty.
        let v = sw.refund(None, 9 * S, 1);
        assert_eq!(v.state, None);
        assert_eq!(v.decision.remaining, 10);
    }
}
