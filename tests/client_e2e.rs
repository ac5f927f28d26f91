//! tollgate-client against the real server: multiplexing, groups, and
//! fail-open while the server is gone, then reconnection.

mod common;

use common::*;
use std::time::Duration;
use tollgate_client::{Client, ClientConfig, FailMode, Outcome, Undecided};

fn config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(2),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        // These tests look at undecided outcomes themselves.
        fallback: None,
        ..ClientConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_multiplexes_concurrent_calls_exactly() {
    let server = TestServer::start().await;
    let client = Client::connect(server.addr.to_string(), config())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..1000)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                let p = tb("hot", 1, 1000, 500, 1);
                client.check(p.key, p.limit, p.cost).await
            })
        })
        .collect();
    let mut allowed = 0;
    for t in tasks {
        match t.await.unwrap() {
            Outcome::Decided(d) => allowed += usize::from(d.allowed),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(allowed, 500);
    let info = client.server_info().unwrap();
    assert_eq!(info.limits.max_batch, 1024);
    server.stop().await;
}

#[tokio::test]
async fn groups_through_the_client_are_atomic() {
    let server = TestServer::start().await;
    let client = Client::connect(server.addr.to_string(), config())
        .await
        .unwrap();
    let group = || {
        vec![
            tb("{c}:s", 10, 1000, 10, 1),
            tb("{c}:d", 1, 86_400_000, 1, 1),
        ]
    };
    assert!(
        client
            .check_group(group())
            .await
            .decision()
            .unwrap()
            .allowed
    );
    let d = client
        .check_group(group())
        .await
        .decision()
        .unwrap()
        .clone();
    assert!(!d.allowed);
    assert_eq!(d.binding.index, 1);
    // The per-second key took only the first, successful check.
    let p = tb("{c}:s", 10, 1000, 10, 1);
    assert_eq!(
        client
            .peek(p.key, p.limit, 1)
            .await
            .decision()
            .unwrap()
            .remaining,
        8
    );
    // A cross-slot group is the caller's bug, not an outage: rejected,
    // never allowed, whatever the fail mode.
    let bad = client
        .check_group(vec![tb("{x}a", 1, 1000, 1, 1), tb("{y}b", 1, 1000, 1, 1)])
        .await;
    assert!(
        matches!(&bad, Outcome::Rejected(r) if r.code == tollgate_client::ErrorCode::CrossSlot),
        "{bad:?}"
    );
    assert!(!bad.is_allowed());
    server.stop().await;
}

#[tokio::test]
async fn server_outage_fails_open_then_the_client_reconnects() {
    let server = TestServer::start().await;
    let addr = server.addr;
    let client = Client::connect(addr.to_string(), config()).await.unwrap();
    let p = tb("k", 5, 1000, 10, 1);
    assert!(client
        .check(p.key.clone(), p.limit.clone(), 1)
        .await
        .decision()
        .is_some());
    server.stop().await;

    // Down: an undecided answer, well within the deadline, never an error.
    let outcome = client.check(p.key.clone(), p.limit.clone(), 1).await;
    let Outcome::Undecided { why, fail_mode } = outcome else {
        panic!("decided without a server: {outcome:?}")
    };
    assert!(
        matches!(why, Undecided::ConnectionLost | Undecided::Unavailable),
        "{why:?}"
    );
    assert_eq!(fail_mode, FailMode::Open);
    assert!(outcome.is_allowed());
    let closed = client
        .with_fail_mode(FailMode::Closed)
        .check(p.key.clone(), p.limit.clone(), 1)
        .await;
    assert!(!closed.is_allowed(), "{closed:?}");

    // Back on the same port: the client finds it again by itself.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let server =
        tollgate::server::Server::new(tollgate::config::ServerConfig::with_listen(addr)).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let join = tokio::spawn(server.run(listener, shutdown.clone()));
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Outcome::Decided(d) = client.check(p.key.clone(), p.limit.clone(), 1).await {
            assert!(d.allowed);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "client never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    join.await.unwrap().unwrap();
}

/// Token leasing: gateways lease tokens of a hot key and spend them without
/// a round trip; the server never admits more than it charged, and over an
/// interval the fleet admits at most `gateways x lease` beyond the limit
/// (tokens leased before the interval, spent in it). Server time is frozen
/// and advanced by hand, so the bounds are exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_overshoot_stays_within_gateways_times_lease() {
    use tollgate_client::{LeaseConfig, Limit, Rate, Source};
    const GATEWAYS: usize = 3;
    const LEASE: u64 = 10;
    let server = TestServer::start().await;
    // 100/s, burst 100: a lease is min(10, 100 / 1, what 100/s refills in
    // the hold) = 10 tokens.
    let limit = Limit::token_bucket(Rate::per_second(100), 100);
    let gateways: Vec<Client> = (0..GATEWAYS)
        .map(|g| {
            Client::new(
                server.addr.to_string(),
                ClientConfig {
                    client_name: format!("gw{g}"),
                    lease: Some(LeaseConfig {
                        max_lease: LEASE as u32,
                        capacity_divisor: 1,
                        hold: Duration::from_secs(60),
                        hot_after: 1,
                        max_keys: 100,
                    }),
                    ..config()
                },
            )
            .expect("valid config")
        })
        .collect();
    let key = "rl:{hot}:x";
    // Round robin over the gateways until one is denied: every admission
    // was charged at the server (frozen clock: at most the burst).
    let mut admitted = 0u64;
    let mut leased = 0u64;
    'first: loop {
        for gw in &gateways {
            match gw.check(key, limit, 1).await {
                Outcome::Decided(d) if d.allowed => {
                    admitted += 1;
                    leased += u64::from(d.source == Source::Lease);
                }
                Outcome::Decided(_) => break 'first,
                other => panic!("{other:?}"),
            }
        }
    }
    assert!(admitted <= 100, "admitted {admitted} of a burst of 100");
    assert!(leased > 0, "no check was served from a lease");
    // One second later the bucket is full again: 100 more, plus whatever
    // the other gateways still hold from their leases.
    server.clock.advance(Duration::from_secs(1));
    let mut second = 0u64;
    for gw in &gateways {
        loop {
            match gw.check(key, limit, 1).await {
                Outcome::Decided(d) if d.allowed => second += 1,
                Outcome::Decided(_) => break,
                other => panic!("{other:?}"),
            }
        }
    }
    // Exactly the refill, plus the tokens leased in the first second and
    // spent in this one.
    assert!(second >= 100, "only {second}");
    assert!(
        second <= 100 + GATEWAYS as u64 * LEASE,
        "{second} admitted: overshoot beyond gateways x lease"
    );
    for gw in &gateways {
        gw.close();
    }
    server.stop().await;
}
