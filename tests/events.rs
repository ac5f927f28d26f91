//! Decision events against a real `nats-server` (Debian's package,
//! installed by scripts/deps.sh; missing = failure) started on a free
//! loopback port: a subscriber checks what arrives (fields, sampling, no
//! event for PEEK), and with no broker at all the queue fills, events are
//! dropped and counted, and every check is still answered.

mod common;

use common::*;
use futures_util::StreamExt;
use serde_json::Value;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tollgate::config::ServerConfig;
use tollgate_protocol::{CheckResult, Request, Response};

const SUBJECT: &str = "test.decisions";

/// A nats-server on 127.0.0.1 and a free port, killed when dropped.
struct Nats {
    url: String,
    _child: Child,
}

async fn nats_server() -> Nats {
    let mut child = Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", "-1"])
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run nats-server ({e}): run scripts/deps.sh (Debian package nats-server)")
        });
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = tokio::time::timeout(PATIENCE, async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(addr) = line.split("client connections on ").nth(1) {
                return addr.trim().to_owned();
            }
        }
        panic!("nats-server exited before listening");
    })
    .await
    .expect("nats-server listens");
    // Keep reading its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Nats {
        url: format!("nats://{addr}"),
        _child: child,
    }
}

fn with_events(url: &str, sample: f64) -> impl FnOnce(&mut ServerConfig) {
    let url = url.to_owned();
    move |c| {
        c.events.events = Some(url);
        c.events.events_subject = SUBJECT.into();
        c.events.events_sample = sample;
        c.events.events_region = Some("test-region".into());
    }
}

