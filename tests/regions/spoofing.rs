//! A peer that lies about who it is: USAGE names the region it claims to
//! be, over a node connection any holder of the cluster secret can open.
//! The receiver takes only regions it exchanges with (`--region-peer`),
//! holds each connection to the first region it spoke for, and refuses a
//! session older than the one the region is sending in.

use crate::common::TempDir;
use crate::harness::free_addr;
use crate::process::{as_node, charge, entry, exchanged, peek, region, send_usage, usage, wall_ns};
use tollgate_protocol::ErrorCode;

/// Region `a` exchanging with `b` and `c`, neither of which runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_speaks_for_one_configured_region_only() {
    let dir = TempDir::new("spoof-region");
    let (a_addr, b_addr, c_addr) = (free_addr(), free_addr(), free_addr());
    let c_peer = format!("c={c_addr}");
    let _a = region(
        &dir,
        "a",
        &a_addr,
        "b",
        &b_addr,
        &["--region-peer", &c_peer],
    );
    let key = "rl:{tenant}:spoofed";
    let fresh = peek(&a_addr, key).await.remaining;

    let mut link = as_node(&a_addr).await;
    // A region a does not exchange with: refused, nothing charged.
    let (code, message) = send_usage(&mut link, 2, usage("mars", 1, 1, vec![entry(key, 500, 0)]))
        .await
        .unwrap_err();
    assert_eq!(code, ErrorCode::Malformed);
    assert!(message.contains("mars"), "{message}");
    // b: applied, and the link now speaks for b.
    let ack = send_usage(&mut link, 3, usage("b", 1, 1, vec![entry(key, 10, 0)]))
        .await
        .expect("b is a peer");
    assert_eq!(ack.region, "a");
    // The same link claiming c: refused, nothing charged.
    let (code, message) = send_usage(&mut link, 4, usage("c", 1, 1, vec![entry(key, 500, 0)]))
        .await
        .unwrap_err();
    assert_eq!(code, ErrorCode::AuthFailed);
    assert!(message.contains("\"b\""), "{message}");
    assert_eq!(peek(&a_addr, key).await.remaining, fresh - 10);
    // Its own region again: still served.
    send_usage(&mut link, 5, usage("b", 1, 2, vec![entry(key, 1, 0)]))
        .await
        .expect("b again");
    assert_eq!(peek(&a_addr, key).await.remaining, fresh - 11);
}

/// b runs and exchanges with a; a spoofer (or b's primary before a
/// failover) sends USAGE as b in an older session: refused while b's own
/// session is live, and nothing of it is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_of_an_older_session_is_refused_while_the_region_sends_in_a_newer() {
    let dir = TempDir::new("spoof-session");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let _a = region(&dir, "a", &a_addr, "b", &b_addr, &[]);
    let b = region(&dir, "b", &b_addr, "a", &a_addr, &[]);
    exchanged(&b, "a", 2).await;
    let key = "rl:{tenant}:replayed";
    assert!(charge(&b_addr, key, 10, false).await.allowed);
    exchanged(&b, "a", 2).await;
    let before = peek(&a_addr, key).await.remaining;
    assert!(before < 1000 - 10, "b's 10 reached a: {before}");

    let mut spoofer = as_node(&a_addr).await;
    // b's session is the time it became primary, before this.
    let older = usage("b", wall_ns() - 60_000_000_000, 1, vec![entry(key, 500, 0)]);
    let (code, message) = send_usage(&mut spoofer, 2, older).await.unwrap_err();
    assert_eq!(code, ErrorCode::Malformed);
    assert!(message.contains("older"), "{message}");
    // Session 1, the lowest there is: the same.
    let (code, _) = send_usage(&mut spoofer, 3, usage("b", 1, 1, vec![entry(key, 500, 0)]))
        .await
        .unwrap_err();
    assert_eq!(code, ErrorCode::Malformed);
    // b itself carries on.
    assert!(charge(&b_addr, key, 5, false).await.allowed);
    exchanged(&b, "a", 2).await;
    let after = peek(&a_addr, key).await.remaining;
    assert!(
        (before - 5..=before - 4).contains(&after),
        "only b's own 5 more: {before} -> {after}"
    );
}
