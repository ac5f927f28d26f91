//! Answering CHECK, PEEK and REFUND frames (named rules, shadow mode,
//! leases, metrics) and RELEASE frames.
//!
//! ```text
//!  frame -> rules.current() (once) -> per check:
//!     resolve: ResolvedPair per pair (UnknownRule)
//!       -> no shadow -> store.check(resolved)
//!       -> shadow    -> slots, one lease, then
//!         enforced pairs as a group (deny / error ends it), then
//!         shadow pairs as a group (a denial becomes allowed + shadow_denied,
//!         unless the enforced pairs hold a lease: then their decision stands)
//!  -> count the decision under the deciding pair's rule; record denied keys
//!
//!  CHECK2 (tagged.rs): per check, by idempotency key (none: straight on):
//!     remembered within the window -> the remembered answer, nothing charged
//!       (for another owner or another check: IdempotencyKeyReused)
//!     else shed by priority and connection backlog -> Shed, nothing charged
//!     else evaluated as a CHECK's check (and remembered if a decision)
//!
//!  REFUND: resolve (UnknownRule, cost 0 = default) -> store.refund(resolved)
//!  RELEASE: store.release per lease
//! ```
//!
//! The common check (inline limits, or rules without shadow) calls the store
//! once, exactly as before rules existed. The store takes only resolved
//! pairs (`store::ResolvedPair`: the key borrowed from the frame, a limit,
//! a cost): resolving an inline pair copies its limit, a rule's pair costs
//! one hash lookup by name; no key is copied or reference-counted.
//! Metric handles are resolved when rules are loaded, so counting a decision
//! is one atomic add; decisions of inline limits are tallied by the frame
//! and added once per frame; latency and batch size are observed once per
//! CHECK or PEEK frame. A frame's keys are located (slot and hash, see
//! `Store::spot`) and prefetched before its first check, and the checks
//! reuse those spots. Refunds are not checks: they count only their errors.

mod capped;
mod frame_rules;
mod global;
mod metrics;
mod tagged;

pub(crate) use capped::GlobalRuleState;
use frame_rules::FrameRules;
pub(crate) use global::UsageError;
use metrics::Tally;
pub(crate) use metrics::{CheckMetrics, ErrorCounters};

use super::Engine;
use crate::clock::Nanos;
use crate::events::{self, Events, Outcome};
use crate::node::regions::Recorded;
use crate::node::Gate;
use crate::rules::{Rule, RuleSet};
use crate::slot::Slot;
use crate::store::{Mode, ResolvedPair, Returned, Spot};
use bytes::BytesMut;
use smallvec::SmallVec;
use std::cell::RefCell;
use std::time::Instant;
use tollgate_protocol::{
    encode_checked, encode_response, Algorithm, CheckBatch, CheckResult, Decision, EncodeError,
    ErrorCode, LeaseRef, LimitRef, Pair, RequestId, Response,
};

/// The verb of a CHECK-shaped frame: what it does with its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// CHECK (charge) or PEEK.
    Check(Mode),
    /// REFUND: give each pair's cost back.
    Refund,
}

