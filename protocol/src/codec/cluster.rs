//! Payloads of the cluster messages (`PROTOCOL.md` §14): TOPOLOGY_OK and
//! MOVED (TOPOLOGY's payload is empty).
//!
//! Every slot on the wire is below 16384 and every range has `first <=
//! last`; anything else is Malformed. Counts are bounded by what the
//! payload can still hold before they size an allocation. Whether the
//! ranges of a map cover every slot once is the client's concern (a map
//! under construction, or from a newer server, may say otherwise): the
//! codec checks shapes, not meaning.

use bytes::{BufMut, BytesMut};

use super::frame::{
    encode_frame, invalid, put_short_string, short_string, wire_len, PayloadReader,
};
use super::{DecodeError, EncodeError};
use crate::cluster::{ClusterTopology, Moved, MovingSlots, ShardInfo, SlotSpan, SLOT_COUNT};
use crate::codec::opcode;
use crate::message::RequestId;

/// Smallest shard: id, epoch, primary_len, n_standbys, n_ranges.
const MIN_SHARD_LEN: usize = 2 + 8 + 1 + 1 + 2;
/// A range on the wire: first, last.
const SPAN_LEN: usize = 2 + 2;
/// A move on the wire: range, from, to.
const MOVE_LEN: usize = SPAN_LEN + 2 + 2;

fn slot(r: &mut PayloadReader, field: &'static str) -> Result<u16, DecodeError> {
    let slot = r.u16()?;
    if slot >= SLOT_COUNT {
        return Err(invalid(r, field, slot.into()));
    }
    Ok(slot)
}

fn span(r: &mut PayloadReader) -> Result<SlotSpan, DecodeError> {
    let first = slot(r, "first slot")?;
    let last = slot(r, "last slot")?;
    if first > last {
        return Err(invalid(r, "slot range (first above last)", first.into()));
    }
    Ok(SlotSpan { first, last })
}

fn bounded(r: &PayloadReader, count: usize, min_len: usize) -> usize {
    count.min(r.remaining() / min_len)
}

pub(crate) fn decode_topology(r: &mut PayloadReader) -> Result<ClusterTopology, DecodeError> {
    let version = r.u64()?;
    let n_shards = r.u16()?;
    let mut shards = Vec::with_capacity(bounded(r, n_shards.into(), MIN_SHARD_LEN));
    for _ in 0..n_shards {
        let id = r.u16()?;
        let epoch = r.u64()?;
        let primary = short_string(r, "primary address")?;
        let n_standbys = r.u8()?;
        let mut standbys = Vec::with_capacity(bounded(r, n_standbys.into(), 1));
        for _ in 0..n_standbys {
            standbys.push(short_string(r, "standby address")?);
        }
        let n_ranges = r.u16()?;
        let mut slots = Vec::with_capacity(bounded(r, n_ranges.into(), SPAN_LEN));
        for _ in 0..n_ranges {
            slots.push(span(r)?);
        }
        shards.push(ShardInfo {
            id,
            epoch,
            primary,
            standbys,
            slots,
        });
    }
    let n_moving = r.u16()?;
    let mut moving = Vec::with_capacity(bounded(r, n_moving.into(), MOVE_LEN));
    for _ in 0..n_moving {
        moving.push(MovingSlots {
            slots: span(r)?,
            from: r.u16()?,
            to: r.u16()?,
        });
    }
    Ok(ClusterTopology {
        version,
        shards,
        moving,
    })
}

pub(crate) fn decode_moved(r: &mut PayloadReader) -> Result<Moved, DecodeError> {
    Ok(Moved {
        slot: slot(r, "slot")?,
        version: r.u64()?,
        addr: short_string(r, "owner address")?,
    })
}

pub(crate) fn encode_topology(
    request_id: RequestId,
    topology: &ClusterTopology,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let hint = 8
        + 2
        + topology
            .shards
            .iter()
            .map(|s| {
                MIN_SHARD_LEN + s.primary.len() + s.standbys.len() * 16 + s.slots.len() * SPAN_LEN
            })
            .sum::<usize>()
        + 2
        + topology.moving.len() * MOVE_LEN;
    encode_frame(dst, opcode::TOPOLOGY_OK, request_id, hint, |dst| {
        dst.put_u64(topology.version);
        dst.put_u16(wire_len(topology.shards.len(), "shards", u16::MAX)?);
        for shard in &topology.shards {
            dst.put_u16(shard.id);
            dst.put_u64(shard.epoch);
            put_short_string(dst, &shard.primary, "primary address")?;
            dst.put_u8(wire_len(
                shard.standbys.len(),
                "standbys of a shard",
                u8::MAX,
            )?);
            for standby in &shard.standbys {
                put_short_string(dst, standby, "standby address")?;
            }
            dst.put_u16(wire_len(
                shard.slots.len(),
                "slot ranges of a shard",
                u16::MAX,
            )?);
            for span in &shard.slots {
                dst.put_u16(span.first);
                dst.put_u16(span.last);
            }
        }
        dst.put_u16(wire_len(topology.moving.len(), "moves", u16::MAX)?);
        for m in &topology.moving {
            dst.put_u16(m.slots.first);
            dst.put_u16(m.slots.last);
            dst.put_u16(m.from);
            dst.put_u16(m.to);
        }
        Ok(())
    })
}

pub(crate) fn encode_moved(
    request_id: RequestId,
    moved: &Moved,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    encode_frame(
        dst,
        opcode::MOVED,
        request_id,
        11 + moved.addr.len(),
        |dst| {
            dst.put_u16(moved.slot);
            dst.put_u64(moved.version);
            put_short_string(dst, &moved.addr, "owner address")
        },
    )
}
