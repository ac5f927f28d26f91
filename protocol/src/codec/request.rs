//! Request payloads (client -> server): HELLO, PING, CHECK, PEEK, RESET,
//! REFUND (CHECK's layout), RELEASE, CHECK2 (CHECK's checks, each after an
//! idempotency key and a priority byte); the others' payloads are in
//! `replication.rs`, `cluster.rs` and `regions.rs`.
//!
//! The decoder enforces the server's [`ServerLimits`] while it reads: every
//! count is checked against its limit before it sizes an allocation, and
//! every key length before the key is sliced. It does not judge limit values
//! (zero rates, overflow): that is the server's per-check `InvalidLimit`;
//! nor whether a named rule exists: that is the server's `UnknownRule`. A
//! rule name's length (1..=64) and UTF-8 are checked here.
//!
//! HELLO is read only as far as its version when the version is not
//! [`PROTOCOL_VERSION`]: the rest of the payload belongs to that version's
//! layout, and the client must get `UnsupportedVersion`, not `Malformed`.

use bytes::{BufMut, Bytes, BytesMut};

use super::fields::{decode_key, decode_rule_name};
use super::frame::{encode_frame, take_frame, wire_len, PayloadReader};
use super::{opcode, DecodeError, EncodeError};
use crate::message::{
    Algorithm, CheckBatch, CheckTag, IdempotencyKey, LeaseRef, Limit, LimitRef, Pair, Priority,
    Request, RequestId, ServerLimits, TaggedBatch, IDEMPOTENCY_KEY_LEN, LIMIT_KIND_RULE,
    PROTOCOL_VERSION,
};

/// Smallest encoded check: n_pairs, then one pair with a 1-byte key.
const MIN_CHECK_LEN: usize = 1 + MIN_PAIR_LEN;
/// Smallest encoded CHECK2 check: idempotency key, priority, then a check.
const MIN_TAGGED_CHECK_LEN: usize = IDEMPOTENCY_KEY_LEN + 1 + MIN_CHECK_LEN;
/// Smallest encoded pair: key_len, 1-byte key, limit_kind, then the smaller
/// of the two limit forms (a rule: name_len and a 1-byte name; inline:
/// count, period, burst), then cost.
const MIN_PAIR_LEN: usize = 2 + 1 + 1 + 1 + 1 + 4;
/// An inline limit's count, period and burst, then the pair's cost.
const INLINE_TAIL_LEN: usize = 3 * 8 + 4;
/// Smallest encoded RESET key: key_len and a 1-byte key.
const MIN_KEY_LEN: usize = 2 + 1;
/// Smallest encoded RELEASE entry: a 1-byte key and the lease id.
const MIN_LEASE_LEN: usize = MIN_KEY_LEN + 8;

/// Decodes the next request from `src`.
///
/// `Ok(None)`: `src` does not hold a whole frame yet (nothing consumed).
/// `Err(e)` with `!e.is_fatal()`: the bad frame was consumed; answer it with
/// an ERROR frame (`e.request_id()`, `e.code()`) and call again.
pub fn decode_request(
    src: &mut BytesMut,
    limits: &ServerLimits,
) -> Result<Option<(RequestId, Request)>, DecodeError> {
    let Some(frame) = take_frame(src, limits.max_frame)? else {
        return Ok(None);
    };
    let mut r = PayloadReader::new(frame);
    let request = match r.opcode {
        opcode::HELLO => decode_hello(&mut r)?,
        opcode::PING => Request::Ping,
        opcode::CHECK => Request::Check(decode_batch(&mut r, limits)?),
        opcode::PEEK => Request::Peek(decode_batch(&mut r, limits)?),
        opcode::RESET => Request::Reset(decode_reset(&mut r, limits)?),
        opcode::REFUND => Request::Refund(decode_batch(&mut r, limits)?),
        opcode::RELEASE => Request::Release(decode_release(&mut r, limits)?),
        opcode::TOPOLOGY => Request::Topology,
        opcode::CHECK2 => Request::Check2(decode_tagged_batch(&mut r, limits)?),
        opcode::USAGE => Request::Usage(super::regions::decode_usage(&mut r, limits)?),
        opcode::NODE_CHALLENGE => Request::NodeChallenge,
        other => match super::replication::decode_repl_request(&mut r) {
            Some(decoded) => Request::Repl(decoded?),
            None => {
                return Err(DecodeError::UnknownOpcode {
                    request_id: r.request_id,
                    opcode: other,
                })
            }
        },
    };
    let request_id = r.request_id;
    r.finish()?;
    Ok(Some((request_id, request)))
}

