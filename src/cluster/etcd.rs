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
//! etcd is never sent twice.

use std::future::Future;
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
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl Etcd {
    /// Sets up connections to `settings.endpoints`. Nothing is sent yet: an
    /// unreachable etcd shows up as errors of the first requests.
    pub async fn connect(settings: &EtcdSettings) -> Result<Self, ClusterError> {
        settings.validate()?;
        let options = ConnectOptions::new()
            .with_connect_timeout(settings.connect_timeout)
            .with_keep_alive(PING_INTERVAL, PING_TIMEOUT)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let client = Client::connect(settings.urls(), Some(options))
            .await
            .map_err(ClusterError::etcd("connect"))?;
        Ok(Self {
            client,
            request_timeout: settings.request_timeout,
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
        let attempts = async {
            loop {
                match request(self.client()).await {
                    Err(e) if never_sent(&e) => {
                        tracing::debug!(op, error = %e, "etcd member unreachable; trying again");
                        tokio::time::sleep(CONNECT_RETRY).await;
                    }
                    done => return done,
                }
            }
        };
        match tokio::time::timeout(self.request_timeout, attempts).await {
            Ok(result) => result.map_err(ClusterError::etcd(op)),
            Err(_) => Err(ClusterError::Timeout {
                op,
                after: self.request_timeout,
            }),
        }
    }
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
