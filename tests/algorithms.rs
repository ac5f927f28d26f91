//! The six algorithms, refunds, leases and atomic multi-rule groups against
//! a real server (manual clock, so every number is exact).

mod common;

use bytes::Bytes;
use common::*;
use std::time::Duration;
use tollgate::clock::Clock;
use tollgate_client::{Client, ClientConfig, Error};
use tollgate_protocol::{
    Algorithm, CheckResult, Decision, ErrorCode, LeaseRef, Limit, Pair, Request, Response,
};

const DAY_MS: u64 = 86_400_000;

fn pair(
    key: &str,
    algorithm: Algorithm,
    count: u64,
    period_ms: u64,
    burst: u64,
    cost: u32,
) -> Pair {
    Pair {
        key: Bytes::copy_from_slice(key.as_bytes()),
        limit: Limit {
            algorithm,
            count,
            period_ms,
            burst,
        }
        .into(),
        cost,
    }
}

/// 100/s with bursts of 200, and 10,000 per day, for API key `k42`.
fn api_key(cost: u32) -> Vec<Pair> {
    vec![
        pair("rl:{k42}:s", Algorithm::TokenBucket, 100, 1000, 200, cost),
        pair(
            "rl:{k42}:d",
            Algorithm::FixedWindow,
            10_000,
            DAY_MS,
            0,
            cost,
        ),
    ]
}

fn decision(r: &CheckResult) -> Decision {
    match r {
        CheckResult::Decision(d) => *d,
        CheckResult::Error(e) => panic!("unexpected error {e}"),
    }
}

fn client_config() -> ClientConfig {
    ClientConfig {
        deadline: PATIENCE,
        ..ClientConfig::default()
    }
}

#[tokio::test]
async fn a_mixed_group_denied_by_one_rule_charges_nothing_and_names_it() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    // The server clock starts at 1000 s; the day window is [0, 86,400 s).
    // Spend the day's 10,000 in 50 checks of 200, 2 s apart (the bucket
    // refills in between).
    for i in 0..50 {
        if i > 0 {
            server.clock.advance(Duration::from_secs(2));
        }
        let r = conn.check(i + 1, batch_of(vec![api_key(200)])).await;
        assert!(decision(&r[0]).allowed, "check {i}");
    }
    // 1 s after the last charge, at 1099 s: the bucket holds 100 again.
    server.clock.advance(Duration::from_secs(1));
    assert_eq!(server.clock.now(), 1099 * S);
    let peek_bucket = Request::Peek(batch_of(vec![api_key(1)[..1].to_vec()]));
    conn.send(90, &peek_bucket).await;
    let (_, Response::Checked(before)) = conn.recv().await else {
        panic!("CHECKED")
    };
    assert_eq!(decision(&before[0]).remaining, 99);

    let r = conn.check(91, batch_of(vec![api_key(1)])).await;
    let d = decision(&r[0]);
    assert!(!d.allowed);
    assert_eq!(d.pair, 1, "the day rule denied");
    assert_eq!((d.limit, d.remaining), (10_000, 0));
    assert_eq!(d.retry_after_ms, DAY_MS - 1_099_000);
    assert_eq!(d.lease, None);

    // Nothing was charged: the bucket answers as it did before.
    conn.send(92, &peek_bucket).await;
    let (_, Response::Checked(after)) = conn.recv().await else {
        panic!("CHECKED")
    };
    assert_eq!(after, before);

    // Empty the bucket too: both rules deny, the longest wait is named.
    let drain = vec![pair(
        "rl:{k42}:s",
        Algorithm::TokenBucket,
        100,
        1000,
        200,
        100,
    )];
    assert!(decision(&conn.check(93, batch_of(vec![drain])).await[0]).allowed);
    let d = decision(&conn.check(94, batch_of(vec![api_key(1)])).await[0]);
    assert_eq!((d.allowed, d.pair), (false, 1));
    assert_eq!(d.retry_after_ms, DAY_MS - 1_099_000);

    // The next day both pass again.
    server.clock.set(DAY_MS * 1_000_000);
    let d = decision(&conn.check(95, batch_of(vec![api_key(1)])).await[0]);
    assert!(d.allowed);
    server.stop().await;
}

