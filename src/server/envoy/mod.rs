//! The Envoy rate limit service front end (`--envoy-rls ADDR`, cargo
//! feature `envoy`): gRPC `envoy.service.ratelimit.v3.RateLimitService`
//! on tonic, its messages generated from proto/ by build.rs.
//!
//! ```text
//!  accept -> admission (a place of --max-connections, shared with the
//!   protocol port; when full: closed) -> TLS (HTTP/2 by ALPN)
//!   -> tonic (HTTP/2) -> ShouldRateLimit -> service.rs: each descriptor
//!      to a named rule -> check::check_one -> statuses + x-ratelimit-*
//! ```
//!
//! Invariants:
//! - the port shares the protocol port's connection limits, client
//!   tokens (`authorization: Bearer TOKEN` metadata), TLS and node
//!   admission: a standby answers UNAVAILABLE naming its primary;
//! - a connection holds its place until tonic drops it;
//! - on shutdown tonic stops accepting and finishes the calls in flight.

mod service;

use super::admission::{Admission, Answer, Ticket};
use super::connection::secure_with;
use super::frontend::accept_loop;
use super::Shared;
use crate::tls::Socket;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The code generated from proto/, one module per protobuf package (the
/// generated code names the other packages by these paths).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub(crate) mod pb {
    pub mod envoy {
        pub mod service {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ratelimit.v3");
                }
            }
        }
        pub mod extensions {
            pub mod common {
                pub mod ratelimit {
                    pub mod v3 {
                        tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                    }
                }
            }
        }
        pub mod config {
            pub mod core {
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        pub mod r#type {
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
    }
}

/// Connections accepted but not yet taken by tonic.
const PENDING_CONNECTIONS: usize = 64;

/// Serves the rate limit service on `listener` until `shutdown`.
pub(super) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    admission: Arc<Admission>,
    shutdown: CancellationToken,
) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    tracing::info!(port, "Envoy rate limit service serving");
    let (tx, rx) = mpsc::channel::<io::Result<Conn>>(PENDING_CONNECTIONS);
    let secured = shared.clone();
    let accept = accept_loop(
        listener,
        admission,
        shared.clone(),
        Answer::Close,
        shutdown.clone(),
        move |stream, peer, ticket| {
            let (tx, shared) = (tx.clone(), secured.clone());
            // The handshake runs on its own task: a slow client must not hold
            // up the accept loop.
            tokio::spawn(async move {
                shared.metrics.frontends.envoy.connections.inc();
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, error = %e, "set_nodelay failed");
                }
                let acceptor = crate::tls::Tls::grpc_acceptor;
                if let Some(socket) = secure_with(stream, peer, &shared, acceptor).await {
                    let _ = tx
                        .send(Ok(Conn {
                            socket,
                            _ticket: ticket,
                        }))
                        .await;
                }
            });
            std::future::ready(())
        },
    );
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let grpc = tonic::transport::Server::builder()
        .add_service(service::server(shared))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled());
    let ((), served) = tokio::join!(accept, grpc);
    if let Err(e) = served {
        tracing::error!(error = %e, "Envoy rate limit service failed");
    }
}

/// One accepted connection and its place, as tonic reads it.
struct Conn {
    socket: Socket,
    _ticket: Ticket,
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_shutdown(cx)
    }
}
