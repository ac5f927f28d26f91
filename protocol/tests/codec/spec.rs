//! The worked examples of `PROTOCOL.md`, generated from the encoder and
//! asserted byte for byte, and checked to appear verbatim in the document
//! so the spec cannot drift from the code.

use bytes::Bytes;
use tollgate_protocol::*;

use crate::samples::*;

pub fn protocol_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/PROTOCOL.md");
    std::fs::read_to_string(path).expect("PROTOCOL.md beside the crate")
}

/// Space-separated lowercase hex, 16 bytes a line.
fn hex_dump(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .map(|line| {
            line.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Checks that `rows` (hex, meaning) concatenate to `frame`, and that the
/// document holds both the annotated table and the plain dump.
pub fn assert_documented(doc: &str, frame: &[u8], rows: &[(&str, &str)]) {
    let from_rows: Vec<u8> = rows
        .iter()
        .flat_map(|(hex, _)| {
            hex.split(' ')
                .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        })
        .collect();
    assert_eq!(
        hex_dump(&from_rows),
        hex_dump(frame),
        "the field rows do not add up to the frame"
    );

    let mut table = String::from("| Bytes | Field |\n|---|---|\n");
    for (hex, meaning) in rows {
        table.push_str(&format!("| `{hex}` | {meaning} |\n"));
    }
    assert!(
        doc.contains(&table),
        "PROTOCOL.md lacks this table:\n{table}"
    );
    let dump = format!("```text\n{}\n```", hex_dump(frame));
    assert!(doc.contains(&dump), "PROTOCOL.md lacks this dump:\n{dump}");
}

#[test]
fn hello_example() {
    let frame = encode_req(
        1,
        &Request::Hello {
            version: 1,
            client_name: "gw-1".into(),
            auth_token: Some(Bytes::from_static(b"secret")),
        },
    );
    assert_eq!(
        &frame[..],
        b"\x00\x00\x00\x13\x01\x00\x00\x00\x01\x00\x01\x04gw-1\x06secret"
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 13", "length: 19-byte body"),
            ("01", "opcode: HELLO"),
            ("00 00 00 01", "request id: 1"),
            ("00 01", "version: 1"),
            ("04", "name_len: 4"),
            ("67 77 2d 31", "name: `gw-1`"),
            ("06", "token_len: 6"),
            ("73 65 63 72 65 74", "token: `secret`"),
        ],
    );
}

#[test]
fn hello_ok_example() {
    let frame = encode_resp(
        1,
        &Response::HelloOk {
            version: 1,
            role: Role::Primary,
            epoch: 1,
            offset: 0,
            limits: ServerLimits::default(),
        },
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 21", "length: 33-byte body"),
            ("81", "opcode: HELLO_OK"),
            ("00 00 00 01", "request id: 1"),
            ("00 01", "version: 1"),
            ("01", "role: primary"),
            ("00 00 00 00 00 00 00 01", "epoch: 1"),
            ("00 00 00 00 00 00 00 00", "offset: 0"),
            ("00 10 00 00", "max_frame: 1048576"),
            ("04 00", "max_batch: 1024"),
            ("10", "max_group: 16"),
            ("01 00", "max_key_len: 256"),
        ],
    );
}

#[test]
fn check_example() {
    let request = Request::Check(batch(vec![vec![pair(
        "rl:{acme}:s",
        limit(Algorithm::TokenBucket, 10, 1000, 20),
        1,
    )]]));
    let frame = encode_req(2, &request);
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 32", "length: 50-byte body"),
            ("03", "opcode: CHECK"),
            ("00 00 00 02", "request id: 2"),
            ("00 01", "n_checks: 1"),
            ("01", "check 0, n_pairs: 1"),
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
fn checked_example() {
    let frame = encode_resp(
        2,
        &Response::Checked(vec![CheckResult::Decision(Decision {
            allowed: true,
            shadow_denied: false,
            pair: 0,
            limit: 20,
            remaining: 19,
            reset_after_ms: 100,
            retry_after_ms: 0,
            lease: None,
        })]),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 29", "length: 41-byte body"),
            ("83", "opcode: CHECKED"),
            ("00 00 00 02", "request id: 2"),
            ("00 01", "n: 1"),
            ("00", "result 0, status: allowed"),
            ("00", "pair: 0"),
            ("00 00 00 00 00 00 00 14", "limit: 20"),
            ("00 00 00 00 00 00 00 13", "remaining: 19"),
            ("00 00 00 00 00 00 00 64", "reset_after_ms: 100"),
            ("00 00 00 00 00 00 00 00", "retry_after_ms: 0"),
        ],
    );
}

#[test]
fn checked_with_lease_example() {
    let frame = encode_resp(
        2,
        &Response::Checked(vec![CheckResult::Decision(Decision {
            allowed: true,
            shadow_denied: false,
            pair: 0,
            limit: 8,
            remaining: 7,
            reset_after_ms: 30_000,
            retry_after_ms: 0,
            lease: Some(1_000_000_001),
        })]),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 31", "length: 49-byte body"),
            ("83", "opcode: CHECKED"),
            ("00 00 00 02", "request id: 2"),
            ("00 01", "n: 1"),
            ("03", "result 0, status: allowed with lease"),
            ("00", "pair: 0"),
            ("00 00 00 00 00 00 00 08", "limit: 8"),
            ("00 00 00 00 00 00 00 07", "remaining: 7"),
            ("00 00 00 00 00 00 75 30", "reset_after_ms: 30000"),
            ("00 00 00 00 00 00 00 00", "retry_after_ms: 0"),
            ("00 00 00 00 3b 9a ca 01", "lease: 1000000001"),
        ],
    );
}

