//! The metric handles of the protocol port's connections: errors answered
//! by code, connections open and accepted, failed TLS handshakes.

use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use tollgate_protocol::ErrorCode;

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

/// Connections served now and accepted in all.
#[derive(Debug, Clone)]
pub(crate) struct ConnMetrics {
    pub open: IntGauge,
    pub accepted: IntCounter,
    /// TLS handshakes that failed (`tollgate_tls_handshake_failures_total`).
    pub tls_failures: IntCounter,
}

impl ConnMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let open = IntGauge::new("tollgate_connections", "Client connections open now.")?;
        let accepted = IntCounter::new(
            "tollgate_connections_accepted_total",
            "Client connections accepted since the start.",
        )?;
        let tls_failures = IntCounter::new(
            "tollgate_tls_handshake_failures_total",
            "TLS handshakes on the protocol port that failed or timed out \
             (no certificate under mTLS, an untrusted one, not TLS at all).",
        )?;
        registry.register(Box::new(open.clone()))?;
        registry.register(Box::new(accepted.clone()))?;
        registry.register(Box::new(tls_failures.clone()))?;
        Ok(Self {
            open,
            accepted,
            tls_failures,
        })
    }
}

/// Keeps `tollgate_connections` right however a connection task ends.
pub(crate) struct OpenConnection(IntGauge);

impl OpenConnection {
    pub fn new(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}
