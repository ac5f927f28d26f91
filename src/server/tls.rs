//! Certificate reloads: on SIGHUP (the CLI calls [`TlsReloader::reload`])
//! and when a TLS file changes on disk ([`TlsReloader::watch`]). A reload
//! that fails keeps the certificate in force, logs why and counts it
//! (`tollgate_tls_reloads_total{source, outcome}`); open connections are
//! never touched, only new handshakes see the new files.

use crate::tls::{Tls, TlsError};
use prometheus::{IntCounterVec, Opts, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsReloadSource {
    FileChange,
    Signal,
}

impl TlsReloadSource {
    fn name(self) -> &'static str {
        match self {
            Self::FileChange => "file-change",
            Self::Signal => "signal",
        }
    }
}

/// Reloads a server's certificates and counts the outcomes.
#[derive(Debug, Clone)]
pub struct TlsReloader {
    tls: Arc<Tls>,
    reloads: IntCounterVec,
}

impl TlsReloader {
    pub(super) fn register(tls: Arc<Tls>, registry: &Registry) -> prometheus::Result<Self> {
        let reloads = IntCounterVec::new(
            Opts::new(
                "tollgate_tls_reloads_total",
                "Reloads of the TLS certificate, key and CAs, by source and outcome.",
            ),
            &["source", "outcome"],
        )?;
        registry.register(Box::new(reloads.clone()))?;
        Ok(Self { tls, reloads })
    }

    /// Reads the files again; new handshakes use them. On an error the
    /// certificate in force stays.
    pub fn reload(&self, source: TlsReloadSource) -> Result<(), TlsError> {
        let result = self.tls.reload();
        let outcome = match &result {
            Ok(()) => {
                tracing::info!(source = source.name(), cert = %self.tls.paths().cert.display(), "TLS certificate reloaded");
                "ok"
            }
            Err(e) => {
                tracing::error!(source = source.name(), error = %e, "TLS reload failed; the certificate in force stays");
                "error"
            }
        };
        self.reloads
            .with_label_values(&[source.name(), outcome])
            .inc();
        result
    }

    /// Reloads whenever a file changes (checked every `poll`), until `stop`.
    pub(super) async fn watch(self, poll: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(poll);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if self.tls.changed_on_disk() {
                // A certificate and its key are often written one after
                // the other: a pair caught in between fails, and the
                // second write is a change of its own that loads the pair.
                let _ = self.reload(TlsReloadSource::FileChange);
            }
        }
    }
}
