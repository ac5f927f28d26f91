//! `CL.THROTTLE key max_burst count period [quantity]`, as redis-cell
//! defines it, answered by Tollgate's token bucket (GCRA, the algorithm
//! redis-cell implements) through the same check path as a CHECK frame.
//!
//! ```text
//!  CL.THROTTLE key B N P [Q]  ->  token bucket: N per P seconds, burst B+1,
//!                                 cost Q (default 1) on `key`
//!  reply: [limited 0|1, B+1, remaining, retry-after s (-1: allowed or
//!          never), reset s]
//! ```
//!
//! redis-cell's numbers map one to one: its emission interval `P/N` and
//! delay tolerance `(B+1) * P/N` are the bucket's; a request is allowed
//! when the new theoretical arrival time is within the tolerance, exactly
//! the bucket's rule. Its times are rounded as redis-cell does, up to a
//! whole second when there is at least a millisecond past the second;
//! Tollgate's decisions carry whole milliseconds, already rounded up, so
//! the seconds are never early. A request larger than the whole bucket
//! is limited with retry-after -1 (it never fits). `quantity` 0 peeks:
//! nothing is charged, and the reply is the bucket as it stands.

use super::context::Ctx;
use super::reply::Reply;
use crate::clock::NANOS_PER_MS;
use crate::engine::{self, Mode};
use bytes::Bytes;
use tollgate_protocol::{Algorithm, CheckResult, Limit, Pair, RETRY_NEVER};

/// Seconds as redis-cell rounds them: whole seconds, plus one when the
/// rest holds at least a whole millisecond.
pub(super) fn cell_seconds(ms: u64) -> i64 {
    let whole = (ms / 1000) as i64;
    whole + i64::from(ms % 1000 > 0)
}

/// The five integers of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Throttled {
    pub limited: bool,
    pub limit: i64,
    pub remaining: i64,
    pub retry_after: i64,
    pub reset_after: i64,
}

/// Why a CL.THROTTLE cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ThrottleError {
    #[error("ERR {name} must be an integer from {min} to {max}, got '{given}'")]
    Number {
        name: &'static str,
        min: u64,
        max: u64,
        given: String,
    },
    #[error("ERR invalid limit: {0}")]
    Limit(String),
}

/// A parsed CL.THROTTLE.
#[derive(Debug, Clone)]
pub(super) struct Throttle {
    pub key: Bytes,
    pub limit: Limit,
    /// 0: peek.
    pub quantity: u32,
}

fn number(arg: &[u8], name: &'static str, min: u64, max: u64) -> Result<u64, ThrottleError> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| ThrottleError::Number {
            name,
            min,
            max,
            given: String::from_utf8_lossy(arg).into_owned(),
        })
}

impl Throttle {
    /// Reads `key max_burst count period [quantity]` (the arguments after
    /// the name); the limit is validated as any inline limit is.
    pub fn parse(args: &[Bytes], max_log_entries: u64) -> Result<Self, ThrottleError> {
        use engine::{MAX_COUNT, MAX_PERIOD_MS};
        let max_burst = number(&args[1], "max_burst", 0, MAX_COUNT - 1)?;
        let count = number(&args[2], "count", 1, MAX_COUNT)?;
        let period = number(&args[3], "period", 1, MAX_PERIOD_MS / 1000)?;
        let quantity = match args.get(4) {
            Some(q) => number(q, "quantity", 0, u32::MAX.into())? as u32,
            None => 1,
        };
        let limit = Limit {
            algorithm: Algorithm::TokenBucket,
            count,
            period_ms: period * 1000,
            burst: max_burst + 1,
        };
        engine::validate(&limit, max_log_entries).map_err(ThrottleError::Limit)?;
        Ok(Self {
            key: args[0].clone(),
            limit,
            quantity,
        })
    }

    /// The bucket's emission interval (time per token), in nanoseconds.
    fn emission(&self) -> u64 {
        self.limit.period_ms * NANOS_PER_MS / self.limit.count
    }