impl Engine {
    /// Evaluates every check of `batch` and appends the CHECKED answer to `dst`.
    pub fn answer(
        &self,
        id: RequestId,
        batch: &CheckBatch,
        verb: Verb,
        gate: &Gate<'_>,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        self.in_frame(verb, gate, batch.len(), |evaluation| {
            let mut spots = Spots::new();
            batch
                .iter()
                .for_each(|pairs| evaluation.prefetch(pairs, &mut spots));
            let mut at = 0;
            let results = batch.iter().map(|pairs| {
                let spots = &spots[at..at + pairs.len()];
                at += pairs.len();
                evaluation.check(pairs, spots)
            });
            encode_checked(id, results, dst)
        })
    }

    /// One frame of `checks` checks: its evaluation (the rules and the time
    /// every check of it sees) handed to `encode`, then, for CHECK and PEEK
    /// frames, the frame's batch size and latency observed.
    fn in_frame<'f>(
        &self,
        verb: Verb,
        gate: &Gate<'_>,
        checks: usize,
        encode: impl FnOnce(&Evaluation<'_, 'f>) -> Result<(), EncodeError>,
    ) -> Result<(), EncodeError> {
        let started = Instant::now();
        let rules = self.rules.current();
        let evaluation = Evaluation {
            engine: self,
            rules: FrameRules::new(&rules),
            now: self.clock.now_at(started),
            verb,
            gate,
            inline: Tally::default(),
            usage: RefCell::default(),
            ceilings: RefCell::default(),
        };
        let encoded = encode(&evaluation);
        // Finished here (on drop): counted, and its usage recorded.
        drop(evaluation);
        if let Verb::Check(_) = verb {
            let metrics = &self.metrics;
            metrics.batch_size.observe(checks as f64);
            metrics.latency.observe(started.elapsed().as_secs_f64());
        }
        encoded
    }

    /// One check outside a frame, for the drop-in front ends: resolved,
    /// evaluated, counted and its denial recorded exactly as one check of a
    /// CHECK (or, with [`Mode::Peek`], PEEK) frame, at `now` and under `rules`
    /// (the frame's latency and batch size are not observed: there is none).
    pub fn check_one(
        &self,
        rules: &RuleSet,
        now: Nanos,
        pairs: &[Pair],
        mode: Mode,
    ) -> CheckResult {
        let spots: Spots = pairs.iter().map(|p| self.store.spot(&p.key)).collect();
        let evaluation = Evaluation {
            engine: self,
            rules: FrameRules::new(rules),
            now,
            verb: Verb::Check(mode),
            // The front ends route by CLUSTER SLOTS (the same topology as
            // TOPOLOGY) and are not redirected key by key.
            gate: &Gate::All,
            inline: Tally::default(),
            usage: RefCell::default(),
            ceilings: RefCell::default(),
        };
        let result = evaluation.check(pairs, &spots);
        drop(evaluation);
        result
    }

    /// Frees the leases of a RELEASE and appends the RELEASED answer to `dst`.
    pub fn release(
        &self,
        id: RequestId,
        leases: &[LeaseRef],
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let now = self.clock.now();
        let released = leases
            .iter()
            .filter(|l| self.store.release(&l.key, l.lease, now))
            .count();
        // At most max_batch (a u16), so this fits.
        encode_response(id, &Response::Released(released as u32), dst)
    }
}

/// The evaluation of one frame's checks (of pairs borrowed for `'f`): the
/// rules and the time every check of it sees.
struct Evaluation<'a, 'f> {
    engine: &'a Engine,
    rules: FrameRules<'a>,
    now: Nanos,
    verb: Verb,
    /// Which slots this node serves (cluster mode: a check whose slot is
    /// moving gets TryAgain on its own).
    gate: &'a Gate<'a>,
    /// The decisions of inline limits so far, added to their counters
    /// once the frame is evaluated: one atomic add per decision would
    /// bounce the counters' cache line between the workers on every check.
    inline: Tally,
    /// The usage of global keys the frame's checks charged or refunded, in
    /// their order, recorded for the peer regions once the frame is
    /// evaluated (`Regions::record_all`): one lock of the journal per frame.
    usage: RefCell<SmallVec<[Recorded<'f>; 16]>>,
    /// The ceiling keys of the frame's global pairs, built and located by
    /// the prefetch for the checks.
    ceilings: RefCell<global::Ceilings>,
}

/// The spots of a frame's pairs (their slots and hashes, see
/// `Store::spot`), in order: computed once, by the prefetch walk, and
/// used again by the checks.
type Spots = SmallVec<[Spot; 32]>;

/// A check's pairs as the store takes them (rules resolved to their
/// limits), and the rule of each (None: inline). Filled in place by
/// [`Evaluation::resolve`] in the caller's frame: returned by value, the
/// two inline arrays (some 270 bytes) were copied twice per check.
#[derive(Default)]
struct Resolved<'p, 'r> {
    checks: SmallVec<[ResolvedPair<'p>; 4]>,
    rules: SmallVec<[Option<&'r Rule>; 4]>,
}

/// How a check ended, for counting.
enum Decided<'r> {
    Decision {
        decision: Decision,
        /// The rule the check is counted under: of the pair the decision
        /// describes, or of the shadow pair that would have denied (None:
        /// inline).
        rule: Option<&'r Rule>,
        /// Counted as shadow-denied. Usually `decision.shadow_denied`; also
        /// set when a shadow rule would have denied a check whose enforced
        /// pairs acquired a lease, which is answered with that lease (the
        /// wire cannot carry both, and the client must be able to release
        /// it).
        shadow_denied: bool,
    },
    /// A refund's answer: not counted as a check.
    Refunded(Decision),
    Error(ErrorCode),
}

impl<'r> Decided<'r> {
    fn decision(decision: Decision, rule: Option<&'r Rule>) -> Self {
        Self::Decision {
            shadow_denied: decision.shadow_denied,
            decision,
            rule,
        }
    }
}

/// The end of every evaluation, however it ends (a panic in a frame
/// included: what the store charged then still reaches the peer regions):
/// the frame's tallies go to the metrics and its usage of global keys to
/// the regions layer.
impl Drop for Evaluation<'_, '_> {
    fn drop(&mut self) {
        self.inline.add_to(self.engine.metrics.inline());
        let usage = self.usage.get_mut();
        if let Some(regions) = self.engine.node.regions().filter(|_| !usage.is_empty()) {
            regions.record_all(usage, self.now);
        }
    }
}

impl<'f> Evaluation<'_, 'f> {
    /// Appends the spot of each of `pairs` to `spots` and starts fetching
    /// the table entries they will touch (see `Store::prefetch`), so a
    /// frame's checks wait on memory together.
    fn prefetch(&self, pairs: &[Pair], spots: &mut Spots) {
        let store = &self.engine.store;
        for pair in pairs {
            let spot = store.spot(&pair.key);
            spots.push(spot);
            let algorithm = match &pair.limit {
                LimitRef::Inline(limit) => limit.algorithm,
                LimitRef::Rule(name) => match self.rules.get(name.as_bytes()) {
                    Some(rule) => {
                        self.prefetch_ceiling(pair, spot, rule);
                        rule.limit.algorithm
                    }
                    None => continue,
                },
            };
            store.prefetch(&pair.key, spot, algorithm);
        }
    }

