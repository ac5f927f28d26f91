//! The node's view of the cluster: a mirror of every key under the
//! cluster's prefix, kept current by an etcd watch, published as a
//! [`RoutingTable`] the check path reads without calling etcd.
//!
//! The mirror is loaded with one range read (a consistent snapshot at one
//! revision), then a watch from the next revision applies every change in
//! order. When the watch breaks (a member down, no leader, history
//! compacted) the mirror is read again whole and a new watch starts after
//! it, so no change is ever skipped; meanwhile the last table stays
//! published and [`ClusterView::in_sync`] says it may be stale.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::keys::KeyKind;
use super::routing::PrimaryRoute;
use super::{
    ClusterError, Etcd, Keyspace, NodeRecord, PrimaryRecord, RoutingTable, ShardId, Topology,
};
use crate::sync::{AtomicBool, Ordering};

/// Pause before reading etcd again after the watch broke.
const RESYNC_BACKOFF: Duration = Duration::from_millis(200);

/// What etcd holds under the prefix, decoded.
#[derive(Debug, Clone, Default)]
pub(crate) struct Mirror {
    revision: u64,
    topology: Option<(Topology, u64)>,
    nodes: BTreeMap<String, NodeRecord>,
    primaries: BTreeMap<ShardId, PrimaryRoute>,
}

impl Mirror {
    /// Reads every key of the cluster at one revision.
    pub(crate) async fn load(etcd: &Etcd, keys: &Keyspace) -> Result<Self, ClusterError> {
        let answer = etcd
            .call("read the cluster", |mut c| {
                let prefix = keys.prefix().to_owned();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let mut mirror = Mirror {
            revision: answer.header().map_or(0, |h| h.revision()) as u64,
            ..Mirror::default()
        };
        for kv in answer.kvs() {
            mirror.put(keys, kv);
        }
        Ok(mirror)
    }

    fn put(&mut self, keys: &Keyspace, kv: &KeyValue) {
        let key = String::from_utf8_lossy(kv.key());
        let corrupt = |e: serde_json::Error| {
            tracing::error!(key = %key, error = %e, "cluster key does not decode; ignored");
        };
        match keys.parse(kv.key()) {
            Some(KeyKind::Topology) => match serde_json::from_slice::<Topology>(kv.value()) {
                Ok(t) => self.topology = Some((t, kv.mod_revision() as u64)),
                Err(e) => corrupt(e),
            },
            Some(KeyKind::Node(addr)) => match serde_json::from_slice::<NodeRecord>(kv.value()) {
                Ok(n) => {
                    self.nodes.insert(addr, n);
                }
                Err(e) => corrupt(e),
            },
            Some(KeyKind::Primary(shard)) => {
                match serde_json::from_slice::<PrimaryRecord>(kv.value()) {
                    Ok(p) => {
                        self.primaries.insert(
                            shard,
                            PrimaryRoute {
                                addr: p.addr,
                                epoch: kv.create_revision() as u64,
                                lease: p.lease,
                            },
                        );
                    }
                    Err(e) => corrupt(e),
                }
            }
            Some(KeyKind::Other) | None => {}
        }
    }

    fn delete(&mut self, keys: &Keyspace, kv: &KeyValue) {
        match keys.parse(kv.key()) {
            Some(KeyKind::Topology) => self.topology = None,
            Some(KeyKind::Node(addr)) => {
                self.nodes.remove(&addr);
            }
            Some(KeyKind::Primary(shard)) => {
                self.primaries.remove(&shard);
            }
            Some(KeyKind::Other) | None => {}
        }
    }

    pub(crate) fn table(&self, keys: &Keyspace) -> RoutingTable {
        RoutingTable::build(
            keys.cluster(),
            self.topology.as_ref().map(|(t, v)| (t, *v)),
            self.revision,
            |shard| self.primaries.get(&shard).cloned(),
            self.nodes.values(),
        )
    }
}

/// A live view of one cluster, for as long as it is kept.
pub struct ClusterView {
    table: Arc<ArcSwap<RoutingTable>>,
    updates: watch::Receiver<Arc<RoutingTable>>,
    in_sync: Arc<AtomicBool>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = self.table.load();
        f.debug_struct("ClusterView")
            .field("cluster", &table.cluster())
            .field("version", &table.version())
            .field("revision", &table.revision())
            .finish_non_exhaustive()
    }
}

impl ClusterView {
    /// Loads the cluster's state and starts following it. Fails only if
    /// the first read fails; later failures are retried in the background.
    pub async fn start(etcd: Etcd, keys: Keyspace) -> Result<Self, ClusterError> {
        let mirror = Mirror::load(&etcd, &keys).await?;
        let first = Arc::new(mirror.table(&keys));
        let table = Arc::new(ArcSwap::new(first.clone()));
        let (publish, updates) = watch::channel(first);
        let in_sync = Arc::new(AtomicBool::new(true));
        let cancel = CancellationToken::new();
        let follower = Follower {
            etcd,
            keys,
            mirror,
            table: table.clone(),
            publish,
            in_sync: in_sync.clone(),
        };
        let task = tokio::spawn(follower.run(cancel.clone()));
        Ok(Self {
            table,
            updates,
            in_sync,
            cancel,
            task,
        })
    }

