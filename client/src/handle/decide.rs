//! The rate-limit questions: check, group, policy, peek and refund, and
//! the one pipeline that turns any of them into an [`Outcome`]:
//!
//! ```text
//!  invalid? (module `validity`) ──yes──> Rejected (never allowed)
//!      │ no
//!  lease spend? ──yes──> Decided(lease)
//!      │ no
//!  server call (cost + lease when hot) ──> decision ──> Decided(server)
//!      │ error / error code
//!      ├── invalid request ──────────────────────────> Rejected (never allowed)
//!      └── availability ── fail mode (call > rule > config)
//!             ├── open + fallback + limits known ────> Fallback(local decision)
//!             └── otherwise ─────────────────────────> Undecided{why, fail_mode}
//! ```

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;
use tokio::time::Instant;
use tollgate_protocol::{
    CheckResult, CheckTag, Decision as WireDecision, IdempotencyKey, Limit, LimitRef, Pair,
    RuleName,
};

use super::single::Single;
use super::{Client, Kept};
use crate::calls::{self, one_result};
use crate::config::FailMode;
use crate::connection::pending::{BatchKind, Checks};
use crate::connection::Deadline;
use crate::decision::{Binding, Decision};
use crate::error::Error;
use crate::outcome::{Failure, Outcome, Rejection};
use crate::policy::Policy;

