//! A shard: the nodes that serve one slot range (a primary and its
//! standby), its current connection, and the life cycle of that connection
//! (lazy connect, reconnect, backoff). Cluster mode (`cluster`) holds one
//! `Shard` per shard of the slot map; everything here is about one.
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
//! - the call path reads the current connection lock-free (`current`); the
//!   state mutex is taken only when there is none or it died;
//! - at most one connection attempt runs at a time, in its own task,
//!   bounded by `connect_timeout`, so a call that stops waiting does not
//!   abort it and a fleet of concurrent calls starts one attempt;
//! - a call never waits longer than its deadline, connecting included;
//! - while backing off, or retrying after a failure, calls fail at once
//!   ([`Error::Unavailable`]); only the first attempt (or a reconnect
//!   after a healthy connection died) is waited for;
//! - a connection that died before answering anything past its handshake
//!   counts as a failed attempt: the first in a row is replaced at once,
//!   the next ones after the backoff (no reconnect per call to a server
//!   that accepts HELLO and drops every connection);
//! - each node has a circuit breaker: calls to a node whose breaker is
//!   open fail at once ([`Error::BreakerOpen`]), connected or not, and a
//!   round over several nodes skips it, so a hung primary does not hold up
//!   finding its standby. A one-node shard's connection attempt asks the
//!   breaker first and, once a probe is due, is that probe: the calls that
//!   come meanwhile fail at once rather than wait for its handshake.
//!
//! A round over several nodes opens every (non-skipped) address at once and
//! keeps the node whose handshake says *primary* with the highest epoch.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_protocol::{Role, ServerLimits};

use crate::backoff;
use crate::breaker::Breaker;
use crate::config::ClientConfig;
use crate::connection::{Connection, Deadline, ServerInfo};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::node::Node;

/// How long a caller waits for a connection.
#[derive(Clone, Copy)]
pub(crate) enum Wait {
    /// Up to the call's deadline; fail fast while backing off.
    Until(Deadline),
    /// Until the attempt in progress ends, and report its error.
    AttemptResult,
}

pub(crate) struct Shard {
    nodes: Vec<Arc<Node>>,
    config: ClientConfig,
    /// The live connection, for the lock-free call path.
    current: ArcSwapOption<Connection>,
    state: Mutex<State>,
    /// Woken when a connection attempt ends (or the shard closes), so calls
    /// waiting for the attempt re-read `state`.
    attempt_ended: Notify,
}

struct State {
    phase: Phase,
    /// Consecutive failed attempts and connections lost before answering
    /// anything; sizes the backoff. Reset when a lost connection had
    /// answered.
    failures: u32,
    /// From the last successful handshake; kept across reconnects.
    info: Option<ServerInfo>,
    /// Which node the current (or last) connection went to.
    connected_to: Option<usize>,
}

enum Phase {
    Idle,
    /// An attempt task is running; `retrying_after` is the failure that
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

impl Shard {
    pub(crate) fn new(
        addrs: Vec<String>,
        config: ClientConfig,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        let now = Instant::now();
        let nodes = addrs
            .into_iter()
            .map(|addr| {
                Arc::new(Node::new(
                    addr,
                    Breaker::new(config.breaker.clone(), now),
                    metrics.clone(),
                ))
            })
            .collect();
        Self {
            nodes,
            config,
            current: ArcSwapOption::empty(),
            state: Mutex::new(State {
                phase: Phase::Idle,
                failures: 0,
                info: None,
                connected_to: None,
            }),
            attempt_ended: Notify::new(),
        }
    }

    pub(crate) fn addrs(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(|n| n.addr.as_str())
    }

    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len()
    }

    pub(crate) fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    pub(crate) fn connected_addr(&self) -> Option<String> {
        let index = self.state.lock().connected_to?;
        self.nodes.get(index).map(|n| n.addr.clone())
    }

    pub(crate) fn server_info(&self) -> Option<ServerInfo> {
        self.state.lock().info
    }

    /// The limits the server announced in the last handshake: the current
    /// connection's, read without a lock, else the last one kept. `None`
    /// before the first handshake.
    pub(crate) fn announced_limits(&self) -> Option<ServerLimits> {
        if let Some(conn) = self.current.load().as_ref() {
            return Some(conn.info().limits);
        }
        self.state.lock().info.map(|info| info.limits)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.current
            .load()
            .as_ref()
            .filter(|c| c.is_alive())
            .map_or(0, |c| c.in_flight())
    }