#[test]
fn release_example() {
    let frame = encode_req(
        3,
        &Request::Release(vec![LeaseRef {
            key: Bytes::from_static(b"cc:{acme}:jobs"),
            lease: 1_000_000_001,
        }]),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 1f", "length: 31-byte body"),
            ("07", "opcode: RELEASE"),
            ("00 00 00 03", "request id: 3"),
            ("00 01", "n_leases: 1"),
            ("00 0e", "key_len: 14"),
            (
                "63 63 3a 7b 61 63 6d 65 7d 3a 6a 6f 62 73",
                "key: `cc:{acme}:jobs`",
            ),
            ("00 00 00 00 3b 9a ca 01", "lease: 1000000001"),
        ],
    );
}

#[test]
fn check_rule_example() {
    let request = Request::Check(batch(vec![vec![rule_pair(
        "rl:{acme}:s",
        "api-per-second",
        0,
    )]]));
    let frame = encode_req(3, &request);
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 29", "length: 41-byte body"),
            ("03", "opcode: CHECK"),
            ("00 00 00 03", "request id: 3"),
            ("00 01", "n_checks: 1"),
            ("01", "check 0, n_pairs: 1"),
            ("00 0b", "key_len: 11"),
            ("72 6c 3a 7b 61 63 6d 65 7d 3a 73", "key: `rl:{acme}:s`"),
            ("80", "limit_kind: named rule"),
            ("0e", "name_len: 14"),
            (
                "61 70 69 2d 70 65 72 2d 73 65 63 6f 6e 64",
                "name: `api-per-second`",
            ),
            ("00 00 00 00", "cost: 0 (the rule's default cost)"),
        ],
    );
}

#[test]
fn checked_shadow_denied_example() {
    let frame = encode_resp(
        3,
        &Response::Checked(vec![CheckResult::Decision(Decision {
            allowed: true,
            shadow_denied: true,
            pair: 0,
            limit: 20,
            remaining: 0,
            reset_after_ms: 2000,
            retry_after_ms: 100,
            lease: None,
        })]),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 29", "length: 41-byte body"),
            ("83", "opcode: CHECKED"),
            ("00 00 00 03", "request id: 3"),
            ("00 01", "n: 1"),
            ("04", "result 0, status: allowed, shadow rule would deny"),
            ("00", "pair: 0"),
            ("00 00 00 00 00 00 00 14", "limit: 20"),
            ("00 00 00 00 00 00 00 00", "remaining: 0"),
            ("00 00 00 00 00 00 07 d0", "reset_after_ms: 2000"),
            ("00 00 00 00 00 00 00 64", "retry_after_ms: 100"),
        ],
    );
}

/// The algorithm table of §5 lists every wire code with its name.
#[test]
fn algorithm_table_matches_the_names() {
    let doc = protocol_md();
    for algorithm in Algorithm::ALL {
        let row = format!("| {} | `{}` |", algorithm as u8, algorithm.name());
        assert!(doc.contains(&row), "PROTOCOL.md lacks the row: {row}");
    }
}

