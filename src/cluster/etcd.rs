//! A connection to etcd with a deadline on every unary request.
//!
//! etcd-client's per-endpoint timeout would also be sent as a gRPC deadline
//! on streams (and end every watch after it), so the deadline is applied
//! here instead, around each unary call. Connections use HTTP/2 keepalive
//! pings so a dead member or a partition is noticed, and `require_leader`
//! so a member cut off from its quorum refuses at once instead of serving
//! stale reads or holding a watch that will never fire.
//!
//! etcd-client balances requests over every endpoint, dead ones included: a
//! request sent to a member that is down fails with "tcp connect error"
//! although the others are up. Such a request never left this process, so
//! [`Etcd::call`] sends it again (another endpoint is picked) until the
//! deadline. Any other failure is reported: a request that may have reached
//! etcd is never sent twice. A failure that comes from TLS (an untrusted
//! certificate, a client certificate refused or missing) is reported as
//! such, [`ClusterError::Tls`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::{ClusterError, EtcdSettings};

/// HTTP/2 keepalive ping period and timeout on etcd connections.
const PING_INTERVAL: Duration = Duration::from_secs(1);
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// A cheap-to-clone handle on an etcd cluster.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    request_timeout: Duration,
    tls: Tls,
    /// Whether etcd answered a request yet (over TLS: the handshake works).
    answered: Arc<AtomicBool>,
}

/// The connection's TLS, to tell a failed handshake from other failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tls {
    Off,
    On { client_cert: bool },
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl Etcd {
    /// Sets up connections to `settings.endpoints`, over TLS and as the
    /// etcd user `settings.access` gives. Without a user nothing is sent
    /// yet: an unreachable etcd shows up as errors of the first requests.
    /// With one, etcd-client asks etcd for a token here, under the request
    /// deadline like any request.
    pub async fn connect(settings: &EtcdSettings) -> Result<Self, ClusterError> {
        settings.validate()?;
        let options = ConnectOptions::new()
            .with_connect_timeout(settings.connect_timeout)
            .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let options = settings.access.apply(options)?;
        let urls = settings.urls();
        let tls = match settings.access.tls() {
            false => Tls::Off,
            true => Tls::On {
                client_cert: settings.access.cert.is_some(),
            },
        };
        let client = retried("connect", settings.request_timeout, tls, || {
            Client::connect(urls.clone(), Some(options.clone()))
        })
        .await?;
        Ok(Self {
            client,
            request_timeout: settings.request_timeout,
            tls,
            // With a user, etcd has just answered the authentication.
            answered: Arc::new(AtomicBool::new(settings.access.user.is_some())),
        })
    }

    /// A client to issue a request with (clones share the connections).
    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// Runs one unary request (built by `request` from a client) under the
    /// request deadline, sending it again while it fails to connect.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        mut request: F,
    ) -> Result<T, ClusterError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        // Once etcd answered, the handshake is known to work: a broken
        // transport is then just that, not a missing client certificate.
        let tls = match self.tls {
            Tls::On { .. } if self.answered.load(Ordering::Relaxed) => {
                Tls::On { client_cert: true }
            }
            tls => tls,
        };
        let result = retried(op, self.request_timeout, tls, || request(self.client())).await;
        if result.is_ok() {
            self.answered.store(true, Ordering::Relaxed);
        }
        result
    }
}

/// Runs `request` under `deadline`, sending it again while it fails to
/// connect; past the deadline, a request that never connected reports its
/// last error (a refused connection, an untrusted certificate...).
async fn retried<T, F, Fut>(
    op: &'static str,
    deadline: Duration,
    tls: Tls,
    mut request: F,
) -> Result<T, ClusterError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let mut last = None;
    let attempts = async {
        loop {
            match request().await {
                Err(e) if never_sent(&e) => {
                    tracing::debug!(op, error = %e, "etcd member unreachable; trying again");
                    last = Some(e);
                    tokio::time::sleep(CONNECT_RETRY).await;
                }
                done => return done,
            }
        }
    };
    // Bound first: the attempts' borrow of `last` ends with this statement.
    let outcome = tokio::time::timeout(deadline, attempts).await;
    match outcome {
        Ok(Err(source)) if tls_failure(&source, tls) => Err(ClusterError::Tls { op, source }),
        Ok(result) => result.map_err(ClusterError::etcd(op)),
        Err(_) => Err(match last {
            Some(source) => ClusterError::Unreachable {
                op,
                after: deadline,
                source,
            },
            None => ClusterError::Timeout {
                op,
                after: deadline,
            },
        }),
    }
}

/// Whether `e` is a failed TLS handshake: the certificate was refused on
/// either side. A server that demands a client certificate and got none
/// closes the connection after the handshake (TLS 1.3), which the client
/// only sees as a broken transport (a broken pipe, a closed connection).
fn tls_failure(e: &etcd_client::Error, tls: Tls) -> bool {
    let Tls::On { client_cert } = tls else {
        return false;
    };
    let text = format!("{e:?}").to_lowercase();
    text.contains("certificate")
        || text.contains("handshake")
        || (!client_cert && text.contains("transport::error(transport"))
}

/// Pause between two attempts of a request that could not connect.
const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// True when `e` says the request could not even be sent: gRPC
/// UNAVAILABLE from the transport failing to connect.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable && status.message().contains("connect")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}
