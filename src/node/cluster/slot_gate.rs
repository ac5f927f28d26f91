//! One frame's view of the slots in cluster mode ([`SlotGate`]): the
//! routing table every key of the frame is judged against, and whether
//! this node serves its shard; `screen` applies PROTOCOL.md §14's rules,
//! which gate.rs states and dispatches to.

use super::metrics;
use crate::cluster::{Route, RoutingTable, ShardId, Unavailable};
use crate::node::refusal::{Busy, Refusal};
use crate::slot::Slot;
use arc_swap::Guard;
use std::sync::Arc;

/// One frame's view of the slots (cluster mode): the routing table it is
/// judged against and whether this node serves its shard.
pub(crate) struct SlotGate<'a> {
    pub(super) table: Guard<Arc<RoutingTable>>,
    /// This node's shard when it serves the access asked (a primary with
    /// a valid lease; a standby serving stale reads for PEEK).
    pub(super) serving: Option<ShardId>,
    pub(super) me: &'a str,
    pub(super) shard: ShardId,
    /// This node is primary at this epoch but does not serve (its lease
    /// deadline passed): its own slots answer LeaseExpired.
    pub(super) lapsed: Option<u64>,
    pub(super) metrics: &'a metrics::ClusterMetrics,
}

impl SlotGate<'_> {
    /// PROTOCOL.md §14 rules 1 and 2 for a request's keys; `whole`: a
    /// moving slot refuses the whole request (RESET, RELEASE).
    pub fn screen<'k>(
        &self,
        keys: impl Iterator<Item = &'k [u8]>,
        whole: bool,
    ) -> Result<(), Refusal> {
        // A one-shard cluster's serving primary: every key is served here,
        // so no key's slot is hashed just to find that out.
        if self.table.routes_all_here(self.serving) {
            return Ok(());
        }
        let mut busy = None;
        for key in keys {
            let slot = Slot::of(key).get();
            match self.table.route(slot, self.serving, self.me) {
                Route::Local => {}
                Route::Moved {
                    slot,
                    addr,
                    version,
                } => {
                    self.metrics.redirects.inc();
                    return Err(Refusal::Moved {
                        slot,
                        addr: addr.to_owned(),
                        version,
                    });
                }
                Route::TryAgain(Unavailable::Moving(_)) if !whole => {}
                Route::TryAgain(why) => {
                    busy.get_or_insert(self.busy(why));
                }
            }
        }
        match busy {
            None => Ok(()),
            Some(b) => {
                self.metrics.try_again.inc();
                Err(Refusal::TryAgain(b))
            }
        }
    }

    fn busy(&self, why: Unavailable) -> Busy {
        match why {
            Unavailable::NoTopology => Busy::NoTopology,
            Unavailable::Moving(m) => Busy::Moving {
                first: m.slots.first(),
                last: m.slots.last(),
                from: m.from.0,
                to: m.to.0,
            },
            Unavailable::NoPrimary(shard) => match self.lapsed {
                Some(epoch) if shard == self.shard => Busy::LeaseExpired { epoch },
                _ => Busy::NoPrimary { shard: shard.0 },
            },
        }
    }

    /// Whether `key`'s slot is moving (its check answers TryAgain).
    pub fn moving(&self, key: &[u8]) -> bool {
        !self.table.moving().is_empty() && self.table.move_of(Slot::of(key).get()).is_some()
    }

    /// Whether `key`'s slot is this shard's or moving to it.
    pub fn receives(&self, key: &[u8]) -> bool {
        let slot = Slot::of(key).get();
        self.table.owner(slot).is_some_and(|s| s.id == self.shard)
            || self.table.move_of(slot).is_some_and(|m| m.to == self.shard)
    }
}
