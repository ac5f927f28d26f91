//! Sample messages covering every variant and field edge, and helpers to
//! build frames by hand (for inputs the encoder would never produce).

use bytes::{BufMut, Bytes, BytesMut};
use tollgate_protocol::*;

pub fn limit(algorithm: Algorithm, count: u64, period_ms: u64, burst: u64) -> Limit {
    Limit {
        algorithm,
        count,
        period_ms,
        burst,
    }
}

pub fn pair(key: &str, limit: Limit, cost: u32) -> Pair {
    Pair::inline(Bytes::copy_from_slice(key.as_bytes()), limit, cost)
}

/// A pair naming a rule.
pub fn rule_pair(key: &str, rule: &str, cost: u32) -> Pair {
    Pair::rule(
        Bytes::copy_from_slice(key.as_bytes()),
        RuleName::try_from(rule).expect("a valid rule name"),
        cost,
    )
}

pub fn per_second(n: u64) -> Limit {
    limit(Algorithm::TokenBucket, n, 1000, n)
}

pub fn per_minute_window(n: u64) -> Limit {
    limit(Algorithm::SlidingWindow, n, 60_000, 0)
}

/// One check per entry; each entry is an atomic group.
pub fn batch(checks: Vec<Vec<Pair>>) -> CheckBatch {
    let mut batch = CheckBatch::with_capacity(checks.len());
    for check in checks {
        batch.push_check(check);
    }
    batch
}

/// Every request variant, with edge values (empty and 255-byte names,
/// tokens, extreme numbers, ids 0 and u32::MAX).
pub fn requests() -> Vec<(RequestId, Request)> {
    vec![
        (
            1,
            Request::Hello {
                version: PROTOCOL_VERSION,
                client_name: "gateway-eu-1".into(),
                auth_token: None,
            },
        ),
        (
            2,
            Request::Hello {
                version: PROTOCOL_VERSION,
                client_name: String::new(),
                auth_token: Some(Bytes::from_static(b"s3cret")),
            },
        ),
        (
            3,
            Request::Hello {
                version: PROTOCOL_VERSION,
                // 85 three-byte chars: 255 bytes, the most a name can hold.
                client_name: "✓".repeat(85),
                auth_token: Some(Bytes::from(vec![0xAB; 255])),
            },
        ),
        (4, Request::Ping),
        (u32::MAX, Request::Ping),
        (
            5,
            Request::Check(batch(vec![vec![pair("rl:ip:10.0.0.1", per_second(10), 1)]])),
        ),
        (
            6,
            Request::Check(batch(vec![
                vec![
                    pair("rl:{acme}:second", per_second(100), 1),
                    pair("rl:{acme}:minute", per_minute_window(3000), 1),
                    pair(
                        "rl:{acme}:day",
                        limit(Algorithm::TokenBucket, 1, 86_400_000, 1),
                        5,
                    ),
                ],
                vec![pair(
                    "k",
                    limit(Algorithm::SlidingWindow, u64::MAX, u64::MAX, u64::MAX),
                    u32::MAX,
                )],
                vec![pair(
                    &"x".repeat(256),
                    limit(Algorithm::TokenBucket, 0, 0, 0),
                    0,
                )],
            ])),
        ),
        (
            7,
            Request::Peek(batch(vec![
                vec![pair("rl:user:7", per_minute_window(60), 1)],
                vec![pair("rl:user:8", per_second(5), 2)],
            ])),
        ),
        (
            8,
            Request::Check(batch(vec![
                vec![
                    pair("rl:{k}:s", per_second(100), 1),
                    pair(
                        "rl:{k}:d",
                        limit(Algorithm::FixedWindow, 10_000, 86_400_000, 0),
                        1,
                    ),
                ],
                vec![pair(
                    "rl:login",
                    limit(Algorithm::SlidingLog, 5, 60_000, 0),
                    1,
                )],
                vec![pair(
                    "rl:smooth",
                    limit(Algorithm::LeakyBucket, 10, 1000, 1),
                    1,
                )],
                vec![pair(
                    "cc:{k}:jobs",
                    limit(Algorithm::Concurrency, 8, 30_000, 0),
                    2,
                )],
            ])),
        ),
        (
            9,
            Request::Refund(batch(vec![
                vec![pair(
                    "llm:{org}:tokens",
                    limit(Algorithm::TokenBucket, 100_000, 60_000, 100_000),
                    2800,
                )],
                vec![pair("k", per_minute_window(60), u32::MAX)],
            ])),
        ),
        (
            10,
            Request::Release(vec![
                LeaseRef {
                    key: Bytes::from_static(b"cc:{k}:jobs"),
                    lease: 1_234_567_890,
                },
                LeaseRef {
                    key: Bytes::from_static(b"\x00\xff"),
                    lease: u64::MAX,
                },
            ]),
        ),
        (
            0,
            Request::Reset(vec![
                Bytes::from_static(b"rl:ip:10.0.0.1"),
                Bytes::from_static(b"\x00\xff binary key"),
            ]),
        ),
        (
            11,
            Request::Check(batch(vec![
                vec![rule_pair("rl:{acme}:s", "api-per-second", 0)],
                vec![
                    rule_pair("rl:{acme}:s", "api-per-second", 1),
                    pair("rl:{acme}:m", per_minute_window(3000), 1),
                    // 64 bytes, 16 four-byte chars: the longest name.
                    rule_pair("rl:{acme}:d", &"𝄞".repeat(16), u32::MAX),
                    rule_pair("rl:{acme}:x", "x", 7),
                ],
            ])),
        ),
        (
            12,
            Request::Peek(batch(vec![vec![rule_pair(
                "rl:user:7",
                "per-user.minute",
                2,
            )]])),
        ),
    ]
    .into_iter()
    .chain(crate::replication::requests())
    .chain(crate::cluster::requests())
    .collect()
}

