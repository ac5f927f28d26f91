//! Valid messages: whole, cut at every byte, pipelined; encoder edges.

use bytes::{Bytes, BytesMut};
use tollgate_protocol::*;

use crate::samples::*;

fn limits() -> ServerLimits {
    ServerLimits::default()
}

#[test]
fn every_request_round_trips() {
    for (id, request) in requests() {
        let mut src = encode_req(id, &request);
        let decoded = decode_request(&mut src, &limits())
            .expect("decodes")
            .expect("whole");
        assert_eq!(decoded, (id, request));
        assert!(src.is_empty(), "exactly one frame consumed");
    }
}

#[test]
fn every_response_round_trips() {
    for (id, response) in responses() {
        let mut src = encode_resp(id, &response);
        let decoded = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME)
            .expect("decodes")
            .expect("whole");
        assert_eq!(decoded, (id, response));
        assert!(src.is_empty());
    }
}

#[test]
fn a_lease_is_written_after_the_decision_with_status_3() {
    let frame = encode_resp(
        1,
        &Response::Checked(vec![leased(2, 5, 0x0102_0304_0506_0708)]),
    );
    // header 4 + opcode 1 + id 4 + n 2, then the result.
    let result = &frame[11..];
    assert_eq!(result.len(), 42);
    assert_eq!(result[0], 3, "status: allowed with lease");
    assert_eq!(result[1], 2, "pair");
    assert_eq!(&result[34..], &[1, 2, 3, 4, 5, 6, 7, 8]);
    let plain = encode_resp(1, &Response::Checked(vec![decision(true, 2, 5, 0)]));
    assert_eq!(plain[11], 0, "status: allowed");
    assert_eq!(plain.len() - 11, 34);
}

#[test]
fn keys_are_slices_of_the_frame_not_copies() {
    let (id, request) = requests().swap_remove(6);
    let mut src = encode_req(id, &request);
    let range = src.as_ptr() as usize..src.as_ptr() as usize + src.len();
    let (_, decoded) = decode_request(&mut src, &limits())
        .expect("decodes")
        .expect("whole");
    let Request::Check(batch) = decoded else {
        panic!("sample 6 is a CHECK")
    };
    for pair in batch.iter().flatten() {
        assert!(
            range.contains(&(pair.key.as_ptr() as usize)),
            "key was copied"
        );
    }
}

/// Feeds every prefix of `frame`: each must give `Ok(None)`, leave the
/// buffer untouched, and (once the header is known) reserve room for the
/// whole frame; the rest then completes the message.
fn check_every_cut<M: PartialEq + std::fmt::Debug>(
    frame: &[u8],
    expected: &M,
    mut decode: impl FnMut(&mut BytesMut) -> Result<Option<M>, DecodeError>,
) {
    for cut in 0..frame.len() {
        let mut src = BytesMut::from(&frame[..cut]);
        let got = decode(&mut src).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        assert!(got.is_none(), "cut at {cut} decoded a message");
        assert_eq!(&src[..], &frame[..cut], "cut at {cut} changed the buffer");
        let need = if cut < FRAME_HEADER_LEN {
            FRAME_HEADER_LEN
        } else {
            frame.len()
        };
        assert!(
            src.capacity() >= need,
            "cut at {cut}: missing bytes not reserved"
        );

        src.extend_from_slice(&frame[cut..]);
        let got = decode(&mut src).unwrap_or_else(|e| panic!("cut at {cut}, completed: {e}"));
        assert_eq!(got.as_ref(), Some(expected), "cut at {cut}");
        assert!(src.is_empty());
    }
}

#[test]
fn every_request_cut_at_every_byte() {
    for (id, request) in requests() {
        let frame = encode_req(id, &request);
        check_every_cut(&frame, &(id, request), |src| decode_request(src, &limits()));
    }
}

#[test]
fn every_response_cut_at_every_byte() {
    for (id, response) in responses() {
        let frame = encode_resp(id, &response);
        check_every_cut(&frame, &(id, response), |src| {
            decode_response(src, DEFAULT_CLIENT_MAX_FRAME)
        });
    }
}