fn decode_hello(r: &mut PayloadReader) -> Result<Request, DecodeError> {
    let version = r.u16()?;
    if version != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            request_id: r.request_id,
            version,
        });
    }
    let name_len = r.u8()?;
    let client_name = r.string(name_len.into(), "client name")?;
    let token_len = r.u8()?;
    let token = r.bytes(token_len.into())?;
    Ok(Request::Hello {
        version,
        client_name,
        auth_token: (!token.is_empty()).then_some(token),
    })
}

/// Reads the batch count shared by CHECK, PEEK, REFUND, RESET and RELEASE:
/// 1..=max_batch.
fn batch_count(r: &mut PayloadReader, limits: &ServerLimits) -> Result<u16, DecodeError> {
    let count = r.u16()?;
    if count == 0 {
        return Err(DecodeError::EmptyBatch {
            request_id: r.request_id,
            opcode: r.opcode,
        });
    }
    if count > limits.max_batch {
        return Err(DecodeError::BatchTooLarge {
            request_id: r.request_id,
            count,
            max: limits.max_batch,
        });
    }
    Ok(count)
}

/// Capacity for `count` items of at least `min_len` bytes each: never more
/// than the payload could hold, so a frame announcing a big batch and
/// carrying nothing does not make us allocate for the announcement.
fn capacity_for(r: &PayloadReader, count: u16, min_len: usize) -> usize {
    usize::from(count).min(r.remaining() / min_len)
}

fn decode_batch(r: &mut PayloadReader, limits: &ServerLimits) -> Result<CheckBatch, DecodeError> {
    let n_checks = batch_count(r, limits)?;
    let mut batch = CheckBatch::with_capacity(capacity_for(r, n_checks, MIN_CHECK_LEN));
    for check in 0..n_checks {
        decode_group(r, limits, check, &mut batch)?;
    }
    Ok(batch)
}

fn decode_tagged_batch(
    r: &mut PayloadReader,
    limits: &ServerLimits,
) -> Result<TaggedBatch, DecodeError> {
    let n_checks = batch_count(r, limits)?;
    let mut batch = TaggedBatch::with_capacity(capacity_for(r, n_checks, MIN_TAGGED_CHECK_LEN));
    for check in 0..n_checks {
        let key = r.array::<IDEMPOTENCY_KEY_LEN>()?;
        let raw = r.u8()?;
        let priority = Priority::from_wire(raw).ok_or(DecodeError::InvalidValue {
            request_id: r.request_id,
            opcode: r.opcode,
            field: "priority",
            value: raw.into(),
        })?;
        let tag = CheckTag::new(IdempotencyKey::new(key), priority);
        decode_group(r, limits, check, batch.tagged(tag))?;
    }
    Ok(batch)
}

/// One check: `n_pairs` (1..=max_group), then its pairs, appended to
/// `batch` as they decode (no vector per check, no iterator between the
/// decoder and the batch).
fn decode_group(
    r: &mut PayloadReader,
    limits: &ServerLimits,
    check: u16,
    batch: &mut CheckBatch,
) -> Result<(), DecodeError> {
    let n_pairs = r.u8()?;
    if n_pairs == 0 {
        return Err(DecodeError::EmptyGroup {
            request_id: r.request_id,
            check,
        });
    }
    if n_pairs > limits.max_group {
        return Err(DecodeError::GroupTooLarge {
            request_id: r.request_id,
            check,
            count: n_pairs,
            max: limits.max_group,
        });
    }
    // Stop at the first decode error and report it. The half-pushed check
    // does not matter: the whole batch is dropped with the error.
    for _ in 0..n_pairs {
        batch.push_pair(decode_pair(r, limits)?);
    }
    batch.end_check();
    Ok(())
}

