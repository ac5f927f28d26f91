//! The network server: accept loop, connection tasks, sweeper, shutdown.
//!
//! [`Server::run`] takes an already bound listener and a [`CancellationToken`],
//! so tests bind port 0 and drive shutdown themselves. Invariants:
//! - a connection permit is taken *before* `accept`, so at most
//!   `max_connections` are served and the rest wait in the kernel's queue;
//! - one task per connection; a bad client can only end its own task;
//! - on shutdown the listener closes first, then every connection answers
//!   what it has already received and closes; after `shutdown_grace` the
//!   stragglers are cut off;
//! - the admin HTTP server (when given a listener) runs beside the protocol
//!   listener, reports not-ready from the moment draining starts, and stops
//!   last;
//! - one metrics [`Registry`] per server; each part registers the metrics it
//!   bumps, next to the code that bumps them.
//! - one replication task (`repl::supervise`) runs beside the listener for
//!   the server's whole life; a connection that sends REPLICATE is handed
//!   over to it whole (socket and unread bytes).

pub mod admin;
mod check;
mod connection;

use crate::clock::{Clock, MonotonicClock};
use crate::config::ServerConfig;
use crate::repl::node::Node;
use crate::repl::primary::Handover;
use crate::rules::{LoadError, Rules};
use crate::store::{Store, StoreConfig};
use crate::throttled::TopThrottled;
use check::CheckMetrics;
use connection::{ConnMetrics, ErrorCounters};
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_protocol::Role;

/// What every connection task shares.
pub(crate) struct Shared {
    pub config: ServerConfig,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// The named rules in force; swapped whole on reload.
    pub rules: Arc<Rules>,
    pub metrics: Metrics,
    /// Keys denied most recently, for `GET /v1/throttled`.
    pub throttled: TopThrottled,
    /// Set once the server serves (listener and rules in place); read by
    /// `/readyz` together with `draining`.
    pub serving: AtomicBool,
    /// Role, epoch and replication state of this node.
    pub node: Node,
    /// REPLICATE connections, to the replication task.
    pub handovers: mpsc::Sender<Handover>,
    /// Cancelled when the server starts draining: connections stop reading
    /// new work after answering what they hold.
    pub draining: CancellationToken,
    /// Cancelled when the grace period is over: connections stop at once.
    pub abort: CancellationToken,
}

/// The server's metrics: one registry, and the handles each part bumps.
pub(crate) struct Metrics {
    pub registry: Registry,
    pub checks: CheckMetrics,
    pub conns: ConnMetrics,
    pub errors: ErrorCounters,
    pub keys: KeyMetrics,
    pub repl: crate::repl::metrics::ReplMetrics,
}

