//! The [`Client`] handle: calls, deadlines, and the connection's life cycle
//! (lazy connect, reconnect, backoff).
//!
//! Connection state machine (one per client, shared by its clones):
//!
//! ```text
//!   Idle ──call──> Connecting ──ok──> Connected ──connection dies──┐
//!                    ▲     └──error──> BackingOff{until}           │
//!                    │                     │ first call after until │
//!                    └─────────────────────┴────────────────────────┘
//!   close() from any state ──> Closed
//! ```
//!
//! Invariants:
//! - at most one connection attempt runs at a time; it runs in its own task,
//!   bounded by `connect_timeout`, so a call that stops waiting (deadline)
//!   does not abort it and a fleet of concurrent calls starts one connect;
//! - a call never waits longer than its deadline, connecting included;
//! - while backing off, or while retrying after a failure, calls fail at
//!   once with [`Error::Unavailable`] rather than waiting: the last attempt
//!   failed, so waiting would most likely only add latency. Only the first
//!   attempt (or a reconnect after a healthy connection died) is waited for;
//! - a connection that died is noticed by the next call, which starts a
//!   reconnect; calls that were waiting on it already failed at once.
//!
//! **Shards of several nodes** ([`Client::new_shard`]: a primary and its
//! standby). An attempt then opens every address at once and keeps the one
//! whose handshake says *primary* with the highest epoch (the others are
//! closed); when none is primary the attempt fails and the usual backoff
//! (with jitter) spaces the next round. A request answered with NotPrimary
//! (the node was demoted or replaced) was not applied, so the call drops the
//! connection and, within its deadline, sends the request once more through
//! a fresh round; a connection that dies sends the next call to a fresh
//! round too. Whatever cannot be done within the deadline is undecided.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_protocol::{
    Announce, CheckBatch, CheckResult, Decision, ErrorCode, LeaseRef, LimitRef, NodeStatus, Pair,
    ReplRequest, ReplResponse, Request, Response, ServerLimits,
};

use crate::backoff::{self, XorShift64};
use crate::config::ClientConfig;
use crate::connection::{response_name, Connection, Deadline, ServerInfo};
use crate::error::Error;
use crate::outcome::{Outcome, Undecided};

/// A handle to one Tollgate server over one multiplexed connection.
///
/// Cheap to clone (an `Arc` inside); clones share the connection. Must be
/// used from within a tokio runtime. Every call is bounded by the client's
/// deadline ([`ClientConfig::deadline`], or [`with_deadline`](Self::with_deadline)).
///
/// Rate-limit questions ([`check`](Self::check), [`peek`](Self::peek) and
/// their group forms) answer with an [`Outcome`], never an error: the
/// request path decides with [`Outcome::allowed`]. Everything else returns a
/// `Result`.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    /// Budget of each call made through this handle.
    deadline: Duration,
}

/// What all clones share.
struct Inner {
    /// The nodes of the shard; one for a plain client.
    addrs: Vec<String>,
    config: ClientConfig,
    state: Mutex<State>,
    /// Woken when a connection attempt ends (or the client closes), so calls
    /// waiting for the attempt re-read `state`.
    attempt_ended: Notify,
}

struct State {
    phase: Phase,
    /// Consecutive failed attempts; sizes the backoff. Reset on success.
    failures: u32,
    /// From the last successful handshake; kept across reconnects.
    info: Option<ServerInfo>,
    /// Which of `addrs` the current (or last) connection went to.
    connected_to: Option<usize>,
    /// Jitter source for the backoff.
    rng: XorShift64,
}

enum Phase {
    /// Never connected, or not since [`Client::new`].
    Idle,
    /// An attempt task is running. `retrying_after` is the failure that
    /// preceded it, if any: calls fail fast during a retry.
    Connecting {
        retrying_after: Option<Arc<Error>>,
    },
    /// The current connection; may have died since (checked on use).
    Connected(Arc<Connection>),
    /// The last attempt failed with `cause`; no new attempt before `until`.
    BackingOff {
        until: Instant,
        cause: Arc<Error>,
    },
    Closed,
}

/// How long a caller waits for a connection.
#[derive(Clone, Copy)]
enum Wait {
    /// Up to the call's deadline; fail fast while backing off.
    Until(Deadline),
    /// Until the attempt in progress ends, and report its error
    /// ([`Client::connect`]).
    AttemptResult,
}

