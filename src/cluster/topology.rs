//! The topology: which shard owns each of the 16384 slots, and the slot
//! moves in progress.
//!
//! Stored as one JSON document under `<prefix>topology` in etcd, so a change
//! of ownership is one atomic write, and its *version* is that key's
//! `mod_revision` (a transaction conditioned on it refuses a change made
//! from a stale copy). Pure data here, no I/O.
//!
//! Invariants [`Topology::validate`] enforces (every constructor and every
//! change goes through it):
//! - shard ids are unique and listed in ascending order;
//! - every slot belongs to exactly one shard (no gap, no overlap);
//! - each shard's ranges are sorted, non-adjacent and non-overlapping (the
//!   canonical form, so two equal ownerships have equal documents);
//! - a move names a range owned entirely by its `from` shard, goes to
//!   another existing shard, and no two moves overlap.

use serde::{Deserialize, Serialize};

use crate::slot::SLOT_COUNT;

/// A shard's number: `0..n` for a cluster created with `n` shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShardId(pub u16);

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Most shards a cluster may have: one slot each.
pub const MAX_SHARDS: u16 = SLOT_COUNT;

/// An inclusive range of slots, `first..=last`, both `< 16384`. Stored in
/// JSON as `[first, last]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "[u16; 2]", into = "[u16; 2]")]
pub struct SlotRange {
    first: u16,
    last: u16,
}

impl SlotRange {
    /// Every slot.
    pub const ALL: SlotRange = SlotRange {
        first: 0,
        last: SLOT_COUNT - 1,
    };

    pub fn new(first: u16, last: u16) -> Result<Self, TopologyError> {
        if first > last || last >= SLOT_COUNT {
            return Err(TopologyError::BadRange { first, last });
        }
        Ok(Self { first, last })
    }

    pub fn first(self) -> u16 {
        self.first
    }

    pub fn last(self) -> u16 {
        self.last
    }

    pub fn contains(self, slot: u16) -> bool {
        self.first <= slot && slot <= self.last
    }

    /// Number of slots (at least 1).
    pub fn len(self) -> u32 {
        u32::from(self.last - self.first) + 1
    }

    /// Always false: a range holds at least one slot.
    pub fn is_empty(self) -> bool {
        false
    }

    pub fn overlaps(self, other: SlotRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }

    /// True when `other` lies entirely inside `self`.
    pub fn covers(self, other: SlotRange) -> bool {
        self.first <= other.first && other.last <= self.last
    }

    pub fn slots(self) -> impl Iterator<Item = u16> {
        self.first..=self.last
    }
}

impl TryFrom<[u16; 2]> for SlotRange {
    type Error = TopologyError;
    fn try_from([first, last]: [u16; 2]) -> Result<Self, TopologyError> {
        Self::new(first, last)
    }
}

impl From<SlotRange> for [u16; 2] {
    fn from(r: SlotRange) -> Self {
        [r.first, r.last]
    }
}

impl std::fmt::Display for SlotRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl std::str::FromStr for SlotRange {
    type Err = TopologyError;

    /// `A-B` (inclusive) or a single slot `A`.
    fn from_str(s: &str) -> Result<Self, TopologyError> {
        let parse = |part: &str| {
            part.trim()
                .parse::<u16>()
                .map_err(|_| TopologyError::RangeSyntax(s.to_owned()))
        };
        match s.split_once('-') {
            Some((a, b)) => Self::new(parse(a)?, parse(b)?),
            None => {
                let slot = parse(s)?;
                Self::new(slot, slot)
            }
        }
    }
}

/// The slots one shard owns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardSpec {
    pub id: ShardId,
    pub slots: Vec<SlotRange>,
}

/// Slots being handed from one shard to another: recorded before the
/// source copies their states, removed by the ownership flip (or an abort).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotMove {
    pub slots: SlotRange,
    pub from: ShardId,
    pub to: ShardId,
}

/// Slot ownership and moves in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub shards: Vec<ShardSpec>,
    #[serde(default)]
    pub moving: Vec<SlotMove>,
}

