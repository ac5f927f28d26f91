//! A decision as a gateway uses it: the numbers of the HTTP rate-limit
//! headers, with `Option` where the wire has a sentinel and the binding
//! limit named rather than indexed.
//!
//! Built from the wire's [`tollgate_protocol::Decision`] and what the caller
//! sent (the group's pairs), or by the local fallback and lease limiters.
//! Invariants: `retry_after` is `Some(ZERO)` when allowed and `None` only
//! when the request can never pass; `reset_after <= full_after`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_protocol::{Algorithm, Limit, LimitRef, RuleName, RETRY_NEVER};

/// Where a decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The server decided (one round trip).
    Server,
    /// Tokens leased earlier from the server were spent locally.
    Lease,
    /// The local fallback limiter decided while the server could not.
    Fallback,
}

impl Source {
    /// The metric label: `server`, `lease`, `fallback`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Lease => "lease",
            Self::Fallback => "fallback",
        }
    }
}

/// How the limit a decision describes is named.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitName {
    /// A rule configured on the server.
    Rule(RuleName),
    /// A name the caller gave the limit (a [`Policy`](crate::Policy) limit).
    Named(Arc<str>),
    /// An inline limit the caller did not name.
    Inline,
}

impl fmt::Display for LimitName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rule(name) => f.write_str(name.as_str()),
            Self::Named(name) => f.write_str(name),
            Self::Inline => f.write_str("inline"),
        }
    }
}

/// The limit a decision describes: for a group, the binding pair (the one
/// with the least remaining when allowed; the denying one with the longest
/// retry-after when denied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Position of the pair in the check (0 for a single check).
    pub index: usize,
    pub name: LimitName,
    /// The limit's numbers: inline, or the rule's from the rule table
    /// (`None` for a rule the client has not fetched).
    pub limit: Option<Limit>,
}

impl Binding {
    /// The binding of `limit` at `index`, named `name` when the caller gave
    /// one; rules resolve their numbers through `resolve`.
    pub(crate) fn of(
        index: usize,
        limit: &LimitRef,
        name: Option<&Arc<str>>,
        resolve: impl FnOnce(&RuleName) -> Option<Limit>,
    ) -> Self {
        let (default_name, numbers) = match limit {
            LimitRef::Inline(l) => (LimitName::Inline, Some(*l)),
            LimitRef::Rule(rule) => (LimitName::Rule(rule.clone()), resolve(rule)),
        };
        Self {
            index,
            name: name.map_or(default_name, |n| LimitName::Named(Arc::clone(n))),
            limit: numbers,
        }
    }
}

/// A rate-limit decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Let the request through.
    pub allowed: bool,
    /// Allowed only because the denying rule is in shadow mode; the other
    /// fields describe that would-be denial.
    pub shadow_denied: bool,
    pub source: Source,
    /// The limit these numbers belong to.
    pub binding: Binding,
    /// Its capacity (`burst` of a bucket, `count` of a window): the
    /// `X-RateLimit-Limit` header.
    pub limit: u64,
    /// Units still available after this request: `X-RateLimit-Remaining`.
    pub remaining: u64,
    /// When the limit frees quota again: the end of the current window for
    /// the window algorithms, the time until the bucket is full for the
    /// buckets: `X-RateLimit-Reset` (a 100/min window says at most 60 s).
    pub reset_after: Duration,
    /// Until the limit's state is entirely back to full if nothing more is
    /// taken (for a sliding window up to two windows).
    pub full_after: Duration,
    /// When denied, the wait until the same request could pass (`None`:
    /// never, e.g. a cost above the capacity); zero when allowed:
    /// `Retry-After`.
    pub retry_after: Option<Duration>,
    /// The concurrency lease an allowed check acquired, to
    /// [`release`](crate::Client::release) when the work is done.
    pub lease: Option<u64>,
}

impl Decision {
    /// The decision the server sent, described with the binding limit.
    pub(crate) fn from_wire(wire: &tollgate_protocol::Decision, binding: Binding) -> Self {
        let full_after = Duration::from_millis(wire.reset_after_ms);
        let reset_after = window_reset(binding.limit.as_ref(), wire.reset_after_ms);
        Self {
            allowed: wire.allowed,
            shadow_denied: wire.shadow_denied,
            source: Source::Server,
            binding,
            limit: wire.limit,
            remaining: wire.remaining,
            reset_after,
            full_after,
            retry_after: match wire.retry_after_ms {
                RETRY_NEVER => None,
                ms => Some(Duration::from_millis(ms)),
            },
            lease: wire.lease,
        }
    }

