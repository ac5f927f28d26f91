//! The routing table: slot -> shard -> primary address and epoch,
//! standbys, the topology version, moves in progress.
//!
//! Built from the node's mirror of etcd by the watch task and published
//! whole (copy-on-write, behind an `ArcSwap`), so the check path answers
//! "do I serve this slot, or where does it go" with one atomic load, a
//! search of a few slot runs and an array lookup, never a call to etcd.
//! A table is immutable: a change in etcd produces a new table.

use serde::Serialize;

use super::{NodeRecord, ShardId, SlotMove, SlotRange, Topology};
use crate::slot::{SlotRuns, SLOT_COUNT};

/// A shard's current primary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrimaryRoute {
    pub addr: String,
    /// The `create_revision` of its `primary/<shard>` key: the fencing
    /// token its answers and replication frames carry.
    pub epoch: u64,
    #[serde(skip)]
    pub lease: i64,
}

/// One shard as clients and peers need it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardRoute {
    pub id: ShardId,
    pub slots: Vec<SlotRange>,
    /// None while the shard has no primary (its lease lapsed and no
    /// standby has taken over yet).
    pub primary: Option<PrimaryRoute>,
    /// Registered nodes of the shard other than its primary.
    pub standbys: Vec<NodeRecord>,
}

/// Where a check for a slot goes, from one node's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// The slot belongs to the shard this node serves as primary.
    Local,
    /// The slot belongs to the shard whose primary is at `addr`.
    Moved {
        slot: u16,
        addr: &'a str,
        version: u64,
    },
    /// Nobody may serve the slot right now; retry shortly.
    TryAgain(Unavailable),
}

/// Why a slot cannot be served right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// The node has not loaded a topology (the cluster is not initialised).
    NoTopology,
    /// The slot is being moved: no shard admits it until the flip.
    Moving(SlotMove),
    /// The owning shard has no primary (failover in progress), or its
    /// primary is this node and its lease deadline has passed.
    NoPrimary(ShardId),
}

/// Routing state at one etcd revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTable {
    cluster: String,
    /// The topology key's `mod_revision` (0: no topology).
    version: u64,
    /// The etcd revision this table reflects.
    revision: u64,
    shards: Vec<ShardRoute>,
    /// Index into `shards` of every slot's owner, as runs of one owner
    /// (`SlotRuns`: a few lines, not a 32 KiB array read at random per
    /// check); None without topology.
    owner: Option<SlotRuns>,
    moving: Vec<SlotMove>,
}

impl RoutingTable {
    /// A table with no topology yet.
    pub fn empty(cluster: &str) -> Self {
        Self {
            cluster: cluster.to_owned(),
            version: 0,
            revision: 0,
            shards: Vec::new(),
            owner: None,
            moving: Vec::new(),
        }
    }