/// The opcode table of §2 lists every opcode the codec knows.
#[test]
fn opcode_table_lists_every_opcode() {
    let doc = protocol_md();
    for (code, name) in [
        (opcode::HELLO, "HELLO"),
        (opcode::PING, "PING"),
        (opcode::CHECK, "CHECK"),
        (opcode::PEEK, "PEEK"),
        (opcode::RESET, "RESET"),
        (opcode::REFUND, "REFUND"),
        (opcode::RELEASE, "RELEASE"),
        (opcode::HELLO_OK, "HELLO_OK"),
        (opcode::PONG, "PONG"),
        (opcode::CHECKED, "CHECKED"),
        (opcode::RESET_DONE, "RESET_DONE"),
        (opcode::RELEASED, "RELEASED"),
        (opcode::ERROR, "ERROR"),
    ] {
        let row = format!("| `0x{code:02X}` |");
        let line = doc
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks opcode {row}"));
        assert!(line.contains(&format!("| {name}")), "{line}");
    }
}

/// The status table of §6 lists every status the encoder writes, once,
/// with the size of its result; a lease wins over the shadow flag.
#[test]
fn status_table_matches_the_encoder() {
    let doc = protocol_md();
    let allowed = Decision {
        allowed: true,
        shadow_denied: false,
        pair: 0,
        limit: 1,
        remaining: 0,
        reset_after_ms: 0,
        retry_after_ms: 0,
        lease: None,
    };
    let leased = Decision {
        lease: Some(1),
        ..allowed
    };
    let shadow = Decision {
        shadow_denied: true,
        ..allowed
    };
    for (result, status, meaning, size) in [
        (CheckResult::Decision(allowed), 0u8, "allowed (", 34),
        (
            CheckResult::Decision(Decision {
                allowed: false,
                ..leased
            }),
            1,
            "denied",
            34,
        ),
        (CheckResult::Error(ErrorCode::CrossSlot), 2, "error", 3),
        (CheckResult::Decision(leased), 3, "allowed with lease", 42),
        (
            CheckResult::Decision(Decision {
                shadow_denied: true,
                ..leased
            }),
            3,
            "allowed with lease",
            42,
        ),
        (
            CheckResult::Decision(shadow),
            4,
            "allowed, but a rule in shadow mode would have denied",
            34,
        ),
    ] {
        let frame = encode_resp(1, &Response::Checked(vec![result]));
        // Header (9 bytes) and n (2), then the one result.
        assert_eq!(frame[11], status, "{result:?}");
        assert_eq!(frame.len() - 11, size, "{result:?}");
        let row = format!("| {status} | {meaning}");
        let lines: Vec<&str> = doc.lines().filter(|l| l.starts_with(&row)).collect();
        assert_eq!(lines.len(), 1, "PROTOCOL.md needs one row starting {row}");
        assert!(
            lines[0].ends_with(&format!("| {size} bytes |")),
            "{}",
            lines[0]
        );
    }
}

#[test]
fn error_example() {
    let frame = encode_resp(
        7,
        &Response::Error {
            code: ErrorCode::KeyTooLong,
            message: "key too long".into(),
        },
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 15", "length: 21-byte body"),
            ("ff", "opcode: ERROR"),
            ("00 00 00 07", "request id: 7"),
            ("00 05", "code: 5 (KeyTooLong)"),
            ("00 0c", "msg_len: 12"),
            (
                "6b 65 79 20 74 6f 6f 20 6c 6f 6e 67",
                "message: `key too long`",
            ),
        ],
    );
}

/// CRC16-XMODEM (poly 0x1021, init 0), bit by bit: enough to check the
/// slot numbers quoted in the spec without a dependency.
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[test]
fn slot_numbers_quoted_in_the_spec() {
    let doc = protocol_md();
    assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    for (tag, crc, slot) in [("foo", 0xAF96u16, 12182u16), ("acme", 0xAC28, 11304)] {
        assert_eq!(crc16_xmodem(tag.as_bytes()), crc);
        assert_eq!(crc % 16384, slot);
        let line = format!("CRC16-XMODEM(`{tag}`) = 0x{crc:04X}, slot {slot}");
        assert!(doc.contains(&line), "PROTOCOL.md lacks: {line}");
    }
}

#[test]
fn error_code_table_matches_to_wire() {
    let doc = protocol_md();
    for wire in 1..=17u16 {
        let code = ErrorCode::from_wire(wire);
        let row = format!("| {wire} | {code:?} |");
        assert!(
            doc.contains(&row),
            "PROTOCOL.md error table lacks row starting: {row}"
        );
    }
}
