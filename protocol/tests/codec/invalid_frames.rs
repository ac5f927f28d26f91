//! Invalid framing and invalid responses: truncated bodies and bytes left
//! over inside a frame (per-frame errors, consuming exactly the bad frame);
//! frames shorter than the header or over the limit (fatal errors, which
//! consume nothing and reserve nothing); then the response decoder's
//! refusals, and the wire code and message of every error.

use bytes::{BufMut, BytesMut};
use tollgate_protocol::*;

use crate::invalid::{check_frame, limits, rejects_request, BAD_ID, NEXT_ID};
use crate::samples::*;

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
