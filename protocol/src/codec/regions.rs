//! Payloads of the usage exchange between regions (`PROTOCOL.md` §16):
//! USAGE and USAGE_OK.
//!
//! A region name is 1 to 64 bytes of UTF-8; keys and rule names follow the
//! rules of a CHECK pair (a key within `max_key_len`, a rule name of 1 to 64
//! bytes). The entry count is not bounded by `max_batch`: a USAGE is bounded
//! by the frame alone, and the count never sizes an allocation beyond what
//! the payload can hold.

use bytes::{BufMut, BytesMut};

use super::frame::{encode_frame, invalid, wire_len, PayloadReader};
use super::request::{decode_key, decode_rule_name};
use super::{opcode, DecodeError, EncodeError};
use crate::message::{RequestId, ServerLimits};
use crate::regions::{usage_header_len, UsageAck, UsageEntry, UsageReport, MAX_REGION_NAME_LEN};

/// Smallest entry: key_len, a 1-byte key, rule_len, a 1-byte rule name,
/// charged, refunded, at.
const MIN_ENTRY_LEN: usize = 2 + 1 + 1 + 1 + 8 + 8 + 8;

fn region(r: &mut PayloadReader) -> Result<String, DecodeError> {
    let len = r.u8()?;
    if len == 0 || usize::from(len) > MAX_REGION_NAME_LEN {
        return Err(invalid(r, "region name length", len.into()));
    }
    r.string(len.into(), "region name")
}

fn put_region(dst: &mut BytesMut, region: &str) -> Result<(), EncodeError> {
    // The decoder refuses an empty name; the encoder sends what it is given
    // (a test may want to), within what the length byte can carry.
    dst.put_u8(wire_len(region.len(), "region name", u8::MAX)?);
    dst.put_slice(region.as_bytes());
    Ok(())
}

pub(crate) fn decode_usage(
    r: &mut PayloadReader,
    limits: &ServerLimits,
) -> Result<UsageReport, DecodeError> {
    let region = region(r)?;
    let session = r.u64()?;
    let seq = r.u64()?;
    let sent_at = r.u64()?;
    let n = r.u32()?;
    let capacity = usize::try_from(n)
        .unwrap_or(usize::MAX)
        .min(r.remaining() / MIN_ENTRY_LEN);
    let mut entries = Vec::with_capacity(capacity);
    for _ in 0..n {
        entries.push(UsageEntry {
            key: decode_key(r, limits)?,
            rule: decode_rule_name(r)?,
            charged: r.u64()?,
            refunded: r.u64()?,
            at: r.u64()?,
        });
    }
    Ok(UsageReport {
        region,
        session,
        seq,
        sent_at,
        entries,
    })
}

pub(crate) fn encode_usage(
    request_id: RequestId,
    report: &UsageReport,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let hint = usage_header_len(report.region.len())
        + report
            .entries
            .iter()
            .map(UsageEntry::wire_len)
            .sum::<usize>();
    encode_frame(dst, opcode::USAGE, request_id, hint, |dst| {
        put_region(dst, &report.region)?;
        dst.put_u64(report.session);
        dst.put_u64(report.seq);
        dst.put_u64(report.sent_at);
        dst.put_u32(wire_len(report.entries.len(), "usage entries", u32::MAX)?);
        for entry in &report.entries {
            dst.put_u16(wire_len(entry.key.len(), "key", u16::MAX)?);
            dst.put_slice(&entry.key);
            // 1..=64 by RuleName's invariant.
            dst.put_u8(wire_len(entry.rule.len(), "rule name", u8::MAX)?);
            dst.put_slice(entry.rule.as_bytes());
            dst.put_u64(entry.charged);
            dst.put_u64(entry.refunded);
            dst.put_u64(entry.at);
        }
        Ok(())
    })
}

pub(crate) fn decode_usage_ok(r: &mut PayloadReader) -> Result<UsageAck, DecodeError> {
    let region = region(r)?;
    let seq = r.u64()?;
    let duplicate = match r.u8()? {
        0 => false,
        1 => true,
        other => return Err(invalid(r, "duplicate flag", other.into())),
    };
    Ok(UsageAck {
        region,
        seq,
        duplicate,
    })
}

pub(crate) fn encode_usage_ok(
    request_id: RequestId,
    ack: &UsageAck,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let hint = 1 + ack.region.len() + 8 + 1;
    encode_frame(dst, opcode::USAGE_OK, request_id, hint, |dst| {
        put_region(dst, &ack.region)?;
        dst.put_u64(ack.seq);
        dst.put_u8(u8::from(ack.duplicate));
        Ok(())
    })
}
