//! Evaluating one check: an atomic group of (key, limit, cost) pairs.
//!
//! Order of work: validate every pair and its slot without any lock, then
//! take the one stripe lock, evaluate each pair against the state left by the
//! pairs before it (a key may appear twice in a group), and write only when
//! every pair passes in [`Mode::Charge`]. The buffers live on the stack for
//! groups up to four pairs, so the common check allocates nothing but a new
//! key's copy.

use super::{Entry, Store};
use crate::algorithm::{Policy, Verdict};
use crate::clock::Nanos;
use crate::slot::Slot;
use crate::sync::{AtomicU64, Ordering};
use smallvec::SmallVec;
use tollgate_protocol::{CheckResult, ErrorCode, LimitRef, Pair};

/// Whether a passing check is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// CHECK: charge every pair when all pass.
    Charge,
    /// PEEK: answer as a check would, change nothing.
    Peek,
}

impl Store {
    /// Evaluates one check (an atomic group when it has several pairs).
    pub fn check(&self, pairs: &[Pair], now: Nanos, mode: Mode) -> CheckResult {
        match self.evaluate_group(pairs, now, mode) {
            Ok(decision) => CheckResult::Decision(decision),
            Err(code) => CheckResult::Error(code),
        }
    }

    fn evaluate_group(
        &self,
        pairs: &[Pair],
        now: Nanos,
        mode: Mode,
    ) -> Result<tollgate_protocol::Decision, ErrorCode> {
        let first = pairs.first().ok_or(ErrorCode::Malformed)?;
        if pairs.len() > usize::from(u8::MAX) {
            return Err(ErrorCode::BatchTooLarge);
        }
        let slot = Slot::of(&first.key);
        if pairs[1..].iter().any(|p| Slot::of(&p.key) != slot) {
            return Err(ErrorCode::CrossSlot);
        }
        let policies = pairs
            .iter()
            .map(|p| {
                if p.cost == 0 {
                    return Err(ErrorCode::InvalidLimit);
                }
                // Named rules are resolved to inline limits by the caller
                // (the server's rule set); the store holds no configuration.
                let LimitRef::Inline(limit) = &p.limit else {
                    return Err(ErrorCode::UnknownRule);
                };
                Policy::from_limit(limit).map_err(|_| ErrorCode::InvalidLimit)
            })
            .collect::<Result<SmallVec<[Policy; 4]>, _>>()?;

        let mut map = self.stripe(slot).map.lock();
        let mut verdicts: SmallVec<[Verdict; 4]> = SmallVec::new();
        // The entry each pair leaves behind, seen by a later pair on the same key.
        let mut after: SmallVec<[Option<Entry>; 4]> = SmallVec::new();
        for (i, (pair, policy)) in pairs.iter().zip(&policies).enumerate() {
            let earlier = pairs[..i].iter().rposition(|p| p.key == pair.key);
            let current = match earlier {
                Some(j) => after[j],
                None => live_entry(&mut map, &pair.key, now, &self.expired_on_access),
            };
            let verdict = policy.evaluate(current.as_ref().map(|e| &e.state), now, pair.cost);
            after.push(if verdict.decision.allowed {
                Some(Entry {
                    state: verdict.state,
                    expires_at: verdict.expires_at,
                })
            } else {
                current
            });
            verdicts.push(verdict);
        }

        let all_allowed = verdicts.iter().all(|v| v.decision.allowed);
        if all_allowed && mode == Mode::Charge {
            for (pair, entry) in pairs.iter().zip(&after) {
                let Some(entry) = *entry else { continue };
                match map.get_mut(&pair.key[..]) {
                    Some(slot) => *slot = entry,
                    None => {
                        map.insert(pair.key.to_vec().into_boxed_slice(), entry);
                    }
                }
            }
        }
        drop(map);
        Ok(summarize(&verdicts, all_allowed))
    }
}

/// The key's entry if it is still live; an expired one is dropped on the
/// spot (and counted in `expired`).
fn live_entry(map: &mut super::Map, key: &[u8], now: Nanos, expired: &AtomicU64) -> Option<Entry> {
    match map.get(key) {
        Some(e) if e.expires_at > now => Some(*e),
        Some(_) => {
            map.remove(key);
            // Relaxed: a statistic, read by the metrics only.
            expired.fetch_add(1, Ordering::Relaxed);
            None
        }
        None => None,
    }
}

/// One decision for the whole group: when every pair passes, the pair with
/// the least remaining (what the gateway's headers should show); otherwise
/// the denying pair that must wait longest ("never" is longest).
fn summarize(verdicts: &[Verdict], all_allowed: bool) -> tollgate_protocol::Decision {
    let key = |v: &Verdict| -> (u64, u64) {
        if all_allowed {
            (u64::MAX - v.decision.remaining, 0)
        } else if v.decision.allowed {
            (0, 0)
        } else {
            (1, v.decision.retry_after.unwrap_or(u64::MAX))
        }
    };
    // max_by_key keeps the last maximum; iterate in reverse so ties go to
    // the first pair.
    let (index, verdict) = verdicts
        .iter()
        .enumerate()
        .rev()
        .max_by_key(|(_, v)| key(v))
        .expect("a group has at least one pair");
    verdict.decision.to_wire(index as u8)
}