#[test]
fn pipelined_requests_decode_in_order() {
    let mut src = BytesMut::new();
    for (id, request) in requests() {
        encode_request(id, &request, &mut src).expect("encodes");
    }
    for expected in requests() {
        let got = decode_request(&mut src, &limits())
            .expect("decodes")
            .expect("whole");
        assert_eq!(got, expected);
    }
    assert!(decode_request(&mut src, &limits())
        .expect("empty")
        .is_none());
    assert!(src.is_empty());
}

#[test]
fn pipelined_responses_fed_one_byte_at_a_time() {
    let mut stream = BytesMut::new();
    for (id, response) in responses() {
        encode_response(id, &response, &mut stream).expect("encodes");
    }
    let mut src = BytesMut::new();
    let mut got = Vec::new();
    for byte in stream.iter() {
        src.extend_from_slice(&[*byte]);
        while let Some(message) =
            decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME).expect("decodes")
        {
            got.push(message);
        }
    }
    assert_eq!(got, responses());
    assert!(src.is_empty());
}

#[test]
fn encoders_append_to_what_is_already_buffered() {
    let mut dst = BytesMut::from(&b"earlier bytes"[..]);
    encode_request(9, &Request::Ping, &mut dst).expect("encodes");
    assert_eq!(&dst[..13], b"earlier bytes");
    assert_eq!(&dst[13..], &[0, 0, 0, 5, opcode::PING, 0, 0, 0, 9]);
}

#[test]
fn error_messages_are_cut_to_1024_bytes_on_a_char_boundary() {
    let message = "é".repeat(1000); // 2000 bytes
    let mut src = encode_resp(
        1,
        &Response::Error {
            code: ErrorCode::Internal,
            message: message.clone(),
        },
    );
    let (_, decoded) = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME)
        .expect("decodes")
        .expect("whole");
    let Response::Error { code, message: cut } = decoded else {
        panic!("an ERROR")
    };
    assert_eq!(code, ErrorCode::Internal);
    assert_eq!(cut.len(), 1024);
    assert!(message.starts_with(&cut));

    let odd = "a".to_string() + &"é".repeat(1000); // the cut lands inside a char
    let mut src = encode_resp(
        1,
        &Response::Error {
            code: ErrorCode::Internal,
            message: odd,
        },
    );
    let (_, decoded) = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME)
        .expect("decodes")
        .expect("whole");
    assert!(matches!(decoded, Response::Error { message, .. } if message.len() == 1023));
}

#[test]
fn an_empty_token_is_sent_as_no_token() {
    let with_empty = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "c".into(),
        auth_token: Some(Bytes::new()),
    };
    let without = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "c".into(),
        auth_token: None,
    };
    assert_eq!(encode_req(1, &with_empty), encode_req(1, &without));
}

/// Encoding a value that does not fit its wire field fails, names the field,
/// and leaves the buffer unchanged.
fn assert_too_long(request: &Request, field: &str, len: usize, max: usize) {
    let mut dst = BytesMut::from(&b"kept"[..]);
    match encode_request(1, request, &mut dst) {
        Err(EncodeError::TooLong {
            field: f,
            len: l,
            max: m,
        }) => {
            assert_eq!((f, l, m), (field, len, max));
        }
        other => panic!("expected TooLong for {field}, got {other:?}"),
    }
    assert_eq!(&dst[..], b"kept");
}

