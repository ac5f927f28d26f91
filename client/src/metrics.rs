//! The client's Prometheus metrics, on a registry the application injects
//! ([`ClientConfig::metrics`](crate::ClientConfig::metrics)). Every name is
//! prefixed `tollgate_client_`; the client's name is a constant label, so
//! several clients can share one registry. No label takes a per-key value.
//!
//! | metric | labels |
//! |---|---|
//! | `tollgate_client_decisions_total` | `decision` (`allowed`, `denied`), `source` (`server`, `lease`, `fallback`) |
//! | `tollgate_client_undecided_total` | `reason` (`deadline`, `unavailable`, `breaker_open`, `connection_lost`, `overloaded`, `server_error`, `protocol`), `fail_mode` |
//! | `tollgate_client_rejected_total` | `code` (`CrossSlot`, `KeyTooLong`, ...) |
//! | `tollgate_client_check_duration_seconds` | histogram of a check's time in the client, fast-failed and leased ones included |
//! | `tollgate_client_breaker_open` | `node`: 1 while the node's breaker is open or half-open |
//! | `tollgate_client_breaker_transitions_total` | `node`, `to` (`open`, `half_open`, `closed`) |
//! | `tollgate_client_lease_tokens_total` | `event` (`leased`, `spent`, `refunded`) |
//!
//! Decision counters are resolved once, so counting a check is one atomic
//! add plus one histogram observation.

use std::time::Duration;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

use crate::breaker::BreakerState;
use crate::decision::Source;
use crate::outcome::Outcome;

pub(crate) struct Metrics {
    /// `[allowed, denied] x [server, lease, fallback]`.
    decisions: [[IntCounter; 3]; 2],
    undecided: IntCounterVec,
    rejected: IntCounterVec,
    latency: Histogram,
    breaker_open: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    lease_tokens: IntCounterVec,
}

fn opts(name: &str, help: &str, client: &str) -> Opts {
    Opts::new(name, help).const_label("client", client)
}

impl Metrics {
    /// Registers the metrics in `registry`; fails on a name clash (another
    /// client with the same `client_name` on the same registry).
    pub(crate) fn register(registry: &Registry, client: &str) -> prometheus::Result<Self> {
        let decisions_vec = IntCounterVec::new(
            opts(
                "tollgate_client_decisions_total",
                "Checks decided, by decision and by where they were decided",
                client,
            ),
            &["decision", "source"],
        )?;
        let undecided = IntCounterVec::new(
            opts("tollgate_client_undecided_total", "Checks the server could not decide and no fallback decided, by reason and fail mode", client),
            &["reason", "fail_mode"],
        )?;
        let rejected = IntCounterVec::new(
            opts(
                "tollgate_client_rejected_total",
                "Checks refused as invalid (never allowed), by error code",
                client,
            ),
            &["code"],
        )?;
        let latency = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_client_check_duration_seconds",
                "Time a check spends in the client",
            )
            .const_label("client", client)
            .buckets(vec![
                0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005,
                0.01, 0.025, 0.1,
            ]),
        )?;
        let breaker_open = IntGaugeVec::new(
            opts(
                "tollgate_client_breaker_open",
                "1 while the node's circuit breaker is open or half-open",
                client,
            ),
            &["node"],
        )?;
        let breaker_transitions = IntCounterVec::new(
            opts(
                "tollgate_client_breaker_transitions_total",
                "Circuit breaker state changes",
                client,
            ),
            &["node", "to"],
        )?;
        let lease_tokens = IntCounterVec::new(
            opts(
                "tollgate_client_lease_tokens_total",
                "Tokens leased from the server, spent locally, and refunded",
                client,
            ),
            &["event"],
        )?;
        registry.register(Box::new(decisions_vec.clone()))?;
        registry.register(Box::new(undecided.clone()))?;
        registry.register(Box::new(rejected.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(breaker_open.clone()))?;
        registry.register(Box::new(breaker_transitions.clone()))?;
        registry.register(Box::new(lease_tokens.clone()))?;
        let by_source = |decision: &str| {
            [Source::Server, Source::Lease, Source::Fallback]
                .map(|s| decisions_vec.with_label_values(&[decision, s.name()]))
        };
        Ok(Self {
            decisions: [by_source("allowed"), by_source("denied")],
            undecided,
            rejected,
            latency,
            breaker_open,
            breaker_transitions,
            lease_tokens,
        })
    }

    pub(crate) fn observe(&self, outcome: &Outcome, elapsed: Duration) {
        self.latency.observe(elapsed.as_secs_f64());
        match outcome {
            Outcome::Decided(d) | Outcome::Fallback { decision: d, .. } => {
                let source = match d.source {
                    Source::Server => 0,
                    Source::Lease => 1,
                    Source::Fallback => 2,
                };
                self.decisions[usize::from(!d.allowed)][source].inc();
            }
            Outcome::Undecided { why, fail_mode } => self
                .undecided
                .with_label_values(&[why.label(), fail_mode.name()])
                .inc(),
            Outcome::Rejected(r) => self.rejected.with_label_values(&[r.code.name()]).inc(),
        }
    }

    pub(crate) fn breaker_transition(&self, node: &str, to: BreakerState) {
        let (label, open) = match to {
            BreakerState::Open => ("open", 1),
            BreakerState::HalfOpen => ("half_open", 1),
            BreakerState::Closed => ("closed", 0),
        };
        self.breaker_open.with_label_values(&[node]).set(open);
        self.breaker_transitions
            .with_label_values(&[node, label])
            .inc();
    }

    pub(crate) fn lease_tokens(&self, event: &str, tokens: u64) {
        self.lease_tokens.with_label_values(&[event]).inc_by(tokens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_a_second_client_needs_its_own_name() {
        let registry = Registry::new();
        let _a = Metrics::register(&registry, "gw-a").expect("first");
        let _b = Metrics::register(&registry, "gw-b").expect("another name");
        assert!(
            Metrics::register(&registry, "gw-a").is_err(),
            "same name twice"
        );
        let families = registry.gather();
        let mut names: Vec<_> = families.iter().map(|f| f.name().to_owned()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), families.len());
    }
}
