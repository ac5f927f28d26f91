//! `ShouldRateLimit`: an Envoy request's domain and descriptors mapped
//! onto named rules and checked as CHECK frames are.
//!
//! ```text
//!  domain "edge", descriptor [(remote_address, 10.0.0.1), (path, /login)]
//!    rule:  "edge.remote_address.path:/login" if it exists (the last
//!           entry's value too), else "edge.remote_address.path"; none:
//!           OK with no limit (as Envoy's own service answers)
//!    key:   "edge|remote_address=10.0.0.1|path=/login"
//!    cost:  the descriptor's hits_addend, else the request's, else 1
//!    limit override (descriptor.limit): a fixed window of
//!           requests_per_unit per unit instead of the rule
//! ```
//!
//! Each descriptor is checked on its own (Envoy's service does the same:
//! an allowed descriptor is charged even when another is over its limit);
//! the overall code is OVER_LIMIT when any is. The response carries the
//! `x-ratelimit-limit`, `-remaining` and `-reset` headers of the matched
//! descriptor with the fewest units left, in the format Envoy's service
//! uses (`10, 10;w=60`, `3`, `42`).

use super::pb::envoy::config::core::v3::HeaderValue;
use super::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use super::pb::envoy::r#type::v3::RateLimitUnit;
use super::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit, Code, DescriptorStatus, RateLimit,
};
use super::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use super::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use super::route;
use crate::clock::Nanos;
use crate::engine::Mode;
use crate::node::Access;
use crate::rules::RuleSet;
use crate::server::Shared;
use bytes::Bytes;
use std::sync::Arc;
use tollgate_protocol::{Algorithm, CheckResult, Decision, Limit, LimitRef, Pair, RuleName};
use tonic::{Request, Response, Status};

/// The service, on the server's shared state, answering on `port`; it
/// reads messages of at most `max_message` bytes (a longer one is refused
/// from its length prefix, before its body is read).
pub(super) fn server(
    shared: Arc<Shared>,
    port: u16,
    max_message: usize,
) -> RateLimitServiceServer<Rls> {
    RateLimitServiceServer::new(Rls { shared, port }).max_decoding_message_size(max_message)
}

pub(super) struct Rls {
    shared: Arc<Shared>,
    /// This node's Envoy port (MOVED names the owner on it).
    port: u16,
}

/// Periods Envoy has a unit for, in milliseconds.
const UNITS: [(u64, Unit); 5] = [
    (1_000, Unit::Second),
    (60_000, Unit::Minute),
    (3_600_000, Unit::Hour),
    (86_400_000, Unit::Day),
    (604_800_000, Unit::Week),
];

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // The token was checked on the headers (gate.rs).
        let shared = &self.shared;
        let gate = shared
            .engine
            .node()
            .admit(Access::Write)
            .map_err(|r| route::refused(&r, self.port))?;
        let request = request.into_inner();
        let max = usize::from(shared.limits.max_batch);
        if request.domain.is_empty() {
            return Err(Status::invalid_argument("the domain is empty"));
        }
        if request.descriptors.len() > max {
            return Err(Status::invalid_argument(format!(
                "{} descriptors, at most {max} (max-batch)",
                request.descriptors.len()
            )));
        }
        // Every key is made and screened before any is charged: a call is
        // served whole here, or refused whole (route.rs).
        let max_key = usize::from(shared.limits.max_key_len);
        let keys = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| key_of(&request.domain, i, d, max_key))
            .collect::<Result<Vec<_>, _>>()?;
        route::screen(&gate, keys.iter().map(|k| k.as_bytes()), self.port)?;
        let rules = shared.engine.rules().current();
        let now = shared.engine.now();
        let call = Call {
            shared,
            rules: &rules,
            now,
            domain: &request.domain,
        };
        let mut statuses = Vec::with_capacity(request.descriptors.len());
        let mut tightest: Option<(Decision, u64)> = None;
        for (i, (descriptor, key)) in request.descriptors.iter().zip(keys).enumerate() {
            let cost = cost(descriptor, request.hits_addend);
            let Some((status, decision, period_ms)) = call.check(i, descriptor, key, cost)? else {
                statuses.push(DescriptorStatus {
                    code: Code::Ok.into(),
                    ..Default::default()
                });
                continue;
            };
            shared.metrics.frontends.envoy.count(Some(decision.allowed));
            if tightest.is_none_or(|(d, _)| decision.remaining < d.remaining) {
                tightest = Some((decision, period_ms));
            }
            statuses.push(status);
        }
        let over = statuses
            .iter()
            .any(|s| s.code == i32::from(Code::OverLimit));
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            statuses,
            response_headers_to_add: tightest.map(headers).unwrap_or_default(),
            ..Default::default()
        }))
    }
}

/// The key of descriptor `i`: the domain, then each entry as `|k=v`.
fn key_of(
    domain: &str,
    i: usize,
    descriptor: &RateLimitDescriptor,
    max_key: usize,
) -> Result<String, Status> {
    if descriptor.entries.is_empty() {
        return Err(Status::invalid_argument(format!(
            "descriptor {i} has no entries"
        )));
    }
    let mut key = domain.to_owned();
    for e in &descriptor.entries {
        key.push_str(&format!("|{}={}", e.key, e.value));
    }
    if key.len() > max_key {
        return Err(Status::invalid_argument(format!(
            "descriptor {i}: its key of {} bytes is longer than max-key-len ({max_key})",
            key.len()
        )));
    }
    Ok(key)
}

