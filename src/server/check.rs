//! Answering CHECK and PEEK frames: named rules, shadow mode, metrics.
//!
//! ```text
//!  frame -> rules.current() (once) -> per check:
//!     all pairs inline ----------------------------> store.check(pairs)
//!     named rules: resolve (UnknownRule) -> no shadow -> store.check(resolved)
//!                                        -> shadow    -> slots, then
//!         enforced pairs as a group (deny / error ends it), then
//!         shadow pairs as a group (a denial becomes allowed + shadow_denied)
//!  -> count the decision under the deciding pair's rule; record denied keys
//! ```
//!
//! The common check (inline limits, or rules without shadow) calls the store
//! once, exactly as before rules existed. Resolving a rule costs one hash
//! lookup by name and copies nothing but reference-counted key handles.
//! Metric handles are resolved when rules are loaded, so counting a decision
//! is one atomic add; latency and batch size are observed once per frame.

use super::Shared;
use crate::clock::Nanos;
use crate::rules::spec::INLINE_LABEL;
use crate::rules::{DecisionCounters, Rule, RuleSet};
use crate::slot::Slot;
use crate::store::Mode;
use bytes::BytesMut;
use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use smallvec::SmallVec;
use std::time::Instant;
use tollgate_protocol::{
    encode_checked, CheckBatch, CheckResult, Decision, EncodeError, ErrorCode, LimitRef, Pair,
    RequestId,
};

/// What the check path counts.
#[derive(Debug, Clone)]
pub(crate) struct CheckMetrics {
    /// `tollgate_checks_total{rule, decision}`; rules take their handles
    /// from it when they are loaded.
    pub checks: IntCounterVec,
    /// Handles of checks decided by inline limits.
    inline: DecisionCounters,
    latency: Histogram,
    batch_size: Histogram,
}

impl CheckMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let checks = IntCounterVec::new(
            Opts::new(
                "tollgate_checks_total",
                "Checks answered, by the rule of the pair that decided them \
                 (\"inline\" for inline limits) and the decision.",
            ),
            &["rule", "decision"],
        )?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_check_frame_duration_seconds",
                "Time to evaluate one CHECK or PEEK frame, all its checks.",
            )
            .buckets(exponential_buckets(1e-6, 4.0, 10)?),
        )?;
        let batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_check_batch_size",
                "Checks in one CHECK or PEEK frame.",
            )
            .buckets(exponential_buckets(1.0, 2.0, 11)?),
        )?;
        registry.register(Box::new(checks.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(batch_size.clone()))?;
        Ok(Self {
            inline: DecisionCounters::new(&checks, INLINE_LABEL),
            checks,
            latency,
            batch_size,
        })
    }
}

/// Evaluates every check of `batch` and appends the CHECKED answer to `dst`.
pub(super) fn answer(
    shared: &Shared,
    id: RequestId,
    batch: &CheckBatch,
    mode: Mode,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let started = Instant::now();
    let rules = shared.rules.current();
    let frame = Frame {
        shared,
        rules: &rules,
        now: shared.clock.now(),
        mode,
    };
    let encoded = encode_checked(id, batch.iter().map(|pairs| frame.check(pairs)), dst);
    let metrics = &shared.metrics.checks;
    metrics.batch_size.observe(batch.len() as f64);
    metrics.latency.observe(started.elapsed().as_secs_f64());
    encoded
}

/// One frame's view: the rules and the time every check of it sees.
struct Frame<'a> {
    shared: &'a Shared,
    rules: &'a RuleSet,
    now: Nanos,
    mode: Mode,
}

/// How a check ended, for counting.
enum Decided<'r> {
    Decision {
        decision: Decision,
        /// The rule of the pair the decision describes (None: inline).
        rule: Option<&'r Rule>,
    },
    Error(ErrorCode),
}

