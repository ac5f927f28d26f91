//! Token bucket as GCRA (generic cell rate algorithm).
//!
//! The whole state is one timestamp, the theoretical arrival time `tat`: the
//! moment the bucket would be full again if nothing more were taken. With
//! emission interval `T = period / count` (time to refill one token) and
//! capacity `burst`, a request of cost `c` at `now` is allowed when
//! `max(tat, now) + c*T - now <= burst*T`, and then `tat` moves to
//! `max(tat, now) + c*T`. The tokens left are `(burst*T - (tat - now)) / T`.
//! Time is integer nanoseconds; `T` is rounded down, which makes the bucket
//! refill at most one nanosecond per token early.
//!
//! A `tat` ahead of `now` by more than the tolerance (a state charged under a
//! bigger limit, or "from the future" after a clock jump back) is honoured,
//! not reset: it only drains with time. A `tat` in the past is a full bucket,
//! however far `now` jumped ahead.
//!
//! Refund of `c` units: `tat' = max(tat - c*T, now)`, so the bucket never
//! holds more than `burst` tokens.

use super::{Decision, InvalidLimit, State, Verdict};
use crate::clock::Nanos;

/// `tat - now` never exceeds `tolerance`, kept below 2^62 so that adding it to
/// a `now` below 2^62 (146 years of uptime) cannot overflow.
const MAX_TOLERANCE: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    /// Nanoseconds to refill one token (T).
    emission: Nanos,
    burst: u64,
    /// `burst * T`: how far ahead of `now` the `tat` may run.
    tolerance: Nanos,
}

impl TokenBucket {
    /// `count` tokens every `period` nanoseconds, capacity `burst`.
    pub fn new(count: u64, period: Nanos, burst: u64) -> Result<Self, InvalidLimit> {
        if burst == 0 || burst > super::MAX_COUNT {
            return Err(InvalidLimit::Burst(burst));
        }
        let emission = period / count;
        if emission == 0 {
            return Err(InvalidLimit::RateTooHigh {
                count,
                period_ms: period / crate::clock::NANOS_PER_MS,
            });
        }
        let tolerance = emission
            .checked_mul(burst)
            .filter(|&t| t <= MAX_TOLERANCE)
            .ok_or(InvalidLimit::BurstSpanTooLong { burst })?;
        Ok(Self {
            emission,
            burst,
            tolerance,
        })
    }

    pub fn evaluate(&self, tat: Option<Nanos>, now: Nanos, cost: u64) -> Verdict {
        // A tat in the past means a full bucket.
        let base = tat.map_or(now, |t| t.max(now));
        let backlog = base - now;
        let remaining_before = (self.tolerance - backlog.min(self.tolerance)) / self.emission;
        let increment = cost.saturating_mul(self.emission);
        if increment > self.tolerance {
            // More than the whole bucket: no amount of waiting helps.
            return self.deny(base, now, remaining_before, None);
        }
        let new_tat = base + increment;
        let ahead = new_tat - now;
        if ahead <= self.tolerance {
            Verdict {
                decision: Decision::allow(
                    self.burst,
                    (self.tolerance - ahead) / self.emission,
                    ahead,
                ),
                state: Some(State::TokenBucket { tat: new_tat }),
                expires_at: new_tat,
            }
        } else {
            self.deny(base, now, remaining_before, Some(ahead - self.tolerance))
        }
    }

    fn deny(&self, base: Nanos, now: Nanos, remaining: u64, retry: Option<Nanos>) -> Verdict {
        let decision = Decision {
            allowed: false,
            limit: self.burst,
            remaining,
            reset_after: base - now,
            retry_after: retry,
            lease: None,
        };
        Verdict::denied(decision, base)
    }

    /// Charges `units` used at `at <= now` somewhere else (another region)
    /// without a decision: `tat' = max(tat, at) + units * T`, an absent
    /// state counting as `tat = at`. The result may run past the tolerance:
    /// the key is then denied until it has drained what was overspent. It
    /// is kept within `MAX_TOLERANCE` of `now`, so later arithmetic cannot
    /// overflow. Returns the new `tat` (also its expiry; `<= now`: nothing
    /// left to keep).
    pub fn absorb(&self, tat: Option<Nanos>, at: Nanos, now: Nanos, units: u64) -> Nanos {
        let base = tat.map_or(at, |t| t.max(at));
        base.saturating_add(units.saturating_mul(self.emission))
            .min(now.saturating_add(MAX_TOLERANCE))
    }

