//! A connection to etcd with a deadline on every unary request.
//!
//! etcd-client's per-endpoint timeout would also be sent as a gRPC deadline
//! on streams (and end every watch after it), so the deadline is applied
//! here instead, around each unary call. Connections use HTTP/2 keepalive
//! pings so a dead member or a partition is noticed, and `require_leader`
//! so a member cut off from its quorum refuses at once instead of serving
//! stale reads or holding a watch that will never fire.

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

    /// Runs one unary request under the request deadline.
    pub(crate) async fn call<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, ClusterError> {
        match tokio::time::timeout(self.request_timeout, request).await {
            Ok(result) => result.map_err(ClusterError::etcd(op)),
            Err(_) => Err(ClusterError::Timeout {
                op,
                after: self.request_timeout,
            }),
        }
    }
}
