//! Regions as real `tollgate serve` processes, and a hostile peer sending
//! USAGE by hand (a raw node connection with the cluster secret): what a
//! region reports and what it takes from others.
//!
//! Where one region must not hear from the other, its peer address is a
//! port nobody listens on: the exchange then runs one way only, and what
//! the receiving region holds of a key is exactly what its own clients and
//! the sender did.

use crate::common::{batch_of, http, rule, RawConn, TempDir};
use crate::harness::{eventually, free_addr, Node, CLUSTER_SECRET};
use serde_json::Value;
use std::net::SocketAddr;
use tollgate_protocol::{
    CheckResult, Decision, ErrorCode, Request, Response, UsageEntry, UsageReport,
};

/// A token bucket of 1,000 a day: it refills one unit every 86 s, so a
/// test sees at most one. `lonely` lists a and a region no node here
/// exchanges with.
pub const RULES: &str = "\
rules:
  - name: daily
    algorithm: token-bucket
    rate: 1000/day
    global: [a, b, c]
  - name: lonely
    algorithm: token-bucket
    rate: 1000/day
    global: [a, zz]
";

/// A region's process: `name`, listening on `addr`, its one peer region
/// `peer` at `peer_addr`, exchanging every 100 ms; `extra` flags after.
pub fn region(
    dir: &TempDir,
    name: &str,
    addr: &str,
    peer: &str,
    peer_addr: &str,
    extra: &[&str],
) -> Node {
    region_every(dir, (name, addr), (peer, peer_addr), "100ms", extra)
}

