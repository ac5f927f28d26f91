//! Operations on a cluster as a whole, for the CLI (`cluster init`,
//! `cluster status`, `cluster move-slots`) and for the node that carries
//! out a slot move.
//!
//! Every change of the topology is one etcd transaction conditioned on the
//! version the change was computed from (the topology key's
//! `mod_revision`): a change made from a stale copy writes nothing and
//! fails with [`ClusterError::TopologyChanged`]. The flip that ends a slot
//! move may also be fenced by the source shard's epoch.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use serde::Serialize;

use super::routing::ShardRoute;
use super::view::Mirror;
use super::{ClusterError, Etcd, Keyspace, RoutingTable, ShardId, SlotMove, SlotRange, Topology};

/// A cluster's topology: the [`Topology`] and its version.
pub async fn load_topology(etcd: &Etcd, keys: &Keyspace) -> Result<(Topology, u64), ClusterError> {
    let answer = etcd
        .call("read the topology", |mut c| {
            let key = keys.topology();
            async move { c.get(key, None).await }
        })
        .await?;
    let kv = answer
        .kvs()
        .first()
        .ok_or_else(|| ClusterError::NoCluster {
            cluster: keys.cluster().to_owned(),
        })?;
    let topology = decode_topology(keys, kv.value())?;
    Ok((topology, kv.mod_revision() as u64))
}

fn decode_topology(keys: &Keyspace, value: &[u8]) -> Result<Topology, ClusterError> {
    let topology: Topology = serde_json::from_slice(value).map_err(|e| ClusterError::Corrupt {
        key: keys.topology(),
        reason: e.to_string(),
    })?;
    topology.validate().map_err(|e| ClusterError::Corrupt {
        key: keys.topology(),
        reason: e.to_string(),
    })?;
    Ok(topology)
}

/// `cluster init`: creates the cluster with `shards` shards, the slots
/// split evenly. Refuses (writing nothing) when the cluster exists.
/// Returns the topology and its version.
pub async fn init(
    etcd: &Etcd,
    keys: &Keyspace,
    shards: u16,
) -> Result<(Topology, u64), ClusterError> {
    let topology = Topology::even(shards)?;
    let value = serde_json::to_vec(&topology).expect("a topology serializes");
    let key = keys.topology();
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), value, None)])
        .or_else([TxnOp::get(key, None)]);
    let answer = etcd
        .call("create the cluster", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
    if answer.succeeded() {
        let version = answer.header().map_or(0, |h| h.revision()) as u64;
        tracing::info!(cluster = keys.cluster(), shards, version, "cluster created");
        return Ok((topology, version));
    }
    Err(ClusterError::ClusterExists {
        cluster: keys.cluster().to_owned(),
        version: found(&answer).map_or(0, |kv| kv.mod_revision() as u64),
    })
}

/// The first key a transaction's `or_else` read.
fn found(answer: &etcd_client::TxnResponse) -> Option<etcd_client::KeyValue> {
    answer.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
        _ => None,
    })
}

/// A condition on a shard's primary: the change is made only while the
/// shard's primary key is the one created at `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    pub shard: ShardId,
    pub epoch: u64,
}

