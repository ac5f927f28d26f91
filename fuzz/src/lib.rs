//! Invariants the fuzz targets check on every input, beyond "no panic".
//!
//! The input is treated as a byte stream holding any number of frames, and
//! decoded in a loop until the decoder needs more bytes or fails fatally.
//! At every step:
//! - `Ok(None)` consumed nothing and left the buffer unchanged, and the
//!   buffer really lacks a complete frame;
//! - a decoded message or a per-frame error consumed exactly one frame (the
//!   length its header announced), so the loop always makes progress, and a
//!   per-frame error names that frame's request id;
//! - a fatal error consumed nothing and names no request id;
//! - a decoded message re-encodes to the exact bytes of its frame (the
//!   encoding is canonical) and decodes back to an equal value;
//! - a decoded request respects the limits it was decoded under (and rule
//!   names their 1..=64-byte UTF-8 form, region names too); a decoded
//!   cluster answer holds only real slots and ranges that are not reversed.
//!
//! The protocol crate's tests include this file by path and replay the seed
//! corpus (and proptest inputs) through it, so CI runs these checks on
//! stable without a fuzzer.

use bytes::BytesMut;
use tollgate_protocol::{
    decode_request, decode_response, encode_request, encode_response, DecodeError, ErrorCode,
    LimitRef, Request, RequestId, Response, ServerLimits, SlotSpan, FRAME_HEADER_LEN,
    MAX_ERROR_MESSAGE_LEN, MAX_REGION_NAME_LEN, MAX_RULE_NAME_LEN, PROTOCOL_VERSION, SLOT_COUNT,
};

/// Small limits, so short fuzz inputs reach every limit check. The seed
/// corpus stays within them.
pub const FUZZ_LIMITS: ServerLimits = ServerLimits {
    max_frame: 4096,
    max_batch: 8,
    max_group: 4,
    max_key_len: 32,
};

/// Response frame cap for the response target.
pub const FUZZ_MAX_RESPONSE_FRAME: u32 = 4096;

/// What replaying one input did, for tests that expect a given outcome.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Replay {
    /// Messages decoded (each re-encoded and checked).
    pub decoded: usize,
    /// Codes of the per-frame errors, in order.
    pub rejected: Vec<ErrorCode>,
    /// Code of the fatal error that ended the stream, if any.
    pub fatal: Option<ErrorCode>,
    /// Bytes left when the decoder asked for more (0 when it ended fatally
    /// or the input was consumed whole).
    pub leftover: usize,
}

/// Checks the request decoder's invariants on `data`; panics on a violation.
pub fn check_decode_request(data: &[u8], limits: &ServerLimits) -> Replay {
    check_stream(
        data,
        |src| decode_request(src, limits),
        |frame, id, request| {
            check_request_limits(&request, limits);
            let mut out = BytesMut::new();
            encode_request(id, &request, &mut out).expect("a decoded request re-encodes");
            assert_eq!(&out[..], frame, "request encoding is canonical");
            let again = decode_request(&mut out, limits)
                .expect("a re-encoded request decodes")
                .expect("a re-encoded request is one whole frame");
            assert_eq!(again, (id, request));
            assert!(out.is_empty());
        },
    )
}

/// Checks the response decoder's invariants on `data`; panics on a violation.
pub fn check_decode_response(data: &[u8], max_frame: u32) -> Replay {
    check_stream(
        data,
        |src| decode_response(src, max_frame),
        |frame, id, response| {
            // The decoder accepts ERROR messages longer than the encoder
            // sends; those come back cut on a char boundary.
            let cut_message = match &response {
                Response::Error { message, .. } if message.len() > MAX_ERROR_MESSAGE_LEN => {
                    Some(message.as_str())
                }
                _ => None,
            };
            check_response_shape(&response);
            let mut out = BytesMut::new();
            encode_response(id, &response, &mut out).expect("a decoded response re-encodes");
            if cut_message.is_none() {
                assert_eq!(&out[..], frame, "response encoding is canonical");
            }
            let again = decode_response(&mut out, max_frame)
                .expect("a re-encoded response decodes")
                .expect("a re-encoded response is one whole frame");
            assert!(out.is_empty());
            match (cut_message, &again) {
                (Some(message), (again_id, Response::Error { code, message: cut })) => {
                    assert_eq!(*again_id, id);
                    assert!(matches!(response, Response::Error { code: c, .. } if c == *code));
                    assert!(message.starts_with(cut.as_str()));
                    assert!(
                        cut.len() <= MAX_ERROR_MESSAGE_LEN && cut.len() + 4 > MAX_ERROR_MESSAGE_LEN
                    );
                }
                _ => {
                    assert_eq!(again.0, id);
                    assert_eq!(again.1, response);
                }
            }
        },
    )
}

/// The whole frame at the front of `buf` (header included), if its header is
/// complete.
fn announced_frame_len(buf: &[u8]) -> Option<usize> {
    let header: [u8; 4] = buf.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
    Some(FRAME_HEADER_LEN + u32::from_be_bytes(header) as usize)
}

