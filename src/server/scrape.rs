//! What `/metrics` computes when it is scraped, beyond the node's own
//! gauges: the most throttled keys, as `tollgate_throttled_key_denials`,
//! and which global rules are capped at this region's ceiling, as
//! `tollgate_region_rule_capped`.
//!
//! Invariants: each vector is cleared before it is filled, so a series
//! exists only for what is there at scrape time (a rule removed by a
//! reload loses its series). The throttled keys' series are the top `--throttled-metric-keys` keys of the
//! throttled-keys sketch at scrape time and no others (the vector is
//! cleared first), so the metric's cardinality is bounded by the setting
//! whatever keys clients send. Keys that are not UTF-8 are labelled with
//! `\xNN` escapes.

use super::Shared;
use prometheus::{IntGaugeVec, Opts, Registry};

/// `tollgate_region_rule_capped{rule}`, refreshed on scrape: 1 while a
/// global rule shared in this region is capped at the region's ceiling, 0
/// otherwise; no series for rules that are regional here.
pub(crate) struct CappedRulesMetric {
    gauge: IntGaugeVec,
}

impl CappedRulesMetric {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "tollgate_region_rule_capped",
                "1 while a global rule shared in this region is capped at the region's \
                 ceiling (the exchange stalled with a majority of the peers it lists, or \
                 any under --region-cut-off any), else 0; by rule.",
            ),
            &["rule"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        Ok(Self { gauge })
    }

    /// Replaces the series with the global rules in force now.
    pub fn refresh(&self, shared: &Shared) {
        self.gauge.reset();
        for state in shared.engine.global_rules() {
            if state.shared {
                let series = self.gauge.with_label_values(&[state.rule.as_str()]);
                series.set(i64::from(state.capped));
            }
        }
    }
}

/// `tollgate_throttled_key_denials{key}`, refreshed on scrape.
pub(crate) struct ThrottledKeysMetric {
    gauge: IntGaugeVec,
    /// `--throttled-metric-keys` (0: the metric has no series).
    top: usize,
}

impl ThrottledKeysMetric {
    pub fn register(registry: &Registry, top: usize) -> prometheus::Result<Self> {
        let gauge = IntGaugeVec::new(
            Opts::new(
                "tollgate_throttled_key_denials",
                "Denials of the most throttled keys over the last one to two \
                 --throttled-window (the top --throttled-metric-keys of GET /v1/throttled).",
            ),
            &["key"],
        )?;
        registry.register(Box::new(gauge.clone()))?;
        Ok(Self { gauge, top })
    }

    /// Replaces the series with the current top keys.
    pub fn refresh(&self, shared: &Shared) {
        self.gauge.reset();
        if self.top == 0 {
            return;
        }
        let sketch = shared.engine.throttled();
        for t in sketch.top(self.top.min(sketch.capacity()), shared.engine.now()) {
            let key = match std::str::from_utf8(&t.key) {
                Ok(s) => s.to_owned(),
                Err(_) => t.key.escape_ascii().to_string(),
            };
            self.gauge
                .with_label_values(&[key.as_str()])
                .set(i64::try_from(t.denied).unwrap_or(i64::MAX));
        }
    }
}