    /// Seconds to put in `Retry-After` (rounded up, at least 1 when
    /// denied); `None` when allowed or when the request can never pass.
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.allowed {
            return None;
        }
        self.retry_after.map(|d| ceil_secs(d).max(1))
    }

    /// Seconds to put in `X-RateLimit-Reset` / `RateLimit`'s `t` (rounded
    /// up).
    pub fn reset_secs(&self) -> u64 {
        ceil_secs(self.reset_after)
    }
}

/// Whole seconds of `d`, rounded up (what HTTP headers carry).
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The time until the binding limit frees quota, from the wire's "until
/// full" (`reset_after_ms`). For a sliding window, the wire's value is
/// `period_ms` plus the time to the end of the current window whenever the
/// current window holds units, and at most `period_ms` otherwise
/// (PROTOCOL.md §8, Decision fields); the end of the current window is when
/// quota starts coming back. Every other algorithm frees quota on the way
/// to full, and reports at most one period anyway.
fn window_reset(limit: Option<&Limit>, reset_after_ms: u64) -> Duration {
    let ms = match limit {
        Some(l) if l.algorithm == Algorithm::SlidingWindow && reset_after_ms > l.period_ms => {
            reset_after_ms - l.period_ms
        }
        _ => reset_after_ms,
    };
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::units::Rate;

    use super::*;

    fn wire(
        allowed: bool,
        reset_after_ms: u64,
        retry_after_ms: u64,
    ) -> tollgate_protocol::Decision {
        tollgate_protocol::Decision {
            allowed,
            shadow_denied: false,
            pair: 0,
            limit: 100,
            remaining: 0,
            reset_after_ms,
            retry_after_ms,
            lease: None,
        }
    }

    fn binding(limit: Limit) -> Binding {
        Binding::of(0, &LimitRef::Inline(limit), None, |_| None)
    }

    #[test]
    fn a_sliding_window_resets_at_the_end_of_its_window() {
        let minute = Limit::sliding_window(Rate::per_minute(100));
        // Current window holds units: the wire says until full (one window
        // plus the rest of this one); the reset is the rest of this one.
        let d = Decision::from_wire(&wire(false, 104_000, 3_000), binding(minute));
        assert_eq!(d.reset_after, Duration::from_secs(44));
        assert_eq!(d.full_after, Duration::from_secs(104));
        assert_eq!(d.reset_secs(), 44);
        // Only the previous window holds units: already within one window.
        let d = Decision::from_wire(&wire(true, 20_000, 0), binding(minute));
        assert_eq!(d.reset_after, Duration::from_secs(20));
        assert_eq!(d.retry_after, Some(Duration::ZERO));
        assert_eq!(d.retry_after_secs(), None);
    }

    #[test]
    fn never_is_none_and_retry_rounds_up() {
        let bucket = Limit::token_bucket(Rate::per_second(5), 10);
        let d = Decision::from_wire(&wire(false, 2_000, RETRY_NEVER), binding(bucket));
        assert_eq!(d.retry_after, None);
        assert_eq!(d.retry_after_secs(), None);
        assert_eq!(d.reset_after, Duration::from_secs(2));
        let d = Decision::from_wire(&wire(false, 2_000, 200), binding(bucket));
        assert_eq!(d.retry_after_secs(), Some(1));
        assert_eq!(d.binding.name, LimitName::Inline);
        assert_eq!(d.binding.limit, Some(bucket));
    }

    #[test]
    fn rules_and_policies_name_the_binding_limit() {
        let rule = RuleName::from_static("login");
        let b = Binding::of(1, &LimitRef::Rule(rule.clone()), None, |_| None);
        assert_eq!(b.name.to_string(), "login");
        assert_eq!((b.index, b.limit), (1, None));
        let name: Arc<str> = Arc::from("per-day");
        let b = Binding::of(0, &LimitRef::Rule(rule), Some(&name), |_| None);
        assert_eq!(b.name.to_string(), "per-day");
    }
}
