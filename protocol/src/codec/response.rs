//! Response payloads (server -> client): HELLO_OK, PONG, CHECKED,
//! RESET_DONE, RELEASED, ERROR.
//!
//! The server encodes CHECKED results as it produces them through
//! [`encode_checked`], without collecting a `Vec` first. The client decodes
//! with only a frame-size cap: it has no batch limits of its own, and a
//! response can only be as big as what the server chose to answer.
//!
//! Decoding is lenient where leniency costs nothing: unknown error codes
//! decode as [`ErrorCode::Unknown`] and ERROR messages longer than the
//! encoder's 1024-byte cap are accepted, so an older client can still read
//! a newer server's errors.

use bytes::{BufMut, BytesMut};

use super::frame::{encode_frame, take_frame, wire_len, PayloadReader};
use super::{opcode, DecodeError, EncodeError, MAX_ERROR_MESSAGE_LEN};
use crate::message::{CheckResult, Decision, ErrorCode, RequestId, Response, ServerLimits};
use crate::replication::Role;

/// Result statuses in a CHECKED payload.
const STATUS_ALLOWED: u8 = 0;
const STATUS_DENIED: u8 = 1;
const STATUS_ERROR: u8 = 2;
/// Allowed, and the decision is followed by the lease it acquired.
const STATUS_ALLOWED_WITH_LEASE: u8 = 3;
/// Allowed because the denying rule is in shadow mode; the decision fields
/// describe the would-be denial.
const STATUS_SHADOW_DENIED: u8 = 4;

/// Encoded size of a decision result (any of statuses 0, 1, 4): status,
/// pair, four u64 fields.
const DECISION_LEN: usize = 1 + 1 + 4 * 8;
/// Encoded size of an allowed-with-lease result: a decision and the lease.
const LEASED_DECISION_LEN: usize = DECISION_LEN + 8;

// The client's default frame cap is sized for the longest result.
const _: () = assert!(
    super::DEFAULT_CLIENT_MAX_FRAME as usize == 5 + 2 + LEASED_DECISION_LEN * u16::MAX as usize
);
/// Encoded size of an error result: status and code.
const ERROR_RESULT_LEN: usize = 1 + 2;

