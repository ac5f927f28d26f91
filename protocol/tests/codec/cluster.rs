//! Cluster messages (§14): samples for the generic round-trip, cut and
//! corpus tests, their invalid forms, the worked examples of the spec, and
//! a proptest over topologies.

use bytes::BufMut;
use proptest::prelude::*;
use tollgate_protocol::*;

use crate::samples::*;
use crate::spec::{assert_documented, protocol_md};

pub fn requests() -> Vec<(RequestId, Request)> {
    vec![(40, Request::Topology), (u32::MAX, Request::Topology)]
}

fn span(first: u16, last: u16) -> SlotSpan {
    SlotSpan { first, last }
}

/// The map of the spec's worked example: two shards, the second without
/// a primary, slots 100-199 on their way from shard 0 to shard 1.
pub fn example_topology() -> ClusterTopology {
    ClusterTopology {
        version: 42,
        shards: vec![
            ShardInfo {
                id: 0,
                epoch: 17,
                primary: "10.0.0.1:7700".into(),
                standbys: vec!["10.0.0.2:7700".into()],
                slots: vec![span(0, 8191)],
            },
            ShardInfo {
                id: 1,
                epoch: 0,
                primary: String::new(),
                standbys: vec!["10.0.0.4:7700".into()],
                slots: vec![span(8192, 16383)],
            },
        ],
        moving: vec![MovingSlots {
            slots: span(100, 199),
            from: 0,
            to: 1,
        }],
    }
}

pub fn responses() -> Vec<(RequestId, Response)> {
    let single = ClusterTopology::single_node(&NodeStatus {
        role: Role::Standby,
        epoch: 3,
        offset: 0,
        addr: "10.0.0.2:7700".into(),
        primary: "10.0.0.1:7700".into(),
        fields: vec![],
    });
    vec![
        (40, Response::Topology(example_topology())),
        (41, Response::Topology(single)),
        (
            42,
            Response::Topology(ClusterTopology {
                version: u64::MAX,
                shards: vec![ShardInfo {
                    id: u16::MAX,
                    epoch: u64::MAX,
                    primary: "p".repeat(255),
                    standbys: vec![String::new(), "s".repeat(255)],
                    slots: vec![span(0, 0), span(2, 16383)],
                }],
                moving: vec![],
            }),
        ),
        (
            43,
            Response::Topology(ClusterTopology {
                version: 0,
                shards: vec![],
                moving: vec![],
            }),
        ),
        (
            44,
            Response::Moved(Moved {
                slot: 11304,
                version: 42,
                addr: "10.0.0.3:7700".into(),
            }),
        ),
        (
            45,
            Response::Moved(Moved {
                slot: 16383,
                version: u64::MAX,
                addr: String::new(),
            }),
        ),
        (
            46,
            Response::Error {
                code: ErrorCode::TryAgain,
                message: "slots 100-199 are moving".into(),
            },
        ),
    ]
}

pub fn request_stream() -> bytes::BytesMut {
    let mut out = bytes::BytesMut::new();
    for (id, request) in requests() {
        out.extend_from_slice(&encode_req(id, &request));
    }
    out
}

pub fn response_stream() -> bytes::BytesMut {
    let mut out = bytes::BytesMut::new();
    for (id, response) in responses() {
        out.extend_from_slice(&encode_resp(id, &response));
    }
    out
}

/// `frame` is refused as Malformed naming `field`, consumed whole: the
/// PONG behind it decodes.
fn rejects_response(frame: bytes::BytesMut, field: &str) {
    let mut src = frame;
    encode_response(77, &Response::Pong, &mut src).expect("encodes");
    let err = decode_response(&mut src, 1 << 20).expect_err("must be rejected");
    assert_eq!(err.code(), ErrorCode::Malformed, "{err}");
    assert!(!err.is_fatal());
    assert!(err.to_string().contains(field), "{err} should name {field}");
    let next = decode_response(&mut src, 1 << 20).expect("next decodes");
    assert_eq!(next, Some((77, Response::Pong)));
}

