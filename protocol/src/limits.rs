//! Constructors and derived numbers of [`Limit`], so callers never write
//! the wire struct by hand and every party reads a limit's numbers the same
//! way (PROTOCOL.md §8).
//!
//! The constructors only shape a limit; whether its numbers are possible
//! (non-zero, no overflow) is the server's call, which answers a bad limit
//! with a per-check InvalidLimit. [`Limit::from_rule_fields`] is the one
//! reading of a named rule's fields (`rate`, `burst`, `window`) as a limit,
//! shared by the server's rules file and by clients that fetch the rule
//! table, so the two can never disagree.

use std::time::Duration;

use crate::message::{Algorithm, Limit};
use crate::units::{duration_ms, Rate};

impl Limit {
    /// A token bucket refilling `rate` continuously and holding at most
    /// `burst` tokens: `Limit::token_bucket(Rate::per_second(100), 200)` is
    /// "100/s, bursts of 200".
    pub fn token_bucket(rate: Rate, burst: u64) -> Self {
        Self {
            algorithm: Algorithm::TokenBucket,
            count: rate.count,
            period_ms: rate.period_ms,
            burst,
        }
    }

    /// A sliding window counter: at most `rate.count` in any window of
    /// `rate.period` (the previous window weighted by its overlap).
    pub fn sliding_window(rate: Rate) -> Self {
        Self::windowed(Algorithm::SlidingWindow, rate)
    }

    /// A fixed window counter: at most `rate.count` per window of
    /// `rate.period` aligned on the server clock (up to twice that across a
    /// boundary).
    pub fn fixed_window(rate: Rate) -> Self {
        Self::windowed(Algorithm::FixedWindow, rate)
    }

    /// A sliding log: exactly at most `rate.count` in any span of
    /// `rate.period`; for small counts (the server caps them).
    pub fn sliding_log(rate: Rate) -> Self {
        Self::windowed(Algorithm::SlidingLog, rate)
    }

    /// A leaky bucket (meter): one unit every `rate.period / rate.count`,
    /// `tolerance` early arrivals allowed (1: strict spacing).
    pub fn leaky_bucket(rate: Rate, tolerance: u64) -> Self {
        Self {
            algorithm: Algorithm::LeakyBucket,
            count: rate.count,
            period_ms: rate.period_ms,
            burst: tolerance,
        }
    }

    /// A concurrency limit: at most `max_in_flight` units held at once,
    /// each lease expiring after `lease_ttl` unless released first.
    pub fn concurrency(max_in_flight: u64, lease_ttl: Duration) -> Self {
        Self {
            algorithm: Algorithm::Concurrency,
            count: max_in_flight,
            period_ms: duration_ms(lease_ttl),
            burst: 0,
        }
    }

    fn windowed(algorithm: Algorithm, rate: Rate) -> Self {
        Self {
            algorithm,
            count: rate.count,
            period_ms: rate.period_ms,
            burst: 0,
        }
    }

