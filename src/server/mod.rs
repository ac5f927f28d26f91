//! The network server: accept loop, connection tasks (the ports over the
//! check engine, `crate::engine`), shutdown (`run.rs`).
//!
//! [`Server::run`] takes an already bound listener and a
//! [`CancellationToken`](tokio_util::sync::CancellationToken), so tests
//! bind port 0 and drive shutdown themselves. Invariants:
//! - every connection is accepted, then admitted or refused
//!   (`admission.rs`): at most `max_connections` are served, at most
//!   `max_connections_per_ip` from one address; when full the quietest
//!   connection makes room if it has been quiet long enough, else the
//!   newcomer is answered TooManyConnections and closed, so nobody waits
//!   silently in the kernel's queue (whose length is `--backlog`,
//!   `listener.rs`);
//! - partial frames larger than a connection's own read buffer draw on one
//!   budget, `--max-connection-memory` (`budget.rs`);
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
//! - a connection sees only what it needs (`Shared`): its settings, its
//!   metric handles and the engine (`crate::engine`: the store, the clock,
//!   the rules, the node handle), which decides every check; no port
//!   reaches the store or an algorithm but through it;
//! - protected mode: `run` refuses a listener bound beyond loopback that
//!   asks for no credentials, unless `--insecure` (the same check as the
//!   settings', on the address actually bound);
//! - decision events (`--events`) are queued by the engine without
//!   waiting; their publisher starts with the server and sends what is
//!   queued after the connections have drained;
//! - with TLS configured every port speaks only TLS, and the certificates
//!   are reloaded (SIGHUP, a file change) without touching open
//!   connections (`tls.rs`);
//! - the drop-in front ends (`resp/`, `envoy/`), when given listeners, run
//!   beside the protocol port on the same `Shared`: the same credentials,
//!   protected mode, TLS, connection admission, node admission and check
//!   path; they translate, they decide nothing of their own.

pub mod admin;
mod admin_guard;
mod admin_listener;
mod admission;
mod auth;
mod budget;
mod conn_metrics;
mod connection;
#[cfg(feature = "envoy")]
mod envoy;
mod frontend;
mod handshake;
mod listener;
mod resp;
mod run;
mod scrape;
mod status_page;
mod stop;
mod tls;

use crate::clock::{Clock, MonotonicClock};
use crate::config::{
    protected_mode, ConfigError, Exposure, FrontendSettings, NetworkSettings, ServerConfig,
};
use crate::engine::{BuildError, Built, Engine, Setup, Store, Sweeper};
use crate::events::Publisher;
#[cfg(feature = "cluster")]
use crate::node::Membership;
use crate::node::Supervisor;
use crate::rules::{LoadError, Rules};
use admission::Admission;
use auth::Authenticator;
use budget::Budget;
use conn_metrics::ConnMetrics;
use frontend::FrontendMetrics;
use prometheus::Registry;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use stop::Stop;
use tokio::net::TcpListener;
use tollgate_protocol::{ClusterTopology, ServerLimits};

pub use listener::bind;
pub use tls::{TlsReloadSource, TlsReloader};

/// What every connection task shares: the transport's settings and
/// state, and the engine that decides the checks.
pub(crate) struct Shared {
    /// Timeouts of the protocol port.
    pub network: NetworkSettings,
    /// What a HELLO's token proves.
    pub auth: Authenticator,
    /// TLS of the protocol port (None: plain TCP).
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// Frame limits, as told to clients in HELLO_OK.
    pub limits: ServerLimits,
    /// The drop-in front ends' settings.
    pub frontends: FrontendSettings,
    /// Longest argument of a RESP command.
    pub resp_max_arg_len: usize,
    /// Cap on a sliding log's or a concurrency limit's count (inline
    /// limits of the front ends are validated against it).
    pub max_log_entries: u64,
    /// Memory for frames larger than a connection's own read buffer.
    pub budget: Arc<Budget>,
    pub metrics: Metrics,
    pub lifecycle: Lifecycle,
    /// The store, the rules, the clock, the node: everything that decides.
    pub engine: Engine,
}