fn decode_pair(r: &mut PayloadReader, limits: &ServerLimits) -> Result<Pair, DecodeError> {
    let key = decode_key(r, limits)?;
    let kind = r.u8()?;
    let limit = if kind == LIMIT_KIND_RULE {
        LimitRef::Rule(decode_rule_name(r)?)
    } else if kind > 0 && kind < LIMIT_KIND_RULE {
        let Some(algorithm) = Algorithm::from_wire(kind) else {
            return Err(DecodeError::UnknownAlgorithm {
                request_id: r.request_id,
                algorithm: kind,
            });
        };
        // The rest of the pair has a fixed size: read at once when it is
        // all there (every pair of a well-formed frame), else field by
        // field, for the error to name the field cut short.
        if let Some(tail) = r.try_array::<INLINE_TAIL_LEN>() {
            let u64_at = |at: usize| {
                let mut be = [0; 8];
                be.copy_from_slice(&tail[at..at + 8]);
                u64::from_be_bytes(be)
            };
            let mut cost = [0; 4];
            cost.copy_from_slice(&tail[24..]);
            let limit = Limit {
                algorithm,
                count: u64_at(0),
                period_ms: u64_at(8),
                burst: u64_at(16),
            };
            return Ok(Pair {
                key,
                limit: LimitRef::Inline(limit),
                cost: u32::from_be_bytes(cost),
            });
        }
        LimitRef::Inline(Limit {
            algorithm,
            count: r.u64()?,
            period_ms: r.u64()?,
            burst: r.u64()?,
        })
    } else {
        return Err(DecodeError::UnknownLimitKind {
            request_id: r.request_id,
            kind,
        });
    };
    let cost = r.u32()?;
    Ok(Pair { key, limit, cost })
}

fn decode_reset(r: &mut PayloadReader, limits: &ServerLimits) -> Result<Vec<Bytes>, DecodeError> {
    let n_keys = batch_count(r, limits)?;
    let mut keys = Vec::with_capacity(capacity_for(r, n_keys, MIN_KEY_LEN));
    for _ in 0..n_keys {
        keys.push(decode_key(r, limits)?);
    }
    Ok(keys)
}

fn decode_release(
    r: &mut PayloadReader,
    limits: &ServerLimits,
) -> Result<Vec<LeaseRef>, DecodeError> {
    let n = batch_count(r, limits)?;
    let mut leases = Vec::with_capacity(capacity_for(r, n, MIN_LEASE_LEN));
    for _ in 0..n {
        let key = decode_key(r, limits)?;
        let lease = r.u64()?;
        leases.push(LeaseRef { key, lease });
    }
    Ok(leases)
}

/// Appends `request` as one frame to `dst`.
///
/// Fails only when a value does not fit its wire field (a client name or
/// token over 255 bytes, a key over 65535 bytes, more than 65535 checks,
/// keys or leases, more than 255 pairs in a check); `dst` is then unchanged. Values the
/// server would refuse but the wire can carry (empty batches, keys over the
/// server's `max_key_len`) are encoded as given: the server answers them.
/// `auth_token: Some(empty)` is sent as "no token", the same bytes as `None`.
pub fn encode_request(
    request_id: RequestId,
    request: &Request,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    match request {
        Request::Hello {
            version,
            client_name,
            auth_token,
        } => {
            let token: &[u8] = auth_token.as_deref().unwrap_or_default();
            let hint = 2 + 1 + client_name.len() + 1 + token.len();
            encode_frame(dst, opcode::HELLO, request_id, hint, |dst| {
                let name_len = wire_len(client_name.len(), "client name", u8::MAX)?;
                let token_len = wire_len(token.len(), "auth token", u8::MAX)?;
                dst.put_u16(*version);
                dst.put_u8(name_len);
                dst.put_slice(client_name.as_bytes());
                dst.put_u8(token_len);
                dst.put_slice(token);
                Ok(())
            })
        }
        Request::Ping => encode_frame(dst, opcode::PING, request_id, 0, |_| Ok(())),
        Request::Check(batch) => encode_batch(opcode::CHECK, request_id, batch, dst),
        Request::Peek(batch) => encode_batch(opcode::PEEK, request_id, batch, dst),
        Request::Refund(batch) => encode_batch(opcode::REFUND, request_id, batch, dst),
        Request::Release(leases) => {
            let hint = 2 + leases.len() * MIN_LEASE_LEN;
            encode_frame(dst, opcode::RELEASE, request_id, hint, |dst| {
                dst.put_u16(wire_len(leases.len(), "leases in a release", u16::MAX)?);
                for lease in leases {
                    encode_key(&lease.key, dst)?;
                    dst.put_u64(lease.lease);
                }
                Ok(())
            })
        }
        Request::Repl(repl) => super::replication::encode_repl_request(request_id, repl, dst),
        Request::Topology => encode_frame(dst, opcode::TOPOLOGY, request_id, 0, |_| Ok(())),
        Request::NodeChallenge => {
            encode_frame(dst, opcode::NODE_CHALLENGE, request_id, 0, |_| Ok(()))
        }
        Request::Check2(batch) => encode_tagged_batch(request_id, batch, dst),
        Request::Usage(report) => super::regions::encode_usage(request_id, report, dst),
        Request::Reset(keys) => {
            let hint = 2 + keys.len() * MIN_KEY_LEN;
            encode_frame(dst, opcode::RESET, request_id, hint, |dst| {
                dst.put_u16(wire_len(keys.len(), "keys in a reset", u16::MAX)?);
                for key in keys {
                    encode_key(key, dst)?;
                }
                Ok(())
            })
        }
    }
}

