//! The slot map of cluster mode: which [`Shard`] serves each of the 16384
//! slots, built from a TOPOLOGY answer (PROTOCOL.md §14).
//!
//! Invariants:
//! - a map covers every slot exactly once, or it is not built (the client
//!   keeps its previous map, as §14 asks of a map that does not);
//! - a shard of the new map whose nodes (primary and standbys, as a set)
//!   are those of a shard of the previous map reuses that `Shard`, so a
//!   refresh that changes nothing keeps every connection, and a failover
//!   within a known node set is found by the shard's own primary round;
//! - a shard with no node at all (no primary, no standby) has no `Shard`:
//!   its slots answer [`Error::NoOwner`] until a refresh names one.

use std::collections::HashMap;
use std::sync::Arc;

use tollgate_protocol::slot::{SlotRuns, SLOT_COUNT};
use tollgate_protocol::ClusterTopology;

use crate::config::ClientConfig;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::shard::Shard;

/// Marks a slot no shard of the map owns (only in the empty map).
const UNOWNED: u16 = u16::MAX;

/// One shard of the map.
pub(crate) struct MapShard {
    /// The shard's id in the topology.
    pub id: u16,
    /// Its nodes, primary first; `None` when the topology names none.
    pub shard: Option<Arc<Shard>>,
    /// The node set, sorted: what a later map matches to reuse `shard`.
    key: Vec<String>,
}

/// Why a TOPOLOGY answer was not turned into a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MapError {
    #[error("slot {slot} is owned by shards {first} and {second}")]
    Overlap { slot: u16, first: u16, second: u16 },
    #[error("slot {slot} is owned by no shard")]
    Gap { slot: u16 },
}

pub(crate) struct SlotMap {
    /// The topology version (0 outside a cluster, and for the empty map).
    pub version: u64,
    pub shards: Vec<MapShard>,
    /// The index in `shards` of each slot's shard, as runs of one owner
    /// (a 16384-entry array was a cache miss per routed check).
    runs: SlotRuns,
}

