//! Concurrency limit: at most `count` units in flight, each held by a lease
//! that expires.
//!
//! An acquire of cost `c` (the units it holds, usually 1) at `now` passes
//! when `held + c <= count`, where `held` is the sum of the units of the
//! live leases (those with `expires_at > now`). It then creates a lease
//! `{id, expires_at: now + TTL, units: c}` and answers with its id. The
//! caller releases the lease by id when done; a caller that crashes never
//! releases, and its lease simply stops counting at `expires_at`, so no slot
//! can leak for longer than one TTL.
//!
//! Decision fields: `limit = count`, `remaining = count - held` (after the
//! acquire when allowed), `reset_after` = time until the last live lease
//! expires (all slots free if nobody releases). When denied, `retry_after`
//! is the time until enough leases *expire* for the acquire to fit (leases
//! are freed oldest expiry first); releases can only make it sooner. A cost
//! above `count` never fits.
//!
//! Lease ids are `max(now, last_id + 1)`: increasing per key, never 0, and
//! never reused while the server runs (the state is kept until `now` has
//! passed the last id handed out, so a later acquire's id is larger still).
//! A stale release (the lease already expired or released) therefore frees
//! nothing. After a restart, or a RESET of the key, all leases are gone and
//! ids start again from the new clock.
//!
//! The state holds the live leases only, sorted by expiry: at most `count`
//! of them (each holds at least one unit), and `count` is capped by the
//! server's `max_log_entries`. Leases "from the future" (expiring after
//! `now + TTL`, e.g. the clock went back) stay live until their own expiry.
//! Units are not refunded; a lease is released whole.

use super::{Decision, State, Verdict};
use crate::clock::Nanos;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    /// Most units in flight.
    max: u64,
    /// Lifetime of a lease in nanoseconds (>= 1 ms, validated by `Policy`).
    ttl: Nanos,
}

/// One acquired slot (or several, for a cost above 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    pub expires_at: Nanos,
    pub units: u64,
}

/// The leases of one key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseSet {
    /// The last id handed out: the next one is larger.
    last_id: u64,
    /// Sorted by `expires_at`. Expired ones are dropped whenever the set is
    /// rewritten.
    leases: Box<[Lease]>,
}

impl LeaseSet {
    /// Bytes these leases hold on the heap (for the store's memory accounting).
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.leases)
    }

    /// A set of these leases (sorted here), the last id handed out being
    /// `last_id`.
    pub fn new(last_id: u64, mut leases: Vec<Lease>) -> Self {
        leases.sort_by_key(|l| l.expires_at);
        Self {
            last_id,
            leases: leases.into_boxed_slice(),
        }
    }

    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// The leases still held at `now`.
    fn live(&self, now: Nanos) -> &[Lease] {
        let expired = self.leases.partition_point(|l| l.expires_at <= now);
        &self.leases[expired..]
    }

    /// When this set stops carrying information: its last lease expired and
    /// `now` is past every id handed out (so forgetting `last_id` cannot
    /// make an id come back).
    fn expiry(&self) -> Nanos {
        let last_lease = self.leases.last().map_or(0, |l| l.expires_at);
        last_lease.max(self.last_id.saturating_add(1))
    }
}

impl Concurrency {
    pub fn new(max: u64, ttl: Nanos) -> Self {
        Self { max, ttl }
    }

    pub fn evaluate(&self, set: Option<&LeaseSet>, now: Nanos, cost: u64) -> Verdict {
        let (last_id, live) = set.map_or((0, &[][..]), |s| (s.last_id, s.live(now)));
        let held: u64 = live.iter().map(|l| l.units).sum();
        if cost == 0 {
            // A query (the admin API's usage report): nothing to acquire,
            // so no lease and nothing to store.
            let all_free_at = live.last().map_or(now, |l| l.expires_at);
            return Verdict {
                decision: Decision::allow(
                    self.max,
                    self.max.saturating_sub(held),
                    all_free_at - now,
                ),
                state: None,
                expires_at: set.map_or(now, LeaseSet::expiry),
            };
        }
        if cost <= self.max && held + cost <= self.max {
            let lease = Lease {
                id: now.max(last_id.saturating_add(1)),
                expires_at: now + self.ttl,
                units: cost,
            };
            let at = live.partition_point(|l| l.expires_at <= lease.expires_at);
            let mut leases = Vec::with_capacity(live.len() + 1);
            leases.extend_from_slice(&live[..at]);
            leases.push(lease);
            leases.extend_from_slice(&live[at..]);
            let all_free_at = leases.last().map_or(now, |l| l.expires_at);
            let set = LeaseSet {
                last_id: lease.id,
                leases: leases.into_boxed_slice(),
            };
            let expires_at = set.expiry();
            return Verdict {
                decision: Decision {
                    lease: Some(lease.id),
                    ..Decision::allow(self.max, self.max - held - cost, all_free_at - now)
                },
                state: Some(State::Concurrency(set)),
                expires_at,
            };
        }
        let retry_after = (cost <= self.max).then(|| {
            // Free the oldest expiries until the acquire fits; there are
            // enough units since cost <= max < held + cost.
            let excess = held + cost - self.max;
            let mut freed = 0;
            let fits_at = live
                .iter()
                .find(|l| {
                    freed += l.units;
                    freed >= excess
                })
                .map_or(now, |l| l.expires_at);
            fits_at - now
        });
        let all_free_at = live.last().map_or(now, |l| l.expires_at);
        let decision = Decision {
            allowed: false,
            limit: self.max,
            remaining: self.max.saturating_sub(held),
            reset_after: all_free_at - now,
            retry_after,
            lease: None,
        };
        Verdict::denied(decision, set.map_or(now, LeaseSet::expiry))
    }
}

