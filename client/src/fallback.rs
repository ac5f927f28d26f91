//! The local fallback limiter: decides fail-open checks while the server
//! cannot (seed 002: "a local in-memory bucket per gateway with the limit
//! divided by the number of gateways ... crude but still blocks abuse").
//!
//! Every algorithm is approximated by one GCRA bucket per key holding
//! `ceil(capacity / gateways)` (at least 1) and refilling `count /
//! gateways` per period: a window of 100/min on 4 gateways becomes a
//! bucket of 25 refilling 25/min on each. Concurrency limits are treated
//! the same way (no lease is handed out). A group passes when every pair
//! passes, and then every pair is charged.
//!
//! Memory is bounded: at most `max_keys` keys, in the bounded map of
//! [`keymap`](crate::keymap), least recently used evicted first (an evicted
//! key starts again with a full bucket, i.e. the fallback errs on the side
//! of admitting).

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tollgate_protocol::{Limit, Pair};

use crate::config::FallbackConfig;
use crate::decision::{Binding, Decision, Source};
use crate::keymap::KeyMap;

/// One key's bucket: the theoretical arrival time (ns since the limiter's
/// epoch) and the limit it was computed for.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tat: u64,
    limit: Limit,
}

pub(crate) struct Fallback {
    gateways: u64,
    epoch: Instant,
    buckets: KeyMap<Bucket>,
}

/// A bucket's numbers for one limit on this gateway.
#[derive(Debug, Clone, Copy)]
struct Share {
    capacity: u64,
    /// Nanoseconds per unit.
    interval: u64,
}

impl Fallback {
    pub(crate) fn new(config: &FallbackConfig) -> Self {
        Self {
            gateways: u64::from(config.gateways),
            epoch: Instant::now(),
            buckets: KeyMap::new(config.max_keys),
        }
    }

    fn share(&self, limit: &Limit) -> Share {
        let count = limit.count.max(1);
        let capacity = limit.capacity().div_ceil(self.gateways).max(1);
        let period_ns = u128::from(limit.period_ms.max(1)) * 1_000_000;
        let interval = period_ns * u128::from(self.gateways) / u128::from(count);
        Share {
            capacity,
            interval: u64::try_from(interval).unwrap_or(u64::MAX).max(1),
        }
    }

