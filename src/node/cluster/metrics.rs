//! Cluster metrics (`tollgate_cluster_*`): redirects and refusals counted
//! where they happen (one atomic add), the lease, epoch and table read
//! when `/metrics` is scraped.

use super::ClusterMode;
use prometheus::{Gauge, IntCounter, IntGauge, Registry};
use std::time::Instant;

pub(crate) struct ClusterMetrics {
    /// MOVED answers sent.
    pub redirects: IntCounter,
    /// Whole requests answered TryAgain.
    pub try_again: IntCounter,
    /// Slot moves this node carried out (as the source's primary).
    pub slot_moves: IntCounter,
    lease_left: Gauge,
    epoch: IntGauge,
    version: IntGauge,
    in_sync: IntGauge,
    shard: IntGauge,
}

impl ClusterMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        fn add<M: prometheus::core::Collector + Clone + 'static>(
            r: &Registry,
            m: prometheus::Result<M>,
        ) -> prometheus::Result<M> {
            let m = m?;
            r.register(Box::new(m.clone()))?;
            Ok(m)
        }
        Ok(Self {
            redirects: add(
                registry,
                IntCounter::new(
                    "tollgate_cluster_redirects_total",
                    "Requests answered MOVED: their slot is another shard's (or this standby's primary's).",
                ),
            )?,
            try_again: add(
                registry,
                IntCounter::new(
                    "tollgate_cluster_try_again_total",
                    "Requests answered ERROR TryAgain: a slot moving, a shard without primary, or this primary's lease not known valid.",
                ),
            )?,
            slot_moves: add(
                registry,
                IntCounter::new(
                    "tollgate_cluster_slot_moves_total",
                    "Slot moves this node carried out as the source shard's primary.",
                ),
            )?,
            lease_left: add(
                registry,
                Gauge::new(
                    "tollgate_cluster_lease_seconds_left",
                    "Time until this node's etcd lease deadline (last acknowledged renewal + TTL - margin); 0 once passed.",
                ),
            )?,
            epoch: add(
                registry,
                IntGauge::new(
                    "tollgate_cluster_epoch",
                    "The epoch of this node's shard's primary, as etcd holds it (0: none).",
                ),
            )?,
            version: add(
                registry,
                IntGauge::new(
                    "tollgate_cluster_topology_version",
                    "The topology version of this node's routing table.",
                ),
            )?,
            in_sync: add(
                registry,
                IntGauge::new(
                    "tollgate_cluster_watch_in_sync",
                    "1 while the etcd watch feeding the routing table is up, 0 while it is re-read.",
                ),
            )?,
            shard: add(
                registry,
                IntGauge::new("tollgate_cluster_shard", "The shard this node belongs to."),
            )?,
        })
    }
}

impl ClusterMode {
    pub(super) fn refresh_metrics(&self) {
        let m = &self.metrics;
        let deadline = self.member.load();
        let left = deadline.deadline().valid_until().map_or(0.0, |t| {
            t.saturating_duration_since(Instant::now()).as_secs_f64()
        });
        m.lease_left.set(left);
        let table = self.tables.load();
        let epoch = table
            .shard(self.shard)
            .and_then(|s| s.primary.as_ref())
            .map_or(0, |p| p.epoch);
        m.epoch.set(i64::try_from(epoch).unwrap_or(i64::MAX));
        m.version
            .set(i64::try_from(table.version()).unwrap_or(i64::MAX));
        m.in_sync.set(i64::from(self.view.in_sync()));
        m.shard.set(i64::from(self.shard.0));
    }
}
