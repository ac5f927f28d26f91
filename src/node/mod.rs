//! The node: who is primary, at which epoch, and the replication that keeps
//! a standby's copy; later, the node's place in a cluster.
//!
//! ```text
//!  server (connections, admin) ──> Node (this module: the handle)
//!                                    │ admit / greeting / promote / status / hand_over
//!                                    ▼
//!                          RoleSource (source.rs): who decides the role
//!                                    │ pair mode (pair.rs): peer probes, PROMOTE,
//!                                    │ failover after heartbeat loss
//!                                    ▼
//!                          RoleState (role.rs): role, epoch, offset, stats
//!                                    ▲
//!  Supervisor (supervisor.rs): per role, the source's duties and the
//!    replication tasks (replication/: primary feed, standby follower)
//!
//!  shared.rs: what those tasks share (Core) and what a connection hands
//!  them (Handover); status.rs, metrics.rs: what the node reports
//! ```
//!
//! Invariants:
//! - this layer never imports the server: what it needs from a connection
//!   comes through the narrow types defined here ([`Handover`], the
//!   [`Access`] of a request) and goes back as typed answers ([`Refusal`],
//!   [`Greeting`], a `NodeStatus`);
//! - only the role source and the replication tasks change the role state,
//!   and every change goes through `RoleState`'s transitions, which log it
//!   and wake the supervisor;
//! - [`Node::admit`] is on every request: it reads atomics, takes no lock
//!   unless it refuses, and does no I/O.
//!
//! Pair mode (`--peer`, `--replica-of`) is the one `RoleSource` today;
//! cluster mode is meant to be the second, deciding roles from etcd and
//! adding refusals of its own (see `source.rs`).

mod link;
mod metrics;
mod pair;
mod replication;
mod role;
mod shared;
mod source;
pub(crate) mod status;
mod supervisor;

pub(crate) use shared::Handover;
pub(crate) use source::{Access, Refusal};
pub(crate) use supervisor::Supervisor;

use crate::clock::Clock;
use crate::config::ReplicationSettings;
use crate::store::Store;
use crate::tls::Tls;
use metrics::ReplMetrics;
use pair::PairMode;
use prometheus::Registry;
use role::RoleState;
use shared::Core;
use source::RoleSource;
use std::sync::Arc;
use tokio::sync::mpsc;
use tollgate_protocol::{Announce, NodeStatus, Role, ServerLimits};

/// What a node tells a client in HELLO_OK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Greeting {
    pub role: Role,
    pub epoch: u64,
    pub offset: u64,
}

/// The node as connections and the admin API see it. Cheap calls only on
/// the request path; everything slow runs in the [`Supervisor`].
pub(crate) struct Node {
    core: Arc<Core>,
    source: Arc<dyn RoleSource>,
    handovers: mpsc::Sender<Handover>,
    metrics: ReplMetrics,
}

/// What a node is built from.
pub(crate) struct NodeParts {
    pub settings: ReplicationSettings,
    /// What the node presents to other nodes in HELLO (the cluster secret).
    pub secret: Option<String>,
    /// TLS for its own connections to other nodes.
    pub tls: Option<Arc<Tls>>,
    pub limits: ServerLimits,
    /// Where the node is reached until the listener is bound (`--advertise`,
    /// else the address it listens on).
    pub advertise: String,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
}

impl Node {
    /// A node in pair mode, and the task that runs its duties. Its metrics
    /// go into `registry`.
    pub fn new(parts: NodeParts, registry: &Registry) -> prometheus::Result<(Self, Supervisor)> {
        let metrics = ReplMetrics::register(registry)?;
        let settings = parts.settings;
        let (role, primary) = PairMode::starting_role(&settings);
        let core = Arc::new(Core {
            role: RoleState::new(role, primary, parts.advertise, settings.max_epoch_gap),
            store: parts.store,
            clock: parts.clock,
            settings,
            secret: parts.secret,
            tls: parts.tls,
            limits: parts.limits,
        });
        let source: Arc<dyn RoleSource> = Arc::new(PairMode::new(core.clone()));
        // A handover waits here only while the replication task switches
        // roles; a few cover a standby reconnecting meanwhile.
        let (handovers, inbox) = mpsc::channel(4);
        let supervisor = Supervisor::new(core.clone(), source.clone(), inbox);
        let node = Self {
            core,
            source,
            handovers,
            metrics,
        };
        Ok((node, supervisor))
    }

    /// Whether this node serves `access` to the counters now; the refusal
    /// says why not and where to go instead.
    pub fn admit(&self, access: Access) -> Result<(), Refusal> {
        self.source.admit(access)
    }

    pub fn greeting(&self) -> Greeting {
        let role = &self.core.role;
        Greeting {
            role: role.role(),
            epoch: role.epoch(),
            offset: role.offset(),
        }
    }

    /// Whether a standby that knows `epoch` may follow this node: it must
    /// be a primary that has not been replaced, and the epoch believable.
    pub fn accept_replica(&self, epoch: u64) -> Result<(), Refusal> {
        let role = &self.core.role;
        role.heard_of_epoch(epoch)?;
        self.source.admit(Access::Write)?;
        if epoch > role.epoch() {
            return Err(Refusal::StaleEpoch {
                ours: role.epoch(),
                theirs: epoch,
            });
        }
        Ok(())
    }

    /// Gives an accepted REPLICATE's connection to the replication task;
    /// false when that task is gone (shutdown).
    pub async fn hand_over(&self, handover: Handover) -> bool {
        self.handovers.send(handover).await.is_ok()
    }

    /// PROMOTE: the epoch this node is primary at, and whether it already
    /// was primary.
    pub fn promote(&self) -> Result<(u64, bool), Refusal> {
        self.source.promote()
    }

    /// STATUS: role, epoch, offsets and the replication counters.
    pub fn status(&self) -> NodeStatus {
        status::status(&self.core)
    }

    /// STATUS from another node that describes itself: its announce is
    /// taken in first (one with an unbelievable epoch is refused and
    /// changes nothing). Only for connections that proved they are a node.
    pub fn announced(&self, announce: &Announce) -> Result<NodeStatus, Refusal> {
        self.source.heard_of(announce)?;
        Ok(self.status())
    }

    /// Where this node is reached, once the listener is bound (unless
    /// `--advertise` said so).
    pub fn set_advertise(&self, addr: String) {
        if self.core.settings.advertise.is_none() {
            self.core.role.set_advertise(addr);
        }
    }

    /// Copies the replication numbers into the metrics (before a scrape).
    pub fn refresh_metrics(&self) {
        self.metrics.refresh(&self.core);
    }
}