    /// Decides a check of `pairs` (each limit resolved: `limits[i]` is
    /// `pairs[i]`'s) at `now`; charges every pair when all pass, unless
    /// `peek`.
    pub(crate) fn decide(
        &self,
        pairs: &[Pair],
        limits: &[Limit],
        bindings: impl Fn(usize) -> Binding,
        peek: bool,
        now: Instant,
    ) -> Decision {
        let now_ns =
            u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        // Evaluate every pair; the binding one is the least remaining when
        // allowed, the longest wait when denied (as the server reports).
        let mut verdicts = Vec::with_capacity(pairs.len());
        for (pair, limit) in pairs.iter().zip(limits) {
            let share = self.share(limit);
            let tat = self
                .buckets
                .get(&pair.key, |b| (b.limit == *limit).then_some(b.tat))
                .flatten()
                .unwrap_or(0)
                .max(now_ns);
            verdicts.push(evaluate(share, tat, now_ns, u64::from(pair.cost.max(1))));
        }
        let allowed = verdicts.iter().all(|v| v.allowed);
        if allowed && !peek {
            for ((pair, limit), v) in pairs.iter().zip(limits).zip(&verdicts) {
                self.buckets.insert(
                    Bytes::clone(&pair.key),
                    Bucket {
                        tat: v.new_tat,
                        limit: *limit,
                    },
                );
            }
        }
        let index = if allowed {
            (0..verdicts.len()).min_by_key(|&i| verdicts[i].remaining)
        } else {
            (0..verdicts.len())
                .filter(|&i| !verdicts[i].allowed)
                .max_by_key(|&i| verdicts[i].retry_after.unwrap_or(Duration::MAX))
        }
        .unwrap_or(0);
        let v = &verdicts[index];
        Decision {
            allowed,
            shadow_denied: false,
            source: Source::Fallback,
            binding: bindings(index),
            limit: v.capacity,
            remaining: v.remaining,
            reset_after: v.full_after,
            full_after: v.full_after,
            retry_after: if allowed {
                Some(Duration::ZERO)
            } else {
                v.retry_after
            },
            lease: None,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.buckets.len()
    }
}

struct Verdict {
    allowed: bool,
    new_tat: u64,
    capacity: u64,
    remaining: u64,
    full_after: Duration,
    retry_after: Option<Duration>,
}

/// GCRA: a request of `cost` passes when the bucket, `tat - now` in
/// arrears, has room for it within `capacity` units.
fn evaluate(share: Share, tat: u64, now: u64, cost: u64) -> Verdict {
    let Share { capacity, interval } = share;
    let horizon = u128::from(capacity) * u128::from(interval);
    let debt = u128::from(tat - now);
    let charged = debt + u128::from(cost) * u128::from(interval);
    let to_u64 = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
    if cost <= capacity && charged <= horizon {
        Verdict {
            allowed: true,
            new_tat: to_u64(u128::from(now) + charged),
            capacity,
            remaining: to_u64((horizon - charged) / u128::from(interval)),
            full_after: Duration::from_nanos(to_u64(charged)),
            retry_after: Some(Duration::ZERO),
        }
    } else {
        Verdict {
            allowed: false,
            new_tat: tat,
            capacity,
            remaining: to_u64(horizon.saturating_sub(debt) / u128::from(interval)),
            full_after: Duration::from_nanos(to_u64(debt)),
            retry_after: (cost <= capacity)
                .then(|| Duration::from_nanos(to_u64(charged - horizon))),
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::LimitRef;

    use super::*;

    fn pair(key: &'static str, limit: Limit) -> Pair {
        Pair {
            key: Bytes::from_static(key.as_bytes()),
            limit: LimitRef::Inline(limit),
            cost: 1,
        }
    }

    fn decide(f: &Fallback, pairs: &[Pair], now: Instant) -> Decision {
        let limits: Vec<Limit> = pairs
            .iter()
            .map(|p| match &p.limit {
                LimitRef::Inline(l) => *l,
                LimitRef::Rule(_) => unreachable!(),
            })
            .collect();
        f.decide(
            pairs,
            &limits,
            |i| Binding::of(i, &pairs[i].limit, None, |_| None),
            false,
            now,
        )
    }

    #[test]
    fn each_gateway_enforces_its_share() {
        let f = Fallback::new(&FallbackConfig {
            gateways: 4,
            max_keys: 10,
        });
        let now = Instant::now();
        // 100/min on 4 gateways: 25 here, then denied until 1/25 min passes.
        let p = [pair("k", Limit::sliding_window(Rate::per_minute(100)))];
        for i in 0..25 {
            let d = decide(&f, &p, now);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 24 - i);
        }
        let d = decide(&f, &p, now);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(2400)));
        assert_eq!(d.source, Source::Fallback);
        assert!(decide(&f, &p, now + Duration::from_millis(2400)).allowed);
    }

    #[test]
    fn a_group_charges_all_or_nothing() {
        let f = Fallback::new(&FallbackConfig {
            gateways: 1,
            max_keys: 10,
        });
        let now = Instant::now();
        let big = Limit::token_bucket(Rate::per_second(10), 10);
        let tiny = Limit::token_bucket(Rate::per_hour(1), 1);
        let group = [pair("a", big), pair("b", tiny)];
        assert!(decide(&f, &group, now).allowed);
        let d = decide(&f, &group, now);
        assert!(!d.allowed);
        assert_eq!(d.binding.index, 1, "the denying pair");
        // The denied group charged nothing: `a` still has 9.
        let d = decide(&f, &[pair("a", big)], now);
        assert_eq!(d.remaining, 8);
    }

    #[test]
    fn memory_is_bounded() {
        let f = Fallback::new(&FallbackConfig {
            gateways: 1,
            max_keys: 8,
        });
        let now = Instant::now();
        let l = Limit::token_bucket(Rate::per_second(1), 1);
        for i in 0..100u32 {
            let key = Bytes::from(format!("k{i}"));
            let p = [Pair {
                key,
                limit: LimitRef::Inline(l),
                cost: 1,
            }];
            assert!(decide(&f, &p, now).allowed);
        }
        assert!(f.len() <= 8, "{}", f.len());
    }
}