    /// Evaluates it (charging unless it peeks) and answers redis-cell's
    /// five integers; Err is the error code of a check that failed.
    pub fn run(&self, ctx: &Ctx) -> Result<Throttled, tollgate_protocol::ErrorCode> {
        let peek = self.quantity == 0;
        let pair = Pair {
            key: self.key.clone(),
            limit: self.limit.into(),
            cost: self.quantity.max(1),
        };
        let mode = if peek { Mode::Peek } else { Mode::Charge };
        let d = match ctx
            .shared
            .engine
            .check_one(ctx.rules, ctx.now, &[pair], mode)
        {
            CheckResult::Decision(d) => d,
            CheckResult::Error(code) => return Err(code),
        };
        let limit = self.limit.burst as i64;
        if !peek {
            return Ok(Throttled {
                limited: !d.allowed,
                limit,
                remaining: d.remaining as i64,
                retry_after: match (d.allowed, d.retry_after_ms) {
                    (true, _) | (false, RETRY_NEVER) => -1,
                    (false, ms) => cell_seconds(ms),
                },
                reset_after: cell_seconds(d.reset_after_ms),
            });
        }
        // A peek of one unit: its answer is the bucket after one more
        // token, so the bucket as it stands has one token and one
        // emission interval more (rounded down, so never early).
        let emission_ms = self.emission() / NANOS_PER_MS;
        Ok(if d.allowed {
            Throttled {
                limited: false,
                limit,
                remaining: d.remaining as i64 + 1,
                retry_after: -1,
                reset_after: cell_seconds(d.reset_after_ms.saturating_sub(emission_ms)),
            }
        } else {
            // Not a whole token left: still not limited, unless the bucket
            // runs past its tolerance (a state charged under a larger
            // limit), when even nothing would have to wait.
            let over = d.retry_after_ms != RETRY_NEVER
                && d.retry_after_ms > self.emission().div_ceil(NANOS_PER_MS);
            Throttled {
                limited: over,
                limit,
                remaining: d.remaining as i64,
                retry_after: if over {
                    cell_seconds(d.retry_after_ms - emission_ms)
                } else {
                    -1
                },
                reset_after: cell_seconds(d.reset_after_ms),
            }
        })
    }
}

impl Throttled {
    pub fn write(&self, reply: &mut Reply) {
        reply.array(5);
        reply.int(i64::from(self.limited));
        reply.int(self.limit);
        reply.int(self.remaining);
        reply.int(self.retry_after);
        reply.int(self.reset_after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Bytes> {
        words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect()
    }

    #[test]
    fn seconds_round_up_from_a_whole_millisecond() {
        assert_eq!(cell_seconds(0), 0);
        assert_eq!(cell_seconds(1), 1);
        assert_eq!(cell_seconds(999), 1);
        assert_eq!(cell_seconds(1000), 1);
        assert_eq!(cell_seconds(1001), 2);
        assert_eq!(cell_seconds(58_000), 58);
    }

    #[test]
    fn arguments_map_onto_a_token_bucket() {
        let t = Throttle::parse(&args(&["user123", "15", "30", "60"]), 1000).unwrap();
        assert_eq!(&t.key[..], b"user123");
        assert_eq!(t.quantity, 1);
        assert_eq!(
            t.limit,
            Limit {
                algorithm: Algorithm::TokenBucket,
                count: 30,
                period_ms: 60_000,
                burst: 16,
            }
        );
        assert_eq!(t.emission(), 2_000_000_000);
        let t = Throttle::parse(&args(&["k", "0", "1", "1", "0"]), 1000).unwrap();
        assert_eq!((t.limit.burst, t.quantity), (1, 0));
    }

    #[test]
    fn bad_numbers_are_errors_naming_the_argument() {
        for (words, name) in [
            (&["k", "-1", "30", "60"][..], "max_burst"),
            (&["k", "15", "0", "60"], "count"),
            (&["k", "15", "x", "60"], "count"),
            (&["k", "15", "30", "0"], "period"),
            (&["k", "15", "30", "60", "-2"], "quantity"),
            (&["k", "15", "30", "60", "4294967296"], "quantity"),
        ] {
            match Throttle::parse(&args(words), 1000) {
                Err(ThrottleError::Number { name: n, .. }) => assert_eq!(n, name, "{words:?}"),
                other => panic!("{words:?}: {other:?}"),
            }
        }
        // More than one per nanosecond: the bucket's own refusal.
        let err = Throttle::parse(&args(&["k", "1", "2000000000", "1"]), 1000).unwrap_err();
        assert!(matches!(err, ThrottleError::Limit(_)), "{err:?}");
        assert!(err
            .to_string()
            .starts_with("ERR invalid limit: rate too high"));
    }
}
