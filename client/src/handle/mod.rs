//! The [`Client`] handle: construction, administrative calls, and the
//! background tasks (rule table refresh, lease refunds). The rate-limit
//! questions are in `decide` (one pair: `single`), the keyed requests
//! (RESET, RELEASE) in `keyed`, where checks go in `route`.

mod decide;
mod keyed;
mod resend;
mod route;
mod single;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use smallvec::SmallVec;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_protocol::{
    Announce, CheckBatch, CheckResult, NodeStatus, Pair, Priority, ReplRequest, ReplResponse,
    Request, Response,
};

use crate::breaker::BreakerState;
use crate::calls;
use crate::cluster::{Cluster, ClusterStats};
use crate::config::{ClientConfig, FailMode};
use crate::connection::pending::{BatchKind, Checks};
use crate::connection::{response_name, Deadline, ServerInfo};
use crate::error::Error;
use crate::fallback::Fallback;
use crate::lease::{refund_batches, Leases};
use crate::metrics::Metrics;
use crate::rules::{RuleTable, SharedTable};
use crate::shard::{Shard, Wait};
use route::Route;

/// The pairs of a check, kept to describe and fall back on its answer.
type Kept = SmallVec<[Pair; 1]>;

/// A handle to one Tollgate shard (one server, or a primary and its
/// standby) over one multiplexed connection.
///
/// Cheap to clone (an `Arc` inside); clones share the connection, the
/// breakers, the fallback limiter, the leases and the rule table. Calls
/// must be made from within a tokio runtime. Every call is bounded by the
/// handle's deadline ([`ClientConfig::deadline`], or
/// [`with_deadline`](Self::with_deadline)).
///
/// Rate-limit questions ([`check`](Self::check), [`check_group`](Self::check_group),
/// [`check_policy`](Self::check_policy), [`peek`](Self::peek)) answer with an
/// [`Outcome`](crate::Outcome), never an error: the request path decides with
/// [`Outcome::is_allowed`](crate::Outcome::is_allowed). Everything else
/// returns a `Result`.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Budget of each call made through this handle.
    deadline: Duration,
    /// Fail mode of undecided checks made through this handle, over the
    /// rule's and the config's.
    fail_mode: Option<FailMode>,
    /// Priority of checks made through this handle, over the policy's;
    /// Some: they go as CHECK2 with a fresh idempotency key each.
    priority: Option<Priority>,
}

