//! Real `tollgate serve --etcd` processes: a cluster of shards made with
//! `tollgate cluster init`, their nodes, and how to wait for them.

use std::process::Command;

use tollgate::cluster::{status, ClusterStatus, Etcd};
use tollgate_protocol::{Algorithm, CheckBatch, Limit, LimitRef, Pair};

use crate::etcd::EtcdCluster;
use crate::procs::{free_addr, Node, BIN};
use crate::*;

/// The lease settings every node of the tests runs with: etcd's minimum
/// TTL (2 s), so failovers happen within a test.
pub const LEASE_FLAGS: [&str; 10] = [
    "--lease-ttl",
    "2s",
    "--lease-margin",
    "500ms",
    "--lease-renew",
    "500ms",
    "--etcd-timeout",
    "1s",
    "--campaign-delay",
    "2s",
];

/// A cluster's nodes, shard by shard, and the etcd they run on.
pub struct Deployment {
    pub etcd: EtcdCluster,
    pub client: Etcd,
    pub name: String,
    /// `nodes[s]`: the nodes of shard `s`.
    pub nodes: Vec<Vec<Node>>,
    /// The lease flags every node runs with.
    lease_flags: Vec<String>,
}

/// Runs the `tollgate` binary with `args`; its exit code and output.
pub fn tollgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().expect("run tollgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Deployment {
    /// `tollgate cluster init` of `shards` shards, then `per_shard` nodes
    /// of each (started one shard after the other), waiting until every
    /// shard has a primary and its standbys are in sync (`per_shard` 0:
    /// none started, `nodes` left empty for the caller to fill).
    pub async fn start(etcd: EtcdCluster, name: &str, shards: u16, per_shard: usize) -> Self {
        Self::start_with(etcd, name, shards, per_shard, &LEASE_FLAGS).await
    }

    /// [`start`](Self::start) with other lease flags than [`LEASE_FLAGS`].
    pub async fn start_with(
        etcd: EtcdCluster,
        name: &str,
        shards: u16,
        per_shard: usize,
        lease_flags: &[&str],
    ) -> Self {
        Self::start_each(etcd, name, shards, per_shard, lease_flags, |_| Vec::new()).await
    }

    /// [`start_with`](Self::start_with), each node of shard `s` also given
    /// the flags `extra(s)` returns (called once per node).
    pub async fn start_each(
        etcd: EtcdCluster,
        name: &str,
        shards: u16,
        per_shard: usize,
        lease_flags: &[&str],
        mut extra: impl FnMut(u16) -> Vec<String>,
    ) -> Self {
        let endpoints = etcd.endpoints().join(",");
        let (code, out, err) = tollgate(&[
            "cluster",
            "init",
            "--etcd",
            &endpoints,
            "--cluster",
            name,
            "--shards",
            &shards.to_string(),
        ]);
        assert_eq!(code, 0, "cluster init: {out}{err}");
        let client = connect(etcd.endpoints()).await;
        let mut deployment = Deployment {
            etcd,
            client,
            name: name.to_owned(),
            nodes: Vec::new(),
            lease_flags: lease_flags.iter().map(|s| s.to_string()).collect(),
        };
        // None per shard: the caller spawns them (with flags of its own).
        for shard in (0..shards).filter(|_| per_shard > 0) {
            let nodes = (0..per_shard)
                .map(|_| {
                    let extra = extra(shard);
                    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                    deployment.spawn(shard, &extra)
                })
                .collect();
            deployment.nodes.push(nodes);
        }
        deployment.settled().await;
        deployment
    }

    /// The flags of a node of `shard`.
    pub fn flags(&self, shard: u16) -> Vec<String> {
        let mut flags: Vec<String> = [
            "--etcd",
            &self.etcd.endpoints().join(","),
            "--cluster",
            &self.name,
            "--shard",
            &shard.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        flags.extend(self.lease_flags.iter().cloned());
        flags
    }

    /// Starts a node of `shard` with `extra` flags.
    pub fn spawn(&self, shard: u16, extra: &[&str]) -> Node {
        let mut flags = self.flags(shard);
        flags.extend(extra.iter().map(|s| s.to_string()));
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        Node::start(&free_addr(), &flags)
    }

    /// What etcd says about the cluster now.
    pub async fn status(&self) -> ClusterStatus {
        status(&self.client, &keys(&self.name))
            .await
            .expect("cluster status")
    }

    /// Waits until every shard has a primary among its running nodes, and
    /// every other running node of the shard is a standby in sync with it.
    pub async fn settled(&self) -> ClusterStatus {
        eventually("every shard has a primary and synced standbys", || async {
            let s = self.status().await;
            for (shard, nodes) in s.shards.iter().zip(&self.nodes) {
                let primary = shard.primary.as_ref()?;
                for node in nodes.iter().filter(|n| n.running()) {
                    if node.addr == primary.addr {
                        continue;
                    }
                    let st = crate::procs::status(&node.addr).await?;
                    if st.primary != primary.addr || st.field("synced") != Some(1) {
                        return None;
                    }
                }
            }
            Some(s)
        })
        .await
    }

    /// The node of `shard` etcd names as its primary now.
    pub async fn primary(&self, shard: usize) -> &Node {
        let status = self.status().await;
        let addr = &status.shards[shard]
            .primary
            .as_ref()
            .expect("a primary")
            .addr;
        self.nodes[shard]
            .iter()
            .find(|n| &n.addr == addr)
            .expect("the primary is one of the shard's nodes")
    }

    /// A node of `shard` other than its primary.
    pub async fn standby(&self, shard: usize) -> &Node {
        let primary = self.primary(shard).await.addr.clone();
        self.nodes[shard]
            .iter()
            .find(|n| n.addr != primary)
            .expect("the shard has a standby")
    }

    /// `tollgate cluster move-slots --slots RANGE --to SHARD`, which must
    /// succeed; its output.
    pub fn move_slots(&self, range: &str, to: u16) -> String {
        let (code, out, err) = tollgate(&[
            "cluster",
            "move-slots",
            "--etcd",
            &self.etcd.endpoints().join(","),
            "--cluster",
            &self.name,
            "--slots",
            range,
            "--to",
            &to.to_string(),
            "--timeout",
            "30s",
        ]);
        assert_eq!(code, 0, "move-slots {range} to {to}: {out}{err}");
        out
    }

    /// Every node's address and its shard.
    pub fn node_shards(&self) -> std::collections::HashMap<String, u16> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(s, nodes)| nodes.iter().map(move |n| (n.addr.clone(), s as u16)))
            .collect()
    }

    /// Every node's address.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .flatten()
            .map(|n| n.addr.clone())
            .collect()
    }
}

/// The limit the routing and move tests charge: 100 units that come back
/// one per hour, so `remaining` counts charges.
pub const LIMIT: Limit = Limit {
    algorithm: Algorithm::TokenBucket,
    count: 1,
    period_ms: 3_600_000,
    burst: 100,
};

/// A CHECK-shaped batch: one check per key, cost 1, under [`LIMIT`].
pub fn batch(keys: &[&str]) -> CheckBatch {
    let mut batch = CheckBatch::default();
    for key in keys {
        batch.push(Pair {
            key: key.as_bytes().to_vec().into(),
            limit: LimitRef::Inline(LIMIT),
            cost: 1,
        });
    }
    batch
}

/// Keys spread over every slot: `rl:{k<i>}:x`.
pub fn keys_named(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("rl:{{{prefix}{i}}}:x")).collect()
}