    /// Closes the connection; every later call fails with `Closed`.
    pub(crate) fn close(&self) {
        let previous = std::mem::replace(&mut self.state.lock().phase, Phase::Closed);
        self.current.store(None);
        if let Phase::Connected(conn) = previous {
            conn.shut_down();
        }
        self.attempt_ended.notify_waiters();
    }

    /// Drops `conn` if it is still the current connection, so the next call
    /// starts a fresh attempt (for several nodes: a new round).
    pub(crate) fn invalidate(&self, conn: &Arc<Connection>) {
        let state = self.state.lock();
        if let Phase::Connected(current) = &state.phase {
            if Arc::ptr_eq(current, conn) {
                current.shut_down();
                self.current.store(None);
            }
        }
    }

    /// Drops the current connection whatever it is, so the next call starts
    /// a new round (cluster mode: a MOVED named another node of the shard).
    pub(crate) fn drop_connection(&self) {
        let state = self.state.lock();
        if let Phase::Connected(current) = &state.phase {
            current.shut_down();
            self.current.store(None);
        }
    }

    /// The live connection whose node admits a call, starting an attempt if
    /// there is none.
    pub(crate) async fn connection(self: &Arc<Self>, wait: Wait) -> Result<Arc<Connection>, Error> {
        if let Some(ready) = self.ready() {
            return ready;
        }
        // One node: while its breaker refuses, fail at once rather than
        // wait for (or start) a connection attempt that the breaker says
        // is likely to hang. A shard of several nodes skips such nodes in
        // its round instead.
        if let [node] = &self.nodes[..] {
            node.refuses()?;
        }
        // Boxed: the slow path's state (a Notified, a timer) would otherwise
        // be part of every call's future, and be moved with it.
        let conn = Box::pin(self.connection_slow(wait)).await?;
        conn.node().admit()?;
        Ok(conn)
    }

    /// The fast path, without a future: connected, alive, breaker closed.
    /// No lock. `None` when the slow path must run.
    pub(crate) fn ready(&self) -> Option<Result<Arc<Connection>, Error>> {
        let current = self.current.load();
        let conn = current.as_ref().filter(|c| c.is_alive())?;
        Some(conn.node().admit().map(|()| Arc::clone(conn)))
    }

