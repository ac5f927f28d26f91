//! The rate-limit headers of a decision.
//!
//! - `X-RateLimit-Limit`: the binding limit's capacity;
//! - `X-RateLimit-Remaining`: units left after this request;
//! - `X-RateLimit-Reset`: seconds (rounded up) until the binding limit
//!   frees quota: the end of the current window for windows, until the
//!   bucket is full for buckets (never "until two windows have passed");
//! - `Retry-After` (429 only): seconds until the same request could pass,
//!   at least 1; omitted when it never can (a cost above the capacity);
//! - `RateLimit-Policy` (IETF draft-ietf-httpapi-ratelimit-headers): one
//!   item per limit of the policy whose numbers are known,
//!   `"name";q=CAPACITY;w=WINDOW_SECONDS`;
//! - `RateLimit`: the binding limit, `"name";r=REMAINING;t=RESET_SECONDS`.

use http::{HeaderMap, HeaderName, HeaderValue};
use tollgate_client::decision::ceil_secs;
use tollgate_client::{Decision, Policy};

pub const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

fn number(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

/// Adds the headers of `decision`, made under `policy`, to `headers`.
pub fn insert(headers: &mut HeaderMap, decision: &Decision, policy: &Policy) {
    headers.insert(X_RATELIMIT_LIMIT, number(decision.limit));
    headers.insert(X_RATELIMIT_REMAINING, number(decision.remaining));
    headers.insert(X_RATELIMIT_RESET, number(decision.reset_secs()));
    if let Some(value) = policy_field(decision, policy) {
        headers.insert(RATELIMIT_POLICY, value);
    }
    let binding = format!(
        "\"{}\";r={};t={}",
        decision.binding.name,
        decision.remaining,
        decision.reset_secs()
    );
    if let Ok(value) = HeaderValue::try_from(binding) {
        headers.insert(RATELIMIT, value);
    }
    if !decision.allowed {
        if let Some(secs) = decision.retry_after_secs() {
            headers.insert(http::header::RETRY_AFTER, number(secs));
        }
    }
}

/// `RateLimit-Policy`: every limit of the policy with known numbers (a
/// rule the client has no table for is left out); the binding limit's own
/// numbers otherwise.
fn policy_field(decision: &Decision, policy: &Policy) -> Option<HeaderValue> {
    let mut items = Vec::new();
    for (i, l) in policy.limits().iter().enumerate() {
        let numbers = match &l.limit {
            tollgate_client::LimitRef::Inline(limit) => Some(*limit),
            tollgate_client::LimitRef::Rule(_) if i == decision.binding.index => {
                decision.binding.limit
            }
            tollgate_client::LimitRef::Rule(_) => None,
        };
        if let Some(limit) = numbers {
            items.push(format!(
                "\"{}\";q={};w={}",
                l.name,
                limit.capacity(),
                ceil_secs(limit.window()).max(1)
            ));
        }
    }
    if items.is_empty() {
        return None;
    }
    HeaderValue::try_from(items.join(", ")).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_client::{Limit, Rate};

    use super::*;

    #[test]
    fn headers_of_a_denial() {
        let policy = Policy::new("search")
            .unwrap()
            .limit("per-second", Limit::token_bucket(Rate::per_second(10), 20))
            .unwrap()
            .limit("per-day", Limit::fixed_window(Rate::per_day(1000)))
            .unwrap();
        let decision = tollgate_client::Decision {
            allowed: false,
            shadow_denied: false,
            source: tollgate_client::Source::Server,
            binding: tollgate_client::Binding {
                index: 1,
                name: tollgate_client::LimitName::Named("per-day".into()),
                limit: Some(Limit::fixed_window(Rate::per_day(1000))),
            },
            limit: 1000,
            remaining: 0,
            reset_after: Duration::from_millis(3_599_001),
            full_after: Duration::from_millis(3_599_001),
            retry_after: Some(Duration::from_millis(3_599_001)),
            lease: None,
        };
        let mut h = HeaderMap::new();
        insert(&mut h, &decision, &policy);
        assert_eq!(h[X_RATELIMIT_LIMIT], "1000");
        assert_eq!(h[X_RATELIMIT_REMAINING], "0");
        assert_eq!(h[X_RATELIMIT_RESET], "3600");
        assert_eq!(h[http::header::RETRY_AFTER], "3600");
        assert_eq!(h[RATELIMIT], "\"per-day\";r=0;t=3600");
        assert_eq!(
            h[RATELIMIT_POLICY],
            "\"per-second\";q=20;w=2, \"per-day\";q=1000;w=86400"
        );
        // Never: no Retry-After.
        let never = tollgate_client::Decision {
            retry_after: None,
            ..decision
        };
        let mut h = HeaderMap::new();
        insert(&mut h, &never, &policy);
        assert!(h.get(http::header::RETRY_AFTER).is_none());
    }
}
