//! Replication and operations messages (§13): samples for the generic
//! round-trip, cut and corpus tests, their invalid forms, the worked
//! example of the spec, and a proptest over records.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use tollgate_protocol::*;

use crate::samples::*;

pub fn requests() -> Vec<(RequestId, Request)> {
    vec![
        (
            20,
            Request::Repl(ReplRequest::Replicate {
                replid: 0,
                offset: 0,
                epoch: 0,
                advertise: String::new(),
            }),
        ),
        (
            21,
            Request::Repl(ReplRequest::Replicate {
                replid: u64::MAX,
                offset: 1234,
                epoch: 7,
                advertise: "10.0.0.2:7700".into(),
            }),
        ),
        (22, Request::Repl(ReplRequest::Ack { offset: u64::MAX })),
        (23, Request::Repl(ReplRequest::Promote)),
        (24, Request::Repl(ReplRequest::Status { announce: None })),
        (
            25,
            Request::Repl(ReplRequest::Status {
                announce: Some(Announce {
                    role: Role::Primary,
                    epoch: 3,
                    addr: "10.0.0.1:7700".into(),
                }),
            }),
        ),
        (
            26,
            Request::Repl(ReplRequest::Handoff {
                epoch: 4,
                records: records(),
            }),
        ),
        (
            27,
            Request::Repl(ReplRequest::Handoff {
                epoch: 0,
                records: vec![],
            }),
        ),
    ]
}

fn entry(expires_at: u64, state: StateValue) -> TableState {
    TableState::Present(StateEntry { expires_at, state })
}

/// One record per algorithm, plus deletions and a record that leaves a
/// table alone.
pub fn records() -> Vec<Record> {
    let key = |k: &'static str| Bytes::from_static(k.as_bytes());
    vec![
        Record {
            key: key("rl:{a}:tb"),
            token_bucket: entry(5, StateValue::TokenBucket { tat: 5 }),
            other: TableState::Absent,
        },
        Record {
            key: key("rl:{a}:sw"),
            token_bucket: TableState::Unchanged,
            other: entry(
                9,
                StateValue::SlidingWindow {
                    index: 1,
                    prev: 2,
                    cur: 3,
                },
            ),
        },
        Record {
            key: key("rl:{a}:fw"),
            token_bucket: TableState::Absent,
            other: entry(
                u64::MAX,
                StateValue::FixedWindow {
                    index: u64::MAX,
                    count: 0,
                },
            ),
        },
        Record {
            key: key("rl:{a}:log"),
            token_bucket: TableState::Unchanged,
            other: entry(
                10,
                StateValue::SlidingLog {
                    entries: vec![1, 2, 3],
                },
            ),
        },
        Record {
            key: key("rl:{a}:log-empty"),
            token_bucket: TableState::Unchanged,
            other: entry(10, StateValue::SlidingLog { entries: vec![] }),
        },
        Record {
            key: key("rl:{a}:lb"),
            token_bucket: TableState::Unchanged,
            other: entry(7, StateValue::LeakyBucket { tat: 7 }),
        },
        Record {
            key: key("cc:{a}:jobs"),
            token_bucket: TableState::Unchanged,
            other: entry(
                40,
                StateValue::Concurrency {
                    last_id: 40,
                    leases: vec![
                        LeaseState {
                            id: 39,
                            expires_at: 30,
                            units: 1,
                        },
                        LeaseState {
                            id: 40,
                            expires_at: 40,
                            units: 2,
                        },
                    ],
                },
            ),
        },
        Record {
            key: Bytes::from_static(b"\x00\xff"),
            token_bucket: TableState::Absent,
            other: TableState::Absent,
        },
    ]
}