    async fn connection_slow(self: &Arc<Self>, wait: Wait) -> Result<Arc<Connection>, Error> {
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
            // One node whose breaker is not closed: the attempt under way
            // is its probe; the other calls fail at once (the probe may
            // outlive the breaker's probe time, up to connect_timeout).
            Phase::Connecting { .. } => {
                return match (wait, &self.nodes[..]) {
                    (Wait::Until(_), [node]) => node.probing().err().map(Err),
                    _ => None,
                };
            }
            Phase::Connected(dead) => {
                // A connection that answered nothing past its handshake
                // proved nothing: its loss counts as a failed attempt, so a
                // server that accepts HELLO and drops every connection is
                // not reconnected to in a loop, once per call. The first
                // such loss in a row still reconnects at once (a CHECK2 is
                // resent on that new connection); from the second the
                // backoff applies, growing with each.
                if dead.answered() {
                    state.failures = 0;
                } else {
                    state.failures = state.failures.saturating_add(1);
                    if state.failures > 1 {
                        return Some(Err(self.back_off_unanswered(&mut state, wait)));
                    }
                }
            }
            Phase::Idle => {}
        }
        // Idle, dead connection, or backoff over: this caller starts the one
        // attempt; every other caller finds `Connecting`.
        let retrying_after = match std::mem::replace(&mut state.phase, Phase::Idle) {
            Phase::BackingOff { cause, .. } => Some(cause),
            _ => None,
        };
        self.current.store(None);
        state.phase = Phase::Connecting { retrying_after };
        drop(state);
        tokio::spawn(Arc::clone(self).attempt());
        None
    }

    /// After a second connection in a row lost before answering anything:
    /// no attempt before the backoff (sized by `failures`) has passed. The
    /// error for the caller that found it.
    fn back_off_unanswered(&self, state: &mut State, wait: Wait) -> Error {
        let delay = backoff::delay(
            self.config.backoff_min,
            self.config.backoff_max,
            state.failures - 1,
        );
        tracing::debug!(addrs = ?self.addrs().collect::<Vec<_>>(), failures = state.failures, retry_in = ?delay, "connection lost before answering anything; backing off");
        let cause = Arc::new(Error::ConnectionLost);
        self.current.store(None);
        state.phase = Phase::BackingOff {
            until: Instant::now() + delay,
            cause: Arc::clone(&cause),
        };
        match wait {
            Wait::AttemptResult => Error::ConnectionLost,
            Wait::Until(_) => Error::Unavailable {
                retry_in: delay,
                cause,
            },
        }
    }

    /// One connection attempt; publishes its result and wakes the waiters.
    async fn attempt(self: Arc<Self>) {
        let result = match &self.nodes[..] {
            [node] => {
                // The attempt asks the breaker first: while it is open the
                // attempt fails at once, and once a probe is due the
                // attempt is the probe, so its result closes the breaker
                // or opens it again for twice as long.
                let result = match node.admit() {
                    Ok(()) => {
                        let result = Connection::open(Arc::clone(node), &self.config).await;
                        node.record(u32::from(result.is_ok()), u32::from(result.is_err()));
                        result
                    }
                    Err(refused) => Err(refused),
                };
                result.map(|c| (c, 0))
            }
            nodes => self.round(nodes).await,
        };
        {
            let mut guard = self.state.lock();
            let state = &mut *guard;
            // Closed meanwhile: drop the new connection (stopping its tasks).
            if !matches!(state.phase, Phase::Closed) {
                match result {
                    Ok((conn, index)) => {
                        // `failures` is reset once the connection answers
                        // (see `ready_or_start`): a handshake alone is no
                        // proof the node serves.
                        state.info = Some(*conn.info());
                        state.connected_to = Some(index);
                        let conn = Arc::new(conn);
                        self.current.store(Some(Arc::clone(&conn)));
                        state.phase = Phase::Connected(conn);
                    }
                    Err(error) => {
                        state.failures = state.failures.saturating_add(1);
                        let mut delay = backoff::delay(
                            self.config.backoff_min,
                            self.config.backoff_max,
                            state.failures,
                        );
                        if let Error::BreakerOpen { retry_in, .. } = &error {
                            delay = delay.max(*retry_in);
                        }
                        // Once per outage: a dead server must not flood the
                        // log with one line per backoff step.
                        if state.failures == 1 {
                            tracing::warn!(addrs = ?self.addrs().collect::<Vec<_>>(), %error, retry_in = ?delay, "connection attempt failed");
                        } else {
                            tracing::debug!(addrs = ?self.addrs().collect::<Vec<_>>(), %error, failures = state.failures, retry_in = ?delay, "connection attempt failed");
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

    /// Opens every node whose breaker does not skip it, at once, and keeps
    /// the one that says it is primary with the highest epoch (the first on
    /// a tie); the other connections are closed.
    async fn round(&self, nodes: &[Arc<Node>]) -> Result<(Connection, usize), Error> {
        let now = Instant::now();
        let mut attempts = tokio::task::JoinSet::new();
        let mut skipped = None;
        for (index, node) in nodes.iter().enumerate() {
            if node.skip(now) {
                skipped.get_or_insert(index);
                continue;
            }
            let (node, config) = (Arc::clone(node), self.config.clone());
            attempts.spawn(async move {
                let result = Connection::open(Arc::clone(&node), &config).await;
                node.record(u32::from(result.is_ok()), u32::from(result.is_err()));
                (index, result)
            });
        }
        if attempts.is_empty() {
            let node = &nodes[skipped.unwrap_or(0)];
            return Err(match node.admit() {
                Err(e) => e,
                Ok(()) => Error::NoPrimary {
                    tried: 0,
                    standbys: 0,
                    last_error: None,
                },
            });
        }
        let mut best: Option<(Connection, usize)> = None;
        let mut standbys = 0;
        let mut last_error = None;
        while let Some(joined) = attempts.join_next().await {
            let Ok((index, result)) = joined else {
                continue;
            };
            match result {
                Ok(conn) if conn.info().role == Role::Primary => {
                    let better = best.as_ref().is_none_or(|(b, i)| {
                        (conn.info().epoch, std::cmp::Reverse(index))
                            > (b.info().epoch, std::cmp::Reverse(*i))
                    });
                    if better {
                        best = Some((conn, index));
                    }
                }
                Ok(_) => standbys += 1,
                Err(e) => last_error = Some(Arc::new(e)),
            }
        }
        if let Some((conn, index)) = best {
            tracing::debug!(addr = %nodes[index].addr, epoch = conn.info().epoch, "primary found");
            return Ok((conn, index));
        }
        Err(Error::NoPrimary {
            tried: nodes.len(),
            standbys,
            last_error,
        })
    }
}
