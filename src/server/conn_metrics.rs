//! The metric handles of the protocol port's connections: connections
//! open and accepted, failed TLS handshakes (errors answered are counted
//! by the engine's `ErrorCounters`).

use prometheus::{IntCounter, IntGauge, Registry};

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