fn topology_with_range(first: u16, last: u16) -> bytes::BytesMut {
    raw_frame(
        opcode::TOPOLOGY_OK,
        5,
        &payload(|p| {
            p.put_u64(1);
            p.put_u16(1);
            p.put_u16(0);
            p.put_u64(1);
            p.put_u8(0);
            p.put_u8(0);
            p.put_u16(1);
            p.put_u16(first);
            p.put_u16(last);
            p.put_u16(0);
        }),
    )
}

#[test]
fn slots_out_of_range_and_reversed_ranges_are_malformed() {
    rejects_response(topology_with_range(0, 16384), "last slot");
    rejects_response(topology_with_range(16384, 16384), "first slot");
    rejects_response(topology_with_range(9, 8), "first above last");
    rejects_response(
        raw_frame(
            opcode::MOVED,
            5,
            &payload(|p| {
                p.put_u16(16384);
                p.put_u64(1);
                p.put_u8(0);
            }),
        ),
        "slot",
    );
    // A move's range is checked the same way.
    let mut bad_move = topology_with_range(0, 16383);
    bad_move.truncate(bad_move.len() - 2);
    bad_move.put_u16(1);
    bad_move.put_u16(200);
    bad_move.put_u16(100);
    bad_move.put_u16(0);
    bad_move.put_u16(1);
    let len = (bad_move.len() - 4) as u32;
    bad_move[..4].copy_from_slice(&len.to_be_bytes());
    rejects_response(bad_move, "first above last");
    // TOPOLOGY carries nothing.
    let mut src = raw_frame(opcode::TOPOLOGY, 5, &[0]);
    let err = decode_request(&mut src, &ServerLimits::default()).expect_err("trailing");
    assert!(
        matches!(err, DecodeError::TrailingBytes { extra: 1, .. }),
        "{err}"
    );
}

#[test]
fn a_huge_announced_shard_count_does_not_allocate_for_it() {
    let mut src = raw_frame(
        opcode::TOPOLOGY_OK,
        5,
        &payload(|p| {
            p.put_u64(1);
            p.put_u16(u16::MAX);
        }),
    );
    let err = decode_response(&mut src, 1 << 20).expect_err("truncated");
    assert!(matches!(err, DecodeError::Truncated { .. }), "{err}");
}

#[test]
fn a_node_outside_a_cluster_is_one_shard_with_every_slot() {
    let primary = ClusterTopology::single_node(&NodeStatus {
        role: Role::Primary,
        epoch: 1,
        offset: 9,
        addr: "10.0.0.1:7700".into(),
        primary: String::new(),
        fields: vec![],
    });
    assert_eq!(primary.version, 0);
    assert_eq!(primary.shards.len(), 1);
    assert_eq!(primary.shards[0].slots, [SlotSpan::ALL]);
    assert_eq!(primary.shards[0].primary, "10.0.0.1:7700");
    assert!(primary.shards[0].standbys.is_empty());
    assert_eq!(primary.owner(16383).map(|s| s.id), Some(0));
    let t = example_topology();
    assert_eq!(t.owner(8191).map(|s| s.id), Some(0));
    assert_eq!(t.owner(8192).map(|s| s.id), Some(1));
}

/// The opcode and error tables of §2 and §9 list the cluster's.
#[test]
fn cluster_opcodes_and_try_again_are_documented() {
    let doc = protocol_md();
    assert_eq!(ErrorCode::TryAgain.to_wire(), 17);
    assert_eq!(ErrorCode::from_wire(17), ErrorCode::TryAgain);
    assert!(doc.contains("| 17 | TryAgain |"));
    for (code, name) in [
        (opcode::TOPOLOGY, "TOPOLOGY"),
        (opcode::TOPOLOGY_OK, "TOPOLOGY_OK"),
        (opcode::MOVED, "MOVED"),
    ] {
        let row = format!("| `0x{code:02X}` |");
        let line = doc
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks opcode {row}"));
        assert!(line.contains(&format!("| {name}")), "{line}");
    }
}

#[test]
fn topology_example() {
    let frame = encode_req(5, &Request::Topology);
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 05", "length: 5-byte body"),
            ("10", "opcode: TOPOLOGY"),
            ("00 00 00 05", "request id: 5"),
        ],
    );
}