/// CHECK, PEEK or REFUND: a batch of the same shape, charged, not charged
/// or given back.
#[derive(Clone, Copy)]
enum BatchKind {
    Check,
    Peek,
    Refund,
}

impl BatchKind {
    fn request(self, batch: CheckBatch) -> Request {
        match self {
            Self::Check => Request::Check(batch),
            Self::Peek => Request::Peek(batch),
            Self::Refund => Request::Refund(batch),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Check => "CHECK",
            Self::Peek => "PEEK",
            Self::Refund => "REFUND",
        }
    }
}

impl Client {
    /// A client for the server at `addr` (`host:port`). Does not connect:
    /// the first call does.
    pub fn new(addr: impl Into<String>, config: ClientConfig) -> Self {
        Self::new_shard(vec![addr.into()], config)
    }

    /// A client for one shard served by several nodes (a primary and its
    /// standby, `host:port` each). Calls go to the node that says it is
    /// primary with the highest epoch; on connection loss or NotPrimary the
    /// client probes the list again (see the module docs). Does not connect:
    /// the first call does.
    ///
    /// ```no_run
    /// # async fn demo() {
    /// use tollgate_client::{Client, ClientConfig};
    /// let client = Client::new_shard(
    ///     vec!["10.0.0.1:7700".into(), "10.0.0.2:7700".into()],
    ///     ClientConfig::default(),
    /// );
    /// let pong = client.ping().await; // to whichever is primary
    /// # }
    /// ```
    pub fn new_shard(addrs: Vec<String>, config: ClientConfig) -> Self {
        let deadline = config.deadline;
        Self {
            inner: Arc::new(Inner {
                addrs,
                config,
                state: Mutex::new(State {
                    phase: Phase::Idle,
                    failures: 0,
                    info: None,
                    connected_to: None,
                    rng: XorShift64::from_entropy(),
                }),
                attempt_ended: Notify::new(),
            }),
            deadline,
        }
    }

    /// A client for the server at `addr`, connected and handshaken now.
    /// Waits up to `config.connect_timeout` (not the call deadline) and
    /// reports why connecting failed, e.g. [`Error::Handshake`].
    pub async fn connect(addr: impl Into<String>, config: ClientConfig) -> Result<Self, Error> {
        config.validate()?;
        let client = Self::new(addr, config);
        client.inner.connection(Wait::AttemptResult).await?;
        Ok(client)
    }

