//! Evaluating one check: an atomic group of (key, limit, cost) pairs
//! ([`ResolvedPair`]: limits resolved, rule names are the engine's business);
//! a refund runs the same way (its entry points are refund.rs); and lease
//! releases.
//!
//! Order of work: validate every pair and its slot without any lock, then
//! take the one stripe lock, evaluate each pair against the state left by the
//! pairs before it (a key may appear twice in a group), and write only when
//! every pair passes in [`Mode::Charge`] (or, for a refund, always: a refund
//! never denies). The buffers live on the stack for groups up to four pairs,
//! so the common check allocates nothing but a new key's copy (and the new
//! state of a sliding log or a concurrency limit).
//!
//! Atomic groups mix algorithms freely; what is all-or-nothing is the write.
//! A group holds at most one concurrency pair, so an allowed check acquires
//! at most one lease, which the group's decision carries.

use super::tables::{Place, Table, Tables};
use super::{Captured, Entry, Spot, Store, StoredKey};
use crate::algorithm::{release_lease, Decision, Policy, State};
use crate::clock::Nanos;
use crate::slot::Slot;
use crate::sync::Ordering;
use smallvec::SmallVec;
use tollgate_protocol::{CheckResult, ErrorCode, Limit};

/// One pair of a check as the store takes it: a key, the limit it is
/// checked against (an inline limit, or the limit of the rule the caller
/// resolved), and its cost. It borrows its key: building one copies
/// nothing but the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedPair<'a> {
    pub key: &'a [u8],
    pub limit: Limit,
    pub cost: u32,
}

impl<'a> ResolvedPair<'a> {
    pub fn new(key: &'a [u8], limit: Limit, cost: u32) -> Self {
        Self { key, limit, cost }
    }
}

/// Whether a passing check is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// CHECK: charge every pair when all pass.
    Charge,
    /// PEEK: answer as a check would, change nothing.
    Peek,
}

/// The units each pair of a refund gave back, in the pairs' order: at most
/// its cost, less when the key held less (0 for a key never charged).
pub type Returned = SmallVec<[u64; 4]>;

/// What a group does to the state of its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Check(Mode),
    /// Give each pair's cost back.
    Refund,
}