    /// Evaluates one check; `spots` are its pairs' (from `prefetch`).
    fn check(&self, pairs: &'f [Pair], spots: &[Spot]) -> CheckResult {
        if pairs.first().is_some_and(|p| self.gate.moving(&p.key)) {
            // Nobody admits a moving slot; nothing is charged.
            self.engine.errors.count(ErrorCode::TryAgain);
            return CheckResult::Error(ErrorCode::TryAgain);
        }
        // Global rules matter only on a node in a region, and only to pairs
        // naming a rule.
        let regions = self
            .engine
            .node
            .regions()
            .filter(|_| pairs.iter().any(|p| matches!(p.limit, LimitRef::Rule(_))));
        let decided = match (self.verb, regions) {
            (Verb::Check(Mode::Charge), Some(regions)) => {
                self.charge_regional(regions, pairs, spots)
            }
            (Verb::Refund, Some(regions)) => self.refund_regional(regions, pairs, spots),
            (Verb::Check(mode), _) => self.evaluate(pairs, spots, mode),
            (Verb::Refund, None) => self.refund(pairs, spots),
        };
        match decided {
            Decided::Decision {
                decision,
                rule,
                shadow_denied,
            } => {
                let outcome = if !decision.allowed {
                    Outcome::Denied
                } else if shadow_denied {
                    Outcome::ShadowDenied
                } else {
                    Outcome::Allowed
                };
                if let Some(events) = self.events() {
                    if events.wants(outcome) {
                        let pair = pairs.get(usize::from(decision.pair));
                        self.offer(events, pair, rule, outcome, Some(decision.remaining), None);
                    }
                }
                self.inline.count(rule.map(|r| &r.counters), outcome);
                if outcome == Outcome::Denied {
                    if let Some(pair) = pairs.get(usize::from(decision.pair)) {
                        self.engine.throttled.record(&pair.key, self.now);
                    }
                }
                CheckResult::Decision(decision)
            }
            Decided::Refunded(decision) => CheckResult::Decision(decision),
            Decided::Error(code) => {
                if let Some(events) = self.events() {
                    let pair = pairs.first();
                    let rule = pair.and_then(|p| match &p.limit {
                        LimitRef::Rule(name) => self.rules.get(name.as_bytes()),
                        LimitRef::Inline(_) => None,
                    });
                    self.offer(events, pair, rule, Outcome::Refused, None, Some(code));
                }
                self.engine.errors.count(code);
                CheckResult::Error(code)
            }
        }
    }

    /// The events sink, for charging checks only (a PEEK decides nothing).
    fn events(&self) -> Option<&Events> {
        match self.verb {
            Verb::Check(Mode::Charge) => self.engine.events.as_ref(),
            _ => None,
        }
    }

