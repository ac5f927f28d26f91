//! What the check path counts: decisions by rule, frame latency and batch
//! size, errors answered by code; and the per-frame tally of inline decisions, added to the shared
//! counters once per frame.

use crate::events::Outcome;
use crate::rules::spec::INLINE_LABEL;
use crate::rules::DecisionCounters;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry,
};
use std::cell::Cell;
use tollgate_protocol::ErrorCode;

/// What the check path counts.
#[derive(Debug, Clone)]
pub(crate) struct CheckMetrics {
    /// `tollgate_checks_total{rule, decision}`; rules take their handles
    /// from it when they are loaded.
    pub checks: IntCounterVec,
    /// Handles of checks decided by inline limits.
    inline: DecisionCounters,
    pub(super) latency: Histogram,
    pub(super) batch_size: Histogram,
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
                "Time to evaluate one CHECK, CHECK2 or PEEK frame, all its checks.",
            )
            .buckets(exponential_buckets(1e-6, 4.0, 10)?),
        )?;
        let batch_size = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_check_batch_size",
                "Checks in one CHECK, CHECK2 or PEEK frame.",
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

impl CheckMetrics {
    /// The decision counts of checks decided by inline limits.
    pub fn inline(&self) -> &DecisionCounters {
        &self.inline
    }
}

/// Errors answered, by code: every ERROR frame and every per-check error
/// (`tollgate_protocol_errors_total{code}`). One pre-resolved handle per
/// known code, indexed by wire value, so counting is one atomic add.
#[derive(Debug, Clone)]
pub(crate) struct ErrorCounters {
    by_wire: Vec<IntCounter>,
    unknown: IntCounter,
}

impl ErrorCounters {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let vec = IntCounterVec::new(
            Opts::new(
                "tollgate_protocol_errors_total",
                "Errors answered (ERROR frames and per-check errors), by code.",
            ),
            &["code"],
        )?;
        registry.register(Box::new(vec.clone()))?;
        let by_wire = ErrorCode::KNOWN
            .iter()
            .map(|c| vec.with_label_values(&[c.name()]))
            .collect();
        let unknown = vec.with_label_values(&["Unknown"]);
        Ok(Self { by_wire, unknown })
    }

    pub fn count(&self, code: ErrorCode) {
        let i = usize::from(code.to_wire()).wrapping_sub(1);
        self.by_wire.get(i).unwrap_or(&self.unknown).inc();
    }
}

/// Decisions counted by a frame, not yet added to the shared counters.
#[derive(Default)]
pub(super) struct Tally {
    allowed: Cell<u64>,
    denied: Cell<u64>,
    shadow_denied: Cell<u64>,
}

impl Tally {
    /// Counts one decision: on its rule's counter at once, or in the tally
    /// when an inline limit decided (`rule` None). A refused check is not
    /// a decision (errors are counted apart): nothing is counted.
    pub(super) fn count(&self, rule: Option<&DecisionCounters>, outcome: Outcome) {
        let (tallied, counter) = match outcome {
            Outcome::Allowed => (&self.allowed, rule.map(|c| &c.allowed)),
            Outcome::Denied => (&self.denied, rule.map(|c| &c.denied)),
            Outcome::ShadowDenied => (&self.shadow_denied, rule.map(|c| &c.shadow_denied)),
            Outcome::Refused => return,
        };
        match counter {
            Some(counter) => counter.inc(),
            None => tallied.set(tallied.get() + 1),
        }
    }

    pub(super) fn add_to(&self, counters: &DecisionCounters) {
        for (count, counter) in [
            (&self.allowed, &counters.allowed),
            (&self.denied, &counters.denied),
            (&self.shadow_denied, &counters.shadow_denied),
        ] {
            if count.get() > 0 {
                counter.inc_by(count.get());
            }
        }
    }
}
