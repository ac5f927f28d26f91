//! Invalid input: each rejection gives its variant and wire code; per-frame
//! errors consume exactly the bad frame (a valid frame behind it still
//! decodes); fatal errors consume nothing and reserve nothing.

use bytes::{BufMut, BytesMut};
use tollgate_protocol::*;

use crate::samples::*;

const BAD_ID: RequestId = 0xDEAD_BEEF;
const NEXT_ID: RequestId = 4242;

fn limits() -> ServerLimits {
    ServerLimits {
        max_frame: 4096,
        max_batch: 4,
        max_group: 3,
        max_key_len: 16,
    }
}

/// Decodes `bad` followed by a valid PING: the first decode must fail with a
/// non-fatal error accepted by `is_expected` and answered with `code`, and the
/// PING must then decode from exactly what is left.
fn rejects_request(bad: BytesMut, code: ErrorCode, is_expected: impl Fn(&DecodeError) -> bool) {
    let mut src = bad;
    encode_request(NEXT_ID, &Request::Ping, &mut src).expect("encodes");
    let err = decode_request(&mut src, &limits()).expect_err("must be rejected");
    assert!(is_expected(&err), "unexpected variant: {err:?}");
    assert_eq!(err.code(), code, "{err}");
    assert!(!err.is_fatal(), "{err}");
    assert_eq!(err.request_id(), Some(BAD_ID));
    let next = decode_request(&mut src, &limits()).expect("next frame decodes");
    assert_eq!(
        next,
        Some((NEXT_ID, Request::Ping)),
        "the bad frame was not consumed exactly"
    );
    assert!(src.is_empty());
}

fn check_frame(opcode: u8, write: impl FnOnce(&mut BytesMut)) -> BytesMut {
    raw_frame(opcode, BAD_ID, &payload(write))
}

#[test]
fn unknown_opcodes() {
    for op in [
        0x00,
        0x11,
        0x7F,
        opcode::HELLO_OK,
        opcode::CHECKED,
        opcode::ERROR,
    ] {
        rejects_request(
            raw_frame(op, BAD_ID, &[]),
            ErrorCode::UnknownOpcode,
            |e| matches!(e, DecodeError::UnknownOpcode { opcode, .. } if *opcode == op),
        );
    }
}

#[test]
fn empty_batches() {
    for op in [
        opcode::CHECK,
        opcode::PEEK,
        opcode::RESET,
        opcode::REFUND,
        opcode::RELEASE,
    ] {
        rejects_request(
            check_frame(op, |p| p.put_u16(0)),
            ErrorCode::Malformed,
            |e| matches!(e, DecodeError::EmptyBatch { opcode, .. } if *opcode == op),
        );
    }
}

#[test]
fn batches_over_max_batch() {
    // The count alone is enough: it is checked before anything is read.
    for op in [
        opcode::CHECK,
        opcode::PEEK,
        opcode::RESET,
        opcode::REFUND,
        opcode::RELEASE,
    ] {
        rejects_request(
            check_frame(op, |p| p.put_u16(5)),
            ErrorCode::BatchTooLarge,
            |e| {
                matches!(
                    e,
                    DecodeError::BatchTooLarge {
                        count: 5,
                        max: 4,
                        ..
                    }
                )
            },
        );
    }
    rejects_request(
        check_frame(opcode::CHECK, |p| p.put_u16(u16::MAX)),
        ErrorCode::BatchTooLarge,
        |e| {
            matches!(
                e,
                DecodeError::BatchTooLarge {
                    count: u16::MAX,
                    max: 4,
                    ..
                }
            )
        },
    );
}

#[test]
fn max_batch_itself_is_accepted() {
    let mut frame = check_frame(opcode::RESET, |p| {
        p.put_u16(4);
        for key in [b"a", b"b", b"c", b"d"] {
            p.put_u16(1);
            p.put_slice(key);
        }
    });
    let (_, request) = decode_request(&mut frame, &limits())
        .expect("valid")
        .expect("whole");
    assert!(matches!(request, Request::Reset(keys) if keys.len() == 4));
    let mut frame = check_frame(opcode::RELEASE, |p| {
        p.put_u16(4);
        for key in [b"a", b"b", b"c", b"d"] {
            p.put_u16(1);
            p.put_slice(key);
            p.put_u64(7);
        }
    });
    let (_, request) = decode_request(&mut frame, &limits())
        .expect("valid")
        .expect("whole");
    assert!(matches!(request, Request::Release(leases) if leases.len() == 4));
}

