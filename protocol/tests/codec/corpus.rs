//! The fuzz seed corpus: regenerated from the encoder (so it stays valid as
//! the format evolves), checked in under the repository's `fuzz/corpus/`, and replayed here
//! through the fuzz targets' invariant checks together with whatever else a
//! local fuzz run left in the corpus directories.
//!
//! `cargo test -p tollgate-protocol -- --ignored write_seed_corpus` rewrites
//! the seed files after a format change.

use std::path::{Path, PathBuf};

use bytes::{BufMut, Bytes, BytesMut};
use tollgate_protocol::*;

use crate::invariants::{
    check_decode_request, check_decode_response, Replay, FUZZ_LIMITS, FUZZ_MAX_RESPONSE_FRAME,
};
use crate::samples::*;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn req(id: RequestId, request: Request) -> BytesMut {
    encode_req(id, &request)
}

/// What each seed replays to.
fn outcome(
    decoded: usize,
    rejected: &[ErrorCode],
    fatal: Option<ErrorCode>,
    leftover: usize,
) -> Replay {
    Replay {
        decoded,
        rejected: rejected.to_vec(),
        fatal,
        leftover,
    }
}

/// Request seeds (within `FUZZ_LIMITS`) and the replay each must give.
fn request_seeds() -> Vec<(&'static str, BytesMut, Replay)> {
    let hello = req(
        1,
        Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "gateway".into(),
            auth_token: None,
        },
    );
    let hello_token = req(
        1,
        Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "gateway".into(),
            auth_token: Some(Bytes::from_static(b"s3cret")),
        },
    );
    let check_single = req(
        2,
        Request::Check(batch(vec![vec![pair("rl:ip:1", per_second(10), 1)]])),
    );
    let check_group = req(
        3,
        Request::Check(batch(vec![vec![
            pair("rl:{u42}:s", per_second(10), 1),
            pair("rl:{u42}:m", per_minute_window(100), 1),
            pair(
                "rl:{u42}:d",
                limit(Algorithm::TokenBucket, 1000, 86_400_000, 1000),
                1,
            ),
        ]])),
    );
    let check_batch = req(
        4,
        Request::Check(batch(vec![
            vec![pair("a", per_second(1), 1)],
            vec![
                pair("{t}b", per_minute_window(5), 2),
                pair("{t}c", per_second(3), 1),
            ],
            vec![pair("d", limit(Algorithm::SlidingWindow, 0, 0, 0), 0)],
        ])),
    );
    let peek = req(
        5,
        Request::Peek(batch(vec![vec![pair("rl:ip:1", per_second(10), 1)]])),
    );
    let reset = req(
        6,
        Request::Reset(vec![
            Bytes::from_static(b"rl:ip:1"),
            Bytes::from_static(b"{u42}x"),
        ]),
    );
    let check_algorithms = req(
        10,
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
                1,
            )],
        ])),
    );
    let refund = req(
        11,
        Request::Refund(batch(vec![vec![pair(
            "llm:{org}",
            limit(Algorithm::TokenBucket, 100_000, 60_000, 100_000),
            2800,
        )]])),
    );
    let release = req(
        12,
        Request::Release(vec![
            LeaseRef {
                key: Bytes::from_static(b"cc:{k}:jobs"),
                lease: 1_000_000_001,
            },
            LeaseRef {
                key: Bytes::from_static(b"cc:{k}:jobs"),
                lease: 1_000_000_002,
            },
        ]),
    );
    let check_rule = req(
        10,
        Request::Check(batch(vec![
            vec![rule_pair("rl:{u42}:s", "api-per-second", 0)],
            vec![
                rule_pair("rl:{u42}:d", "api-per-day", 1),
                pair("rl:{u42}:m", per_minute_window(100), 1),
            ],
        ])),
    );
    let bad_rule_name = raw_frame(
        opcode::CHECK,
        11,
        &payload(|p| {
            p.put_u16(1);
            p.put_u8(1);
            p.put_u16(1);
            p.put_u8(b'k');
            p.put_u8(LIMIT_KIND_RULE);
            p.put_u8(0);
            p.put_u32(1);
        }),
    );
    let ping = req(7, Request::Ping);
    let mut pipelined = hello.clone();
    pipelined.extend_from_slice(&ping);
    pipelined.extend_from_slice(&check_group);
    pipelined.extend_from_slice(&reset);
    pipelined.extend_from_slice(&check_algorithms);
    pipelined.extend_from_slice(&refund);
    pipelined.extend_from_slice(&release);

    let unknown_opcode = raw_frame(0x11, 8, b"");
    let unknown_algorithm = raw_frame(
        opcode::CHECK,
        13,
        &payload(|p| {
            p.put_u16(1);
            p.put_u8(1);
            put_pair(p, b"k", 7);
        }),
    );
    let mut truncated_check = check_single.clone();
    truncated_check.truncate(truncated_check.len() - 6);
    let len = (truncated_check.len() - 4) as u32;
    truncated_check[..4].copy_from_slice(&len.to_be_bytes());
    let key_too_long = raw_frame(
        opcode::RESET,
        9,
        &payload(|p| {
            p.put_u16(1);
            p.put_u16(33);
            p.put_slice(&[b'k'; 33]);
        }),
    );
    let mut trailing = ping.clone();
    trailing.put_u8(0);
    trailing[3] += 1;
    let hello_v2 = raw_frame(opcode::HELLO, 1, &[0, 2, 0, 0]);
    let mut partial = check_group.clone();
    partial.truncate(20);
    let too_large = BytesMut::from(&[0x00, 0x10, 0x00, 0x01, opcode::PING][..]);
    let mut bad_then_good = unknown_opcode.clone();
    bad_then_good.extend_from_slice(&ping);

    use ErrorCode::*;
    vec![
        ("hello.bin", hello, outcome(1, &[], None, 0)),
        ("hello_token.bin", hello_token, outcome(1, &[], None, 0)),
        ("ping.bin", ping, outcome(1, &[], None, 0)),
        ("check_single.bin", check_single, outcome(1, &[], None, 0)),
        ("check_group.bin", check_group, outcome(1, &[], None, 0)),
        ("check_batch.bin", check_batch, outcome(1, &[], None, 0)),
        ("peek.bin", peek, outcome(1, &[], None, 0)),
        ("check_rule.bin", check_rule, outcome(1, &[], None, 0)),
        (
            "broken_rule_name.bin",
            bad_rule_name,
            outcome(0, &[Malformed], None, 0),
        ),
        ("reset.bin", reset, outcome(1, &[], None, 0)),
        (
            "check_algorithms.bin",
            check_algorithms,
            outcome(1, &[], None, 0),
        ),
        ("refund.bin", refund, outcome(1, &[], None, 0)),
        ("release.bin", release, outcome(1, &[], None, 0)),
        ("pipelined.bin", pipelined, outcome(7, &[], None, 0)),
        (
            "broken_unknown_algorithm.bin",
            unknown_algorithm,
            outcome(0, &[Malformed], None, 0),
        ),
        (
            "broken_unknown_opcode.bin",
            unknown_opcode,
            outcome(0, &[UnknownOpcode], None, 0),
        ),
        (
            "broken_truncated_check.bin",
            truncated_check,
            outcome(0, &[Malformed], None, 0),
        ),
        (
            "broken_key_too_long.bin",
            key_too_long,
            outcome(0, &[KeyTooLong], None, 0),
        ),
        (
            "broken_trailing_bytes.bin",
            trailing,
            outcome(0, &[Malformed], None, 0),
        ),
        (
            "broken_hello_version.bin",
            hello_v2,
            outcome(0, &[UnsupportedVersion], None, 0),
        ),
        (
            "broken_partial_frame.bin",
            partial,
            outcome(0, &[], None, 20),
        ),
        (
            "broken_frame_too_large.bin",
            too_large,
            outcome(0, &[], Some(FrameTooLarge), 0),
        ),
        (
            "broken_then_ping.bin",
            bad_then_good,
            outcome(1, &[UnknownOpcode], None, 0),
        ),
        (
            "replication.bin",
            crate::replication::request_stream(),
            outcome(crate::replication::requests().len(), &[], None, 0),
        ),
        (
            "broken_status_flag.bin",
            raw_frame(opcode::STATUS, 9, &[2]),
            outcome(0, &[Malformed], None, 0),
        ),
        (
            "cluster.bin",
            crate::cluster::request_stream(),
            outcome(crate::cluster::requests().len(), &[], None, 0),
        ),
        (
            "check2.bin",
            crate::check2::request_stream(),
            outcome(crate::check2::requests().len(), &[], None, 0),
        ),
        (
            "broken_check2.bin",
            crate::check2::broken_stream(),
            outcome(
                1,
                &crate::check2::broken()
                    .into_iter()
                    .map(|(_, _, code)| code)
                    .collect::<Vec<_>>(),
                None,
                0,
            ),
        ),
        (
            "regions.bin",
            crate::regions::request_stream(),
            outcome(crate::regions::requests().len(), &[], None, 0),
        ),
        (
            "broken_usage_region.bin",
            raw_frame(opcode::USAGE, 9, &[0]),
            outcome(0, &[Malformed], None, 0),
        ),
    ]
}

