//! The expiry sweeper: drops expired keys a few stripes per tick, and keeps
//! the key and memory gauges current (`Store::len` visits every stripe, too
//! slow to run per check).
//!
//! Invariant: one tick visits at most `--sweep-stripes` stripes, so no tick
//! holds locks long, whatever the store's size.

use crate::clock::Clock;
use crate::store::Store;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The sweeper task and what it reads.
pub(crate) struct Sweeper {
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    pub metrics: KeyMetrics,
    /// `--sweep-interval`, `--sweep-stripes`, `--max-memory`.
    pub interval: Duration,
    pub stripes: usize,
    pub max_memory: Option<usize>,
}

/// Keys held and keys expired (`by` = `sweeper` or `access`). Updated by
/// the sweeper tick: `Store::len` visits every stripe, too slow per check.
pub(crate) struct KeyMetrics {
    live: IntGauge,
    expired_swept: prometheus::IntCounter,
    expired_on_access: prometheus::IntCounter,
    /// Live keys evicted and new keys refused at the memory cap.
    evicted: prometheus::IntCounter,
    refused: prometheus::IntCounter,
    /// Bytes the tables reserve, and the cap (0: none).
    memory: IntGauge,
    memory_limit: IntGauge,
    /// Wall clock minus server clock at the last sweeper tick's re-check.
    clock_offset: prometheus::Gauge,
}

impl KeyMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let live = IntGauge::new(
            "tollgate_keys",
            "Keys held by the store (expired ones not yet dropped included); \
             updated every sweeper tick.",
        )?;
        let expired = IntCounterVec::new(
            Opts::new(
                "tollgate_keys_expired_total",
                "Keys dropped because their state expired, by who dropped them.",
            ),
            &["by"],
        )?;
        let evicted = prometheus::IntCounter::new(
            "tollgate_keys_evicted_total",
            "Live keys evicted to stay within --max-memory (--on-full evict).",
        )?;
        let refused = prometheus::IntCounter::new(
            "tollgate_keys_refused_total",
            "New keys refused with StoreFull at --max-memory (--on-full refuse).",
        )?;
        let memory = IntGauge::new(
            "tollgate_memory_bytes",
            "Bytes the counter tables reserve (slots, control bytes, heap keys, logs, leases); \
             updated every sweeper tick.",
        )?;
        let memory_limit = IntGauge::new(
            "tollgate_memory_limit_bytes",
            "The --max-memory cap on tollgate_memory_bytes (0: no cap).",
        )?;
        registry.register(Box::new(live.clone()))?;
        registry.register(Box::new(expired.clone()))?;
        registry.register(Box::new(evicted.clone()))?;
        registry.register(Box::new(refused.clone()))?;
        registry.register(Box::new(memory.clone()))?;
        registry.register(Box::new(memory_limit.clone()))?;
        let clock_offset = prometheus::Gauge::new(
            "tollgate_clock_offset_seconds",
            "Wall clock minus server clock, re-checked every sweeper tick: positive is \
             stepped forward at once, negative is absorbed by running 1/16 slow.",
        )?;
        registry.register(Box::new(clock_offset.clone()))?;
        Ok(Self {
            live,
            expired_swept: expired.with_label_values(&["sweeper"]),
            expired_on_access: expired.with_label_values(&["access"]),
            evicted,
            refused,
            memory,
            memory_limit,
            clock_offset,
        })
    }
}

impl Sweeper {
    /// Sweeps every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.tick();
        }
    }

    fn tick(&self) {
        let store = &self.store;
        let removed = store.sweep(self.stripes, self.clock.now());
        if removed > 0 {
            tracing::trace!(removed, "swept expired keys");
        }
        let keys = &self.metrics;
        if let Some(check) = self.clock.check_wall() {
            keys.clock_offset.set(check.offset as f64 / 1e9);
        }
        keys.expired_swept.inc_by(removed as u64);
        // The store counts expiries met by checks; the counter follows it.
        let on_access = store.expired_on_access();
        keys.expired_on_access
            .inc_by(on_access.saturating_sub(keys.expired_on_access.get()));
        keys.live.set(store.len() as i64);
        keys.memory.set(store.memory_bytes() as i64);
        keys.memory_limit.set(self.max_memory.unwrap_or(0) as i64);
        // The cap at work is worth a log line, once per tick at most.
        let (evicted, refused) = (store.evicted(), store.refused());
        let new_evicted = evicted.saturating_sub(keys.evicted.get());
        let new_refused = refused.saturating_sub(keys.refused.get());
        if new_evicted + new_refused > 0 {
            tracing::warn!(
                evicted = new_evicted,
                refused = new_refused,
                memory = store.memory_bytes(),
                max_memory = self.max_memory,
                "memory cap reached"
            );
        }
        keys.evicted.inc_by(new_evicted);
        keys.refused.inc_by(new_refused);
    }
}