/// Decodes the next response from `src`, refusing frames whose body exceeds
/// `max_frame`. Same contract as [`decode_request`](super::decode_request).
pub fn decode_response(
    src: &mut BytesMut,
    max_frame: u32,
) -> Result<Option<(RequestId, Response)>, DecodeError> {
    let Some(frame) = take_frame(src, max_frame)? else {
        return Ok(None);
    };
    let mut r = PayloadReader::new(frame);
    let response = match r.opcode {
        opcode::HELLO_OK => decode_hello_ok(&mut r)?,
        opcode::PONG => Response::Pong,
        opcode::CHECKED => Response::Checked(decode_results(&mut r)?),
        opcode::RESET_DONE => Response::ResetDone(r.u32()?),
        opcode::RELEASED => Response::Released(r.u32()?),
        opcode::ERROR => {
            let code = ErrorCode::from_wire(r.u16()?);
            let len = r.u16()?;
            let message = r.string(len.into(), "error message")?;
            Response::Error { code, message }
        }
        opcode::TOPOLOGY_OK => Response::Topology(super::cluster::decode_topology(&mut r)?),
        opcode::MOVED => Response::Moved(super::cluster::decode_moved(&mut r)?),
        opcode::USAGE_OK => Response::UsageOk(super::regions::decode_usage_ok(&mut r)?),
        opcode::CHALLENGE => Response::Challenge { nonce: r.array()? },
        other => match super::replication::decode_repl_response(&mut r) {
            Some(decoded) => Response::Repl(decoded?),
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
    Ok(Some((request_id, response)))
}

fn decode_hello_ok(r: &mut PayloadReader) -> Result<Response, DecodeError> {
    let version = r.u16()?;
    let role = r.u8()?;
    let Some(role) = Role::from_wire(role) else {
        return Err(DecodeError::UnknownRole {
            request_id: r.request_id,
            role,
        });
    };
    Ok(Response::HelloOk {
        version,
        role,
        epoch: r.u64()?,
        offset: r.u64()?,
        limits: ServerLimits {
            max_frame: r.u32()?,
            max_batch: r.u16()?,
            max_group: r.u8()?,
            max_key_len: r.u16()?,
        },
    })
}

fn decode_results(r: &mut PayloadReader) -> Result<Vec<CheckResult>, DecodeError> {
    let n = r.u16()?;
    // Bounded by what the payload can hold, not by the announced count.
    let mut results = Vec::with_capacity(usize::from(n).min(r.remaining() / ERROR_RESULT_LEN));
    for _ in 0..n {
        let status = r.u8()?;
        let result = match status {
            STATUS_ALLOWED | STATUS_DENIED | STATUS_ALLOWED_WITH_LEASE | STATUS_SHADOW_DENIED => {
                // The fixed fields in one read when they are all there (the
                // client decodes one per check); field by field otherwise,
                // to report the first one cut short.
                let (pair, limit, remaining, reset_after_ms, retry_after_ms) = match r
                    .try_array::<{ DECISION_LEN - 1 }>()
                {
                    Some(a) => {
                        let u64_at =
                            |i: usize| u64::from_be_bytes(a[i..i + 8].try_into().expect("8 bytes"));
                        (a[0], u64_at(1), u64_at(9), u64_at(17), u64_at(25))
                    }
                    None => (r.u8()?, r.u64()?, r.u64()?, r.u64()?, r.u64()?),
                };
                CheckResult::Decision(Decision {
                    allowed: status != STATUS_DENIED,
                    shadow_denied: status == STATUS_SHADOW_DENIED,
                    pair,
                    limit,
                    remaining,
                    reset_after_ms,
                    retry_after_ms,
                    lease: if status == STATUS_ALLOWED_WITH_LEASE {
                        Some(r.u64()?)
                    } else {
                        None
                    },
                })
            }
            STATUS_ERROR => CheckResult::Error(ErrorCode::from_wire(r.u16()?)),
            _ => {
                return Err(DecodeError::UnknownStatus {
                    request_id: r.request_id,
                    status,
                })
            }
        };
        results.push(result);
    }
    Ok(results)
}

/// Appends `response` as one frame to `dst`.
///
/// An ERROR message is cut to [`MAX_ERROR_MESSAGE_LEN`] bytes on a char
/// boundary. Fails only for a CHECKED with more than 65535 results (`dst` is
/// then unchanged), which a server bounded by `max_batch` never builds.
pub fn encode_response(
    request_id: RequestId,
    response: &Response,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    match response {
        Response::HelloOk {
            version,
            role,
            epoch,
            offset,
            limits,
        } => encode_frame(
            dst,
            opcode::HELLO_OK,
            request_id,
            2 + 1 + 8 + 8 + 4 + 2 + 1 + 2,
            |dst| {
                dst.put_u16(*version);
                dst.put_u8(*role as u8);
                dst.put_u64(*epoch);
                dst.put_u64(*offset);
                dst.put_u32(limits.max_frame);
                dst.put_u16(limits.max_batch);
                dst.put_u8(limits.max_group);
                dst.put_u16(limits.max_key_len);
                Ok(())
            },
        ),
        Response::Pong => encode_frame(dst, opcode::PONG, request_id, 0, |_| Ok(())),
        Response::Repl(repl) => super::replication::encode_repl_response(request_id, repl, dst),
        Response::Topology(topology) => super::cluster::encode_topology(request_id, topology, dst),
        Response::Moved(moved) => super::cluster::encode_moved(request_id, moved, dst),
        Response::UsageOk(ack) => super::regions::encode_usage_ok(request_id, ack, dst),
        Response::Challenge { nonce } => {
            encode_frame(dst, opcode::CHALLENGE, request_id, nonce.len(), |dst| {
                dst.put_slice(nonce);
                Ok(())
            })
        }
        Response::Checked(results) => encode_checked(request_id, results.iter().copied(), dst),
        Response::ResetDone(removed) => {
            encode_frame(dst, opcode::RESET_DONE, request_id, 4, |dst| {
                dst.put_u32(*removed);
                Ok(())
            })
        }
        Response::Released(released) => encode_frame(dst, opcode::RELEASED, request_id, 4, |dst| {
            dst.put_u32(*released);
            Ok(())
        }),
        Response::Error { code, message } => {
            let message = truncate_on_char_boundary(message, MAX_ERROR_MESSAGE_LEN);
            encode_frame(
                dst,
                opcode::ERROR,
                request_id,
                2 + 2 + message.len(),
                |dst| {
                    dst.put_u16(code.to_wire());
                    // At most MAX_ERROR_MESSAGE_LEN, so this cannot fail.
                    dst.put_u16(wire_len(message.len(), "error message", u16::MAX)?);
                    dst.put_slice(message.as_bytes());
                    Ok(())
                },
            )
        }
    }
}

/// Appends a CHECKED frame answering `request_id`, one result per check in
/// request order, streamed from `results` (no intermediate `Vec`).
///
/// An allowed decision with a lease is written with status 3 and the lease
/// after the decision fields; a denied decision never carries a lease (one
/// set there is dropped). An allowed decision with `shadow_denied` and no
/// lease is written with status 4. Status 3 wins when a decision has both:
/// the lease must reach the client to be released, and status 3 has no
/// room for the shadow flag (the server never answers with both, see
/// [`Decision::shadow_denied`]).
///
/// The result count is written from the results actually yielded, so an
/// iterator whose `len()` is wrong still produces a well-formed frame;
/// `len()` only sizes the up-front reservation. Fails (leaving `dst`
/// unchanged) when there are more than 65535 results.
pub fn encode_checked<I>(
    request_id: RequestId,
    results: I,
    dst: &mut BytesMut,
) -> Result<(), EncodeError>
where
    I: ExactSizeIterator<Item = CheckResult>,
{
    let hint = 2usize.saturating_add(results.len().saturating_mul(DECISION_LEN));
    encode_frame(dst, opcode::CHECKED, request_id, hint, |dst| {
        let count_at = dst.len();
        dst.put_u16(0); // patched once the results are counted
        let mut count = 0usize;
        for result in results {
            count += 1;
            match result {
                CheckResult::Decision(d) => {
                    // A denial stays a denial whatever shadow_denied or
                    // lease say; a lease wins over shadow_denied.
                    let lease = d.lease.filter(|_| d.allowed);
                    let status = match (d.allowed, lease) {
                        (false, _) => STATUS_DENIED,
                        (true, Some(_)) => STATUS_ALLOWED_WITH_LEASE,
                        (true, None) if d.shadow_denied => STATUS_SHADOW_DENIED,
                        (true, None) => STATUS_ALLOWED,
                    };
                    // Laid out on the stack and appended at once: one
                    // capacity check per decision (two with a lease)
                    // instead of one per field, and a copy of a length
                    // known when compiling (a copy of either length was a
                    // `memcpy` call, 1% of the server's CPU).
                    let mut out = [0u8; DECISION_LEN];
                    out[0] = status;
                    out[1] = d.pair;
                    let fields = [d.limit, d.remaining, d.reset_after_ms, d.retry_after_ms];
                    for (chunk, value) in out[2..].chunks_exact_mut(8).zip(fields) {
                        chunk.copy_from_slice(&value.to_be_bytes());
                    }
                    dst.put_slice(&out);
                    if let Some(lease) = lease {
                        dst.put_slice(&lease.to_be_bytes());
                    }
                }
                CheckResult::Error(code) => {
                    dst.put_u8(STATUS_ERROR);
                    dst.put_u16(code.to_wire());
                }
            }
        }
        let count = wire_len(count, "results in a CHECKED", u16::MAX)?;
        dst[count_at..count_at + 2].copy_from_slice(&count.to_be_bytes());
        Ok(())
    })
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char
/// boundary.
fn truncate_on_char_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    // A char is at most 4 bytes, so this steps back at most 3 times; index 0
    // is always a boundary.
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_whole_chars() {
        assert_eq!(truncate_on_char_boundary("short", 1024), "short");
        // "é" is 2 bytes: cutting at 3 would split the second one.
        assert_eq!(truncate_on_char_boundary("éé", 3), "é");
        assert_eq!(truncate_on_char_boundary("€", 2), "");
        let long = "x".repeat(1023) + "€";
        assert_eq!(truncate_on_char_boundary(&long, 1024).len(), 1023);
    }

    #[test]
    fn too_many_results_leave_the_buffer_unchanged() {
        let mut dst = BytesMut::from(&b"kept"[..]);
        let results = std::iter::repeat_n(CheckResult::Error(ErrorCode::Internal), 65536);
        let err = encode_checked(1, results, &mut dst).expect_err("too many");
        assert!(matches!(
            err,
            EncodeError::TooLong {
                len: 65536,
                max: 65535,
                ..
            }
        ));
        assert_eq!(&dst[..], b"kept");
    }
}
