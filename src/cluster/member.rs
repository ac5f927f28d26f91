//! A node's membership: its registration under its etcd lease, the lease's
//! renewal, and the election of its shard's primary.
//!
//! **Election.** `primary/<shard>` is created, bound to the candidate's
//! lease, by a transaction that succeeds only if the key does not exist
//! (`create_revision == 0`). The key's `create_revision` is the shard's
//! **epoch**: etcd revisions only grow, so every later primary of the
//! shard has a higher epoch, and a node holding an older one is fenced.
//! The key disappears when its holder resigns, or when etcd expires the
//! holder's lease (the holder stopped renewing: crashed, paused, cut off).
//! A transaction on one key, rather than etcd's election service, because
//! the node layer decides *when* to run (only a standby in sync with the
//! last primary's stream may take over) and reads the epoch from the same
//! answer.
//!
//! A node never decides alone that it is primary: only this transaction's
//! success (or finding the key held by its own lease) says so, and it
//! serves writes as primary only while its [`LeaseDeadline`] is valid.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::lease::{renew, LeaseDeadline};
use super::{admin, ClusterError, Etcd, EtcdSettings, Keyspace, ShardId};

/// A node's registration (`nodes/<addr>`), bound to its lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Where clients and peers reach it (`--advertise`).
    pub addr: String,
    pub shard: ShardId,
    /// Its admin HTTP address, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<String>,
}

/// The holder of a shard's primary role (`primary/<shard>`), bound to its
/// lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrimaryRecord {
    pub addr: String,
    /// The holder's lease id: a node that restarts at the same address
    /// holds a new lease, so it does not mistake its old self's key for
    /// its own.
    pub lease: i64,
}

/// What a campaign found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Campaign {
    /// This node holds the shard's primary key, created at `epoch`.
    Elected { epoch: u64 },
    /// Another node does.
    Follower { primary: PrimaryRecord, epoch: u64 },
}

/// A node registered in a cluster, renewing its lease in the background
/// until [`leave`](Member::leave) or drop. Dropping it stops the renewal
/// without revoking the lease, like a crash: etcd expires it after the TTL.
pub struct Member {
    etcd: Etcd,
    keys: Keyspace,
    record: NodeRecord,
    deadline: Arc<LeaseDeadline>,
    ttl: Duration,
    cancel: CancellationToken,
    renewal: JoinHandle<()>,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("cluster", &self.keys.cluster())
            .field("record", &self.record)
            .field("lease", &format_args!("{:x}", self.deadline.lease_id()))
            .finish_non_exhaustive()
    }
}

impl Member {
    /// Registers `record` in the cluster under a new lease of
    /// `settings.lease_ttl` and starts renewing it. Fails if the cluster
    /// or the shard does not exist.
    pub async fn join(
        etcd: Etcd,
        keys: Keyspace,
        record: NodeRecord,
        settings: &EtcdSettings,
    ) -> Result<Self, ClusterError> {
        settings.validate()?;
        let (topology, _) = admin::load_topology(&etcd, &keys).await?;
        if topology.shard(record.shard).is_none() {
            return Err(ClusterError::NoSuchShard {
                cluster: keys.cluster().to_owned(),
                shard: record.shard,
                shards: topology.shards.len(),
            });
        }
        let sent = Instant::now();
        let grant = etcd
            .call("grant a lease", |mut c| {
                // Validated above (at most MAX_LEASE_TTL); never wrapped
                // negative, which etcd would take as its minimum.
                let ttl = i64::try_from(settings.lease_ttl.as_secs()).unwrap_or(i64::MAX);
                async move { c.lease_grant(ttl, None).await }
            })
            .await?;
        // etcd may raise a TTL below its minimum: use what it granted.
        let ttl = Duration::from_secs(grant.ttl().max(1) as u64);
        let deadline =
            LeaseDeadline::new(grant.id(), sent + ttl.saturating_sub(settings.lease_margin));
        let value = serde_json::to_vec(&record).expect("a node record serializes");
        let put = PutOptions::new().with_lease(grant.id());
        etcd.call("register the node", |mut c| {
            let (key, value, put) = (keys.node(&record.addr), value.clone(), put.clone());
            async move { c.put(key, value, Some(put)).await }
        })
        .await?;
        let cancel = CancellationToken::new();
        let renewal = tokio::spawn(renew(
            etcd.clone(),
            deadline.clone(),
            ttl,
            settings.keepalive_interval,
            settings.lease_margin,
            cancel.clone(),
        ));
        tracing::info!(
            cluster = keys.cluster(),
            addr = %record.addr,
            shard = %record.shard,
            lease = format!("{:x}", grant.id()),
            ttl_s = ttl.as_secs(),
            "joined the cluster"
        );
        Ok(Self {
            etcd,
            keys,
            record,
            deadline,
            ttl,
            cancel,
            renewal,
        })
    }

