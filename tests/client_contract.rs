//! The client's contract (docs/CLIENT.md) where the server cannot answer,
//! against real `tollgate serve` processes: an invalid request is
//! `Rejected` whether the server is up, hung behind an open breaker,
//! killed, or was never reached (never a fallback's free pass); an open
//! breaker fails a one-node client's calls at once; a refused handshake
//! reads as the server's error code, not as an outage.
//!
//! Pass/fail is counted in outcomes (which variant, which `why`), never
//! in time.

#[path = "replication/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::time::Duration;

use bytes::Bytes;
use harness::{eventually, free_addr, Node};
use tollgate_client::{
    BreakerConfig, BreakerState, Client, ClientConfig, ErrorCode, FailMode, FallbackConfig, Limit,
    Outcome, Pair, Rate, Undecided,
};

/// Short enough that a hung server costs little, long enough for a loaded
/// 2-core machine to answer a live server.
const DEADLINE: Duration = Duration::from_millis(100);

fn config() -> ClientConfig {
    ClientConfig {
        deadline: DEADLINE,
        connect_timeout: Duration::from_secs(2),
        probe_timeout: Duration::from_millis(100),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        fallback: Some(FallbackConfig::default()),
        client_name: "contract".into(),
        ..ClientConfig::default()
    }
}

fn bucket() -> Limit {
    Limit::token_bucket(Rate::per_second(10), 10)
}

fn pair(key: impl Into<Bytes>, limit: Limit, cost: u32) -> Pair {
    Pair::inline(key.into(), limit, cost)
}

fn code(outcome: &Outcome) -> Option<ErrorCode> {
    outcome.rejection().map(|r| r.code)
}

/// Every kind of invalid request the server refuses, each of which the
/// fallback would otherwise have admitted: each must be `Rejected` with the
/// server's code, and none allowed.
async fn assert_invalid_rejected(client: &Client, when: &str) {
    assert_oversized_rejected(client, when).await;
    assert_impossible_rejected(client, when).await;
}

/// Each case rejected with its code, never allowed.
fn assert_rejected_as(cases: Vec<(&str, Outcome, ErrorCode)>, when: &str) {
    for (what, outcome, expected) in cases {
        assert_eq!(
            code(&outcome),
            Some(expected),
            "{when}: {what}: {outcome:?}"
        );
        assert!(!outcome.is_allowed(), "{when}: {what}");
    }
}

/// What no server takes, whatever its settings: refused before any
/// handshake too.
async fn assert_impossible_rejected(client: &Client, when: &str) {
    let zero_count = Limit {
        count: 0,
        ..bucket()
    };
    let cases: Vec<(&str, Outcome, ErrorCode)> = vec![
        (
            "empty key",
            client.check("", bucket(), 1).await,
            ErrorCode::Malformed,
        ),
        (
            "inline cost 0",
            client.check("rl:{a}:c", bucket(), 0).await,
            ErrorCode::InvalidLimit,
        ),
        (
            "count 0",
            client.check("rl:{a}:z", zero_count, 1).await,
            ErrorCode::InvalidLimit,
        ),
        (
            "a key past a u16 length",
            client.check("k".repeat(70_000), bucket(), 1).await,
            ErrorCode::KeyTooLong,
        ),
        (
            "cross-slot group",
            client
                .check_group(vec![
                    pair("rl:{a}:1", bucket(), 1),
                    pair("rl:{b}:2", bucket(), 1),
                ])
                .await,
            ErrorCode::CrossSlot,
        ),
    ];
    assert_rejected_as(cases, when);
    // Left to the fallback, an empty group made it panic.
    let empty = client.check_group(Vec::new()).await;
    assert_eq!(
        code(&empty),
        Some(ErrorCode::Malformed),
        "{when}: {empty:?}"
    );
}

/// Past the sizes the server announced: refused once it has announced
/// them, kept while it is unreachable.
async fn assert_oversized_rejected(client: &Client, when: &str) {
    let long = "k".repeat(300);
    let cases: Vec<(&str, Outcome, ErrorCode)> = vec![
        (
            "300-byte key",
            client.check(long.clone(), bucket(), 1).await,
            ErrorCode::KeyTooLong,
        ),
        (
            "group of 17 pairs",
            client
                .check_group(
                    (0..17)
                        .map(|i| pair(format!("rl:{{a}}:{i}"), bucket(), 1))
                        .collect(),
                )
                .await,
            ErrorCode::BatchTooLarge,
        ),
    ];
    assert_rejected_as(cases, when);
    // Distinct over-long keys would each get a fresh fallback bucket.
    let one_per_second = Limit::token_bucket(Rate::per_second(1), 1);
    let mut allowed = 0;
    for i in 0..50 {
        allowed += u32::from(
            client
                .check(format!("{long}{i}"), one_per_second, 1)
                .await
                .is_allowed(),
        );
    }
    assert_eq!(allowed, 0, "{when}: distinct over-long keys passed");
}

/// A valid check the fallback decides: the server really is out of reach
/// and fail-open applies, so the rejections above are not the server's.
async fn assert_fallback_decides(client: &Client, when: &str) {
    let outcome = client.check("rl:{ok}:x", bucket(), 1).await;
    assert!(
        matches!(outcome, Outcome::Fallback { .. }),
        "{when}: {outcome:?}"
    );
}