/// [`region`] exchanging every `interval`.
pub fn region_every(
    dir: &TempDir,
    (name, addr): (&str, &str),
    (peer, peer_addr): (&str, &str),
    interval: &str,
    extra: &[&str],
) -> Node {
    let rules = dir.path("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let peer_flag = format!("{peer}={peer_addr}");
    let mut args = vec![
        "--rules",
        rules.to_str().unwrap(),
        "--region",
        name,
        "--region-peer",
        &peer_flag,
        "--exchange-interval",
        interval,
    ];
    // A peer that never answers must not cap the checks of a test, unless
    // the test says otherwise.
    if !extra.contains(&"--region-stall-intervals") {
        args.extend(["--region-stall-intervals", "100000"]);
    }
    args.extend_from_slice(extra);
    Node::start(addr, &args)
}

pub fn sock(addr: &str) -> SocketAddr {
    addr.parse().unwrap()
}

/// A connection that proved the cluster secret, as a peer region's.
pub async fn as_node(addr: &str) -> RawConn {
    let mut c = RawConn::connect(sock(addr)).await;
    match c
        .node_hello(CLUSTER_SECRET, tollgate_protocol::NodeScope::Cluster)
        .await
    {
        Some(Response::HelloOk { .. }) => c,
        other => panic!("HELLO: {other:?}"),
    }
}

/// PEEK of `key` under `daily`.
pub async fn peek(addr: &str, key: &str) -> Decision {
    let mut c = RawConn::ready(sock(addr)).await;
    c.send(
        2,
        &Request::Peek(batch_of(vec![vec![rule(key, "daily", 1)]])),
    )
    .await;
    match c.recv().await {
        (2, Response::Checked(r)) => match &r[0] {
            CheckResult::Decision(d) => *d,
            other => panic!("PEEK: {other:?}"),
        },
        other => panic!("PEEK: {other:?}"),
    }
}

/// CHECK (or REFUND) of `cost` units of `key` under `daily`.
pub async fn charge(addr: &str, key: &str, cost: u32, refund: bool) -> Decision {
    charge_under(addr, (key, "daily"), cost, refund).await
}

/// [`charge`] under the rule `rule_name`.
pub async fn charge_under(
    addr: &str,
    (key, rule_name): (&str, &str),
    cost: u32,
    refund: bool,
) -> Decision {
    let mut c = RawConn::ready(sock(addr)).await;
    let batch = batch_of(vec![vec![rule(key, rule_name, cost)]]);
    let req = if refund {
        Request::Refund(batch)
    } else {
        Request::Check(batch)
    };
    c.send(2, &req).await;
    match c.recv().await {
        (2, Response::Checked(r)) => match &r[0] {
            CheckResult::Decision(d) => *d,
            other => panic!("CHECK: {other:?}"),
        },
        other => panic!("CHECK: {other:?}"),
    }
}

/// `GET /v1/regions` of a node.
pub async fn regions_status(node: &Node) -> Value {
    let answer = http(sock(&node.admin), "GET", "/v1/regions", None).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    answer.json()
}

/// A number out of peer `peer`'s entry in a node's `/v1/regions`.
pub async fn peer_field(node: &Node, peer: &str, field: &str) -> u64 {
    let s = regions_status(node).await;
    s["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["region"] == peer)
        .unwrap_or_else(|| panic!("no peer {peer} in {s}"))[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {s}"))
}

/// Waits until `node` has had `n` more of its USAGE messages answered by
/// `peer`: whatever it journaled before has reached the peer by then.
pub async fn exchanged(node: &Node, peer: &str, n: u64) {
    let from = peer_field(node, peer, "messages_acked").await;
    eventually("USAGE answered by the peer", || async {
        (peer_field(node, peer, "messages_acked").await >= from + n).then_some(())
    })
    .await;
}

/// Wall-clock ns, as a sender stamps `at`.
pub fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

pub fn usage(region: &str, session: u64, seq: u64, entries: Vec<UsageEntry>) -> UsageReport {
    UsageReport {
        region: region.into(),
        session,
        seq,
        sent_at: wall_ns(),
        entries,
    }
}

pub fn entry(key: &str, charged: u64, refunded: u64) -> UsageEntry {
    UsageEntry {
        key: bytes::Bytes::copy_from_slice(key.as_bytes()),
        rule: "daily".try_into().unwrap(),
        charged,
        refunded,
        at: wall_ns(),
    }
}

/// Sends `report` on `conn` and returns its answer: the ack, or the error.
pub async fn send_usage(
    conn: &mut RawConn,
    id: u32,
    report: UsageReport,
) -> Result<tollgate_protocol::UsageAck, (ErrorCode, String)> {
    conn.send(id, &Request::Usage(report)).await;
    match conn.recv().await {
        (got, Response::UsageOk(ack)) if got == id => Ok(ack),
        (got, Response::Error { code, message }) if got == id => Err((code, message)),
        other => panic!("USAGE: {other:?}"),
    }
}

/// Regions `a` and `b` (nodes and addresses), `a` reporting to `b` and `b`
/// to nobody (a port nobody listens on): what `b` holds of a key is what
/// its own clients and `a`'s reports made it, and `a`'s copy of a key is
/// never touched by `b`.
fn a_reports_to_b(dir: &TempDir) -> (Node, String, Node, String) {
    let (a_addr, b_addr, nowhere) = (free_addr(), free_addr(), free_addr());
    let a = region(dir, "a", &a_addr, "b", &b_addr, &[]);
    let b = region(dir, "b", &b_addr, "a", &nowhere, &[]);
    (a, a_addr, b, b_addr)
}

/// The checks of one frame are recorded together once the frame is
/// evaluated: every one of them reaches the peer, the frame's first, its
/// last and those past the sixteen kept on the stack, a key too long to be
/// held inline, and a global pair beside an inline one; a REFUND frame's
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_global_check_of_a_frame_reaches_the_peer() {
    let dir = TempDir::new("frame-usage");
    let (a, a_addr, b, b_addr) = a_reports_to_b(&dir);
    let first = "rl:{tenant}:frame-first";
    let long = "rl:{tenant}:a-key-far-longer-than-twenty-two-bytes";
    let beside = "rl:{tenant}:beside-an-inline-pair";
    let last = "rl:{tenant}:frame-last";
    let mut checks = vec![vec![rule(first, "daily", 3)], vec![rule(long, "daily", 11)]];
    checks.push(vec![
        rule(beside, "daily", 5),
        crate::common::tb("rl:{tenant}:inline", 100, 1000, 100, 1),
    ]);
    // Twenty checks of cost 1: past the sixteen records a frame keeps inline.
    checks.extend((0..20).map(|_| vec![rule(first, "daily", 1)]));
    checks.push(vec![rule(last, "daily", 7)]);
    let mut c = RawConn::ready(sock(&a_addr)).await;
    let results = c.check(2, batch_of(checks)).await;
    assert!(results.iter().all(crate::common::allowed), "{results:?}");
    exchanged(&a, "b", 2).await;
    // What a PEEK of one unit leaves is the rest less that unit; one unit
    // may refill meanwhile (one every 86 s).
    let used = |d: Decision| 999 - d.remaining;
    for (key, charged) in [(first, 23), (long, 11), (beside, 5), (last, 7)] {
        let got = used(peek(&b_addr, key).await);
        assert!(
            (charged - 1..=charged).contains(&got),
            "b holds {got} of {key}, a charged {charged} in one frame"
        );
    }
    let refunds = batch_of(vec![
        vec![rule(first, "daily", 4)],
        vec![rule(last, "daily", 2)],
    ]);
    c.send(3, &Request::Refund(refunds)).await;
    match c.recv().await {
        (3, Response::Checked(r)) => assert!(r.iter().all(crate::common::allowed), "{r:?}"),
        other => panic!("REFUND: {other:?}"),
    }
    exchanged(&a, "b", 2).await;
    for (key, net) in [(first, 19), (last, 5)] {
        let got = used(peek(&b_addr, key).await);
        assert!(
            (net - 1..=net).contains(&got),
            "b holds {got} of {key}, a's charges less its refunds are {net}"
        );
    }
    drop(b);
}

/// A refund of 4e9 units on a key region `a` never charged reports nothing
/// to `b`: b's usage of the key stays what b's own clients made it. (It
/// used to report the 4e9 asked for, which emptied the key in b.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_an_untouched_global_key_leaves_the_other_region_alone() {
    let dir = TempDir::new("refund-untouched");
    let (a, a_addr, b, b_addr) = a_reports_to_b(&dir);
    let key = "rl:{tenant}:refunded-elsewhere";
    assert!(charge(&b_addr, key, 100, false).await.allowed);
    let before = peek(&b_addr, key).await.remaining;
    assert!(before <= 900, "b charged 100 of 1000: {before}");

    let refunded = charge(&a_addr, key, 4_000_000_000, true).await;
    assert!(refunded.allowed);
    // a's journal (had it anything) is at b after two more answered USAGE.
    exchanged(&a, "b", 2).await;
    let after = peek(&b_addr, key).await.remaining;
    // One unit may refill meanwhile (one every 86 s).
    assert!(
        (before..=before + 1).contains(&after),
        "b's usage of the key changed by a refund in a: {before} -> {after}"
    );
    // The same in a: an ordinary refund of what a charged is still reported.
    assert!(charge(&a_addr, key, 50, false).await.allowed);
    assert!(charge(&a_addr, key, 20, true).await.allowed);
    exchanged(&a, "b", 2).await;
    let net = peek(&b_addr, key).await.remaining;
    assert!(
        (after - 30..=after - 29).contains(&net),
        "b holds a's 50 charged less 20 refunded: {after} -> {net}"
    );
    drop(b);
}

/// A refund in a of a key only b charged, whose usage a already absorbed
/// from b's reports, gives none of it back in b, nor in a's own copy: a
/// gives back and reports only what it charged itself (its ceiling key's
/// count). Before, a's copy gave the 100 back, and a admitted them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_one_region_gives_back_none_of_anothers_reported_usage() {
    let dir = TempDir::new("refund-reported");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a = region(&dir, "a", &a_addr, "b", &b_addr, &[]);
    let b = region(&dir, "b", &b_addr, "a", &a_addr, &[]);
    let key = "rl:{tenant}:used-in-b";
    assert!(charge(&b_addr, key, 100, false).await.allowed);
    exchanged(&b, "a", 2).await;
    let in_a = peek(&a_addr, key).await.remaining;
    assert!(in_a <= 900, "a absorbed b's 100 of 1000: {in_a}");
    let before = peek(&b_addr, key).await.remaining;

    let refunded = charge(&a_addr, key, 4_000_000_000, true).await;
    assert!(refunded.allowed);
    exchanged(&a, "b", 2).await;
    let after = peek(&b_addr, key).await.remaining;
    // One unit may refill meanwhile (one every 86 s).
    assert!(
        (before..=before + 1).contains(&after),
        "b's own usage given back by a refund in a: {before} -> {after}"
    );
    let kept = peek(&a_addr, key).await.remaining;
    assert!(
        (in_a..=in_a + 1).contains(&kept),
        "a's copy gave back b's usage: {in_a} -> {kept}"
    );
    // What a charged itself it gets back, and no more.
    assert!(charge(&a_addr, key, 50, false).await.allowed);
    assert!(charge(&a_addr, key, 80, true).await.allowed);
    let own = peek(&a_addr, key).await.remaining;
    assert!(
        (kept..=kept + 1).contains(&own),
        "a gave back its own 50 and nothing of b's: {kept} -> {own}"
    );
}

/// A rule listing this region and only regions it does not exchange with
/// is regional here: no ceiling caps what a REFUND gives back. (With one,
/// the 900 charged at once were past the ceiling's 500, never counted in
/// it, and so never given back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_rule_naming_no_peer_here_is_regional() {
    let dir = TempDir::new("lonely");
    let (a_addr, nowhere) = (free_addr(), free_addr());
    let a = region(
        &dir,
        "a",
        &a_addr,
        "b",
        &nowhere,
        &["--region-stall-intervals", "2"],
    );
    let key = "rl:{tenant}:lonely";
    let d = charge_under(&a_addr, (key, "lonely"), 900, false).await;
    assert_eq!((d.allowed, d.remaining), (true, 100));
    let d = charge_under(&a_addr, (key, "lonely"), 900, true).await;
    assert_eq!(d.remaining, 1000, "the refund gave back all 900: {d:?}");
    // b never answers: its stall is said once, naming it (rules shared
    // with it may be capped from then on).
    let stalled = "usage exchange with a peer region stalled: global rules shared with it may be capped at this region's ceiling";
    eventually("the stalled peer logged", || async {
        (!a.logged(stalled).is_empty()).then_some(())
    })
    .await;
    let lines = a.logged(stalled);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["peer"], "b", "{lines:?}");
}