    pub fn record(&self) -> &NodeRecord {
        &self.record
    }

    /// The lease's validity, shared with the renewal task.
    pub fn deadline(&self) -> &Arc<LeaseDeadline> {
        &self.deadline
    }

    /// The TTL etcd granted.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lease_id(&self) -> i64 {
        self.deadline.lease_id()
    }

    /// Tries to become the primary of this node's shard. Idempotent: a
    /// node that already holds the key is told so with its epoch.
    pub async fn campaign(&self) -> Result<Campaign, ClusterError> {
        if self.deadline.is_lost() {
            return Err(ClusterError::LeaseLost {
                lease: self.lease_id(),
            });
        }
        let key = self.keys.primary(self.record.shard);
        let record = PrimaryRecord {
            addr: self.record.addr.clone(),
            lease: self.lease_id(),
        };
        let value = serde_json::to_vec(&record).expect("a primary record serializes");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(self.lease_id())),
            )])
            .or_else([TxnOp::get(key.clone(), None)]);
        let answer = self
            .etcd
            .call("campaign", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
            .map_err(|e| self.lease_error(e))?;
        if answer.succeeded() {
            let epoch = answer.header().map_or(0, |h| h.revision()) as u64;
            tracing::info!(shard = %self.record.shard, epoch, "elected primary");
            return Ok(Campaign::Elected { epoch });
        }
        let kv = answer
            .op_responses()
            .into_iter()
            .find_map(|r| match r {
                TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                _ => None,
            })
            .ok_or_else(|| ClusterError::Corrupt {
                key: key.clone(),
                reason: "the campaign found the key held, then no key".into(),
            })?;
        let primary: PrimaryRecord =
            serde_json::from_slice(kv.value()).map_err(|e| ClusterError::Corrupt {
                key,
                reason: e.to_string(),
            })?;
        let epoch = kv.create_revision() as u64;
        if kv.lease() == self.lease_id() {
            Ok(Campaign::Elected { epoch })
        } else {
            Ok(Campaign::Follower { primary, epoch })
        }
    }

    /// Gives up the primary role held at `epoch` (a graceful hand-over).
    /// False when the key is not that one any more.
    pub async fn resign(&self, epoch: u64) -> Result<bool, ClusterError> {
        let key = self.keys.primary(self.record.shard);
        let txn = Txn::new()
            .when([Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                epoch as i64,
            )])
            .and_then([TxnOp::delete(key, None)]);
        let answer = self
            .etcd
            .call("resign", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(answer.succeeded())
    }

    /// Stops renewing and revokes the lease: the registration and any
    /// primary key go at once, so a standby can take over without waiting
    /// for the TTL. The node must have stopped serving writes first.
    pub async fn leave(&self) -> Result<(), ClusterError> {
        self.cancel.cancel();
        let lease = self.lease_id();
        self.deadline.lose();
        self.etcd
            .call("revoke the lease", |mut c| async move {
                c.lease_revoke(lease).await
            })
            .await
            .map(|_| ())
    }

    /// A request refused because the lease is gone is reported as such.
    fn lease_error(&self, e: ClusterError) -> ClusterError {
        match &e {
            ClusterError::Etcd {
                source: etcd_client::Error::GRpcStatus(status),
                ..
            } if status.message().contains("lease not found") => ClusterError::LeaseLost {
                lease: self.lease_id(),
            },
            _ => e,
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.renewal.abort();
    }
}