/// The request id in the header of the frame at the front of `buf`.
fn announced_request_id(buf: &[u8]) -> Option<RequestId> {
    let id: [u8; 4] = buf
        .get(FRAME_HEADER_LEN + 1..FRAME_HEADER_LEN + 5)?
        .try_into()
        .ok()?;
    Some(u32::from_be_bytes(id))
}

fn check_stream<M>(
    data: &[u8],
    mut decode: impl FnMut(&mut BytesMut) -> Result<Option<(RequestId, M)>, DecodeError>,
    mut check_message: impl FnMut(&[u8], RequestId, M),
) -> Replay {
    let mut src = BytesMut::from(data);
    let mut replay = Replay::default();
    loop {
        let rest = &data[data.len() - src.len()..];
        let frame_len = announced_frame_len(rest);
        let result = decode(&mut src);
        let consumed = rest.len() - src.len();
        match result {
            Ok(None) => {
                assert_eq!(&src[..], rest, "Ok(None) leaves the buffer as it was");
                if let Some(frame_len) = frame_len {
                    assert!(
                        rest.len() < frame_len,
                        "a complete frame was left undecoded"
                    );
                }
                replay.leftover = rest.len();
                return replay;
            }
            Ok(Some((id, message))) => {
                assert_eq!(Some(consumed), frame_len, "a message is exactly one frame");
                assert_eq!(Some(id), announced_request_id(rest));
                check_message(&rest[..consumed], id, message);
                replay.decoded += 1;
            }
            Err(e) if e.is_fatal() => {
                assert_eq!(consumed, 0, "a fatal error consumes nothing: {e}");
                assert_eq!(e.request_id(), None, "a fatal error has no request id: {e}");
                replay.fatal = Some(e.code());
                return replay;
            }
            Err(e) => {
                assert_eq!(
                    Some(consumed),
                    frame_len,
                    "a rejected frame is consumed whole: {e}"
                );
                assert_eq!(e.request_id(), announced_request_id(rest), "{e}");
                replay.rejected.push(e.code());
            }
        }
    }
}

/// Slots in decoded cluster answers are real slots, ranges not reversed;
/// region names are within their bounds.
fn check_response_shape(response: &Response) {
    let check_span = |s: &SlotSpan| {
        assert!(
            s.first <= s.last && s.last < SLOT_COUNT,
            "bad slot range decoded: {s:?}"
        );
    };
    match response {
        Response::Topology(t) => {
            t.shards.iter().flat_map(|s| &s.slots).for_each(check_span);
            t.moving.iter().for_each(|m| check_span(&m.slots));
        }
        Response::Moved(m) => assert!(m.slot < SLOT_COUNT, "bad slot decoded: {}", m.slot),
        Response::UsageOk(ack) => assert!(
            (1..=MAX_REGION_NAME_LEN).contains(&ack.region.len()),
            "region name length out of range decoded"
        ),
        _ => {}
    }
}

fn check_request_limits(request: &Request, limits: &ServerLimits) {
    let check_key = |key: &[u8]| {
        assert!(!key.is_empty(), "empty key decoded");
        assert!(
            key.len() <= usize::from(limits.max_key_len),
            "key over max_key_len decoded"
        );
    };
    let check_count = |count: usize| {
        assert!(count >= 1, "empty batch decoded");
        assert!(
            count <= usize::from(limits.max_batch),
            "batch over max_batch decoded"
        );
    };
    let check_batch = |batch: &tollgate_protocol::CheckBatch| {
        check_count(batch.len());
        for check in batch.iter() {
            assert!(!check.is_empty(), "empty group decoded");
            assert!(
                check.len() <= usize::from(limits.max_group),
                "group over max_group decoded"
            );
            for pair in check {
                check_key(&pair.key);
                if let LimitRef::Rule(name) = &pair.limit {
                    assert!(
                        (1..=MAX_RULE_NAME_LEN).contains(&name.len()),
                        "rule name length out of range decoded"
                    );
                    assert!(std::str::from_utf8(name.as_bytes()).is_ok());
                }
            }
        }
    };
    match request {
        Request::Hello { version, .. } => assert_eq!(*version, PROTOCOL_VERSION),
        Request::Ping => {}
        Request::Check(batch) | Request::Peek(batch) | Request::Refund(batch) => {
            check_batch(batch);
        }
        Request::Check2(tagged) => {
            assert_eq!(tagged.len(), tagged.checks().len(), "one tag per check");
            check_batch(tagged.checks());
        }
        Request::Reset(keys) => {
            check_count(keys.len());
            for key in keys {
                check_key(key);
            }
        }
        Request::Release(leases) => {
            check_count(leases.len());
            for lease in leases {
                check_key(&lease.key);
            }
        }
        // No batch limits apply: sizes are bounded by the frame alone.
        Request::Usage(report) => {
            for entry in &report.entries {
                check_key(&entry.key);
            }
            assert!((1..=MAX_REGION_NAME_LEN).contains(&report.region.len()));
        }
        Request::Repl(_) | Request::Topology | Request::NodeChallenge => {}
    }
}