    /// A handle to the same connection whose calls get `deadline` instead.
    /// For example a longer one for administrative calls:
    /// `client.with_deadline(Duration::from_secs(1)).reset(keys)`.
    pub fn with_deadline(&self, deadline: Duration) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            deadline,
        }
    }

    /// The budget of each call made through this handle.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The server address this client connects to (for a shard, the first
    /// of its addresses; see [`connected_addr`](Self::connected_addr)).
    pub fn addr(&self) -> &str {
        self.inner.addrs.first().map_or("", String::as_str)
    }

    /// Every address of the shard.
    pub fn addrs(&self) -> &[String] {
        &self.inner.addrs
    }

    /// The address of the node the current (or last) connection went to.
    pub fn connected_addr(&self) -> Option<String> {
        let index = self.inner.state.lock().connected_to?;
        self.inner.addrs.get(index).cloned()
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
        let conn = self.inner.connection(Wait::Until(deadline)).await?;
        match conn.call(request, deadline).await? {
            Response::Error { code, message } => Err(Error::Server { code, message }),
            Response::Repl(ReplResponse::Stream { .. }) => Err(Error::UnexpectedResponse {
                request: name,
                got: "REPL_STREAM",
            }),
            other => Ok(other),
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// Whether to let the request through, undecided outcomes following the
    /// configured [`ClientConfig::fail_mode`] (fail-open by default).
    pub fn allows(&self, outcome: &Outcome) -> bool {
        outcome.allowed(self.inner.config.fail_mode)
    }

    /// Checks `cost` units of `key` against `limit`, charging them if
    /// allowed. `limit` is an inline [`Limit`] or a [`RuleName`] configured
    /// on the server (then `cost` 0 takes the rule's default cost).
    ///
    /// [`RuleName`]: tollgate_protocol::RuleName
    pub async fn check(
        &self,
        key: impl Into<Bytes>,
        limit: impl Into<LimitRef>,
        cost: u32,
    ) -> Outcome {
        self.decide(BatchKind::Check, single(key.into(), limit.into(), cost))
            .await
    }

    /// Checks several (key, limit, cost) pairs as one atomic group: all pass
    /// and all are charged, or none is. The keys must share a hash slot
    /// (e.g. the same `{tag}`), else the outcome is
    /// `Undecided(Rejected(CrossSlot))`.
    pub async fn check_group(&self, pairs: Vec<Pair>) -> Outcome {
        self.decide(BatchKind::Check, group(pairs)).await
    }

    /// Sends many independent checks in one frame; one result per check, in
    /// order. Refused locally when over the server's limits.
    pub async fn check_batch(&self, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        self.batch(BatchKind::Check, batch).await
    }

    /// Like [`check`](Self::check), without charging anything.
    pub async fn peek(
        &self,
        key: impl Into<Bytes>,
        limit: impl Into<LimitRef>,
        cost: u32,
    ) -> Outcome {
        self.decide(BatchKind::Peek, single(key.into(), limit.into(), cost))
            .await
    }

    /// Like [`check_group`](Self::check_group), without charging anything.
    pub async fn peek_group(&self, pairs: Vec<Pair>) -> Outcome {
        self.decide(BatchKind::Peek, group(pairs)).await
    }

    /// Like [`check_batch`](Self::check_batch), without charging anything.
    pub async fn peek_batch(&self, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        self.batch(BatchKind::Peek, batch).await
    }

    /// Gives `amount` units of `key` back, e.g. the part of an up-front
    /// charge a request did not use (charged 4000 tokens, used 1200: refund
    /// 2800). `limit` must be the one the units were charged under: the
    /// same inline [`Limit`] or the same [`RuleName`] (then `amount` 0 gives
    /// back the rule's default cost). Never fills beyond the limit. Returns
    /// the decision after the refund
    /// (always allowed; `remaining` updated). A per-check refusal (say
    /// InvalidLimit, or a concurrency limit, whose slots are given back with
    /// [`release`](Self::release), or UnknownRule) is [`Error::Server`] with
    /// its code.
    ///
    /// [`Limit`]: tollgate_protocol::Limit
    /// [`RuleName`]: tollgate_protocol::RuleName
    pub async fn refund(
        &self,
        key: impl Into<Bytes>,
        limit: impl Into<LimitRef>,
        amount: u32,
    ) -> Result<Decision, Error> {
        self.refund_group(vec![Pair {
            key: key.into(),
            limit: limit.into(),
            cost: amount,
        }])
        .await
    }

    /// Refunds several pairs (each `cost` is the amount given back) as one
    /// atomic group; the keys must share a hash slot. See
    /// [`refund`](Self::refund).
    pub async fn refund_group(&self, pairs: Vec<Pair>) -> Result<Decision, Error> {
        let results = self.batch(BatchKind::Refund, group(pairs)).await?;
        match results.into_iter().next() {
            Some(CheckResult::Decision(decision)) => Ok(decision),
            Some(CheckResult::Error(code)) => Err(Error::Server {
                code,
                message: "refund refused".into(),
            }),
            // `batch` checked there is exactly one result.
            None => Err(Error::ResultCount {
                expected: 1,
                got: 0,
            }),
        }
    }

    /// Sends many independent refunds in one frame; one result per check.
    pub async fn refund_batch(&self, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        self.batch(BatchKind::Refund, batch).await
    }

    /// Releases the concurrency lease `lease` acquired on `key` (the id in
    /// the allowed [`Decision::lease`]). Returns whether it was still held:
    /// `false` when it had already been released or had expired.
    pub async fn release(&self, key: impl Into<Bytes>, lease: u64) -> Result<bool, Error> {
        let released = self
            .release_many(vec![LeaseRef {
                key: key.into(),
                lease,
            }])
            .await?;
        Ok(released > 0)
    }

    /// Releases several leases in one request; returns how many were still
    /// held.
    pub async fn release_many(&self, leases: Vec<LeaseRef>) -> Result<u32, Error> {
        let deadline = Deadline::after(self.deadline);
        if leases.is_empty() {
            return Ok(0);
        }
        let conn = self.inner.connection(Wait::Until(deadline)).await?;
        let limits = conn.info().limits;
        if leases.len() > usize::from(limits.max_batch) {
            return Err(Error::BatchTooLarge {
                checks: leases.len(),
                max: limits.max_batch,
            });
        }
        for lease in &leases {
            check_key(&lease.key, &limits)?;
        }
        match self
            .call_primary(conn, Request::Release(leases), deadline)
            .await?
        {
            Response::Released(released) => Ok(released),
            Response::Error { code, message } => Err(Error::Server { code, message }),
            other => Err(Error::UnexpectedResponse {
                request: "RELEASE",
                got: response_name(&other),
            }),
        }
    }

    /// Forgets the state of `keys`; returns how many held state.
    pub async fn reset(&self, keys: Vec<Bytes>) -> Result<u32, Error> {
        let deadline = Deadline::after(self.deadline);
        if keys.is_empty() {
            return Ok(0);
        }
        let conn = self.inner.connection(Wait::Until(deadline)).await?;
        let limits = conn.info().limits;
        if keys.len() > usize::from(limits.max_batch) {
            return Err(Error::BatchTooLarge {
                checks: keys.len(),
                max: limits.max_batch,
            });
        }
        for key in &keys {
            check_key(key, &limits)?;
        }
        match self
            .call_primary(conn, Request::Reset(keys), deadline)
            .await?
        {
            Response::ResetDone(removed) => Ok(removed),
            Response::Error { code, message } => Err(Error::Server { code, message }),
            other => Err(Error::UnexpectedResponse {
                request: "RESET",
                got: response_name(&other),
            }),
        }
    }

    /// Sends PING and returns the round trip (from queueing the request to
    /// reading the answer; connecting, if needed, is not counted).
    pub async fn ping(&self) -> Result<Duration, Error> {
        let deadline = Deadline::after(self.deadline);
        let conn = self.inner.connection(Wait::Until(deadline)).await?;
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

    /// What the server said in the last successful handshake; `None` before
    /// the first one.
    pub fn server_info(&self) -> Option<ServerInfo> {
        self.inner.state.lock().info
    }

    /// Calls waiting for an answer on the current connection.
    pub fn in_flight(&self) -> usize {
        match &self.inner.state.lock().phase {
            Phase::Connected(conn) => conn.in_flight(),
            _ => 0,
        }
    }

    /// Closes the connection and refuses every later call with
    /// [`Error::Closed`] (`Undecided::Unavailable` for checks). Calls waiting
    /// for an answer fail at once. Affects every clone.
    pub fn close(&self) {
        let previous = std::mem::replace(&mut self.inner.state.lock().phase, Phase::Closed);
        if let Phase::Connected(conn) = previous {
            conn.shut_down();
        }
        self.inner.attempt_ended.notify_waiters();
    }

    /// Runs a one-check batch and folds any failure into the outcome.
    async fn decide(&self, kind: BatchKind, batch: CheckBatch) -> Outcome {
        match self.batch(kind, batch).await {
            // `batch` checked there is exactly one result.
            Ok(results) => results.into_iter().next().map_or(
                Outcome::Undecided(Undecided::Protocol),
                Outcome::from_result,
            ),
            Err(error) => {
                tracing::debug!(addrs = ?self.inner.addrs, %error, "check undecided");
                Outcome::Undecided(Undecided::from_error(&error))
            }
        }
    }

    async fn batch(&self, kind: BatchKind, batch: CheckBatch) -> Result<Vec<CheckResult>, Error> {
        let deadline = Deadline::after(self.deadline);
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.inner.connection(Wait::Until(deadline)).await?;
        check_batch_limits(&batch, &conn.info().limits)?;
        let checks = batch.len();
        match self
            .call_primary(conn, kind.request(batch), deadline)
            .await?
        {
            Response::Checked(results) if results.len() == checks => Ok(results),
            Response::Checked(results) => Err(Error::ResultCount {
                expected: checks,
                got: results.len(),
            }),
            Response::Error { code, message } => Err(Error::Server { code, message }),
            other => Err(Error::UnexpectedResponse {
                request: kind.name(),
                got: response_name(&other),
            }),
        }
    }
}

impl Client {
    /// Sends a request that only a primary serves. For a shard of several
    /// nodes, an ERROR NotPrimary (nothing was applied) drops the
    /// connection and sends the request once more to the primary a fresh
    /// round finds, within the same deadline; the answer is returned as
    /// is otherwise.
    async fn call_primary(
        &self,
        conn: Arc<Connection>,
        request: Request,
        deadline: Deadline,
    ) -> Result<Response, Error> {
        if self.inner.addrs.len() < 2 {
            return conn.call(request, deadline).await;
        }
        let answer = conn.call(request.clone(), deadline).await?;
        let Response::Error {
            code: ErrorCode::NotPrimary,
            message,
        } = &answer
        else {
            return Ok(answer);
        };
        tracing::info!(%message, "node is not primary; looking for the primary again");
        self.inner.invalidate(&conn);
        let conn = self.inner.connection(Wait::Until(deadline)).await?;
        conn.call(request, deadline).await
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("addrs", &self.inner.addrs)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// Drops `conn` if it is still the current connection, so the next call
    /// starts a fresh attempt (for a shard: a new round over every node).
    fn invalidate(&self, conn: &Arc<Connection>) {
        let state = self.state.lock();
        if let Phase::Connected(current) = &state.phase {
            if Arc::ptr_eq(current, conn) {
                current.shut_down();
            }
        }
    }

    /// The live connection, starting an attempt if there is none.
    async fn connection(self: &Arc<Self>, wait: Wait) -> Result<Arc<Connection>, Error> {
        loop {
            let attempt_ended = self.attempt_ended.notified();
            tokio::pin!(attempt_ended);
            // Registered before the state is read, so an attempt ending
            // between the read and the await below still wakes us.
            attempt_ended.as_mut().enable();
            if let Some(ready) = self.ready_or_start(wait) {
                return ready;
            }
            match wait {
                Wait::Until(deadline) => {
                    if tokio::time::timeout_at(deadline.at, attempt_ended)
                        .await
                        .is_err()
                    {
                        return Err(deadline.exceeded());
                    }
                }
                Wait::AttemptResult => attempt_ended.await,
            }
        }
    }

    /// `Some` when the caller can go on (or must fail) now; `None` when it
    /// should wait for the attempt in progress, which this may have started.
    fn ready_or_start(self: &Arc<Self>, wait: Wait) -> Option<Result<Arc<Connection>, Error>> {
        let mut state = self.state.lock();
        match &state.phase {
            Phase::Closed => return Some(Err(Error::Closed)),
            Phase::Connected(conn) if conn.is_alive() => return Some(Ok(Arc::clone(conn))),
            Phase::BackingOff { until, cause } => {
                let now = Instant::now();
                if now < *until {
                    return Some(Err(match wait {
                        Wait::AttemptResult => Error::clone(cause),
                        Wait::Until(_) => Error::Unavailable {
                            retry_in: *until - now,
                            cause: Arc::clone(cause),
                        },
                    }));
                }
            }
            Phase::Connecting {
                retrying_after: Some(cause),
            } if matches!(wait, Wait::Until(_)) => {
                return Some(Err(Error::Unavailable {
                    retry_in: Duration::ZERO,
                    cause: Arc::clone(cause),
                }));
            }
            Phase::Connecting { .. } => return None,
            Phase::Idle | Phase::Connected(_) => {}
        }
        // Idle, dead connection, or backoff over: this caller starts the one
        // attempt; every other caller finds `Connecting`.
        let retrying_after = match std::mem::replace(&mut state.phase, Phase::Idle) {
            Phase::BackingOff { cause, .. } => Some(cause),
            _ => None,
        };
        state.phase = Phase::Connecting { retrying_after };
        drop(state);
        tokio::spawn(Arc::clone(self).attempt());
        None
    }

    /// One connection attempt, bounded by `connect_timeout`; publishes its
    /// result in `state` and wakes the waiting calls.
    async fn attempt(self: Arc<Self>) {
        let result = match &self.addrs[..] {
            [addr] => Connection::open(addr, &self.config).await.map(|c| (c, 0)),
            addrs => Connection::open_primary(addrs, &self.config).await,
        };
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            // Closed meanwhile: drop the new connection (stopping its tasks).
            if !matches!(state.phase, Phase::Closed) {
                match result {
                    Ok((conn, index)) => {
                        state.failures = 0;
                        state.info = Some(*conn.info());
                        state.connected_to = Some(index);
                        state.phase = Phase::Connected(Arc::new(conn));
                    }
                    Err(error) => {
                        state.failures = state.failures.saturating_add(1);
                        let delay = backoff::delay(
                            self.config.backoff_min,
                            self.config.backoff_max,
                            state.failures,
                            &mut state.rng,
                        );
                        // Once per outage: a dead server must not flood the
                        // log with one line per backoff step.
                        if state.failures == 1 {
                            tracing::warn!(
                                addrs = ?self.addrs,
                                %error,
                                retry_in = ?delay,
                                "connection attempt failed"
                            );
                        } else {
                            tracing::debug!(
                                addrs = ?self.addrs,
                                %error,
                                failures = state.failures,
                                retry_in = ?delay,
                                "connection attempt failed"
                            );
                        }
                        state.phase = Phase::BackingOff {
                            until: Instant::now() + delay,
                            cause: Arc::new(error),
                        };
                    }
                }
            }
        }
        self.attempt_ended.notify_waiters();
    }
}

/// A batch of one single-pair check.
fn single(key: Bytes, limit: LimitRef, cost: u32) -> CheckBatch {
    let mut batch = CheckBatch::with_capacity(1);
    batch.push(Pair { key, limit, cost });
    batch
}

/// A batch of one check made of `pairs` (an atomic group).
fn group(pairs: Vec<Pair>) -> CheckBatch {
    let mut batch = CheckBatch::with_capacity(1);
    batch.push_check(pairs);
    batch
}

/// Refuses locally what the server would refuse, using the limits it
/// announced: no round trip for a request that cannot succeed.
fn check_batch_limits(batch: &CheckBatch, limits: &ServerLimits) -> Result<(), Error> {
    if batch.len() > usize::from(limits.max_batch) {
        return Err(Error::BatchTooLarge {
            checks: batch.len(),
            max: limits.max_batch,
        });
    }
    for (index, check) in batch.iter().enumerate() {
        if check.is_empty() {
            return Err(Error::EmptyGroup { check: index });
        }
        if check.len() > usize::from(limits.max_group) {
            return Err(Error::GroupTooLarge {
                check: index,
                pairs: check.len(),
                max: limits.max_group,
            });
        }
        for pair in check {
            check_key(&pair.key, limits)?;
        }
    }
    Ok(())
}

fn check_key(key: &[u8], limits: &ServerLimits) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if key.len() > usize::from(limits.max_key_len) {
        return Err(Error::KeyTooLong {
            len: key.len(),
            max: limits.max_key_len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::{Algorithm, Limit};

    use super::*;

    fn pair(key: &'static [u8]) -> Pair {
        Pair {
            key: Bytes::from_static(key),
            limit: Limit {
                algorithm: Algorithm::TokenBucket,
                count: 5,
                period_ms: 1000,
                burst: 10,
            }
            .into(),
            cost: 1,
        }
    }

    fn limits() -> ServerLimits {
        ServerLimits {
            max_frame: 4096,
            max_batch: 2,
            max_group: 2,
            max_key_len: 4,
        }
    }

    #[test]
    fn local_limits_carry_the_numbers() {
        let mut batch = CheckBatch::default();
        for _ in 0..3 {
            batch.push(pair(b"k"));
        }
        assert!(matches!(
            check_batch_limits(&batch, &limits()),
            Err(Error::BatchTooLarge { checks: 3, max: 2 })
        ));

        let mut batch = CheckBatch::default();
        batch.push(pair(b"k"));
        batch.push_check([pair(b"a"), pair(b"b"), pair(b"c")]);
        assert!(matches!(
            check_batch_limits(&batch, &limits()),
            Err(Error::GroupTooLarge {
                check: 1,
                pairs: 3,
                max: 2
            })
        ));

        let mut batch = CheckBatch::default();
        batch.push(pair(b"toolong"));
        assert!(matches!(
            check_batch_limits(&batch, &limits()),
            Err(Error::KeyTooLong { len: 7, max: 4 })
        ));

        let mut batch = CheckBatch::default();
        batch.push_check([]);
        assert!(matches!(
            check_batch_limits(&batch, &limits()),
            Err(Error::EmptyGroup { check: 0 })
        ));

        let mut batch = CheckBatch::default();
        batch.push(pair(b""));
        assert!(matches!(
            check_batch_limits(&batch, &limits()),
            Err(Error::EmptyKey)
        ));

        let mut batch = CheckBatch::default();
        batch.push_check([pair(b"a"), pair(b"b")]);
        batch.push(pair(b"four"));
        assert!(check_batch_limits(&batch, &limits()).is_ok());
    }
}
