//! Black-box tests of the server over real sockets: pipelining, batches,
//! atomic groups, expiry and shutdown.

mod common;

use common::*;
use std::time::Duration;
use tollgate_protocol::{CheckResult, ErrorCode, Request, Response};

#[tokio::test]
async fn pipelined_requests_are_all_answered_by_id() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    // 200 requests in one write, before reading anything.
    let mut wire = bytes::BytesMut::new();
    for id in 1..=200u32 {
        let req = if id % 2 == 0 {
            Request::Ping
        } else {
            Request::Check(batch_of(vec![vec![tb(&format!("p{id}"), 5, 1000, 10, 1)]]))
        };
        tollgate_protocol::encode_request(id, &req, &mut wire).unwrap();
    }
    conn.send_raw(&wire).await;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 1..=200 {
        let (id, resp) = conn.recv().await;
        match (id % 2, resp) {
            (0, Response::Pong) => {}
            (1, Response::Checked(r)) => assert!(allowed(&r[0])),
            other => panic!("mismatched answer {other:?}"),
        }
        assert!(seen.insert(id), "answered twice: {id}");
    }
    assert_eq!(seen.len(), 200);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_over_admit() {
    let server = TestServer::start().await;
    // Burst 500 and a frozen clock: exactly 500 of 8 x 100 checks may pass.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let addr = server.addr;
            tokio::spawn(async move {
                let mut conn = RawConn::ready(addr).await;
                let mut ok = 0;
                for id in 0..10u32 {
                    let checks = (0..10)
                        .map(|_| vec![tb("shared", 1, 1000, 500, 1)])
                        .collect();
                    ok += conn
                        .check(id, batch_of(checks))
                        .await
                        .iter()
                        .filter(|r| allowed(r))
                        .count();
                }
                ok
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 500);
    server.stop().await;
}

#[tokio::test]
async fn one_frame_checks_many_independent_keys() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    let checks = (0..1000)
        .map(|i| vec![tb(&format!("user:{i}"), 5, 1000, 3, 1)])
        .collect();
    let results = conn.check(1, batch_of(checks)).await;
    assert_eq!(results.len(), 1000);
    for r in &results {
        match r {
            CheckResult::Decision(d) => assert_eq!((d.allowed, d.remaining), (true, 2)),
            e => panic!("{e:?}"),
        }
    }
    assert_eq!(server.store.len(), 1000);
    server.stop().await;
}

#[tokio::test]
async fn atomic_group_denial_charges_nothing() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    let second = || tb("rl:{key42}:second", 100, 1000, 200, 1);
    let day = || tb("rl:{key42}:day", 2, 86_400_000, 2, 1);
    for id in 0..2 {
        let r = conn.check(id, batch_of(vec![vec![second(), day()]])).await;
        assert!(allowed(&r[0]));
    }
    let before = server
        .store
        .get(b"rl:{key42}:second", server.clock_now())
        .unwrap();
    let r = conn.check(9, batch_of(vec![vec![second(), day()]])).await;
    match r[0] {
        CheckResult::Decision(d) => {
            assert!(!d.allowed);
            assert_eq!(d.pair, 1, "the day limit denied");
            assert_eq!(d.retry_after_ms, 43_200_000);
        }
        e => panic!("{e:?}"),
    }
    let after = server
        .store
        .get(b"rl:{key42}:second", server.clock_now())
        .unwrap();
    assert_eq!(before, after, "the passing pair was not charged");
    server.stop().await;
}

#[tokio::test]
async fn cross_slot_group_is_refused_while_the_rest_proceed() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    let results = conn
        .check(
            1,
            batch_of(vec![
                vec![tb("solo", 5, 1000, 10, 1)],
                vec![
                    tb("rl:{a}:x", 5, 1000, 10, 1),
                    tb("rl:{b}:x", 5, 1000, 10, 1),
                ],
                vec![
                    tb("rl:{c}:x", 5, 1000, 10, 1),
                    tb("rl:{c}:y", 5, 1000, 10, 1),
                ],
            ]),
        )
        .await;
    assert!(allowed(&results[0]));
    assert_eq!(results[1], CheckResult::Error(ErrorCode::CrossSlot));
    assert!(allowed(&results[2]));
    let now = server.clock_now();
    assert!(server.store.get(b"rl:{a}:x", now).is_none());
    assert!(server.store.get(b"rl:{b}:x", now).is_none());
    assert_eq!(server.store.len(), 3);
    server.stop().await;
}

#[tokio::test]
async fn peek_and_reset_over_the_wire() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    let one = || batch_of(vec![vec![tb("pk", 1, 1000, 1, 1)]]);
    conn.send(1, &Request::Peek(one())).await;
    assert!(matches!(conn.recv().await, (1, Response::Checked(r)) if allowed(&r[0])));
    assert!(server.store.is_empty(), "peek charged nothing");
    assert!(allowed(&conn.check(2, one()).await[0]));
    assert!(!allowed(&conn.check(3, one()).await[0]));
    conn.send(4, &Request::Reset(vec!["pk".into(), "never-seen".into()]))
        .await;
    assert_eq!(conn.recv().await, (4, Response::ResetDone(1)));
    assert!(allowed(&conn.check(5, one()).await[0]));
    server.stop().await;
}

