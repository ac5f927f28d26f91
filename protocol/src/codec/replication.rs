//! Payloads of the replication and operations messages (`PROTOCOL.md` §13).
//!
//! Same rules as the other payloads: every count is bounded by what the
//! payload can still hold before it sizes an allocation, every flag byte is
//! exactly 0 or 1 (so the encoding stays canonical), and a record's states
//! must belong to its tables (a token-bucket state in the token-bucket
//! table, any other in the other one).

use bytes::{BufMut, BytesMut};

use super::frame::{
    encode_frame, invalid, put_short_string, short_string, wire_len, PayloadReader,
};
use super::{opcode, DecodeError, EncodeError};
use crate::cluster::SLOT_COUNT;
use crate::message::RequestId;
use crate::replication::Role;
use crate::replication::{
    Announce, ChangeBatch, LeaseState, NodeStatus, Record, ReplRequest, ReplResponse, SnapshotPart,
    StateEntry, StateValue, TableState,
};

/// Smallest record: key_len, a 1-byte key, two table bytes.
const MIN_RECORD_LEN: usize = 2 + 1 + 1 + 1;
/// Smallest status field: name_len, value (empty name).
const MIN_FIELD_LEN: usize = 1 + 8;
const TABLE_UNCHANGED: u8 = 0;
const TABLE_ABSENT: u8 = 1;
const TABLE_PRESENT: u8 = 2;

/// Decodes the payload of a replication request whose opcode is `op`;
/// `None` when `op` is not one.
pub(crate) fn decode_repl_request(
    r: &mut PayloadReader,
) -> Option<Result<ReplRequest, DecodeError>> {
    let decoded = match r.opcode {
        opcode::REPLICATE => (|| {
            Ok(ReplRequest::Replicate {
                replid: r.u64()?,
                offset: r.u64()?,
                epoch: r.u64()?,
                advertise: short_string(r, "advertised address")?,
            })
        })(),
        opcode::REPL_ACK => r.u64().map(|offset| ReplRequest::Ack { offset }),
        opcode::PROMOTE => Ok(ReplRequest::Promote),
        opcode::STATUS => (|| {
            let announce = if flag(r, "announce flag")? {
                Some(Announce {
                    role: role(r)?,
                    epoch: r.u64()?,
                    addr: short_string(r, "announced address")?,
                })
            } else {
                None
            };
            Ok(ReplRequest::Status { announce })
        })(),
        opcode::HANDOFF => (|| {
            Ok(ReplRequest::Handoff {
                epoch: r.u64()?,
                records: records(r)?,
            })
        })(),
        _ => return None,
    };
    Some(decoded)
}

pub(crate) fn encode_repl_request(
    request_id: RequestId,
    request: &ReplRequest,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    match request {
        ReplRequest::Replicate {
            replid,
            offset,
            epoch,
            advertise,
        } => encode_frame(
            dst,
            opcode::REPLICATE,
            request_id,
            25 + advertise.len(),
            |dst| {
                dst.put_u64(*replid);
                dst.put_u64(*offset);
                dst.put_u64(*epoch);
                put_short_string(dst, advertise, "advertised address")
            },
        ),
        ReplRequest::Ack { offset } => encode_frame(dst, opcode::REPL_ACK, request_id, 8, |dst| {
            dst.put_u64(*offset);
            Ok(())
        }),
        ReplRequest::Promote => encode_frame(dst, opcode::PROMOTE, request_id, 0, |_| Ok(())),
        ReplRequest::Status { announce } => {
            let hint = 1 + announce.as_ref().map_or(0, |a| 10 + a.addr.len());
            encode_frame(dst, opcode::STATUS, request_id, hint, |dst| {
                match announce {
                    None => dst.put_u8(0),
                    Some(a) => {
                        dst.put_u8(1);
                        dst.put_u8(a.role as u8);
                        dst.put_u64(a.epoch);
                        put_short_string(dst, &a.addr, "announced address")?;
                    }
                }
                Ok(())
            })
        }
        ReplRequest::Handoff { epoch, records } => {
            let hint = 8 + 4 + records_hint(records);
            encode_frame(dst, opcode::HANDOFF, request_id, hint, |dst| {
                dst.put_u64(*epoch);
                put_records(dst, records)
            })
        }
    }
}