pub fn responses() -> Vec<(RequestId, Response)> {
    vec![
        (
            20,
            Response::Repl(ReplResponse::Stream {
                replid: 0x0123_4567_89ab_cdef,
                epoch: 2,
                offset: 99,
                full: true,
            }),
        ),
        (
            20,
            Response::Repl(ReplResponse::Stream {
                replid: 1,
                epoch: u64::MAX,
                offset: 0,
                full: false,
            }),
        ),
        (
            20,
            Response::Repl(ReplResponse::Snapshot(SnapshotPart {
                offset: 100,
                slot_mod: 1024,
                slot_rem: 1023,
                last: false,
                records: records(),
            })),
        ),
        (
            20,
            Response::Repl(ReplResponse::Snapshot(SnapshotPart {
                offset: 101,
                slot_mod: 1,
                slot_rem: 0,
                last: true,
                records: vec![],
            })),
        ),
        (
            20,
            Response::Repl(ReplResponse::Changes(ChangeBatch {
                offset: 102,
                sent_at: 1_700_000_000_000_000_000,
                records: records(),
            })),
        ),
        (
            20,
            Response::Repl(ReplResponse::Heartbeat {
                epoch: 2,
                offset: 102,
                now: 1_700_000_000_000_000_000,
                syncing: true,
            }),
        ),
        (
            30,
            Response::Repl(ReplResponse::Status(NodeStatus {
                role: Role::Standby,
                epoch: 2,
                offset: 102,
                addr: "10.0.0.2:7700".into(),
                primary: "10.0.0.1:7700".into(),
                fields: vec![("lag_ms".into(), 3), ("synced".into(), 1)],
            })),
        ),
        (
            31,
            Response::Repl(ReplResponse::Status(NodeStatus {
                role: Role::Primary,
                epoch: 0,
                offset: 0,
                addr: String::new(),
                primary: String::new(),
                fields: vec![],
            })),
        ),
        (
            32,
            Response::Repl(ReplResponse::Promoted {
                epoch: 3,
                was_primary: false,
            }),
        ),
        (
            33,
            Response::Repl(ReplResponse::Promoted {
                epoch: 3,
                was_primary: true,
            }),
        ),
        (34, Response::Repl(ReplResponse::HandedOff { merged: 0 })),
        (
            35,
            Response::Repl(ReplResponse::HandedOff { merged: u32::MAX }),
        ),
    ]
}

/// Every sample request, back to back.
pub fn request_stream() -> BytesMut {
    let mut out = BytesMut::new();
    for (id, request) in requests() {
        out.extend_from_slice(&encode_req(id, &request));
    }
    out
}

/// Every sample response, back to back.
pub fn response_stream() -> BytesMut {
    let mut out = BytesMut::new();
    for (id, response) in responses() {
        out.extend_from_slice(&encode_resp(id, &response));
    }
    out
}

fn rejects_response(frame: BytesMut, field: &str) {
    let mut src = frame;
    encode_response(77, &Response::Pong, &mut src).expect("encodes");
    let err = decode_response(&mut src, 1 << 20).expect_err("must be rejected");
    assert_eq!(err.code(), ErrorCode::Malformed, "{err}");
    assert!(!err.is_fatal());
    assert!(err.to_string().contains(field), "{err} should name {field}");
    let next = decode_response(&mut src, 1 << 20).expect("next decodes");
    assert_eq!(next, Some((77, Response::Pong)));
}

fn snapshot_header(p: &mut BytesMut, slot_mod: u16, slot_rem: u16) {
    p.put_u64(1);
    p.put_u16(slot_mod);
    p.put_u16(slot_rem);
}

#[test]
fn invalid_replication_frames_are_malformed_and_consumed_whole() {
    // A flag byte other than 0 or 1.
    rejects_response(
        raw_frame(
            opcode::PROMOTED,
            5,
            &payload(|p| {
                p.put_u64(1);
                p.put_u8(2);
            }),
        ),
        "was_primary",
    );
    // Snapshot slots that are not a power-of-two split.
    for (slot_mod, slot_rem, field) in [
        (3, 0, "slot_mod"),
        (0, 0, "slot_mod"),
        (32768, 0, "slot_mod"),
        (8, 8, "slot_rem"),
    ] {
        rejects_response(
            raw_frame(
                opcode::REPL_SNAPSHOT,
                5,
                &payload(|p| {
                    snapshot_header(p, slot_mod, slot_rem);
                    p.put_u8(1);
                    p.put_u32(0);
                }),
            ),
            field,
        );
    }
    // A table byte out of range, and a state in the wrong table.
    let record_frame = |tb: &[u8], other: &[u8]| {
        raw_frame(
            opcode::REPL_CHANGES,
            5,
            &payload(|p| {
                p.put_u64(1);
                p.put_u64(2);
                p.put_u32(1);
                p.put_u16(1);
                p.put_u8(b'k');
                p.put_slice(tb);
                p.put_slice(other);
            }),
        )
    };
    rejects_response(record_frame(&[3], &[0]), "table state");
    let leaky = [&[2u8, 5][..], &[0; 8], &[0; 8]].concat();
    rejects_response(record_frame(&leaky, &[0]), "algorithm of the table");
    let bucket = [&[2u8, 1][..], &[0; 8], &[0; 8]].concat();
    rejects_response(record_frame(&[0], &bucket), "algorithm of the table");
    // An unknown algorithm inside a record.
    let mut frame = record_frame(&[0], &[2, 9]);
    frame.put_bytes(0, 16);
    let len = (frame.len() - 4) as u32;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    let mut src = frame;
    let err = decode_response(&mut src, 1 << 20).expect_err("unknown algorithm");
    assert!(matches!(
        err,
        DecodeError::UnknownAlgorithm { algorithm: 9, .. }
    ));
    // Requests: a bad announce flag, an unknown announced role.
    let limits = ServerLimits::default();
    let mut src = raw_frame(opcode::STATUS, 5, &[2]);
    let err = decode_request(&mut src, &limits).expect_err("flag");
    assert_eq!(err.code(), ErrorCode::Malformed);
    let mut src = raw_frame(opcode::STATUS, 5, &[1, 9]);
    let err = decode_request(&mut src, &limits).expect_err("role");
    assert!(matches!(err, DecodeError::UnknownRole { role: 9, .. }));
}

