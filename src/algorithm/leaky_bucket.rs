//! Leaky bucket as a meter: smooth spacing with a bounded tolerance.
//!
//! Picture a bucket of depth `burst` that drains one unit every
//! `T = period / count`. Each request pours its cost in; it passes when the
//! bucket does not overflow. With `burst = 1` that means requests at least
//! `T` apart, no bursts at all: the output is perfectly smooth. A larger
//! `burst` is the queue depth, the tolerance for requests that arrive early
//! (jitter): up to `burst` may arrive back to back, after which they are
//! held to one per `T` again.
//!
//! The state is one timestamp, the time the bucket will be empty ("the
//! theoretical arrival time" of GCRA): a request of cost `c` at `now` passes
//! when `max(tat, now) + c*T - now <= burst*T`, and `tat` moves to
//! `max(tat, now) + c*T`. `remaining` is the free depth,
//! `(burst*T - (tat - now)) / T`; `reset_after` is `tat - now` (when the
//! bucket is empty); when denied, `retry_after` is the time until enough has
//! drained; a cost above `burst` never fits.
//!
//! **Versus the token bucket.** As a meter (deciding, not delaying), the
//! leaky bucket and the token bucket are the same algorithm seen from two
//! sides: a bucket filling with requests and draining at the rate, or a
//! bucket of tokens refilling at the rate and emptied by requests. Both are
//! GCRA and Tollgate runs the same arithmetic ([`TokenBucket`]) for both, so
//! for the same numbers they decide the same. What differs is the intent and
//! how the numbers are read: the token bucket is configured by a capacity
//! (how big a burst to grant, by default the rate's count: "100/s" allows
//! 100 at once), the leaky bucket by its spacing and a tolerance (by default
//! 1: "100/s" means one request every 10 ms, never two closer). The leaky
//! bucket's state is also kept apart from a token bucket's, so switching a
//! key between the two starts it afresh. (A leaky bucket *as a queue*, which
//! delays requests instead of refusing them, is a traffic shaper and not
//! something a counter server can do for its callers.)
//!
//! Refund of `c` units moves `tat` back by `c*T`, not before `now` (an empty
//! bucket); clock jumps behave as the token bucket's (a `tat` in the past is
//! an empty bucket, one from the future is honoured).

use super::{InvalidLimit, State, TokenBucket, Verdict};
use crate::clock::Nanos;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    /// The same GCRA: spacing `T = period / count`, tolerance `burst * T`.
    gcra: TokenBucket,
}

impl LeakyBucket {
    /// Drains `count` units every `period` nanoseconds; depth `burst` (>= 1).
    pub fn new(count: u64, period: Nanos, burst: u64) -> Result<Self, InvalidLimit> {
        TokenBucket::new(count, period, burst).map(|gcra| Self { gcra })
    }

    pub fn evaluate(&self, tat: Option<Nanos>, now: Nanos, cost: u64) -> Verdict {
        retag(self.gcra.evaluate(tat, now, cost))
    }

    /// Units in the bucket at `now` (see [`TokenBucket::in_use`]).
    pub fn in_use(&self, tat: Option<Nanos>, now: Nanos) -> u64 {
        self.gcra.in_use(tat, now)
    }

    /// Takes `amount` units back out of the bucket, never below empty.
    pub fn refund(&self, tat: Option<Nanos>, now: Nanos, amount: u64) -> Verdict {
        retag(self.gcra.refund(tat, now, amount))
    }
}