/// Decodes the payload of a replication response; `None` when the opcode
/// is not one.
pub(crate) fn decode_repl_response(
    r: &mut PayloadReader,
) -> Option<Result<ReplResponse, DecodeError>> {
    let decoded = match r.opcode {
        opcode::REPL_STREAM => (|| {
            Ok(ReplResponse::Stream {
                replid: r.u64()?,
                epoch: r.u64()?,
                offset: r.u64()?,
                full: flag(r, "full")?,
            })
        })(),
        opcode::REPL_SNAPSHOT => (|| {
            let offset = r.u64()?;
            let slot_mod = r.u16()?;
            if slot_mod == 0 || slot_mod > SLOT_COUNT || !slot_mod.is_power_of_two() {
                return Err(invalid(r, "slot_mod", slot_mod.into()));
            }
            let slot_rem = r.u16()?;
            if slot_rem >= slot_mod {
                return Err(invalid(r, "slot_rem", slot_rem.into()));
            }
            Ok(ReplResponse::Snapshot(SnapshotPart {
                offset,
                slot_mod,
                slot_rem,
                last: flag(r, "last")?,
                records: records(r)?,
            }))
        })(),
        opcode::REPL_CHANGES => (|| {
            Ok(ReplResponse::Changes(ChangeBatch {
                offset: r.u64()?,
                sent_at: r.u64()?,
                records: records(r)?,
            }))
        })(),
        opcode::REPL_HEARTBEAT => (|| {
            Ok(ReplResponse::Heartbeat {
                epoch: r.u64()?,
                offset: r.u64()?,
                now: r.u64()?,
                syncing: flag(r, "syncing")?,
            })
        })(),
        opcode::STATUS_OK => (|| {
            let role = role(r)?;
            let epoch = r.u64()?;
            let offset = r.u64()?;
            let addr = short_string(r, "address")?;
            let primary = short_string(r, "primary address")?;
            let n = r.u8()?;
            let mut fields = Vec::with_capacity(usize::from(n).min(r.remaining() / MIN_FIELD_LEN));
            for _ in 0..n {
                let name = short_string(r, "field name")?;
                fields.push((name, r.u64()?));
            }
            Ok(ReplResponse::Status(NodeStatus {
                role,
                epoch,
                offset,
                addr,
                primary,
                fields,
            }))
        })(),
        opcode::PROMOTED => (|| {
            Ok(ReplResponse::Promoted {
                epoch: r.u64()?,
                was_primary: flag(r, "was_primary")?,
            })
        })(),
        opcode::HANDED_OFF => r.u32().map(|merged| ReplResponse::HandedOff { merged }),
        _ => return None,
    };
    Some(decoded)
}

