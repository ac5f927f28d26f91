//! Signals of `tollgate serve`: SIGINT and SIGTERM start the drain, SIGHUP
//! reloads the rules file and the TLS certificates.

use crate::rules::{ReloadSource, Rules};
use crate::server::{TlsReloadSource, TlsReloader};
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Cancels `token` on SIGINT or SIGTERM (Ctrl-C elsewhere). The handlers
/// are installed when this is called, not when the task first runs, so a
/// signal sent once the server says it serves is never the default one
/// (which would end the process without a drain).
pub(super) fn cancel_on_signal(token: CancellationToken) -> impl Future<Output = ()> {
    #[cfg(unix)]
    let handlers = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        {
            let (Ok(mut term), Ok(mut int)) = handlers else {
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
}

/// SIGHUP reloads the rules file and the certificates (a bad file leaves
/// what was in force; each outcome is logged and counted where it is
/// reloaded). The handler is installed when this is called: SIGHUP's
/// default action ends the process.
pub(super) fn reload_on_sighup(
    rules: Arc<Rules>,
    tls: Option<TlsReloader>,
    stop: CancellationToken,
) -> impl Future<Output = ()> {
    #[cfg(unix)]
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    async move {
        #[cfg(unix)]
        {
            let Ok(mut hup) = hup else {
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
}