/// The GCRA verdict with its state filed under the leaky bucket.
fn retag(mut verdict: Verdict) -> Verdict {
    verdict.state = match verdict.state {
        Some(State::TokenBucket { tat }) => Some(State::LeakyBucket { tat }),
        other => other,
    };
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Decision;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn run(lb: &LeakyBucket, tat: &mut Option<Nanos>, now: Nanos, cost: u64) -> Decision {
        let v = lb.evaluate(*tat, now, cost);
        if v.decision.allowed {
            match v.state {
                Some(State::LeakyBucket { tat: t }) => *tat = Some(t),
                other => panic!("{other:?}"),
            }
        }
        v.decision
    }

    #[test]
    fn burst_one_enforces_strict_spacing() {
        // 10 per second, tolerance 1: one request every 100 ms exactly.
        let lb = LeakyBucket::new(10, S, 1).unwrap();
        let mut tat = None;
        let d = run(&lb, &mut tat, S, 1);
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining), (1, 0));
        assert_eq!(d.reset_after, 100 * MS);
        let d = run(&lb, &mut tat, S + 40 * MS, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(60 * MS));
        assert!(!run(&lb, &mut tat, S + 100 * MS - 1, 1).allowed);
        assert!(run(&lb, &mut tat, S + 100 * MS, 1).allowed);
        // Ten in a second, evenly spaced, and no more.
        let mut tat = None;
        let passed = (0..1000u64)
            .filter(|ms| run(&lb, &mut tat, S + ms * MS, 1).allowed)
            .count();
        assert_eq!(passed, 10);
    }

    #[test]
    fn burst_is_the_tolerance_for_early_arrivals() {
        // Depth 3: three back to back, then one per 100 ms again.
        let lb = LeakyBucket::new(10, S, 3).unwrap();
        let mut tat = None;
        for left in [2, 1, 0] {
            assert_eq!(run(&lb, &mut tat, S, 1).remaining, left);
        }
        let d = run(&lb, &mut tat, S, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(100 * MS));
        assert_eq!(d.reset_after, 300 * MS);
        assert!(run(&lb, &mut tat, S + 100 * MS, 1).allowed);
        assert!(!run(&lb, &mut tat, S + 150 * MS, 1).allowed);
    }

    #[test]
    fn same_decisions_as_the_token_bucket_but_its_own_state() {
        let lb = LeakyBucket::new(5, S, 2).unwrap();
        let tb = TokenBucket::new(5, S, 2).unwrap();
        for (tat, now, cost) in [
            (None, S, 1),
            (Some(S + 300 * MS), S, 2),
            (Some(S), 2 * S, 3),
        ] {
            let (l, t) = (lb.evaluate(tat, now, cost), tb.evaluate(tat, now, cost));
            assert_eq!(l.decision, t.decision);
            assert_eq!(l.expires_at, t.expires_at);
            if let Some(State::TokenBucket { tat }) = t.state {
                assert_eq!(l.state, Some(State::LeakyBucket { tat }));
            }
        }
    }

    #[test]
    fn cost_above_depth_is_never_and_clock_jumps() {
        let lb = LeakyBucket::new(10, S, 2).unwrap();
        let d = lb.evaluate(None, S, 3).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        // Far forward: an empty bucket, not a deeper one.
        let mut tat = Some(S + 200 * MS);
        let far = 1000 * 24 * 3600 * S;
        assert!(run(&lb, &mut tat, far, 2).allowed);
        assert!(!run(&lb, &mut tat, far, 1).allowed);
        // From the future: honoured.
        let d = lb.evaluate(Some(10 * S), S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(9 * S - 100 * MS));
        assert_eq!(lb.evaluate(Some(10 * S), S, 1).expires_at, 10 * S);
    }

    #[test]
    fn refund_drains_but_not_below_empty() {
        let lb = LeakyBucket::new(10, S, 5).unwrap();
        let v = lb.refund(Some(S + 400 * MS), S, 3);
        assert_eq!(v.state, Some(State::LeakyBucket { tat: S + 100 * MS }));
        assert_eq!(v.decision.remaining, 4);
        assert!(v.decision.allowed);
        let v = lb.refund(Some(S + 400 * MS), S, 30);
        assert_eq!(v.state, Some(State::LeakyBucket { tat: S }));
        assert_eq!(v.expires_at, S);
        assert_eq!(lb.refund(None, S, 1).state, None);
    }

    #[test]
    fn burst_zero_is_refused() {
        assert_eq!(LeakyBucket::new(10, S, 0), Err(InvalidLimit::Burst(0)));
    }
}