/// A configured server, ready to run on a listener.
pub struct Server {
    shared: Arc<Shared>,
    admin: Option<TcpListener>,
    handovers: mpsc::Receiver<Handover>,
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rules: {0}")]
    Rules(#[from] LoadError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

impl Server {
    /// A server on the production clock. Loads the rules file if one is
    /// configured: bad rules stop the server here, with the file, line and
    /// reason.
    pub fn new(config: ServerConfig) -> Result<Self, StartError> {
        Self::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// A server whose time comes from `clock` (tests pass a manual clock).
    pub fn with_clock(config: ServerConfig, clock: Arc<dyn Clock>) -> Result<Self, StartError> {
        let store = Arc::new(Store::new(StoreConfig {
            stripes: config.stripes,
            max_group: usize::from(config.max_group),
            max_log_entries: config.max_log_entries,
            max_memory: config.max_memory,
            on_full: config.on_full.into(),
            change_buffer_cap: config.repl_buffer_cap,
        }));
        let registry = Registry::new();
        let checks = CheckMetrics::register(&registry)?;
        let rules = Rules::load(
            config.rules.clone(),
            config.max_log_entries,
            checks.checks.clone(),
            &registry,
        )?;
        let metrics = Metrics {
            checks,
            conns: ConnMetrics::register(&registry)?,
            errors: ErrorCounters::register(&registry)?,
            keys: KeyMetrics::register(&registry)?,
            repl: crate::repl::metrics::ReplMetrics::register(&registry)?,
            registry,
        };
        let throttled = TopThrottled::new(
            config.throttled_keys,
            config.throttled_window.as_nanos() as u64,
        );
        // A node with a peer asks it before taking any role (repl::peer).
        let (role, primary) = match (&config.replica_of, &config.peer) {
            (Some(p), _) => (Role::Standby, Some(p.clone())),
            (None, Some(_)) => (Role::Standby, None),
            (None, None) => (Role::Primary, None),
        };
        let advertise = config
            .advertise
            .clone()
            .unwrap_or_else(|| config.listen.to_string());
        let node = Node::new(role, primary, advertise);
        let (handover_tx, handovers) = mpsc::channel(4);
        Ok(Self {
            shared: Arc::new(Shared {
                config,
                store,
                clock,
                rules: Arc::new(rules),
                metrics,
                throttled,
                serving: AtomicBool::new(false),
                node,
                handovers: handover_tx,
                draining: CancellationToken::new(),
                abort: CancellationToken::new(),
            }),
            admin: None,
            handovers,
        })
    }

    /// Serves the admin HTTP API on `listener` too, while the server runs.
    pub fn with_admin(mut self, listener: TcpListener) -> Self {
        self.admin = Some(listener);
        self
    }

    /// The store, for inspection (tests).
    pub fn store(&self) -> Arc<Store> {
        self.shared.store.clone()
    }

    /// The rules, to reload them (the CLI's SIGHUP handler, tests).
    pub fn rules(&self) -> Arc<Rules> {
        self.shared.rules.clone()
    }

    /// Serves `listener` until `shutdown` is cancelled, then drains.
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) -> io::Result<()> {
        let shared = self.shared;
        if shared.config.advertise.is_none() {
            if let Ok(addr) = listener.local_addr() {
                shared.node.set_advertise(addr.to_string());
            }
        }
        let tracker = TaskTracker::new();
        tracker.spawn(sweep(shared.clone(), shutdown.clone()));
        tracker.spawn(crate::repl::supervise(
            shared.clone(),
            self.handovers,
            shutdown.clone(),
        ));
        if !shared.config.rules_poll.is_zero() {
            tracker.spawn(crate::rules::watch::watch(
                shared.rules.clone(),
                shared.config.rules_poll,
                shutdown.clone(),
            ));
        }
        // The admin server outlives the drain (readyz says "draining"), so
        // it has its own stop signal, given after the connections are done.
        let admin_stop = CancellationToken::new();
        let admin = self
            .admin
            .map(|l| tokio::spawn(admin::serve(l, shared.clone(), admin_stop.clone())));
        // Release: pairs with the Acquire in readyz, after the set-up above.
        shared.serving.store(true, Ordering::Release);

        let permits = Arc::new(Semaphore::new(shared.config.max_connections));
        let mut accept_backoff = Duration::from_millis(5);
        loop {
            let permit = tokio::select! {
                _ = shutdown.cancelled() => break,
                p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            };
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = listener.accept() => match r {
                    Ok(conn) => conn,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning;
                        // the server stays up for the connections it has.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(accept_backoff).await;
                        accept_backoff = (accept_backoff * 2).min(Duration::from_secs(1));
                        continue;
                    }
                },
            };
            accept_backoff = Duration::from_millis(5);
            let shared = shared.clone();
            tracker.spawn(async move {
                let _permit = permit;
                connection::serve(stream, peer, shared).await;
            });
        }

        drop(listener);
        // The sweeper and the replication task are not connections.
        tracing::info!(connections = tracker.len().saturating_sub(2), "draining");
        shared.draining.cancel();
        tracker.close();
        if tokio::time::timeout(shared.config.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = tracker.len(),
                "shutdown grace period over, closing remaining connections"
            );
            shared.abort.cancel();
            tracker.wait().await;
        }
        admin_stop.cancel();
        if let Some(admin) = admin {
            if tokio::time::timeout(shared.config.shutdown_grace, admin)
                .await
                .is_err()
            {
                tracing::warn!("admin server did not stop in time");
            }
        }
        tracing::info!("stopped");
        Ok(())
    }
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
    fn register(registry: &Registry) -> prometheus::Result<Self> {
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

/// Drops expired keys a few stripes per tick, so no tick holds locks long.
async fn sweep(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(shared.config.sweep_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let removed = shared
            .store
            .sweep(shared.config.sweep_stripes, shared.clock.now());
        if removed > 0 {
            tracing::trace!(removed, "swept expired keys");
        }
        let keys = &shared.metrics.keys;
        if let Some(check) = shared.clock.check_wall() {
            keys.clock_offset.set(check.offset as f64 / 1e9);
        }
        keys.expired_swept.inc_by(removed as u64);
        // The store counts expiries met by checks; the counter follows it.
        let on_access = shared.store.expired_on_access();
        keys.expired_on_access
            .inc_by(on_access.saturating_sub(keys.expired_on_access.get()));
        keys.live.set(shared.store.len() as i64);
        keys.memory.set(shared.store.memory_bytes() as i64);
        keys.memory_limit
            .set(shared.config.max_memory.unwrap_or(0) as i64);
        // The cap at work is worth a log line, once per tick at most.
        let (evicted, refused) = (shared.store.evicted(), shared.store.refused());
        let new_evicted = evicted.saturating_sub(keys.evicted.get());
        let new_refused = refused.saturating_sub(keys.refused.get());
        if new_evicted + new_refused > 0 {
            tracing::warn!(
                evicted = new_evicted,
                refused = new_refused,
                memory = shared.store.memory_bytes(),
                max_memory = shared.config.max_memory,
                "memory cap reached"
            );
        }
        keys.evicted.inc_by(new_evicted);
        keys.refused.inc_by(new_refused);
    }
}