fn encode_batch(
    opcode: u8,
    request_id: RequestId,
    batch: &CheckBatch,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    // Lower bound (keys of one byte); the buffer grows if keys are longer.
    let hint = 2 + batch.len() + batch.pair_count() * MIN_PAIR_LEN;
    encode_frame(dst, opcode, request_id, hint, |dst| {
        dst.put_u16(wire_len(batch.len(), "checks in a batch", u16::MAX)?);
        batch.iter().try_for_each(|check| encode_group(check, dst))
    })
}

/// Appends a CHECK, PEEK or REFUND frame (`opcode`) of the given checks,
/// each given as its pairs, without a [`CheckBatch`] built first: a client
/// that merges several callers' checks into one frame encodes them from
/// where they are. The same bytes as [`encode_request`] with a batch of
/// those checks. `expected` (how many checks there are) only sizes the
/// buffer; the count on the wire is the checks actually encoded.
///
/// # Errors
/// As [`encode_request`]; `dst` is then unchanged.
pub fn encode_checks<'a>(
    opcode: u8,
    request_id: RequestId,
    expected: usize,
    checks: impl IntoIterator<Item = &'a [Pair]>,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let hint = 2 + expected * MIN_CHECK_LEN;
    encode_frame(dst, opcode, request_id, hint, |dst| {
        let at = dst.len();
        dst.put_u16(0); // patched below
        let mut count = 0;
        for check in checks {
            encode_group(check, dst)?;
            count += 1;
        }
        let count = wire_len(count, "checks in a batch", u16::MAX)?;
        dst[at..at + 2].copy_from_slice(&count.to_be_bytes());
        Ok(())
    })
}

fn encode_tagged_batch(
    request_id: RequestId,
    batch: &TaggedBatch,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    let checks = batch.checks();
    let hint = 2 + checks.len() * (IDEMPOTENCY_KEY_LEN + 2) + checks.pair_count() * MIN_PAIR_LEN;
    encode_frame(dst, opcode::CHECK2, request_id, hint, |dst| {
        dst.put_u16(wire_len(batch.len(), "checks in a batch", u16::MAX)?);
        batch.iter().try_for_each(|(tag, check)| {
            dst.put_slice(tag.idempotency.as_bytes());
            dst.put_u8(tag.priority as u8);
            encode_group(check, dst)
        })
    })
}

/// One check: `n_pairs`, then its pairs.
fn encode_group(check: &[Pair], dst: &mut BytesMut) -> Result<(), EncodeError> {
    dst.put_u8(wire_len(check.len(), "pairs in a check", u8::MAX)?);
    for pair in check {
        encode_key(&pair.key, dst)?;
        match &pair.limit {
            LimitRef::Inline(limit) => {
                // The fixed-size tail (limit and cost) in one copy rather
                // than five `put`s, each checking the capacity: encoding
                // is per check on the client's writer.
                let mut tail = [0u8; 1 + 8 + 8 + 8 + 4];
                tail[0] = limit.algorithm as u8;
                tail[1..9].copy_from_slice(&limit.count.to_be_bytes());
                tail[9..17].copy_from_slice(&limit.period_ms.to_be_bytes());
                tail[17..25].copy_from_slice(&limit.burst.to_be_bytes());
                tail[25..].copy_from_slice(&pair.cost.to_be_bytes());
                dst.put_slice(&tail);
            }
            LimitRef::Rule(name) => {
                dst.put_u8(LIMIT_KIND_RULE);
                // 1..=64 by RuleName's invariant.
                dst.put_u8(wire_len(name.len(), "rule name", u8::MAX)?);
                dst.put_slice(name.as_bytes());
                dst.put_u32(pair.cost);
            }
        }
    }
    Ok(())
}

fn encode_key(key: &[u8], dst: &mut BytesMut) -> Result<(), EncodeError> {
    dst.put_u16(wire_len(key.len(), "key", u16::MAX)?);
    dst.put_slice(key);
    Ok(())
}
