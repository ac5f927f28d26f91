//! The model: each key's token bucket and other state in a map, and what
//! every operation answers and keeps, from the store's documented
//! semantics (the parent module says what it trusts).

use super::*;
use crate::algorithm::{Decision, State};
use std::collections::HashMap;

/// Which of a key's two states a policy works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Side {
    Bucket = 0,
    Other = 1,
}

fn side_of(policy: &Policy) -> Side {
    match policy {
        Policy::TokenBucket(_) => Side::Bucket,
        _ => Side::Other,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupOp {
    Check(Mode),
    Refund,
}

/// A state to keep for a key (None, or one already expired: none).
#[derive(Debug)]
pub struct Write {
    key: Bytes,
    side: Side,
    entry: Option<Entry>,
}

/// What a check or a refund answers and what it keeps.
#[derive(Debug)]
pub struct Expect {
    pub result: CheckResult,
    /// To apply in order when the store answered `result`.
    pub writes: Vec<Write>,
    /// Whether the writes may add an entry to a table: a capped store
    /// that refuses new keys may answer StoreFull instead.
    pub may_add: bool,
}

impl Expect {
    fn error(code: ErrorCode) -> Self {
        Self {
            result: CheckResult::Error(code),
            writes: Vec::new(),
            may_add: false,
        }
    }
}

/// Whether writing `after` where `before` was live may add an entry to a
/// table: a new key, another algorithm, or a window (one that packs and
/// one that does not are in different tables).
fn may_add(before: &Option<Entry>, after: &Entry) -> bool {
    match before {
        None => true,
        Some(b) => {
            b.state.algorithm() != after.state.algorithm()
                || matches!(after.state, State::FixedWindow(_) | State::SlidingWindow(_))
        }
    }
}

#[derive(Debug)]
pub struct Model {
    pub now: Nanos,
    max_log: u64,
    /// Every key ever written, with its token bucket and other state
    /// (expired ones included: they must be absent from the store too).
    keys: HashMap<Bytes, [Option<Entry>; 2]>,
}

impl Model {
    pub fn new(now: Nanos, max_log: u64) -> Self {
        Self {
            now,
            max_log,
            keys: HashMap::new(),
        }
    }

    /// Time only moves forward here: a state once expired stays absent.
    pub fn advance(&mut self, step: Nanos) {
        self.now += step;
    }

    fn live(&self, key: &[u8], side: Side) -> Option<Entry> {
        let held = self.keys.get(key)?[side as usize].as_ref();
        held.filter(|e| e.expires_at > self.now).cloned()
    }

    /// The live states of `key`, token bucket first.
    pub fn entries(&self, key: &[u8]) -> Vec<Entry> {
        [Side::Bucket, Side::Other]
            .into_iter()
            .filter_map(|side| self.live(key, side))
            .collect()
    }

    pub fn keys(&self) -> impl Iterator<Item = &Bytes> {
        self.keys.keys()
    }

    /// Live states in all.
    pub fn live_count(&self) -> usize {
        self.keys.keys().map(|k| self.entries(k).len()).sum()
    }

    pub fn write(&mut self, write: Write) {
        let now = self.now;
        let entry = write.entry.filter(|e| e.expires_at > now);
        self.keys.entry(write.key).or_default()[write.side as usize] = entry;
    }

    /// Keeps of `key`'s live states only those in `held` (what the store
    /// kept when it evicted); returns how many went. A state held that the
    /// model does not have is an error.
    pub fn keep_only(&mut self, key: &[u8], held: &[Entry]) -> Result<usize, String> {
        let live = self.entries(key);
        if let Some(extra) = held.iter().find(|e| !live.contains(e)) {
            return Err(format!("holds {extra:?}, the model {live:?}"));
        }
        let mut lost = 0;
        for side in [Side::Bucket, Side::Other] {
            if self.live(key, side).is_some_and(|e| !held.contains(&e)) {
                self.keys.get_mut(key).expect("live")[side as usize] = None;
                lost += 1;
            }
        }
        Ok(lost)
    }

    /// Forgets both states; whether either was live.
    pub fn remove(&mut self, key: &[u8]) -> bool {
        let live = !self.entries(key).is_empty();
        if let Some(held) = self.keys.get_mut(key) {
            *held = Default::default();
        }
        live
    }

    /// A lease id to release: the `pick`th the key holds (expired ones
    /// too), or now and then one it never had.
    pub fn lease_of(&self, key: &[u8], pick: usize) -> u64 {
        pick_lease(self.live(key, Side::Other).map(|e| e.state).as_ref(), pick)
    }

    /// A release frees a live lease of a live state; the state left
    /// expires by the algorithm's say.
    pub fn release(&mut self, key: &Bytes, lease: u64) -> bool {
        let Some(entry) = self.live(key, Side::Other) else {
            return false;
        };
        let Some((state, expires_at)) = release_lease(&entry.state, lease, self.now) else {
            return false;
        };
        let entry = Some(Entry { state, expires_at });
        self.write(Write {
            key: key.clone(),
            side: Side::Other,
            entry,
        });
        true
    }

    /// Remote usage: charged at its time (no later than now), then
    /// refunded as REFUNDs at now would (in steps of a REFUND's `u32`).
    /// Whether the state changed, and the write when it did (which a
    /// refusing cap may answer StoreFull to, when it adds an entry).
    pub fn absorb(
        &self,
        key: &Bytes,
        limit: &Limit,
        usage: RemoteUsage,
    ) -> (Result<bool, AbsorbError>, Option<(Write, bool)>) {
        let policy = match Policy::from_limit_with(limit, self.max_log) {
            Ok(p) => p,
            Err(e) => return (Err(e.into()), None),
        };
        let side = side_of(&policy);
        let current = self.live(key, side);
        let mut entry = current.clone();
        let state = entry.as_ref().map(|e| &e.state);
        match policy.absorb(state, usage.at, self.now, usage.charged) {
            Err(e) => return (Err(e.into()), None),
            Ok(Some((state, expires_at))) => entry = Some(Entry { state, expires_at }),
            Ok(None) => {}
        }
        let mut refund = usage.refunded;
        while refund > 0 && entry.is_some() {
            let step = refund.min(u64::from(u32::MAX));
            refund -= step;
            let state = entry.as_ref().map(|e| &e.state);
            let verdict = policy
                .refund(state, self.now, step)
                .expect("a global algorithm takes refunds");
            let expires_at = verdict.expires_at;
            entry = verdict.state.map(|state| Entry { state, expires_at });
        }
        let entry = entry.filter(|e| e.expires_at > self.now);
        if entry == current {
            return (Ok(false), None);
        }
        let adds = entry.as_ref().is_some_and(|e| may_add(&current, e));
        let key = key.clone();
        (Ok(true), Some((Write { key, side, entry }, adds)))
    }

    /// One check or refund of `pairs`.
    pub fn group(&self, pairs: &[Pair], op: GroupOp) -> Expect {
        let slot = Slot::of(&pairs[0].key);
        if pairs.iter().any(|p| Slot::of(&p.key) != slot) {
            return Expect::error(ErrorCode::CrossSlot);
        }
        let mut policies = Vec::new();
        for pair in pairs {
            let LimitRef::Inline(limit) = &pair.limit else {
                return Expect::error(ErrorCode::UnknownRule);
            };
            match Policy::from_limit_with(limit, self.max_log) {
                Ok(p) if pair.cost > 0 => policies.push(p),
                _ => return Expect::error(ErrorCode::InvalidLimit),
            }
        }
        // One lease per decision, released rather than refunded; and one
        // other state per key, so two other algorithms on one key would
        // lose a charge.
        let leases = policies.iter().filter(|p| p.is_concurrency()).count();
        let clash = (0..pairs.len()).any(|i| {
            (i + 1..pairs.len()).any(|j| {
                pairs[i].key == pairs[j].key
                    && side_of(&policies[i]) == Side::Other
                    && side_of(&policies[j]) == Side::Other
                    && policies[i].algorithm() != policies[j].algorithm()
            })
        });
        if leases > 1 || (leases > 0 && op == GroupOp::Refund) || clash {
            return Expect::error(ErrorCode::InvalidLimit);
        }

        let now = self.now;
        // The state each (key, side) holds so far in the group.
        let mut after: HashMap<(Bytes, Side), Option<Entry>> = HashMap::new();
        let mut writes = Vec::new();
        let mut decisions = Vec::new();
        let mut adds = false;
        for (pair, policy) in pairs.iter().zip(&policies) {
            let side = side_of(policy);
            let at = (pair.key.clone(), side);
            let before = self.live(&pair.key, side);
            let current = after.get(&at).cloned().unwrap_or_else(|| before.clone());
            let state = current.as_ref().map(|e| &e.state);
            let verdict = match op {
                GroupOp::Check(_) => policy.evaluate(state, now, pair.cost),
                GroupOp::Refund => policy
                    .refund(state, now, pair.cost.into())
                    .expect("leases are refused above"),
            };
            let next = match verdict.state {
                Some(state) if verdict.decision.allowed => Some(Entry {
                    state,
                    expires_at: verdict.expires_at,
                }),
                _ => current,
            };
            adds |= next.as_ref().is_some_and(|e| may_add(&before, e));
            writes.push(Write {
                key: pair.key.clone(),
                side,
                entry: next.clone(),
            });
            after.insert(at, next);
            decisions.push(verdict.decision);
        }
        let all_allowed = decisions.iter().all(|d| d.allowed);
        let charges = matches!(op, GroupOp::Check(Mode::Charge) | GroupOp::Refund);
        let mut decision = summarize(&decisions, all_allowed);
        decision.lease = match op {
            GroupOp::Check(Mode::Charge) if all_allowed => decisions.iter().find_map(|d| d.lease),
            _ => None,
        };
        Expect {
            result: CheckResult::Decision(decision),
            writes: if all_allowed && charges {
                writes
            } else {
                Vec::new()
            },
            may_add: all_allowed && adds,
        }
    }
}

/// The group's decision: when every pair passes, the one with the least
/// remaining; otherwise the denial that waits longest (never is longest);
/// the first pair on ties.
fn summarize(decisions: &[Decision], all_allowed: bool) -> tollgate_protocol::Decision {
    let wait = |d: &Decision| d.retry_after.unwrap_or(u64::MAX);
    let mut chosen = 0;
    for (i, d) in decisions.iter().enumerate() {
        let best = &decisions[chosen];
        let better = if all_allowed {
            d.remaining < best.remaining
        } else {
            !d.allowed && (best.allowed || wait(d) > wait(best))
        };
        if better {
            chosen = i;
        }
    }
    decisions[chosen].to_wire(chosen as u8)
}