#[test]
fn empty_groups() {
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(2);
        p.put_u8(1);
        put_pair(p, b"ok", 1);
        p.put_u8(0);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(e, DecodeError::EmptyGroup { check: 1, .. })
    });
}

#[test]
fn groups_over_max_group() {
    let frame = check_frame(opcode::PEEK, |p| {
        p.put_u16(1);
        p.put_u8(4);
        for key in [b"{a}1", b"{a}2", b"{a}3", b"{a}4"] {
            put_pair(p, key, 1);
        }
    });
    rejects_request(frame, ErrorCode::BatchTooLarge, |e| {
        matches!(
            e,
            DecodeError::GroupTooLarge {
                check: 0,
                count: 4,
                max: 3,
                ..
            }
        )
    });
}

#[test]
fn max_group_and_max_key_len_themselves_are_accepted() {
    let key = [b'k'; 16];
    let mut frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(3);
        for _ in 0..3 {
            put_pair(p, &key, 2);
        }
    });
    let (_, request) = decode_request(&mut frame, &limits())
        .expect("valid")
        .expect("whole");
    let Request::Check(batch) = request else {
        panic!("a CHECK")
    };
    assert_eq!(batch.pair_count(), 3);
    assert!(batch.iter().flatten().all(|p| p.key[..] == key));
}

#[test]
fn empty_keys() {
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        put_pair(p, b"", 1);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(e, DecodeError::EmptyKey { .. })
    });
    let frame = check_frame(opcode::RESET, |p| {
        p.put_u16(1);
        p.put_u16(0);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(e, DecodeError::EmptyKey { .. })
    });
    let frame = check_frame(opcode::RELEASE, |p| {
        p.put_u16(1);
        p.put_u16(0);
        p.put_u64(7);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(e, DecodeError::EmptyKey { .. })
    });
}

#[test]
fn keys_over_max_key_len_are_refused_before_slicing() {
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        put_pair(p, &[b'k'; 17], 1);
    });
    rejects_request(frame, ErrorCode::KeyTooLong, |e| {
        matches!(
            e,
            DecodeError::KeyTooLong {
                len: 17,
                max: 16,
                ..
            }
        )
    });
    // Only the length is there: still KeyTooLong, not Truncated.
    for op in [opcode::RESET, opcode::RELEASE] {
        let frame = check_frame(op, |p| {
            p.put_u16(1);
            p.put_u16(u16::MAX);
        });
        rejects_request(frame, ErrorCode::KeyTooLong, |e| {
            matches!(
                e,
                DecodeError::KeyTooLong {
                    len: u16::MAX,
                    max: 16,
                    ..
                }
            )
        });
    }
    let frame = check_frame(opcode::REFUND, |p| {
        p.put_u16(1);
        p.put_u8(1);
        p.put_u16(u16::MAX);
    });
    rejects_request(frame, ErrorCode::KeyTooLong, |e| {
        matches!(
            e,
            DecodeError::KeyTooLong {
                len: u16::MAX,
                max: 16,
                ..
            }
        )
    });
}

#[test]
fn unknown_limit_kinds() {
    // Neither an algorithm code (1..=127) nor a rule reference (0x80).
    for (op, kind) in [
        (opcode::CHECK, 0),
        (opcode::CHECK, 0x81),
        (opcode::CHECK, 0xFE),
        (opcode::PEEK, 0xFF),
        (opcode::REFUND, 0),
    ] {
        let frame = check_frame(op, |p| {
            p.put_u16(1);
            p.put_u8(1);
            put_pair(p, b"k", kind);
        });
        rejects_request(
            frame,
            ErrorCode::Malformed,
            |e| matches!(e, DecodeError::UnknownLimitKind { kind: k, .. } if *k == kind),
        );
    }
}

