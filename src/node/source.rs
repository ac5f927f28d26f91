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
use super::role::EpochError;
use std::future::Future;
use std::pin::Pin;
use tollgate_protocol::{Announce, ClusterTopology, ErrorCode, Role};

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

/// Why this node does not serve a request here and now. Each answers as an
/// ERROR frame with [`code`](Refusal::code) and the `Display` message,
/// except [`Refusal::Moved`], which answers MOVED.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) enum Refusal {
    /// A standby: writes go to `primary` (None while it knows none).
    NotPrimary { primary: Option<String>, epoch: u64 },
    /// A standby knows a higher epoch than this primary: this node has been
    /// replaced and must not feed it.
    StaleEpoch { ours: u64, theirs: u64 },
    /// Cluster mode: `slot` is served by the primary at `addr` (topology
    /// `version`). Nothing of the request was evaluated.
    Moved {
        slot: u16,
        addr: String,
        version: u64,
    },
    /// Cluster mode: nobody may serve the request right now.
    TryAgain(Busy),
    /// Cluster mode: etcd elects primaries; PROMOTE is not used.
    ElectedByEtcd,
    /// Another node claimed an epoch this node does not believe, or a
    /// promotion would pass the largest epoch.
    Epoch(EpochError),
    /// HANDOFF: `refused` of the frame's `records` would have added keys
    /// past `--max-memory` with `--on-full refuse`; they were not merged
    /// (the others were).
    StoreFull { refused: u32, records: u32 },
}

impl From<EpochError> for Refusal {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}

/// Why a slot cannot be served right now (cluster mode), answered
/// TryAgain: nothing was charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) enum Busy {
    /// The node has no topology (the cluster watch has not loaded one).
    NoTopology,
    /// The slots `first..=last` move from shard `from` to `to`.
    Moving {
        first: u16,
        last: u16,
        from: u16,
        to: u16,
    },
    /// The shard owning the slot has no primary (failover in progress).
    NoPrimary { shard: u16 },
    /// This node is the shard's primary at `epoch`, but its etcd lease is
    /// no longer known valid: it serves nothing until a renewal lands, or
    /// until another node is elected.
    LeaseExpired { epoch: u64 },
}

impl Refusal {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotPrimary { .. } | Self::ElectedByEtcd => ErrorCode::NotPrimary,
            Self::StaleEpoch { .. } => ErrorCode::StaleEpoch,
            Self::TryAgain(_) => ErrorCode::TryAgain,
            // Answered MOVED, not ERROR; the nearest code if one is needed.
            Self::Moved { .. } => ErrorCode::NotPrimary,
            // A value out of the range this node accepts.
            Self::Epoch(EpochError::TooFar { .. }) => ErrorCode::Malformed,
            Self::Epoch(EpochError::Exhausted(_)) => ErrorCode::Internal,
            Self::StoreFull { .. } => ErrorCode::StoreFull,
        }
    }
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoTopology => f.write_str("this node has no cluster topology yet"),
            Self::Moving {
                first,
                last,
                from,
                to,
            } => write!(
                f,
                "slots {first}-{last} are moving from shard {from} to shard {to}"
            ),
            Self::NoPrimary { shard } => write!(f, "shard {shard} has no primary right now"),
            Self::LeaseExpired { epoch } => write!(
                f,
                "this primary's etcd lease (epoch {epoch}) is not known valid: \
                 it serves nothing until etcd renews it or elects another primary"
            ),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotPrimary {
                primary: Some(p),
                epoch,
            } => write!(f, "this node is a standby of {p} (epoch {epoch})"),
            Self::NotPrimary { primary: None, .. } => {
                f.write_str("this node is a standby and knows no primary yet")
            }
            Self::StaleEpoch { ours, theirs } => write!(
                f,
                "this primary is at epoch {ours}, the standby knows epoch {theirs}: \
                 this node has been replaced"
            ),
            Self::Moved {
                slot,
                addr,
                version,
            } => write!(f, "slot {slot} is served by {addr} (topology {version})"),
            Self::TryAgain(busy) => write!(f, "try again: {busy}"),
            Self::ElectedByEtcd => {
                f.write_str("cluster mode: etcd elects each shard's primary, PROMOTE is not used")
            }
            Self::Epoch(e) => e.fmt(f),
            Self::StoreFull { refused, records } => write!(
                f,
                "the store is at its memory cap (--max-memory, --on-full refuse): {refused} of \
                 the {records} handed-over states would add keys and were not merged"
            ),
        }
    }
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