impl Frame<'_> {
    fn check(&self, pairs: &[Pair]) -> CheckResult {
        let decided = self.evaluate(pairs);
        match decided {
            Decided::Decision { decision, rule } => {
                let counters = rule.map_or(&self.shared.metrics.checks.inline, |r| &r.counters);
                if !decision.allowed {
                    counters.denied.inc();
                    if let Some(pair) = pairs.get(usize::from(decision.pair)) {
                        self.shared.throttled.record(&pair.key, self.now);
                    }
                } else if decision.shadow_denied {
                    counters.shadow_denied.inc();
                } else {
                    counters.allowed.inc();
                }
                CheckResult::Decision(decision)
            }
            Decided::Error(code) => {
                self.shared.metrics.errors.count(code);
                CheckResult::Error(code)
            }
        }
    }

    fn store_check(&self, pairs: &[Pair]) -> Result<Decision, ErrorCode> {
        match self.shared.store.check(pairs, self.now, self.mode) {
            CheckResult::Decision(d) => Ok(d),
            CheckResult::Error(code) => Err(code),
        }
    }

    fn evaluate(&self, pairs: &[Pair]) -> Decided<'_> {
        if pairs.iter().all(|p| matches!(p.limit, LimitRef::Inline(_))) {
            return match self.store_check(pairs) {
                Ok(decision) => Decided::Decision {
                    decision,
                    rule: None,
                },
                Err(code) => Decided::Error(code),
            };
        }

        // Resolve names against this frame's rules; unknown names first.
        let mut resolved: SmallVec<[Pair; 4]> = SmallVec::with_capacity(pairs.len());
        let mut rules: SmallVec<[Option<&Rule>; 4]> = SmallVec::with_capacity(pairs.len());
        for pair in pairs {
            match &pair.limit {
                LimitRef::Inline(_) => {
                    resolved.push(pair.clone());
                    rules.push(None);
                }
                LimitRef::Rule(name) => {
                    let Some(rule) = self.rules.get(name.as_bytes()) else {
                        return Decided::Error(ErrorCode::UnknownRule);
                    };
                    resolved.push(Pair {
                        key: pair.key.clone(),
                        limit: LimitRef::Inline(rule.limit),
                        cost: if pair.cost == 0 {
                            rule.default_cost()
                        } else {
                            pair.cost
                        },
                    });
                    rules.push(Some(rule));
                }
            }
        }
        let is_shadow = |i: usize| rules[i].is_some_and(Rule::shadow);
        if !(0..pairs.len()).any(is_shadow) {
            return match self.store_check(&resolved) {
                Ok(decision) => Decided::Decision {
                    rule: rules[usize::from(decision.pair)],
                    decision,
                },
                Err(code) => Decided::Error(code),
            };
        }

        // Shadow mode: the slot rule holds for the whole group, then the
        // enforced pairs decide, then the shadow pairs are evaluated as a
        // group of their own.
        let slot = Slot::of(&resolved[0].key);
        if resolved[1..].iter().any(|p| Slot::of(&p.key) != slot) {
            return Decided::Error(ErrorCode::CrossSlot);
        }
        let (shadow_idx, enforced_idx): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
            (0..pairs.len()).partition(|&i| is_shadow(i));
        let subset = |idx: &[usize]| -> SmallVec<[Pair; 4]> {
            idx.iter().map(|&i| resolved[i].clone()).collect()
        };
        // Decisions of a part describe its pairs by their index in the part.
        let remap = |mut d: Decision, idx: &[usize]| {
            let i = idx[usize::from(d.pair)];
            d.pair = i as u8;
            (d, rules[i])
        };

        let enforced = if enforced_idx.is_empty() {
            None
        } else {
            match self.store_check(&subset(&enforced_idx)) {
                Err(code) => return Decided::Error(code),
                Ok(d) => {
                    let (decision, rule) = remap(d, &enforced_idx);
                    if !decision.allowed {
                        return Decided::Decision { decision, rule };
                    }
                    Some((decision, rule))
                }
            }
        };
        let shadow = match self.store_check(&subset(&shadow_idx)) {
            Ok(d) => remap(d, &shadow_idx),
            Err(code) => {
                // Unreachable with validated rules and checked slots; the
                // enforced answer stands if there is one.
                tracing::error!(code = %code, "shadow pairs could not be evaluated");
                return match enforced {
                    Some((decision, rule)) => Decided::Decision { decision, rule },
                    None => Decided::Error(code),
                };
            }
        };
        let (decision, rule) = match (enforced, shadow) {
            (_, (mut d, rule)) if !d.allowed => {
                d.allowed = true;
                d.shadow_denied = true;
                (d, rule)
            }
            // Both passed: the pair with the least remaining, ties to the
            // lower index (as for any group).
            (Some(e), s) => {
                if (s.0.remaining, s.0.pair) < (e.0.remaining, e.0.pair) {
                    s
                } else {
                    e
                }
            }
            (None, s) => s,
        };
        Decided::Decision { decision, rule }
    }
}
