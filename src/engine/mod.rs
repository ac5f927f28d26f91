//! The check engine: everything that decides a check, behind one
//! [`Engine`] the ports (the binary protocol's connections, RESP, Envoy
//! RLS, the admin API) call.
//!
//! ```text
//!  port (decoded frame) -> Engine::answer / answer_tagged / check_one
//!     -> node gate (slots this node serves), rules (once per frame), now
//!     -> check.rs: resolve rule names, shadow merging, global rules
//!        (check/global.rs), retries (dedup.rs), shedding (shed.rs)
//!     -> store (Slot -> stripe -> algorithm) -> decision
//!     -> counted (check/metrics.rs), denials recorded (throttled),
//!        decision events offered (events)
//! ```
//!
//! The engine owns the store, the rules, the clock, the node handle, the
//! decision events, the list of throttled keys, the retry memory, the
//! shedder and the check path's metrics (`build.rs` makes them from the
//! settings). A port holds the engine through its `Shared` and knows no
//! store or algorithm type: what it needs of them beyond a check (RESET,
//! DEL, EXISTS, the RESP counters in `counter.rs`, a key's usage for the
//! admin API in `inspect.rs`, the store's figures) is wrapped here. The
//! sweeper (`sweeper.rs`) keeps the store's expired keys and gauges in
//! check beside it.
//!
//! Layering: `server -> engine -> node -> store -> algorithm`; the engine
//! also uses rules, events, throttled and clock, and never a port.

mod build;
mod check;
mod counter;
mod dedup;
mod inspect;
mod shed;
mod sweeper;

/// The largest count and period of a limit (CL.THROTTLE's arguments are
/// bounded by them).
pub(crate) use crate::algorithm::{MAX_COUNT, MAX_PERIOD_MS};
/// Charge or peek: what a check does with its cost.
pub use crate::store::Mode;
/// The store, for the server's embedders (tests inspect it).
pub use crate::store::Store;
pub(crate) use build::{BuildError, Built, Setup};
pub(crate) use check::{CheckMetrics, ErrorCounters, GlobalRuleState, UsageError, Verb};
pub(crate) use counter::window_of;
pub(crate) use dedup::{DedupMetrics, Owner, RetryMemory};
pub(crate) use inspect::{Inspected, Usage};
pub(crate) use shed::Shedder;
pub(crate) use sweeper::{KeyMetrics, Sweeper};

use crate::clock::{Clock, Nanos};
use crate::events::Events;
use crate::node::Node;
use crate::rules::Rules;
use crate::throttled::TopThrottled;
use std::sync::Arc;
use tollgate_protocol::Limit;

/// What a connection may do, by what its HELLO proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Privilege {
    /// Checks and the rest of the client protocol; read-only STATUS.
    Client,
    /// A region peer that proved the region secret: USAGE and PING only,
    /// so a region cannot replicate from, promote or hand states to
    /// another region's nodes.
    Region,
    /// Also replication, PROMOTE, HANDOFF, STATUS announces and USAGE:
    /// another node of this cluster.
    Node,
}

/// Whether `limit` is one a check may carry (sliding logs and concurrency
/// capped at `max_log_entries`): the reason it is not, if not.
pub(crate) fn validate(limit: &Limit, max_log_entries: u64) -> Result<(), String> {
    crate::algorithm::Policy::from_limit_with(limit, max_log_entries)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The check engine (see the module docs).
pub(crate) struct Engine {
    store: Arc<Store>,
    clock: Arc<dyn Clock>,
    /// The named rules in force; swapped whole on reload.
    rules: Arc<Rules>,
    /// Who is primary; refusals, status, handovers, regions.
    node: Node,
    /// Decision events (`--events`); None when off.
    events: Option<Events>,
    /// Keys denied most recently, for `GET /v1/throttled`.
    throttled: TopThrottled,
    /// CHECK2 answers by idempotency key (safe retries).
    retries: RetryMemory,
    /// CHECK2 shedding by priority under a connection's backlog.
    shedder: Shedder,
    /// Decisions by rule, frame latency and batch size.
    metrics: CheckMetrics,
    /// Errors answered, by code (the ports count theirs here too).
    errors: ErrorCounters,
}

/// What the store holds, for the status page.
pub(crate) struct StoreFigures {
    pub keys: usize,
    pub memory: usize,
    pub evicted: u64,
    pub refused: u64,
}

impl Engine {
    /// The store (the server's embedders inspect it; the sweeper runs on
    /// it).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The server's time now.
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    pub fn rules(&self) -> &Arc<Rules> {
        &self.rules
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn throttled(&self) -> &TopThrottled {
        &self.throttled
    }

    pub fn metrics(&self) -> &CheckMetrics {
        &self.metrics
    }

    pub fn errors(&self) -> &ErrorCounters {
        &self.errors
    }

    /// Whom a connection's remembered CHECK2 answers belong to (see
    /// [`RetryMemory::owner`]).
    pub fn owner(&self, privilege: Privilege, token: &[u8]) -> Owner {
        self.retries.owner(privilege, token)
    }

    /// Drops every state of `key` (DELETE, RESP DEL); whether it had one.
    pub fn remove(&self, key: &[u8], now: Nanos) -> bool {
        self.store.remove(key, now)
    }

    /// RESET: drops every state of each of `keys`; how many had one.
    pub fn reset(&self, keys: &[bytes::Bytes]) -> u32 {
        let now = self.clock.now();
        // At most max_batch keys (a u16), so this fits.
        keys.iter().filter(|k| self.store.remove(k, now)).count() as u32
    }

    /// Whether `key` holds a live state (RESP EXISTS).
    pub fn holds(&self, key: &[u8], now: Nanos) -> bool {
        !self.store.entries(key, now).is_empty()
    }

    pub fn store_figures(&self) -> StoreFigures {
        StoreFigures {
            keys: self.store.len(),
            memory: self.store.memory_bytes(),
            evicted: self.store.evicted(),
            refused: self.store.refused(),
        }
    }
}