    /// Queues the event of a check decided on `pair` (by `rule`, or the
    /// pair's inline limit).
    fn offer(
        &self,
        events: &Events,
        pair: Option<&Pair>,
        rule: Option<&Rule>,
        outcome: Outcome,
        remaining: Option<u64>,
        code: Option<ErrorCode>,
    ) {
        let Some(pair) = pair else { return };
        let (name, limit) = match (rule, &pair.limit) {
            (Some(r), _) => (Some(r.name()), Some(&r.limit)),
            (None, LimitRef::Inline(l)) => (None, Some(l)),
            // A rule the frame's set does not have (UnknownRule).
            (None, LimitRef::Rule(n)) => (Some(n.as_str()), None),
        };
        let cost = match rule {
            Some(r) if pair.cost == 0 => r.default_cost(),
            _ => pair.cost,
        };
        events.offer(events::Decided {
            key: &pair.key,
            rule: name,
            limit,
            cost,
            outcome,
            remaining,
            code,
        });
    }

    fn store_check(
        &self,
        checks: &[ResolvedPair<'_>],
        spots: &[Spot],
        mode: Mode,
    ) -> Result<Decision, ErrorCode> {
        match self.engine.store.check_at(checks, spots, self.now, mode) {
            CheckResult::Decision(d) => Ok(d),
            CheckResult::Error(code) => Err(code),
        }
    }

    /// Fills `into` (empty) with the pairs as the store takes them: inline
    /// limits as they are, rule names resolved to their rule's limit
    /// (`cost` 0 taking the rule's default), and the rule of each (None:
    /// inline); UnknownRule for a name the frame's rules do not have. Keys
    /// are borrowed, not copied.
    fn resolve<'p, 'r>(
        &'r self,
        pairs: &'p [Pair],
        into: &mut Resolved<'p, 'r>,
    ) -> Result<(), ErrorCode> {
        // Free when the pairs fit inline (four: nearly every check).
        into.checks.reserve(pairs.len());
        into.rules.reserve(pairs.len());
        for pair in pairs {
            let (limit, cost, rule) = match &pair.limit {
                LimitRef::Inline(limit) => (*limit, pair.cost, None),
                LimitRef::Rule(name) => {
                    let rule = self
                        .rules
                        .get(name.as_bytes())
                        .ok_or(ErrorCode::UnknownRule)?;
                    let cost = if pair.cost == 0 {
                        rule.default_cost()
                    } else {
                        pair.cost
                    };
                    (rule.limit, cost, Some(rule))
                }
            };
            into.checks.push(ResolvedPair::new(&pair.key, limit, cost));
            into.rules.push(rule);
        }
        Ok(())
    }

    /// A REFUND check: resolved like a CHECK, then refunded as one group
    /// (shadow rules too: their units were charged when their part passed).
    fn refund(&self, pairs: &[Pair], spots: &[Spot]) -> Decided<'_> {
        let mut resolved = Resolved::default();
        match self.resolve(pairs, &mut resolved) {
            Ok(()) => self.refund_resolved(&resolved.checks, spots, None),
            Err(code) => Decided::Error(code),
        }
    }

    /// The refund of pairs resolved already, filling `returned`, when
    /// given, with the units each pair gave back (see
    /// `Store::refund_returning`): what a global rule's refund reports to
    /// the peers; a plain refund does not count them.
    fn refund_resolved(
        &self,
        checks: &[ResolvedPair<'_>],
        spots: &[Spot],
        returned: Option<&mut Returned>,
    ) -> Decided<'_> {
        let store = &self.engine.store;
        let result = match returned {
            Some(r) => store.refund_returning(checks, spots, self.now, r),
            None => store.refund_at(checks, spots, self.now),
        };
        match result {
            CheckResult::Decision(d) => Decided::Refunded(d),
            CheckResult::Error(code) => Decided::Error(code),
        }
    }

    /// A CHECK or PEEK check: resolved, then one group for the store, or,
    /// when a pair names a shadow rule, two ([`Self::evaluate_shadow`]).
    fn evaluate(&self, pairs: &[Pair], spots: &[Spot], mode: Mode) -> Decided<'_> {
        // Resolve names against this frame's rules; unknown names first.
        let mut resolved = Resolved::default();
        if let Err(code) = self.resolve(pairs, &mut resolved) {
            return Decided::Error(code);
        }
        self.evaluate_resolved(&resolved, spots, mode)
    }

