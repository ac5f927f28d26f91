//! What `/metrics` computes when it is scraped, beyond the node's own
//! gauges: the most throttled keys, as `tollgate_throttled_key_denials`.
//!
//! Invariant: the series are the top `--throttled-metric-keys` keys of the
//! throttled-keys sketch at scrape time and no others (the vector is
//! cleared first), so the metric's cardinality is bounded by the setting
//! whatever keys clients send. Keys that are not UTF-8 are labelled with
//! `\xNN` escapes.

use super::Shared;
use prometheus::{IntGaugeVec, Opts, Registry};

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