impl Shared {
    /// The slot map this node answers TOPOLOGY (and the RESP front end's
    /// CLUSTER SLOTS) with: the cluster's routing table, or outside a
    /// cluster one shard owning every slot (PROTOCOL.md §14).
    pub fn topology(&self) -> ClusterTopology {
        self.engine.node().topology()
    }
}

/// How a port's exposure is judged from the address it is bound to.
type ExposureOf = fn(&ServerConfig, SocketAddr) -> Exposure;

/// The metric handles connections bump.
pub(crate) struct Metrics {
    pub conns: ConnMetrics,
    pub frontends: FrontendMetrics,
    /// The most throttled keys, refreshed when `/metrics` is scraped.
    pub throttled_keys: scrape::ThrottledKeysMetric,
    /// Which global rules are capped, refreshed when `/metrics` is scraped.
    pub capped_rules: scrape::CappedRulesMetric,
}

impl Metrics {
    fn register(registry: &Registry, config: &ServerConfig) -> prometheus::Result<Self> {
        Ok(Self {
            conns: ConnMetrics::register(registry)?,
            frontends: FrontendMetrics::register(registry, &resp::command_names())?,
            throttled_keys: scrape::ThrottledKeysMetric::register(
                registry,
                config.admin.throttled_metric_keys,
            )?,
            capped_rules: scrape::CappedRulesMetric::register(registry)?,
        })
    }
}

/// Where the server stands in its shutdown.
pub(crate) struct Lifecycle {
    /// Cancelled when the server starts draining: connections stop reading
    /// new work after answering what they hold.
    pub draining: Stop,
    /// Cancelled when the grace period is over: connections stop at once.
    pub abort: Stop,
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
    /// Who gets a connection.
    admission: Arc<Admission>,
    /// The RESP front end's listener, if it runs.
    resp: Option<TcpListener>,
    /// The Envoy RLS front end's listener, if it runs.
    envoy: Option<TcpListener>,
    /// Reloads the certificates (None without TLS).
    tls: Option<TlsReloader>,
    /// Publishes decision events (`--events`), started by `run`.
    publisher: Option<Publisher>,
}

/// Why a server could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rules: {0}")]
    Rules(LoadError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[cfg(feature = "cluster")]
    #[error("cluster: {0}")]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
    #[error("events: {0}")]
    Events(crate::events::EventsError),
}

impl From<BuildError> for StartError {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::Rules(e) => Self::Rules(e),
            BuildError::Metrics(e) => Self::Metrics(e),
            BuildError::Events(e) => Self::Events(e),
        }
    }
}