#[tokio::test]
async fn idle_keys_expire_through_the_sweeper() {
    let server = TestServer::start_with(|c| {
        c.store.sweep_interval = Duration::from_millis(5);
        c.store.sweep_stripes = 256;
        c.store.stripes = 64;
    })
    .await;
    let mut conn = RawConn::ready(server.addr).await;
    let checks = (0..300)
        .map(|i| vec![tb(&format!("idle:{i}"), 10, 1000, 10, 1)])
        .collect();
    conn.check(1, batch_of(checks)).await;
    assert_eq!(server.store.len(), 300);
    // Full again 100 ms (server time) after one token was taken.
    server.clock.advance(Duration::from_millis(100));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !server.store.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sweeper did not expire keys"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The connection and the store keep working.
    assert!(allowed(
        &conn
            .check(2, batch_of(vec![vec![tb("idle:0", 10, 1000, 10, 1)]]))
            .await[0]
    ));
    server.stop().await;
}

#[tokio::test]
async fn shutdown_answers_requests_in_flight_then_closes() {
    let server =
        TestServer::start_with(|c| c.network.shutdown_grace = Duration::from_secs(5)).await;
    let mut conn = RawConn::ready(server.addr).await;
    let mut wire = bytes::BytesMut::new();
    for id in 1..=500u32 {
        let req = Request::Check(batch_of(vec![vec![tb("drain", 1, 1000, 1000, 1)]]));
        tollgate_protocol::encode_request(id, &req, &mut wire).unwrap();
    }
    conn.send_raw(&wire).await;
    // Shut down while those requests are in flight.
    server.shutdown.cancel();
    let mut answered = 0;
    loop {
        match conn.try_recv().await {
            Some((_, Response::Checked(r))) => {
                assert!(allowed(&r[0]));
                answered += 1;
            }
            Some((0, Response::Error { code, .. })) => {
                assert_eq!(code, ErrorCode::ShuttingDown);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        answered, 500,
        "every request sent before shutdown is answered"
    );
    conn.expect_closed().await;
    tokio::time::timeout(PATIENCE, server.join)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The counters reflect exactly the answered checks.
    let e = server.store.get(b"drain", 1000 * S).unwrap();
    assert!(
        matches!(e.state, tollgate::algorithm::State::TokenBucket { tat } if tat == 1000 * S + 500 * S)
    );
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "listener closed"
    );
}

/// A connection that was served and has gone quiet (asleep, its stops'
/// waits registered once) is still told of the drain and closed at once,
/// not when its idle timeout would end it.
#[tokio::test]
async fn shutdown_reaches_a_connection_asleep_after_serving() {
    let server = TestServer::start_with(|c| {
        // No timer of the connection's fires within the test's patience:
        // only the drain can wake it.
        c.network.shutdown_grace = Duration::from_secs(30);
        c.network.idle_timeout = Duration::from_secs(60);
        c.network.handshake_timeout = Duration::from_secs(60);
    })
    .await;
    let mut conn = RawConn::ready(server.addr).await;
    for id in 1..=3u32 {
        let results = conn
            .check(id, batch_of(vec![vec![tb("asleep", 10, 1000, 10, 1)]]))
            .await;
        assert!(allowed(&results[0]));
        // Asleep between checks: each read finds the socket drained.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown.cancel();
    match conn.try_recv().await {
        Some((0, Response::Error { code, .. })) => assert_eq!(code, ErrorCode::ShuttingDown),
        other => panic!("expected ShuttingDown within {PATIENCE:?}: {other:?}"),
    }
    conn.expect_closed().await;
    // Already cancelled: this waits for the drain to end.
    server.stop().await;
}

#[tokio::test]
async fn shutdown_grace_cuts_off_a_client_that_never_reads() {
    let server =
        TestServer::start_with(|c| c.network.shutdown_grace = Duration::from_millis(200)).await;
    // A client mid-frame that never completes it: draining cannot finish it.
    let mut conn = RawConn::ready(server.addr).await;
    conn.send_raw(&[0, 0, 0, 50, 3]).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    server.stop().await;
}

impl TestServer {
    pub fn clock_now(&self) -> u64 {
        use tollgate::clock::Clock;
        self.clock.now()
    }
}

/// PROTOCOL.md §14: a node outside a cluster answers TOPOLOGY as one shard
/// owning every slot, itself as primary at its epoch, version 0.
#[tokio::test]
async fn a_single_node_answers_topology_as_one_shard_with_every_slot() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    conn.send(9, &Request::Topology).await;
    let topology = match conn.recv().await {
        (9, Response::Topology(t)) => t,
        other => panic!("expected TOPOLOGY_OK: {other:?}"),
    };
    assert_eq!(topology.version, 0);
    assert!(topology.moving.is_empty());
    assert_eq!(topology.shards.len(), 1);
    let shard = &topology.shards[0];
    assert_eq!(shard.id, 0);
    assert_eq!(shard.slots, [tollgate_protocol::SlotSpan::ALL]);
    assert!(!shard.primary.is_empty());
    assert!(shard.standbys.is_empty());
    assert_eq!(shard.epoch, 1);
    // The connection goes on serving checks.
    let results = conn
        .check(10, batch_of(vec![vec![tb("rl:{t}:k", 10, 1000, 10, 1)]]))
        .await;
    assert!(allowed(&results[0]));
    server.stop().await;
}