#[test]
fn a_huge_announced_record_count_does_not_allocate_for_it() {
    let mut src = raw_frame(
        opcode::REPL_CHANGES,
        5,
        &payload(|p| {
            p.put_u64(1);
            p.put_u64(2);
            p.put_u32(u32::MAX);
        }),
    );
    let err = decode_response(&mut src, 1 << 20).expect_err("truncated");
    assert!(matches!(err, DecodeError::Truncated { .. }), "{err}");
}

#[test]
fn stale_epoch_is_code_16_and_documented() {
    assert_eq!(ErrorCode::StaleEpoch.to_wire(), 16);
    assert_eq!(ErrorCode::from_wire(16), ErrorCode::StaleEpoch);
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/PROTOCOL.md"))
        .expect("PROTOCOL.md");
    assert!(doc.contains("| 16 | StaleEpoch |"));
    for (code, name) in [
        (opcode::REPLICATE, "REPLICATE"),
        (opcode::REPL_ACK, "REPL_ACK"),
        (opcode::PROMOTE, "PROMOTE"),
        (opcode::STATUS, "STATUS"),
        (opcode::REPL_STREAM, "REPL_STREAM"),
        (opcode::REPL_SNAPSHOT, "REPL_SNAPSHOT"),
        (opcode::REPL_CHANGES, "REPL_CHANGES"),
        (opcode::REPL_HEARTBEAT, "REPL_HEARTBEAT"),
        (opcode::STATUS_OK, "STATUS_OK"),
        (opcode::PROMOTED, "PROMOTED"),
    ] {
        let row = format!("| `0x{code:02X}` |");
        let line = doc
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks opcode {row}"));
        assert!(line.contains(&format!("| {name}")), "{line}");
    }
}

/// The worked example of §13, byte for byte.
#[test]
fn changes_example_is_in_the_spec() {
    let frame = encode_resp(
        1,
        &Response::Repl(ReplResponse::Changes(ChangeBatch {
            offset: 7,
            sent_at: 1_700_000_000_000_000_000,
            records: vec![
                Record {
                    key: Bytes::from_static(b"rl:{a}:s"),
                    token_bucket: entry(
                        1_700_000_000_500_000_000,
                        StateValue::TokenBucket {
                            tat: 1_700_000_000_500_000_000,
                        },
                    ),
                    other: TableState::Absent,
                },
                Record {
                    key: Bytes::from_static(b"rl:{a}:d"),
                    token_bucket: TableState::Absent,
                    other: TableState::Absent,
                },
            ],
        })),
    );
    let dump = frame
        .chunks(16)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n");
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/PROTOCOL.md"))
        .expect("PROTOCOL.md");
    let block = format!("```text\n{dump}\n```");
    assert!(doc.contains(&block), "PROTOCOL.md lacks:\n{block}");
}