#[test]
fn topology_ok_example() {
    let frame = encode_resp(5, &Response::Topology(example_topology()));
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 66", "length: 102-byte body"),
            ("90", "opcode: TOPOLOGY_OK"),
            ("00 00 00 05", "request id: 5"),
            ("00 00 00 00 00 00 00 2a", "version: 42"),
            ("00 02", "n_shards: 2"),
            ("00 00", "shard 0: id 0"),
            ("00 00 00 00 00 00 00 11", "epoch: 17"),
            ("0d", "primary_len: 13"),
            (
                "31 30 2e 30 2e 30 2e 31 3a 37 37 30 30",
                "primary: `10.0.0.1:7700`",
            ),
            ("01", "n_standbys: 1"),
            ("0d", "addr_len: 13"),
            (
                "31 30 2e 30 2e 30 2e 32 3a 37 37 30 30",
                "standby: `10.0.0.2:7700`",
            ),
            ("00 01", "n_ranges: 1"),
            ("00 00 1f ff", "slots 0-8191"),
            ("00 01", "shard 1: id 1"),
            ("00 00 00 00 00 00 00 00", "epoch: 0 (no primary)"),
            ("00", "primary_len: 0"),
            ("01", "n_standbys: 1"),
            ("0d", "addr_len: 13"),
            (
                "31 30 2e 30 2e 30 2e 34 3a 37 37 30 30",
                "standby: `10.0.0.4:7700`",
            ),
            ("00 01", "n_ranges: 1"),
            ("20 00 3f ff", "slots 8192-16383"),
            ("00 01", "n_moving: 1"),
            ("00 64 00 c7", "slots 100-199"),
            ("00 00", "from shard 0"),
            ("00 01", "to shard 1"),
        ],
    );
}

#[test]
fn moved_example() {
    let frame = encode_resp(
        7,
        &Response::Moved(Moved {
            slot: 11304,
            version: 42,
            addr: "10.0.0.3:7700".into(),
        }),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 1d", "length: 29-byte body"),
            ("91", "opcode: MOVED"),
            ("00 00 00 07", "request id: 7"),
            ("2c 28", "slot: 11304"),
            ("00 00 00 00 00 00 00 2a", "version: 42"),
            ("0d", "addr_len: 13"),
            (
                "31 30 2e 30 2e 30 2e 33 3a 37 37 30 30",
                "addr: `10.0.0.3:7700`",
            ),
        ],
    );
}

fn slot_span() -> impl Strategy<Value = SlotSpan> {
    (0..SLOT_COUNT, 0..SLOT_COUNT).prop_map(|(a, b)| span(a.min(b), a.max(b)))
}

fn address() -> impl Strategy<Value = String> {
    "[a-z0-9.:]{0,24}"
}

fn topology() -> impl Strategy<Value = ClusterTopology> {
    let shard = (
        any::<u16>(),
        any::<u64>(),
        address(),
        prop::collection::vec(address(), 0..4),
        prop::collection::vec(slot_span(), 0..4),
    )
        .prop_map(|(id, epoch, primary, standbys, slots)| ShardInfo {
            id,
            epoch,
            primary,
            standbys,
            slots,
        });
    let moving = (slot_span(), any::<u16>(), any::<u16>())
        .prop_map(|(slots, from, to)| MovingSlots { slots, from, to });
    (
        any::<u64>(),
        prop::collection::vec(shard, 0..6),
        prop::collection::vec(moving, 0..3),
    )
        .prop_map(|(version, shards, moving)| ClusterTopology {
            version,
            shards,
            moving,
        })
}

proptest! {
    #[test]
    fn topologies_and_redirections_round_trip(
        id in any::<u32>(),
        topology in topology(),
        slot in 0..SLOT_COUNT,
        version in any::<u64>(),
        addr in address(),
    ) {
        for response in [
            Response::Topology(topology.clone()),
            Response::Moved(Moved { slot, version, addr: addr.clone() }),
        ] {
            let mut buf = encode_resp(id, &response);
            let decoded = decode_response(&mut buf, u32::MAX).expect("decodes");
            prop_assert_eq!(decoded, Some((id, response)));
            prop_assert!(buf.is_empty());
        }
    }
}
