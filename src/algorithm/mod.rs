//! The limiting algorithms, as pure functions of (policy, state, now, cost).
//!
//! No I/O, no locks, no clock: the store hands each algorithm the key's
//! current state and the server's `now`, and gets back a [`Verdict`] holding
//! the decision and the state to keep if the request is charged. A denied
//! request never changes state. Each state also says when it stops carrying
//! information (`expires_at`), which is when the store may forget the key.
//!
//! A wire [`Limit`] becomes a [`Policy`] through [`Policy::from_limit`] (or
//! [`Policy::from_limit_with`] for a non-default log cap), which is where
//! impossible numbers (zero rates, overflowing products, logs above the cap)
//! are refused.
//!
//! | algorithm | state | decision `limit` |
//! |---|---|---|
//! | [token bucket](TokenBucket) (GCRA) | one timestamp | `burst` |
//! | [sliding window](SlidingWindow) counter | window index, two counts | `count` |
//! | [fixed window](FixedWindow) | window index, one count | `count` |
//! | [sliding log](SlidingLog) | one timestamp per unit, at most `max_log_entries` | `count` |
//! | [leaky bucket](LeakyBucket) (meter, GCRA) | one timestamp | `burst` |
//! | [concurrency](Concurrency) | the live leases, at most `count` | `count` |
//!
//! Besides charging, a state can be given units back ([`Policy::refund`],
//! never beyond a full/empty state) and a concurrency lease can be released
//! ([`release_lease`]). Two copies of one key's state (two nodes served
//! it) are combined by [`merge`], which never hands quota back.

mod concurrency;
mod fixed_window;
mod leaky_bucket;
mod merge;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use concurrency::{Concurrency, Lease, LeaseSet};
pub use fixed_window::{FixedWindow, FixedWindowState};
pub use leaky_bucket::LeakyBucket;
pub use merge::merge;
pub use sliding_log::{LogState, SlidingLog};
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

/// How far ahead of `now` a window counter's stored window may start and
/// still be honoured (one hour). A state from a later window comes from a
/// node whose clock is ahead (met after a failover) or from before this
/// clock went back, and must not be read as empty; a window starting
/// further ahead than any plausible skew or clock step was written under
/// another window length (a changed rule), and starts afresh.
pub const MAX_WINDOW_LEAD: Nanos = 3600 * 1_000_000_000;

/// Whether a stored window `index` (of length `window`) later than `now`'s
/// is honoured: it starts at most [`MAX_WINDOW_LEAD`] ahead.
fn later_window_honoured(index: u64, window: Nanos, now: Nanos) -> bool {
    index.saturating_mul(window) <= now.saturating_add(MAX_WINDOW_LEAD)
}

/// Default cap on the timestamps one key may hold: a sliding log's `count`
/// and a concurrency limit's `count` (one lease each at most) must not
/// exceed it. 1000 timestamps are 8 KB per key.
pub const DEFAULT_MAX_LOG_ENTRIES: u64 = 1000;

/// Why a limit was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLimit {
    #[error("count must be between 1 and {MAX_COUNT}, got {0}")]
    Count(u64),
    #[error("period must be between 1 ms and {MAX_PERIOD_MS} ms, got {0} ms")]
    Period(u64),
    #[error("burst must be between 1 and {MAX_COUNT}, got {0}")]
    Burst(u64),
    #[error("{algorithm} takes no burst (must be 0), got {burst}")]
    UnexpectedBurst { algorithm: &'static str, burst: u64 },
    #[error("rate too high: {count} per {period_ms} ms is more than one per nanosecond")]
    RateTooHigh { count: u64, period_ms: u64 },
    #[error("burst {burst} at this rate spans more time than the server can represent")]
    BurstSpanTooLong { burst: u64 },
    #[error(
        "sliding-log keeps one timestamp per unit: a count of {count} is above max-log-entries \
         ({max}); use sliding-window (the sliding window counter) for large limits"
    )]
    LogTooLong { count: u64, max: u64 },
    #[error(
        "concurrency keeps one lease per slot: {count} in flight is above max-log-entries ({max})"
    )]
    TooManyInFlight { count: u64, max: u64 },
    #[error("cost must be at least 1")]
    ZeroCost,
    #[error("concurrency slots are given back with RELEASE and the lease id, not REFUND")]
    RefundOfLeases,
    #[error("{algorithm} cannot be global: {why}")]
    NotGlobal {
        algorithm: &'static str,
        why: &'static str,
    },
}