/// A USAGE whose numbers are as large as the wire allows is answered (the
/// refund is one step, not 2^32 under a stripe lock), and the node keeps
/// serving the key and every other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_with_huge_numbers_is_answered_and_the_node_serves_on() {
    let dir = TempDir::new("huge-usage");
    let (a_addr, nowhere) = (free_addr(), free_addr());
    let _a = region(&dir, "a", &a_addr, "b", &nowhere, &[]);
    let key = "rl:{tenant}:huge";
    assert!(charge(&a_addr, key, 10, false).await.allowed);
    let mut peer = as_node(&a_addr).await;
    let report = usage(
        "b",
        1,
        1,
        vec![
            entry(key, u64::MAX, u64::MAX),
            entry("rl:{tenant}:huge-2", 1, u64::MAX),
            entry("rl:{tenant}:huge-3", u64::MAX, 0),
        ],
    );
    // Before the fix this answer never came within the test's patience.
    let ack = send_usage(&mut peer, 3, report).await.expect("applied");
    assert!(!ack.duplicate);
    // Charged and refunded everything: the key is empty again, a's own 10
    // included (a refund empties the bucket, whoever charged it).
    assert_eq!(peek(&a_addr, key).await.remaining, 999);
    // Charged u64::MAX: denied, and the node answers that.
    assert!(
        !charge(&a_addr, "rl:{tenant}:huge-3", 1, false)
            .await
            .allowed
    );
    assert!(charge(&a_addr, "rl:{other}:k", 1, false).await.allowed);
}