    /// The limit of a named rule's fields, as the rules file and the admin
    /// API write them: `rate` (`COUNT/PERIOD`), `burst` (token and leaky
    /// buckets; default the rate's count, respectively 1) and `window`
    /// (window algorithms; default the rate's period, the rate scaled to it).
    pub fn from_rule_fields(
        algorithm: Algorithm,
        rate: Rate,
        burst: Option<u64>,
        window_ms: Option<u64>,
    ) -> Result<Self, RuleFieldError> {
        let refuse = |field: &'static str, given: bool| {
            if given {
                Err(RuleFieldError::NotFor {
                    field,
                    algorithm: algorithm.name(),
                })
            } else {
                Ok(())
            }
        };
        match algorithm {
            Algorithm::TokenBucket => {
                refuse("window", window_ms.is_some())?;
                Ok(Self::token_bucket(rate, burst.unwrap_or(rate.count)))
            }
            Algorithm::LeakyBucket => {
                refuse("window", window_ms.is_some())?;
                Ok(Self::leaky_bucket(rate, burst.unwrap_or(1)))
            }
            Algorithm::SlidingWindow | Algorithm::FixedWindow | Algorithm::SlidingLog => {
                refuse("burst", burst.is_some())?;
                let window_ms = window_ms.unwrap_or(rate.period_ms);
                let scaled = u128::from(rate.count) * u128::from(window_ms);
                let period = u128::from(rate.period_ms);
                let uneven = RuleFieldError::UnevenWindow {
                    count: rate.count,
                    period_ms: rate.period_ms,
                    window_ms,
                };
                if period == 0 || scaled % period != 0 || scaled < period {
                    return Err(uneven);
                }
                let count = u64::try_from(scaled / period).map_err(|_| uneven)?;
                Ok(Self::windowed(
                    algorithm,
                    Rate {
                        count,
                        period_ms: window_ms,
                    },
                ))
            }
            Algorithm::Concurrency => {
                refuse("burst", burst.is_some())?;
                refuse("window", window_ms.is_some())?;
                Ok(Self::concurrency(rate.count, rate.period()))
            }
        }
    }

    /// The most units the limit grants at once: `burst` for the token and
    /// leaky buckets, `count` for the others. What a decision's `limit`
    /// reports, and the quota of an HTTP `RateLimit-Policy`.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => self.burst,
            _ => self.count,
        }
    }

    /// The period over which the capacity is granted: the window for the
    /// window algorithms, the time a bucket takes to refill from empty for
    /// the buckets (`burst × period / count`), the lease time to live for a
    /// concurrency limit. The `w` of an HTTP `RateLimit-Policy`.
    pub fn window(&self) -> Duration {
        match self.algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket if self.count > 0 => {
                let ms =
                    u128::from(self.burst) * u128::from(self.period_ms) / u128::from(self.count);
                Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
            }
            _ => Duration::from_millis(self.period_ms),
        }
    }

    /// The rate at which units come back: `count` per `period_ms`.
    pub fn rate(&self) -> Rate {
        Rate {
            count: self.count,
            period_ms: self.period_ms,
        }
    }
}

/// Why a rule's fields do not make a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RuleFieldError {
    /// `burst` or `window` on an algorithm without one.
    #[error("{field} does not apply to {algorithm}")]
    NotFor {
        field: &'static str,
        algorithm: &'static str,
    },
    #[error("rate {count}/{period_ms}ms over a {window_ms} ms window is not a whole count of at least 1")]
    UnevenWindow {
        count: u64,
        period_ms: u64,
        window_ms: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_fill_the_wire_fields() {
        let tb = Limit::token_bucket(Rate::per_second(100), 200);
        assert_eq!(
            tb,
            Limit {
                algorithm: Algorithm::TokenBucket,
                count: 100,
                period_ms: 1000,
                burst: 200
            }
        );
        assert_eq!(tb.capacity(), 200);
        assert_eq!(tb.window(), Duration::from_secs(2));
        let day = Limit::fixed_window("10000/day".parse().unwrap());
        assert_eq!(
            (day.count, day.period_ms, day.burst),
            (10_000, 86_400_000, 0)
        );
        assert_eq!(day.window(), Duration::from_secs(86_400));
        let c = Limit::concurrency(8, Duration::from_secs(30));
        assert_eq!((c.count, c.period_ms, c.capacity()), (8, 30_000, 8));
    }

    #[test]
    fn rule_fields_read_as_the_rules_file_does() {
        let rate = Rate::per_minute(100);
        assert_eq!(
            Limit::from_rule_fields(Algorithm::TokenBucket, rate, None, None),
            Ok(Limit::token_bucket(rate, 100))
        );
        assert_eq!(
            Limit::from_rule_fields(Algorithm::LeakyBucket, rate, None, None),
            Ok(Limit::leaky_bucket(rate, 1))
        );
        // 100/min over a 30 s window is 50 per 30 s.
        assert_eq!(
            Limit::from_rule_fields(Algorithm::SlidingWindow, rate, None, Some(30_000)),
            Ok(Limit::sliding_window(Rate {
                count: 50,
                period_ms: 30_000
            }))
        );
        assert_eq!(
            Limit::from_rule_fields(Algorithm::FixedWindow, rate, None, Some(7)),
            Err(RuleFieldError::UnevenWindow {
                count: 100,
                period_ms: 60_000,
                window_ms: 7
            })
        );
        assert_eq!(
            Limit::from_rule_fields(Algorithm::Concurrency, rate, Some(3), None),
            Err(RuleFieldError::NotFor {
                field: "burst",
                algorithm: "concurrency"
            })
        );
    }
}
