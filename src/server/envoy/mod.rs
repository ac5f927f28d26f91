//! The Envoy rate limit service front end (`--envoy-rls ADDR`, cargo
//! feature `envoy`): gRPC `envoy.service.ratelimit.v3.RateLimitService`
//! on tonic, its messages generated from proto/ by build.rs.
//!
//! ```text
//!  accept -> admission (a place of --max-connections, shared with the
//!   protocol port; when full: closed) -> TLS (HTTP/2 by ALPN)
//!   -> tonic (HTTP/2) -> gate.rs (token, on the headers)
//!   -> ShouldRateLimit -> service.rs: keys screened by the node (route.rs:
//!      cluster mode's MOVED/TryAgain), each descriptor to a named rule
//!      -> Engine::check_one -> statuses + x-ratelimit-*
//! ```
//!
//! Invariants:
//! - the port shares the protocol port's connection limits, client
//!   tokens (`authorization: Bearer TOKEN` metadata), TLS and node
//!   admission: a standby answers UNAVAILABLE naming its primary;
//! - a connection holds its place until tonic drops it; it is closed when
//!   it makes no authorized call within `--handshake-timeout` of opening or
//!   `--idle-timeout` of the last, after [`conn::MAX_AUTH_FAILURES`]
//!   refused tokens, or when shed to make room (conn.rs);
//! - the token is checked on a call's headers, before its body is read
//!   (gate.rs); an authorized call's message is at most
//!   `--envoy-max-message` and is answered within `--frame-timeout`;
//! - what one connection can make the server hold is bounded by settings:
//!   unread request bytes by the HTTP/2 connection window
//!   (`--envoy-max-message`); calls by `--envoy-max-streams`, each at most
//!   [`MAX_HEADER_LIST`] of headers and, once authorized, one message of
//!   at most `--envoy-max-message` being decoded;
//! - on shutdown tonic stops accepting and finishes the calls in flight.

mod conn;
mod gate;
mod route;
mod service;

use super::admission::{Admission, Answer};
use super::frontend::accept_loop;
use super::handshake::secure_with;
use super::Shared;
use conn::Conn;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;

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

/// Largest HTTP/2 frame the server accepts: the protocol's minimum (and
/// hyper's default), so a frame never outgrows the read buffer.
const MAX_FRAME: u32 = 16 << 10;
/// Largest header block of one call: gRPC's own headers and a bearer
/// token take a few hundred bytes; Envoy adds a few more.
const MAX_HEADER_LIST: u32 = 8 << 10;
/// How often a connection that sent nothing is pinged, and how long its
/// answer may take before the connection is dropped as dead.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

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
                    let network = &shared.network;
                    let (handshake, idle) = (network.handshake_timeout, network.idle_timeout);
                    let conn = Conn::new(socket, ticket, handshake, idle);
                    let _ = tx.send(Ok(conn)).await;
                }
            });
            std::future::ready(())
        },
    );
    let incoming = tokio_stream::wrappers::ReceiverStream::new(rx);
    let grpc = grpc_server(&shared)
        .add_service(InterceptedService::new(
            service::server(shared.clone(), port, shared.frontends.envoy_max_message),
            gate::Gate::new(shared.clone(), shared.frontends.envoy_max_message),
        ))
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled());
    let ((), served) = tokio::join!(accept, grpc);
    if let Err(e) = served {
        tracing::error!(error = %e, "Envoy rate limit service failed");
    }
}

/// tonic's HTTP/2 server with the bounds of the module docs.
fn grpc_server(shared: &Shared) -> tonic::transport::Server {
    let settings = &shared.frontends;
    // The window is a u32 on the wire; the setting is at most 4 MiB.
    let window = u32::try_from(settings.envoy_max_message).unwrap_or(u32::MAX);
    tonic::transport::Server::builder()
        .max_concurrent_streams(settings.envoy_max_streams)
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .max_frame_size(MAX_FRAME)
        .http2_max_header_list_size(MAX_HEADER_LIST)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .timeout(shared.network.frame_timeout)
}
