//! The usage a region holds for a peer region that is down is bounded by
//! `--region-journal-max-bytes`, whatever its clients check: a real
//! `tollgate serve` process checks 250,000 distinct keys under a global
//! rule while its only peer is not running, stays within a resident-memory
//! bound derived from its settings, counts what it dropped, and once the
//! peer starts reports everything it kept.
//!
//! Smaller than the scenario (1,000,000 keys over 60 s) with the
//! same meaning: how long the peer is down does not matter, the journal
//! grows with the distinct keys checked meanwhile, not with time (a key
//! checked again adds to its entry), so the keys go through as fast as a
//! debug build takes them (about 11 s). And what is shown is a bound, not a
//! rate: with a 1 MiB cap (the default is 64 MiB) the journal is full after
//! a few thousand keys, and the remaining 240,000-odd prove it stays full
//! as they would 1,000,000. Without the bound the same run grew by 78 MiB
//! (about 330 bytes a key, so some 300 MiB for the million); with
//! it, by 24 MiB, most of it the store's own 16 MiB.

use crate::common::{batch_of, http, rule, RawConn, TempDir};
use crate::harness::{eventually, free_addr, Node};
use crate::process::{peer_field, region, sock};
use tokio::task::JoinSet;
use tollgate_protocol::{Request, Response};

const KEYS: u64 = 250_000;
const MIB: u64 = 1 << 20;
/// Checks in one frame (the default `--max-batch` is 1024).
const BATCH: u64 = 1000;
/// Connections sending at once.
const SENDERS: u64 = 4;
const JOURNAL_CAP: &str = "1MiB";
const STORE_CAP: &str = "16MiB";

/// The resident set (VmRSS) of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("it runs");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .expect("VmRSS")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib << 10
}

/// A series of `/metrics` (with its labels, e.g. `{peer="b"}`), 0 if absent.
async fn metric(node: &Node, series: &str) -> u64 {
    let text = http(sock(&node.admin), "GET", "/metrics", None)
        .await
        .text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse::<f64>().unwrap() as u64)
}

/// Sender `which` of `SENDERS` checks its share of the keys, one frame of
/// `BATCH` at a time.
async fn check_keys(addr: String, which: u64) {
    let mut c = RawConn::ready(sock(&addr)).await;
    let mut id = 1;
    let mut first = which * BATCH;
    while first < KEYS {
        let checks = (first..(first + BATCH).min(KEYS))
            .map(|i| vec![rule(&format!("rl:{{tenant-{i:07}}}"), "daily", 1)])
            .collect();
        id += 1;
        c.send(id, &Request::Check(batch_of(checks))).await;
        match c.recv().await {
            (got, Response::Checked(r)) if got == id => {
                assert!(r.iter().all(crate::common::allowed), "a key denied")
            }
            other => panic!("CHECK: {other:?}"),
        }
        first += SENDERS * BATCH;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_for_a_peer_that_is_down_stay_within_the_journal_bound() {
    let dir = TempDir::new("journal-bound");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = region(
        &dir,
        "a",
        &a_addr,
        "b",
        &b_addr,
        &[
            "--region-journal-max-bytes",
            JOURNAL_CAP,
            "--max-memory",
            STORE_CAP,
        ],
    );
    let before = rss(a.pid());
    let started = std::time::Instant::now();
    let mut senders = JoinSet::new();
    for which in 0..SENDERS {
        senders.spawn(check_keys(a_addr.clone(), which));
    }
    while let Some(done) = senders.join_next().await {
        done.unwrap();
    }
    let after = rss(a.pid());
    eprintln!("{KEYS} keys checked in {:?}", started.elapsed());
    // Baseline, the store's cap, the journal's cap and one unanswered
    // message (1 MiB), the frames in flight, and the allocator's slack.
    let bound = before + 16 * MIB + MIB + MIB + 24 * MIB;
    eprintln!(
        "a: RSS {} MiB before, {} MiB after {KEYS} keys (bound {} MiB)",
        before / MIB,
        after / MIB,
        bound / MIB
    );
    assert!(after <= bound, "RSS {after} over {bound}");
    let dropped_series = "tollgate_region_entries_dropped_total{peer=\"b\"}";
    let dropped = metric(&a, dropped_series).await;
    assert!(dropped > KEYS / 2, "dropped {dropped} of {KEYS}");
    assert_eq!(
        metric(&a, "tollgate_region_usage_dropped_total{peer=\"b\"}").await,
        dropped,
        "one unit per dropped check"
    );

    // The peer starts: the exchange resumes and reports every key a kept,
    // so sent and dropped account for every key.
    let b = region(&dir, "b", &b_addr, "a", &a_addr, &[]);
    eventually("a reports everything it kept", || async {
        let sent = peer_field(&a, "b", "keys_sent").await;
        (sent + dropped == KEYS).then_some(sent)
    })
    .await;
    let received = peer_field(&b, "a", "keys_received").await;
    assert_eq!(received, KEYS - dropped, "b applied what a sent");
    assert_eq!(
        metric(&a, dropped_series).await,
        dropped,
        "nothing more dropped"
    );
}
