//! Cluster messages, as Rust values (`PROTOCOL.md` §14): TOPOLOGY and its
//! answer, and the MOVED redirection.
//!
//! A cluster spreads the 16384 slots over shards; each shard has a primary
//! (and standbys). Any node answers TOPOLOGY with the whole map, so a
//! client can route each check to the primary of its slot's shard; a node
//! that gets a request for a slot it does not serve answers MOVED with the
//! slot's owner, and a slot that nobody may serve right now (it is moving,
//! or its shard has no primary) gets the error code `TryAgain`. A node
//! outside a cluster answers TOPOLOGY as a cluster of one shard that owns
//! every slot, so cluster-aware clients work against it unchanged.

use crate::replication::NodeStatus;
use crate::replication::Role;

/// Number of hash slots (Redis Cluster's).
pub const SLOT_COUNT: u16 = 16384;

/// An inclusive range of slots, `first..=last`, both below
/// [`SLOT_COUNT`] (the decoder refuses anything else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotSpan {
    pub first: u16,
    pub last: u16,
}

impl SlotSpan {
    /// Every slot.
    pub const ALL: SlotSpan = SlotSpan {
        first: 0,
        last: SLOT_COUNT - 1,
    };

    pub fn contains(self, slot: u16) -> bool {
        self.first <= slot && slot <= self.last
    }
}

/// One shard of a TOPOLOGY answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardInfo {
    pub id: u16,
    /// The epoch of the shard's primary (the fencing token its answers and
    /// replication frames carry); 0 when it has none.
    pub epoch: u64,
    /// Where the primary serves; empty while the shard has no primary.
    pub primary: String,
    /// Where its standbys serve.
    pub standbys: Vec<String>,
    /// The slots it owns.
    pub slots: Vec<SlotSpan>,
}

/// Slots on their way from one shard to another: answered `TryAgain` until
/// the move ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovingSlots {
    pub slots: SlotSpan,
    pub from: u16,
    pub to: u16,
}

/// The TOPOLOGY answer (TOPOLOGY_OK): the whole slot map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterTopology {
    /// The topology's version: grows with every change of slot ownership
    /// (and every move begun or ended). 0 for a node outside a cluster.
    pub version: u64,
    pub shards: Vec<ShardInfo>,
    pub moving: Vec<MovingSlots>,
}

impl ClusterTopology {
    /// What a node outside a cluster answers: one shard, 0, owning every
    /// slot, its primary (the node itself, or the primary a standby
    /// follows) at the node's epoch, and a standby's own address as the
    /// standby. Version 0.
    pub fn single_node(status: &NodeStatus) -> Self {
        let (primary, standbys) = match status.role {
            Role::Primary => (status.addr.clone(), Vec::new()),
            Role::Standby => (status.primary.clone(), vec![status.addr.clone()]),
        };
        Self {
            version: 0,
            shards: vec![ShardInfo {
                id: 0,
                epoch: status.epoch,
                primary,
                standbys,
                slots: vec![SlotSpan::ALL],
            }],
            moving: Vec::new(),
        }
    }

    /// The shard owning `slot`, if any.
    pub fn owner(&self, slot: u16) -> Option<&ShardInfo> {
        self.shards
            .iter()
            .find(|s| s.slots.iter().any(|r| r.contains(slot)))
    }
}

/// MOVED: the request's slot is served by another node. Nothing in the
/// request was evaluated or charged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The first slot of the request the node does not serve.
    pub slot: u16,
    /// The version of the topology the node answered from: a client whose
    /// map is older fetches TOPOLOGY again.
    pub version: u64,
    /// Where the slot's primary serves.
    pub addr: String,
}