/// Units a descriptor takes: its own hits_addend, else the request's,
/// else 1 (Envoy sends 0 for "one hit"); at most u32::MAX.
fn cost(descriptor: &RateLimitDescriptor, request: u32) -> u32 {
    let hits = descriptor.hits_addend.unwrap_or(u64::from(request));
    u32::try_from(hits.max(1)).unwrap_or(u32::MAX)
}

/// What every descriptor of one call sees.
struct Call<'a> {
    shared: &'a Shared,
    rules: &'a RuleSet,
    now: Nanos,
    domain: &'a str,
}

impl Call<'_> {
    /// Checks descriptor `i`: None when no rule (and no override) applies;
    /// else its status, the decision and the limit's period.
    fn check(
        &self,
        i: usize,
        descriptor: &RateLimitDescriptor,
        key: String,
        cost: u32,
    ) -> Result<Option<(DescriptorStatus, Decision, u64)>, Status> {
        let (name, limit) = match self.limit_of(descriptor) {
            Some(found) => found,
            None => return Ok(None),
        };
        let pair = Pair {
            key: Bytes::from(key),
            limit: match &limit {
                Target::Rule(rule) => LimitRef::Rule(rule.clone()),
                Target::Inline(l) => LimitRef::Inline(*l),
            },
            cost,
        };
        let d = match self
            .shared
            .engine
            .check_one(self.rules, self.now, &[pair], Mode::Charge)
        {
            CheckResult::Decision(d) => d,
            CheckResult::Error(code) => {
                self.shared.metrics.frontends.envoy.count(None);
                return Err(Status::failed_precondition(format!(
                    "descriptor {i} ({name}): {code}"
                )));
            }
        };
        let wire = match &limit {
            Target::Rule(rule) => self.rules.get(rule.as_bytes()).map(|r| r.limit),
            Target::Inline(l) => Some(*l),
        };
        let (count, period_ms) = wire.map_or((d.limit, 0), |l| (l.count, l.period_ms));
        let (per_unit, unit) = UNITS
            .iter()
            .find(|(ms, _)| *ms == period_ms)
            .map_or((d.limit, Unit::Unknown), |(_, unit)| (count, *unit));
        let status = DescriptorStatus {
            code: if d.allowed { Code::Ok } else { Code::OverLimit }.into(),
            current_limit: Some(RateLimit {
                name,
                requests_per_unit: clamp(per_unit),
                unit: unit.into(),
            }),
            limit_remaining: clamp(d.remaining),
            duration_until_reset: Some(duration_ms(d.reset_after_ms)),
            quota: None,
        };
        Ok(Some((status, d, period_ms)))
    }

    /// The limit of a descriptor: its override, else the most specific
    /// rule its domain and entries name.
    fn limit_of(&self, descriptor: &RateLimitDescriptor) -> Option<(String, Target)> {
        if let Some(o) = &descriptor.limit {
            let period_ms = unit_ms(o.unit())?;
            let limit = Limit {
                algorithm: Algorithm::FixedWindow,
                count: u64::from(o.requests_per_unit),
                period_ms,
                burst: 0,
            };
            return (o.requests_per_unit > 0)
                .then(|| ("override".to_owned(), Target::Inline(limit)));
        }
        let mut general = self.domain.to_owned();
        for e in &descriptor.entries {
            general.push('.');
            general.push_str(&e.key);
        }
        let last = descriptor.entries.last()?;
        let specific = format!("{general}:{}", last.value);
        [specific, general].into_iter().find_map(|name| {
            self.rules.get(name.as_bytes())?;
            let rule = RuleName::try_from(name.as_str()).ok()?;
            Some((name, Target::Rule(rule)))
        })
    }
}

/// What a descriptor is checked against.
enum Target {
    Rule(RuleName),
    Inline(Limit),
}

/// The period of an override's unit (None: UNKNOWN).
fn unit_ms(unit: RateLimitUnit) -> Option<u64> {
    Some(match unit {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => 1_000,
        RateLimitUnit::Minute => 60_000,
        RateLimitUnit::Hour => 3_600_000,
        RateLimitUnit::Day => 86_400_000,
        RateLimitUnit::Week => 604_800_000,
        RateLimitUnit::Month => 30 * 86_400_000,
        RateLimitUnit::Year => 365 * 86_400_000,
    })
}

fn clamp(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn duration_ms(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The `x-ratelimit-*` headers of the tightest descriptor.
fn headers((d, period_ms): (Decision, u64)) -> Vec<HeaderValue> {
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        raw_value: Vec::new(),
    };
    let window = period_ms.div_ceil(1000);
    vec![
        header(
            "x-ratelimit-limit",
            format!("{}, {};w={window}", d.limit, d.limit),
        ),
        header("x-ratelimit-remaining", d.remaining.to_string()),
        header(
            "x-ratelimit-reset",
            d.reset_after_ms.div_ceil(1000).to_string(),
        ),
    ]
}