#[test]
fn rule_names_out_of_range_are_refused_before_slicing() {
    for len in [0u8, 65, 0xFF] {
        let frame = check_frame(opcode::CHECK, |p| {
            p.put_u16(1);
            p.put_u8(1);
            p.put_u16(1);
            p.put_u8(b'k');
            p.put_u8(LIMIT_KIND_RULE);
            p.put_u8(len);
            // Only 3 bytes follow: a length above them is still reported as
            // a bad length, not as a truncation.
            p.put_slice(b"abc");
        });
        rejects_request(
            frame,
            ErrorCode::Malformed,
            |e| matches!(e, DecodeError::RuleNameLength { len: l, .. } if *l == len),
        );
    }
}

#[test]
fn rule_names_must_be_utf8_and_whole() {
    let frame = check_frame(opcode::PEEK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        put_rule_pair(p, b"k", &[b'r', 0xC3, 0x28]);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::InvalidUtf8 {
                field: "rule name",
                ..
            }
        )
    });
    // name_len 10, only 4 name bytes and no cost.
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        p.put_u16(1);
        p.put_u8(b'k');
        p.put_u8(LIMIT_KIND_RULE);
        p.put_u8(10);
        p.put_slice(b"rule");
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                offset: 8,
                needed: 10,
                available: 4,
                ..
            }
        )
    });
    // A rule pair without its cost.
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        p.put_u16(1);
        p.put_u8(b'k');
        p.put_u8(LIMIT_KIND_RULE);
        p.put_u8(1);
        p.put_u8(b'r');
        p.put_u16(0);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                needed: 4,
                available: 2,
                ..
            }
        )
    });
}

#[test]
fn rule_pairs_at_the_edges_are_accepted() {
    let name = [b'n'; 64];
    let mut frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(2);
        put_rule_pair(p, b"{t}a", &name);
        put_rule_pair(p, b"{t}b", b"r");
    });
    let (_, request) = decode_request(&mut frame, &limits())
        .expect("valid")
        .expect("whole");
    let Request::Check(batch) = request else {
        panic!("a CHECK")
    };
    let pairs: Vec<_> = batch.iter().flatten().collect();
    assert!(matches!(&pairs[0].limit, LimitRef::Rule(n) if n.as_bytes() == name));
    assert!(matches!(&pairs[1].limit, LimitRef::Rule(n) if n.as_str() == "r"));
    assert_eq!(
        pairs[1].cost, 0,
        "cost 0 is the rule's default, not an error"
    );
}

#[test]
fn unknown_algorithms() {
    // Codes 1..=127 are inline algorithms: 7 and up are not known (yet).
    for (op, algorithm) in [
        (opcode::CHECK, 7),
        (opcode::CHECK, 0x7F),
        (opcode::PEEK, 7),
        (opcode::REFUND, 7),
        (opcode::REFUND, 0x7F),
    ] {
        let frame = check_frame(op, |p| {
            p.put_u16(1);
            p.put_u8(1);
            put_pair(p, b"k", algorithm);
        });
        rejects_request(
            frame,
            ErrorCode::Malformed,
            |e| matches!(e, DecodeError::UnknownAlgorithm { algorithm: a, .. } if *a == algorithm),
        );
    }
}

#[test]
fn every_algorithm_code_decodes() {
    for code in 1..=6u8 {
        let mut frame = check_frame(opcode::CHECK, |p| {
            p.put_u16(1);
            p.put_u8(1);
            put_pair(p, b"k", code);
        });
        let (_, request) = decode_request(&mut frame, &limits())
            .expect("valid")
            .expect("whole");
        let Request::Check(batch) = request else {
            panic!("a CHECK")
        };
        let LimitRef::Inline(limit) = &batch.iter().next().unwrap()[0].limit else {
            panic!("an inline limit")
        };
        let algorithm = limit.algorithm;
        assert_eq!(algorithm as u8, code);
        assert_eq!(Algorithm::from_wire(code), Some(algorithm));
        assert_eq!(Algorithm::from_name(algorithm.name()), Some(algorithm));
    }
    let names: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
    assert_eq!(
        names,
        [
            "token-bucket",
            "sliding-window",
            "fixed-window",
            "sliding-log",
            "leaky-bucket",
            "concurrency"
        ]
    );
    assert_eq!(Algorithm::from_name("Token-Bucket"), None);
    assert_eq!(Algorithm::from_name(""), None);
}