    /// The current table (one atomic load; cheap enough per request).
    pub fn table(&self) -> Arc<RoutingTable> {
        self.table.load_full()
    }

    /// A handle the check path can keep: always the latest table.
    pub fn tables(&self) -> Arc<ArcSwap<RoutingTable>> {
        self.table.clone()
    }

    /// Every new table, for tasks that react to changes (elections, moves).
    pub fn subscribe(&self) -> watch::Receiver<Arc<RoutingTable>> {
        self.updates.clone()
    }

    /// False from a broken watch until etcd has been read again: the table
    /// may then lag behind etcd.
    pub fn in_sync(&self) -> bool {
        // Relaxed: a hint for status and metrics, ordered by nothing.
        self.in_sync.load(Ordering::Relaxed)
    }

    /// Waits until the table satisfies `ready` and returns that table.
    pub async fn wait_for(
        &self,
        mut ready: impl FnMut(&RoutingTable) -> bool,
    ) -> Arc<RoutingTable> {
        let mut updates = self.updates.clone();
        let table = updates
            .wait_for(|t| ready(t))
            .await
            .map(|t| t.clone())
            // The sender lives as long as the task, which lives as long as self.
            .unwrap_or_else(|_| self.table());
        table
    }
}

impl Drop for ClusterView {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.task.abort();
    }
}

/// The watch task's state.
struct Follower {
    etcd: Etcd,
    keys: Keyspace,
    mirror: Mirror,
    table: Arc<ArcSwap<RoutingTable>>,
    publish: watch::Sender<Arc<RoutingTable>>,
    in_sync: Arc<AtomicBool>,
}

impl Follower {
    async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                reason = self.follow() => {
                    self.in_sync.store(false, Ordering::Relaxed);
                    tracing::warn!(cluster = self.keys.cluster(), %reason, "cluster watch broke; reading etcd again");
                }
            }
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(RESYNC_BACKOFF) => {}
                }
                match Mirror::load(&self.etcd, &self.keys).await {
                    Ok(mirror) => {
                        self.mirror = mirror;
                        self.publish();
                        self.in_sync.store(true, Ordering::Relaxed);
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "reading the cluster again failed");
                    }
                }
            }
        }
    }

    /// Follows changes after the mirror's revision until the watch breaks;
    /// returns why.
    async fn follow(&mut self) -> String {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(self.mirror.revision as i64 + 1);
        let opened = tokio::time::timeout(
            self.etcd.request_timeout(),
            self.etcd.client().watch(self.keys.prefix(), Some(options)),
        )
        .await;
        let mut stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return format!("opening the watch: {e}"),
            Err(_) => return "opening the watch: no answer in time".into(),
        };
        loop {
            let answer = match stream.message().await {
                Ok(Some(answer)) => answer,
                Ok(None) => return "the watch stream ended".into(),
                Err(e) => return e.to_string(),
            };
            if answer.canceled() {
                return format!(
                    "watch canceled: {} (compacted at {})",
                    answer.cancel_reason(),
                    answer.compact_revision()
                );
            }
            if answer.events().is_empty() {
                continue;
            }
            for event in answer.events() {
                let Some(kv) = event.kv() else { continue };
                match event.event_type() {
                    EventType::Put => self.mirror.put(&self.keys, kv),
                    EventType::Delete => self.mirror.delete(&self.keys, kv),
                }
            }
            if let Some(h) = answer.header() {
                self.mirror.revision = self.mirror.revision.max(h.revision() as u64);
            }
            self.publish();
        }
    }

    fn publish(&self) {
        let table = Arc::new(self.mirror.table(&self.keys));
        self.table.store(table.clone());
        self.publish.send_replace(table);
    }
}
