//! Why a node does not serve a request here and now ([`Refusal`]), and
//! the epochs it will not take ([`EpochError`]): answered to the client as
//! an ERROR (or MOVED) by the connection, raised by the role's state, the
//! role sources and the cluster's slot gate alike.

use tollgate_protocol::ErrorCode;

/// An epoch this node will not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EpochError {
    #[error(
        "epoch {theirs} refused: more than {gap} above the highest epoch known here ({known})"
    )]
    TooFar { theirs: u64, known: u64, gap: u64 },
    #[error("this node knows epoch {0}, the largest there is: no promotion can outrank it")]
    Exhausted(u64),
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