#[test]
fn hello_with_invalid_utf8_name() {
    let frame = check_frame(opcode::HELLO, |p| {
        p.put_u16(PROTOCOL_VERSION);
        p.put_u8(3);
        p.put_slice(&[b'a', 0xC3, 0x28]); // broken 2-byte sequence
        p.put_u8(0);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::InvalidUtf8 {
                field: "client name",
                ..
            }
        )
    });
}

#[test]
fn hello_for_another_version_is_not_read_past_its_version() {
    // Whatever follows the version belongs to that version's layout.
    for version in [0, 2, u16::MAX] {
        let frame = check_frame(opcode::HELLO, |p| {
            p.put_u16(version);
            p.put_slice(b"\xFF\xFF any future layout");
        });
        rejects_request(
            frame,
            ErrorCode::UnsupportedVersion,
            |e| matches!(e, DecodeError::UnsupportedVersion { version: v, .. } if *v == version),
        );
    }
}

#[test]
fn truncated_bodies() {
    // CHECK whose pair stops after the algorithm byte.
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        p.put_u16(1);
        p.put_u8(b'k');
        p.put_u8(1);
        p.put_u32(0); // half a u64
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                opcode: opcode::CHECK,
                offset: 7,
                needed: 8,
                available: 4,
                ..
            }
        )
    });
    // A batch announcing more checks than the frame holds.
    let frame = check_frame(opcode::CHECK, |p| {
        p.put_u16(2);
        p.put_u8(1);
        put_pair(p, b"k", 1);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                needed: 1,
                available: 0,
                ..
            }
        )
    });
    // HELLO whose token is shorter than token_len; HELLO with no payload.
    let frame = check_frame(opcode::HELLO, |p| {
        p.put_u16(PROTOCOL_VERSION);
        p.put_u8(0);
        p.put_u8(10);
        p.put_slice(b"short");
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                opcode: opcode::HELLO,
                offset: 4,
                needed: 10,
                available: 5,
                ..
            }
        )
    });
    rejects_request(
        raw_frame(opcode::HELLO, BAD_ID, &[]),
        ErrorCode::Malformed,
        |e| {
            matches!(
                e,
                DecodeError::Truncated {
                    offset: 0,
                    needed: 2,
                    available: 0,
                    ..
                }
            )
        },
    );
    // RELEASE whose lease id is cut short.
    let frame = check_frame(opcode::RELEASE, |p| {
        p.put_u16(1);
        p.put_u16(1);
        p.put_u8(b'k');
        p.put_u32(9);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                opcode: opcode::RELEASE,
                offset: 5,
                needed: 8,
                available: 4,
                ..
            }
        )
    });
    // RESET key shorter than its key_len.
    let frame = check_frame(opcode::RESET, |p| {
        p.put_u16(1);
        p.put_u16(8);
        p.put_slice(b"abc");
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                offset: 4,
                needed: 8,
                available: 3,
                ..
            }
        )
    });
}

#[test]
fn bytes_left_over_inside_a_frame() {
    rejects_request(
        raw_frame(opcode::PING, BAD_ID, b"x"),
        ErrorCode::Malformed,
        |e| {
            matches!(
                e,
                DecodeError::TrailingBytes {
                    opcode: opcode::PING,
                    extra: 1,
                    ..
                }
            )
        },
    );
    let mut with_extra = encode_req(BAD_ID, &requests()[5].1);
    with_extra.put_slice(b"abc");
    let len = (with_extra.len() - FRAME_HEADER_LEN) as u32;
    with_extra[..4].copy_from_slice(&len.to_be_bytes());
    rejects_request(with_extra, ErrorCode::Malformed, |e| {
        matches!(
            e,
            DecodeError::TrailingBytes {
                opcode: opcode::CHECK,
                extra: 3,
                ..
            }
        )
    });
    let frame = check_frame(opcode::HELLO, |p| {
        p.put_u16(PROTOCOL_VERSION);
        p.put_u8(0);
        p.put_u8(0);
        p.put_u8(0);
    });
    rejects_request(frame, ErrorCode::Malformed, |e| {
        matches!(e, DecodeError::TrailingBytes { extra: 1, .. })
    });
}

