//! What a cluster node does in each role, woken by every new routing
//! table and by a short tick (its lease, its silence).
//!
//! ```text
//!  standby:  lease lost?                    -> join again (new lease)
//!            the shard's primary is ...
//!              this lease                   -> lead at its epoch
//!              another node                 -> follow it at its epoch
//!              this address, an older lease -> wait (a former self: its key expires)
//!              nobody: copy complete, or no other node of the shard,
//!                      or --campaign-delay without a primary
//!                                           -> campaign (etcd txn)
//!  primary:  lease lost, or the table names another primary, or the
//!            shard's key is gone            -> step down (states handed over
//!                                              to the next primary, then resync)
//!            a move out of this shard       -> carry it out (moves.rs)
//!            lease deadline passed          -> nothing to do: the check path
//!                                              refuses until a renewal lands
//! ```
//!
//! A copy is *complete* when this node led the shard and has not followed
//! anyone since (it owes its states to the next primary), or when it
//! followed the last primary in sync and heard from it within two lease
//! TTLs: then the primary's lease ran out while this copy was current, up
//! to what the old primary admitted in its last flush interval.

use super::ClusterMode;
use crate::cluster::{Campaign, ClusterError, Member, RoutingTable};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often the duties look at the lease and the silence besides table
/// changes.
const TICK: Duration = Duration::from_millis(100);

/// Pause before joining again, or campaigning again, after an etcd error.
const RETRY: Duration = Duration::from_millis(500);

/// What a standby does about its shard's primary.
enum Step {
    Lead { epoch: u64 },
    Follow { addr: String, epoch: u64 },
    Campaign,
    Wait,
}

impl ClusterMode {
    /// Standby duties, until the role changes.
    pub(super) async fn stand_by(&self) {
        let mut updates = self.view.subscribe();
        let mut orphaned_since: Option<Instant> = None;
        loop {
            if self.member.load().deadline().is_lost() {
                self.rejoin().await;
            }
            let table = updates.borrow_and_update().clone();
            match self.standby_step(&table, &mut orphaned_since) {
                Step::Lead { epoch } => {
                    self.core
                        .role
                        .lead(epoch, "cluster: etcd holds this node as primary");
                    return;
                }
                Step::Follow { addr, epoch } => {
                    self.core.role.follow_elected(
                        addr,
                        epoch,
                        "cluster: following the shard's elected primary",
                    );
                }
                Step::Campaign => {
                    if self.campaign().await {
                        return;
                    }
                }
                Step::Wait => {}
            }
            tokio::select! {
                _ = updates.changed() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        }
    }

    fn standby_step(&self, table: &RoutingTable, orphaned_since: &mut Option<Instant>) -> Step {
        let Some(shard) = table.shard(self.shard) else {
            // No topology (yet), or this shard was dropped from it.
            return Step::Wait;
        };
        let lease = self.member.load().deadline().lease_id();
        match &shard.primary {
            Some(p) if p.lease == lease => Step::Lead { epoch: p.epoch },
            // This node's former self (restarted within its old TTL):
            // nobody serves until that key expires.
            Some(p) if p.addr == self.me => {
                *orphaned_since = None;
                Step::Wait
            }
            Some(p) => {
                *orphaned_since = None;
                Step::Follow {
                    addr: p.addr.clone(),
                    epoch: p.epoch,
                }
            }
            None => {
                let since = *orphaned_since.get_or_insert_with(Instant::now);
                let alone = shard.standbys.iter().all(|n| n.addr == self.me);
                if self.copy_complete() || alone || since.elapsed() >= self.campaign_delay {
                    Step::Campaign
                } else {
                    Step::Wait
                }
            }
        }
    }

    /// See the module docs.
    fn copy_complete(&self) -> bool {
        let role = &self.core.role;
        if role.owes_handoff() {
            return true;
        }
        // Saturating: the TTL is bounded at start, but a panic here would
        // leave the node a standby that never campaigns.
        let recent = self.settings.lease_ttl.saturating_mul(2);
        role.view().ever_synced
            && (role.is_streaming() || role.silence().is_some_and(|s| s < recent))
    }

    /// Runs for election; true when this node leads now.
    async fn campaign(&self) -> bool {
        let member = self.member.load_full();
        match member.campaign().await {
            Ok(Campaign::Elected { epoch }) => {
                self.core.role.lead(epoch, "cluster: elected by etcd");
                true
            }
            Ok(Campaign::Follower { primary, epoch }) => {
                if primary.addr != self.me {
                    self.core.role.follow_elected(
                        primary.addr,
                        epoch,
                        "cluster: another node was elected first",
                    );
                }
                false
            }
            Err(ClusterError::LeaseLost { .. }) => false,
            Err(e) => {
                tracing::warn!(shard = %self.shard, error = %e, "campaign failed; retrying");
                tokio::time::sleep(RETRY).await;
                false
            }
        }
    }

    /// Joins the cluster again with a new lease (etcd expired the old one
    /// while the node could not renew it), until it succeeds.
    async fn rejoin(&self) {
        loop {
            let joined = Member::join(
                self.etcd.clone(),
                self.keys.clone(),
                self.record.clone(),
                &self.settings,
            )
            .await;
            match joined {
                Ok(member) => {
                    self.member.store(Arc::new(member));
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "joining the cluster again failed; retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// Primary duties, until the role changes: stay primary while etcd
    /// agrees, and carry out the slot moves out of this shard.
    pub(super) async fn lead(&self) {
        let mut updates = self.view.subscribe();
        let member = self.member.load_full();
        let deadline = member.deadline();
        let mut mover: Option<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = None;
        loop {
            let table = updates.borrow_and_update().clone();
            let epoch = self.core.role.epoch();
            let primary = table.shard(self.shard).and_then(|s| s.primary.clone());
            if deadline.is_lost() {
                self.core
                    .role
                    .orphan("cluster: etcd no longer has this node's lease");
                return;
            }
            match primary {
                Some(p) if p.lease == deadline.lease_id() => {}
                Some(p) if p.epoch > epoch => {
                    self.core.role.follow_elected(
                        p.addr,
                        p.epoch,
                        "cluster: etcd elected another primary",
                    );
                    return;
                }
                // An older table: the watch catches up.
                Some(_) => {}
                // A table that reflects this node's election (its revision
                // is the epoch) and has no primary: the key is gone.
                None if table.revision() >= epoch => {
                    self.core
                        .role
                        .orphan("cluster: the shard's primary key is gone from etcd");
                    return;
                }
                None => {}
            }
            if mover.is_none() {
                if let Some(m) = self.pending_move() {
                    mover = Some(Box::pin(self.carry_out(m)));
                }
            }
            let moving = async {
                match mover.as_mut() {
                    Some(m) => m.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = updates.changed() => {}
                _ = tokio::time::sleep(TICK) => {}
                () = moving => mover = None,
            }
        }
    }
}