impl SlotMap {
    /// The map before the first TOPOLOGY: no slot has an owner.
    pub(crate) fn empty() -> Self {
        Self {
            version: 0,
            shards: Vec::new(),
            runs: SlotRuns::uniform(UNOWNED),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The shard serving `slot` and its index, or why there is none.
    pub(crate) fn shard_of(&self, slot: u16) -> Result<(usize, &Arc<Shard>), Error> {
        let index = self.runs.owner(slot);
        // Not `ok_or(Error::NoOwner ..)`: that builds the error on every
        // routed check and calls its drop glue when there is an owner.
        match self
            .shards
            .get(usize::from(index))
            .and_then(|s| s.shard.as_ref())
        {
            Some(shard) => Ok((usize::from(index), shard)),
            None => Err(Error::NoOwner {
                slot,
                version: self.version,
            }),
        }
    }

    /// Every node address the map names.
    pub(crate) fn addrs(&self) -> impl Iterator<Item = &str> {
        self.shards
            .iter()
            .flat_map(|s| s.key.iter().map(String::as_str))
    }

    /// The map of `topology`, reusing the shards of `previous` whose node
    /// sets are unchanged.
    pub(crate) fn build(
        topology: &ClusterTopology,
        previous: &SlotMap,
        config: &ClientConfig,
        metrics: Option<&Arc<Metrics>>,
    ) -> Result<Self, MapError> {
        let mut owner = vec![UNOWNED; usize::from(SLOT_COUNT)].into_boxed_slice();
        for (index, info) in topology.shards.iter().enumerate() {
            let index = u16::try_from(index).unwrap_or(UNOWNED - 1);
            for span in &info.slots {
                for slot in span.first..=span.last.min(SLOT_COUNT - 1) {
                    let cell = &mut owner[usize::from(slot)];
                    if *cell != UNOWNED {
                        return Err(MapError::Overlap {
                            slot,
                            first: topology.shards[usize::from(*cell)].id,
                            second: info.id,
                        });
                    }
                    *cell = index;
                }
            }
        }
        if let Some(slot) = owner.iter().position(|&o| o == UNOWNED) {
            return Err(MapError::Gap {
                slot: u16::try_from(slot).unwrap_or(0),
            });
        }
        let mut reusable: HashMap<&[String], &Arc<Shard>> = previous
            .shards
            .iter()
            .filter_map(|s| Some((s.key.as_slice(), s.shard.as_ref()?)))
            .collect();
        let shards = topology
            .shards
            .iter()
            .map(|info| {
                let mut addrs: Vec<String> = Vec::with_capacity(1 + info.standbys.len());
                if !info.primary.is_empty() {
                    addrs.push(info.primary.clone());
                }
                for standby in &info.standbys {
                    if !standby.is_empty() && !addrs.contains(standby) {
                        addrs.push(standby.clone());
                    }
                }
                let mut key = addrs.clone();
                key.sort_unstable();
                let shard = match reusable.remove(key.as_slice()) {
                    Some(shard) => Some(Arc::clone(shard)),
                    None if addrs.is_empty() => None,
                    None => Some(Arc::new(Shard::new(
                        addrs,
                        config.clone(),
                        metrics.cloned(),
                    ))),
                };
                MapShard {
                    id: info.id,
                    shard,
                    key,
                }
            })
            .collect();
        Ok(Self {
            version: topology.version,
            shards,
            runs: SlotRuns::of(&owner),
        })
    }
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::{ShardInfo, SlotSpan};

    use super::*;

    fn info(id: u16, primary: &str, standbys: &[&str], slots: &[(u16, u16)]) -> ShardInfo {
        ShardInfo {
            id,
            epoch: 1,
            primary: primary.into(),
            standbys: standbys.iter().map(|s| (*s).into()).collect(),
            slots: slots
                .iter()
                .map(|&(first, last)| SlotSpan { first, last })
                .collect(),
        }
    }

    fn topology(version: u64, shards: Vec<ShardInfo>) -> ClusterTopology {
        ClusterTopology {
            version,
            shards,
            moving: Vec::new(),
        }
    }

    #[test]
    fn slots_go_to_their_shard_and_unchanged_shards_are_reused() {
        let config = ClientConfig::default();
        let first = topology(
            3,
            vec![
                info(0, "a:1", &["b:1"], &[(0, 8191)]),
                info(1, "c:1", &["d:1"], &[(8192, 16383)]),
            ],
        );
        let map = SlotMap::build(&first, &SlotMap::empty(), &config, None).unwrap();
        assert_eq!(map.shard_of(0).unwrap().0, 0);
        assert_eq!(map.shard_of(8191).unwrap().0, 0);
        assert_eq!(map.shard_of(8192).unwrap().0, 1);
        assert_eq!(map.shard_of(16383).unwrap().0, 1);
        // Shard 0 fails over (same nodes, other primary), shard 1 loses a
        // node: the first Shard is kept, the second is new.
        let second = topology(
            4,
            vec![
                info(0, "b:1", &["a:1"], &[(0, 8191)]),
                info(1, "c:1", &[], &[(8192, 16383)]),
            ],
        );
        let next = SlotMap::build(&second, &map, &config, None).unwrap();
        assert!(Arc::ptr_eq(
            next.shard_of(0).unwrap().1,
            map.shard_of(0).unwrap().1
        ));
        assert!(!Arc::ptr_eq(
            next.shard_of(9000).unwrap().1,
            map.shard_of(9000).unwrap().1
        ));
        assert_eq!(next.version, 4);
    }

    #[test]
    fn slots_of_interleaved_spans_find_their_owner() {
        let config = ClientConfig::default();
        let t = topology(
            5,
            vec![
                info(0, "a:1", &[], &[(0, 99), (200, 16382)]),
                info(1, "b:1", &[], &[(100, 199), (16383, 16383)]),
            ],
        );
        let map = SlotMap::build(&t, &SlotMap::empty(), &config, None).unwrap();
        for (slot, owner) in [
            (0, 0),
            (99, 0),
            (100, 1),
            (150, 1),
            (199, 1),
            (200, 0),
            (16382, 0),
            (16383, 1),
        ] {
            assert_eq!(map.shard_of(slot).unwrap().0, owner, "slot {slot}");
        }
        assert_eq!(map.runs.len(), 4);
    }

    #[test]
    fn maps_that_do_not_cover_every_slot_once_are_refused() {
        let config = ClientConfig::default();
        let gap = topology(1, vec![info(0, "a:1", &[], &[(0, 100)])]);
        assert_eq!(
            SlotMap::build(&gap, &SlotMap::empty(), &config, None).err(),
            Some(MapError::Gap { slot: 101 })
        );
        let overlap = topology(
            1,
            vec![
                info(0, "a:1", &[], &[(0, 9000)]),
                info(7, "b:1", &[], &[(9000, 16383)]),
            ],
        );
        assert_eq!(
            SlotMap::build(&overlap, &SlotMap::empty(), &config, None).err(),
            Some(MapError::Overlap {
                slot: 9000,
                first: 0,
                second: 7
            })
        );
    }

    #[test]
    fn a_shard_without_nodes_has_no_owner_and_the_empty_map_none() {
        let config = ClientConfig::default();
        let t = topology(
            2,
            vec![
                info(0, "a:1", &[], &[(0, 8191)]),
                info(1, "", &[], &[(8192, 16383)]),
            ],
        );
        let map = SlotMap::build(&t, &SlotMap::empty(), &config, None).unwrap();
        assert!(matches!(
            map.shard_of(9000),
            Err(Error::NoOwner {
                slot: 9000,
                version: 2
            })
        ));
        assert!(matches!(
            SlotMap::empty().shard_of(5),
            Err(Error::NoOwner {
                slot: 5,
                version: 0
            })
        ));
    }
}