#[test]
fn values_that_do_not_fit_the_wire_are_encode_errors() {
    assert_too_long(
        &Request::Hello {
            version: 1,
            client_name: "n".repeat(256),
            auth_token: None,
        },
        "client name",
        256,
        255,
    );
    assert_too_long(
        &Request::Hello {
            version: 1,
            client_name: String::new(),
            auth_token: Some(Bytes::from(vec![1; 256])),
        },
        "auth token",
        256,
        255,
    );
    let long_key = Bytes::from(vec![b'k'; 65536]);
    assert_too_long(&Request::Reset(vec![long_key.clone()]), "key", 65536, 65535);
    let big_pair = Pair {
        key: long_key,
        limit: LimitRef::Inline(per_second(1)),
        cost: 1,
    };
    assert_too_long(
        &Request::Check(batch(vec![vec![big_pair]])),
        "key",
        65536,
        65535,
    );

    let small = pair("k", per_second(1), 1);
    assert_too_long(
        &Request::Peek(batch(vec![vec![small.clone(); 256]])),
        "pairs in a check",
        256,
        255,
    );
    let mut many = CheckBatch::with_capacity(65536);
    for _ in 0..65536 {
        many.push(small.clone());
    }
    assert_too_long(&Request::Check(many), "checks in a batch", 65536, 65535);
    let keys = vec![Bytes::from_static(b"k"); 65536];
    assert_too_long(&Request::Reset(keys), "keys in a reset", 65536, 65535);
    let leases = vec![
        LeaseRef {
            key: Bytes::from_static(b"k"),
            lease: 1,
        };
        65536
    ];
    assert_too_long(
        &Request::Release(leases),
        "leases in a release",
        65536,
        65535,
    );
    let long_lease_key = vec![LeaseRef {
        key: Bytes::from(vec![b'k'; 65536]),
        lease: 1,
    }];
    assert_too_long(&Request::Release(long_lease_key), "key", 65536, 65535);
}

/// An `ExactSizeIterator` whose `len()` is wrong (a safe-code bug the
/// encoder must survive).
struct LyingLen<I>(I, usize);

impl<I: Iterator> Iterator for LyingLen<I> {
    type Item = I::Item;
    fn next(&mut self) -> Option<I::Item> {
        self.0.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<I: Iterator> ExactSizeIterator for LyingLen<I> {}

#[test]
fn encode_checked_counts_what_it_writes_not_what_len_says() {
    let results = vec![
        decision(true, 0, 5, 0),
        CheckResult::Error(ErrorCode::CrossSlot),
    ];
    for claimed in [0, 1, 5, 10_000] {
        let mut dst = BytesMut::new();
        encode_checked(3, LyingLen(results.iter().copied(), claimed), &mut dst).expect("encodes");
        let got = decode_response(&mut dst, DEFAULT_CLIENT_MAX_FRAME)
            .expect("decodes")
            .expect("whole");
        assert_eq!(got, (3, Response::Checked(results.clone())));
    }
}

#[test]
fn encode_response_for_checked_is_encode_checked() {
    let results = vec![
        decision(false, 1, 0, 10),
        CheckResult::Error(ErrorCode::InvalidLimit),
    ];
    let mut streamed = BytesMut::new();
    encode_checked(4, results.iter().copied(), &mut streamed).expect("encodes");
    assert_eq!(streamed, encode_resp(4, &Response::Checked(results)));
}

#[test]
fn largest_v1_response_fits_the_default_client_cap() {
    // Allowed with a lease is the longest result (42 bytes).
    let results = vec![leased(0, 0, 1); u16::MAX as usize];
    let mut src = encode_resp(1, &Response::Checked(results.clone()));
    assert_eq!(
        src.len() - FRAME_HEADER_LEN,
        DEFAULT_CLIENT_MAX_FRAME as usize
    );
    let got = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME)
        .expect("decodes")
        .expect("whole");
    assert_eq!(got, (1, Response::Checked(results)));
}

#[test]
fn a_denial_is_never_encoded_as_shadow_denied() {
    // shadow_denied is meaningful only with allowed: a (wrongly) flagged
    // denial must still reach the client as a denial.
    let flagged = CheckResult::Decision(Decision {
        allowed: false,
        shadow_denied: true,
        pair: 0,
        limit: 1,
        remaining: 0,
        reset_after_ms: 1,
        retry_after_ms: 1,
        lease: None,
    });
    let mut src = encode_resp(1, &Response::Checked(vec![flagged]));
    assert_eq!(src[FRAME_HEADER_LEN + 5 + 2], 1, "status: denied");
    let (_, decoded) = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME)
        .expect("decodes")
        .expect("whole");
    let Response::Checked(results) = decoded else {
        panic!("CHECKED")
    };
    assert!(matches!(
        results[0],
        CheckResult::Decision(Decision {
            allowed: false,
            shadow_denied: false,
            ..
        })
    ));
}