impl Client {
    /// Checks `cost` units of `key` against `limit`, charging them if
    /// allowed. `limit` is an inline [`Limit`] or a [`RuleName`] configured
    /// on the server (then `cost` 0 takes the rule's default cost).
    ///
    /// A plain function returning the check's future (not an `async fn`):
    /// the pair goes straight into one hand-written state machine (module
    /// `single`), with no layer of state of its own around it. The caller's
    /// future embeds and moves that state, so its size is part of what
    /// every check costs.
    pub fn check(
        &self,
        key: impl Into<Bytes>,
        limit: impl Into<LimitRef>,
        cost: u32,
    ) -> impl Future<Output = Outcome> + Send + '_ {
        self.single(BatchKind::Check, key.into(), limit.into(), cost)
    }

    fn single(
        &self,
        kind: BatchKind,
        key: Bytes,
        limit: LimitRef,
        cost: u32,
    ) -> impl Future<Output = Outcome> + Send + '_ {
        Single::new(self, kind, Pair { key, limit, cost })
    }

    /// Checks several (key, limit, cost) pairs as one atomic group: all pass
    /// and all are charged, or none is. The keys must share a hash slot
    /// (the same `{tag}`; see [`KeyBuilder`](crate::KeyBuilder)), else the
    /// outcome is `Rejected(CrossSlot)`.
    pub async fn check_group(&self, pairs: Vec<Pair>) -> Outcome {
        self.decide(BatchKind::Check, pairs.into(), None).await
    }

    /// Checks `policy`'s limits for `identifier` (an API key, an IP, ...)
    /// as one atomic group; the identifier is made safe by the policy's
    /// [`KeyBuilder`](crate::KeyBuilder). An empty identifier, or one whose
    /// key cannot be built, is `Rejected(Malformed)` (respectively
    /// `KeyTooLong`): never allowed.
    pub async fn check_policy(&self, policy: &Policy, identifier: &[u8], cost: u32) -> Outcome {
        self.policy(BatchKind::Check, policy, identifier, cost)
            .await
    }

    /// Like [`check_policy`](Self::check_policy), without charging anything.
    pub async fn peek_policy(&self, policy: &Policy, identifier: &[u8], cost: u32) -> Outcome {
        self.policy(BatchKind::Peek, policy, identifier, cost).await
    }

    async fn policy(
        &self,
        kind: BatchKind,
        policy: &Policy,
        identifier: &[u8],
        cost: u32,
    ) -> Outcome {
        match policy.pairs(identifier, cost) {
            Ok(pairs) => {
                let names = policy.names();
                match (self.priority, policy.priority()) {
                    (None, Some(priority)) => {
                        let handle = self.with_priority(priority);
                        handle.decide(kind, pairs.into(), Some(&names)).await
                    }
                    _ => self.decide(kind, pairs.into(), Some(&names)).await,
                }
            }
            Err(e) => {
                let code = match e {
                    crate::key::KeyError::KeyTooLong { .. } => {
                        tollgate_protocol::ErrorCode::KeyTooLong
                    }
                    _ => tollgate_protocol::ErrorCode::Malformed,
                };
                let outcome = Outcome::Rejected(Rejection {
                    code,
                    error: Some(Error::Key(e)),
                });
                self.observe(&outcome, Instant::now());
                outcome
            }
        }
    }

    /// Like [`check`](Self::check), without charging anything.
    pub fn peek(
        &self,
        key: impl Into<Bytes>,
        limit: impl Into<LimitRef>,
        cost: u32,
    ) -> impl Future<Output = Outcome> + Send + '_ {
        self.single(BatchKind::Peek, key.into(), limit.into(), cost)
    }

    /// Like [`check_group`](Self::check_group), without charging anything.
    pub async fn peek_group(&self, pairs: Vec<Pair>) -> Outcome {
        self.decide(BatchKind::Peek, pairs.into(), None).await
    }

    /// Gives `amount` units of `key` back, e.g. the part of an up-front
    /// charge a request did not use (charged 4000 tokens, used 1200: refund
    /// 2800). `limit` must be the one the units were charged under (then
    /// `amount` 0 gives back a rule's default cost). Never fills beyond the
    /// limit. Returns the decision after the refund (always allowed;
    /// `remaining` updated). A per-check refusal (a concurrency limit, whose
    /// slots are given back with [`release`](Self::release), an unknown
    /// rule) is [`Error::Server`] with its code.
    pub async fn refund(
        &self,
        key: impl Into<Bytes>,
        limit: impl Into<LimitRef>,
        amount: u32,
    ) -> Result<Decision, Error> {
        self.refund_group(vec![Pair {
            key: key.into(),
            limit: limit.into(),
            cost: amount,
        }])
        .await
    }

    /// Refunds several pairs (each `cost` is the amount given back) as one
    /// atomic group; the keys must share a hash slot.
    pub async fn refund_group(&self, pairs: Vec<Pair>) -> Result<Decision, Error> {
        let kept: Kept = pairs.iter().cloned().collect();
        let deadline = Deadline::after(self.deadline);
        let answer = self
            .inner
            .route
            .checks(BatchKind::Refund, Checks::Group(pairs), deadline)
            .await?;
        match calls::results(answer, "REFUND")?.first() {
            Some(CheckResult::Decision(d)) => Ok(self.describe(d, &kept, None)),
            Some(CheckResult::Error(code)) => Err(Error::Server {
                code: *code,
                message: "refund refused".into(),
            }),
            None => Err(Error::ResultCount {
                expected: 1,
                got: 0,
            }),
        }
    }

    /// The one pipeline (see the module docs).
    ///
    /// An async block rather than an `async fn`, so the arguments are kept
    /// once in the future's state, not twice (captured, then as locals).
    #[allow(clippy::manual_async_fn)] // on purpose: see above
    fn decide<'a>(
        &'a self,
        kind: BatchKind,
        pairs: Kept,
        names: Option<&'a [Arc<str>]>,
    ) -> impl Future<Output = Outcome> + Send + 'a {
        async move {
            self.start_background();
            // The one clock read of a check: its deadline, its lease time,
            // its latency.
            let started = Instant::now();
            let deadline = Deadline {
                at: started + self.deadline,
                budget: self.deadline,
            };
            // A priority makes a CHECK a CHECK2, under a key of its own that
            // a resend after a lost connection reuses (calls.rs).
            let (kind, tag) = match (kind, self.priority) {
                (BatchKind::Check, Some(priority)) => {
                    let key = IdempotencyKey::from_u128(fastrand::u128(1..));
                    (BatchKind::Check2, Some(CheckTag::new(key, priority)))
                }
                _ => (kind, None),
            };
            // Before anything else: an invalid request is rejected whether
            // or not the server can be reached (no lease, no fallback).
            if let Err(error) = self.validate(&pairs) {
                let outcome = self.conclude(kind, Err(error), &pairs, names);
                self.observe(&outcome, started);
                return outcome;
            }
            if self.inner.leases.is_some() && kind == BatchKind::Check && pairs.len() == 1 {
                // Boxed: leasing is opt-in, its state need not weigh on every
                // check's future. Scoped, so its outcome is not kept across
                // the server call below.
                if let Some(outcome) = Box::pin(self.leased(&pairs, names, started, deadline)).await
                {
                    self.observe(&outcome, started);
                    return outcome;
                }
            }
            let checks = match (&pairs[..], tag) {
                (_, Some(tag)) => Checks::Tagged(tag, pairs.to_vec()),
                ([pair], None) => Checks::One(pair.clone()),
                (_, None) => Checks::Group(pairs.to_vec()),
            };
            let answer = self.inner.route.checks(kind, checks, deadline).await;
            let outcome = self.conclude(kind, one_result(kind, answer), &pairs, names);
            self.observe(&outcome, started);
            outcome
        }
    }

    /// What the server would refuse as invalid, found locally against its
    /// last announced limits, or before any handshake against what the
    /// protocol's fields allow (module `validity`): `Err` is a rejection.
    pub(super) fn validate(&self, pairs: &[Pair]) -> Result<(), Error> {
        let limits =
            (self.inner.route.announced_limits()).unwrap_or(crate::validity::PROTOCOL_BOUNDS);
        crate::validity::check_pairs(pairs, &limits)
    }

    pub(super) fn observe(&self, outcome: &Outcome, started: Instant) {
        if let Some(m) = &self.inner.metrics {
            m.observe(outcome, started.elapsed());
        }
    }

    /// The leasing path of a single-pair CHECK: spend leased tokens, or ask
    /// for `cost + lease` when the key is hot. `None` when the key is not
    /// leased (not a known token bucket, not hot).
    pub(super) async fn leased(
        &self,
        pairs: &Kept,
        names: Option<&[Arc<str>]>,
        now: Instant,
        deadline: Deadline,
    ) -> Option<Outcome> {
        let leases = self.inner.leases.as_ref()?;
        let pair = pairs.first()?;
        let limit = self.resolve(&pair.limit)?;
        let cost = self.effective_cost(pair);
        if let Some(mut d) = leases.spend(&pair.key, &limit, cost, now) {
            if let Some(m) = &self.inner.metrics {
                m.lease_tokens("spent", u64::from(cost));
            }
            d.binding = self.binding(0, &pair.limit, names);
            return Some(Outcome::Decided(d));
        }
        let size = leases.want(&pair.key, &limit, now)?;
        let leasing = Checks::One(Pair {
            cost: cost.saturating_add(size),
            ..pair.clone()
        });
        let result = self.one(BatchKind::Check, leasing, deadline).await;
        let result = match result {
            Ok(CheckResult::Decision(d)) if d.allowed => {
                let mut decision = self.describe(&d, pairs, names);
                leases.store(&pair.key, &limit, size, &decision, now);
                if let Some(m) = &self.inner.metrics {
                    m.lease_tokens("leased", u64::from(size));
                }
                self.start_refunds(leases);
                decision.remaining += u64::from(size);
                return Some(Outcome::Decided(decision));
            }
            Ok(CheckResult::Decision(_)) => {
                // Near the limit: ask for the plain cost, lease later.
                leases.cool(&pair.key, now);
                self.one(BatchKind::Check, Checks::One(pair.clone()), deadline)
                    .await
            }
            other => other,
        };
        Some(self.conclude(BatchKind::Check, result, pairs, names))
    }

    /// The outcome of a check's result: a decision, a rejection, or the
    /// fail mode's answer (the fallback's decision when it fails open).
    pub(super) fn conclude(
        &self,
        kind: BatchKind,
        result: Result<CheckResult, Error>,
        pairs: &[Pair],
        names: Option<&[Arc<str>]>,
    ) -> Outcome {
        let failure = match result {
            Ok(CheckResult::Decision(d)) => {
                return Outcome::Decided(self.describe(&d, pairs, names))
            }
            Ok(CheckResult::Error(code)) => Failure::from_code(code),
            Err(error) => {
                tracing::debug!(%error, "check undecided");
                Failure::from_error(&error)
            }
        };
        match failure {
            Failure::Rejected(r) => Outcome::Rejected(r),
            Failure::Undecided(why) => {
                let fail_mode = self.fail_mode_of(pairs);
                if fail_mode == FailMode::Open {
                    if let Some(decision) = self.fall_back(kind, pairs, names) {
                        return Outcome::Fallback { decision, why };
                    }
                }
                Outcome::Undecided { why, fail_mode }
            }
        }
    }

    /// One check through the shard: its result, or why there is none.
    async fn one(
        &self,
        kind: BatchKind,
        checks: Checks,
        deadline: Deadline,
    ) -> Result<CheckResult, Error> {
        one_result(kind, self.inner.route.checks(kind, checks, deadline).await)
    }

    /// The limit of a pair: inline, or the rule's from the rule table.
    fn resolve(&self, limit: &LimitRef) -> Option<Limit> {
        match limit {
            LimitRef::Inline(l) => Some(*l),
            LimitRef::Rule(name) => self.rule_limit(name),
        }
    }

    fn rule_limit(&self, name: &RuleName) -> Option<Limit> {
        self.inner.rules.load().get(name.as_str()).map(|r| r.limit)
    }

    /// The cost a pair takes (a rule's default cost for cost 0).
    fn effective_cost(&self, pair: &Pair) -> u32 {
        match (&pair.limit, pair.cost) {
            (LimitRef::Rule(name), 0) => self
                .inner
                .rules
                .load()
                .get(name.as_str())
                .map_or(1, |r| r.default_cost),
            (_, cost) => cost.max(1),
        }
    }

    fn binding(&self, index: usize, limit: &LimitRef, names: Option<&[Arc<str>]>) -> Binding {
        Binding::of(index, limit, names.and_then(|n| n.get(index)), |rule| {
            self.rule_limit(rule)
        })
    }

    /// A server decision, described with the pair it names.
    pub(super) fn describe(
        &self,
        wire: &WireDecision,
        pairs: &[Pair],
        names: Option<&[Arc<str>]>,
    ) -> Decision {
        let index = usize::from(wire.pair).min(pairs.len().saturating_sub(1));
        let binding = match pairs.get(index) {
            Some(p) => self.binding(index, &p.limit, names),
            None => self.binding(
                0,
                &LimitRef::Inline(Limit::token_bucket(
                    tollgate_protocol::units::Rate::per_second(1),
                    1,
                )),
                names,
            ),
        };
        Decision::from_wire(wire, binding)
    }

    /// The fail mode of an undecided check: this handle's, else the
    /// strictest of its rules' (closed if any is), else the config's.
    fn fail_mode_of(&self, pairs: &[Pair]) -> FailMode {
        if let Some(mode) = self.fail_mode {
            return mode;
        }
        let rules = self.inner.rules.load();
        let mut mode = None;
        for pair in pairs {
            if let LimitRef::Rule(name) = &pair.limit {
                match rules.get(name.as_str()).map(|r| r.failure_mode) {
                    Some(FailMode::Closed) => return FailMode::Closed,
                    Some(FailMode::Open) => mode = Some(FailMode::Open),
                    None => {}
                }
            }
        }
        let inline = pairs.iter().any(|p| matches!(p.limit, LimitRef::Inline(_)));
        match mode {
            Some(m) if !inline => m,
            _ => self.inner.config.fail_mode,
        }
    }

    /// The local fallback's decision, when there is a fallback and every
    /// pair's limit is known. Never for refunds.
    fn fall_back(
        &self,
        kind: BatchKind,
        pairs: &[Pair],
        names: Option<&[Arc<str>]>,
    ) -> Option<Decision> {
        let fallback = self.inner.fallback.as_ref()?;
        let limits: Option<SmallVec<[Limit; 2]>> =
            pairs.iter().map(|p| self.resolve(&p.limit)).collect();
        let limits = limits?;
        let costs: Kept = pairs
            .iter()
            .map(|p| Pair {
                cost: self.effective_cost(p),
                ..p.clone()
            })
            .collect();
        Some(fallback.decide(
            &costs,
            &limits,
            |i| self.binding(i, &pairs[i].limit, names),
            kind == BatchKind::Peek,
            Instant::now(),
        ))
    }
}