fn state_value() -> impl Strategy<Value = StateValue> {
    prop_oneof![
        any::<u64>().prop_map(|tat| StateValue::TokenBucket { tat }),
        any::<(u64, u64, u64)>().prop_map(|(index, prev, cur)| StateValue::SlidingWindow {
            index,
            prev,
            cur
        }),
        any::<(u64, u64)>().prop_map(|(index, count)| StateValue::FixedWindow { index, count }),
        prop::collection::vec(any::<u64>(), 0..8)
            .prop_map(|entries| StateValue::SlidingLog { entries }),
        any::<u64>().prop_map(|tat| StateValue::LeakyBucket { tat }),
        (
            any::<u64>(),
            prop::collection::vec(any::<(u64, u64, u64)>(), 0..4)
        )
            .prop_map(|(last_id, leases)| StateValue::Concurrency {
                last_id,
                leases: leases
                    .into_iter()
                    .map(|(id, expires_at, units)| LeaseState {
                        id,
                        expires_at,
                        units
                    })
                    .collect(),
            }),
    ]
}

fn record() -> impl Strategy<Value = Record> {
    (
        prop::collection::vec(any::<u8>(), 1..40),
        0..3u8,
        any::<u64>(),
        0..3u8,
        state_value(),
        any::<u64>(),
    )
        .prop_map(|(key, tb, tat, other, value, expires_at)| {
            let table = |kind: u8, present: TableState| match kind {
                0 => TableState::Unchanged,
                1 => TableState::Absent,
                _ => present,
            };
            let other_value = match value {
                // The token bucket has its own table.
                StateValue::TokenBucket { tat } => StateValue::LeakyBucket { tat },
                v => v,
            };
            Record {
                key: Bytes::from(key),
                token_bucket: table(tb, entry(tat, StateValue::TokenBucket { tat })),
                other: table(other, entry(expires_at, other_value)),
            }
        })
}

proptest! {
    #[test]
    fn change_batches_round_trip(
        id in any::<u32>(),
        offset in any::<u64>(),
        sent_at in any::<u64>(),
        records in prop::collection::vec(record(), 0..16),
    ) {
        let response = Response::Repl(ReplResponse::Changes(ChangeBatch { offset, sent_at, records }));
        let mut buf = encode_resp(id, &response);
        let decoded = decode_response(&mut buf, u32::MAX).expect("decodes");
        prop_assert_eq!(decoded, Some((id, response)));
        prop_assert!(buf.is_empty());
    }

    /// The record-by-record encoder the primary's sender uses writes the
    /// bytes of the batch it stands for, whatever is pushed.
    #[test]
    fn a_changes_frame_built_record_by_record_is_the_encoded_batch(
        id in any::<u32>(),
        offset in any::<u64>(),
        sent_at in any::<u64>(),
        records in prop::collection::vec(record(), 0..16),
    ) {
        let mut frame = ChangesFrame::new(id, sent_at, 0);
        for r in &records {
            frame.push(&r.key, &r.token_bucket, &r.other).expect("fits");
        }
        prop_assert_eq!(frame.records() as usize, records.len());
        prop_assert_eq!(frame.is_empty(), records.is_empty());
        let len = frame.len();
        let streamed = frame.finish(offset).expect("fits");
        prop_assert_eq!(streamed.len(), len);
        let batch = Response::Repl(ReplResponse::Changes(ChangeBatch { offset, sent_at, records }));
        prop_assert_eq!(&streamed[..], &encode_resp(id, &batch)[..]);
    }
}

#[test]
fn a_record_too_long_leaves_the_changes_frame_as_it_was() {
    let mut frame = ChangesFrame::new(3, 9, 0);
    frame
        .push(b"k", &TableState::Absent, &TableState::Unchanged)
        .expect("fits");
    let len = frame.len();
    let long = vec![b'x'; usize::from(u16::MAX) + 1];
    let err = frame
        .push(&long, &TableState::Absent, &TableState::Unchanged)
        .expect_err("a key longer than its length field");
    assert!(matches!(err, EncodeError::TooLong { field: "key", .. }));
    assert_eq!((frame.len(), frame.records()), (len, 1));
    let mut bytes = BytesMut::from(&frame.finish(4).expect("fits")[..]);
    let decoded = decode_response(&mut bytes, u32::MAX).expect("decodes");
    let Some((3, Response::Repl(ReplResponse::Changes(batch)))) = decoded else {
        panic!("a changes frame: {decoded:?}");
    };
    assert_eq!(
        (batch.offset, batch.sent_at, batch.records.len()),
        (4, 9, 1)
    );
}
