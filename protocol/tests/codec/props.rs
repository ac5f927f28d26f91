//! Property tests: arbitrary messages within limits round-trip, whole and
//! pipelined in arbitrary chunks; arbitrary bytes never panic and keep the
//! fuzz invariants (the same checks as the fuzz targets).

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use tollgate_protocol::*;

use crate::invariants::{check_decode_request, check_decode_response, FUZZ_LIMITS};

fn key() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 1..=24),
        1 => prop::collection::vec(any::<u8>(), 1..=256),
    ]
    .prop_map(Bytes::from)
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::ALL.to_vec())
}

/// Any 1..=64-byte UTF-8 string (multi-byte chars included).
fn rule_name() -> impl Strategy<Value = RuleName> {
    "\\PC{1,64}".prop_filter_map("1..=64 bytes", |s: String| {
        let mut end = s.len().min(MAX_RULE_NAME_LEN);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        RuleName::try_from(&s[..end]).ok()
    })
}

fn limit_ref() -> impl Strategy<Value = LimitRef> {
    prop_oneof![
        (algorithm(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(algorithm, count, period_ms, burst)| {
                LimitRef::Inline(Limit {
                    algorithm,
                    count,
                    period_ms,
                    burst,
                })
            }
        ),
        rule_name().prop_map(LimitRef::Rule),
    ]
}

fn pair() -> impl Strategy<Value = Pair> {
    (key(), limit_ref(), any::<u32>()).prop_map(|(key, limit, cost)| Pair { key, limit, cost })
}

fn check_batch() -> impl Strategy<Value = CheckBatch> {
    prop::collection::vec(prop::collection::vec(pair(), 1..=16), 1..=8).prop_map(|checks| {
        let mut batch = CheckBatch::with_capacity(checks.len());
        for check in checks {
            batch.push_check(check);
        }
        batch
    })
}

fn check_tag() -> impl Strategy<Value = CheckTag> {
    (
        prop_oneof![Just(0u128), any::<u128>()],
        prop::sample::select(Priority::ALL.to_vec()),
    )
        .prop_map(|(key, priority)| CheckTag::new(IdempotencyKey::from_u128(key), priority))
}

fn tagged_batch() -> impl Strategy<Value = TaggedBatch> {
    prop::collection::vec((check_tag(), prop::collection::vec(pair(), 1..=16)), 1..=8).prop_map(
        |checks| {
            let mut batch = TaggedBatch::with_capacity(checks.len());
            for (tag, check) in checks {
                batch.push_check(tag, check);
            }
            batch
        },
    )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            "\\PC{0,60}",
            prop::option::of(prop::collection::vec(any::<u8>(), 1..=255))
        )
            .prop_map(|(client_name, token)| Request::Hello {
                version: PROTOCOL_VERSION,
                client_name,
                auth_token: token.map(Bytes::from),
            }),
        Just(Request::Ping),
        check_batch().prop_map(Request::Check),
        check_batch().prop_map(Request::Peek),
        check_batch().prop_map(Request::Refund),
        tagged_batch().prop_map(Request::Check2),
        prop::collection::vec(key(), 1..=32).prop_map(Request::Reset),
        prop::collection::vec(
            (key(), any::<u64>()).prop_map(|(key, lease)| LeaseRef { key, lease }),
            1..=32
        )
        .prop_map(Request::Release),
    ]
}

fn error_code() -> impl Strategy<Value = ErrorCode> {
    any::<u16>().prop_map(ErrorCode::from_wire)
}

fn check_result() -> impl Strategy<Value = CheckResult> {
    prop_oneof![
        // (allowed, shadow_denied): the three combinations the wire carries.
        (
            prop::sample::select(vec![(true, false), (false, false), (true, true)]),
            any::<u8>(),
            any::<[u64; 4]>(),
            any::<Option<u64>>()
        )
            .prop_map(|((allowed, shadow_denied), pair, n, lease)| {
                CheckResult::Decision(Decision {
                    allowed,
                    shadow_denied,
                    pair,
                    limit: n[0],
                    remaining: n[1],
                    reset_after_ms: n[2],
                    retry_after_ms: n[3],
                    // Only an allowed decision carries a lease on the wire,
                    // and status 3 has no room for the shadow flag.
                    lease: lease.filter(|_| allowed && !shadow_denied),
                })
            }),
        error_code().prop_map(CheckResult::Error),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        (
            any::<u16>(),
            prop_oneof![Just(Role::Primary), Just(Role::Standby)],
            any::<(u64, u64, u32, u16, u8, u16)>()
        )
            .prop_map(
                |(version, role, (epoch, offset, max_frame, max_batch, max_group, max_key_len))| {
                    Response::HelloOk {
                        version,
                        role,
                        epoch,
                        offset,
                        limits: ServerLimits {
                            max_frame,
                            max_batch,
                            max_group,
                            max_key_len,
                        },
                    }
                }
            ),
        Just(Response::Pong),
        prop::collection::vec(check_result(), 0..=64).prop_map(Response::Checked),
        any::<u32>().prop_map(Response::ResetDone),
        any::<u32>().prop_map(Response::Released),
        (error_code(), "\\PC{0,200}").prop_map(|(code, message)| Response::Error { code, message }),
    ]
}

/// Splits `bytes` into consecutive chunks of the given sizes (cycled).
fn chunks<'a>(bytes: &'a [u8], sizes: &'a [usize]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut at = 0;
    let mut i = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let size = sizes[i % sizes.len()].max(1);
        i += 1;
        let end = (at + size).min(bytes.len());
        let chunk = &bytes[at..end];
        at = end;
        Some(chunk)
    })
}