impl Server {
    /// A server on the production clock. Loads the rules file if one is
    /// configured: bad rules stop the server here, with the file, line and
    /// reason.
    pub fn new(config: ServerConfig) -> Result<Self, StartError> {
        Self::with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// A server in cluster mode (`--etcd`): joins the cluster as the node
    /// reached at `advertise` (and whose admin API is at `admin`), then is
    /// built as [`Server::new`] builds one.
    #[cfg(feature = "cluster")]
    pub async fn join_cluster(
        config: ServerConfig,
        advertise: String,
        admin: Option<String>,
    ) -> Result<Self, StartError> {
        let membership = Membership::join(&config.cluster, advertise, admin).await?;
        Self::build(config, Arc::new(MonotonicClock::new()), Some(membership))
    }

    /// A server whose time comes from `clock` (tests pass a manual clock).
    pub fn with_clock(config: ServerConfig, clock: Arc<dyn Clock>) -> Result<Self, StartError> {
        #[cfg(feature = "cluster")]
        return Self::build(config, clock, None);
        #[cfg(not(feature = "cluster"))]
        Self::build(config, clock)
    }

    fn build(
        config: ServerConfig,
        clock: Arc<dyn Clock>,
        #[cfg(feature = "cluster")] cluster: Option<Membership>,
    ) -> Result<Self, StartError> {
        #[cfg(feature = "cluster")]
        let advertise = match &cluster {
            Some(m) => m.advertise().to_owned(),
            None => Self::advertise(&config),
        };
        #[cfg(not(feature = "cluster"))]
        let advertise = Self::advertise(&config);
        let registry = Registry::new();
        let tls = Self::load_tls(&config)?;
        let tls_reloader = tls
            .as_ref()
            .map(|t| TlsReloader::register(t.clone(), &registry))
            .transpose()?;
        let setup = Setup {
            clock,
            tls: tls.clone(),
            advertise,
            #[cfg(feature = "cluster")]
            cluster,
        };
        let Built {
            engine,
            supervisor,
            sweeper,
            publisher,
        } = Engine::build(&config, setup, &registry)?;
        let metrics = Metrics::register(&registry, &config)?;
        let network = &config.network;
        let admission = Arc::new(Admission::register(
            network.max_connections,
            network.max_connections_per_ip,
            network.shed_idle_after,
            &registry,
        )?);
        let budget = Arc::new(Budget::register(network.max_connection_memory, &registry)?);
        let shared = Arc::new(Shared {
            network: config.network.clone(),
            auth: Authenticator::new(&config.auth),
            tls,
            limits: config.limits.server_limits(),
            frontends: config.frontends.clone(),
            resp_max_arg_len: config.resp_max_arg_len(),
            max_log_entries: config.store.max_log_entries,
            budget,
            metrics,
            lifecycle: Lifecycle {
                draining: Stop::default(),
                abort: Stop::default(),
            },
            engine,
        });
        Ok(Self {
            config,
            shared,
            supervisor,
            sweeper,
            registry,
            admin: None,
            admission,
            resp: None,
            envoy: None,
            tls: tls_reloader,
            publisher,
        })
    }

    /// The certificates of every port (None: plain TCP).
    fn load_tls(config: &ServerConfig) -> Result<Option<Arc<crate::tls::Tls>>, StartError> {
        let (Some(cert), Some(key)) = (&config.tls.tls_cert, &config.tls.tls_key) else {
            return Ok(None);
        };
        let tls = crate::tls::Tls::load(crate::tls::TlsPaths {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: config.tls.tls_client_ca.clone(),
            ca: config.tls.tls_ca.clone(),
        })?;
        Ok(Some(Arc::new(tls)))
    }

    /// Where the node says it is reached until its listener is bound.
    fn advertise(config: &ServerConfig) -> String {
        config
            .replication
            .advertise
            .clone()
            .unwrap_or_else(|| config.network.listen.to_string())
    }

    /// Serves the admin HTTP API on `listener` too, while the server runs.
    pub fn with_admin(mut self, listener: TcpListener) -> Self {
        self.admin = Some(listener);
        self
    }

    /// Serves the RESP front end on `listener` too, while the server runs.
    pub fn with_resp(mut self, listener: TcpListener) -> Self {
        self.resp = Some(listener);
        self
    }

    /// Serves the Envoy rate limit service on `listener` too, while the
    /// server runs (a build with the `envoy` feature; without it `run`
    /// refuses to start).
    pub fn with_envoy_rls(mut self, listener: TcpListener) -> Self {
        self.envoy = Some(listener);
        self
    }

    /// The store, for inspection (tests).
    pub fn store(&self) -> Arc<Store> {
        self.shared.engine.store().clone()
    }

    /// The rules, to reload them (the CLI's SIGHUP handler, tests).
    pub fn rules(&self) -> Arc<Rules> {
        self.shared.engine.rules().clone()
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
        let config = &self.config;
        let ports: [(Option<&TcpListener>, ExposureOf); 4] = [
            (Some(listener), ServerConfig::protocol_exposure),
            (self.admin.as_ref(), ServerConfig::admin_exposure),
            (self.resp.as_ref(), ServerConfig::resp_exposure),
            (self.envoy.as_ref(), ServerConfig::envoy_exposure),
        ];
        for (listener, exposure) in ports {
            if let Some(l) = listener {
                protected_mode(&exposure(config, l.local_addr()?), insecure).map_err(refuse)?;
            }
        }
        if self.envoy.is_some() && !cfg!(feature = "envoy") {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                ConfigError::NotBuiltIn {
                    flag: "envoy-rls",
                    feature: "envoy",
                }
                .to_string(),
            ));
        }
        Ok(())
    }
}
