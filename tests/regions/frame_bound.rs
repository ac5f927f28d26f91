//! A USAGE filled to `--exchange-max-bytes` still fits the receiver's
//! frame when that is the frame's size (the default: 1 MiB each). The
//! frame's body is the opcode and request id (5 bytes) and then the
//! message; the sender capped the message alone at `--max-frame`, so a
//! full one was 5 bytes too large, refused FrameTooLarge, resent as it was
//! and refused again: once a peer had been away long enough for its
//! backlog to fill a message, the exchange with it never resumed.
//!
//! Here both regions take frames of 8 KiB and messages of 8 KiB, and the
//! keys are sized so that messages fill exactly: 2,000 keys of 21 bytes
//! under `daily`, 53 bytes an entry, 154 of them after a 30-byte header
//! make 8,192 bytes.
//!
//! And a receiver whose frames are smaller than the sender's messages (8
//! KiB against the default 1 MiB): the sender seals to the `max_frame` the
//! receiver's HELLO_OK tells (PROTOCOL.md §16), and what it sealed before
//! it knew goes back to be sealed again; before, every message was refused
//! FrameTooLarge and resent as it was, for good.

use crate::common::{batch_of, http, rule, RawConn, TempDir};
use crate::harness::{eventually, free_addr, Node};
use crate::process::{peer_field, region, sock};

const KEYS: u64 = 2_000;
const FLAGS: &[&str] = &["--max-frame", "8KiB", "--exchange-max-bytes", "8KiB"];

/// `tollgate_protocol_errors_total{code="FrameTooLarge"}` of a node.
async fn frames_too_large(node: &Node) -> u64 {
    let answer = http(sock(&node.admin), "GET", "/metrics", None).await;
    let text = answer.text();
    text.lines()
        .find_map(|l| l.strip_prefix(r#"tollgate_protocol_errors_total{code="FrameTooLarge"} "#))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_message_fits_the_peers_frame() {
    every_key_reaches_b("frame-bound", FLAGS, FLAGS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_fit_a_peer_that_takes_smaller_frames() {
    every_key_reaches_b("frame-smaller", &[], &["--max-frame", "8KiB"]).await;
}

/// Region a's clients check `KEYS` keys while b is down (the usage waits
/// for it), then b starts: every key reaches it, and no USAGE is refused.
async fn every_key_reaches_b(name: &str, a_flags: &[&str], b_flags: &[&str]) {
    let dir = TempDir::new(name);
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = region(&dir, "a", &a_addr, "b", &b_addr, a_flags);
    let mut c = RawConn::ready(sock(&a_addr)).await;
    for (id, first) in (0..KEYS).step_by(100).enumerate() {
        let checks = (first..first + 100)
            .map(|i| {
                let key = format!("rl:{{frame-{i:05}}}:xxxx");
                assert_eq!(key.len(), 21);
                vec![rule(&key, "daily", 1)]
            })
            .collect();
        let results = c.check(id as u32 + 2, batch_of(checks)).await;
        assert!(results.iter().all(crate::common::allowed));
    }
    let b = region(&dir, "b", &b_addr, "a", &a_addr, b_flags);
    // Every key reaches b, or b refuses a message as too large (which a
    // would resend, refused again, for good).
    let (received, too_large) = eventually("a's usage at b, or a refusal", || async {
        let received = peer_field(&b, "a", "keys_received").await;
        let too_large = frames_too_large(&b).await;
        (received == KEYS || too_large > 0).then_some((received, too_large))
    })
    .await;
    assert_eq!(
        (received, too_large),
        (KEYS, 0),
        "b took {received} of {KEYS} keys and refused {too_large} USAGE frames as too large"
    );
    drop((a, b));
}