    /// Assembles a table; `primaries` and `nodes` are what etcd holds.
    /// An invalid topology is treated as no topology (it was validated
    /// before it was written, so this means a corrupt key, logged by the
    /// caller).
    pub(crate) fn build<'a>(
        cluster: &str,
        topology: Option<(&Topology, u64)>,
        revision: u64,
        primaries: impl Fn(ShardId) -> Option<PrimaryRoute>,
        nodes: impl Iterator<Item = &'a NodeRecord> + Clone,
    ) -> Self {
        let Some((topology, version)) = topology else {
            return Self {
                revision,
                ..Self::empty(cluster)
            };
        };
        let Ok(owner) = topology.owners() else {
            return Self {
                revision,
                ..Self::empty(cluster)
            };
        };
        let shards = topology
            .shards
            .iter()
            .map(|spec| {
                let primary = primaries(spec.id);
                let standbys = nodes
                    .clone()
                    .filter(|n| n.shard == spec.id)
                    .filter(|n| primary.as_ref().is_none_or(|p| p.addr != n.addr))
                    .cloned()
                    .collect();
                ShardRoute {
                    id: spec.id,
                    slots: spec.slots.clone(),
                    primary,
                    standbys,
                }
            })
            .collect();
        Self {
            cluster: cluster.to_owned(),
            version,
            revision,
            shards,
            owner: Some(SlotRuns::of(&owner)),
            moving: topology.moving.clone(),
        }
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The topology version (its key's `mod_revision`); 0 without one.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The etcd revision this table reflects.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn has_topology(&self) -> bool {
        self.owner.is_some()
    }

    pub fn shards(&self) -> &[ShardRoute] {
        &self.shards
    }

    pub fn shard(&self, id: ShardId) -> Option<&ShardRoute> {
        self.shards
            .binary_search_by_key(&id, |s| s.id)
            .ok()
            .map(|i| &self.shards[i])
    }

    /// The shard that owns `slot` (None without topology or for a slot
    /// number out of range).
    pub fn owner(&self, slot: u16) -> Option<&ShardRoute> {
        if slot >= SLOT_COUNT {
            return None;
        }
        let index = self.owner.as_ref()?.owner(slot);
        self.shards.get(usize::from(index))
    }

    pub fn moving(&self) -> &[SlotMove] {
        &self.moving
    }

    /// The move in progress covering `slot`.
    pub fn move_of(&self, slot: u16) -> Option<&SlotMove> {
        self.moving.iter().find(|m| m.slots.contains(slot))
    }

    /// Whether every slot routes [`Route::Local`] for a node serving
    /// `serving`: one shard owns them all, it is that one, and nothing is
    /// moving (a one-shard cluster's primary). Then a request's keys need
    /// no screening, and no slot hash each.
    pub fn routes_all_here(&self, serving: Option<ShardId>) -> bool {
        let Some(runs) = &self.owner else {
            return false;
        };
        runs.len() == 1
            && self.moving.is_empty()
            && serving.is_some()
            && self.owner(0).map(|s| s.id) == serving
    }

    /// Where a check for `slot` goes, for a node at `own_addr` that serves
    /// writes for shard `serving` (None: it serves no shard's writes, as a
    /// standby or a primary past its lease deadline).
    pub fn route(&self, slot: u16, serving: Option<ShardId>, own_addr: &str) -> Route<'_> {
        debug_assert!(slot < SLOT_COUNT);
        let Some(owner) = self.owner(slot) else {
            return Route::TryAgain(Unavailable::NoTopology);
        };
        if let Some(m) = self.move_of(slot) {
            return Route::TryAgain(Unavailable::Moving(*m));
        }
        if serving == Some(owner.id) {
            return Route::Local;
        }
        match &owner.primary {
            // Never redirect to oneself: this node is the recorded primary
            // but does not serve (its deadline passed).
            Some(p) if p.addr != own_addr => Route::Moved {
                slot,
                addr: &p.addr,
                version: self.version,
            },
            _ => Route::TryAgain(Unavailable::NoPrimary(owner.id)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(topology: &Topology) -> RoutingTable {
        let nodes = [
            NodeRecord {
                addr: "a0".into(),
                shard: ShardId(0),
                admin: None,
            },
            NodeRecord {
                addr: "b0".into(),
                shard: ShardId(0),
                admin: None,
            },
            NodeRecord {
                addr: "b1".into(),
                shard: ShardId(1),
                admin: None,
            },
        ];
        RoutingTable::build(
            "t",
            Some((topology, 7)),
            9,
            |shard| {
                (shard == ShardId(0)).then(|| PrimaryRoute {
                    addr: "a0".into(),
                    epoch: 5,
                    lease: 1,
                })
            },
            nodes.iter(),
        )
    }

    #[test]
    fn routes_by_owner_primary_and_moves() {
        let topology = Topology::even(2).unwrap();
        let t = table(&topology);
        assert_eq!(t.version(), 7);
        assert_eq!(t.owner(0).unwrap().id, ShardId(0));
        assert_eq!(t.owner(16383).unwrap().id, ShardId(1));
        assert_eq!(t.shard(ShardId(0)).unwrap().standbys.len(), 1);
        assert_eq!(t.shard(ShardId(1)).unwrap().standbys[0].addr, "b1");
        // The primary of shard 0 serves slot 0; its standby redirects.
        assert_eq!(t.route(0, Some(ShardId(0)), "a0"), Route::Local);
        assert_eq!(
            t.route(0, None, "b0"),
            Route::Moved {
                slot: 0,
                addr: "a0",
                version: 7
            }
        );
        // A primary past its deadline does not redirect to itself.
        assert_eq!(
            t.route(0, None, "a0"),
            Route::TryAgain(Unavailable::NoPrimary(ShardId(0)))
        );
        // Shard 1 has no primary.
        assert_eq!(
            t.route(16383, Some(ShardId(0)), "a0"),
            Route::TryAgain(Unavailable::NoPrimary(ShardId(1)))
        );
        // A moving slot is served by nobody.
        let range = SlotRange::new(0, 9).unwrap();
        let moving = table(&topology.with_move(range, ShardId(1)).unwrap());
        assert!(matches!(
            moving.route(3, Some(ShardId(0)), "a0"),
            Route::TryAgain(Unavailable::Moving(m)) if m.slots == range
        ));
        assert_eq!(moving.route(10, Some(ShardId(0)), "a0"), Route::Local);
        let empty = RoutingTable::empty("t");
        assert_eq!(
            empty.route(1, None, "x"),
            Route::TryAgain(Unavailable::NoTopology)
        );
    }

    /// A node may skip screening keys only where `route` would find every
    /// slot local: the one shard's serving primary, nothing moving.
    #[test]
    fn every_slot_routes_here_only_for_the_sole_shards_serving_primary() {
        let one = table(&Topology::even(1).unwrap());
        assert!(one.routes_all_here(Some(ShardId(0))));
        for slot in [0, 1, 8191, 16383] {
            assert_eq!(one.route(slot, Some(ShardId(0)), "a0"), Route::Local);
        }
        // Not serving (a standby, a lapsed primary), or another shard.
        assert!(!one.routes_all_here(None));
        assert!(!one.routes_all_here(Some(ShardId(1))));
        // Two shards, or a move in progress.
        let two = Topology::even(2).unwrap();
        assert!(!table(&two).routes_all_here(Some(ShardId(0))));
        let range = SlotRange::new(0, 9).unwrap();
        let moving = table(&two.with_move(range, ShardId(1)).unwrap());
        assert!(!moving.routes_all_here(Some(ShardId(0))));
        assert!(!RoutingTable::empty("t").routes_all_here(Some(ShardId(0))));
    }
}
