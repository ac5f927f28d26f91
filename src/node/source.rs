//! The seam between the node and whoever decides its role: a
//! [`RoleSource`].
//!
//! Pair mode ([`PairMode`](super::pair::PairMode)) decides from its peer,
//! from PROMOTE and from heartbeat loss. Cluster mode is meant to be the
//! second implementation: it takes the role from an etcd election, and its
//! [`RoleSource::admit`] adds what pair mode does not know (a lease deadline
//! after which a primary refuses writes; slots owned by another shard,
//! answered MOVED or TRYAGAIN), as new [`Refusal`] variants. The connection
//! code does not change with the mode: it asks [`Node`](super::Node) and
//! answers whatever refusal comes back with its code and message.
//!
//! Contract:
//! - [`admit`](RoleSource::admit) is on every request: atomic loads, no lock
//!   unless it refuses, no I/O;
//! - [`start`](RoleSource::start) and [`duties`](RoleSource::duties) are the
//!   source's own tasks, run by the supervisor; `duties` is dropped and asked
//!   again whenever the role changes;
//! - a source changes the role only through [`RoleState`](super::RoleState)'s
//!   transitions.

use super::role::EpochError;
use std::future::Future;
use std::pin::Pin;
use tollgate_protocol::{Announce, ErrorCode, Role};

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
/// ERROR frame with [`code`](Refusal::code) and the `Display` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A standby: writes go to `primary` (None while it knows none).
    NotPrimary { primary: Option<String>, epoch: u64 },
    /// A standby knows a higher epoch than this primary: this node has been
    /// replaced and must not feed it.
    StaleEpoch { ours: u64, theirs: u64 },
    /// Another node claimed an epoch this node does not believe, or a
    /// promotion would pass the largest epoch.
    Epoch(EpochError),
}

impl From<EpochError> for Refusal {
    fn from(e: EpochError) -> Self {
        Self::Epoch(e)
    }
}

impl Refusal {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotPrimary { .. } => ErrorCode::NotPrimary,
            Self::StaleEpoch { .. } => ErrorCode::StaleEpoch,
            // A value out of the range this node accepts.
            Self::Epoch(EpochError::TooFar { .. }) => ErrorCode::Malformed,
            Self::Epoch(EpochError::Exhausted(_)) => ErrorCode::Internal,
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
            Self::Epoch(e) => e.fmt(f),
        }
    }
}

/// Whoever decides this node's role.
pub(crate) trait RoleSource: Send + Sync {
    /// Whether this node may serve `access` now.
    fn admit(&self, access: Access) -> Result<(), Refusal>;

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
}
