//! The usage exchange between regions (§16): samples for the generic
//! round-trip, cut and corpus tests, their invalid forms, the worked
//! examples of the spec, and a proptest over reports.

use bytes::{BufMut, Bytes};
use proptest::prelude::*;
use tollgate_protocol::*;

use crate::samples::*;
use crate::spec::{assert_documented, protocol_md};

fn entry(key: &str, rule: &str, charged: u64, refunded: u64, at: u64) -> UsageEntry {
    UsageEntry {
        key: Bytes::copy_from_slice(key.as_bytes()),
        rule: RuleName::try_from(rule).expect("a valid rule name"),
        charged,
        refunded,
        at,
    }
}

/// The USAGE of the spec's worked example: region `us` tells another
/// region that `rl:{a}:s` took 3 units under rule `api` since its last
/// message, the latest at 1,700,000,000.4 s.
pub fn example_report() -> UsageReport {
    UsageReport {
        region: "us".into(),
        session: 0x1122_3344_5566_7788,
        seq: 2,
        sent_at: 1_700_000_000_500_000_000,
        entries: vec![entry("rl:{a}:s", "api", 3, 0, 1_700_000_000_400_000_000)],
    }
}

pub fn requests() -> Vec<(RequestId, Request)> {
    vec![
        (50, Request::Usage(example_report())),
        // A heartbeat: nothing was used since the last message.
        (
            51,
            Request::Usage(UsageReport {
                region: "eu-west-1".into(),
                session: 1,
                seq: 1,
                sent_at: 0,
                entries: vec![],
            }),
        ),
        (
            u32::MAX,
            Request::Usage(UsageReport {
                region: "r".repeat(MAX_REGION_NAME_LEN),
                session: u64::MAX,
                seq: u64::MAX,
                sent_at: u64::MAX,
                entries: vec![
                    entry("k", "r", 0, u64::MAX, 0),
                    entry(&"k".repeat(32), &"n".repeat(64), u64::MAX, 0, u64::MAX),
                ],
            }),
        ),
    ]
}

