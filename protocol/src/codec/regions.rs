//! Payloads of the usage exchange between regions (`PROTOCOL.md` §16):
//! USAGE and USAGE_OK, and [`UsageFrame`], a USAGE built entry by entry.
//!
//! A region name is 1 to 64 bytes of UTF-8; keys and rule names follow the
//! rules of a CHECK pair (a key within `max_key_len`, a rule name of 1 to 64
//! bytes). The entry count is not bounded by `max_batch`: a USAGE is bounded
//! by the frame alone, and the count never sizes an allocation beyond what
//! the payload can hold.

use bytes::{BufMut, BytesMut};

use super::fields::{decode_key, decode_rule_name};
use super::frame::{encode_frame, invalid, wire_len, PayloadReader};
use super::{opcode, DecodeError, EncodeError};
use crate::message::RuleName;
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

/// A USAGE frame built entry by entry: what a region's sender uses to
/// encode straight from its journal, with no owned [`UsageEntry`] (and no
/// reference-counted key and rule name) per entry on the way. The bytes are
/// exactly those [`encode_request`](super::encode_request) writes for a
/// [`UsageReport`] of the same entries (a test checks it). Kept for
/// resending: [`UsageFrame::frame`] numbers it for each request, and
/// [`UsageFrame::renumber`] moves it into another session.
#[derive(Debug)]
pub struct UsageFrame {
    buf: BytesMut,
    entries: u32,
    /// Where the session, then seq, sent_at and the entry count, sit.
    session_at: usize,
}

/// Where the request id sits in a frame.
const REQUEST_ID_AT: usize = super::FRAME_HEADER_LEN + 1;

impl UsageFrame {
    /// An empty USAGE of `region`, written into `buf` (emptied first: a
    /// buffer kept from an earlier message keeps its room).
    pub fn new(
        mut buf: BytesMut,
        region: &str,
        (session, seq, sent_at): (u64, u64, u64),
    ) -> Result<Self, EncodeError> {
        buf.clear();
        buf.put_u32(0); // length, patched by `frame`
        buf.put_u8(opcode::USAGE);
        buf.put_u32(0); // request id, patched by `frame`
        put_region(&mut buf, region)?;
        let session_at = buf.len();
        buf.put_u64(session);
        buf.put_u64(seq);
        buf.put_u64(sent_at);
        buf.put_u32(0); // entry count, patched by `frame`
        Ok(Self {
            buf,
            entries: 0,
            session_at,
        })
    }

    /// Appends one entry. On an error (a key too long for its field, or
    /// too many entries) the frame is left as it was.
    pub fn push(
        &mut self,
        key: &[u8],
        rule: &RuleName,
        (charged, refunded, at): (u64, u64, u64),
    ) -> Result<(), EncodeError> {
        let entries = wire_len(self.entries as usize + 1, "usage entries", u32::MAX)?;
        let key_len = wire_len(key.len(), "key", u16::MAX)?;
        self.buf.reserve(UsageEntry::encoded_len(key, rule));
        self.buf.put_u16(key_len);
        self.buf.put_slice(key);
        // 1..=64 by RuleName's invariant.
        self.buf.put_u8(rule.len() as u8);
        self.buf.put_slice(rule.as_bytes());
        self.buf.put_u64(charged);
        self.buf.put_u64(refunded);
        self.buf.put_u64(at);
        self.entries = entries;
        Ok(())
    }

    /// Entries pushed so far.
    pub fn entries(&self) -> u32 {
        self.entries
    }

    /// Bytes of the frame so far, header included.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no entry was pushed.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Moves the message into `session` as its `seq`-th (resent after a
    /// failover, PROTOCOL.md §16).
    pub fn renumber(&mut self, session: u64, seq: u64) {
        let at = self.session_at;
        self.buf[at..at + 8].copy_from_slice(&session.to_be_bytes());
        self.buf[at + 8..at + 16].copy_from_slice(&seq.to_be_bytes());
    }

    /// The whole frame, as request `request_id`.
    pub fn frame(&mut self, request_id: RequestId) -> Result<&[u8], EncodeError> {
        let body_len = self.buf.len() - super::FRAME_HEADER_LEN;
        let len =
            u32::try_from(body_len).map_err(|_| EncodeError::FrameTooLarge { len: body_len })?;
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf[REQUEST_ID_AT..REQUEST_ID_AT + 4].copy_from_slice(&request_id.to_be_bytes());
        let count_at = self.session_at + 24;
        self.buf[count_at..count_at + 4].copy_from_slice(&self.entries.to_be_bytes());
        Ok(&self.buf)
    }

    /// The entries pushed so far, as they were pushed: key, rule name, and
    /// (charged, refunded, at). To take a message back before it is sent
    /// (its usage merged into a journal again, say).
    pub fn entries_pushed(&self) -> impl Iterator<Item = (&[u8], &[u8], (u64, u64, u64))> {
        let mut rest = &self.buf[self.session_at + 28..];
        std::iter::from_fn(move || {
            // Written by `push`: well formed, so `take` never comes short.
            let mut take = |n: usize| -> Option<&[u8]> {
                let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
                rest = tail;
                Some(head)
            };
            let key_len = u16::from_be_bytes(take(2)?.try_into().ok()?);
            let key = take(usize::from(key_len))?;
            let rule_len = take(1)?[0];
            let rule = take(usize::from(rule_len))?;
            let mut count = || Some(u64::from_be_bytes(take(8)?.try_into().ok()?));
            let counts = (count()?, count()?, count()?);
            Some((key, rule, counts))
        })
    }

    /// A copy of the message written into `buf` (emptied first), to send
    /// the same entries to another peer under its own numbers: one copy of
    /// the bytes, not the entries encoded again.
    pub fn copy_into(&self, mut buf: BytesMut) -> Self {
        buf.clear();
        buf.extend_from_slice(&self.buf);
        Self {
            buf,
            entries: self.entries,
            session_at: self.session_at,
        }
    }

    /// The buffer, for the next message.
    pub fn into_buf(self) -> BytesMut {
        self.buf
    }
}