/// A secret shared by two regions (`--region-peer-secret`) binds a
/// connection to the region it names: the exchange between a and b runs
/// under it; at a, a connection proving the cluster secret may no longer
/// speak for b, and one proving b's secret may speak for b alone. Nothing
/// refused is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_regions_own_secret_binds_its_connections_to_it() {
    const AB: &str = "secret-of-regions-a-and-b";
    let dir = TempDir::new("peer-secret");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let (at_a, at_b) = (format!("b={AB}"), format!("a={AB}"));
    let a = region(
        &dir,
        "a",
        &a_addr,
        "b",
        &b_addr,
        &["--region-peer-secret", &at_a],
    );
    let b = region(
        &dir,
        "b",
        &b_addr,
        "a",
        &a_addr,
        &["--region-peer-secret", &at_b],
    );
    let key = "rl:{tenant}:paired";
    assert!(charge(&b_addr, key, 100, false).await.allowed);
    exchanged(&b, "a", 2).await;
    let in_a = peek(&a_addr, key).await.remaining;
    assert!(in_a <= 900, "a absorbed b's 100 under their secret: {in_a}");

    let forged = "rl:{tenant}:forged";
    let report = |region: &str| usage(region, u64::MAX / 2, 1, vec![entry(forged, 500, 0)]);
    let mut node = as_node(&a_addr).await;
    let (code, message) = send_usage(&mut node, 5, report("b")).await.unwrap_err();
    assert_eq!(code, ErrorCode::AuthFailed, "{message}");
    assert!(message.contains("--region-peer-secret"), "{message}");

    let mut as_b = RawConn::connect(sock(&a_addr)).await;
    match as_b
        .node_hello(AB, tollgate_protocol::NodeScope::Region)
        .await
    {
        Some(Response::HelloOk { .. }) => {}
        other => panic!("HELLO proving b's secret: {other:?}"),
    }
    let (code, message) = send_usage(&mut as_b, 6, report("c")).await.unwrap_err();
    assert_eq!(code, ErrorCode::AuthFailed, "{message}");
    assert_eq!(
        peek(&a_addr, forged).await.remaining,
        999,
        "nothing charged (a peek of a fresh key leaves its cost of 1)"
    );
    drop((a, b));
}