pub fn responses() -> Vec<(RequestId, Response)> {
    vec![
        (
            50,
            Response::UsageOk(UsageAck {
                region: "eu".into(),
                seq: 2,
                duplicate: false,
            }),
        ),
        (
            51,
            Response::UsageOk(UsageAck {
                region: "r".repeat(MAX_REGION_NAME_LEN),
                seq: u64::MAX,
                duplicate: true,
            }),
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

/// A USAGE payload by hand: region, the fixed fields, then `entries` as
/// given (already encoded).
fn usage_frame(region: &[u8], n: u32, entries: &[u8]) -> bytes::BytesMut {
    raw_frame(
        opcode::USAGE,
        9,
        &payload(|p| {
            p.put_u8(region.len() as u8);
            p.put_slice(region);
            p.put_u64(1);
            p.put_u64(1);
            p.put_u64(0);
            p.put_u32(n);
            p.put_slice(entries);
        }),
    )
}

fn one_entry(key: &[u8], rule: &[u8]) -> bytes::BytesMut {
    payload(|p| {
        p.put_u16(key.len() as u16);
        p.put_slice(key);
        p.put_u8(rule.len() as u8);
        p.put_slice(rule);
        p.put_u64(1);
        p.put_u64(0);
        p.put_u64(0);
    })
}

/// `frame` is refused with `code`, consumed whole: the PING behind it
/// decodes.
fn rejects_request(frame: bytes::BytesMut, code: ErrorCode, what: &str) {
    let mut src = frame;
    encode_request(77, &Request::Ping, &mut src).expect("encodes");
    let limits = ServerLimits::default();
    let err = decode_request(&mut src, &limits).expect_err("must be rejected");
    assert_eq!(err.code(), code, "{err}");
    assert!(!err.is_fatal());
    assert!(err.to_string().contains(what), "{err} should say {what}");
    let next = decode_request(&mut src, &limits).expect("next decodes");
    assert_eq!(next, Some((77, Request::Ping)));
}

#[test]
fn bad_region_names_keys_and_rules_are_refused() {
    use ErrorCode::*;
    rejects_request(usage_frame(b"", 0, &[]), Malformed, "region name length");
    rejects_request(
        usage_frame(&[b'r'; 65], 0, &[]),
        Malformed,
        "region name length",
    );
    rejects_request(usage_frame(&[0xff], 0, &[]), Malformed, "region name");
    rejects_request(
        usage_frame(b"us", 1, &one_entry(b"", b"api")),
        Malformed,
        "empty key",
    );
    rejects_request(
        usage_frame(b"us", 1, &one_entry(&[b'k'; 257], b"api")),
        KeyTooLong,
        "257 bytes",
    );
    rejects_request(
        usage_frame(b"us", 1, &one_entry(b"k", b"")),
        Malformed,
        "rule name",
    );
    // More entries announced than the frame holds.
    rejects_request(
        usage_frame(b"us", 2, &one_entry(b"k", b"api")),
        Malformed,
        "needs",
    );
    // The duplicate flag is 0 or 1.
    let mut src = raw_frame(
        opcode::USAGE_OK,
        5,
        &payload(|p| {
            p.put_u8(2);
            p.put_slice(b"eu");
            p.put_u64(1);
            p.put_u8(2);
        }),
    );
    let err = decode_response(&mut src, 1 << 20).expect_err("bad flag");
    assert_eq!(err.code(), Malformed);
    assert!(err.to_string().contains("duplicate flag"), "{err}");
}

#[test]
fn a_huge_announced_entry_count_does_not_allocate_for_it() {
    let mut src = usage_frame(b"us", u32::MAX, &[]);
    let err = decode_request(&mut src, &ServerLimits::default()).expect_err("truncated");
    assert!(matches!(err, DecodeError::Truncated { .. }), "{err}");
}

/// The header length the sender budgets with is what the encoder writes.
#[test]
fn entry_and_header_lengths_match_the_encoder() {
    let report = example_report();
    let frame = encode_req(1, &Request::Usage(report.clone()));
    let expected = FRAME_HEADER_LEN
        + MIN_FRAME_BODY as usize
        + usage_header_len(report.region.len())
        + report
            .entries
            .iter()
            .map(UsageEntry::wire_len)
            .sum::<usize>();
    assert_eq!(frame.len(), expected);
}

/// The opcode table of §2 lists the exchange's.
#[test]
fn usage_opcodes_are_documented() {
    let doc = protocol_md();
    for (code, name) in [(opcode::USAGE, "USAGE"), (opcode::USAGE_OK, "USAGE_OK")] {
        let row = format!("| `0x{code:02X}` |");
        let line = doc
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("PROTOCOL.md lacks opcode {row}"));
        assert!(line.contains(&format!("| {name}")), "{line}");
    }
}

#[test]
fn usage_example() {
    let frame = encode_req(3, &Request::Usage(example_report()));
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 4a", "length: 74-byte body"),
            ("20", "opcode: USAGE"),
            ("00 00 00 03", "request id: 3"),
            ("02", "region_len: 2"),
            ("75 73", "region: `us`"),
            ("11 22 33 44 55 66 77 88", "session: 0x1122334455667788"),
            ("00 00 00 00 00 00 00 02", "seq: 2"),
            ("17 97 9c fe 53 f7 65 00", "sent_at: 1700000000500000000"),
            ("00 00 00 01", "n: 1 entry"),
            ("00 08", "key_len: 8"),
            ("72 6c 3a 7b 61 7d 3a 73", "key: `rl:{a}:s`"),
            ("03", "rule_len: 3"),
            ("61 70 69", "rule: `api`"),
            ("00 00 00 00 00 00 00 03", "charged: 3"),
            ("00 00 00 00 00 00 00 00", "refunded: 0"),
            ("17 97 9c fe 4e 01 84 00", "at: 1700000000400000000"),
        ],
    );
}

#[test]
fn usage_ok_example() {
    let frame = encode_resp(
        3,
        &Response::UsageOk(UsageAck {
            region: "eu".into(),
            seq: 2,
            duplicate: false,
        }),
    );
    assert_documented(
        &protocol_md(),
        &frame,
        &[
            ("00 00 00 11", "length: 17-byte body"),
            ("a0", "opcode: USAGE_OK"),
            ("00 00 00 03", "request id: 3"),
            ("02", "region_len: 2"),
            ("65 75", "region: `eu`"),
            ("00 00 00 00 00 00 00 02", "seq: 2"),
            ("00", "duplicate: 0 (applied now)"),
        ],
    );
}

fn report() -> impl Strategy<Value = UsageReport> {
    let entry = (
        "[a-z{}:0-9]{1,32}",
        "[a-z.:_-]{1,64}",
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(key, rule, charged, refunded, at)| entry(&key, &rule, charged, refunded, at));
    (
        "[a-z0-9-]{1,64}",
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        prop::collection::vec(entry, 0..8),
    )
        .prop_map(|(region, session, seq, sent_at, entries)| UsageReport {
            region,
            session,
            seq,
            sent_at,
            entries,
        })
}

