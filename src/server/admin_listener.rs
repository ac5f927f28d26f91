//! The admin API's listener: accepts connections, speaks TLS when the
//! server does (no client certificate: probes hold none, the admin token
//! authenticates), and serves each with HTTP/1 and the admin router.
//!
//! Invariants: a TLS handshake or a request head that does not arrive in
//! time ends that connection only; on stop the listener closes, requests
//! in progress finish, and idle keep-alive connections close.

use super::admin::{router, AdminState};
use crate::tls::{Socket, Tls};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves the admin API on `listener` until `stop`.
pub(super) async fn serve(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    state: Arc<AdminState>,
    stop: CancellationToken,
) {
    let addr = listener.local_addr().ok();
    tracing::info!(admin = ?addr, tls = tls.is_some(), "admin API serving");
    // The protocol port's handshake bound serves here too: TLS and the
    // request head must both arrive within it.
    let patience = state.shared.network.handshake_timeout;
    let service = TowerToHyperService::new(router(state));
    let graceful = GracefulShutdown::new();
    let mut backoff = Duration::from_millis(5);
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(5);
        let acceptor = tls.as_ref().map(|t| t.admin_acceptor());
        let service = service.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let socket = match acceptor {
                None => Socket::Plain(stream),
                Some(acceptor) => {
                    match tokio::time::timeout(patience, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => Socket::from(tls),
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "admin TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    }
                }
            };
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(patience)
                .serve_connection(TokioIo::new(socket), service);
            if let Err(e) = watcher.watch(connection).await {
                tracing::debug!(%peer, error = %e, "admin connection");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