/// Why an algorithm cannot be shared between regions (a global rule), or
/// `None` when it can: the token bucket and the window counters take usage
/// made elsewhere as more of the same ([`Policy::absorb`]).
pub fn why_not_global(algorithm: Algorithm) -> Option<&'static str> {
    match algorithm {
        Algorithm::TokenBucket | Algorithm::SlidingWindow | Algorithm::FixedWindow => None,
        Algorithm::SlidingLog => Some(
            "a log promises exactness, which usage learnt an exchange interval late cannot \
             keep (use sliding-window)",
        ),
        Algorithm::LeakyBucket => Some(
            "it promises strict spacing between requests, which regions that learn of each \
             other's requests once an interval cannot keep (use token-bucket)",
        ),
        Algorithm::Concurrency => Some(
            "it counts requests in flight, a level that a region cut off would leave held, \
             not a usage that drains",
        ),
    }
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
    /// The lease a concurrency acquire would hold (the store hands it out
    /// only when it charges the request).
    pub lease: Option<u64>,
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
            lease: self.lease.filter(|_| self.allowed),
        }
    }

    /// An allowed decision (what a refund answers).
    fn allow(limit: u64, remaining: u64, reset_after: Nanos) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            reset_after,
            retry_after: Some(0),
            lease: None,
        }
    }
}

/// Per-key state: the smallest thing each algorithm needs.
///
/// At most 32 bytes whatever the variant (checked by a test): the two
/// variants whose size depends on the limit keep it behind one pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// GCRA's theoretical arrival time.
    TokenBucket {
        tat: Nanos,
    },
    SlidingWindow(WindowState),
    FixedWindow(FixedWindowState),
    SlidingLog(LogState),
    /// GCRA's theoretical arrival time, kept apart from the token bucket's
    /// so that switching a key's algorithm starts it afresh.
    LeakyBucket {
        tat: Nanos,
    },
    Concurrency(LeaseSet),
}

impl State {
    /// Bytes the state owns beyond its own size (logs and lease lists).
    pub fn heap_bytes(&self) -> usize {
        match self {
            State::SlidingLog(log) => log.heap_bytes(),
            State::Concurrency(leases) => leases.heap_bytes(),
            _ => 0,
        }
    }

    /// The algorithm this state belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Self::TokenBucket { .. } => Algorithm::TokenBucket,
            Self::SlidingWindow(_) => Algorithm::SlidingWindow,
            Self::FixedWindow(_) => Algorithm::FixedWindow,
            Self::SlidingLog(_) => Algorithm::SlidingLog,
            Self::LeakyBucket { .. } => Algorithm::LeakyBucket,
            Self::Concurrency(_) => Algorithm::Concurrency,
        }
    }
}

/// What evaluating (or refunding) one request yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    /// The state to store when the request is charged: `None` when denied
    /// (a denial changes nothing) or when there is nothing to store (a
    /// refund on a key without state).
    pub state: Option<State>,
    /// When the state (the new one if any, else the current one) stops
    /// carrying information and may be dropped; `<= now` means "drop now".
    pub expires_at: Nanos,
}

impl Verdict {
    fn denied(decision: Decision, expires_at: Nanos) -> Self {
        Self {
            decision,
            state: None,
            expires_at,
        }
    }
}

/// A validated limit in server units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    TokenBucket(TokenBucket),
    SlidingWindow(SlidingWindow),
    FixedWindow(FixedWindow),
    SlidingLog(SlidingLog),
    LeakyBucket(LeakyBucket),
    Concurrency(Concurrency),
}

impl Policy {
    /// Checks a wire limit and converts it to server units, with the
    /// default log cap ([`DEFAULT_MAX_LOG_ENTRIES`]).
    pub fn from_limit(limit: &Limit) -> Result<Self, InvalidLimit> {
        Self::from_limit_with(limit, DEFAULT_MAX_LOG_ENTRIES)
    }

