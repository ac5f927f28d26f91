//! One server node of a shard: its address and its circuit breaker, which
//! the shard consults to pick a node and each connection feeds with its
//! calls' answers and failures.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::breaker::{Breaker, BreakerState};
use crate::error::Error;
use crate::metrics::Metrics;

/// One node of a shard and its circuit breaker.
pub(crate) struct Node {
    pub addr: String,
    breaker: Breaker,
    metrics: Option<Arc<Metrics>>,
}

impl Node {
    pub(crate) fn new(addr: String, breaker: Breaker, metrics: Option<Arc<Metrics>>) -> Self {
        Self {
            addr,
            breaker,
            metrics,
        }
    }

    /// Counts answers and failures of calls to this node; logs and counts a
    /// breaker transition.
    pub(crate) fn record(&self, answered: u32, failed: u32) {
        if let Some(t) = self.breaker.record(answered, failed, Instant::now()) {
            self.transition(t.to);
        }
    }

    /// Whether a call may go to this node now.
    pub(crate) fn admit(&self) -> Result<(), Error> {
        // A closed breaker admits without the time: no clock read on every
        // call's path (a read was ~2% of a client's CPU at batch 1).
        if self.breaker.state() == BreakerState::Closed {
            return Ok(());
        }
        match self.breaker.admit(Instant::now()) {
            Ok(None) => Ok(()),
            Ok(Some(t)) => {
                self.transition(t.to);
                Ok(())
            }
            Err(retry_in) => Err(self.breaker_open(retry_in)),
        }
    }

    /// The refusal of a call while this node's breaker is open.
    fn breaker_open(&self, retry_in: Duration) -> Error {
        Error::BreakerOpen {
            addr: self.addr.clone(),
            retry_in,
        }
    }

    /// `Err(BreakerOpen)` when a call to this node would be refused now
    /// (open, or half-open with its probe out), without taking the probe.
    pub(crate) fn refuses(&self) -> Result<(), Error> {
        // Closed (nearly always): no clock read.
        if self.breaker.state() == BreakerState::Closed {
            return Ok(());
        }
        match self.breaker.refusing(Instant::now()) {
            None => Ok(()),
            Some(retry_in) => Err(self.breaker_open(retry_in)),
        }
    }

    /// `Err(BreakerOpen)` while the breaker is not closed: a connection
    /// attempt to this node under way is then its probe, and other calls
    /// fail at once rather than wait for it.
    pub(crate) fn probing(&self) -> Result<(), Error> {
        if self.breaker.state() == BreakerState::Closed {
            return Ok(());
        }
        let retry_in = self.breaker.refusing(Instant::now());
        Err(self.breaker_open(retry_in.unwrap_or(Duration::ZERO)))
    }

    /// Whether a round over the shard's nodes should skip this one (its
    /// breaker open, not yet due for a probe).
    pub(crate) fn skip(&self, now: Instant) -> bool {
        self.breaker.skip(now)
    }

    pub(crate) fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    fn transition(&self, to: BreakerState) {
        match to {
            BreakerState::Open => {
                tracing::warn!(addr = %self.addr, "circuit breaker open: calls fail fast")
            }
            BreakerState::HalfOpen => {
                tracing::info!(addr = %self.addr, "circuit breaker half-open: probing")
            }
            BreakerState::Closed => tracing::info!(addr = %self.addr, "circuit breaker closed"),
        }
        if let Some(m) = &self.metrics {
            m.breaker_transition(&self.addr, to);
        }
    }
}
