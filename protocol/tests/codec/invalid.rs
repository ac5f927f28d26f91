//! Invalid request contents: each rejection gives its variant and wire
//! code, and consumes exactly the bad frame (a valid frame behind it still
//! decodes). Broken framing and invalid responses: `invalid_frames.rs`.

use bytes::{BufMut, BytesMut};
use tollgate_protocol::*;

use crate::samples::*;

pub(crate) const BAD_ID: RequestId = 0xDEAD_BEEF;
pub(crate) const NEXT_ID: RequestId = 4242;

pub(crate) fn limits() -> ServerLimits {
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
pub(crate) fn rejects_request(
    bad: BytesMut,
    code: ErrorCode,
    is_expected: impl Fn(&DecodeError) -> bool,
) {
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

pub(crate) fn check_frame(opcode: u8, write: impl FnOnce(&mut BytesMut)) -> BytesMut {
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
    // Too long to be copied: sliced, and checked the same.
    let mut long = vec![b'r'; 40];
    long[30] = 0xFF;
    let frame = check_frame(opcode::PEEK, |p| {
        p.put_u16(1);
        p.put_u8(1);
        put_rule_pair(p, b"k", &long);
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
