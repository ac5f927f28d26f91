//! Metrics of the usage exchange (`tollgate_region_*`), bumped where the
//! exchange happens; per-peer series carry the peer region as `peer`.

use prometheus::{GaugeVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

pub(super) struct RegionMetrics {
    by_peer: ByPeer,
    pub capped: IntCounter,
    pub ceiling_activations: IntCounter,
    pub ceiling_denied: IntCounter,
    pub cut_off: IntGauge,
}

/// The per-peer series, labelled `peer`: [`RegionMetrics::peer`] takes
/// one peer's handles from them.
struct ByPeer {
    lag: GaugeVec,
    keys_sent: IntCounterVec,
    keys_received: IntCounterVec,
    units_imported: IntCounterVec,
    skipped: IntCounterVec,
    send_failures: IntCounterVec,
    entries_dropped: IntCounterVec,
    units_dropped: IntCounterVec,
}

/// One peer's handles.
pub(super) struct PeerMetrics {
    pub lag: prometheus::Gauge,
    pub keys_sent: IntCounter,
    pub keys_received: IntCounter,
    pub units_imported: IntCounter,
    pub skipped: IntCounter,
    pub send_failures: IntCounter,
    pub entries_dropped: IntCounter,
    pub units_dropped: IntCounter,
}

impl RegionMetrics {
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        fn counter(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(name, help)?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        }
        let by_peer = ByPeer::register(r)?;
        let cut_off = IntGauge::new(
            "tollgate_region_cut_off",
            "1 while the region is cut off (the exchange stalled with most peer regions, \
             or any under --region-cut-off any): rules listing every region are capped at \
             this region's ceiling.",
        )?;
        r.register(Box::new(cut_off.clone()))?;
        Ok(Self {
            by_peer,
            capped: counter(
                r,
                "tollgate_region_messages_capped_total",
                "USAGE messages that hit exchange-max-bytes: the keys left over went in a \
                 later message.",
            )?,
            ceiling_activations: counter(
                r,
                "tollgate_region_ceiling_activations_total",
                "Times the region was cut off and the ceiling came into force for rules \
                 listing every region.",
            )?,
            ceiling_denied: counter(
                r,
                "tollgate_region_ceiling_denied_total",
                "Checks denied by this region's ceiling while their rule was capped.",
            )?,
            cut_off,
        })
    }

    pub fn peer(&self, name: &str) -> PeerMetrics {
        PeerMetrics {
            lag: self.by_peer.lag.with_label_values(&[name]),
            keys_sent: self.by_peer.keys_sent.with_label_values(&[name]),
            keys_received: self.by_peer.keys_received.with_label_values(&[name]),
            units_imported: self.by_peer.units_imported.with_label_values(&[name]),
            skipped: self.by_peer.skipped.with_label_values(&[name]),
            send_failures: self.by_peer.send_failures.with_label_values(&[name]),
            entries_dropped: self.by_peer.entries_dropped.with_label_values(&[name]),
            units_dropped: self.by_peer.units_dropped.with_label_values(&[name]),
        }
    }
}

impl ByPeer {
    fn register(r: &Registry) -> prometheus::Result<Self> {
        fn per_peer(r: &Registry, name: &str, help: &str) -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(name, help), &["peer"])?;
            r.register(Box::new(c.clone()))?;
            Ok(c)
        }
        let lag = GaugeVec::new(
            Opts::new(
                "tollgate_region_sync_lag_seconds",
                "Time since the usage exchange with a peer region last worked both ways \
                 (its answer to our USAGE, its USAGE to us), by peer.",
            ),
            &["peer"],
        )?;
        r.register(Box::new(lag.clone()))?;
        Ok(Self {
            lag,
            keys_sent: per_peer(
                r,
                "tollgate_region_keys_sent_total",
                "Key entries sent to a peer region in answered USAGE messages.",
            )?,
            keys_received: per_peer(
                r,
                "tollgate_region_keys_received_total",
                "Key entries received from a peer region and applied.",
            )?,
            units_imported: per_peer(
                r,
                "tollgate_region_usage_imported_total",
                "Units charged here for usage made in a peer region.",
            )?,
            skipped: per_peer(
                r,
                "tollgate_region_entries_skipped_total",
                "Entries from a peer region not applied (no such global rule listing it, \
                 an algorithm that cannot be global, a full store).",
            )?,
            send_failures: per_peer(
                r,
                "tollgate_region_send_failures_total",
                "USAGE messages to a peer region that failed (connection, timeout, refusal).",
            )?,
            entries_dropped: per_peer(
                r,
                "tollgate_region_entries_dropped_total",
                "Usage records of keys new to a peer region's journal dropped because it \
                 held --region-journal-max-bytes (one per check or refund).",
            )?,
            units_dropped: per_peer(
                r,
                "tollgate_region_usage_dropped_total",
                "Units (charged and refunded) never reported to a peer region because its \
                 journal was full.",
            )?,
        })
    }
}
