//! What every cluster test (and the cluster benchmark, which includes
//! this file) shares: short lease settings, an etcd client, waiting.

use std::future::Future;
use std::time::Duration;

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

/// [`join`], asked again while etcd does not answer: right after a fault
/// a request may time out once, and a node retries its join as well.
pub async fn join_when_etcd_answers(
    etcd: &Etcd,
    keys: &Keyspace,
    addr: &str,
    shard: u16,
) -> Member {
    let settings = settings(vec!["unused".into()]);
    eventually(&format!("{addr} joins shard {shard}"), || async {
        let record = NodeRecord {
            addr: addr.to_owned(),
            shard: ShardId(shard),
            admin: None,
        };
        Member::join(etcd.clone(), keys.clone(), record, &settings)
            .await
            .ok()
    })
    .await
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

/// Polls `probe` until it returns `Some`, for up to [`PATIENCE`]; panics
/// with `what` otherwise (the replication tests' helper).
pub use crate::procs::eventually;

/// The body of `GET path` on `addr` (an admin API, etcd's /metrics), or
/// None when it does not answer.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    tollgate::admin_client::call(addr, hyper::Method::GET, path, None, Duration::from_secs(5))
        .await
        .ok()
        .map(|a| a.text())
}

/// Runs `step` with [`PATIENCE`] as its deadline.
pub async fn within<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, step)
        .await
        .unwrap_or_else(|_| panic!("gave up waiting: {what}"))
}