/// Frees lease `id` if it is live at `now`: the set without it, and when
/// that set expires. `None` when no live lease has this id.
pub fn release(set: &LeaseSet, id: u64, now: Nanos) -> Option<(LeaseSet, Nanos)> {
    let live = set.live(now);
    let index = live.iter().position(|l| l.id == id)?;
    let mut leases = live.to_vec();
    leases.remove(index);
    let set = LeaseSet {
        last_id: set.last_id,
        leases: leases.into_boxed_slice(),
    };
    let expires_at = set.expiry();
    Some((set, expires_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    /// Acquires `cost` at `now`, keeping the state when allowed.
    fn acquire(c: &Concurrency, set: &mut Option<LeaseSet>, now: Nanos, cost: u64) -> Decision {
        let v = c.evaluate(set.as_ref(), now, cost);
        if v.decision.allowed {
            match v.state {
                Some(State::Concurrency(s)) => *set = Some(s),
                other => panic!("{other:?}"),
            }
        }
        v.decision
    }

    fn release_in(set: &mut Option<LeaseSet>, id: u64, now: Nanos) -> bool {
        match release(set.as_ref().unwrap(), id, now) {
            Some((s, _)) => {
                *set = Some(s);
                true
            }
            None => false,
        }
    }

    #[test]
    fn cost_zero_is_a_query_that_acquires_nothing() {
        let c = Concurrency::new(3, 10 * S);
        let mut set = None;
        acquire(&c, &mut set, 0, 2);
        let v = c.evaluate(set.as_ref(), 4 * S, 0);
        assert!(v.decision.allowed);
        assert_eq!(v.decision.lease, None);
        assert_eq!(v.state, None);
        assert_eq!((v.decision.remaining, v.decision.reset_after), (1, 6 * S));
        let v = c.evaluate(None, 4 * S, 0);
        assert_eq!((v.decision.remaining, v.decision.reset_after), (3, 0));
    }

    #[test]
    fn acquire_up_to_count_then_release_frees_a_slot() {
        // 2 in flight, leases live 30 s.
        let c = Concurrency::new(2, 30 * S);
        let mut set = None;
        let a = acquire(&c, &mut set, 10 * S, 1);
        assert!(a.allowed);
        assert_eq!((a.limit, a.remaining), (2, 1));
        assert_eq!(a.lease, Some(10 * S));
        assert_eq!(a.reset_after, 30 * S);
        let b = acquire(&c, &mut set, 11 * S, 1);
        assert_eq!(b.remaining, 0);
        assert_eq!(b.lease, Some(11 * S));
        assert_eq!(b.reset_after, 30 * S);
        // Full: the next fits when the first lease expires, at 40 s.
        let d = acquire(&c, &mut set, 12 * S, 1);
        assert!(!d.allowed);
        assert_eq!(d.lease, None);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after, Some(28 * S));
        assert_eq!(d.reset_after, 29 * S);
        // Releasing frees the slot at once; a second release frees nothing.
        assert!(release_in(&mut set, 10 * S, 12 * S));
        assert!(!release_in(&mut set, 10 * S, 12 * S));
        assert!(!release_in(&mut set, 999, 12 * S), "unknown id");
        let d = acquire(&c, &mut set, 12 * S, 1);
        assert!(d.allowed);
        assert_eq!(d.lease, Some(12 * S));
    }

    #[test]
    fn an_unreleased_lease_expires_so_a_crashed_caller_leaks_nothing() {
        let c = Concurrency::new(1, 30 * S);
        let mut set = None;
        let lease = acquire(&c, &mut set, S, 1).lease.unwrap();
        assert!(!acquire(&c, &mut set, 31 * S - 1, 1).allowed);
        // At the expiry the slot is free again, without any release...
        let d = acquire(&c, &mut set, 31 * S, 1);
        assert!(d.allowed);
        // ... and the old lease can no longer free the new one.
        assert!(!release_in(&mut set, lease, 31 * S));
        assert_eq!(set.as_ref().unwrap().leases().len(), 1);
        assert!(!acquire(&c, &mut set, 31 * S, 1).allowed);
    }

    #[test]
    fn ids_are_unique_even_at_one_instant() {
        let c = Concurrency::new(3, S);
        let mut set = None;
        let ids: Vec<_> = (0..3)
            .map(|_| acquire(&c, &mut set, 5 * S, 1).lease.unwrap())
            .collect();
        assert_eq!(ids, [5 * S, 5 * S + 1, 5 * S + 2]);
        // Release all, acquire again at the same instant: a new id.
        for id in &ids {
            assert!(release_in(&mut set, *id, 5 * S));
        }
        assert_eq!(acquire(&c, &mut set, 5 * S, 1).lease, Some(5 * S + 3));
        // A fresh key at time 0 still gets a non-zero id.
        assert_eq!(c.evaluate(None, 0, 1).decision.lease, Some(1));
    }

    #[test]
    fn cost_holds_that_many_slots() {
        let c = Concurrency::new(5, 10 * S);
        let mut set = None;
        let heavy = acquire(&c, &mut set, S, 3).lease.unwrap();
        acquire(&c, &mut set, 2 * S, 1);
        assert_eq!(acquire(&c, &mut set, 3 * S, 1).remaining, 0);
        // Cost 2 needs two units back: the 3-unit lease expires at 11 s.
        let d = acquire(&c, &mut set, 4 * S, 2);
        assert_eq!(d.retry_after, Some(7 * S));
        // Releasing the heavy lease frees its three units.
        assert!(release_in(&mut set, heavy, 4 * S));
        assert_eq!(acquire(&c, &mut set, 4 * S, 3).remaining, 0);
        // Above the limit: never.
        let d = c.evaluate(None, S, 6).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, None);
        assert_eq!(d.remaining, 5);
    }

    #[test]
    fn retry_after_counts_units_from_the_oldest_expiry() {
        let c = Concurrency::new(3, 10 * S);
        let mut set = None;
        for t in [S, 2 * S, 3 * S] {
            acquire(&c, &mut set, t, 1);
        }
        // Cost 2 needs two leases gone: the second expires at 12 s.
        assert_eq!(acquire(&c, &mut set, 5 * S, 2).retry_after, Some(7 * S));
        assert_eq!(acquire(&c, &mut set, 5 * S, 3).retry_after, Some(8 * S));
    }

    #[test]
    fn state_expiry_and_clock_jumps() {
        let c = Concurrency::new(2, 30 * S);
        let v = c.evaluate(None, S, 1);
        assert_eq!(v.expires_at, 31 * S);
        let mut set = None;
        acquire(&c, &mut set, S, 1);
        // Release the only lease: the state carries only the last id, and
        // expires just after it.
        let (after, expires_at) = release(set.as_ref().unwrap(), S, 2 * S).unwrap();
        assert!(after.leases().is_empty());
        assert_eq!(expires_at, S + 1);
        // Far forward: every lease expired, a full set of slots.
        let mut full = None;
        acquire(&c, &mut full, S, 2);
        let far = S + 365 * 24 * 3600 * S;
        assert_eq!(c.evaluate(full.as_ref(), far, 2).decision.remaining, 0);
        assert!(c.evaluate(full.as_ref(), far, 2).decision.allowed);
        // From the future (the clock went back): leases stay live until
        // their own expiry, and new ids continue after the last one.
        let future = LeaseSet::new(
            100 * S,
            vec![Lease {
                id: 100 * S,
                expires_at: 130 * S,
                units: 2,
            }],
        );
        let d = c.evaluate(Some(&future), 5 * S, 1).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(125 * S));
        let one = LeaseSet::new(
            100 * S,
            vec![Lease {
                id: 100 * S,
                expires_at: 130 * S,
                units: 1,
            }],
        );
        let v = c.evaluate(Some(&one), 5 * S, 1);
        assert_eq!(v.decision.lease, Some(100 * S + 1));
        assert_eq!(v.expires_at, 130 * S);
        assert_eq!(v.decision.reset_after, 125 * S);
    }

    #[test]
    fn a_denial_on_a_fresh_key_stores_nothing() {
        let c = Concurrency::new(1, S);
        let v = c.evaluate(None, 7 * S, 2);
        assert_eq!(v.state, None);
        assert_eq!(v.expires_at, 7 * S);
    }
}