    /// Checks a wire limit and converts it to server units; a sliding log
    /// or a concurrency limit may keep at most `max_log_entries` timestamps.
    pub fn from_limit_with(limit: &Limit, max_log_entries: u64) -> Result<Self, InvalidLimit> {
        if limit.count == 0 || limit.count > MAX_COUNT {
            return Err(InvalidLimit::Count(limit.count));
        }
        if limit.period_ms == 0 || limit.period_ms > MAX_PERIOD_MS {
            return Err(InvalidLimit::Period(limit.period_ms));
        }
        let period = limit.period_ms * NANOS_PER_MS;
        let no_burst = || {
            if limit.burst == 0 {
                Ok(())
            } else {
                Err(InvalidLimit::UnexpectedBurst {
                    algorithm: limit.algorithm.name(),
                    burst: limit.burst,
                })
            }
        };
        match limit.algorithm {
            Algorithm::TokenBucket => {
                TokenBucket::new(limit.count, period, limit.burst).map(Policy::TokenBucket)
            }
            Algorithm::SlidingWindow => {
                no_burst()?;
                Ok(Policy::SlidingWindow(SlidingWindow::new(
                    limit.count,
                    period,
                )))
            }
            Algorithm::FixedWindow => {
                no_burst()?;
                Ok(Policy::FixedWindow(FixedWindow::new(limit.count, period)))
            }
            Algorithm::SlidingLog => {
                no_burst()?;
                if limit.count > max_log_entries {
                    return Err(InvalidLimit::LogTooLong {
                        count: limit.count,
                        max: max_log_entries,
                    });
                }
                Ok(Policy::SlidingLog(SlidingLog::new(limit.count, period)))
            }
            Algorithm::LeakyBucket => {
                LeakyBucket::new(limit.count, period, limit.burst).map(Policy::LeakyBucket)
            }
            Algorithm::Concurrency => {
                no_burst()?;
                if limit.count > max_log_entries {
                    return Err(InvalidLimit::TooManyInFlight {
                        count: limit.count,
                        max: max_log_entries,
                    });
                }
                Ok(Policy::Concurrency(Concurrency::new(limit.count, period)))
            }
        }
    }

