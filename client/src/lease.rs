//! Token leasing for hot keys (seed 002: "a gateway can lease tokens: ask
//! the store for 20 tokens at once for a hot key and spend them locally").
//!
//! For a token-bucket key seen at least `hot_after` times in the last
//! second at this gateway, a check charges `cost + lease` at the server; if
//! allowed, the `lease` extra tokens are kept here and spent by the next
//! checks of the key without a round trip. Unspent tokens go back with a
//! REFUND after `hold` (or when the key is evicted from the bounded table).
//! A lease request the server denies is retried at plain cost and the key
//! is not leased again for `hold` (it is near its limit: small steps).
//!
//! Lease size: what the limit refills in `hold`, at most `max_lease` and
//! at most `capacity / capacity_divisor`; below 2 the key is not leased, so
//! small limits and slow keys always ask the server.
//!
//! Accuracy: nothing is admitted that the server did not charge, but
//! tokens charged at one moment may be spent up to `hold` later, so over
//! any interval a key can admit up to `gateways × lease` more than its
//! limit allows for that interval (the leases outstanding when it began).

use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::time::Instant;
use tollgate_protocol::{Algorithm, CheckBatch, Limit, Pair};

use crate::config::LeaseConfig;
use crate::decision::{Decision, Source};
use crate::keymap::KeyMap;

#[derive(Debug, Clone)]
struct Entry {
    limit: Limit,
    /// Checks of the key in the current second.
    hits: u32,
    second_start: Instant,
    /// Leased tokens not yet spent.
    tokens: u32,
    leased_at: Instant,
    /// The server's decision when the lease was taken (numbers for headers).
    decision: Option<Decision>,
    /// Not leased again before this (a lease request was denied).
    cool_until: Instant,
}

pub(crate) struct Leases {
    config: LeaseConfig,
    table: KeyMap<Entry>,
    /// Leases to give back (evicted or expired): key, limit, tokens.
    returns: Mutex<Vec<(Bytes, Limit, u32)>>,
}

