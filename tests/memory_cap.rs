//! The memory cap on a real server: filling the store past `--max-memory`
//! never takes the server down; it follows the configured policy.

mod common;

use common::*;
use tollgate::config::OnFull;
use tollgate_protocol::{CheckResult, ErrorCode, Request, Response};

const CAP: usize = 16 * (16 << 10);

async fn fill(conn: &mut RawConn, rounds: u32) -> (usize, usize) {
    let (mut allowed, mut full) = (0, 0);
    for round in 0..rounds {
        let checks = (0..1000)
            .map(|i| vec![tb(&format!("fill:{round}:{i}"), 1, 60_000, 5, 1)])
            .collect();
        for r in conn.check(round + 10, batch_of(checks)).await {
            match r {
                CheckResult::Decision(d) if d.allowed => allowed += 1,
                CheckResult::Error(ErrorCode::StoreFull) => full += 1,
                other => panic!("{other:?}"),
            }
        }
    }
    (allowed, full)
}

#[tokio::test]
async fn refuse_policy_refuses_new_keys_and_serves_the_rest() {
    let server = TestServer::start_with(|c| {
        c.store.stripes = 16;
        c.store.max_memory = Some(CAP);
        c.store.on_full = OnFull::Refuse;
    })
    .await;
    let mut conn = RawConn::ready(server.addr).await;
    let first = conn
        .check(1, batch_of(vec![vec![tb("old", 1, 60_000, 5, 1)]]))
        .await;
    assert!(allowed(&first[0]));
    let (allowed_n, full) = fill(&mut conn, 30).await;
    assert!(full > 0, "the cap was never reached ({allowed_n} keys)");
    assert!(
        server.store.memory_bytes() <= CAP,
        "{}",
        server.store.memory_bytes()
    );
    assert_eq!(server.store.refused(), full as u64);
    // The server keeps serving: PING, and a key that has state.
    conn.send(2, &Request::Ping).await;
    assert_eq!(conn.recv().await, (2, Response::Pong));
    let again = conn
        .check(3, batch_of(vec![vec![tb("old", 1, 60_000, 5, 1)]]))
        .await;
    match again[0] {
        CheckResult::Decision(d) => assert_eq!((d.allowed, d.remaining), (true, 3)),
        other => panic!("{other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn evict_policy_keeps_taking_new_keys_within_the_cap() {
    let server = TestServer::start_with(|c| {
        c.store.stripes = 16;
        c.store.max_memory = Some(CAP);
        c.store.on_full = OnFull::Evict;
    })
    .await;
    let mut conn = RawConn::ready(server.addr).await;
    let (allowed_n, full) = fill(&mut conn, 30).await;
    assert_eq!((allowed_n, full), (30_000, 0));
    assert!(
        server.store.memory_bytes() <= CAP,
        "{}",
        server.store.memory_bytes()
    );
    assert!(server.store.evicted() > 0);
    assert!(server.store.len() < 30_000);
    conn.send(2, &Request::Ping).await;
    assert_eq!(conn.recv().await, (2, Response::Pong));
    server.stop().await;
}

/// Keys that expire give their memory back: a stripe whose table grew for a
/// burst of keys under one hash tag does not keep that table once the
/// sweeper has dropped them (it used to keep every table at the largest
/// size it ever had, so a server's memory only ever went up: each stripe
/// held room for its busiest tag's burst, with no key left).
#[tokio::test]
async fn expired_keys_give_their_tables_memory_back() {
    let server = TestServer::start_with(|c| {
        c.store.stripes = 16;
        c.store.sweep_interval = std::time::Duration::from_millis(10);
        c.store.sweep_stripes = 16;
    })
    .await;
    let idle = server.store.memory_bytes();
    let mut conn = RawConn::ready(server.addr).await;
    for round in 0..3u32 {
        // 20,000 keys of one tag, one stripe; each expires 1 ms after its
        // check (1,000 tokens a second, a full bucket after one).
        for part in 0..20u32 {
            let checks = (0..1000)
                .map(|i| vec![tb(&format!("{{t}}:{part}:{i}"), 1000, 1000, 1000, 1)])
                .collect();
            for r in conn.check(round * 100 + part + 10, batch_of(checks)).await {
                assert!(allowed(&r), "{r:?}");
            }
        }
        let grown = server.store.memory_bytes();
        assert!(grown > idle + 20_000 * 24, "{grown} after 20,000 keys");
        // Only the sweeper drops them (nothing checks them again), and it
        // gives a stripe's room back in the same visit.
        server.clock.advance(std::time::Duration::from_secs(1));
        eventually("the sweeper drops every key", || async {
            server.store.is_empty().then_some(())
        })
        .await;
        assert!(
            server.store.memory_bytes() <= idle,
            "round {round}: {} bytes held with no key (idle: {idle}, at 20,000 keys: {grown})",
            server.store.memory_bytes()
        );
    }
    server.stop().await;
}