pub(crate) fn encode_repl_response(
    request_id: RequestId,
    response: &ReplResponse,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    match response {
        ReplResponse::Stream {
            replid,
            epoch,
            offset,
            full,
        } => encode_frame(dst, opcode::REPL_STREAM, request_id, 25, |dst| {
            dst.put_u64(*replid);
            dst.put_u64(*epoch);
            dst.put_u64(*offset);
            dst.put_u8((*full).into());
            Ok(())
        }),
        ReplResponse::Snapshot(part) => {
            let hint = 13 + 4 + records_hint(&part.records);
            encode_frame(dst, opcode::REPL_SNAPSHOT, request_id, hint, |dst| {
                dst.put_u64(part.offset);
                dst.put_u16(part.slot_mod);
                dst.put_u16(part.slot_rem);
                dst.put_u8(part.last.into());
                put_records(dst, &part.records)
            })
        }
        ReplResponse::Changes(batch) => {
            let hint = 16 + 4 + records_hint(&batch.records);
            encode_frame(dst, opcode::REPL_CHANGES, request_id, hint, |dst| {
                dst.put_u64(batch.offset);
                dst.put_u64(batch.sent_at);
                put_records(dst, &batch.records)
            })
        }
        ReplResponse::Heartbeat {
            epoch,
            offset,
            now,
            syncing,
        } => encode_frame(dst, opcode::REPL_HEARTBEAT, request_id, 25, |dst| {
            dst.put_u64(*epoch);
            dst.put_u64(*offset);
            dst.put_u64(*now);
            dst.put_u8((*syncing).into());
            Ok(())
        }),
        ReplResponse::Status(status) => {
            let hint = 17 + 2 + status.addr.len() + status.primary.len() + 1;
            encode_frame(dst, opcode::STATUS_OK, request_id, hint, |dst| {
                dst.put_u8(status.role as u8);
                dst.put_u64(status.epoch);
                dst.put_u64(status.offset);
                put_short_string(dst, &status.addr, "address")?;
                put_short_string(dst, &status.primary, "primary address")?;
                dst.put_u8(wire_len(status.fields.len(), "status fields", u8::MAX)?);
                for (name, value) in &status.fields {
                    put_short_string(dst, name, "field name")?;
                    dst.put_u64(*value);
                }
                Ok(())
            })
        }
        ReplResponse::Promoted { epoch, was_primary } => {
            encode_frame(dst, opcode::PROMOTED, request_id, 9, |dst| {
                dst.put_u64(*epoch);
                dst.put_u8((*was_primary).into());
                Ok(())
            })
        }
        ReplResponse::HandedOff { merged } => {
            encode_frame(dst, opcode::HANDED_OFF, request_id, 4, |dst| {
                dst.put_u32(*merged);
                Ok(())
            })
        }
    }
}

/// A boolean byte: exactly 0 or 1.
fn flag(r: &mut PayloadReader, field: &'static str) -> Result<bool, DecodeError> {
    match r.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(invalid(r, field, other.into())),
    }
}

fn role(r: &mut PayloadReader) -> Result<Role, DecodeError> {
    let role = r.u8()?;
    Role::from_wire(role).ok_or(DecodeError::UnknownRole {
        request_id: r.request_id,
        role,
    })
}

/// Bounds a `u32` count by what the rest of the payload can hold.
fn capacity(r: &PayloadReader, count: u32, min_len: usize) -> usize {
    usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(r.remaining() / min_len)
}

fn records(r: &mut PayloadReader) -> Result<Vec<Record>, DecodeError> {
    let n = r.u32()?;
    let mut records = Vec::with_capacity(capacity(r, n, MIN_RECORD_LEN));
    for _ in 0..n {
        records.push(record(r)?);
    }
    Ok(records)
}

fn record(r: &mut PayloadReader) -> Result<Record, DecodeError> {
    let len = r.u16()?;
    if len == 0 {
        return Err(DecodeError::EmptyKey {
            request_id: r.request_id,
        });
    }
    let key = r.bytes(len.into())?;
    let token_bucket = table_state(r, true)?;
    let other = table_state(r, false)?;
    Ok(Record {
        key,
        token_bucket,
        other,
    })
}

fn table_state(r: &mut PayloadReader, token_bucket: bool) -> Result<TableState, DecodeError> {
    match r.u8()? {
        TABLE_UNCHANGED => Ok(TableState::Unchanged),
        TABLE_ABSENT => Ok(TableState::Absent),
        TABLE_PRESENT => {
            let entry = state_entry(r)?;
            let is_bucket = matches!(entry.state, StateValue::TokenBucket { .. });
            if is_bucket != token_bucket {
                return Err(invalid(
                    r,
                    "algorithm of the table",
                    entry.state.algorithm().into(),
                ));
            }
            Ok(TableState::Present(entry))
        }
        other => Err(invalid(r, "table state", other.into())),
    }
}