fn response_seeds() -> Vec<(&'static str, BytesMut, Replay)> {
    let resp = |id, response: Response| encode_resp(id, &response);
    let hello_ok = resp(
        1,
        Response::HelloOk {
            version: PROTOCOL_VERSION,
            role: Role::Primary,
            epoch: 3,
            offset: 42,
            limits: FUZZ_LIMITS,
        },
    );
    let checked = resp(
        2,
        Response::Checked(vec![
            decision(true, 0, 9, 0),
            decision(false, 1, 0, 250),
            decision(false, 0, 0, RETRY_NEVER),
            CheckResult::Error(ErrorCode::CrossSlot),
            leased(0, 7, 1_000_000_001),
        ]),
    );
    let released = resp(6, Response::Released(2));
    let checked_shadow = resp(
        6,
        Response::Checked(vec![
            shadow_denied(0, 0, 100),
            CheckResult::Error(ErrorCode::UnknownRule),
        ]),
    );
    let error = resp(
        0,
        Response::Error {
            code: ErrorCode::HandshakeRequired,
            message: "send HELLO first".into(),
        },
    );
    let mut pipelined = resp(3, Response::Pong);
    pipelined.extend_from_slice(&resp(4, Response::ResetDone(2)));
    pipelined.extend_from_slice(&checked);
    pipelined.extend_from_slice(&released);
    let bad_status = raw_frame(opcode::CHECKED, 5, &[0, 1, 7]);
    vec![
        ("hello_ok.bin", hello_ok, outcome(1, &[], None, 0)),
        ("checked.bin", checked, outcome(1, &[], None, 0)),
        (
            "checked_shadow.bin",
            checked_shadow,
            outcome(1, &[], None, 0),
        ),
        ("error.bin", error, outcome(1, &[], None, 0)),
        ("released.bin", released, outcome(1, &[], None, 0)),
        ("pipelined.bin", pipelined, outcome(4, &[], None, 0)),
        (
            "broken_status.bin",
            bad_status,
            outcome(0, &[ErrorCode::Malformed], None, 0),
        ),
        (
            "replication.bin",
            crate::replication::response_stream(),
            outcome(crate::replication::responses().len(), &[], None, 0),
        ),
        (
            "cluster.bin",
            crate::cluster::response_stream(),
            outcome(crate::cluster::responses().len(), &[], None, 0),
        ),
        (
            "regions.bin",
            crate::regions::response_stream(),
            outcome(crate::regions::responses().len(), &[], None, 0),
        ),
        (
            "broken_moved_slot.bin",
            raw_frame(opcode::MOVED, 9, &[0x40, 0x00, 0, 0, 0, 0, 0, 0, 0, 1, 0]),
            outcome(0, &[ErrorCode::Malformed], None, 0),
        ),
    ]
}

