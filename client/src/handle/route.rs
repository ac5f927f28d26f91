//! Where a client's checks go: its one shard, or (cluster mode) the shard
//! of each check's slot.

use std::future::Future;
use std::sync::Arc;

use tollgate_protocol::ServerLimits;

use crate::calls;
use crate::cluster::Cluster;
use crate::connection::pending::{Answer, BatchKind, Checks};
use crate::connection::Deadline;
use crate::error::Error;
use crate::shard::Shard;

/// Where checks go: one shard, or the shard of each check's slot.
#[derive(Clone)]
pub(crate) enum Route {
    Shard(Arc<Shard>),
    Cluster(Arc<Cluster>),
}

impl Route {
    /// The limits requests are checked against before they go anywhere
    /// (module `validity`): the server's last announced ones; None before
    /// any handshake.
    pub(crate) fn announced_limits(&self) -> Option<ServerLimits> {
        match self {
            Self::Shard(shard) => shard.announced_limits(),
            Self::Cluster(cluster) => cluster.announced_limits(),
        }
    }

    /// Sends checks of `kind` and returns their answer (a batch's results
    /// in the batch's order, however it was split).
    ///
    /// A plain function returning an async block, as [`calls::checks`]
    /// (see there why).
    #[allow(clippy::manual_async_fn)] // on purpose: see calls::checks
    pub(crate) fn checks(
        &self,
        kind: BatchKind,
        checks: Checks,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Answer, Error>> + Send + '_ {
        async move {
            match self {
                Self::Shard(shard) => calls::checks(shard, kind, checks, deadline).await,
                // Boxed: the routing state need not weigh on a single shard's calls.
                Self::Cluster(cluster) => Box::pin(cluster.checks(kind, checks, deadline)).await,
            }
        }
    }
}