/// Why a topology, a range or a change of it is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("a cluster needs 1 to {MAX_SHARDS} shards, got {0}")]
    ShardCount(u32),
    #[error("slot range {first}-{last}: must be first <= last < {SLOT_COUNT}")]
    BadRange { first: u16, last: u16 },
    #[error("{0:?} is not a slot range (A-B or A)")]
    RangeSyntax(String),
    #[error("shard ids must be unique and ascending: {0} after {1}")]
    ShardOrder(ShardId, ShardId),
    #[error("slot {slot} belongs to no shard")]
    Unowned { slot: u16 },
    #[error("slot {slot} belongs to shards {first} and {second}")]
    OwnedTwice {
        slot: u16,
        first: ShardId,
        second: ShardId,
    },
    #[error("shard {shard}: ranges must be sorted and not touch ({range} after {previous})")]
    RangesNotCanonical {
        shard: ShardId,
        range: SlotRange,
        previous: SlotRange,
    },
    #[error("no shard {shard} (shards: {shards})")]
    NoSuchShard { shard: ShardId, shards: usize },
    #[error("slots {range} are not all owned by shard {from}")]
    NotOwnedBy { range: SlotRange, from: ShardId },
    #[error("slots {range} already belong to shard {to}")]
    MoveToItself { range: SlotRange, to: ShardId },
    #[error("slots {range} overlap the move of {moving} in progress")]
    MoveOverlap { range: SlotRange, moving: SlotRange },
    #[error("no move of exactly slots {range} is in progress")]
    NoSuchMove { range: SlotRange },
}

impl Topology {
    /// `n` shards `0..n`, the slots split into `n` contiguous ranges whose
    /// sizes differ by at most one (the first `16384 % n` shards take the
    /// extra slot).
    pub fn even(n: u16) -> Result<Self, TopologyError> {
        if n == 0 || n > MAX_SHARDS {
            return Err(TopologyError::ShardCount(n.into()));
        }
        let base = SLOT_COUNT / n;
        let extra = SLOT_COUNT % n;
        let mut first = 0u16;
        let shards = (0..n)
            .map(|i| {
                let size = base + u16::from(i < extra);
                let range = SlotRange {
                    first,
                    last: first + size - 1,
                };
                first += size;
                ShardSpec {
                    id: ShardId(i),
                    slots: vec![range],
                }
            })
            .collect();
        let topology = Self {
            shards,
            moving: Vec::new(),
        };
        topology.validate()?;
        Ok(topology)
    }

    /// Checks every invariant of the module header.
    pub fn validate(&self) -> Result<(), TopologyError> {
        self.owners().map(|_| ())
    }

    /// The owning shard's index in [`shards`](Self::shards) for every
    /// slot, after checking the invariants.
    pub fn owners(&self) -> Result<Vec<u16>, TopologyError> {
        let count = self.shards.len();
        if count == 0 || count > usize::from(MAX_SHARDS) {
            return Err(TopologyError::ShardCount(count as u32));
        }
        for pair in self.shards.windows(2) {
            if pair[0].id >= pair[1].id {
                return Err(TopologyError::ShardOrder(pair[1].id, pair[0].id));
            }
        }
        const NONE: u16 = u16::MAX;
        let mut owner = vec![NONE; usize::from(SLOT_COUNT)];
        for (index, shard) in self.shards.iter().enumerate() {
            for pair in shard.slots.windows(2) {
                // Sorted, and a gap of at least one slot between ranges.
                if u32::from(pair[0].last) + 1 >= u32::from(pair[1].first) {
                    return Err(TopologyError::RangesNotCanonical {
                        shard: shard.id,
                        range: pair[1],
                        previous: pair[0],
                    });
                }
            }
            for range in &shard.slots {
                for slot in range.slots() {
                    let cell = &mut owner[usize::from(slot)];
                    if *cell != NONE {
                        return Err(TopologyError::OwnedTwice {
                            slot,
                            first: self.shards[usize::from(*cell)].id,
                            second: shard.id,
                        });
                    }
                    // index < MAX_SHARDS, checked above.
                    *cell = index as u16;
                }
            }
        }
        if let Some(slot) = owner.iter().position(|&o| o == NONE) {
            return Err(TopologyError::Unowned { slot: slot as u16 });
        }
        for (i, m) in self.moving.iter().enumerate() {
            self.check_move(m, &owner)?;
            if let Some(other) = self.moving[..i].iter().find(|o| o.slots.overlaps(m.slots)) {
                return Err(TopologyError::MoveOverlap {
                    range: m.slots,
                    moving: other.slots,
                });
            }
        }
        Ok(owner)
    }

    fn check_move(&self, m: &SlotMove, owner: &[u16]) -> Result<(), TopologyError> {
        let from = self.index_of(m.from)?;
        self.index_of(m.to)?;
        if m.from == m.to {
            return Err(TopologyError::MoveToItself {
                range: m.slots,
                to: m.to,
            });
        }
        if m.slots
            .slots()
            .any(|s| usize::from(owner[usize::from(s)]) != from)
        {
            return Err(TopologyError::NotOwnedBy {
                range: m.slots,
                from: m.from,
            });
        }
        Ok(())
    }

