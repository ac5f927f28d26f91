//! Cluster mode, the second [`RoleSource`]: the node's role comes from
//! etcd (`crate::cluster`), never from the nodes among themselves.
//!
//! ```text
//!  serve --etcd ... --shard S:  Membership::join (lease, registration, watch)
//!  check path (admit):  role (atomic) + lease deadline (atomic) + routing
//!                       table (ArcSwap) -> SlotGate: Local | MOVED | TryAgain
//!  duties (duties.rs):  standby: follow the shard's elected primary at its
//!                       epoch; campaign when the shard has none and this
//!                       copy is complete (or after --campaign-delay)
//!                       primary: step down when the lease is lost or etcd
//!                       names another primary
//! ```
//!
//! Invariants:
//! - the check path never calls etcd: it reads the role, the lease
//!   deadline and one routing table, all atomics;
//! - this node serves its shard's writes only while it is primary, its
//!   lease deadline has not passed, and the table names it (its lease) as
//!   the shard's primary at its epoch; a primary paused past its TTL
//!   answers TryAgain when it resumes, never as primary;
//! - the epoch is the one etcd handed out (the primary key's
//!   `create_revision`): a standby follows only that primary at that
//!   epoch, and a primary refuses a standby that knows a higher one;
//! - a primary that steps down hands its states to the next primary
//!   before it resyncs (`replication::handoff`), as in pair mode.

mod duties;
mod metrics;
mod moves;
mod settings;
pub(super) mod slot_gate;

use super::gate::Gate;
use super::refusal::{Busy, Refusal};
use super::shared::Core;
use super::source::{Access, Duty, RoleSource};
use crate::cluster::{
    ClusterError, ClusterView, Etcd, EtcdSettings, Keyspace, Member, NodeRecord, RoutingTable,
    ShardId,
};
use crate::config::ClusterSettings;
use arc_swap::ArcSwap;
use prometheus::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate_protocol::{Announce, ClusterTopology, MovingSlots, Role, ShardInfo, SlotSpan};

pub(crate) use settings::{check_settings, etcd_access};
use slot_gate::SlotGate;

/// A node's place in a cluster, joined before the server starts: its
/// lease and registration, and the watch that feeds its routing table.
pub(crate) struct Membership {
    etcd: Etcd,
    keys: Keyspace,
    settings: EtcdSettings,
    record: NodeRecord,
    member: Member,
    view: ClusterView,
    campaign_delay: Duration,
}

impl Membership {
    /// Registers this node (reached at `advertise`, admin API at `admin`)
    /// in the cluster and shard `config` names, and starts watching the
    /// cluster. Fails when etcd cannot be reached, the cluster does not
    /// exist, or it has no such shard.
    pub async fn join(
        config: &ClusterSettings,
        advertise: String,
        admin: Option<String>,
    ) -> Result<Self, ClusterError> {
        let settings = settings::etcd_settings(config).map_err(ClusterError::Settings)?;
        if let Some(warning) = settings.slack_warning() {
            tracing::warn!("{warning}");
        }
        let keys = Keyspace::new(config.cluster.as_deref().unwrap_or_default())?;
        let shard = ShardId(config.shard.unwrap_or_default());
        let etcd = Etcd::connect(&settings).await?;
        let record = NodeRecord {
            addr: advertise,
            shard,
            admin,
        };
        let member = Member::join(etcd.clone(), keys.clone(), record.clone(), &settings).await?;
        let view = ClusterView::start(etcd.clone(), keys.clone()).await?;
        Ok(Self {
            etcd,
            keys,
            settings,
            record,
            member,
            view,
            campaign_delay: config.campaign_delay,
        })
    }

    /// Where this node registered itself.
    pub fn advertise(&self) -> &str {
        &self.record.addr
    }
}

/// The role source of a cluster node.
pub(crate) struct ClusterMode {
    core: Arc<Core>,
    shard: ShardId,
    /// This node's address, as registered (`--advertise`).
    me: String,
    etcd: Etcd,
    keys: Keyspace,
    settings: EtcdSettings,
    record: NodeRecord,
    /// The current registration; replaced when etcd lost the lease and
    /// the node joined again.
    member: ArcSwap<Member>,
    tables: Arc<ArcSwap<RoutingTable>>,
    view: ClusterView,
    campaign_delay: Duration,
    metrics: metrics::ClusterMetrics,
}

impl ClusterMode {
    pub fn new(
        core: Arc<Core>,
        membership: Membership,
        registry: &Registry,
    ) -> prometheus::Result<Self> {
        let Membership {
            etcd,
            keys,
            settings,
            record,
            member,
            view,
            campaign_delay,
        } = membership;
        Ok(Self {
            core,
            shard: record.shard,
            me: record.addr.clone(),
            etcd,
            keys,
            settings,
            record,
            member: ArcSwap::from_pointee(member),
            tables: view.tables(),
            view,
            campaign_delay,
            metrics: metrics::ClusterMetrics::register(registry)?,
        })
    }