/// Writes `next` if the topology is still at `expected` (and the fence, if
/// any, holds); returns the new version.
pub async fn replace_topology(
    etcd: &Etcd,
    keys: &Keyspace,
    expected: u64,
    next: &Topology,
    fence: Option<Fence>,
) -> Result<u64, ClusterError> {
    next.validate()?;
    let key = keys.topology();
    let mut compares = vec![Compare::mod_revision(
        key.clone(),
        CompareOp::Equal,
        expected as i64,
    )];
    let mut reads = vec![TxnOp::get(key.clone(), None)];
    if let Some(f) = fence {
        let primary = keys.primary(f.shard);
        compares.push(Compare::create_revision(
            primary.clone(),
            CompareOp::Equal,
            f.epoch as i64,
        ));
        reads.push(TxnOp::get(primary, None));
    }
    let value = serde_json::to_vec(next).expect("a topology serializes");
    let txn = Txn::new()
        .when(compares)
        .and_then([TxnOp::put(key, value, None)])
        .or_else(reads);
    let answer = etcd
        .call("change the topology", |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await?;
    if answer.succeeded() {
        return Ok(answer.header().map_or(0, |h| h.revision()) as u64);
    }
    let mut reads = answer.op_responses().into_iter().map(|r| match r {
        TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
        _ => None,
    });
    let current = reads
        .next()
        .flatten()
        .map_or(0, |kv| kv.mod_revision() as u64);
    if current != expected {
        return Err(ClusterError::TopologyChanged { expected, current });
    }
    let fence = fence.expect("only the fence can have failed");
    Err(ClusterError::Fenced {
        shard: fence.shard,
        epoch: fence.epoch,
        current: reads
            .next()
            .flatten()
            .map_or(0, |kv| kv.create_revision() as u64),
    })
}

/// Records a move of `slots` to shard `to`, computed from the topology at
/// `expected`. Returns the version with the move recorded.
pub async fn begin_move(
    etcd: &Etcd,
    keys: &Keyspace,
    slots: SlotRange,
    to: ShardId,
    expected: u64,
) -> Result<u64, ClusterError> {
    let topology = topology_at(etcd, keys, expected).await?;
    let next = topology.with_move(slots, to)?;
    replace_topology(etcd, keys, expected, &next, None).await
}

/// The flip that ends a move: `slots` belong to the move's target, in one
/// transaction conditioned on the version the move was seen at (and on
/// the source primary's epoch, when fenced).
pub async fn complete_move(
    etcd: &Etcd,
    keys: &Keyspace,
    slots: SlotRange,
    expected: u64,
    fence: Option<Fence>,
) -> Result<u64, ClusterError> {
    let topology = topology_at(etcd, keys, expected).await?;
    let next = topology.with_move_done(slots)?;
    replace_topology(etcd, keys, expected, &next, fence).await
}

/// Drops the move of `slots`: they stay with their source.
pub async fn abort_move(
    etcd: &Etcd,
    keys: &Keyspace,
    slots: SlotRange,
    expected: u64,
) -> Result<u64, ClusterError> {
    let topology = topology_at(etcd, keys, expected).await?;
    let next = topology.without_move(slots)?;
    replace_topology(etcd, keys, expected, &next, None).await
}

/// The topology if it is still at `expected`.
async fn topology_at(
    etcd: &Etcd,
    keys: &Keyspace,
    expected: u64,
) -> Result<Topology, ClusterError> {
    let (topology, current) = load_topology(etcd, keys).await?;
    if current != expected {
        return Err(ClusterError::TopologyChanged { expected, current });
    }
    Ok(topology)
}

/// `cluster status`: what etcd says about the cluster now.
pub async fn status(etcd: &Etcd, keys: &Keyspace) -> Result<ClusterStatus, ClusterError> {
    let mirror = Mirror::load(etcd, keys).await?;
    let table = mirror.table(keys);
    if !table.has_topology() {
        return Err(ClusterError::NoCluster {
            cluster: keys.cluster().to_owned(),
        });
    }
    Ok(ClusterStatus::from(&table))
}

/// A cluster's shards, primaries, epochs and standbys (serialised as the
/// `--json` output of `cluster status`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterStatus {
    pub cluster: String,
    /// The topology version.
    pub version: u64,
    pub shards: Vec<ShardRoute>,
    pub moving: Vec<SlotMove>,
}

impl From<&RoutingTable> for ClusterStatus {
    fn from(t: &RoutingTable) -> Self {
        Self {
            cluster: t.cluster().to_owned(),
            version: t.version(),
            shards: t.shards().to_vec(),
            moving: t.moving().to_vec(),
        }
    }
}

impl std::fmt::Display for ClusterStatus {
    /// A table for people: one line per shard.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "cluster {}: {} shards, topology version {}",
            self.cluster,
            self.shards.len(),
            self.version
        )?;
        writeln!(
            f,
            "{:<6} {:<24} {:<22} {:>10}  standbys",
            "shard", "slots", "primary", "epoch"
        )?;
        for shard in &self.shards {
            let slots = shard
                .slots
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let (primary, epoch) = match &shard.primary {
                Some(p) => (p.addr.as_str(), p.epoch.to_string()),
                None => ("(none)", "-".to_owned()),
            };
            let standbys = shard
                .standbys
                .iter()
                .map(|n| n.addr.as_str())
                .collect::<Vec<_>>()
                .join(",");
            writeln!(
                f,
                "{:<6} {:<24} {:<22} {:>10}  {}",
                shard.id,
                slots,
                primary,
                epoch,
                if standbys.is_empty() {
                    "(none)"
                } else {
                    &standbys
                }
            )?;
        }
        for m in &self.moving {
            writeln!(
                f,
                "moving slots {} from shard {} to shard {}",
                m.slots, m.from, m.to
            )?;
        }
        Ok(())
    }
}
