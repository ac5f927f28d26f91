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
//! - the node's supervisor (`crate::node`) runs beside the listener for
//!   the server's whole life; a connection that sends REPLICATE is handed
//!   over to it whole (socket and unread bytes);
//! - a connection sees only what it needs (`Shared`): its settings, the
//!   store, the clock, the rules, its metric handles and the node handle;
//! - protected mode: `run` refuses a listener bound beyond loopback that
//!   asks for no credentials, unless `--insecure` (the same check as the
//!   settings', on the address actually bound);
//! - decision events (`--events`) are queued by the check path without
//!   waiting; their publisher starts with the server and sends what is
//!   queued after the connections have drained;
//! - with TLS configured every port speaks only TLS, and the certificates
//!   are reloaded (SIGHUP, a file change) without touching open
//!   connections (`tls.rs`).

pub mod admin;
mod admin_listener;
mod auth;
mod check;
mod connection;
mod scrape;
mod status_page;
mod sweeper;
mod tls;

use crate::clock::{Clock, MonotonicClock};
use crate::config::{protected_mode, ConfigError, NetworkSettings, ServerConfig};
use crate::events::{EventMetrics, Events, Publisher};
use crate::node::{Node, NodeParts, Supervisor};
use crate::rules::{LoadError, Rules};
use crate::store::Store;
use crate::throttled::TopThrottled;
use admin::AdminState;
use auth::{AdminAuth, Authenticator};
use check::CheckMetrics;
use connection::{ConnMetrics, ErrorCounters};
use prometheus::Registry;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sweeper::{KeyMetrics, Sweeper};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_protocol::ServerLimits;

pub use tls::{TlsReloadSource, TlsReloader};

/// What every connection task shares.
pub(crate) struct Shared {
    /// Timeouts of the protocol port.
    pub network: NetworkSettings,
    /// What a HELLO's token proves.
    pub auth: Authenticator,
    /// TLS of the protocol port (None: plain TCP).
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// Frame limits, as told to clients in HELLO_OK.
    pub limits: ServerLimits,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// The named rules in force; swapped whole on reload.
    pub rules: Arc<Rules>,
    pub metrics: Metrics,
    /// Keys denied most recently, for `GET /v1/throttled`.
    pub throttled: TopThrottled,
    /// Decision events (`--events`); None when off.
    pub events: Option<Events>,
    /// Who is primary; refusals, status, handovers.
    pub node: Node,
    pub lifecycle: Lifecycle,
}

/// The metric handles connections bump.
pub(crate) struct Metrics {
    pub checks: CheckMetrics,
    pub conns: ConnMetrics,
    pub errors: ErrorCounters,
    /// The most throttled keys, refreshed when `/metrics` is scraped.
    pub throttled_keys: scrape::ThrottledKeysMetric,
}

/// Where the server stands in its shutdown.
pub(crate) struct Lifecycle {
    /// Cancelled when the server starts draining: connections stop reading
    /// new work after answering what they hold.
    pub draining: CancellationToken,
    /// Cancelled when the grace period is over: connections stop at once.
    pub abort: CancellationToken,
}

