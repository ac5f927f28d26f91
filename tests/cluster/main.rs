//! Cluster mode's control plane against real etcd members on loopback
//! (feature `cluster`): `cluster init` and `status`, topology changes
//! conditioned on the version, the watch-fed routing table, elections and
//! their fencing epochs, a primary's lease deadline when it is cut off
//! from etcd, when etcd loses quorum and when etcd's leader is killed.
//!
//! No timing is asserted: waits are event-driven with generous deadlines.
//! The only comparisons of instants are safety properties (a node's
//! deadline passed before anyone else was elected), measured on one
//! monotonic clock.

mod control;
mod etcd;
mod faults;
#[allow(dead_code)] // `sever` is for the replication tests
#[path = "../replication/proxy.rs"]
mod proxy;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::cluster::{Etcd, EtcdSettings, Keyspace, Member, NodeRecord, ShardId};

/// Bound for anything that should happen within a few lease TTLs.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Short leases so failovers happen within a test: etcd's minimum TTL
/// (2 s with its default election timeout), renewed every 500 ms.
pub fn settings(endpoints: Vec<String>) -> EtcdSettings {
    EtcdSettings {
        lease_ttl: Duration::from_secs(2),
        lease_margin: Duration::from_millis(500),
        keepalive_interval: Duration::from_millis(500),
        request_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..EtcdSettings::new(endpoints)
    }
}

pub async fn connect(endpoints: Vec<String>) -> Etcd {
    Etcd::connect(&settings(endpoints))
        .await
        .expect("etcd client")
}

pub fn keys(cluster: &str) -> Keyspace {
    Keyspace::new(cluster).expect("a valid cluster name")
}

pub async fn join(etcd: &Etcd, keys: &Keyspace, addr: &str, shard: u16) -> Member {
    join_with(etcd, keys, addr, shard, &settings(vec!["unused".into()])).await
}

pub async fn join_with(
    etcd: &Etcd,
    keys: &Keyspace,
    addr: &str,
    shard: u16,
    settings: &EtcdSettings,
) -> Member {
    Member::join(
        etcd.clone(),
        keys.clone(),
        NodeRecord {
            addr: addr.to_owned(),
            shard: ShardId(shard),
            admin: None,
        },
        settings,
    )
    .await
    .unwrap_or_else(|e| panic!("{addr} joins shard {shard}: {e}"))
}

/// Polls `probe` every 50 ms until it returns `Some`, for up to
/// [`PATIENCE`]; panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `step` with [`PATIENCE`] as its deadline.
pub async fn within<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, step)
        .await
        .unwrap_or_else(|_| panic!("gave up waiting: {what}"))
}
