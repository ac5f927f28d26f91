//! A backlog of usage is drained at once: when more is waiting than one
//! USAGE holds (`--exchange-max-bytes`), the sender sends the next message
//! as soon as the peer has answered the last, within the same interval,
//! rather than one message per interval (which would leave a large backlog
//! unseen by the peers for many intervals).
//!
//! Region a's peer b is down while a's clients check 2,000 keys under a
//! global rule (about 60 KiB of usage, 15 messages at the 4 KiB cap); b
//! then starts. With a 5 s interval a's next tick resends its one
//! unanswered message and must then drain the rest: every key reaches b
//! before the tick after it (one message per interval would take 15
//! intervals, over a minute).

use crate::common::{batch_of, rule, RawConn, TempDir};
use crate::harness::{eventually, free_addr, Node};
use crate::process::{peer_field, region_every, sock};

const KEYS: u64 = 2_000;
const INTERVAL_MS: u64 = 5_000;

/// A region exchanging every `INTERVAL_MS`, at most 4 KiB a message.
fn region(dir: &TempDir, name: &str, addr: &str, peer: &str, peer_addr: &str) -> Node {
    let interval = format!("{INTERVAL_MS}ms");
    region_every(
        dir,
        (name, addr),
        (peer, peer_addr),
        &interval,
        &["--exchange-max-bytes", "4KiB"],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_sent_message_after_message_within_one_interval() {
    let dir = TempDir::new("drain");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = region(&dir, "a", &a_addr, "b", &b_addr);
    let mut c = RawConn::ready(sock(&a_addr)).await;
    for (id, first) in (0..KEYS).step_by(500).enumerate() {
        let checks = (first..first + 500)
            .map(|i| vec![rule(&format!("rl:{{drain-{i:05}}}"), "daily", 1)])
            .collect();
        let results = c.check(id as u32 + 2, batch_of(checks)).await;
        assert!(results.iter().all(crate::common::allowed));
    }
    let b = region(&dir, "b", &b_addr, "a", &a_addr);
    // The first USAGE b takes from a (at a's next tick).
    eventually("a's first message at b", || async {
        (peer_field(&b, "a", "keys_received").await > 0).then_some(())
    })
    .await;
    let first_seen = std::time::Instant::now();
    let mut received = 0;
    // Well inside one interval: the rest follows message after message.
    while first_seen.elapsed() < std::time::Duration::from_millis(INTERVAL_MS / 2) {
        received = peer_field(&b, "a", "keys_received").await;
        if received == KEYS {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        received, KEYS,
        "a's backlog was not drained within the interval"
    );
    assert!(peer_field(&a, "b", "messages_acked").await >= 15);
    drop((a, b));
}
