//! Signals of `tollgate serve`: SIGINT and SIGTERM start the drain, SIGHUP
//! reloads the rules file and the TLS certificates.

use crate::rules::{ReloadSource, Rules};
use crate::server::{TlsReloadSource, TlsReloader};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Cancels `token` on SIGINT or SIGTERM (Ctrl-C elsewhere).
pub(super) async fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    token.cancel();
}

/// SIGHUP reloads the rules file and the certificates (a bad file leaves
/// what was in force; each outcome is logged and counted where it is
/// reloaded).
pub(super) async fn reload_on_sighup(
    rules: Arc<Rules>,
    tls: Option<TlsReloader>,
    stop: CancellationToken,
) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::error!("cannot install the SIGHUP handler");
            return;
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            tracing::info!("SIGHUP: reloading rules and certificates");
            let _ = rules.reload(ReloadSource::Signal).await;
            if let Some(tls) = &tls {
                let _ = tls.reload(TlsReloadSource::Signal);
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (rules, tls, stop);
    }
}