#[test]
fn frames_shorter_than_the_header_are_fatal() {
    for len in 0..5u32 {
        let mut src = BytesMut::new();
        src.put_u32(len);
        src.put_slice(&[0; 16]);
        let before = src.clone();
        let err = decode_request(&mut src, &limits()).expect_err("too short");
        assert!(
            matches!(err, DecodeError::FrameTooShort { len: l } if l == len),
            "{err:?}"
        );
        assert!(err.is_fatal());
        assert_eq!(err.request_id(), None);
        assert_eq!(err.code(), ErrorCode::Malformed);
        assert_eq!(src, before, "nothing consumed");
    }
}

#[test]
fn oversized_frames_are_fatal_and_reserve_nothing() {
    for len in [4097, 1 << 20, u32::MAX] {
        let mut src = BytesMut::with_capacity(64);
        src.put_u32(len);
        src.put_u8(opcode::PING);
        let capacity = src.capacity();
        let err = decode_request(&mut src, &limits()).expect_err("too large");
        assert!(matches!(err, DecodeError::FrameTooLarge { len: l, max: 4096 } if l == len));
        assert!(err.is_fatal());
        assert_eq!(err.request_id(), None);
        assert_eq!(err.code(), ErrorCode::FrameTooLarge);
        assert_eq!(
            src.capacity(),
            capacity,
            "capacity grew for a refused frame"
        );
        assert!(src.capacity() < len as usize);
        assert_eq!(src.len(), 5, "nothing consumed");
    }
    // max_frame itself is accepted (a frame of exactly 4096 body bytes).
    let mut frame = check_frame(opcode::RESET, |p| {
        p.put_u16(1);
        p.put_u16(16);
        p.put_slice(&[b'k'; 16]);
    });
    let exact = ServerLimits {
        max_frame: frame.len() as u32 - 4,
        ..limits()
    };
    assert!(decode_request(&mut frame.clone(), &exact)
        .expect("fits")
        .is_some());
    let smaller = ServerLimits {
        max_frame: exact.max_frame - 1,
        ..limits()
    };
    assert!(matches!(
        decode_request(&mut frame, &smaller),
        Err(DecodeError::FrameTooLarge { .. })
    ));
}

#[test]
fn a_huge_announced_batch_does_not_allocate_for_the_announcement() {
    // 4 checks announced within limits but no bytes for them: Truncated, and
    // the batch capacity came from the payload size (nothing to measure
    // here beyond not panicking, but it exercises the clamp).
    let wide = ServerLimits {
        max_batch: u16::MAX,
        ..limits()
    };
    let mut frame = check_frame(opcode::CHECK, |p| p.put_u16(u16::MAX));
    let err = decode_request(&mut frame, &wide).expect_err("truncated");
    assert!(matches!(err, DecodeError::Truncated { .. }));
}

fn rejects_response(bad: BytesMut, is_expected: impl Fn(&DecodeError) -> bool) {
    let mut src = bad;
    encode_response(NEXT_ID, &Response::Pong, &mut src).expect("encodes");
    let err = decode_response(&mut src, 4096).expect_err("must be rejected");
    assert!(is_expected(&err), "unexpected variant: {err:?}");
    assert!(!err.is_fatal());
    assert_eq!(err.request_id(), Some(BAD_ID));
    let next = decode_response(&mut src, 4096).expect("next frame decodes");
    assert_eq!(next, Some((NEXT_ID, Response::Pong)));
    assert!(src.is_empty());
}

