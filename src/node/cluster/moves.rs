//! Carrying out a slot move, on the source shard's primary.
//!
//! ```text
//!  cluster move-slots: the move is recorded in the topology
//!     -> every node answers TryAgain for the slots (no admission anywhere)
//!  source primary, once its table shows the move:
//!     wait one heartbeat (frames that judged the slots on the table
//!       before the move finish)
//!     HANDOFF the slots' states to the target shard's primary (merged there)
//!     flip ownership: one etcd txn conditioned on the topology version it
//!       saw and on its own epoch (Fence)
//!     forget the slots' states here (the standby forgets them too)
//! ```
//!
//! Nobody admits a moving slot between the move being recorded and the
//! flip, and the copy is taken after the source stopped admitting, so a
//! move adds no over-admission; what it costs is TryAgain on the moving
//! slots for the length of the copy. If the source primary changes
//! meanwhile, the flip is fenced off and the new primary carries the move
//! out from its own copy.

use super::ClusterMode;
use crate::cluster::{complete_move, ClusterError, Fence, SlotMove};
use crate::node::replication::handoff::hand_slots;
use crate::slot::Slot;
use std::time::Duration;

/// Pause before trying a step of a move again.
const RETRY: Duration = Duration::from_millis(200);

impl ClusterMode {
    /// The move this shard's primary should carry out, if any.
    pub(super) fn pending_move(&self) -> Option<SlotMove> {
        self.tables
            .load()
            .moving()
            .iter()
            .find(|m| m.from == self.shard)
            .copied()
    }

    /// Carries `m` out (see the module docs); returns when the slots have
    /// flipped, the move is gone, or this node is no longer the source's
    /// primary.
    pub(super) async fn carry_out(&self, m: SlotMove) {
        let in_range = |slot: Slot| m.slots.contains(slot.get());
        tracing::info!(slots = %m.slots, from = %m.from, to = %m.to, "moving slots");
        tokio::time::sleep(self.core.settings.heartbeat).await;
        loop {
            let table = self.tables.load_full();
            if !table.moving().contains(&m) {
                tracing::info!(slots = %m.slots, "the move is over (done or aborted elsewhere)");
                return;
            }
            let Some(target) = table.shard(m.to).and_then(|s| s.primary.clone()) else {
                tracing::debug!(shard = %m.to, "the target shard has no primary yet");
                tokio::time::sleep(RETRY).await;
                continue;
            };
            let copied = match hand_slots(&self.core, &target.addr, in_range).await {
                Ok(done) => done,
                Err(e) => {
                    tracing::warn!(target = %target.addr, error = %e, "copying moving slots failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let fence = Fence {
                shard: self.shard,
                epoch: self.core.role.epoch(),
            };
            match complete_move(
                &self.etcd,
                &self.keys,
                m.slots,
                table.version(),
                Some(fence),
            )
            .await
            {
                Ok(version) => {
                    let forgotten = self.core.store.forget_slots(in_range);
                    self.metrics.slot_moves.inc();
                    tracing::info!(
                        slots = %m.slots, to = %m.to, target = %target.addr, version,
                        states = copied.sent, forgotten, "slots moved"
                    );
                    return;
                }
                Err(ClusterError::Fenced { current, .. }) => {
                    tracing::warn!(slots = %m.slots, current, "not the source's primary any more; its successor moves the slots");
                    return;
                }
                Err(e) => {
                    // A newer topology (the watch catches up), or etcd
                    // unreachable: copy again (a merge is idempotent), flip
                    // from the newer version.
                    tracing::debug!(slots = %m.slots, error = %e, "flipping the slots failed; retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}