#[test]
#[ignore = "rewrites fuzz/corpus seed files; run after a format change"]
fn write_seed_corpus() {
    for (target, seeds) in [
        ("decode_request", request_seeds()),
        ("decode_response", response_seeds()),
    ] {
        let dir = corpus_dir(target);
        std::fs::create_dir_all(&dir).expect("create corpus dir");
        for (name, bytes, _) in seeds {
            std::fs::write(dir.join(name), &bytes[..]).expect("write seed");
        }
    }
}

#[test]
fn checked_in_seeds_match_the_encoder_and_replay_as_expected() {
    for (target, seeds) in [
        ("decode_request", request_seeds()),
        ("decode_response", response_seeds()),
    ] {
        for (name, bytes, expected) in seeds {
            let path = corpus_dir(target).join(name);
            let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (run the ignored write_seed_corpus test)",
                    path.display()
                )
            });
            assert_eq!(
                on_disk,
                &bytes[..],
                "{} is stale: run write_seed_corpus",
                path.display()
            );
            let replay = match target {
                "decode_request" => check_decode_request(&on_disk, &FUZZ_LIMITS),
                _ => check_decode_response(&on_disk, FUZZ_MAX_RESPONSE_FRAME),
            };
            assert_eq!(replay, expected, "{}", path.display());
        }
    }
}

/// Every file in the corpus directories (seeds and anything a local fuzz
/// run added) keeps the invariants.
#[test]
fn whole_corpus_keeps_the_invariants() {
    for target in ["decode_request", "decode_response"] {
        let entries = std::fs::read_dir(corpus_dir(target)).expect("corpus dir exists");
        let mut replayed = 0;
        for entry in entries {
            let path = entry.expect("dir entry").path();
            if !path.is_file() {
                continue;
            }
            let data = std::fs::read(&path).expect("read corpus file");
            match target {
                "decode_request" => {
                    check_decode_request(&data, &FUZZ_LIMITS);
                    check_decode_request(&data, &ServerLimits::default());
                }
                _ => {
                    check_decode_response(&data, FUZZ_MAX_RESPONSE_FRAME);
                    check_decode_response(&data, DEFAULT_CLIENT_MAX_FRAME);
                }
            }
            replayed += 1;
        }
        assert!(replayed >= 5, "{target}: corpus missing ({replayed} files)");
    }
}
