//! CHECK2 (§5): samples for the generic round-trip, cut and corpus tests,
//! its invalid forms (each with its typed code), the worked examples of
//! the spec, and the Shed code's place in the error table.

use bytes::{BufMut, BytesMut};
use tollgate_protocol::*;

use crate::samples::*;
use crate::spec::{assert_documented, protocol_md};

/// The spec's example key: the bytes 0x00 to 0x0f.
pub const EXAMPLE_KEY: IdempotencyKey =
    IdempotencyKey::from_u128(0x0001_0203_0405_0607_0809_0a0b_0c0d_0e0f);

fn tagged(checks: Vec<(CheckTag, Vec<Pair>)>) -> TaggedBatch {
    let mut batch = TaggedBatch::with_capacity(checks.len());
    for (tag, pairs) in checks {
        batch.push_check(tag, pairs);
    }
    batch
}

fn tag(key: u128, priority: Priority) -> CheckTag {
    CheckTag::new(IdempotencyKey::from_u128(key), priority)
}

/// The spec's example: one check, low priority, the CHECK example's pair.
pub fn example() -> Request {
    Request::Check2(tagged(vec![(
        CheckTag::new(EXAMPLE_KEY, Priority::Low),
        vec![pair(
            "rl:{acme}:s",
            limit(Algorithm::TokenBucket, 10, 1000, 20),
            1,
        )],
    )]))
}

pub fn requests() -> Vec<(RequestId, Request)> {
    vec![
        (4, example()),
        (
            u32::MAX,
            Request::Check2(tagged(vec![
                (tag(0, Priority::High), vec![pair("a", per_second(1), 1)]),
                (
                    tag(u128::MAX, Priority::Normal),
                    vec![
                        pair("{t}b", per_minute_window(5), 2),
                        rule_pair("{t}c", "per-user.minute", 0),
                    ],
                ),
            ])),
        ),
    ]
}

pub fn request_stream() -> BytesMut {
    let mut out = BytesMut::new();
    for (id, request) in requests() {
        out.extend_from_slice(&encode_req(id, &request));
    }
    out
}

/// A CHECK2 payload of one check: key, priority byte, then `group`.
fn one_check(priority: u8, group: impl FnOnce(&mut BytesMut)) -> BytesMut {
    payload(|p| {
        p.put_u16(1);
        p.put_slice(EXAMPLE_KEY.as_bytes());
        p.put_u8(priority);
        group(p);
    })
}

fn one_pair(p: &mut BytesMut) {
    p.put_u8(1);
    put_pair(p, b"k", 1);
}

/// Broken CHECK2 frames, each with the code a server answers it with.
pub fn broken() -> Vec<(&'static str, BytesMut, ErrorCode)> {
    let frame = |id, payload: BytesMut| raw_frame(opcode::CHECK2, id, &payload);
    let mut trailing = one_check(1, one_pair);
    trailing.put_u8(0);
    let mut truncated_key = payload(|p| p.put_u16(1));
    truncated_key.put_slice(&EXAMPLE_KEY.as_bytes()[..10]);
    vec![
        (
            "priority",
            frame(1, one_check(3, one_pair)),
            ErrorCode::Malformed,
        ),
        (
            "priority 0xff",
            frame(2, one_check(0xff, one_pair)),
            ErrorCode::Malformed,
        ),
        (
            "truncated key",
            frame(3, truncated_key),
            ErrorCode::Malformed,
        ),
        (
            "no priority",
            frame(4, {
                let mut p = payload(|p| p.put_u16(1));
                p.put_slice(EXAMPLE_KEY.as_bytes());
                p
            }),
            ErrorCode::Malformed,
        ),
        (
            "empty batch",
            frame(5, payload(|p| p.put_u16(0))),
            ErrorCode::Malformed,
        ),
        (
            "batch too large",
            frame(6, payload(|p| p.put_u16(9))),
            ErrorCode::BatchTooLarge,
        ),
        (
            "empty group",
            frame(7, one_check(1, |p| p.put_u8(0))),
            ErrorCode::Malformed,
        ),
        (
            "group too large",
            frame(8, one_check(1, |p| p.put_u8(5))),
            ErrorCode::BatchTooLarge,
        ),
        ("trailing bytes", frame(9, trailing), ErrorCode::Malformed),
        (
            "key too long",
            frame(
                10,
                one_check(1, |p| {
                    p.put_u8(1);
                    put_pair(p, &[b'k'; 33], 1);
                }),
            ),
            ErrorCode::KeyTooLong,
        ),
        (
            "unknown algorithm",
            frame(
                11,
                one_check(1, |p| {
                    p.put_u8(1);
                    put_pair(p, b"k", 99);
                }),
            ),
            ErrorCode::Malformed,
        ),
    ]
}