#[tokio::test]
async fn concurrency_leases_through_the_client() {
    let server = TestServer::start().await;
    let client = Client::connect(server.addr.to_string(), client_config())
        .await
        .unwrap();
    let jobs = Limit {
        algorithm: Algorithm::Concurrency,
        count: 2,
        period_ms: 30_000,
        burst: 0,
    };
    let a = client.check("cc:{acme}:jobs", jobs, 1).await;
    let b = client.check("cc:{acme}:jobs", jobs, 1).await;
    let (Some(la), Some(lb)) = (a.lease(), b.lease()) else {
        panic!("leases: {a:?} {b:?}")
    };
    assert_ne!(la, lb);
    let full = client
        .check("cc:{acme}:jobs", jobs, 1)
        .await
        .decision()
        .cloned()
        .unwrap();
    assert!(!full.allowed);
    assert_eq!(full.lease, None);
    assert_eq!(full.retry_after, Some(Duration::from_secs(30)));

    assert!(client.release("cc:{acme}:jobs", la).await.unwrap());
    assert!(
        !client.release("cc:{acme}:jobs", la).await.unwrap(),
        "twice"
    );
    let c = client.check("cc:{acme}:jobs", jobs, 1).await;
    assert!(c.lease().is_some());

    // A crashed holder: its lease expires with the TTL and frees the slot.
    server.clock.advance(Duration::from_secs(30));
    let released = client
        .release_many(vec![
            LeaseRef {
                key: "cc:{acme}:jobs".into(),
                lease: lb,
            },
            LeaseRef {
                key: "cc:{acme}:jobs".into(),
                lease: c.lease().unwrap(),
            },
        ])
        .await
        .unwrap();
    assert_eq!(released, 0, "both leases had expired");
    let d = client
        .check("cc:{acme}:jobs", jobs, 1)
        .await
        .decision()
        .cloned()
        .unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 1));

    // Refunding a concurrency pair is the caller's mistake.
    let err = client
        .refund("cc:{acme}:jobs", jobs, 1)
        .await
        .expect_err("refused");
    assert!(
        matches!(
            err,
            Error::Server {
                code: ErrorCode::InvalidLimit,
                ..
            }
        ),
        "{err}"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_lease_is_status_3_on_the_wire_and_released_counts() {
    let server = TestServer::start().await;
    let mut conn = RawConn::ready(server.addr).await;
    let acquire = pair("cc:{w}", Algorithm::Concurrency, 1, 1000, 0, 1);
    let r = conn.check(1, batch_of(vec![vec![acquire.clone()]])).await;
    let lease = decision(&r[0]).lease.expect("status 3 carries the lease");
    // The server clock is at 1000 s: the lease id is that instant in ns.
    assert_eq!(lease, 1000 * S);
    conn.send(
        2,
        &Request::Release(vec![
            LeaseRef {
                key: "cc:{w}".into(),
                lease,
            },
            LeaseRef {
                key: "cc:{w}".into(),
                lease,
            },
            LeaseRef {
                key: "nothing-here".into(),
                lease: 1,
            },
        ]),
    )
    .await;
    assert_eq!(conn.recv().await, (2, Response::Released(1)));
    server.stop().await;
}

#[tokio::test]
async fn refund_through_the_client_gives_back_what_was_not_used() {
    let server = TestServer::start().await;
    let client = Client::connect(server.addr.to_string(), client_config())
        .await
        .unwrap();
    let budget = Limit {
        algorithm: Algorithm::TokenBucket,
        count: 100_000,
        period_ms: 60_000,
        burst: 100_000,
    };
    let d = client
        .check("llm:{org7}", budget, 4000)
        .await
        .decision()
        .cloned()
        .unwrap();
    assert_eq!(d.remaining, 96_000);
    let d = client.refund("llm:{org7}", budget, 2800).await.unwrap();
    assert!(d.allowed);
    assert_eq!(d.remaining, 98_800);
    // Never above the limit.
    let d = client.refund("llm:{org7}", budget, 50_000).await.unwrap();
    assert_eq!(d.remaining, 100_000);
    // A group refund is atomic, and one bad pair refunds nothing.
    let group = vec![
        pair("{r}a", Algorithm::FixedWindow, 10, 60_000, 0, 5),
        pair("{r}b", Algorithm::SlidingLog, 10, 60_000, 0, 5),
    ];
    assert!(client.check_group(group.clone()).await.is_allowed());
    let mut bad = group.clone();
    bad[1].cost = 0;
    assert!(client.refund_group(bad).await.is_err());
    let mut back = group.clone();
    back[0].cost = 2;
    back[1].cost = 3;
    let d = client.refund_group(back).await.unwrap();
    assert_eq!((d.binding.index, d.remaining), (0, 7));
    server.stop().await;
}

#[tokio::test]
async fn every_algorithm_answers_inline_limits() {
    let server = TestServer::start().await;
    let client = Client::connect(server.addr.to_string(), client_config())
        .await
        .unwrap();
    // (algorithm, count, period_ms, burst, how many pass at one instant)
    for (algorithm, count, period_ms, burst, passes) in [
        (Algorithm::TokenBucket, 5, 1000, 3, 3),
        (Algorithm::SlidingWindow, 4, 1000, 0, 4),
        (Algorithm::FixedWindow, 4, 1000, 0, 4),
        (Algorithm::SlidingLog, 4, 1000, 0, 4),
        (Algorithm::LeakyBucket, 10, 1000, 1, 1),
        (Algorithm::Concurrency, 2, 1000, 0, 2),
    ] {
        let limit = Limit {
            algorithm,
            count,
            period_ms,
            burst,
        };
        let key = format!("inline:{}", algorithm.name());
        let mut passed = 0;
        for _ in 0..10 {
            let outcome = client.check(key.clone(), limit, 1).await;
            let d = outcome.decision().expect("decided");
            passed += usize::from(d.allowed);
            assert_eq!(
                d.lease.is_some(),
                d.allowed && algorithm == Algorithm::Concurrency,
                "{algorithm:?}"
            );
        }
        assert_eq!(passed, passes, "{algorithm:?}");
    }
    // A sliding log above the server's cap is refused, pointing elsewhere.
    let too_big = Limit {
        algorithm: Algorithm::SlidingLog,
        count: 1001,
        period_ms: 1000,
        burst: 0,
    };
    let outcome = client.check("inline:big-log", too_big, 1).await;
    assert!(
        matches!(&outcome, tollgate_client::Outcome::Rejected(r) if r.code == tollgate_client::ErrorCode::InvalidLimit),
        "{outcome:?}"
    );
    assert!(!outcome.is_allowed());
    server.stop().await;
}

#[tokio::test]
async fn max_log_entries_is_a_server_setting() {
    let server = TestServer::start_with(|c| c.store.max_log_entries = 3).await;
    let mut conn = RawConn::ready(server.addr).await;
    let r = conn
        .check(
            1,
            batch_of(vec![
                vec![pair("l3", Algorithm::SlidingLog, 3, 1000, 0, 1)],
                vec![pair("l4", Algorithm::SlidingLog, 4, 1000, 0, 1)],
                vec![pair("c4", Algorithm::Concurrency, 4, 1000, 0, 1)],
            ]),
        )
        .await;
    assert!(decision(&r[0]).allowed);
    assert_eq!(r[1], CheckResult::Error(ErrorCode::InvalidLimit));
    assert_eq!(r[2], CheckResult::Error(ErrorCode::InvalidLimit));
    server.stop().await;
}