fn state_entry(r: &mut PayloadReader) -> Result<StateEntry, DecodeError> {
    let algorithm = r.u8()?;
    let expires_at = r.u64()?;
    let state = match algorithm {
        1 => StateValue::TokenBucket { tat: r.u64()? },
        2 => StateValue::SlidingWindow {
            index: r.u64()?,
            prev: r.u64()?,
            cur: r.u64()?,
        },
        3 => StateValue::FixedWindow {
            index: r.u64()?,
            count: r.u64()?,
        },
        4 => {
            let n = r.u32()?;
            let mut entries = Vec::with_capacity(capacity(r, n, 8));
            for _ in 0..n {
                entries.push(r.u64()?);
            }
            StateValue::SlidingLog { entries }
        }
        5 => StateValue::LeakyBucket { tat: r.u64()? },
        6 => {
            let last_id = r.u64()?;
            let n = r.u32()?;
            let mut leases = Vec::with_capacity(capacity(r, n, 24));
            for _ in 0..n {
                leases.push(LeaseState {
                    id: r.u64()?,
                    expires_at: r.u64()?,
                    units: r.u64()?,
                });
            }
            StateValue::Concurrency { last_id, leases }
        }
        _ => {
            return Err(DecodeError::UnknownAlgorithm {
                request_id: r.request_id,
                algorithm,
            })
        }
    };
    Ok(StateEntry { expires_at, state })
}

/// A REPL_CHANGES frame built record by record: what a primary's sender
/// uses to encode straight from the states it drained, with no owned
/// [`Record`] (and no copy of its key) per change on the way. The bytes are
/// exactly those [`encode_response`](super::encode_response) writes for a
/// [`ChangeBatch`] of the same records (a test checks it).
#[derive(Debug)]
pub struct ChangesFrame {
    buf: BytesMut,
    records: u32,
}

/// Where the batch's offset, then its record count, sit in the frame.
const CHANGES_OFFSET_AT: usize = super::FRAME_HEADER_LEN + 5;
const CHANGES_COUNT_AT: usize = CHANGES_OFFSET_AT + 16;

impl ChangesFrame {
    /// An empty batch sent at `sent_at`, with room for `capacity` bytes.
    pub fn new(request_id: RequestId, sent_at: u64, capacity: usize) -> Self {
        let mut buf = BytesMut::with_capacity(capacity.max(CHANGES_COUNT_AT + 4));
        buf.put_u32(0); // length, patched by `finish`
        buf.put_u8(opcode::REPL_CHANGES);
        buf.put_u32(request_id);
        buf.put_u64(0); // offset, patched by `finish`
        buf.put_u64(sent_at);
        buf.put_u32(0); // record count, patched by `finish`
        Self { buf, records: 0 }
    }

    /// Appends one record. On an error (a key or state too long for its
    /// field) the frame is left as it was.
    pub fn push(
        &mut self,
        key: &[u8],
        token_bucket: &TableState,
        other: &TableState,
    ) -> Result<(), EncodeError> {
        let start = self.buf.len();
        let pushed = (|| {
            let records = wire_len(self.records as usize + 1, "records in a frame", u32::MAX)?;
            let key_len = wire_len(key.len(), "key", u16::MAX)?;
            // The usual record (states with no list in them) is laid out
            // on the stack and appended in one copy: one capacity check
            // per record rather than one per field.
            let mut states = [0u8; 2 * FIXED_STATE_MAX];
            let (tb, rest) = states.split_at_mut(FIXED_STATE_MAX);
            if let (Some(a), Some(b)) = (
                fixed_table_state(token_bucket, tb),
                fixed_table_state(other, rest),
            ) {
                self.buf.reserve(2 + key.len() + a + b);
                self.buf.put_u16(key_len);
                self.buf.put_slice(key);
                self.buf.put_slice(&tb[..a]);
                self.buf.put_slice(&rest[..b]);
                return Ok(records);
            }
            self.buf.put_u16(key_len);
            self.buf.put_slice(key);
            put_table_state(&mut self.buf, token_bucket)?;
            put_table_state(&mut self.buf, other)?;
            Ok(records)
        })();
        match pushed {
            Ok(records) => {
                self.records = records;
                Ok(())
            }
            Err(e) => {
                self.buf.truncate(start);
                Err(e)
            }
        }
    }

    /// Records pushed so far.
    pub fn records(&self) -> u32 {
        self.records
    }