#[test]
fn invalid_responses() {
    for op in [opcode::HELLO, opcode::CHECK, 0x84, 0x86, 0xFE] {
        rejects_response(
            raw_frame(op, BAD_ID, &[]),
            |e| matches!(e, DecodeError::UnknownOpcode { opcode, .. } if *opcode == op),
        );
    }
    let bad_utf8 = raw_frame(opcode::ERROR, BAD_ID, &[0, 1, 0, 2, 0xFF, 0xFE]);
    rejects_response(bad_utf8, |e| {
        matches!(
            e,
            DecodeError::InvalidUtf8 {
                field: "error message",
                ..
            }
        )
    });
    let mut hello_ok = encode_resp(BAD_ID, &responses()[0].1);
    hello_ok[FRAME_HEADER_LEN + 5 + 2] = 3; // the role byte
    rejects_response(hello_ok, |e| {
        matches!(e, DecodeError::UnknownRole { role: 3, .. })
    });
    let bad_status = raw_frame(opcode::CHECKED, BAD_ID, &[0, 1, 5]);
    rejects_response(bad_status, |e| {
        matches!(e, DecodeError::UnknownStatus { status: 5, .. })
    });
    // Status 3 promises a lease after the decision.
    let mut leased_short = encode_resp(BAD_ID, &Response::Checked(vec![leased(0, 1, 9)]));
    let cut = leased_short.len() - 8;
    leased_short.truncate(cut);
    let len = (leased_short.len() - FRAME_HEADER_LEN) as u32;
    leased_short[..4].copy_from_slice(&len.to_be_bytes());
    rejects_response(leased_short, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                needed: 8,
                available: 0,
                ..
            }
        )
    });
    let short = raw_frame(opcode::RELEASED, BAD_ID, &[0, 0]);
    rejects_response(short, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                needed: 4,
                available: 2,
                ..
            }
        )
    });
    let short = raw_frame(opcode::RESET_DONE, BAD_ID, &[0, 0, 1]);
    rejects_response(short, |e| {
        matches!(
            e,
            DecodeError::Truncated {
                needed: 4,
                available: 3,
                ..
            }
        )
    });
    let long = raw_frame(opcode::PONG, BAD_ID, &[0]);
    rejects_response(long, |e| {
        matches!(e, DecodeError::TrailingBytes { extra: 1, .. })
    });
    // A CHECKED announcing more results than it carries.
    let mut checked = encode_resp(BAD_ID, &Response::Checked(vec![decision(true, 0, 1, 0)]));
    checked[FRAME_HEADER_LEN + 5 + 1] = 2; // n = 2
    rejects_response(checked, |e| matches!(e, DecodeError::Truncated { .. }));
}

#[test]
fn oversized_responses_are_fatal() {
    let mut src = encode_resp(
        1,
        &Response::Error {
            code: ErrorCode::Internal,
            message: "x".repeat(100),
        },
    );
    let err = decode_response(&mut src, 50).expect_err("too large");
    assert!(matches!(
        err,
        DecodeError::FrameTooLarge { len: 109, max: 50 }
    ));
    assert!(err.is_fatal());
}

#[test]
fn error_codes_of_every_variant() {
    let io = DecodeError::from(std::io::Error::other("boom"));
    assert!(io.is_fatal());
    assert_eq!(io.code(), ErrorCode::Internal);
    assert_eq!(io.request_id(), None);
    let eof = DecodeError::UnexpectedEof { buffered: 3 };
    assert!(eof.is_fatal());
    assert_eq!(eof.code(), ErrorCode::Malformed);
}

#[test]
fn messages_carry_the_numbers() {
    let err = DecodeError::KeyTooLong {
        request_id: 7,
        len: 300,
        max: 256,
    };
    assert_eq!(
        err.to_string(),
        "request 7: key of 300 bytes exceeds the limit of 256"
    );
    let err = DecodeError::FrameTooLarge {
        len: 2_000_000,
        max: 1_048_576,
    };
    assert_eq!(
        err.to_string(),
        "frame body of 2000000 bytes exceeds the limit of 1048576"
    );
}