/// With the server hung: concurrent calls time out on the live connection
/// until the breaker opens.
async fn breaker_opens(client: &Client) {
    eventually("the breaker opens", || async {
        let mut calls = tokio::task::JoinSet::new();
        for i in 0..8 {
            let client = client.clone();
            calls.spawn(async move { client.check(format!("rl:{{load}}:{i}"), bucket(), 1).await });
        }
        calls.join_all().await;
        (client.breakers()[0].1 == BreakerState::Open).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_are_rejected_by_a_client_that_never_connected() {
    // Nothing listens there: every attempt is refused.
    let client = Client::new(free_addr(), config()).expect("valid config");
    assert_fallback_decides(&client, "never connected").await;
    assert_impossible_rejected(&client, "never connected").await;
    // Before any handshake the server's sizes are unknown: a key or a
    // group past the default ones may be within its own, so the fallback
    // decides them (a server run with --max-key-len 512 must not have its
    // routes refused while it is away).
    let long = client.check("k".repeat(300), bucket(), 1).await;
    assert!(matches!(long, Outcome::Fallback { .. }), "{long:?}");
    let group: Vec<_> = (0..17)
        .map(|i| pair(format!("rl:{{a}}:{i}"), bucket(), 1))
        .collect();
    let group = client.check_group(group).await;
    assert!(matches!(group, Outcome::Fallback { .. }), "{group:?}");
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_are_rejected_behind_an_open_breaker_and_after_a_kill() {
    let mut node = Node::start(&free_addr(), &[]);
    let client = Client::connect(node.addr.clone(), config())
        .await
        .expect("connect");
    assert_invalid_rejected(&client, "server up").await;

    node.pause();
    breaker_opens(&client).await;
    assert_invalid_rejected(&client, "breaker open").await;
    node.resume();

    node.kill();
    eventually("the fallback decides without a server", || async {
        matches!(
            client.check("rl:{ok}:x", bucket(), 1).await,
            Outcome::Fallback { .. }
        )
        .then_some(())
    })
    .await;
    assert_invalid_rejected(&client, "server killed").await;
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limits_announced_last_still_apply_when_the_server_is_gone() {
    let mut node = Node::start(&free_addr(), &["--max-key-len", "512"]);
    let client = Client::connect(node.addr.clone(), config())
        .await
        .expect("connect");
    node.kill();
    eventually("the fallback decides without a server", || async {
        matches!(
            client.check("rl:{ok}:x", bucket(), 1).await,
            Outcome::Fallback { .. }
        )
        .then_some(())
    })
    .await;
    // 300 bytes is within what this server announced; 600 is not.
    let within = client.check("k".repeat(300), bucket(), 1).await;
    assert!(matches!(within, Outcome::Fallback { .. }), "{within:?}");
    let beyond = client.check("k".repeat(600), bucket(), 1).await;
    assert_eq!(code(&beyond), Some(ErrorCode::KeyTooLong), "{beyond:?}");
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_fails_a_one_node_clients_calls_at_once() {
    let node = Node::start(&free_addr(), &[]);
    let client = Client::connect(
        node.addr.clone(),
        ClientConfig {
            // No fallback: the outcome's `why` is the breaker's or the
            // deadline's, nothing else.
            fallback: None,
            breaker: BreakerConfig {
                // Long enough that no probe is due while the calls below
                // run, however slow the machine.
                open_for: Duration::from_secs(5),
                open_max: Duration::from_secs(10),
                ..BreakerConfig::default()
            },
            ..config()
        },
    )
    .await
    .expect("connect");

    node.pause();
    breaker_opens(&client).await;
    // Spread over several probe timeouts, so the suspect connection is
    // dropped meanwhile: calls must still fail at once, not wait for a
    // new connection's handshake that the hung server never answers.
    let mut why = Vec::new();
    for _ in 0..15 {
        why.push(client.check("rl:{a}:x", bucket(), 1).await.undecided());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        why.iter().all(|w| *w == Some(Undecided::BreakerOpen)),
        "while open: {why:?}"
    );

    // The documented recovery still works: once due, one probe goes
    // through, and an answer closes the breaker.
    node.resume();
    eventually("the probe closes the breaker", || async {
        matches!(
            client.check("rl:{b}:x", bucket(), 1).await,
            Outcome::Decided(_)
        )
        .then_some(())
    })
    .await;
    assert_eq!(client.breakers()[0].1, BreakerState::Closed);
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_handshake_is_the_servers_error_not_an_outage() {
    let node = Node::start(&free_addr(), &["--auth-token", "contract-token-1234"]);
    let client = Client::new(
        node.addr.clone(),
        ClientConfig {
            auth_token: Some(b"wrong-token".to_vec()),
            // Every call here must meet the refusal itself, not a breaker
            // opened by the refused attempts.
            breaker: BreakerConfig::never_open(),
            ..config()
        },
    )
    .expect("valid config");
    // The first call waits for the refused attempt; the next ones find
    // the shard backing off from it: all say AuthFailed.
    let refused = Undecided::ServerError(ErrorCode::AuthFailed);
    for _ in 0..5 {
        let outcome = client
            .with_deadline(Duration::from_secs(2))
            .check("rl:{a}:x", bucket(), 1)
            .await;
        assert!(
            matches!(outcome, Outcome::Fallback { why, .. } if why == refused),
            "{outcome:?}"
        );
    }
    let closed = client
        .with_fail_mode(FailMode::Closed)
        .check("rl:{a}:x", bucket(), 1)
        .await;
    assert!(
        matches!(closed, Outcome::Undecided { why, fail_mode: FailMode::Closed } if why == refused),
        "{closed:?}"
    );
    assert!(!closed.is_allowed());
    client.close();
}