impl Leases {
    pub(crate) fn new(config: LeaseConfig) -> Self {
        Self {
            table: KeyMap::new(config.max_keys),
            config,
            returns: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn hold(&self) -> Duration {
        self.config.hold
    }

    /// Tokens one lease of `limit` takes; 0 when the key is not leased.
    pub(crate) fn lease_size(&self, limit: &Limit) -> u32 {
        if limit.algorithm != Algorithm::TokenBucket || limit.period_ms == 0 {
            return 0;
        }
        let hold_ms = u128::from(tollgate_protocol::units::duration_ms(self.config.hold));
        let by_rate = (u128::from(limit.count) * hold_ms).div_ceil(u128::from(limit.period_ms));
        let by_capacity = u128::from(limit.burst / u64::from(self.config.capacity_divisor));
        let size = by_rate
            .min(by_capacity)
            .min(u128::from(self.config.max_lease));
        if size < 2 {
            0
        } else {
            u32::try_from(size).unwrap_or(0)
        }
    }

    /// Spends `cost` leased tokens of `key` if it holds them; counts the
    /// hit either way. Returns the decision when spent locally.
    pub(crate) fn spend(
        &self,
        key: &Bytes,
        limit: &Limit,
        cost: u32,
        now: Instant,
    ) -> Option<Decision> {
        let hold = self.config.hold;
        let found = self.table.get(key, |e| {
            if now.duration_since(e.second_start) >= Duration::from_secs(1) {
                e.second_start = now;
                e.hits = 0;
            }
            e.hits = e.hits.saturating_add(1);
            if e.limit != *limit || e.tokens < cost || now.duration_since(e.leased_at) >= hold {
                return None;
            }
            e.tokens -= cost;
            let d = e.decision.as_mut()?;
            d.remaining = d.remaining.saturating_sub(u64::from(cost));
            let mut spent = d.clone();
            spent.source = Source::Lease;
            Some(spent)
        });
        match found {
            Some(spent) => spent,
            None => {
                self.table.insert(
                    Bytes::clone(key),
                    Entry {
                        limit: *limit,
                        hits: 1,
                        second_start: now,
                        tokens: 0,
                        leased_at: now,
                        decision: None,
                        cool_until: now,
                    },
                );
                None
            }
        }
    }

    /// The lease to request with this check of `key`, if the key is hot.
    pub(crate) fn want(&self, key: &Bytes, limit: &Limit, now: Instant) -> Option<u32> {
        let size = self.lease_size(limit);
        if size == 0 {
            return None;
        }
        self.table
            .get(key, |e| {
                (e.hits >= self.config.hot_after && now >= e.cool_until && e.tokens == 0)
                    .then_some(size)
            })
            .flatten()
    }

    /// Keeps `tokens` leased for `key`; `decision` is the server's answer
    /// to the leasing check (its `remaining` counts the lease as taken).
    pub(crate) fn store(
        &self,
        key: &Bytes,
        limit: &Limit,
        tokens: u32,
        decision: &Decision,
        now: Instant,
    ) {
        let mut d = decision.clone();
        // The fleet's view: what the server has left plus what we hold.
        d.remaining += u64::from(tokens);
        let leftover = self.table.get(key, |e| {
            let leftover = (e.limit, std::mem::replace(&mut e.tokens, tokens));
            e.limit = *limit;
            e.leased_at = now;
            e.decision = Some(d.clone());
            leftover
        });
        match leftover {
            Some((old_limit, old)) if old > 0 => self.give_back(Bytes::clone(key), old_limit, old),
            Some(_) => {}
            None => {
                let evicted = self.table.insert(
                    Bytes::clone(key),
                    Entry {
                        limit: *limit,
                        hits: 0,
                        second_start: now,
                        tokens,
                        leased_at: now,
                        decision: Some(d),
                        cool_until: now,
                    },
                );
                if let Some((k, e)) = evicted {
                    if e.tokens > 0 {
                        self.give_back(k, e.limit, e.tokens);
                    }
                }
            }
        }
    }

    /// A lease request was denied: ask plainly for `hold`.
    pub(crate) fn cool(&self, key: &Bytes, now: Instant) {
        let until = now + self.config.hold;
        self.table.get(key, |e| e.cool_until = until);
    }

    fn give_back(&self, key: Bytes, limit: Limit, tokens: u32) {
        self.returns.lock().push((key, limit, tokens));
    }

    /// Takes the leases to refund now: expired ones and evicted ones.
    pub(crate) fn due(&self, now: Instant) -> Vec<(Bytes, Limit, u32)> {
        let hold = self.config.hold;
        let mut due = std::mem::take(&mut *self.returns.lock());
        for (key, mut e) in self
            .table
            .drain_where(|e| e.tokens > 0 && now.duration_since(e.leased_at) >= hold)
        {
            due.push((Bytes::clone(&key), e.limit, std::mem::take(&mut e.tokens)));
            e.decision = None;
            // Keep the hit count: a hot key stays hot.
            if let Some((k, evicted)) = self.table.insert(key, e) {
                if evicted.tokens > 0 {
                    due.push((k, evicted.limit, evicted.tokens));
                }
            }
        }
        due
    }

    /// Every unspent lease, for the refund at close.
    pub(crate) fn all(&self) -> Vec<(Bytes, Limit, u32)> {
        let mut due = std::mem::take(&mut *self.returns.lock());
        due.extend(
            self.table
                .drain_where(|e| e.tokens > 0)
                .into_iter()
                .map(|(k, e)| (k, e.limit, e.tokens)),
        );
        due
    }
}

/// REFUND batches for `due` leases, at most `max_batch` checks each.
pub(crate) fn refund_batches(due: Vec<(Bytes, Limit, u32)>, max_batch: usize) -> Vec<CheckBatch> {
    due.chunks(max_batch.max(1))
        .map(|chunk| {
            let mut batch = CheckBatch::with_capacity(chunk.len());
            for (key, limit, tokens) in chunk {
                batch.push(Pair::inline(Bytes::clone(key), *limit, *tokens));
            }
            batch
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::LimitRef;

    use super::*;
    use crate::decision::Binding;

    fn config() -> LeaseConfig {
        LeaseConfig {
            max_lease: 20,
            capacity_divisor: 10,
            hold: Duration::from_millis(100),
            hot_after: 3,
            max_keys: 100,
        }
    }

    #[test]
    fn lease_size_scales_with_the_rate_and_drops_to_none_for_small_limits() {
        let leases = Leases::new(config());
        // 1000/s refills 100 in 100 ms: capped at 20.
        assert_eq!(
            leases.lease_size(&Limit::token_bucket(Rate::per_second(1000), 1000)),
            20
        );
        // 50/s refills 5 in 100 ms.
        assert_eq!(
            leases.lease_size(&Limit::token_bucket(Rate::per_second(50), 100)),
            5
        );
        // A burst of 15: at most 1 (15 / 10): not leased.
        assert_eq!(
            leases.lease_size(&Limit::token_bucket(Rate::per_second(1000), 15)),
            0
        );
        // 5/s: half a token per hold: not leased.
        assert_eq!(
            leases.lease_size(&Limit::token_bucket(Rate::per_second(5), 100)),
            0
        );
        // Windows are not leased (refunds do not cross windows exactly).
        assert_eq!(
            leases.lease_size(&Limit::sliding_window(Rate::per_second(1000))),
            0
        );
    }

    #[test]
    fn hot_keys_lease_spend_locally_and_return_the_rest() {
        let leases = Leases::new(config());
        let limit = Limit::token_bucket(Rate::per_second(1000), 1000);
        let key = Bytes::from_static(b"k");
        let t0 = Instant::now();
        for _ in 0..2 {
            assert!(leases.spend(&key, &limit, 1, t0).is_none());
            assert_eq!(leases.want(&key, &limit, t0), None, "not hot yet");
        }
        assert!(leases.spend(&key, &limit, 1, t0).is_none());
        assert_eq!(leases.want(&key, &limit, t0), Some(20));
        let server = Decision {
            allowed: true,
            shadow_denied: false,
            source: Source::Server,
            binding: Binding::of(0, &LimitRef::Inline(limit), None, |_| None),
            limit: 1000,
            remaining: 979,
            reset_after: Duration::from_millis(21),
            full_after: Duration::from_millis(21),
            retry_after: Some(Duration::ZERO),
            lease: None,
        };
        leases.store(&key, &limit, 20, &server, t0);
        for i in 0..20u64 {
            let d = leases.spend(&key, &limit, 1, t0).expect("leased");
            assert_eq!(d.source, Source::Lease);
            assert_eq!(d.remaining, 979 + 19 - i);
        }
        assert!(leases.spend(&key, &limit, 1, t0).is_none(), "spent");
        // A new lease, half spent, then due after `hold`.
        leases.store(&key, &limit, 20, &server, t0);
        for _ in 0..8 {
            leases.spend(&key, &limit, 1, t0).expect("leased");
        }
        assert!(leases.due(t0 + Duration::from_millis(50)).is_empty());
        assert_eq!(
            leases.due(t0 + Duration::from_millis(100)),
            vec![(key.clone(), limit, 12)]
        );
        assert!(leases
            .spend(&key, &limit, 1, t0 + Duration::from_millis(101))
            .is_none());
    }
}