    fn index_of(&self, shard: ShardId) -> Result<usize, TopologyError> {
        self.shards
            .binary_search_by_key(&shard, |s| s.id)
            .map_err(|_| TopologyError::NoSuchShard {
                shard,
                shards: self.shards.len(),
            })
    }

    pub fn shard(&self, id: ShardId) -> Option<&ShardSpec> {
        self.index_of(id).ok().map(|i| &self.shards[i])
    }

    /// The shard that owns `slot` (linear in the number of ranges; the
    /// check path uses the routing table's slot runs instead).
    pub fn owner_of(&self, slot: u16) -> Option<ShardId> {
        self.shards
            .iter()
            .find(|s| s.slots.iter().any(|r| r.contains(slot)))
            .map(|s| s.id)
    }

    /// The move in progress that covers `slot`, if any.
    pub fn move_of(&self, slot: u16) -> Option<&SlotMove> {
        self.moving.iter().find(|m| m.slots.contains(slot))
    }

    /// This topology with a move of `slots` to shard `to` recorded: `slots`
    /// must all belong to one other shard and overlap no move in progress.
    pub fn with_move(&self, slots: SlotRange, to: ShardId) -> Result<Topology, TopologyError> {
        let from = self
            .owner_of(slots.first)
            .ok_or(TopologyError::Unowned { slot: slots.first })?;
        let mut next = self.clone();
        next.moving.push(SlotMove { slots, from, to });
        next.validate()?;
        Ok(next)
    }

    /// This topology with the move of exactly `slots` carried out: the
    /// slots belong to the move's target and the move is gone.
    pub fn with_move_done(&self, slots: SlotRange) -> Result<Topology, TopologyError> {
        let mut next = self.clone();
        let m = next.take_move(slots)?;
        for shard in &mut next.shards {
            if shard.id == m.from {
                shard.slots = subtract(&shard.slots, slots);
            } else if shard.id == m.to {
                shard.slots = add(&shard.slots, slots);
            }
        }
        next.validate()?;
        Ok(next)
    }

    /// This topology without the move of exactly `slots` (an abort: the
    /// slots stay with their source).
    pub fn without_move(&self, slots: SlotRange) -> Result<Topology, TopologyError> {
        let mut next = self.clone();
        next.take_move(slots)?;
        next.validate()?;
        Ok(next)
    }

    fn take_move(&mut self, slots: SlotRange) -> Result<SlotMove, TopologyError> {
        let i = self
            .moving
            .iter()
            .position(|m| m.slots == slots)
            .ok_or(TopologyError::NoSuchMove { range: slots })?;
        Ok(self.moving.remove(i))
    }
}

/// `ranges` (canonical) without the slots of `cut`.
fn subtract(ranges: &[SlotRange], cut: SlotRange) -> Vec<SlotRange> {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &r in ranges {
        if !r.overlaps(cut) {
            out.push(r);
            continue;
        }
        if r.first < cut.first {
            out.push(SlotRange {
                first: r.first,
                last: cut.first - 1,
            });
        }
        if r.last > cut.last {
            out.push(SlotRange {
                first: cut.last + 1,
                last: r.last,
            });
        }
    }
    out
}

