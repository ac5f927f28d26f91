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
use metrics::ReplMetrics;
use pair::PairMode;
use prometheus::Registry;
use replication::records::key_write;
use role::RoleState;
use shared::Core;
use source::RoleSource;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tollgate_protocol::{Announce, NodeStatus, Record, Role, ServerLimits};

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
    pub auth_token: Option<String>,
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
            role: RoleState::new(role, primary, parts.advertise),
            store: parts.store,
            clock: parts.clock,
            settings,
            auth_token: parts.auth_token,
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
    /// be a primary that has not been replaced.
    pub fn accept_replica(&self, epoch: u64) -> Result<(), Refusal> {
        let role = &self.core.role;
        role.heard_of_epoch(epoch);
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

    /// HANDOFF: merges another node's states into ours, each key keeping
    /// the copy with less quota left. Only a node serving writes takes
    /// them. Returns how many records changed a state here.
    pub fn take_handoff(&self, epoch: u64, records: &[Record]) -> Result<u32, Refusal> {
        self.source.admit(Access::Write)?;
        let now = self.core.clock.now();
        let store = &self.core.store;
        let merged = records
            .iter()
            .filter(|r| store.merge(&key_write(r), now))
            .count();
        let stats = &self.core.role.stats;
        stats.handoffs_received.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            from_epoch = epoch,
            records = records.len(),
            merged,
            "merged states handed over by another node"
        );
        // At most a frame's worth of records, far below u32::MAX.
        Ok(u32::try_from(merged).unwrap_or(u32::MAX))
    }

    /// PROMOTE: the epoch this node is primary at, and whether it already
    /// was primary.
    pub fn promote(&self) -> Result<(u64, bool), Refusal> {
        self.source.promote()
    }

    /// STATUS, after taking in what the asking node says of itself.
    pub fn status(&self, announce: Option<&Announce>) -> NodeStatus {
        if let Some(announce) = announce {
            self.source.heard_of(announce);
        }
        status::status(&self.core)
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