proptest! {
    #[test]
    fn reports_and_acks_round_trip(
        id in any::<u32>(),
        report in report(),
        seq in any::<u64>(),
        duplicate in any::<bool>(),
    ) {
        let request = Request::Usage(report.clone());
        let mut buf = encode_req(id, &request);
        let limits = ServerLimits { max_frame: u32::MAX, ..ServerLimits::default() };
        prop_assert_eq!(decode_request(&mut buf, &limits).expect("decodes"), Some((id, request)));
        prop_assert!(buf.is_empty());
        let response = Response::UsageOk(UsageAck { region: report.region, seq, duplicate });
        let mut buf = encode_resp(id, &response);
        prop_assert_eq!(decode_response(&mut buf, u32::MAX).expect("decodes"), Some((id, response)));
        prop_assert!(buf.is_empty());
    }

    /// The entry-by-entry encoder a region's sender uses writes the bytes
    /// of the report it stands for, numbered for each request it is sent
    /// as, and again once moved into another session; a copy for another
    /// peer (into a kept buffer) is the same report under its own numbers,
    /// and leaves the original as it was.
    #[test]
    fn a_usage_frame_built_entry_by_entry_is_the_encoded_report(
        ids in (any::<u32>(), any::<u32>()),
        report in report(),
        later in (any::<u64>(), any::<u64>()),
        garbage in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // A kept buffer's old bytes are no part of the next message.
        let kept = bytes::BytesMut::from(&garbage[..]);
        let other = bytes::BytesMut::from(&garbage[..garbage.len() / 2]);
        let numbers = (report.session, report.seq, report.sent_at);
        let mut frame = UsageFrame::new(kept, &report.region, numbers).expect("fits");
        for e in &report.entries {
            frame.push(&e.key, &e.rule, (e.charged, e.refunded, e.at)).expect("fits");
        }
        prop_assert_eq!(frame.entries() as usize, report.entries.len());
        let read: Vec<_> = frame
            .entries_pushed()
            .map(|(k, r, counts)| (k.to_vec(), r.to_vec(), counts))
            .collect();
        let pushed: Vec<_> = (report.entries.iter())
            .map(|e| (e.key.to_vec(), e.rule.as_bytes().to_vec(), (e.charged, e.refunded, e.at)))
            .collect();
        prop_assert_eq!(read, pushed);
        prop_assert_eq!(frame.is_empty(), report.entries.is_empty());
        let len = frame.len();
        let sent = frame.frame(ids.0).expect("fits").to_vec();
        prop_assert_eq!(sent.len(), len);
        prop_assert_eq!(&sent[..], &encode_req(ids.0, &Request::Usage(report.clone()))[..]);
        let mut copy = frame.copy_into(other);
        copy.renumber(later.1, later.0);
        prop_assert_eq!((copy.entries(), copy.len()), (frame.entries(), frame.len()));
        let copied = UsageReport { session: later.1, seq: later.0, ..report.clone() };
        let sent_copy = copy.frame(ids.1).expect("fits").to_vec();
        prop_assert_eq!(&sent_copy[..], &encode_req(ids.1, &Request::Usage(copied))[..]);
        frame.renumber(later.0, later.1);
        let moved = UsageReport { session: later.0, seq: later.1, ..report };
        let resent = frame.frame(ids.1).expect("fits").to_vec();
        prop_assert_eq!(&resent[..], &encode_req(ids.1, &Request::Usage(moved))[..]);
    }
}

#[test]
fn an_entry_too_long_leaves_the_usage_frame_as_it_was() {
    let mut frame = UsageFrame::new(bytes::BytesMut::new(), "us", (1, 1, 0)).expect("fits");
    let rule = RuleName::try_from("api").expect("a valid rule name");
    frame.push(b"k", &rule, (1, 0, 5)).expect("fits");
    let len = frame.len();
    let long = vec![b'x'; usize::from(u16::MAX) + 1];
    let err = frame
        .push(&long, &rule, (1, 0, 5))
        .expect_err("a key longer than its field");
    assert!(matches!(err, EncodeError::TooLong { field: "key", .. }));
    assert_eq!((frame.len(), frame.entries()), (len, 1));
    let region = "x".repeat(256);
    let err = UsageFrame::new(bytes::BytesMut::new(), &region, (1, 1, 0))
        .expect_err("a region name longer than its length byte");
    assert!(matches!(
        err,
        EncodeError::TooLong {
            field: "region name",
            ..
        }
    ));
}
