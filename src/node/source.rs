//! The seam between the node and whoever decides its role: a
//! [`RoleSource`].
//!
//! Pair mode ([`PairMode`](super::pair::PairMode)) decides from its peer,
//! from PROMOTE and from heartbeat loss. Cluster mode
//! (`ClusterMode`, feature `cluster`) takes the role from an etcd election
//! and adds what pair mode does not know: a lease deadline after which a
//! primary refuses writes, and slots owned by another shard, answered
//! MOVED or TryAgain per request ([`Gate`]). The connection code does not
//! change with the mode: it asks [`Node`](super::Node) for a gate, screens
//! the request through it, and answers whatever refusal comes back.
//!
//! Contract:
//! - [`admit`](RoleSource::admit) is on every request: atomic loads (and,
//!   in cluster mode, one load of the routing table), no lock unless it
//!   refuses, no I/O;
//! - [`start`](RoleSource::start) and [`duties`](RoleSource::duties) are the
//!   source's own tasks, run by the supervisor; `duties` is dropped and asked
//!   again whenever the role changes;
//! - a source changes the role only through [`RoleState`](super::RoleState)'s
//!   transitions.

use super::gate::Gate;
use super::refusal::Refusal;
use std::future::Future;
use std::pin::Pin;
use tollgate_protocol::{Announce, ClusterTopology, Role};

/// A task of a role source, run by the supervisor until it ends or is
/// dropped.
pub(crate) type Duty<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// What a request does to the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// CHECK, REFUND, RELEASE, RESET: only a primary serves them.
    Write,
    /// PEEK: a standby may answer from its copy if told to.
    Read,
}

/// Whoever decides this node's role.
pub(crate) trait RoleSource: Send + Sync {
    /// Whether this node may serve `access` now, and for which keys (the
    /// gate screens a request's slots).
    fn admit(&self, access: Access) -> Result<Gate<'_>, Refusal>;

    /// Whether this node acts as its shard's primary now (replication,
    /// handoffs): the role, and in cluster mode a valid lease.
    fn leads(&self) -> Result<(), Refusal>;

    /// Settles the starting role (requests are refused meanwhile unless
    /// the node starts as primary).
    fn start(&self) -> Duty<'_>;

    /// What the source does while the node holds `role`.
    fn duties(&self, role: Role) -> Duty<'_>;

    /// An operator's PROMOTE: the epoch the node is primary at, and whether
    /// it already was.
    fn promote(&self) -> Result<(u64, bool), Refusal>;

    /// Another node described itself (a STATUS announce); refused when its
    /// epoch is not believable.
    fn heard_of(&self, announce: &Announce) -> Result<(), Refusal>;

    /// The slot map (TOPOLOGY); None outside a cluster (the node answers
    /// as one shard owning every slot).
    fn topology(&self) -> Option<ClusterTopology> {
        None
    }

    /// What `GET /v1/cluster` shows; None outside a cluster.
    fn describe(&self) -> Option<serde_json::Value> {
        None
    }

    /// Copies what the source reports into its metrics (before a scrape).
    fn refresh_metrics(&self) {}

    /// Leaves gracefully at shutdown, once the node serves no more
    /// requests (cluster mode: revokes the etcd lease, so a standby takes
    /// over at once).
    fn leave(&self) -> Duty<'_> {
        Box::pin(async {})
    }
}