/// A byte stream of frames with correct length headers around arbitrary
/// opcodes and payloads: gets past the header check, unlike random bytes.
fn framed_garbage() -> impl Strategy<Value = Vec<u8>> {
    let opcode = prop_oneof![
        prop::sample::select(vec![
            opcode::HELLO,
            opcode::PING,
            opcode::CHECK,
            opcode::PEEK,
            opcode::RESET,
            opcode::REFUND,
            opcode::RELEASE,
            opcode::HELLO_OK,
            opcode::PONG,
            opcode::CHECKED,
            opcode::RESET_DONE,
            opcode::RELEASED,
            opcode::ERROR,
        ]),
        any::<u8>(),
    ];
    prop::collection::vec(
        (
            opcode,
            any::<u32>(),
            prop::collection::vec(any::<u8>(), 0..96),
        ),
        0..6,
    )
    .prop_map(|frames| {
        let mut out = BytesMut::new();
        for (opcode, id, payload) in frames {
            out.put_u32(5 + payload.len() as u32);
            out.put_u8(opcode);
            out.put_u32(id);
            out.put_slice(&payload);
        }
        out.to_vec()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A denied decision never carries a lease: the encoder drops one, and
    /// the frame is exactly the lease-free decision's.
    #[test]
    fn a_denied_decision_drops_its_lease(id in any::<u32>(), lease in any::<u64>(), n in any::<[u64; 4]>()) {
        let denied = |lease| CheckResult::Decision(Decision {
            allowed: false,
            shadow_denied: false,
            pair: 0,
            limit: n[0],
            remaining: n[1],
            reset_after_ms: n[2],
            retry_after_ms: n[3],
            lease,
        });
        let mut with = BytesMut::new();
        encode_response(id, &Response::Checked(vec![denied(Some(lease))]), &mut with).expect("encodes");
        let mut without = BytesMut::new();
        encode_response(id, &Response::Checked(vec![denied(None)]), &mut without).expect("encodes");
        prop_assert_eq!(&with, &without);
        let decoded = decode_response(&mut with, DEFAULT_CLIENT_MAX_FRAME).expect("decodes");
        prop_assert_eq!(decoded, Some((id, Response::Checked(vec![denied(None)]))));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn requests_round_trip(id in any::<u32>(), request in request()) {
        let mut src = BytesMut::new();
        encode_request(id, &request, &mut src).expect("within limits");
        let decoded = decode_request(&mut src, &ServerLimits::default()).expect("decodes");
        prop_assert_eq!(decoded, Some((id, request)));
        prop_assert!(src.is_empty());
    }

    /// A frame encoded from its checks where they are is the frame of the
    /// same checks as a batch, whatever the size hint says.
    #[test]
    fn checks_encoded_in_place_match_the_batch(
        id in any::<u32>(),
        batch in check_batch(),
        hint in 0usize..64,
    ) {
        let mut whole = BytesMut::new();
        encode_request(id, &Request::Peek(batch.clone()), &mut whole).expect("within limits");
        let mut in_place = BytesMut::from(&b"left alone"[..]);
        encode_checks(opcode::PEEK, id, hint, batch.iter(), &mut in_place).expect("within limits");
        prop_assert_eq!(&in_place[..10], &b"left alone"[..]);
        prop_assert_eq!(&in_place[10..], &whole[..]);
    }

    #[test]
    fn responses_round_trip(id in any::<u32>(), response in response()) {
        let mut src = BytesMut::new();
        encode_response(id, &response, &mut src).expect("encodes");
        let decoded = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME).expect("decodes");
        prop_assert_eq!(decoded, Some((id, response)));
        prop_assert!(src.is_empty());
    }

    #[test]
    fn pipelined_requests_in_arbitrary_chunks(
        messages in prop::collection::vec((any::<u32>(), request()), 1..8),
        sizes in prop::collection::vec(1usize..64, 1..8),
    ) {
        let mut stream = BytesMut::new();
        for (id, request) in &messages {
            encode_request(*id, request, &mut stream).expect("encodes");
        }
        let mut src = BytesMut::new();
        let mut got = Vec::new();
        for chunk in chunks(&stream, &sizes) {
            src.extend_from_slice(chunk);
            while let Some(m) = decode_request(&mut src, &ServerLimits::default()).expect("decodes") {
                got.push(m);
            }
        }
        prop_assert_eq!(got, messages);
        prop_assert!(src.is_empty());
    }

    #[test]
    fn arbitrary_bytes_keep_the_invariants(data in prop::collection::vec(any::<u8>(), 0..512)) {
        check_decode_request(&data, &FUZZ_LIMITS);
        check_decode_request(&data, &ServerLimits::default());
        check_decode_response(&data, 4096);
    }

    #[test]
    fn framed_garbage_keeps_the_invariants(data in framed_garbage()) {
        let replay = check_decode_request(&data, &FUZZ_LIMITS);
        prop_assert_eq!(replay.fatal, None);
        check_decode_request(&data, &ServerLimits::default());
        check_decode_response(&data, 4096);
    }

    /// Valid frames with one byte changed or cut short: close to valid, so
    /// they reach deep into the payload parsers.
    #[test]
    fn mutated_valid_requests_keep_the_invariants(
        id in any::<u32>(),
        request in request(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut frame = BytesMut::new();
        encode_request(id, &request, &mut frame).expect("encodes");
        let i = at.index(frame.len());
        frame[i] = byte;
        check_decode_request(&frame, &ServerLimits::default());
        check_decode_request(&frame, &FUZZ_LIMITS);
        let cut = cut.index(frame.len() + 1);
        check_decode_request(&frame[..cut], &ServerLimits::default());
    }
}