impl Store {
    /// Evaluates one check (an atomic group when it has several pairs).
    pub fn check(&self, pairs: &[ResolvedPair<'_>], now: Nanos, mode: Mode) -> CheckResult {
        let spots = self.spots(pairs);
        self.run_group(pairs, &spots, now, Op::Check(mode), None, &[])
    }

    /// [`Store::check`] of pairs whose spots the caller already has
    /// (`spots[i]` is `pairs[i]`'s, from [`Store::spot`]): the slot and the
    /// hash of each key are not computed again.
    pub fn check_at(
        &self,
        pairs: &[ResolvedPair<'_>],
        spots: &[Spot],
        now: Nanos,
        mode: Mode,
    ) -> CheckResult {
        self.run_group(pairs, spots, now, Op::Check(mode), None, &[])
    }

    /// The spot of every pair's key.
    pub(super) fn spots(&self, pairs: &[ResolvedPair<'_>]) -> SmallVec<[Spot; 4]> {
        pairs.iter().map(|p| self.spot(p.key)).collect()
    }

    /// Frees concurrency lease `lease` of `key`. Returns whether it was live
    /// (a released or expired lease, an unknown id or a key without leases
    /// frees nothing).
    pub fn release(&self, key: &[u8], lease: u64, now: Nanos) -> bool {
        let hash = self.hash(key);
        let stripe = self.stripe(Slot::of(key));
        let mut locked = stripe.lock();
        let super::Locked { tables, changes } = &mut *locked;
        let Some(entry) = tables.live(Table::Others, hash, key, now, &self.expired_on_access)
        else {
            return false;
        };
        let Some((state, expires_at)) = release_lease(&entry.state, lease, now) else {
            return false;
        };
        if expires_at <= now {
            tables.remove(Table::Others, hash, key);
            self.record_change(stripe, changes, key, || Captured::Removed(Table::Others));
        } else {
            let entry = Entry { state, expires_at };
            // Recorded first: the entry moves into the table.
            self.record_change(stripe, changes, key, || Captured::Put(entry.clone()));
            tables.put(&self.hasher, hash, key, entry);
        }
        true
    }

    pub(super) fn run_group(
        &self,
        pairs: &[ResolvedPair<'_>],
        spots: &[Spot],
        now: Nanos,
        op: Op,
        returned: Option<&mut Returned>,
        caps: &[u64],
    ) -> CheckResult {
        assert_eq!(pairs.len(), spots.len(), "one spot per pair");
        debug_assert!(
            pairs.iter().zip(spots).all(|(p, &s)| s == self.spot(p.key)),
            "spots of other keys"
        );
        match self.evaluate_group(pairs, spots, (now, op), returned, caps) {
            Ok(decision) => CheckResult::Decision(decision),
            Err(code) => CheckResult::Error(code),
        }
    }

    fn evaluate_group(
        &self,
        pairs: &[ResolvedPair<'_>],
        spots: &[Spot],
        (now, op): (Nanos, Op),
        returned: Option<&mut Returned>,
        caps: &[u64],
    ) -> Result<tollgate_protocol::Decision, ErrorCode> {
        let first = Self::one_slot(pairs, spots)?;
        let slot = first.slot;
        let policies: SmallVec<[Policy; 4]> = match pairs {
            // The common check: one pair, its policy built in place rather
            // than collected (a collect of Results through a SmallVec costs
            // more than the policy itself).
            [pair] => {
                let policy = self.policy_of(pair)?;
                if let (Policy::TokenBucket(_), Op::Check(mode)) = (&policy, op) {
                    if self.stripe_budget == usize::MAX {
                        return Ok(self.check_one_bucket(pair, &policy, *first, now, mode));
                    }
                }
                smallvec::smallvec![policy]
            }
            _ => pairs
                .iter()
                .map(|p| self.policy_of(p))
                .collect::<Result<_, _>>()?,
        };
        Self::group_rules(pairs, &policies, op)?;
        let hashes: SmallVec<[u64; 4]> = spots.iter().map(|s| s.hash).collect();
        let group = Group {
            pairs,
            policies: &policies,
            hashes: &hashes,
            now,
            op,
            caps,
        };
        let stripe = self.stripe(slot);
        let mut locked = stripe.lock();
        let (decisions, after) = self.evaluate_pairs(&mut locked.tables, &group, returned)?;
        let all_allowed = decisions.iter().all(|d| d.allowed);
        let written = if all_allowed {
            self.write_group(stripe, &mut locked, &group, after)
        } else {
            Ok(())
        };
        drop(locked);
        written?;
        let mut decision = summarize(&decisions, all_allowed);
        // A lease exists only once its acquire was charged.
        decision.lease = match op {
            Op::Check(Mode::Charge) if all_allowed => decisions.iter().find_map(|d| d.lease),
            _ => None,
        };
        Ok(decision)
    }

    /// The spot of a group's first pair, all of its pairs in its slot, or
    /// why not (checked before any lock).
    fn one_slot<'s>(pairs: &[ResolvedPair<'_>], spots: &'s [Spot]) -> Result<&'s Spot, ErrorCode> {
        let first = spots.first().ok_or(ErrorCode::Malformed)?;
        if pairs.len() > usize::from(u8::MAX) {
            return Err(ErrorCode::BatchTooLarge);
        }
        if spots[1..].iter().any(|s| s.slot != first.slot) {
            return Err(ErrorCode::CrossSlot);
        }
        Ok(first)
    }

    /// The rules between a group's pairs (checked before any lock): one
    /// lease per decision, leases released and never refunded, one state
    /// besides the token bucket per key.
    fn group_rules(
        pairs: &[ResolvedPair<'_>],
        policies: &[Policy],
        op: Op,
    ) -> Result<(), ErrorCode> {
        let leased = policies.iter().filter(|p| p.is_concurrency()).count();
        if leased > 1 || (leased > 0 && op == Op::Refund) || clashing_states(pairs) {
            return Err(ErrorCode::InvalidLimit);
        }
        Ok(())
    }

    /// Why `op` of `pairs` would be refused, found as [`Self::run_group`]
    /// finds it before taking a lock (every refusal but a full store's).
    pub(super) fn refusal(
        &self,
        pairs: &[ResolvedPair<'_>],
        spots: &[Spot],
        op: Op,
    ) -> Result<(), ErrorCode> {
        Self::one_slot(pairs, spots)?;
        let policies: SmallVec<[Policy; 4]> = pairs
            .iter()
            .map(|p| self.policy_of(p))
            .collect::<Result<_, _>>()?;
        Self::group_rules(pairs, &policies, op)
    }

    /// Evaluates each pair of `group` against the state left by the pairs
    /// before it (a key may appear twice in a group), under the stripe's
    /// lock: the decision of each, and the entry each leaves behind.
    fn evaluate_pairs(
        &self,
        tables: &mut Tables,
        group: &Group<'_, '_>,
        mut returned: Option<&mut Returned>,
    ) -> Result<(Decisions, Afters), ErrorCode> {
        let Group {
            pairs,
            policies,
            hashes,
            now,
            op,
            caps,
        } = *group;
        let mut decisions = Decisions::new();
        // The entry each pair leaves behind, seen by a later pair on the same key.
        let mut after = Afters::new();
        for (i, (pair, policy)) in pairs.iter().zip(policies).enumerate() {
            let table = table_for(policy);
            let earlier = (0..i)
                .rev()
                .find(|&j| pairs[j].key == pair.key && table_for(&policies[j]) == table);
            let current = match earlier {
                Some(j) => after[j].clone(),
                None => tables.live(table, hashes[i], pair.key, now, &self.expired_on_access),
            };
            let state = current.as_ref().map(|e| &e.state);
            let verdict = match op {
                Op::Check(_) => policy.evaluate(state, now, pair.cost),
                Op::Refund => {
                    let cost = u64::from(pair.cost);
                    let units = caps.get(i).map_or(cost, |&cap| cap.min(cost));
                    policy
                        .refund(state, now, units)
                        .map_err(|_| ErrorCode::InvalidLimit)?
                }
            };
            if let (Op::Refund, Some(r)) = (op, returned.as_deref_mut()) {
                let left = policy.in_use(verdict.state.as_ref(), now);
                r.push(policy.in_use(state, now).saturating_sub(left));
            }
            after.push(match verdict.state {
                Some(state) if verdict.decision.allowed => Some(Entry {
                    state,
                    expires_at: verdict.expires_at,
                }),
                _ => current,
            });
            decisions.push(verdict.decision);
        }
        Ok((decisions, after))
    }

    /// The end of a group whose every pair passed, under the stripe's
    /// lock: a peek only asks whether its new keys would fit; a charge or
    /// a refund makes room for them and writes what each pair left behind.
    fn write_group(
        &self,
        stripe: &super::Stripe,
        locked: &mut super::Locked,
        group: &Group<'_, '_>,
        after: Afters,
    ) -> Result<(), ErrorCode> {
        let super::Locked { tables, changes } = locked;
        let Group {
            pairs,
            policies,
            hashes,
            now,
            op,
            ..
        } = *group;
        let written = pairs
            .iter()
            .zip(&after)
            .zip(hashes)
            .filter_map(|((p, e), &hash)| e.as_ref().map(|e| (p.key, e, hash)));
        if op == Op::Check(Mode::Peek) {
            // A peek answers what the check would: StoreFull when the check
            // could not take its new keys (nothing is evicted for a peek).
            return self.make_room(tables, written, now, Mode::Peek).1;
        }
        let (evicted, room) = self.make_room(tables, written, now, Mode::Charge);
        if evicted > 0 {
            // Evicted keys are not in any log: the standby gets the
            // whole stripe (evictions come in batches of 1/8 of it),
            // also when the check is refused after all.
            self.record_eviction(stripe, changes);
        }
        room?;
        for (((pair, entry), &hash), policy) in pairs.iter().zip(after).zip(hashes).zip(policies) {
            let Some(entry) = entry else { continue };
            // Recorded under the lock already held: no extra lock per
            // check; first, as the entry moves into the table.
            if entry.expires_at <= now {
                // Refunded back to nothing: nothing left to keep.
                let table = table_for(policy);
                tables.remove(table, hash, pair.key);
                self.record_change(stripe, changes, pair.key, || Captured::Removed(table));
            } else {
                self.record_change(stripe, changes, pair.key, || Captured::Put(entry.clone()));
                tables.put_hinted(&self.hasher, hash, pair.key, entry, policy.window());
            }
        }
        Ok(())
    }
}

/// One group under evaluation: its pairs, their policies and hashes, the
/// time, and what is done to them.
struct Group<'g, 'k> {
    pairs: &'g [ResolvedPair<'k>],
    policies: &'g [Policy],
    hashes: &'g [u64],
    now: Nanos,
    op: Op,
    /// A refund's most units per pair ([`Store::refund_within`]).
    caps: &'g [u64],
}

/// The decision of each pair of a group.
type Decisions = SmallVec<[Decision; 4]>;

/// The entry each pair of a group leaves behind (None: none, or the key's
/// unchanged).
type Afters = SmallVec<[Option<Entry>; 4]>;

impl Store {
    /// The policy of one pair, or why the group is refused: a cost of 0 or
    /// an invalid limit is InvalidLimit.
    fn policy_of(&self, pair: &ResolvedPair<'_>) -> Result<Policy, ErrorCode> {
        if pair.cost == 0 {
            return Err(ErrorCode::InvalidLimit);
        }
        Policy::from_limit_with(&pair.limit, self.max_log_entries)
            .map_err(|_| ErrorCode::InvalidLimit)
    }

    /// The common case, a single token-bucket pair with no memory cap: one
    /// table lookup, the state updated in place. Same answers as the
    /// general path (the store tests run through both).
    fn check_one_bucket(
        &self,
        pair: &ResolvedPair<'_>,
        policy: &Policy,
        spot: Spot,
        now: Nanos,
        mode: Mode,
    ) -> tollgate_protocol::Decision {
        let stripe = self.stripe(spot.slot);
        let mut locked = stripe.lock();
        let decision =
            self.bucket_locked(stripe, &mut locked, (pair, policy, spot.hash), now, mode);
        drop(locked);
        decision.to_wire(0)
    }

    /// [`Store::check_one_bucket`]'s work under its stripe's lock, held.
    fn bucket_locked(
        &self,
        stripe: &super::Stripe,
        locked: &mut super::Guard<'_>,
        (pair, policy, hash): (&ResolvedPair<'_>, &Policy, u64),
        now: Nanos,
        mode: Mode,
    ) -> Decision {
        let super::Locked { tables, changes } = &mut **locked;
        let charge = mode == Mode::Charge;
        let verdict = tables.bucket_in_place(
            &self.hasher,
            hash,
            pair.key,
            now,
            charge,
            &self.expired_on_access,
            |state| policy.evaluate(state, now, pair.cost),
        );
        if charge && verdict.decision.allowed {
            // Under the lock already held, as on the general path: the
            // state just written, as `bucket_in_place` wrote it.
            self.record_change(stripe, changes, pair.key, || match verdict.state {
                Some(State::TokenBucket { tat }) => Captured::Put(Entry {
                    state: State::TokenBucket { tat },
                    expires_at: tat,
                }),
                // Not a bucket's state (no policy of this path writes one):
                // whatever the table holds now.
                _ => Captured::current(tables, Table::Buckets, hash, pair.key),
            });
        }
        verdict.decision
    }

    /// Charges `pair`, a check of one token-bucket key, and when it is
    /// allowed charges `companion` too (when the companion's own check
    /// passes: it never denies `pair`), both under one lock: a global
    /// rule's key and its ceiling key (`engine/check/global.rs`), which
    /// share a stripe whenever the key has a hash tag. Checked one after
    /// the other, the second lock and its call were 4% of the server's CPU
    /// under a global rule, in perf. None, and nothing done, unless both
    /// are token buckets in one stripe of a store with no memory cap: the
    /// caller then checks them one after the other.
    pub fn charge_with_companion(
        &self,
        (pair, spot): (&ResolvedPair<'_>, Spot),
        (companion, companion_spot): (&ResolvedPair<'_>, Spot),
        now: Nanos,
    ) -> Option<CheckResult> {
        debug_assert!(spot == self.spot(pair.key) && companion_spot == self.spot(companion.key));
        let same_stripe = usize::from(spot.slot.get() ^ companion_spot.slot.get()) & self.mask == 0;
        if self.stripe_budget != usize::MAX || !same_stripe {
            return None;
        }
        let policy = match self.policy_of(pair) {
            Ok(policy @ Policy::TokenBucket(_)) => policy,
            Ok(_) => return None,
            Err(code) => return Some(CheckResult::Error(code)),
        };
        let Ok(companion_policy @ Policy::TokenBucket(_)) = self.policy_of(companion) else {
            return None;
        };
        let stripe = self.stripe(spot.slot);
        let mut locked = stripe.lock();
        let decision = self.bucket_locked(
            stripe,
            &mut locked,
            (pair, &policy, spot.hash),
            now,
            Mode::Charge,
        );
        if decision.allowed {
            let companion = (companion, &companion_policy, companion_spot.hash);
            self.bucket_locked(stripe, &mut locked, companion, now, Mode::Charge);
        }
        drop(locked);
        Some(CheckResult::Decision(decision.to_wire(0)))
    }

    /// Before a write adds keys (`written`: each key, the entry it is to
    /// hold, its hash), keeps the stripe within its memory share
    /// (`Tables::make_room`, for each place the keys go to). A refusal is
    /// `StoreFull` and, like every error, charges nothing. Returns how many
    /// live entries were evicted, refused or not (the caller records them
    /// for the standby either way), and whether the room was made.
    /// With [`Mode::Peek`] it only answers whether the charge would be
    /// refused: expired entries may go, live ones never, and nothing is
    /// counted ([`Mode::Charge`]: a charge, a refund or an update, which
    /// all write).
    pub(super) fn make_room<'k>(
        &self,
        tables: &mut Tables,
        written: impl Iterator<Item = (&'k [u8], &'k Entry, u64)> + Clone,
        now: Nanos,
        mode: Mode,
    ) -> (usize, Result<(), ErrorCode>) {
        if self.stripe_budget == usize::MAX {
            return (0, Ok(()));
        }
        let mut evicted = 0;
        for place in Place::ALL {
            let (mut new, mut heap) = (0, 0);
            for (key, entry, hash) in written.clone() {
                if Place::of(key, entry) == place && tables.is_new(hash, key, entry) {
                    new += 1;
                    heap += StoredKey::new(key).heap_bytes() + entry.state.heap_bytes();
                }
            }
            let made = tables.make_room(
                &self.hasher,
                place,
                (new, heap),
                (self.stripe_budget, self.on_full),
                now,
                mode == Mode::Peek,
            );
            if mode == Mode::Peek {
                if !made.granted {
                    return (0, Err(ErrorCode::StoreFull));
                }
                continue;
            }
            // Relaxed: statistics.
            self.evicted
                .fetch_add(made.evicted as u64, Ordering::Relaxed);
            evicted += made.evicted;
            if !made.granted {
                self.refused.fetch_add(new as u64, Ordering::Relaxed);
                return (evicted, Err(ErrorCode::StoreFull));
            }
        }
        (evicted, Ok(()))
    }
}

/// Whether two pairs of the group name one key with two different
/// algorithms other than the token bucket. A key holds one token bucket and
/// one state of any other algorithm, so the second pair's state would
/// replace the first's and the first charge would be lost: such a group is
/// refused (InvalidLimit) instead. Groups are small (`max_group`).
/// Public for the engine, which splits a group with shadow pairs in two
/// and must refuse such a clash across both parts.
pub fn clashing_states(pairs: &[ResolvedPair<'_>]) -> bool {
    // A policy's algorithm is its limit's; only the token bucket has a
    // table of its own (`table_for`).
    let others = || {
        pairs
            .iter()
            .filter(|p| p.limit.algorithm != tollgate_protocol::Algorithm::TokenBucket)
    };
    others().enumerate().any(|(i, a)| {
        others()
            .skip(i + 1)
            .any(|b| a.key == b.key && a.limit.algorithm != b.limit.algorithm)
    })
}

/// The table holding the state this policy works on.
pub(super) fn table_for(policy: &Policy) -> Table {
    match policy {
        Policy::TokenBucket(_) => Table::Buckets,
        _ => Table::Others,
    }
}

/// One decision for the whole group: when every pair passes, the pair with
/// the least remaining (what the gateway's headers should show); otherwise
/// the denying pair that must wait longest ("never" is longest).
fn summarize(decisions: &[Decision], all_allowed: bool) -> tollgate_protocol::Decision {
    let key = |d: &Decision| -> (u64, u64) {
        if all_allowed {
            (u64::MAX - d.remaining, 0)
        } else if d.allowed {
            (0, 0)
        } else {
            (1, d.retry_after.unwrap_or(u64::MAX))
        }
    };
    // max_by_key keeps the last maximum; iterate in reverse so ties go to
    // the first pair.
    let (index, decision) = decisions
        .iter()
        .enumerate()
        .rev()
        .max_by_key(|(_, d)| key(d))
        .expect("a group has at least one pair");
    decision.to_wire(index as u8)
}
