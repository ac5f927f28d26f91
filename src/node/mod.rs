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
//!  them (Handover); status.rs, metrics.rs: what the node reports;
//!  store_settings.rs (and cluster/settings.rs): the store's (etcd's)
//!  settings made from the server's, which `config` holds as plain values
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
//! Pair mode (`--peer`, `--replica-of`, pair.rs) and cluster mode
//! (`--etcd`, cluster/, feature `cluster`: roles from etcd, MOVED and
//! TryAgain per slot through a [`Gate`]) are the two `RoleSource`s.

#[cfg(feature = "cluster")]
mod cluster;
mod credentials;
mod gate;
mod link;
mod metrics;
mod pair;
mod refusal;
pub(crate) mod regions;
mod replication;
mod role;
mod shared;
mod source;
pub(crate) mod status;
mod store_settings;
mod supervisor;

#[cfg(feature = "cluster")]
pub(crate) use cluster::{check_settings as check_cluster_settings, etcd_access, Membership};
pub(crate) use credentials::Credentials;
pub(crate) use gate::Gate;
pub(crate) use refusal::Refusal;
pub(crate) use shared::Handover;
pub(crate) use source::Access;
pub(crate) use supervisor::Supervisor;

use crate::clock::Clock;
use crate::config::ReplicationSettings;
use crate::store::{MergeRefused, Store};
use crate::tls::Tls;
use metrics::ReplMetrics;
use pair::PairMode;
use prometheus::Registry;
use regions::{RegionConfig, Regions};
use replication::records::key_write;
use role::RoleState;
use shared::Core;
use source::RoleSource;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;
use tollgate_protocol::{Announce, ClusterTopology, NodeStatus, Record, Role, ServerLimits};

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
    /// The usage exchange of global limits (None: in no region).
    regions: Option<Arc<Regions>>,
}

/// What a node is built from.
pub(crate) struct NodeParts {
    pub settings: ReplicationSettings,
    /// What the node proves (or presents) to other nodes in HELLO.
    pub credentials: credentials::Credentials,
    /// TLS for its own connections to other nodes.
    pub tls: Option<Arc<Tls>>,
    pub limits: ServerLimits,
    /// Where the node is reached until the listener is bound (`--advertise`,
    /// else the address it listens on).
    pub advertise: String,
    pub store: Arc<Store>,
    pub clock: Arc<dyn Clock>,
    /// This node's region and its peers (None: in no region).
    pub regions: Option<RegionConfig>,
    /// Cluster mode: the membership `serve` joined (None: pair mode).
    #[cfg(feature = "cluster")]
    pub cluster: Option<Membership>,
}

impl Node {
    /// A node (in pair mode, or in the cluster it joined), and the task
    /// that runs its duties. Its metrics go into `registry`.
    pub fn new(parts: NodeParts, registry: &Registry) -> prometheus::Result<(Self, Supervisor)> {
        let metrics = ReplMetrics::register(registry)?;
        let settings = parts.settings;
        let regions = parts
            .regions
            .map(|c| Regions::new(c, parts.store.clone(), parts.clock.now(), registry))
            .transpose()?
            .map(Arc::new);
        #[cfg(feature = "cluster")]
        let (role, primary) = match &parts.cluster {
            // A cluster node follows nobody until its duties read etcd.
            Some(_) => (Role::Standby, None),
            None => PairMode::starting_role(&settings),
        };
        #[cfg(not(feature = "cluster"))]
        let (role, primary) = PairMode::starting_role(&settings);
        let core = Arc::new(Core {
            role: RoleState::new(role, primary, parts.advertise, settings.max_epoch_gap),
            store: parts.store,
            clock: parts.clock,
            settings,
            credentials: parts.credentials,
            tls: parts.tls,
            limits: parts.limits,
        });
        #[cfg(feature = "cluster")]
        let source: Arc<dyn RoleSource> = match parts.cluster {
            Some(membership) => Arc::new(cluster::ClusterMode::new(
                core.clone(),
                membership,
                registry,
            )?),
            None => Arc::new(PairMode::new(core.clone())),
        };
        #[cfg(not(feature = "cluster"))]
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
            regions,
        };
        Ok((node, supervisor))
    }

    /// Whether this node serves `access` to the counters now, and a gate
    /// that screens the request's slots; the refusal says why not and
    /// where to go instead.
    pub fn admit(&self, access: Access) -> Result<Gate<'_>, Refusal> {
        self.source.admit(access)
    }

    /// The slot map, as TOPOLOGY answers it: the cluster's, or outside a
    /// cluster one shard owning every slot, served by this node (or by the
    /// primary a standby follows).
    pub fn topology(&self) -> ClusterTopology {
        self.source
            .topology()
            .unwrap_or_else(|| ClusterTopology::single_node(&status::status(&self.core)))
    }

    /// This node's place in its cluster and the routing table it serves
    /// from (`GET /v1/cluster`); None outside a cluster.
    pub fn cluster_json(&self) -> Option<serde_json::Value> {
        self.source.describe()
    }

    /// At shutdown, once no request is served any more: leave the cluster
    /// (nothing outside one).
    pub async fn leave(&self) {
        self.source.leave().await;
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
        self.source.leads()?;
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
    /// them. Returns how many records changed a state here. A state that
    /// would add a key past `--max-memory` evicts by `--on-full evict`; by
    /// `refuse` it is not merged, and the frame is answered
    /// [`Refusal::StoreFull`] once the others are (a merge is idempotent:
    /// the sender may send it all again).
    pub fn take_handoff(&self, epoch: u64, records: &[Record]) -> Result<u32, Refusal> {
        self.source.leads()?;
        let gate = self.source.admit(Access::Write)?;
        let now = self.core.clock.now();
        let store = &self.core.store;
        let (mut merged, mut refused) = (0u32, 0u32);
        // In a cluster, states of slots this shard neither owns nor
        // receives are not ours to keep (the sender's map was older).
        for record in records.iter().filter(|r| gate.receives(&r.key)) {
            match store.merge(&key_write(record), now) {
                Ok(true) => merged += 1,
                Ok(false) => {}
                Err(MergeRefused) => refused += 1,
            }
        }
        // At most a frame's worth of records, far below u32::MAX.
        let total = u32::try_from(records.len()).unwrap_or(u32::MAX);
        // The HANDOFF's `epoch` is the sender's current one (PROTOCOL.md
        // §13): a node that stepped down already carries its new
        // primary's, so it is not logged as the epoch it served at.
        if refused > 0 {
            tracing::warn!(
                sender_epoch = epoch,
                records = total,
                merged,
                refused,
                "handed-over states refused: the store is at its memory cap"
            );
            return Err(Refusal::StoreFull {
                refused,
                records: total,
            });
        }
        let stats = &self.core.role.stats;
        stats.handoffs_received.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            sender_epoch = epoch,
            records = total,
            merged,
            "merged states handed over by another node"
        );
        Ok(merged)
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

    /// The regions layer, when this node is in a region.
    pub fn regions(&self) -> Option<&Regions> {
        self.regions.as_deref()
    }

    /// The usage exchange with the other regions, to run beside the
    /// listener until `shutdown` (None: in no region).
    pub fn exchange(
        &self,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let regions = self.regions.clone()?;
        Some(regions::run(self.core.clone(), regions, shutdown))
    }

    /// Copies the replication numbers into the metrics (before a scrape).
    pub fn refresh_metrics(&self) {
        self.metrics.refresh(&self.core);
        self.source.refresh_metrics();
    }
}
