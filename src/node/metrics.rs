//! Replication metrics (`tollgate_replication_*`), read from the node's and
//! the store's counters when `/metrics` is scraped.
//!
//! The numbers themselves live where they change (the role state's `Stats`, the
//! store's capture counters) as plain atomics, so the request path and the
//! replication task never touch the registry; [`ReplMetrics::refresh`]
//! copies them in (counters move by the difference since the last scrape).

use super::shared::Core;
use super::status::lag_ms;
use prometheus::{Gauge, IntCounter, IntGauge, Registry};
use std::sync::atomic::Ordering;
use tollgate_protocol::Role;

pub(crate) struct ReplMetrics {
    gauges: ReplGauges,
    counters: ReplCounters,
}

/// Where the stream stands, set to the current value at each scrape.
struct ReplGauges {
    primary: IntGauge,
    epoch: IntGauge,
    offset: IntGauge,
    replica_offset: IntGauge,
    lag_offsets: IntGauge,
    lag_seconds: Gauge,
    synced: IntGauge,
    replica_connected: IntGauge,
    buffered: IntGauge,
    backlog_bytes: IntGauge,
}

/// What happened to the stream, moved by the difference at each scrape.
struct ReplCounters {
    full_syncs: IntCounter,
    stripe_resyncs: IntCounter,
    overflows: IntCounter,
    backlog_resets: IntCounter,
    promotions: IntCounter,
    role_changes: IntCounter,
}

impl ReplMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            gauges: ReplGauges::register(registry)?,
            counters: ReplCounters::register(registry)?,
        })
    }

    /// Copies the current numbers in (before `/metrics` is gathered).
    pub fn refresh(&self, core: &Core) {
        let node = &core.role;
        let stats = &node.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let gauge = |g: &IntGauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        let counter = |c: &IntCounter, v: u64| c.inc_by(v.saturating_sub(c.get()));
        let view = node.view();
        let capture = core.store.capture_stats();
        let Self {
            gauges: g,
            counters: c,
        } = self;
        gauge(&g.primary, u64::from(view.role == Role::Primary));
        gauge(&g.epoch, view.epoch);
        gauge(&g.offset, node.offset());
        gauge(&g.synced, u64::from(view.synced));
        gauge(&g.replica_connected, get(&stats.replica_connected));
        gauge(&g.replica_offset, get(&stats.replica_offset));
        gauge(&g.buffered, capture.buffered as u64);
        gauge(&g.backlog_bytes, get(&stats.backlog_bytes));
        match view.role {
            Role::Primary => {
                let behind = node.offset().saturating_sub(get(&stats.replica_offset));
                gauge(&g.lag_offsets, behind);
                g.lag_seconds.set(0.0);
            }
            Role::Standby => {
                let behind = get(&stats.primary_offset).saturating_sub(node.offset());
                gauge(&g.lag_offsets, behind);
                g.lag_seconds.set(lag_ms(core) as f64 / 1000.0);
            }
        }
        counter(&c.full_syncs, get(&stats.full_syncs));
        counter(&c.stripe_resyncs, capture.stripe_resyncs);
        counter(&c.overflows, capture.overflows);
        counter(&c.backlog_resets, get(&stats.backlog_resets));
        counter(&c.promotions, get(&stats.promotions));
        counter(&c.role_changes, get(&stats.role_changes));
    }
}

impl ReplGauges {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        fn gauge(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(name, help)?;
            r.register(Box::new(g.clone()))?;
            Ok(g)
        }
        let lag_seconds = Gauge::new(
            "tollgate_replication_lag_seconds",
            "Standby: how far behind the primary its copy is, in seconds of the primary's \
             clock (clock skew between the hosts included); 0 on a primary.",
        )?;
        registry.register(Box::new(lag_seconds.clone()))?;
        Ok(Self {
            primary: gauge(
                registry,
                "tollgate_replication_primary",
                "1 while this node is primary, 0 while it is a standby.",
            )?,
            epoch: gauge(
                registry,
                "tollgate_replication_epoch",
                "Replication epoch of this node (a standby: its primary's).",
            )?,
            offset: gauge(
                registry,
                "tollgate_replication_offset",
                "Primary: the last stream offset numbered. Standby: the last one applied.",
            )?,
            replica_offset: gauge(
                registry,
                "tollgate_replication_replica_offset",
                "Primary: the offset its standby last acknowledged.",
            )?,
            lag_offsets: gauge(
                registry,
                "tollgate_replication_lag_offsets",
                "Stream frames the standby has not applied yet (seen from either side).",
            )?,
            lag_seconds,
            synced: gauge(
                registry,
                "tollgate_replication_synced",
                "1 when this node holds a complete copy (a primary always does).",
            )?,
            replica_connected: gauge(
                registry,
                "tollgate_replication_replica_connected",
                "Primary: 1 while a standby is attached.",
            )?,
            buffered: gauge(
                registry,
                "tollgate_replication_buffered_changes",
                "Changed keys waiting in the stripes' change buffers.",
            )?,
            backlog_bytes: gauge(
                registry,
                "tollgate_replication_backlog_bytes",
                "Bytes of recent stream frames kept for standbys that reconnect.",
            )?,
        })
    }
}

impl ReplCounters {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        }
        Ok(Self {
            full_syncs: counter(
                registry,
                "tollgate_replication_full_syncs_total",
                "Full syncs (primary: sent; standby: received).",
            )?,
            stripe_resyncs: counter(
                registry,
                "tollgate_replication_stripe_resyncs_total",
                "Stripes sent whole because their change buffer overflowed.",
            )?,
            overflows: counter(
                registry,
                "tollgate_replication_buffer_overflows_total",
                "Times a stripe's change buffer hit --repl-buffer-cap and was dropped.",
            )?,
            backlog_resets: counter(
                registry,
                "tollgate_replication_backlog_resets_total",
                "Times the backlog was dropped because the last standby could no longer resume.",
            )?,
            promotions: counter(
                registry,
                "tollgate_replication_promotions_total",
                "Times this node was promoted to primary.",
            )?,
            role_changes: counter(
                registry,
                "tollgate_replication_role_changes_total",
                "Times this node changed role.",
            )?,
        })
    }
}