/// The broken frames back to back (each consumed alone), then a PING.
pub fn broken_stream() -> BytesMut {
    let mut out = BytesMut::new();
    for (_, frame, _) in broken() {
        out.extend_from_slice(&frame);
    }
    out.extend_from_slice(&encode_req(12, &Request::Ping));
    out
}

#[test]
fn broken_frames_get_their_typed_code_and_only_their_frame_is_consumed() {
    let limits = crate::invariants::FUZZ_LIMITS;
    for (what, frame, code) in broken() {
        let mut src = frame.clone();
        src.extend_from_slice(&encode_req(99, &Request::Ping));
        let err = decode_request(&mut src, &limits).expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err}");
        assert!(!err.is_fatal(), "{what}");
        assert_eq!(
            err.request_id(),
            Some(u32::from_be_bytes(frame[5..9].try_into().unwrap()))
        );
        let next = decode_request(&mut src, &limits).expect(what);
        assert_eq!(
            next,
            Some((99, Request::Ping)),
            "{what}: the next frame decodes"
        );
    }
}

#[test]
fn priority_names_and_wire_values() {
    for (wire, p) in Priority::ALL.into_iter().enumerate() {
        assert_eq!(Priority::from_wire(wire as u8), Some(p));
        assert_eq!(p.name().parse::<Priority>(), Ok(p));
    }
    assert_eq!(Priority::from_wire(3), None);
    assert!(Priority::Low < Priority::Normal && Priority::Normal < Priority::High);
    assert!("urgent".parse::<Priority>().is_err());
    assert!(IdempotencyKey::NONE.is_none());
    assert!(!EXAMPLE_KEY.is_none());
}

#[test]
fn check2_example() {
    let frame = encode_req(4, &example());
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 43", "length: 67-byte body"),
            ("30", "opcode: CHECK2"),
            ("00 00 00 04", "request id: 4"),
            ("00 01", "n_checks: 1"),
            (
                "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f",
                "check 0, idempotency key",
            ),
            ("00", "priority: low"),
            ("01", "n_pairs: 1"),
            ("00 0b", "key_len: 11"),
            ("72 6c 3a 7b 61 63 6d 65 7d 3a 73", "key: `rl:{acme}:s`"),
            ("01", "algorithm: token bucket"),
            ("00 00 00 00 00 00 00 0a", "count: 10"),
            ("00 00 00 00 00 00 03 e8", "period_ms: 1000"),
            ("00 00 00 00 00 00 00 14", "burst: 20"),
            ("00 00 00 01", "cost: 1"),
        ],
    );
}

#[test]
fn checked_shed_example() {
    let frame = encode_resp(
        4,
        &Response::Checked(vec![CheckResult::Error(ErrorCode::Shed)]),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 0a", "length: 10-byte body"),
            ("83", "opcode: CHECKED"),
            ("00 00 00 04", "request id: 4"),
            ("00 01", "n: 1"),
            ("02", "result 0, status: error"),
            ("00 14", "code: 20 (Shed)"),
        ],
    );
}

#[test]
fn shed_is_code_20_and_documented() {
    assert_eq!(ErrorCode::Shed.to_wire(), 20);
    assert_eq!(ErrorCode::from_wire(20), ErrorCode::Shed);
    assert!(protocol_md().contains("| 20 | Shed |"));
}