/// What all clones share.
struct Inner {
    /// The shard of a single-shard client; in cluster mode, the first seed
    /// (PING, STATUS and PROMOTE go there).
    shard: Arc<Shard>,
    /// Where checks go.
    route: Route,
    /// Set once the topology refresh task runs (cluster mode).
    mapping: AtomicBool,
    config: ClientConfig,
    rules: Arc<SharedTable>,
    /// Set once the rule refresh task runs.
    refreshing: AtomicBool,
    fallback: Option<Fallback>,
    leases: Option<Arc<Leases>>,
    /// Set once the lease refund task runs.
    refunding: AtomicBool,
    metrics: Option<Arc<Metrics>>,
    /// Stops the background tasks when the last handle goes (or on close).
    stop: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Client {
    /// A client for the server at `addr` (`host:port`). Validates `config`
    /// (an invalid one is [`Error::Config`]: never a client that silently
    /// fails open) and registers the metrics; does not connect: the first
    /// call does.
    pub fn new(addr: impl Into<String>, config: ClientConfig) -> Result<Self, Error> {
        Self::new_shard(vec![addr.into()], config)
    }

    /// A client for one shard served by several nodes (a primary and its
    /// standby, `host:port` each). Calls go to the node that says it is
    /// primary with the highest epoch; on connection loss, NotPrimary, or a
    /// hung node (calls time out and a probe goes unanswered) the client
    /// looks for the primary again, skipping nodes whose breaker is open.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate_client::Error> {
    /// use tollgate_client::{Client, ClientConfig};
    /// let client = Client::new_shard(
    ///     vec!["10.0.0.1:7700".into(), "10.0.0.2:7700".into()],
    ///     ClientConfig::default(),
    /// )?;
    /// let rtt = client.ping().await?; // to whichever is primary
    /// # Ok(()) }
    /// ```
    pub fn new_shard(addrs: Vec<String>, config: ClientConfig) -> Result<Self, Error> {
        Self::build(addrs, None, config)
    }

    /// A client for a cluster (docs/CLUSTER.md, "Running a cluster"), knowing it by
    /// `seeds`: any of its nodes (`host:port` each; one is enough). The
    /// slot map comes from TOPOLOGY asked of a seed (PROTOCOL.md §14); each
    /// check goes to the primary of its key's slot, a batch is split per
    /// shard and its results merged in order, a MOVED is followed once
    /// (after refreshing the map), TryAgain and unreachable shards are
    /// retried with a short, growing wait within the call's deadline. A
    /// server outside a cluster answers TOPOLOGY as one shard owning every
    /// slot, so a cluster client works against a single server too.
    ///
    /// PING, STATUS and PROMOTE go to the first seed. Does not connect: the
    /// first call fetches the map.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), tollgate_client::Error> {
    /// use tollgate_client::{Client, ClientConfig, Limit, Rate};
    /// let client = Client::connect_cluster(vec!["10.0.0.1:7700".into()], ClientConfig::default()).await?;
    /// let limit = Limit::token_bucket(Rate::per_second(10), 20);
    /// let outcome = client.check("rl:{user-7}:s", limit, 1).await; // to user-7's shard
    /// # Ok(()) }
    /// ```
    pub fn cluster(seeds: Vec<String>, config: ClientConfig) -> Result<Self, Error> {
        let first = seeds.first().cloned();
        Self::build(first.into_iter().collect(), Some(seeds), config)
    }

    /// [`cluster`](Self::cluster), with the slot map fetched now (within
    /// `config.connect_timeout`): an error says why no seed answered.
    pub async fn connect_cluster(seeds: Vec<String>, config: ClientConfig) -> Result<Self, Error> {
        let client = Self::cluster(seeds, config)?;
        if let Route::Cluster(cluster) = &client.inner.route {
            cluster
                .refresh(Deadline::after(client.inner.config.connect_timeout))
                .await?;
        }
        if client.inner.config.admin.is_some() {
            if let Err(error) = client.refresh_rules().await {
                tracing::warn!(%error, "no rule table yet; rule checks use the default fail mode");
            }
        }
        Ok(client)
    }

    fn build(
        addrs: Vec<String>,
        seeds: Option<Vec<String>>,
        config: ClientConfig,
    ) -> Result<Self, Error> {
        config.validate()?;
        if addrs.is_empty() {
            return Err(Error::Config(crate::config::ConfigError::Empty {
                field: "addrs",
            }));
        }
        let metrics = match &config.metrics {
            Some(registry) => Some(Arc::new(
                Metrics::register(registry, &config.client_name).map_err(|e| {
                    Error::Config(crate::config::ConfigError::Metrics {
                        reason: e.to_string(),
                    })
                })?,
            )),
            None => None,
        };
        let deadline = config.deadline;
        let shard = Arc::new(Shard::new(addrs, config.clone(), metrics.clone()));
        let route = match seeds {
            Some(seeds) => Route::Cluster(Arc::new(Cluster::new(
                seeds,
                config.clone(),
                metrics.clone(),
            ))),
            None => Route::Shard(Arc::clone(&shard)),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                shard,
                route,
                mapping: AtomicBool::new(false),
                fallback: config.fallback.as_ref().map(Fallback::new),
                leases: config.lease.clone().map(|l| Arc::new(Leases::new(l))),
                config,
                rules: Arc::new(SharedTable::from_pointee(RuleTable::default())),
                refreshing: AtomicBool::new(false),
                refunding: AtomicBool::new(false),
                metrics,
                stop: CancellationToken::new(),
            }),
            deadline,
            fail_mode: None,
            priority: None,
        })
    }

    /// A client for the server at `addr`, connected and handshaken now (and
    /// its rule table fetched, when `config.admin` is set). Waits up to
    /// `config.connect_timeout` (not the call deadline) and reports why
    /// connecting failed, e.g. [`Error::Handshake`].
    pub async fn connect(addr: impl Into<String>, config: ClientConfig) -> Result<Self, Error> {
        Self::connect_shard(vec![addr.into()], config).await
    }

    /// [`new_shard`](Self::new_shard), connected now.
    pub async fn connect_shard(addrs: Vec<String>, config: ClientConfig) -> Result<Self, Error> {
        let client = Self::new_shard(addrs, config)?;
        client.inner.shard.connection(Wait::AttemptResult).await?;
        if client.inner.config.admin.is_some() {
            if let Err(error) = client.refresh_rules().await {
                tracing::warn!(%error, "no rule table yet; rule checks use the default fail mode");
            }
        }
        Ok(client)
    }

    /// A handle to the same client whose calls get `deadline` instead.
    /// For example a longer one for administrative calls:
    /// `client.with_deadline(Duration::from_secs(1)).reset(keys)`.
    pub fn with_deadline(&self, deadline: Duration) -> Self {
        Self {
            deadline,
            ..self.clone()
        }
    }

    /// A handle to the same client whose undecided checks take `mode`,
    /// whatever the rule table and the config say.
    pub fn with_fail_mode(&self, mode: FailMode) -> Self {
        Self {
            fail_mode: Some(mode),
            ..self.clone()
        }
    }

    /// A handle to the same client whose checks go with `priority`, as
    /// CHECK2: under overload the server sheds low priority first, then
    /// normal, never high (a shed check is undecided, with the server
    /// error Shed). Each check gets a fresh idempotency key, and is sent
    /// again under that key if its connection is lost before the answer:
    /// the server charges it at most once. Needs a server that knows
    /// CHECK2; token leasing does not apply to these checks.
    pub fn with_priority(&self, priority: Priority) -> Self {
        Self {
            priority: Some(priority),
            ..self.clone()
        }
    }

    /// The budget of each call made through this handle.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The first address of the shard (see [`connected_addr`](Self::connected_addr));
    /// in cluster mode, the first seed (as for [`addrs`](Self::addrs),
    /// [`connected_addr`](Self::connected_addr), [`server_info`](Self::server_info)
    /// and [`in_flight`](Self::in_flight); [`cluster_shards`](Self::cluster_shards)
    /// lists the shards checks go to).
    pub fn addr(&self) -> &str {
        self.inner.shard.addrs().next().unwrap_or("")
    }

    /// Every address of the shard.
    pub fn addrs(&self) -> Vec<String> {
        self.inner.shard.addrs().map(str::to_owned).collect()
    }

    /// The address of the node the current (or last) connection went to.
    pub fn connected_addr(&self) -> Option<String> {
        self.inner.shard.connected_addr()
    }

    /// What the server said in the last successful handshake; `None` before
    /// the first one.
    pub fn server_info(&self) -> Option<ServerInfo> {
        self.inner.shard.server_info()
    }

    /// Calls waiting for an answer on the current connection.
    pub fn in_flight(&self) -> usize {
        self.inner.shard.in_flight()
    }

    /// Each node's address and the state of its circuit breaker (in
    /// cluster mode, of every shard of the slot map).
    pub fn breakers(&self) -> Vec<(String, BreakerState)> {
        let shards = match &self.inner.route {
            Route::Shard(shard) => vec![Arc::clone(shard)],
            Route::Cluster(cluster) => cluster.all_shards(),
        };
        shards
            .iter()
            .flat_map(|s| {
                s.nodes()
                    .iter()
                    .map(|n| (n.addr.clone(), n.breaker_state()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Cluster mode: the slot map's version and size, and the MOVED
    /// answers, resends and refreshes so far. `None` for a single-shard
    /// client.
    pub fn cluster_stats(&self) -> Option<ClusterStats> {
        match &self.inner.route {
            Route::Cluster(cluster) => Some(cluster.stats()),
            Route::Shard(_) => None,
        }
    }

    /// Cluster mode: each shard of the slot map, its id and its nodes'
    /// addresses (primary first). Empty before the first map, and for a
    /// single-shard client.
    pub fn cluster_shards(&self) -> Vec<(u16, Vec<String>)> {
        match &self.inner.route {
            Route::Cluster(cluster) => cluster.shards(),
            Route::Shard(_) => Vec::new(),
        }
    }

    /// Cluster mode: fetches the slot map now, within this handle's
    /// deadline. A single-shard client has nothing to refresh.
    pub async fn refresh_topology(&self) -> Result<(), Error> {
        match &self.inner.route {
            Route::Cluster(cluster) => cluster.refresh(Deadline::after(self.deadline)).await,
            Route::Shard(_) => Ok(()),
        }
    }

    /// The rule table as last fetched (empty before the first fetch, or
    /// without `config.admin`).
    pub fn rules(&self) -> Arc<RuleTable> {
        self.inner.rules.load_full()
    }

    /// Fetches the rule table from the admin API now.
    pub async fn refresh_rules(&self) -> Result<Arc<RuleTable>, Error> {
        let Some(admin) = &self.inner.config.admin else {
            return Err(Error::Config(crate::config::ConfigError::Empty {
                field: "admin",
            }));
        };
        let table =
            Arc::new(crate::rules::fetch(admin, crate::config::DEFAULT_RULES_TIMEOUT).await?);
        self.inner.rules.store(Arc::clone(&table));
        Ok(table)
    }

    /// Closes the connection and refuses every later call with
    /// [`Error::Closed`] (undecided `Unavailable` for checks); gives unspent
    /// leases back first when it can. Affects every clone.
    pub fn close(&self) {
        if let Some(leases) = &self.inner.leases {
            let due = leases.all();
            if !due.is_empty() {
                let (route, shard) = (self.inner.route.clone(), Arc::clone(&self.inner.shard));
                let budget = self.inner.config.connect_timeout;
                tokio::spawn(async move {
                    refund_due(&route, &shard, due, budget).await;
                    close_route(&route, &shard);
                });
                self.inner.stop.cancel();
                return;
            }
        }
        self.inner.stop.cancel();
        close_route(&self.inner.route, &self.inner.shard);
    }

    /// Starts the background tasks on first use (they need a runtime, which
    /// `new` may not have).
    fn start_background(&self) {
        let inner = &self.inner;
        if let Route::Cluster(cluster) = &inner.route {
            if !inner.mapping.load(Ordering::Relaxed)
                && !inner.mapping.swap(true, Ordering::Relaxed)
            {
                tokio::spawn(Arc::clone(cluster).refresh_loop(inner.stop.clone()));
            }
        }
        if let Some(admin) = &inner.config.admin {
            if !inner.refreshing.load(Ordering::Relaxed)
                && !inner.refreshing.swap(true, Ordering::Relaxed)
            {
                tokio::spawn(crate::rules::refresh_loop(
                    admin.clone(),
                    Arc::clone(&inner.rules),
                    inner.config.rules_refresh,
                    inner.stop.clone(),
                ));
            }
        }
    }

    fn start_refunds(&self, leases: &Arc<Leases>) {
        let inner = &self.inner;
        if inner.refunding.load(Ordering::Relaxed) || inner.refunding.swap(true, Ordering::Relaxed)
        {
            return;
        }
        let (route, shard, leases, stop) = (
            inner.route.clone(),
            Arc::clone(&inner.shard),
            Arc::clone(leases),
            inner.stop.clone(),
        );
        let metrics = inner.metrics.clone();
        let budget = inner.config.connect_timeout;
        tokio::spawn(async move {
            let tick = (leases.hold() / 2).max(Duration::from_millis(5));
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(tick) => {}
                }
                let due = leases.due(Instant::now());
                if let Some(m) = &metrics {
                    m.lease_tokens("refunded", due.iter().map(|(_, _, t)| u64::from(*t)).sum());
                }
                refund_due(&route, &shard, due, budget).await;
            }
        });
    }

    /// Asks the node this client is connected to for its role, epoch and
    /// replication state (STATUS).
    pub async fn status(&self) -> Result<NodeStatus, Error> {
        self.status_request(None).await
    }

    /// STATUS, telling the node who asks: a node probing its peer. A node
    /// told about a primary with a higher epoch than its own steps down.
    pub async fn status_announcing(&self, announce: Announce) -> Result<NodeStatus, Error> {
        self.status_request(Some(announce)).await
    }

    async fn status_request(&self, announce: Option<Announce>) -> Result<NodeStatus, Error> {
        let request = Request::Repl(ReplRequest::Status { announce });
        match self.admin_call(request, "STATUS").await? {
            Response::Repl(ReplResponse::Status(status)) => Ok(status),
            other => Err(Error::UnexpectedResponse {
                request: "STATUS",
                got: response_name(&other),
            }),
        }
    }

    /// Makes the node this client is connected to primary (PROMOTE).
    /// Returns its epoch and whether it already was primary.
    pub async fn promote(&self) -> Result<(u64, bool), Error> {
        match self
            .admin_call(Request::Repl(ReplRequest::Promote), "PROMOTE")
            .await?
        {
            Response::Repl(ReplResponse::Promoted { epoch, was_primary }) => {
                Ok((epoch, was_primary))
            }
            other => Err(Error::UnexpectedResponse {
                request: "PROMOTE",
                got: response_name(&other),
            }),
        }
    }

    async fn admin_call(&self, request: Request, name: &'static str) -> Result<Response, Error> {
        let deadline = Deadline::after(self.deadline);
        let conn = self.inner.shard.connection(Wait::Until(deadline)).await?;
        match conn.call(request, deadline).await? {
            Response::Error { code, message } => Err(Error::Server { code, message }),
            Response::Repl(ReplResponse::Stream { .. }) => Err(Error::UnexpectedResponse {
                request: name,
                got: "REPL_STREAM",
            }),
            other => Ok(other),
        }
    }

    /// Sends many independent checks in one frame; one result per check, in
    /// order. Refused locally when over the server's limits.
    pub async fn check_batch(&self, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        self.batch(BatchKind::Check, batch).await
    }

    /// Like [`check_batch`](Self::check_batch), without charging anything.
    pub async fn peek_batch(&self, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        self.batch(BatchKind::Peek, batch).await
    }

    /// Sends many independent refunds in one frame; one result per check.
    pub async fn refund_batch(&self, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        self.batch(BatchKind::Refund, batch).await
    }

    async fn batch(&self, kind: BatchKind, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let deadline = Deadline::after(self.deadline);
        self.start_background();
        let answer = self
            .inner
            .route
            .checks(kind, Checks::Batch(batch), deadline)
            .await?;
        calls::results(answer, kind.name())
    }

    /// Sends PING and returns the round trip (from queueing the request to
    /// reading the answer; connecting, if needed, is not counted).
    pub async fn ping(&self) -> Result<Duration, Error> {
        let deadline = Deadline::after(self.deadline);
        let conn = self.inner.shard.connection(Wait::Until(deadline)).await?;
        let sent = Instant::now();
        match conn.call(Request::Ping, deadline).await? {
            Response::Pong => Ok(sent.elapsed()),
            Response::Error { code, message } => Err(Error::Server { code, message }),
            other => Err(Error::UnexpectedResponse {
                request: "PING",
                got: response_name(&other),
            }),
        }
    }
}

/// Refunds `due` leases (best effort: a lease that cannot be given back
/// simply expires with the bucket's refill).
async fn refund_due(
    route: &Route,
    shard: &Arc<Shard>,
    due: Vec<(Bytes, tollgate_protocol::Limit, u32)>,
    budget: Duration,
) {
    if due.is_empty() {
        return;
    }
    let max_batch = shard
        .server_info()
        .map_or(usize::from(tollgate_protocol::DEFAULT_MAX_BATCH), |i| {
            usize::from(i.limits.max_batch)
        });
    for batch in refund_batches(due, max_batch) {
        let deadline = Deadline::after(budget);
        if let Err(error) = route
            .checks(BatchKind::Refund, Checks::Batch(batch), deadline)
            .await
        {
            tracing::debug!(%error, "lease refund failed; the tokens come back with the refill");
        }
    }
}

/// Closes the client's connections.
fn close_route(route: &Route, shard: &Shard) {
    if let Route::Cluster(cluster) = route {
        cluster.close();
    }
    shard.close();
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("addrs", &self.addrs())
            .field("deadline", &self.deadline)
            .field("fail_mode", &self.fail_mode)
            .finish_non_exhaustive()
    }
}
