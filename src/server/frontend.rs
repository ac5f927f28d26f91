//! What every port shares: the accept loop (accept, then admit or
//! refuse), and what the drop-in front ends count.
//!
//! Invariants:
//! - every listening port (protocol, RESP, Envoy RLS) is admitted by one
//!   [`Admission`]: `--max-connections` and `--max-connections-per-ip`
//!   count the front ends' connections with the protocol port's, and a
//!   connection is accepted before it is admitted, so a refused client is
//!   told (or closed) at once instead of waiting in the kernel's queue;
//! - a front end's checks are counted twice: under their rule in
//!   `tollgate_checks_total` (by the shared check path, as any check) and
//!   under the front end in `tollgate_frontend_checks_total`.

use super::admission::{Admission, Answer, Ticket};
use super::Shared;
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Accepts connections on `listener` until `shutdown`; hands each one
/// admitted (with its place) to `serve`, and refuses the others with
/// `answer`. Protocol connections (told ERROR TooManyConnections) and
/// Envoy ones (closed: Envoy reconnects when it next needs the service)
/// may be shed to make room; RESP ones are not.
pub(super) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    admission: Arc<Admission>,
    shared: Arc<Shared>,
    answer: Answer,
    shutdown: CancellationToken,
    mut serve: F,
) where
    F: FnMut(TcpStream, SocketAddr, Ticket) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut backoff = Duration::from_millis(5);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(conn) => conn,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning;
                    // the server stays up for the connections it has.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            },
        };
        backoff = Duration::from_millis(5);
        let admitted = match answer {
            Answer::Protocol | Answer::Close => admission.admit(peer.ip()),
            Answer::Resp => admission.admit_unshed(peer.ip()),
        };
        match admitted {
            Ok(ticket) => serve(stream, peer, ticket).await,
            Err(why) => admission.refuse(stream, peer, why, answer, shared.clone()),
        }
    }
}

/// The drop-in front ends, as metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frontend {
    Resp,
    Envoy,
}

impl Frontend {
    pub fn name(self) -> &'static str {
        match self {
            Self::Resp => "resp",
            Self::Envoy => "envoy",
        }
    }
}

/// One front end's handles, resolved once.
#[derive(Debug, Clone)]
pub(crate) struct FrontendCounters {
    pub allowed: IntCounter,
    pub denied: IntCounter,
    /// Checks answered with an error (bad limit, unknown rule, store full).
    pub errors: IntCounter,
    /// Connections accepted on the front end's port.
    pub connections: IntCounter,
}

/// What the drop-in front ends count.
#[derive(Debug, Clone)]
pub(crate) struct FrontendMetrics {
    pub resp: FrontendCounters,
    /// Counted by the Envoy front end (built with the feature `envoy`).
    #[cfg_attr(not(feature = "envoy"), allow(dead_code))]
    pub envoy: FrontendCounters,
    /// `tollgate_resp_commands_total{command}`: RESP commands answered,
    /// one handle per command the front end knows, in its table's order.
    pub resp_commands: Vec<IntCounter>,
    /// The same for any other command (refused).
    pub resp_other: IntCounter,
    /// `tollgate_auth_failures_total{port}`: requests refused for a
    /// missing or wrong client token, by port (protocol, resp, envoy).
    pub auth_failures: IntCounterVec,
}

impl FrontendMetrics {
    /// Registers the metrics; `commands` are the RESP command names.
    pub fn register(registry: &Registry, commands: &[&str]) -> prometheus::Result<Self> {
        let checks = IntCounterVec::new(
            Opts::new(
                "tollgate_frontend_checks_total",
                "Checks answered through a drop-in front end (resp: CL.THROTTLE; \
                 envoy: one per descriptor that matched a limit), by outcome.",
            ),
            &["frontend", "outcome"],
        )?;
        let connections = IntCounterVec::new(
            Opts::new(
                "tollgate_frontend_connections_total",
                "Connections accepted on a drop-in front end's port.",
            ),
            &["frontend"],
        )?;
        let resp_commands = IntCounterVec::new(
            Opts::new(
                "tollgate_resp_commands_total",
                "Commands answered on the RESP front end, by command.",
            ),
            &["command"],
        )?;
        registry.register(Box::new(checks.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(resp_commands.clone()))?;
        let auth_failures = IntCounterVec::new(
            Opts::new(
                "tollgate_auth_failures_total",
                "Requests refused for a missing or wrong token, by port.",
            ),
            &["port"],
        )?;
        registry.register(Box::new(auth_failures.clone()))?;
        let counters = |f: Frontend| FrontendCounters {
            allowed: checks.with_label_values(&[f.name(), "allowed"]),
            denied: checks.with_label_values(&[f.name(), "denied"]),
            errors: checks.with_label_values(&[f.name(), "error"]),
            connections: connections.with_label_values(&[f.name()]),
        };
        Ok(Self {
            resp: counters(Frontend::Resp),
            envoy: counters(Frontend::Envoy),
            resp_other: resp_commands.with_label_values(&["other"]),
            resp_commands: commands
                .iter()
                .map(|c| resp_commands.with_label_values(&[c]))
                .collect(),
            auth_failures,
        })
    }
}

impl FrontendCounters {
    /// Counts one check's outcome: Some(allowed) or None (an error).
    pub fn count(&self, outcome: Option<bool>) {
        match outcome {
            Some(true) => self.allowed.inc(),
            Some(false) => self.denied.inc(),
            None => self.errors.inc(),
        }
    }
}

/// The address of a node's front end, from the node's protocol address
/// (`host:port`) and the front end's own port: a deployment runs every
/// node's front end on the same port, so another node's is its host and
/// this port.
pub(crate) fn on_port(protocol_addr: &str, port: u16) -> (String, u16) {
    let host = match protocol_addr.rsplit_once(':') {
        Some((host, _)) => host,
        None => protocol_addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host.to_owned(), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_nodes_front_end_is_its_host_on_this_port() {
        assert_eq!(on_port("10.0.0.7:7700", 6380), ("10.0.0.7".into(), 6380));
        assert_eq!(on_port("[::1]:7700", 6380), ("::1".into(), 6380));
        assert_eq!(
            on_port("tollgate-1.tollgate:7700", 6380),
            ("tollgate-1.tollgate".into(), 6380)
        );
        assert_eq!(on_port("", 6380), ("".into(), 6380));
    }
}
