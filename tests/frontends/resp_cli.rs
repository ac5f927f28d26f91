//! redis-cli against the RESP front end: PING, CL.THROTTLE with
//! redis-cell's reply, INCR/EXPIRE counters, AUTH, refusals.

use super::common::TestServer;
use super::redis_cli;
use std::time::Duration;

/// redis-cli prints a reply's integers one per line when not on a
/// terminal.
fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

#[tokio::test]
async fn ping_and_cl_throttle_answer_as_redis_cell() {
    let server = TestServer::start_resp(|_| {}).await;
    let resp = server.resp.unwrap();
    assert_eq!(redis_cli(resp, &["PING"]).await.trim(), "PONG");
    // redis-cell's README example: burst 15 (16 in all), 30 per 60 s.
    let first = redis_cli(resp, &["CL.THROTTLE", "user123", "15", "30", "60"]).await;
    assert_eq!(lines(&first), ["0", "16", "15", "-1", "2"]);
    // Quantity 15 more: 0 left, the bucket full again in 32 s.
    let out = redis_cli(resp, &["CL.THROTTLE", "user123", "15", "30", "60", "15"]).await;
    assert_eq!(lines(&out), ["0", "16", "0", "-1", "32"]);
    // Empty: limited, a token comes back in 2 s.
    let out = redis_cli(resp, &["cl.throttle", "user123", "15", "30", "60"]).await;
    assert_eq!(lines(&out), ["1", "16", "0", "2", "32"]);
    // Two seconds later one token is back.
    server.clock.advance(Duration::from_secs(2));
    let out = redis_cli(resp, &["CL.THROTTLE", "user123", "15", "30", "60"]).await;
    assert_eq!(lines(&out), ["0", "16", "0", "-1", "32"]);
    // Quantity 0 peeks: nothing charged, the bucket as it stands.
    let out = redis_cli(resp, &["CL.THROTTLE", "other", "4", "10", "1", "0"]).await;
    assert_eq!(lines(&out), ["0", "5", "5", "-1", "0"]);
    let out = redis_cli(resp, &["CL.THROTTLE", "other", "4", "10", "1", "0"]).await;
    assert_eq!(lines(&out), ["0", "5", "5", "-1", "0"]);
    // More than the whole bucket never fits.
    let out = redis_cli(resp, &["CL.THROTTLE", "other", "4", "10", "1", "6"]).await;
    assert_eq!(lines(&out), ["1", "5", "5", "-1", "0"]);
    server.stop().await;
}

#[tokio::test]
async fn bad_arguments_and_scripts_are_refused_with_errors() {
    let server = TestServer::start_resp(|_| {}).await;
    let resp = server.resp.unwrap();
    let out = redis_cli(resp, &["CL.THROTTLE", "k", "-1", "30", "60"]).await;
    assert!(out.contains("ERR max_burst must be an integer"), "{out}");
    let out = redis_cli(resp, &["CL.THROTTLE", "k", "1", "30"]).await;
    assert!(out.contains("wrong number of arguments"), "{out}");
    let out = redis_cli(resp, &["EVAL", "return 1", "0"]).await;
    assert!(out.contains("Tollgate runs no scripts"), "{out}");
    let out = redis_cli(resp, &["EVALSHA", "abc", "0"]).await;
    assert!(out.contains("Tollgate runs no scripts"), "{out}");
    let out = redis_cli(resp, &["SET", "k", "v"]).await;
    assert!(out.contains("ERR unknown command 'SET'"), "{out}");
    // The server still serves.
    assert_eq!(redis_cli(resp, &["PING"]).await.trim(), "PONG");
    server.stop().await;
}

#[tokio::test]
async fn counters_incr_expire_get_ttl_del() {
    let server = TestServer::start_resp(|_| {}).await;
    let resp = server.resp.unwrap();
    assert_eq!(redis_cli(resp, &["INCR", "hits"]).await.trim(), "1");
    assert_eq!(redis_cli(resp, &["INCRBY", "hits", "4"]).await.trim(), "5");
    assert_eq!(redis_cli(resp, &["GET", "hits"]).await.trim(), "5");
    // Into 60 s windows aligned on the clock (t = 1000 s): ends at 1020 s.
    assert_eq!(redis_cli(resp, &["EXPIRE", "hits", "60"]).await.trim(), "1");
    assert_eq!(redis_cli(resp, &["TTL", "hits"]).await.trim(), "20");
    assert_eq!(redis_cli(resp, &["PTTL", "hits"]).await.trim(), "20000");
    assert_eq!(redis_cli(resp, &["GET", "hits"]).await.trim(), "5");
    assert_eq!(redis_cli(resp, &["EXPIRE", "none", "60"]).await.trim(), "0");
    assert_eq!(redis_cli(resp, &["TTL", "none"]).await.trim(), "-2");
    assert_eq!(redis_cli(resp, &["GET", "none"]).await.trim(), "");
    // The window ends: the counter is gone.
    server.clock.advance(Duration::from_secs(20));
    assert_eq!(redis_cli(resp, &["GET", "hits"]).await.trim(), "");
    assert_eq!(redis_cli(resp, &["INCR", "hits"]).await.trim(), "1");
    assert_eq!(redis_cli(resp, &["DEL", "hits", "none"]).await.trim(), "1");
    assert_eq!(redis_cli(resp, &["EXISTS", "hits"]).await.trim(), "0");
    let out = redis_cli(resp, &["INCRBY", "hits", "-1"]).await;
    assert!(out.contains("only count up"), "{out}");
    server.stop().await;
}

#[tokio::test]
async fn auth_takes_the_client_tokens() {
    let token = "resp-token-0123456789abcdef";
    let server = TestServer::start_resp(|c| c.auth.auth_token = Some(token.into())).await;
    let resp = server.resp.unwrap();
    let out = redis_cli(resp, &["CL.THROTTLE", "k", "1", "1", "1"]).await;
    assert!(out.contains("NOAUTH"), "{out}");
    let out = redis_cli(resp, &["AUTH", "wrong"]).await;
    assert!(out.contains("WRONGPASS"), "{out}");
    // redis-cli -a: its AUTH fails, and the command after it is refused.
    let out = redis_cli(resp, &["--no-auth-warning", "-a", "wrong", "PING"]).await;
    assert!(out.contains("NOAUTH"), "{out}");
    let out = redis_cli(resp, &["--no-auth-warning", "-a", token, "PING"]).await;
    assert_eq!(out.trim(), "PONG");
    // RESP3 with HELLO's own AUTH (redis-cli -3 sends HELLO 3 AUTH).
    let out = redis_cli(
        resp,
        &["--no-auth-warning", "-3", "-a", token, "INCR", "k2"],
    )
    .await;
    assert_eq!(out.trim(), "1");
    server.stop().await;
}

#[tokio::test]
async fn cluster_slots_name_this_node_as_one_shard() {
    let server = TestServer::start_resp(|_| {}).await;
    let resp = server.resp.unwrap();
    let out = redis_cli(resp, &["CLUSTER", "SLOTS"]).await;
    let port = resp.port().to_string();
    assert_eq!(
        &lines(&out)[..4],
        ["0", "16383", "127.0.0.1", port.as_str()]
    );
    let out = redis_cli(resp, &["CLUSTER", "SHARDS"]).await;
    assert!(out.contains("16383") && out.contains(&port), "{out}");
    assert_eq!(
        redis_cli(resp, &["CLUSTER", "KEYSLOT", "{user1}:x"])
            .await
            .trim(),
        "8106"
    );
    server.stop().await;
}