async fn next_event(sub: &mut async_nats::Subscriber) -> Value {
    let message = tokio::time::timeout(PATIENCE, sub.next())
        .await
        .expect("an event arrives")
        .expect("the subscription is open");
    serde_json::from_slice(&message.payload).expect("an event is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_decision_reaches_a_subscriber() {
    let nats = nats_server().await;
    let client = async_nats::connect(&nats.url).await.unwrap();
    let mut sub = client.subscribe(SUBJECT).await.unwrap();
    client.flush().await.unwrap();

    let server = TestServer::start_admin(with_events(&nats.url, 1.0)).await;
    let admin = server.admin.unwrap();
    let put = http(
        admin,
        "PUT",
        "/v1/rules/watch",
        Some(r#"{"rate": "1/s", "shadow": true}"#),
    )
    .await;
    assert_eq!(put.status, 201, "{}", put.text());

    let mut conn = RawConn::ready(server.addr).await;
    // A PEEK first: it decides nothing, so it sends nothing.
    let peek = batch_of(vec![vec![tb("peeked", 1, 1000, 1, 1)]]);
    conn.send(1, &Request::Peek(peek)).await;
    assert!(matches!(conn.recv().await, (1, Response::Checked(_))));
    let results = conn
        .check(
            2,
            batch_of(vec![
                vec![tb("rl:{acme}:a", 1, 1000, 1, 1)],
                vec![tb("rl:{acme}:a", 1, 1000, 1, 1)],
                vec![rule("w", "watch", 0)],
                vec![rule("w", "watch", 0)],
                vec![rule("x", "missing-rule", 1)],
            ]),
        )
        .await;
    assert!(allowed(&results[0]) && !allowed(&results[1]));
    assert!(matches!(&results[3], CheckResult::Decision(d) if d.shadow_denied));
    assert!(matches!(&results[4], CheckResult::Error(_)));

    let events: Vec<Value> = {
        let mut v = Vec::new();
        for _ in 0..5 {
            v.push(next_event(&mut sub).await);
        }
        v
    };
    let decisions: Vec<&str> = events
        .iter()
        .map(|e| e["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        decisions,
        ["allowed", "denied", "allowed", "shadow_denied", "refused"]
    );
    let node = server.addr.to_string();
    for e in &events {
        assert_eq!(e["node"], node.as_str(), "{e}");
        assert_eq!(e["region"], "test-region");
        assert!(e["time_ms"].as_u64().unwrap() > 1_600_000_000_000, "{e}");
    }
    let denied = &events[1];
    assert_eq!(denied["key"], "rl:{acme}:a");
    assert_eq!(denied["rule"], Value::Null);
    assert_eq!(denied["algorithm"], "token-bucket");
    assert_eq!(denied["limit"]["count"], 1);
    assert_eq!(denied["limit"]["period_ms"], 1000);
    assert_eq!(denied["cost"], 1);
    assert_eq!(denied["remaining"], 0);
    let shadow = &events[3];
    assert_eq!(shadow["rule"], "watch");
    assert!(shadow.get("limit").is_none(), "{shadow}");
    assert_eq!(shadow["cost"], 1, "a cost of 0 takes the rule's default");
    let refused = &events[4];
    assert_eq!(refused["code"], "UnknownRule");
    assert_eq!(refused["rule"], "missing-rule");
    assert!(refused.get("algorithm").is_none());

    let metrics = http(admin, "GET", "/metrics", None).await.text();
    assert!(
        metrics.contains("tollgate_events_published_total 5"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_checks_are_sampled_and_denials_always_sent() {
    let nats = nats_server().await;
    let client = async_nats::connect(&nats.url).await.unwrap();
    let mut sub = client.subscribe(SUBJECT).await.unwrap();
    client.flush().await.unwrap();
    // Sample 0: no allowed check is sent.
    let server = TestServer::start_admin(with_events(&nats.url, 0.0)).await;
    let mut conn = RawConn::ready(server.addr).await;
    let mut checks: Vec<_> = (0..200)
        .map(|i| vec![tb(&format!("k{i}"), 10, 1000, 10, 1)])
        .collect();
    checks.push(vec![tb("b\u{0}\u{7f}", 1, 1000, 1, 2)]);
    let results = conn.check(1, batch_of(checks)).await;
    assert_eq!(results.iter().filter(|r| allowed(r)).count(), 200);
    // Events leave in the order checks were decided: had any of the 200
    // allowed checks been sent, it would arrive before the denial.
    let first = next_event(&mut sub).await;
    assert_eq!(first["decision"], "denied", "{first}");
    assert_eq!(first["key"], "b\u{0}\u{7f}");
    assert_eq!(first["cost"], 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_broker_events_are_dropped_and_checks_still_answered() {
    // A port nothing listens on: the client keeps reconnecting, its buffer
    // fills, then the queue, then events are dropped.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = TestServer::start_admin(|c| {
        with_events(&format!("nats://127.0.0.1:{port}"), 1.0)(c);
        c.events.events_queue = 16;
        c.events.events_batch = 4;
        // The stop waits this long for events that cannot leave.
        c.network.shutdown_grace = std::time::Duration::from_millis(500);
    })
    .await;
    let mut conn = RawConn::ready(server.addr).await;
    let total = 8_000;
    for frame in 0..(total / 500) {
        let checks = (0..500)
            .map(|i| vec![tb(&format!("d{frame}-{i}"), 1, 1000, 1, 2)])
            .collect();
        let results = conn.check(frame as u32 + 1, batch_of(checks)).await;
        assert_eq!(results.len(), 500);
        assert!(results.iter().all(|r| !allowed(r)), "cost 2 > burst 1");
    }
    let admin = server.admin.unwrap();
    let metrics = http(admin, "GET", "/metrics", None).await.text();
    let value = |name: &str| -> u64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let dropped = value("tollgate_events_dropped_total{reason=\"queue_full\"}");
    let queued = value("tollgate_events_queued");
    // What the client took (buffered while it reconnects) is bounded by
    // its own buffer; the rest of the 8000 was dropped.
    let handed = value("tollgate_events_published_total");
    assert!(queued <= 16, "{metrics}");
    assert_eq!(handed + queued + dropped, total as u64, "{metrics}");
    assert!(dropped > total as u64 / 2, "{metrics}");
    server.stop().await;
}