/// A configured server, ready to run on a listener.
pub struct Server {
    config: ServerConfig,
    shared: Arc<Shared>,
    supervisor: Supervisor,
    sweeper: Sweeper,
    /// One registry per server; each part registered what it bumps.
    registry: Registry,
    admin: Option<TcpListener>,
    /// Reloads the certificates (None without TLS).
    tls: Option<TlsReloader>,
    /// Publishes decision events (`--events`), started by `run`.
    publisher: Option<Publisher>,
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rules: {0}")]
    Rules(#[from] LoadError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("events: {0}")]
    Events(#[from] crate::events::EventsError),
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
        let store = Arc::new(Store::new(config.store_config()));
        let registry = Registry::new();
        let checks = CheckMetrics::register(&registry)?;
        let rules = Rules::load(
            config.rules.file.clone(),
            config.store.max_log_entries,
            checks.checks.clone(),
            &registry,
        )?;
        let metrics = Metrics {
            checks,
            conns: ConnMetrics::register(&registry)?,
            errors: ErrorCounters::register(&registry)?,
            throttled_keys: scrape::ThrottledKeysMetric::register(
                &registry,
                config.admin.throttled_metric_keys,
            )?,
        };
        let tls = match (&config.tls.tls_cert, &config.tls.tls_key) {
            (Some(cert), Some(key)) => {
                Some(Arc::new(crate::tls::Tls::load(crate::tls::TlsPaths {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: config.tls.tls_client_ca.clone(),
                    ca: config.tls.tls_ca.clone(),
                })?))
            }
            _ => None,
        };
        let tls_reloader = tls
            .as_ref()
            .map(|t| TlsReloader::register(t.clone(), &registry))
            .transpose()?;
        let sweeper = Sweeper {
            store: store.clone(),
            clock: clock.clone(),
            metrics: KeyMetrics::register(&registry)?,
            interval: config.store.sweep_interval,
            stripes: config.store.sweep_stripes,
            max_memory: config.store.max_memory,
        };
        let (node, supervisor) = Node::new(
            NodeParts {
                settings: config.replication.clone(),
                // Without a cluster secret (only with --insecure) the
                // client token, if any, gets this node through HELLO.
                secret: config
                    .auth
                    .cluster_secret
                    .clone()
                    .or_else(|| config.auth.auth_token.clone()),
                tls: tls.clone(),
                limits: config.limits.server_limits(),
                advertise: config
                    .replication
                    .advertise
                    .clone()
                    .unwrap_or_else(|| config.network.listen.to_string()),
                store: store.clone(),
                clock: clock.clone(),
            },
            &registry,
        )?;
        let event_metrics = EventMetrics::register(&registry)?;
        let (events, publisher) = match config.events.config() {
            Some(c) => {
                let (events, publisher) = crate::events::channel(c, event_metrics)?;
                (Some(events), Some(publisher))
            }
            None => (None, None),
        };
        let throttled = TopThrottled::new(
            config.admin.throttled_keys,
            config.admin.throttled_window.as_nanos() as u64,
        );
        let shared = Arc::new(Shared {
            network: config.network.clone(),
            auth: Authenticator::new(&config.auth),
            tls,
            limits: config.limits.server_limits(),
            store,
            clock,
            rules: Arc::new(rules),
            metrics,
            throttled,
            events,
            node,
            lifecycle: Lifecycle {
                draining: CancellationToken::new(),
                abort: CancellationToken::new(),
            },
        });
        Ok(Self {
            config,
            shared,
            supervisor,
            sweeper,
            registry,
            admin: None,
            tls: tls_reloader,
            publisher,
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

    /// The certificates, to reload them (the CLI's SIGHUP handler, tests);
    /// None without TLS.
    pub fn tls(&self) -> Option<TlsReloader> {
        self.tls.clone()
    }

    /// Protected mode on the addresses actually bound (see the module
    /// docs).
    fn check_exposure(&self, listener: &TcpListener) -> io::Result<()> {
        let refuse =
            |e: ConfigError| io::Error::new(io::ErrorKind::PermissionDenied, e.to_string());
        let insecure = self.config.auth.insecure;
        let addr = listener.local_addr()?;
        protected_mode(&self.config.protocol_exposure(addr), insecure).map_err(refuse)?;
        if let Some(admin) = &self.admin {
            let addr = admin.local_addr()?;
            protected_mode(&self.config.admin_exposure(addr), insecure).map_err(refuse)?;
        }
        Ok(())
    }

    /// Serves `listener` until `shutdown` is cancelled, then drains.
    pub async fn run(self, listener: TcpListener, shutdown: CancellationToken) -> io::Result<()> {
        self.check_exposure(&listener)?;
        let Self {
            config,
            shared,
            supervisor,
            sweeper,
            registry,
            admin,
            tls,
            publisher,
        } = self;
        if let Ok(addr) = listener.local_addr() {
            shared.node.set_advertise(addr.to_string());
        }
        // Events outlive the connections (their last decisions are sent),
        // so they have their own stop signal, given after the drain.
        let events_stop = CancellationToken::new();
        let grace = config.network.shutdown_grace;
        let publisher = publisher
            .map(|p| tokio::spawn(p.run(shared.node.status().addr, events_stop.clone(), grace)));
        let tracker = TaskTracker::new();
        tracker.spawn(sweeper.run(shutdown.clone()));
        tracker.spawn(supervisor.run(shutdown.clone()));
        if !config.rules.poll.is_zero() {
            tracker.spawn(crate::rules::watch::watch(
                shared.rules.clone(),
                config.rules.poll,
                shutdown.clone(),
            ));
        }
        if let Some(tls) = tls.filter(|_| !config.tls.tls_poll.is_zero()) {
            tracker.spawn(tls.watch(config.tls.tls_poll, shutdown.clone()));
        }
        // The admin server outlives the drain (readyz says "draining"), so
        // it has its own stop signal, given after the connections are done.
        let admin_stop = CancellationToken::new();
        let admin_state = Arc::new(AdminState {
            shared: shared.clone(),
            registry,
            serving: AtomicBool::new(false),
            max_log_entries: config.store.max_log_entries,
            auth: AdminAuth::new(&config.auth),
            max_memory: config.store.max_memory,
            status_refresh: config.admin.status_refresh,
        });
        let admin = admin.map(|l| {
            let acceptor = shared.tls.clone();
            tokio::spawn(admin_listener::serve(
                l,
                acceptor,
                admin_state.clone(),
                admin_stop.clone(),
            ))
        });
        // Release: pairs with the Acquire in readyz, after the set-up above.
        admin_state.serving.store(true, Ordering::Release);

        let permits = Arc::new(Semaphore::new(config.network.max_connections));
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
        tracing::info!(connections = shared.metrics.conns.open.get(), "draining");
        let lifecycle = &shared.lifecycle;
        lifecycle.draining.cancel();
        tracker.close();
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!(
                remaining = tracker.len(),
                "shutdown grace period over, closing remaining connections"
            );
            lifecycle.abort.cancel();
            tracker.wait().await;
        }
        events_stop.cancel();
        if let Some(publisher) = publisher {
            // The publisher bounds its own drain by the grace period.
            if tokio::time::timeout(grace * 2, publisher).await.is_err() {
                tracing::warn!("decision events publisher did not stop in time");
            }
        }
        admin_stop.cancel();
        if let Some(admin) = admin {
            if tokio::time::timeout(grace, admin).await.is_err() {
                tracing::warn!("admin server did not stop in time");
            }
        }
        tracing::info!("stopped");
        Ok(())
    }
}
