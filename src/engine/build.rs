//! [`Engine::build`]: the store, the rules, the node, the retry memory,
//! the shedder, the decision events and the check metrics, from the
//! server's settings; the tasks that run beside them (the node's
//! supervisor, the sweeper, the events publisher) handed back for the
//! server to start.

use super::{
    CheckMetrics, DedupMetrics, Engine, ErrorCounters, KeyMetrics, RetryMemory, Shedder, Store,
    Sweeper,
};
use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::events::{EventMetrics, Publisher};
#[cfg(feature = "cluster")]
use crate::node::Membership;
use crate::node::{Node, NodeParts, Supervisor};
use crate::rules::{LoadError, Rules};
use crate::throttled::TopThrottled;
use prometheus::Registry;
use std::sync::Arc;

/// What the engine is built from beyond the settings.
pub(crate) struct Setup {
    pub clock: Arc<dyn Clock>,
    /// The node's TLS for its own connections (None: plain TCP).
    pub tls: Option<Arc<crate::tls::Tls>>,
    /// Where the node says it is reached until its listener is bound.
    pub advertise: String,
    /// The cluster this node joined (`--etcd`), if any.
    #[cfg(feature = "cluster")]
    pub cluster: Option<Membership>,
}

/// A built engine and the tasks the server runs beside it.
pub(crate) struct Built {
    pub engine: Engine,
    /// Who is primary, replication (runs for the server's whole life).
    pub supervisor: Supervisor,
    /// Drops expired keys, keeps the key gauges current.
    pub sweeper: Sweeper,
    /// Publishes decision events (`--events`).
    pub publisher: Option<Publisher>,
}

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    #[error("rules: {0}")]
    Rules(#[from] LoadError),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("events: {0}")]
    Events(#[from] crate::events::EventsError),
}

impl Engine {
    /// Builds the engine of `config`, registering its metrics in
    /// `registry`. Loads the rules file if one is configured: bad rules
    /// stop the server here, with the file, line and reason.
    pub fn build(
        config: &ServerConfig,
        setup: Setup,
        registry: &Registry,
    ) -> Result<Built, BuildError> {
        let clock = setup.clock.clone();
        let store = Arc::new(Store::new(config.store_config()));
        let metrics = CheckMetrics::register(registry)?;
        let rules = Rules::load(
            config.rules.file.clone(),
            config.store.max_log_entries,
            metrics.checks.clone(),
            registry,
        )?;
        let sweeper = Sweeper {
            store: store.clone(),
            clock: clock.clone(),
            metrics: KeyMetrics::register(registry)?,
            interval: config.store.sweep_interval,
            stripes: config.store.sweep_stripes,
            max_memory: config.store.max_memory,
        };
        let (node, supervisor) = node(config, setup, store.clone(), registry)?;
        let overload = &config.overload;
        let retries = RetryMemory::new(
            overload.dedup_window,
            overload.dedup_capacity,
            DedupMetrics::register(registry)?,
        );
        let shedder = Shedder::new(
            overload.shed_low_backlog,
            overload.shed_normal_backlog,
            registry,
        )?;
        let event_metrics = EventMetrics::register(registry)?;
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
        let engine = Engine {
            store,
            clock,
            rules: Arc::new(rules),
            node,
            events,
            throttled,
            retries,
            shedder,
            metrics,
            errors: ErrorCounters::register(registry)?,
        };
        Ok(Built {
            engine,
            supervisor,
            sweeper,
            publisher,
        })
    }
}

/// The node handle of `config` and its supervisor.
fn node(
    config: &ServerConfig,
    setup: Setup,
    store: Arc<Store>,
    registry: &Registry,
) -> prometheus::Result<(Node, Supervisor)> {
    Node::new(
        NodeParts {
            settings: config.replication.clone(),
            // Without a cluster secret (only with --insecure) the client
            // token, if any, gets this node through HELLO.
            credentials: crate::node::Credentials {
                cluster: config.auth.cluster_secret.clone(),
                region: config.auth.region_secret.clone(),
                region_peers: config.auth.region_peer_secrets(),
                token: config.auth.auth_token.clone(),
            },
            tls: setup.tls,
            limits: config.limits.server_limits(),
            advertise: setup.advertise,
            store,
            clock: setup.clock,
            regions: crate::node::regions::RegionConfig::from_settings(
                &config.regions,
                config.limits.max_frame,
            ),
            #[cfg(feature = "cluster")]
            cluster: setup.cluster,
        },
        registry,
    )
}