    /// Tokens taken out of the bucket at `now`, a token partly refilled
    /// counting as taken: what a refund of any size can give back.
    pub fn in_use(&self, tat: Option<Nanos>, now: Nanos) -> u64 {
        tat.map_or(0, |t| t.saturating_sub(now).div_ceil(self.emission))
    }

    /// Gives `amount` tokens back: `tat` moves back by `amount * T`, but not
    /// before `now` (a full bucket). No state: nothing to give back.
    pub fn refund(&self, tat: Option<Nanos>, now: Nanos, amount: u64) -> Verdict {
        let base = tat.map_or(now, |t| t.max(now));
        let new_tat = base
            .saturating_sub(amount.saturating_mul(self.emission))
            .max(now);
        let ahead = new_tat - now;
        let remaining = (self.tolerance - ahead.min(self.tolerance)) / self.emission;
        Verdict {
            decision: Decision::allow(self.burst, remaining, ahead),
            state: tat.map(|_| State::TokenBucket { tat: new_tat }),
            expires_at: new_tat,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    fn run(tb: &TokenBucket, tat: &mut Option<Nanos>, now: Nanos, cost: u64) -> Decision {
        let v = tb.evaluate(*tat, now, cost);
        if v.decision.allowed {
            match v.state {
                Some(State::TokenBucket { tat: t }) => *tat = Some(t),
                _ => unreachable!(),
            }
        }
        v.decision
    }

    #[test]
    fn seed_example_rate_5_per_s_burst_10() {
        // seeds/002: 12 requests at once -> 10 allowed, 2 denied, retry 0.2 s;
        // one second later 5 more are allowed.
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let mut tat = None;
        let t = 100 * S;
        let mut allowed = 0;
        for i in 0..10 {
            let d = run(&tb, &mut tat, t, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, 9 - i);
            allowed += 1;
        }
        assert_eq!(allowed, 10);
        for _ in 0..2 {
            let d = run(&tb, &mut tat, t, 1);
            assert!(!d.allowed);
            assert_eq!(d.remaining, 0);
            assert_eq!(d.retry_after, Some(200 * MS));
            assert_eq!(d.reset_after, 2 * S);
            assert_eq!(d.limit, 10);
        }
        let later = t + S;
        let ok = (0..10)
            .filter(|_| run(&tb, &mut tat, later, 1).allowed)
            .count();
        assert_eq!(ok, 5);
    }

    #[test]
    fn absorbed_usage_is_charged_at_its_time_without_a_decision() {
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let t = 100 * S;
        // 3 tokens used elsewhere 400 ms ago: 2 of the 5 refills since
        // then are already back.
        let tat = tb.absorb(None, t - 400 * MS, t, 3);
        assert_eq!(tat, t + 200 * MS);
        let mut state = Some(tat);
        assert_eq!(run(&tb, &mut state, t, 1).remaining, 8);
        // Usage older than the bucket's refill leaves nothing behind.
        assert!(tb.absorb(None, t - S, t, 2) <= t);
        // Beyond the burst: the debt is kept and drained before anything
        // passes again.
        let tat = tb.absorb(Some(t), t, t, 15);
        assert_eq!(tat, t + 3 * S);
        let d = run(&tb, &mut Some(tat), t, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(S + 200 * MS));
        // Never further ahead than the arithmetic allows.
        assert_eq!(tb.absorb(Some(t), t, t, u64::MAX), t + MAX_TOLERANCE);
    }

    #[test]
    fn refill_is_continuous() {
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let mut tat = None;
        let t = S;
        for _ in 0..10 {
            assert!(run(&tb, &mut tat, t, 1).allowed);
        }
        // 199 ms later: not a whole token yet.
        let d = run(&tb, &mut tat, t + 199 * MS, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(MS));
        // 200 ms: exactly one.
        let d = run(&tb, &mut tat, t + 200 * MS, 1);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn cost_is_weighted() {
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let mut tat = None;
        let d = run(&tb, &mut tat, S, 7);
        assert!(d.allowed);
        assert_eq!(d.remaining, 3);
        let d = run(&tb, &mut tat, S, 4);
        assert!(!d.allowed);
        assert_eq!(d.remaining, 3);
        // Needs one more token: 200 ms.
        assert_eq!(d.retry_after, Some(200 * MS));
        let d = run(&tb, &mut tat, S, 3);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn cost_above_burst_is_never() {
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let d = tb.evaluate(None, S, 11).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        assert_eq!(d.remaining, 10);
        // u32::MAX cost does not overflow either.
        let d = tb.evaluate(None, S, u64::from(u32::MAX)).decision;
        assert_eq!(d.retry_after, None);
        // Exactly the burst is fine on a full bucket.
        assert!(tb.evaluate(None, S, 10).decision.allowed);
    }

    #[test]
    fn full_bucket_expires_and_idle_time_does_not_overfill() {
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let mut tat = None;
        let v = tb.evaluate(tat, S, 3);
        assert_eq!(v.expires_at, S + 600 * MS);
        run(&tb, &mut tat, S, 3);
        // An hour idle: still only `burst` tokens.
        let d = run(&tb, &mut tat, 3600 * S, 1);
        assert_eq!(d.remaining, 9);
    }

    #[test]
    fn clock_at_or_before_tat_never_refills() {
        // `now` equal to the previous call (same instant) gives no refill.
        let tb = TokenBucket::new(1, S, 1).unwrap();
        let mut tat = None;
        assert!(run(&tb, &mut tat, 5 * S, 1).allowed);
        assert!(!run(&tb, &mut tat, 5 * S, 1).allowed);
        // A state from the future (e.g. replicated) is honoured, not reset.
        let d = tb.evaluate(Some(10 * S), 5 * S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.reset_after, 5 * S);
        assert_eq!(d.retry_after, Some(5 * S));
    }

    #[test]
    fn fractional_emission_interval() {
        // 3 per second: T = 333_333_333 ns, rounded down.
        let tb = TokenBucket::new(3, S, 3).unwrap();
        let mut tat = None;
        for _ in 0..3 {
            assert!(run(&tb, &mut tat, S, 1).allowed);
        }
        assert!(!run(&tb, &mut tat, S, 1).allowed);
        assert!(run(&tb, &mut tat, S + 333_333_333, 1).allowed);
    }

    #[test]
    fn clock_jump_forward_gives_a_full_bucket_only() {
        let tb = TokenBucket::new(5, S, 10).unwrap();
        let mut tat = None;
        for _ in 0..10 {
            assert!(run(&tb, &mut tat, S, 1).allowed);
        }
        // Years later: still `burst`, never more.
        let far = S + 3 * 365 * 24 * 3600 * S;
        let v = tb.evaluate(tat, far, 10);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 0);
        assert!(!tb.evaluate(tat, far, 11).decision.allowed);
    }

    #[test]
    fn refund_moves_tat_back_but_never_past_full() {
        // An LLM budget: 10_000 tokens per minute, burst 10_000; a call is
        // charged 4000 up front and gives back the 2800 it did not use.
        let tb = TokenBucket::new(10_000, 60 * S, 10_000).unwrap();
        let mut tat = None;
        let d = run(&tb, &mut tat, S, 4000);
        assert_eq!(d.remaining, 6000);
        let v = tb.refund(tat, S, 2800);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.remaining, 8800);
        assert_eq!(v.decision.retry_after, Some(0));
        // T = 6 ms: 1200 tokens in the bucket's debt.
        assert_eq!(v.decision.reset_after, 1200 * 6 * MS);
        assert_eq!(v.state, Some(State::TokenBucket { tat: S + 7200 * MS }));
        assert_eq!(v.expires_at, S + 7200 * MS);
        // Refunding more than was taken stops at a full bucket.
        let v = tb.refund(Some(S + 7200 * MS), S, 1_000_000);
        assert_eq!(v.decision.remaining, 10_000);
        assert_eq!(v.state, Some(State::TokenBucket { tat: S }));
        assert_eq!(v.expires_at, S, "a full bucket expires at once");
        // Nothing taken, nothing stored: answered as full.
        let v = tb.refund(None, S, 5);
        assert_eq!(v.state, None);
        assert_eq!(v.decision.remaining, 10_000);
        assert_eq!(v.decision.reset_after, 0);
        // A tat in the past is a full bucket already.
        let v = tb.refund(Some(S / 2), S, 5);
        assert_eq!(v.state, Some(State::TokenBucket { tat: S }));
        assert_eq!(v.decision.remaining, 10_000);
    }

    #[test]
    fn rejects_impossible_limits() {
        assert_eq!(TokenBucket::new(5, S, 0), Err(InvalidLimit::Burst(0)));
        assert!(matches!(
            TokenBucket::new(2_000_000_000, S, 1),
            Err(InvalidLimit::RateTooHigh { .. })
        ));
        assert!(matches!(
            TokenBucket::new(1, 400 * 24 * 3600 * S, 1 << 40),
            Err(InvalidLimit::BurstSpanTooLong { .. })
        ));
    }
}
