//! The limiting algorithms, as pure functions of (policy, state, now, cost).
//!
//! No I/O, no locks, no clock: the store hands each algorithm the key's
//! current state and the server's `now`, and gets back a [`Verdict`] holding
//! the decision and the state to keep if the request is charged. A denied
//! request never changes state. Each state also says when it stops carrying
//! information (`expires_at`), which is when the store may forget the key.
//!
//! A wire [`Limit`] becomes a [`Policy`] through [`Policy::from_limit`], which
//! is where impossible numbers (zero rates, overflowing products) are refused.

mod sliding_window;
mod token_bucket;

pub use sliding_window::{SlidingWindow, WindowState};
pub use token_bucket::TokenBucket;

use crate::clock::{Nanos, NANOS_PER_MS};
use tollgate_protocol::{Algorithm, Limit};

/// Longest accepted period or window: 400 days, enough for yearly plans'
/// daily/monthly caps while keeping every product well inside `u64`.
pub const MAX_PERIOD_MS: u64 = 400 * 24 * 3600 * 1000;

/// Largest accepted count or burst (2^48): far above any real limit, and
/// small enough that sums with a `u32` cost cannot overflow.
pub const MAX_COUNT: u64 = 1 << 48;

/// Why a limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLimit {
    #[error("count must be between 1 and {MAX_COUNT}, got {0}")]
    Count(u64),
    #[error("period must be between 1 ms and {MAX_PERIOD_MS} ms, got {0} ms")]
    Period(u64),
    #[error("token bucket burst must be between 1 and {MAX_COUNT}, got {0}")]
    Burst(u64),
    #[error("sliding window takes no burst (must be 0), got {0}")]
    UnexpectedBurst(u64),
    #[error("rate too high: {count} per {period_ms} ms is more than one per nanosecond")]
    RateTooHigh { count: u64, period_ms: u64 },
    #[error("burst {burst} at this rate spans more time than the server can represent")]
    BurstSpanTooLong { burst: u64 },
    #[error("cost must be at least 1")]
    ZeroCost,
}

/// A rate-limit decision in server units (nanoseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    /// Time until the state is back to full (nothing left to forget).
    pub reset_after: Nanos,
    /// When denied: time until the same request could pass, `None` when it
    /// never can (cost above the limit). `Some(0)` when allowed.
    pub retry_after: Option<Nanos>,
}

impl Decision {
    /// The wire form, rounding times up to whole milliseconds so a client
    /// that waits `retry_after_ms` is never early.
    pub fn to_wire(self, pair: u8) -> tollgate_protocol::Decision {
        tollgate_protocol::Decision {
            allowed: self.allowed,
            shadow_denied: false,
            pair,
            limit: self.limit,
            remaining: self.remaining,
            reset_after_ms: self.reset_after.div_ceil(NANOS_PER_MS),
            retry_after_ms: match self.retry_after {
                Some(ns) => ns.div_ceil(NANOS_PER_MS),
                None => tollgate_protocol::RETRY_NEVER,
            },
        }
    }
}

/// Per-key state: the smallest thing each algorithm needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// GCRA's theoretical arrival time.
    TokenBucket {
        tat: Nanos,
    },
    SlidingWindow(WindowState),
}

/// What evaluating one request yields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// The state to store when the request is charged (only meaningful when
    /// allowed; a denied request keeps the old state).
    pub state: State,
    /// When `state` stops carrying information and may be dropped.
    pub expires_at: Nanos,
}

/// A validated limit in server units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    TokenBucket(TokenBucket),
    SlidingWindow(SlidingWindow),
}

impl Policy {
    /// Checks a wire limit and converts it to server units.
    pub fn from_limit(limit: &Limit) -> Result<Self, InvalidLimit> {
        if limit.count == 0 || limit.count > MAX_COUNT {
            return Err(InvalidLimit::Count(limit.count));
        }
        if limit.period_ms == 0 || limit.period_ms > MAX_PERIOD_MS {
            return Err(InvalidLimit::Period(limit.period_ms));
        }
        let period = limit.period_ms * NANOS_PER_MS;
        match limit.algorithm {
            Algorithm::TokenBucket => {
                TokenBucket::new(limit.count, period, limit.burst).map(Policy::TokenBucket)
            }
            Algorithm::SlidingWindow => {
                if limit.burst != 0 {
                    return Err(InvalidLimit::UnexpectedBurst(limit.burst));
                }
                Ok(Policy::SlidingWindow(SlidingWindow::new(
                    limit.count,
                    period,
                )))
            }
        }
    }

    /// Evaluates a request of `cost` against `state` (None: no state, or
    /// state of another algorithm, which is treated as fresh).
    pub fn evaluate(&self, state: Option<&State>, now: Nanos, cost: u32) -> Verdict {
        let cost = u64::from(cost);
        match self {
            Policy::TokenBucket(tb) => {
                let tat = match state {
                    Some(State::TokenBucket { tat }) => Some(*tat),
                    _ => None,
                };
                tb.evaluate(tat, now, cost)
            }
            Policy::SlidingWindow(sw) => {
                let ws = match state {
                    Some(State::SlidingWindow(ws)) => Some(*ws),
                    _ => None,
                };
                sw.evaluate(ws, now, cost)
            }
        }
    }
}
