//! The TLS handshake of a connection just accepted, on a port that speaks
//! TLS: within the handshake timeout (which also bounds the HELLO after
//! it), abandoned when the server drains, each failure counted. The
//! protocol port's connections (and the refusals admission.rs writes), the
//! RESP port's and the Envoy port's all go through it.

use crate::server::Shared;
use crate::tls::Socket;
use std::net::SocketAddr;
use tokio::net::TcpStream;

/// The TLS handshake, when the port speaks TLS, within the handshake
/// timeout (which also bounds the HELLO after it); None when it failed.
pub(super) async fn secure(stream: TcpStream, peer: SocketAddr, shared: &Shared) -> Option<Socket> {
    secure_with(stream, peer, shared, crate::tls::Tls::protocol_acceptor).await
}

/// [`secure`] with the acceptor `acceptor` picks (the RESP port takes the
/// protocol port's, the gRPC port one that offers HTTP/2 by ALPN).
pub(super) async fn secure_with(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    acceptor: fn(&crate::tls::Tls) -> tokio_rustls::TlsAcceptor,
) -> Option<Socket> {
    let Some(tls) = &shared.tls else {
        return Some(Socket::Plain(stream));
    };
    let acceptor = acceptor(tls);
    let limit = shared.network.handshake_timeout;
    let failed = |why: &dyn std::fmt::Display| {
        shared.metrics.conns.tls_failures.inc();
        tracing::debug!(%peer, error = %why, "TLS handshake failed");
        None
    };
    let handshake = tokio::select! {
        _ = shared.lifecycle.draining.cancelled() => return None,
        h = tokio::time::timeout(limit, acceptor.accept(stream)) => h,
    };
    match handshake {
        Ok(Ok(tls)) => Some(Socket::from(tls)),
        Ok(Err(e)) => failed(&e),
        Err(_) => failed(&format!("not done within {limit:?}")),
    }
}