    /// The algorithm this policy runs.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Policy::TokenBucket(_) => Algorithm::TokenBucket,
            Policy::SlidingWindow(_) => Algorithm::SlidingWindow,
            Policy::FixedWindow(_) => Algorithm::FixedWindow,
            Policy::SlidingLog(_) => Algorithm::SlidingLog,
            Policy::LeakyBucket(_) => Algorithm::LeakyBucket,
            Policy::Concurrency(_) => Algorithm::Concurrency,
        }
    }

    /// The window length of a fixed or sliding window, in nanoseconds.
    pub fn window(&self) -> Option<Nanos> {
        match self {
            Policy::FixedWindow(p) => Some(p.window()),
            Policy::SlidingWindow(p) => Some(p.window()),
            _ => None,
        }
    }

    /// Whether this is a concurrency limit (whose allowed checks hold a lease).
    pub fn is_concurrency(&self) -> bool {
        matches!(self, Policy::Concurrency(_))
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
            Policy::FixedWindow(fw) => {
                let s = match state {
                    Some(State::FixedWindow(s)) => Some(*s),
                    _ => None,
                };
                fw.evaluate(s, now, cost)
            }
            Policy::SlidingLog(sl) => {
                let log = match state {
                    Some(State::SlidingLog(log)) => Some(log),
                    _ => None,
                };
                sl.evaluate(log, now, cost)
            }
            Policy::LeakyBucket(lb) => {
                let tat = match state {
                    Some(State::LeakyBucket { tat }) => Some(*tat),
                    _ => None,
                };
                lb.evaluate(tat, now, cost)
            }
            Policy::Concurrency(c) => {
                let leases = match state {
                    Some(State::Concurrency(leases)) => Some(leases),
                    _ => None,
                };
                c.evaluate(leases, now, cost)
            }
        }
    }

    /// Charges `units` that were used at `at` somewhere else (another
    /// region) into `state`, without a decision: the state may pass the
    /// limit, and the key is then denied until it has drained the excess.
    /// An `at` later than `now` (a sender whose clock is ahead) counts as
    /// `now`. Returns the state to store and its expiry (`<= now`: nothing
    /// to keep), or `None` when the usage no longer counts (a window gone
    /// by) and the state stays as it is. Only the algorithms that can be
    /// global ([`why_not_global`]) take usage this way.
    pub fn absorb(
        &self,
        state: Option<&State>,
        at: Nanos,
        now: Nanos,
        units: u64,
    ) -> Result<Option<(State, Nanos)>, InvalidLimit> {
        let at = at.min(now);
        if let Some(why) = why_not_global(self.algorithm()) {
            return Err(InvalidLimit::NotGlobal {
                algorithm: self.algorithm().name(),
                why,
            });
        }
        if units == 0 {
            return Ok(None);
        }
        Ok(match self {
            Policy::TokenBucket(tb) => {
                let tat = match state {
                    Some(State::TokenBucket { tat }) => Some(*tat),
                    _ => None,
                };
                let tat = tb.absorb(tat, at, now, units);
                Some((State::TokenBucket { tat }, tat))
            }
            Policy::SlidingWindow(sw) => {
                let ws = match state {
                    Some(State::SlidingWindow(ws)) => Some(*ws),
                    _ => None,
                };
                sw.absorb(ws, at, now, units)
                    .map(|(ws, expires_at)| (State::SlidingWindow(ws), expires_at))
            }
            Policy::FixedWindow(fw) => {
                let s = match state {
                    Some(State::FixedWindow(s)) => Some(*s),
                    _ => None,
                };
                fw.absorb(s, at, now, units)
                    .map(|(s, expires_at)| (State::FixedWindow(s), expires_at))
            }
            // Refused above.
            Policy::SlidingLog(_) | Policy::LeakyBucket(_) | Policy::Concurrency(_) => None,
        })
    }

    /// Gives `amount` units back to `state` and answers with the decision
    /// after the refund (always allowed). Never beyond a full bucket or an
    /// empty window; a key without state (or with another algorithm's state)
    /// is left alone and answered as full. Concurrency slots are not
    /// refunded: they are released by lease id ([`release_lease`]). O(1) in
    /// `amount`: a remote report may carry any u64.
    pub fn refund(
        &self,
        state: Option<&State>,
        now: Nanos,
        amount: u64,
    ) -> Result<Verdict, InvalidLimit> {
        Ok(match self {
            Policy::TokenBucket(tb) => {
                let tat = match state {
                    Some(State::TokenBucket { tat }) => Some(*tat),
                    _ => None,
                };
                tb.refund(tat, now, amount)
            }
            Policy::SlidingWindow(sw) => {
                let ws = match state {
                    Some(State::SlidingWindow(ws)) => Some(*ws),
                    _ => None,
                };
                sw.refund(ws, now, amount)
            }
            Policy::FixedWindow(fw) => {
                let s = match state {
                    Some(State::FixedWindow(s)) => Some(*s),
                    _ => None,
                };
                fw.refund(s, now, amount)
            }
            Policy::SlidingLog(sl) => {
                let log = match state {
                    Some(State::SlidingLog(log)) => Some(log),
                    _ => None,
                };
                sl.refund(log, now, amount)
            }
            Policy::LeakyBucket(lb) => {
                let tat = match state {
                    Some(State::LeakyBucket { tat }) => Some(*tat),
                    _ => None,
                };
                lb.refund(tat, now, amount)
            }
            Policy::Concurrency(_) => return Err(InvalidLimit::RefundOfLeases),
        })
    }
}

impl Policy {
    /// The units `state` holds at `now` that a refund could give back (0
    /// for no state, another algorithm's state, or leases): the units a
    /// refund returned are this before it less this after it.
    pub fn in_use(&self, state: Option<&State>, now: Nanos) -> u64 {
        match (self, state) {
            (Policy::TokenBucket(tb), Some(State::TokenBucket { tat })) => {
                tb.in_use(Some(*tat), now)
            }
            (Policy::LeakyBucket(lb), Some(State::LeakyBucket { tat })) => {
                lb.in_use(Some(*tat), now)
            }
            (Policy::SlidingWindow(sw), Some(State::SlidingWindow(ws))) => {
                sw.in_use(Some(*ws), now)
            }
            (Policy::FixedWindow(fw), Some(State::FixedWindow(s))) => fw.in_use(Some(*s), now),
            (Policy::SlidingLog(sl), Some(State::SlidingLog(log))) => sl.in_use(Some(log), now),
            _ => 0,
        }
    }
}

/// Frees lease `lease` held in `state`, if `state` is a concurrency state
/// and the lease is live at `now`. Returns the state to keep and when it
/// expires; `None` when there was no such live lease.
pub fn release_lease(state: &State, lease: u64, now: Nanos) -> Option<(State, Nanos)> {
    match state {
        State::Concurrency(leases) => concurrency::release(leases, lease, now)
            .map(|(leases, expires_at)| (State::Concurrency(leases), expires_at)),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