/// `ranges` (canonical) with the slots of `extra` (disjoint from them),
/// merged back into canonical form.
fn add(ranges: &[SlotRange], extra: SlotRange) -> Vec<SlotRange> {
    let mut all: Vec<SlotRange> = ranges.iter().copied().chain([extra]).collect();
    all.sort();
    let mut out: Vec<SlotRange> = Vec::with_capacity(all.len());
    for r in all {
        match out.last_mut() {
            Some(prev) if u32::from(prev.last) + 1 >= u32::from(r.first) => {
                prev.last = prev.last.max(r.last);
            }
            _ => out.push(r),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(first: u16, last: u16) -> SlotRange {
        SlotRange::new(first, last).unwrap()
    }

    #[test]
    fn even_split_covers_every_slot_once() {
        let t = Topology::even(3).unwrap();
        let slots: Vec<_> = t.shards.iter().map(|s| s.slots.clone()).collect();
        assert_eq!(
            slots,
            [
                vec![range(0, 5461)],
                vec![range(5462, 10922)],
                vec![range(10923, 16383)]
            ]
        );
        for n in [1, 2, 7, 1000, 16384] {
            let t = Topology::even(n).unwrap();
            assert_eq!(t.shards.len(), usize::from(n));
            let sizes: Vec<u32> = t.shards.iter().map(|s| s.slots[0].len()).collect();
            assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        }
        assert_eq!(Topology::even(0), Err(TopologyError::ShardCount(0)));
    }

    #[test]
    fn invalid_topologies_are_refused_with_the_slot() {
        let mut t = Topology::even(2).unwrap();
        t.shards[1].slots = vec![range(8191, 16383)];
        assert!(matches!(
            t.validate(),
            Err(TopologyError::OwnedTwice { slot: 8191, .. })
        ));
        t.shards[1].slots = vec![range(8193, 16383)];
        assert_eq!(t.validate(), Err(TopologyError::Unowned { slot: 8192 }));
        t.shards[1].slots = vec![range(8192, 9000), range(9001, 16383)];
        assert!(matches!(
            t.validate(),
            Err(TopologyError::RangesNotCanonical { .. })
        ));
        t.shards[1].slots = vec![range(8192, 16383)];
        t.shards[1].id = ShardId(0);
        assert!(matches!(t.validate(), Err(TopologyError::ShardOrder(..))));
        assert!(SlotRange::new(5, 4).is_err());
        assert!(SlotRange::new(0, 16384).is_err());
    }

    #[test]
    fn a_move_is_recorded_then_flipped() {
        let t = Topology::even(2).unwrap();
        let moving = t.with_move(range(100, 199), ShardId(1)).unwrap();
        assert_eq!(moving.move_of(150).unwrap().from, ShardId(0));
        assert_eq!(moving.owner_of(150), Some(ShardId(0)));
        // Overlapping moves and moves of slots another shard owns are refused.
        assert!(matches!(
            moving.with_move(range(150, 250), ShardId(1)),
            Err(TopologyError::MoveOverlap { .. })
        ));
        assert!(matches!(
            t.with_move(range(8000, 8300), ShardId(1)),
            Err(TopologyError::NotOwnedBy { .. })
        ));
        assert!(matches!(
            t.with_move(range(0, 5), ShardId(0)),
            Err(TopologyError::MoveToItself { .. })
        ));
        assert!(matches!(
            t.with_move(range(0, 5), ShardId(9)),
            Err(TopologyError::NoSuchShard { .. })
        ));
        let done = moving.with_move_done(range(100, 199)).unwrap();
        assert!(done.moving.is_empty());
        assert_eq!(done.shards[0].slots, [range(0, 99), range(200, 8191)]);
        assert_eq!(done.shards[1].slots, [range(100, 199), range(8192, 16383)]);
        // Moving them back merges the ranges again.
        let back = done
            .with_move(range(100, 199), ShardId(0))
            .unwrap()
            .with_move_done(range(100, 199))
            .unwrap();
        assert_eq!(back, t);
        assert_eq!(
            moving.without_move(range(100, 199)).unwrap(),
            t,
            "an abort leaves ownership alone"
        );
        assert!(matches!(
            moving.with_move_done(range(100, 198)),
            Err(TopologyError::NoSuchMove { .. })
        ));
    }

    #[test]
    fn json_is_compact_and_checked() {
        let t = Topology::even(2)
            .unwrap()
            .with_move(range(0, 9), ShardId(1))
            .unwrap();
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(
            json,
            r#"{"shards":[{"id":0,"slots":[[0,8191]]},{"id":1,"slots":[[8192,16383]]}],"moving":[{"slots":[0,9],"from":0,"to":1}]}"#
        );
        assert_eq!(serde_json::from_str::<Topology>(&json).unwrap(), t);
        assert!(
            serde_json::from_str::<Topology>(r#"{"shards":[{"id":0,"slots":[[9,1]]}]}"#).is_err()
        );
    }

    #[test]
    fn ranges_parse_and_print() {
        assert_eq!("10-20".parse::<SlotRange>().unwrap(), range(10, 20));
        assert_eq!("7".parse::<SlotRange>().unwrap(), range(7, 7));
        assert_eq!(range(7, 7).to_string(), "7");
        assert_eq!(range(0, 16383).to_string(), "0-16383");
        assert!(matches!(
            "a-b".parse::<SlotRange>(),
            Err(TopologyError::RangeSyntax(_))
        ));
        assert!("3-1".parse::<SlotRange>().is_err());
    }
}