#[test]
fn a_lease_wins_over_shadow_denied() {
    // The wire has no status for both: the lease must reach the client (it
    // has to release it), so such a decision is written as status 3.
    let both = Decision {
        allowed: true,
        shadow_denied: true,
        pair: 1,
        limit: 8,
        remaining: 3,
        reset_after_ms: 30_000,
        retry_after_ms: 0,
        lease: Some(77),
    };
    let mut src = encode_resp(1, &Response::Checked(vec![CheckResult::Decision(both)]));
    assert_eq!(
        src[FRAME_HEADER_LEN + 5 + 2],
        3,
        "status: allowed with lease"
    );
    let (_, decoded) = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME)
        .expect("decodes")
        .expect("whole");
    assert_eq!(
        decoded,
        Response::Checked(vec![CheckResult::Decision(Decision {
            shadow_denied: false,
            ..both
        })])
    );
}

#[test]
fn rule_names_refuse_what_the_wire_cannot_carry() {
    assert_eq!(RuleName::try_from(""), Err(InvalidRuleName::Length(0)));
    assert_eq!(
        RuleName::try_from("x".repeat(65)),
        Err(InvalidRuleName::Length(65))
    );
    assert_eq!(
        RuleName::new(Bytes::from_static(b"\xff")),
        Err(InvalidRuleName::Utf8)
    );
    let longest = RuleName::try_from("é".repeat(32)).expect("64 bytes");
    assert_eq!(longest.len(), 64);
    assert_eq!(longest.to_string(), "é".repeat(32));
}

/// A decoded rule name is the name, whatever its length and whatever
/// followed it in the frame: short names are copied with the bytes after
/// them (unspecified), long ones sliced; both compare and hash by the
/// name's bytes alone, equal to the name built from a string.
#[test]
fn rule_names_decode_to_the_same_name_held_inline_or_sliced() {
    use std::hash::BuildHasher;
    let hasher = std::collections::hash_map::RandomState::new();
    for len in [1, 2, 22, 23, 24, 63, 64] {
        let name = RuleName::try_from("é".repeat(len / 2) + &"n".repeat(len % 2)).unwrap();
        assert_eq!(name.len(), len);
        // Two pairs naming it, the first followed by a pair with a long
        // key, the last by its cost alone (fewer than 23 bytes after a
        // short name), in two frames whose costs differ.
        // Costs whose every byte is non-zero: after a 22-byte name, its
        // first byte is the one the name's copy takes with it.
        let decoded: Vec<Vec<RuleName>> = [0x0101_0101, 0x0202_0202]
            .map(|cost| {
                let mut batch = CheckBatch::with_capacity(2);
                batch.push(Pair::rule("k", name.clone(), cost));
                batch.push(Pair::rule(Bytes::from(vec![b'k'; 40]), name.clone(), cost));
                let mut src = encode_req(7, &Request::Check(batch));
                match decode_request(&mut src, &limits()) {
                    Ok(Some((7, Request::Check(batch)))) => (batch.iter().flatten())
                        .map(|p| match &p.limit {
                            LimitRef::Rule(n) => n.clone(),
                            other => panic!("{other:?}"),
                        })
                        .collect(),
                    other => panic!("{other:?}"),
                }
            })
            .into();
        for got in decoded.iter().flatten() {
            assert_eq!(got, &name, "{len} bytes");
            assert_eq!(got.as_str(), name.as_str());
            assert_eq!(hasher.hash_one(got), hasher.hash_one(&name), "{len} bytes");
        }
    }
}
