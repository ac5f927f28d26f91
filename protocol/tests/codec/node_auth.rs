//! Node authentication (§15): NODE_CHALLENGE and CHALLENGE round trip and
//! refuse stray bytes, and the spec's worked exchange, proof included, is
//! what the encoder and `node_proof` produce.

use bytes::{Bytes, BytesMut};
use tollgate_protocol::*;

use crate::samples::*;
use crate::spec::{assert_documented, protocol_md};

const NONCE: [u8; NONCE_LEN] = {
    let mut n = [0u8; NONCE_LEN];
    let mut i = 0;
    while i < NONCE_LEN {
        n[i] = i as u8;
        i += 1;
    }
    n
};

#[test]
fn node_auth_opcodes_are_documented() {
    let doc = protocol_md();
    for (code, name) in [
        (opcode::NODE_CHALLENGE, "NODE_CHALLENGE"),
        (opcode::CHALLENGE, "CHALLENGE"),
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
fn challenge_messages_round_trip() {
    let mut src = encode_req(4, &Request::NodeChallenge);
    let decoded = decode_request(&mut src, &ServerLimits::default()).unwrap();
    assert_eq!(decoded, Some((4, Request::NodeChallenge)));
    let mut src = encode_resp(4, &Response::Challenge { nonce: NONCE });
    let decoded = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME).unwrap();
    assert_eq!(decoded, Some((4, Response::Challenge { nonce: NONCE })));
}

#[test]
fn stray_or_missing_bytes_are_malformed() {
    // NODE_CHALLENGE with a payload byte.
    let mut src = BytesMut::from(&[0, 0, 0, 6, 0x0d, 0, 0, 0, 1, 0][..]);
    let err = decode_request(&mut src, &ServerLimits::default()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Malformed, "{err}");
    assert!(src.is_empty(), "the frame is consumed whole");
    // CHALLENGE one byte short, and one byte long.
    for len in [NONCE_LEN - 1, NONCE_LEN + 1] {
        let mut src = BytesMut::from(&[0, 0, 0, 5 + len as u8, 0x8f, 0, 0, 0, 1][..]);
        src.extend_from_slice(&vec![7u8; len]);
        let err = decode_response(&mut src, DEFAULT_CLIENT_MAX_FRAME).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Malformed, "{len}: {err}");
    }
}

#[test]
fn node_handshake_example() {
    let doc = protocol_md();
    assert_documented(
        &doc,
        &encode_req(1, &Request::NodeChallenge),
        &[
            ("00 00 00 05", "length: 5-byte body"),
            ("0d", "opcode: NODE_CHALLENGE"),
            ("00 00 00 01", "request id: 1"),
        ],
    );
    let nonce_hex = "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f";
    assert_documented(
        &doc,
        &encode_resp(1, &Response::Challenge { nonce: NONCE }),
        &[
            ("00 00 00 25", "length: 37-byte body"),
            ("8f", "opcode: CHALLENGE"),
            ("00 00 00 01", "request id: 1"),
            (nonce_hex, "nonce: bytes 0 to 31"),
        ],
    );
    let proof = node_proof(b"cluster-secret", &NONCE, NodeScope::Cluster);
    let proof_hex = "b3 b8 1d 73 dd d6 27 57 20 1e 71 4a 3e 43 d9 ea 73 cd 37 f7 f1 3f d1 37 81 af 1d 9a fb 9a a9 72";
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "node-b".into(),
        auth_token: Some(Bytes::copy_from_slice(&proof)),
    };
    assert_documented(
        &doc,
        &encode_req(2, &hello),
        &[
            ("00 00 00 2f", "length: 47-byte body"),
            ("01", "opcode: HELLO"),
            ("00 00 00 02", "request id: 2"),
            ("00 01", "version: 1"),
            ("06", "name_len: 6"),
            ("6e 6f 64 65 2d 62", "name: `node-b`"),
            ("20", "token_len: 32"),
            (
                proof_hex,
                "token: HMAC-SHA256(`cluster-secret`, nonce ‖ `tollgate node auth v1 cluster`)",
            ),
        ],
    );
    // The region scope's proof of the same secret over the same nonce.
    let region = node_proof(b"cluster-secret", &NONCE, NodeScope::Region);
    let region_hex = region
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(
        region_hex,
        "b8 40 34 15 4d 57 cd cf 41 05 e6 bc bb ba c5 b2 96 b6 db 09 07 ae 16 c0 13 aa 23 b4 d4 93 d7 58"
    );
    assert!(doc.contains(&format!("`{region_hex}`")));
}