    /// Whether this node serves its shard's writes now, judged against
    /// `table`: primary, lease deadline ahead, and named by the table.
    fn serves_writes(&self, table: &RoutingTable) -> bool {
        let role = &self.core.role;
        if !role.is_primary() {
            return false;
        }
        let member = self.member.load();
        let deadline = member.deadline();
        deadline.is_valid_at(Instant::now())
            && table
                .shard(self.shard)
                .and_then(|s| s.primary.as_ref())
                .is_some_and(|p| p.lease == deadline.lease_id() && p.epoch == role.epoch())
    }
}

impl RoleSource for ClusterMode {
    fn admit(&self, access: Access) -> Result<Gate<'_>, Refusal> {
        let table = self.tables.load();
        let role = self.core.role.role();
        let serving = match (role, access) {
            (Role::Primary, _) => self.serves_writes(&table),
            (Role::Standby, Access::Read) => self.core.settings.serve_stale_reads,
            (Role::Standby, Access::Write) => false,
        };
        let lapsed = (role == Role::Primary && !serving).then(|| self.core.role.epoch());
        Ok(Gate::Slots(SlotGate {
            table,
            serving: serving.then_some(self.shard),
            me: &self.me,
            shard: self.shard,
            lapsed,
            metrics: &self.metrics,
        }))
    }

    fn leads(&self) -> Result<(), Refusal> {
        let table = self.tables.load();
        if self.serves_writes(&table) {
            return Ok(());
        }
        if self.core.role.is_primary() {
            return Err(Refusal::TryAgain(Busy::LeaseExpired {
                epoch: self.core.role.epoch(),
            }));
        }
        let primary = table.shard(self.shard).and_then(|s| s.primary.as_ref());
        Err(Refusal::NotPrimary {
            primary: primary.map(|p| p.addr.clone()),
            epoch: primary.map_or(0, |p| p.epoch),
        })
    }

    fn start(&self) -> Duty<'_> {
        // Joined before the server started: the duties take it from here.
        Box::pin(async {})
    }

    fn duties(&self, role: Role) -> Duty<'_> {
        match role {
            Role::Primary => Box::pin(self.lead()),
            Role::Standby => Box::pin(self.stand_by()),
        }
    }

    fn promote(&self) -> Result<(u64, bool), Refusal> {
        match self.leads() {
            Ok(()) => Ok((self.core.role.epoch(), true)),
            Err(_) => Err(Refusal::ElectedByEtcd),
        }
    }

    fn heard_of(&self, announce: &Announce) -> Result<(), Refusal> {
        // etcd decides the roles: what other nodes say of themselves
        // changes none. Their epoch is still held to --max-epoch-gap, as
        // in REPLICATE (PROTOCOL.md §15): an absurd one is refused whole.
        self.core.role.heard_of_epoch(announce.epoch)?;
        Ok(())
    }

    fn topology(&self) -> Option<ClusterTopology> {
        Some(topology(&self.tables.load()))
    }

    fn refresh_metrics(&self) {
        ClusterMode::refresh_metrics(self);
    }

    fn describe(&self) -> Option<serde_json::Value> {
        let table = self.tables.load_full();
        let member = self.member.load();
        let deadline = member.deadline();
        let role = self.core.role.view();
        Some(serde_json::json!({
            "cluster": self.keys.cluster(),
            "shard": self.shard.0,
            "addr": self.me,
            "role": match role.role { Role::Primary => "primary", Role::Standby => "standby" },
            "epoch": role.epoch,
            "primary": role.primary,
            "serving": self.serves_writes(&table),
            "lease": format!("{:x}", deadline.lease_id()),
            "lease_ms_left": deadline.time_left().as_millis() as u64,
            "lease_renewals": deadline.renewals(),
            "watch_in_sync": self.view.in_sync(),
            "topology": crate::cluster::ClusterStatus::from(&*table),
        }))
    }

    fn leave(&self) -> Duty<'_> {
        Box::pin(async {
            let member = self.member.load_full();
            match member.leave().await {
                Ok(()) => tracing::info!(cluster = self.keys.cluster(), "left the cluster"),
                Err(e) => tracing::warn!(error = %e, "could not revoke the lease; etcd expires it"),
            }
        })
    }
}

/// The TOPOLOGY answer built from a routing table.
pub(crate) fn topology(table: &RoutingTable) -> ClusterTopology {
    let span = |r: crate::cluster::SlotRange| SlotSpan {
        first: r.first(),
        last: r.last(),
    };
    ClusterTopology {
        version: table.version(),
        shards: table
            .shards()
            .iter()
            .map(|s| ShardInfo {
                id: s.id.0,
                epoch: s.primary.as_ref().map_or(0, |p| p.epoch),
                primary: s
                    .primary
                    .as_ref()
                    .map(|p| p.addr.clone())
                    .unwrap_or_default(),
                standbys: s.standbys.iter().map(|n| n.addr.clone()).collect(),
                slots: s.slots.iter().copied().map(span).collect(),
            })
            .collect(),
        moving: table
            .moving()
            .iter()
            .map(|m| MovingSlots {
                slots: span(m.slots),
                from: m.from.0,
                to: m.to.0,
            })
            .collect(),
    }
}