    /// [`Self::evaluate`] of pairs resolved already.
    fn evaluate_resolved<'r>(
        &'r self,
        resolved: &Resolved<'_, 'r>,
        spots: &[Spot],
        mode: Mode,
    ) -> Decided<'r> {
        let Resolved { checks, rules } = resolved;
        if rules.iter().any(|r| r.is_some_and(Rule::shadow)) {
            return self.evaluate_shadow(checks, rules, spots, mode);
        }
        // Resolved pairs keep their keys and order: the same spots.
        match self.store_check(checks, spots, mode) {
            Ok(decision) => Decided::decision(decision, rules[usize::from(decision.pair)]),
            Err(code) => Decided::Error(code),
        }
    }

    /// Shadow mode: the slot rule and the one-lease rule hold for the whole
    /// group (each part alone would pass them), then the enforced pairs
    /// decide, then the shadow pairs are evaluated as a group of their own.
    fn evaluate_shadow<'r>(
        &self,
        checks: &[ResolvedPair<'_>],
        rules: &[Option<&'r Rule>],
        spots: &[Spot],
        mode: Mode,
    ) -> Decided<'r> {
        let slot = Slot::of(checks[0].key);
        if checks[1..].iter().any(|c| Slot::of(c.key) != slot) {
            return Decided::Error(ErrorCode::CrossSlot);
        }
        let concurrency = checks
            .iter()
            .filter(|c| c.limit.algorithm == Algorithm::Concurrency)
            .count();
        // The parts are two groups for the store, which would not see a
        // key named with two other states across them: the shadow part's
        // state would replace the enforced part's.
        if concurrency > 1 || crate::store::clashing_states(checks) {
            return Decided::Error(ErrorCode::InvalidLimit);
        }
        let is_shadow = |i: usize| rules[i].is_some_and(Rule::shadow);
        let (shadow_idx, enforced_idx): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
            (0..checks.len()).partition(|&i| is_shadow(i));
        // One part of the group: its checks, their spots; its decision
        // describes its pairs by their index in the part.
        let part = |idx: &[usize]| {
            let checks: SmallVec<[ResolvedPair<'_>; 4]> = idx.iter().map(|&i| checks[i]).collect();
            let spots: SmallVec<[Spot; 4]> = idx.iter().map(|&i| spots[i]).collect();
            self.store_check(&checks, &spots, mode).map(|mut d| {
                let i = idx[usize::from(d.pair)];
                d.pair = i as u8;
                (d, rules[i])
            })
        };

        let enforced = if enforced_idx.is_empty() {
            None
        } else {
            match part(&enforced_idx) {
                Err(code) => return Decided::Error(code),
                Ok((decision, rule)) if !decision.allowed => {
                    return Decided::decision(decision, rule)
                }
                Ok(decided) => Some(decided),
            }
        };
        match part(&shadow_idx) {
            Ok(shadow) => merge_shadow(enforced, shadow),
            Err(code) => {
                // Unreachable with validated rules and checked slots; the
                // enforced answer stands if there is one.
                tracing::error!(code = %code, "shadow pairs could not be evaluated");
                match enforced {
                    Some((decision, rule)) => Decided::decision(decision, rule),
                    None => Decided::Error(code),
                }
            }
        }
    }
}

/// A decision and the rule it is counted under (None: inline).
type Ruled<'r> = (Decision, Option<&'r Rule>);

/// The answer of a check with shadow rules, from its enforced part's
/// decision (None: it has no enforced pairs; allowed, else it was the
/// answer) and its shadow part's.
fn merge_shadow<'r>(enforced: Option<Ruled<'r>>, shadow: Ruled<'r>) -> Decided<'r> {
    match (enforced, shadow) {
        // A would-be denial, but the enforced pairs hold a lease: their
        // decision and its lease are the answer (status 3), the shadow
        // denial is counted only.
        (Some((e, _)), (s, rule)) if !s.allowed && e.lease.is_some() => Decided::Decision {
            decision: e,
            rule,
            shadow_denied: true,
        },
        (_, (mut d, rule)) if !d.allowed => {
            d.allowed = true;
            d.shadow_denied = true;
            d.lease = None;
            Decided::decision(d, rule)
        }
        // Both passed: the pair with the least remaining, ties to the
        // lower index (as for any group), with the lease either part
        // acquired (at most one: the group has one concurrency pair).
        (Some(e), s) => {
            let lease = e.0.lease.or(s.0.lease);
            let (mut decision, rule) = if (s.0.remaining, s.0.pair) < (e.0.remaining, e.0.pair) {
                s
            } else {
                e
            };
            decision.lease = lease;
            Decided::decision(decision, rule)
        }
        (None, (decision, rule)) => Decided::decision(decision, rule),
    }
}