pub fn decision(allowed: bool, pair: u8, remaining: u64, retry_after_ms: u64) -> CheckResult {
    CheckResult::Decision(Decision {
        allowed,
        shadow_denied: false,
        pair,
        limit: 100,
        remaining,
        reset_after_ms: 250,
        retry_after_ms,
        lease: None,
    })
}

/// An allowed decision holding concurrency lease `lease`.
pub fn leased(pair: u8, remaining: u64, lease: u64) -> CheckResult {
    CheckResult::Decision(Decision {
        allowed: true,
        shadow_denied: false,
        pair,
        limit: 8,
        remaining,
        reset_after_ms: 30_000,
        retry_after_ms: 0,
        lease: Some(lease),
    })
}

/// An allowed result that a shadow-mode rule would have denied.
pub fn shadow_denied(pair: u8, remaining: u64, retry_after_ms: u64) -> CheckResult {
    CheckResult::Decision(Decision {
        allowed: true,
        shadow_denied: true,
        pair,
        limit: 100,
        remaining,
        reset_after_ms: 900,
        retry_after_ms,
        lease: None,
    })
}

/// Every response variant, every result status, every error code.
pub fn responses() -> Vec<(RequestId, Response)> {
    let mut out = vec![
        (
            1,
            Response::HelloOk {
                version: PROTOCOL_VERSION,
                role: Role::Primary,
                epoch: 0,
                offset: 0,
                limits: ServerLimits::default(),
            },
        ),
        (
            2,
            Response::HelloOk {
                version: 7,
                role: Role::Standby,
                epoch: u64::MAX,
                offset: 123_456_789,
                limits: ServerLimits {
                    max_frame: u32::MAX,
                    max_batch: u16::MAX,
                    max_group: u8::MAX,
                    max_key_len: u16::MAX,
                },
            },
        ),
        (3, Response::Pong),
        (
            4,
            Response::Checked(vec![
                decision(true, 0, 99, 0),
                decision(false, 2, 0, 1500),
                decision(false, 1, 0, RETRY_NEVER),
                CheckResult::Error(ErrorCode::CrossSlot),
                CheckResult::Error(ErrorCode::InvalidLimit),
                CheckResult::Error(ErrorCode::Unknown(999)),
                CheckResult::Error(ErrorCode::UnknownRule),
                shadow_denied(1, 0, 2500),
                shadow_denied(0, 3, RETRY_NEVER),
                CheckResult::Decision(Decision {
                    allowed: true,
                    shadow_denied: false,
                    pair: u8::MAX,
                    limit: u64::MAX,
                    remaining: u64::MAX,
                    reset_after_ms: u64::MAX,
                    retry_after_ms: u64::MAX,
                    lease: None,
                }),
                leased(0, 7, 1),
                leased(u8::MAX, 0, u64::MAX),
                leased(3, 1, 0),
            ]),
        ),
        (5, Response::Checked(vec![])),
        (6, Response::ResetDone(0)),
        (u32::MAX, Response::ResetDone(u32::MAX)),
        (10, Response::Released(0)),
        (11, Response::Released(u32::MAX)),
        (
            0,
            Response::Error {
                code: ErrorCode::FrameTooLarge,
                message: "frame body of 2000000 bytes exceeds the limit of 1048576".into(),
            },
        ),
        (
            8,
            Response::Error {
                code: ErrorCode::Unknown(u16::MAX),
                message: String::new(),
            },
        ),
        (
            9,
            Response::Error {
                code: ErrorCode::Internal,
                message: "ünïcödé ✓".into(),
            },
        ),
    ];
    for wire in 1..=14 {
        out.push((
            100 + u32::from(wire),
            Response::Error {
                code: ErrorCode::from_wire(wire),
                message: ErrorCode::from_wire(wire).to_string(),
            },
        ));
    }
    out.extend(crate::replication::responses());
    out.extend(crate::cluster::responses());
    out
}

pub fn encode_req(id: RequestId, request: &Request) -> BytesMut {
    let mut dst = BytesMut::new();
    encode_request(id, request, &mut dst).expect("sample request encodes");
    dst
}

pub fn encode_resp(id: RequestId, response: &Response) -> BytesMut {
    let mut dst = BytesMut::new();
    encode_response(id, response, &mut dst).expect("sample response encodes");
    dst
}

/// A frame with a correct length header around `payload`.
pub fn raw_frame(opcode: u8, id: RequestId, payload: &[u8]) -> BytesMut {
    let mut dst = BytesMut::new();
    dst.put_u32(5 + payload.len() as u32);
    dst.put_u8(opcode);
    dst.put_u32(id);
    dst.put_slice(payload);
    dst
}

/// A payload written with `BufMut` calls.
pub fn payload(write: impl FnOnce(&mut BytesMut)) -> BytesMut {
    let mut p = BytesMut::new();
    write(&mut p);
    p
}

/// A well-formed rule pair: key, 0x80, the name, cost 0.
pub fn put_rule_pair(p: &mut BytesMut, key: &[u8], name: &[u8]) {
    p.put_u16(key.len() as u16);
    p.put_slice(key);
    p.put_u8(LIMIT_KIND_RULE);
    p.put_u8(name.len() as u8);
    p.put_slice(name);
    p.put_u32(0);
}

/// A well-formed pair: key, algorithm byte, then fixed numbers.
pub fn put_pair(p: &mut BytesMut, key: &[u8], algorithm: u8) {
    p.put_u16(key.len() as u16);
    p.put_slice(key);
    p.put_u8(algorithm);
    p.put_u64(10);
    p.put_u64(1000);
    p.put_u64(10);
    p.put_u32(1);
}
