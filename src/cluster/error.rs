//! Errors of the control plane, typed and carrying what explains them.

use std::time::Duration;

use super::{EtcdAccessError, ShardId, TopologyError};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// An etcd request failed (connection, gRPC status, no leader...).
    #[error("etcd {op}: {source}")]
    Etcd {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },

    /// etcd refused the credentials, or the user lacks a permission: a
    /// wrong or missing `--etcd-user`/password, or a role without read
    /// and write on the cluster's prefix.
    #[error("etcd refused {op}: {source} (check --etcd-user and its password, and that the user's role may read and write /tollgate/)")]
    Denied {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },

    /// No etcd member could be reached within the request deadline: each
    /// attempt failed to connect (`source`: the last one's error, e.g. a
    /// refused connection or a certificate the CA does not vouch for).
    #[error("etcd {op}: no member reached within {after:?}: {source}")]
    Unreachable {
        op: &'static str,
        after: Duration,
        #[source]
        source: etcd_client::Error,
    },

    /// The TLS connection to etcd failed: etcd's certificate is not signed
    /// by `--etcd-tls-ca`, or etcd refused the client certificate (or its
    /// absence).
    #[error("etcd {op}: TLS with etcd failed: {source} (check that --etcd-tls-ca signed etcd's certificate, and --etcd-cert/--etcd-key when etcd demands client certificates)")]
    Tls {
        op: &'static str,
        #[source]
        source: etcd_client::Error,
    },

    /// The etcd credentials or TLS files cannot be used.
    #[error(transparent)]
    Access(#[from] EtcdAccessError),

    /// An etcd request got no answer in time (no quorum, partition).
    #[error("etcd {op}: no answer within {after:?}")]
    Timeout { op: &'static str, after: Duration },

    #[error("{name:?} is not a cluster name (1 to 64 of A-Z a-z 0-9 . _ -)")]
    ClusterName { name: String },

    #[error("invalid cluster settings: {0}")]
    Settings(String),

    /// `cluster init` of a cluster whose topology already exists.
    #[error("cluster {cluster:?} already exists (topology version {version})")]
    ClusterExists { cluster: String, version: u64 },

    /// The cluster has no topology in etcd (never initialised).
    #[error("cluster {cluster:?} does not exist (run `tollgate cluster init`)")]
    NoCluster { cluster: String },

    #[error("cluster {cluster:?} has no shard {shard} ({shards} shards)")]
    NoSuchShard {
        cluster: String,
        shard: ShardId,
        shards: usize,
    },

    /// A change was made from a stale copy of the topology: nothing was
    /// written. Read it again and retry.
    #[error("the topology changed: expected version {expected}, etcd holds {current}")]
    TopologyChanged { expected: u64, current: u64 },

    /// A change fenced by a shard's epoch: the shard's primary is no longer
    /// the one elected at `epoch` (`current`: the epoch now, 0 for none).
    #[error("shard {shard}: epoch {epoch} is fenced (current epoch {current})")]
    Fenced {
        shard: ShardId,
        epoch: u64,
        current: u64,
    },

    #[error(transparent)]
    Topology(#[from] TopologyError),

    /// A value under the cluster's prefix does not decode.
    #[error("etcd key {key}: {reason}")]
    Corrupt { key: String, reason: String },

    /// The node's lease is gone from etcd (it expired while the node could
    /// not renew it): its registration and any primary key went with it.
    #[error("lease {lease:x} has expired in etcd")]
    LeaseLost { lease: i64 },
}

impl ClusterError {
    pub(crate) fn etcd(op: &'static str) -> impl FnOnce(etcd_client::Error) -> Self {
        move |source| {
            if denied(&source) {
                Self::Denied { op, source }
            } else {
                Self::Etcd { op, source }
            }
        }
    }
}

/// Whether etcd refused the request for its credentials or permissions.
fn denied(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return false;
    };
    match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => true,
        // etcd answers a wrong password, a missing user name and a
        // user on an etcd without auth with these codes.
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
            let m = status.message();
            m.starts_with("etcdserver: ")
                && (m.contains("auth") || m.contains("user name") || m.contains("password"))
        }
        _ => false,
    }
}