    /// Bytes of the frame so far, header included.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no record was pushed.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The whole frame, numbered `offset`.
    pub fn finish(mut self, offset: u64) -> Result<bytes::Bytes, EncodeError> {
        let body_len = self.buf.len() - super::FRAME_HEADER_LEN;
        let len =
            u32::try_from(body_len).map_err(|_| EncodeError::FrameTooLarge { len: body_len })?;
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf[CHANGES_OFFSET_AT..CHANGES_OFFSET_AT + 8].copy_from_slice(&offset.to_be_bytes());
        self.buf[CHANGES_COUNT_AT..CHANGES_COUNT_AT + 4]
            .copy_from_slice(&self.records.to_be_bytes());
        Ok(self.buf.freeze())
    }
}

fn records_hint(records: &[Record]) -> usize {
    records
        .iter()
        .map(|r| MIN_RECORD_LEN + r.key.len() + 32)
        .sum()
}

fn put_records(dst: &mut BytesMut, records: &[Record]) -> Result<(), EncodeError> {
    dst.put_u32(wire_len(records.len(), "records in a frame", u32::MAX)?);
    for record in records {
        dst.put_u16(wire_len(record.key.len(), "key", u16::MAX)?);
        dst.put_slice(&record.key);
        put_table_state(dst, &record.token_bucket)?;
        put_table_state(dst, &record.other)?;
    }
    Ok(())
}

/// The longest table state with no list in it: a sliding window's
/// (presence, algorithm, expiry and three words).
const FIXED_STATE_MAX: usize = 2 + 8 + 3 * 8;

/// `table` encoded into `out` as [`put_table_state`] would, when it holds
/// no list (None: a sliding log or a lease set, left to
/// `put_table_state`). The bytes written.
fn fixed_table_state(table: &TableState, out: &mut [u8]) -> Option<usize> {
    let mut at = 0;
    let mut put = |bytes: &[u8]| {
        out[at..at + bytes.len()].copy_from_slice(bytes);
        at += bytes.len();
    };
    match table {
        TableState::Unchanged => put(&[TABLE_UNCHANGED]),
        TableState::Absent => put(&[TABLE_ABSENT]),
        TableState::Present(entry) => {
            let words: &[u64] = match &entry.state {
                StateValue::TokenBucket { tat } | StateValue::LeakyBucket { tat } => &[*tat],
                StateValue::SlidingWindow { index, prev, cur } => &[*index, *prev, *cur],
                StateValue::FixedWindow { index, count } => &[*index, *count],
                StateValue::SlidingLog { .. } | StateValue::Concurrency { .. } => return None,
            };
            put(&[TABLE_PRESENT, entry.state.algorithm()]);
            put(&entry.expires_at.to_be_bytes());
            for word in words {
                put(&word.to_be_bytes());
            }
        }
    }
    Some(at)
}

fn put_table_state(dst: &mut BytesMut, table: &TableState) -> Result<(), EncodeError> {
    match table {
        TableState::Unchanged => dst.put_u8(TABLE_UNCHANGED),
        TableState::Absent => dst.put_u8(TABLE_ABSENT),
        TableState::Present(entry) => {
            dst.put_u8(TABLE_PRESENT);
            dst.put_u8(entry.state.algorithm());
            dst.put_u64(entry.expires_at);
            match &entry.state {
                StateValue::TokenBucket { tat } | StateValue::LeakyBucket { tat } => {
                    dst.put_u64(*tat)
                }
                StateValue::SlidingWindow { index, prev, cur } => {
                    dst.put_u64(*index);
                    dst.put_u64(*prev);
                    dst.put_u64(*cur);
                }
                StateValue::FixedWindow { index, count } => {
                    dst.put_u64(*index);
                    dst.put_u64(*count);
                }
                StateValue::SlidingLog { entries } => {
                    dst.put_u32(wire_len(entries.len(), "sliding log entries", u32::MAX)?);
                    for t in entries {
                        dst.put_u64(*t);
                    }
                }
                StateValue::Concurrency { last_id, leases } => {
                    dst.put_u64(*last_id);
                    dst.put_u32(wire_len(leases.len(), "leases", u32::MAX)?);
                    for lease in leases {
                        dst.put_u64(lease.id);
                        dst.put_u64(lease.expires_at);
                        dst.put_u64(lease.units);
                    }
                }
            }
        }
    }
    Ok(())
}
