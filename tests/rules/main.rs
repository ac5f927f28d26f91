//! Named rules end to end: the rules file (edited while clients check), the
//! admin API (PUT / DELETE / reload, invalid reloads) and shadow mode here;
//! rules of every algorithm with their leases and refunds in
//! `algorithms.rs`; usage, throttled keys and the metrics exposition in
//! `observed.rs`. All over real sockets and real HTTP. Reloads are awaited
//! by polling with a generous deadline; no assertion depends on timing.

#[path = "../common/mod.rs"]
mod common;

mod algorithms;
mod observed;

use common::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate_protocol::{CheckResult, Decision, ErrorCode, LeaseRef, Request, Response};

const RULES: &str = "\
# Test rules.
rules:
  - name: api
    rate: 1/s
    burst: 5
  - name: per-minute
    algorithm: sliding-window
    rate: 3/min
    failure-mode: closed
";

fn decision(r: &CheckResult) -> Decision {
    match r {
        CheckResult::Decision(d) => *d,
        CheckResult::Error(e) => panic!("unexpected error {e}"),
    }
}

/// A server with `text` as its rules file, polled every 20 ms, admin API on.
async fn start_with_rules(dir: &TempDir, text: &str) -> (TestServer, std::path::PathBuf) {
    let path = dir.path("rules.yaml");
    std::fs::write(&path, text).unwrap();
    let p = path.clone();
    let server = TestServer::start_admin(move |c| {
        c.rules.file = Some(p);
        c.rules.poll = Duration::from_millis(20);
    })
    .await;
    (server, path)
}

/// Checks `key` under `rule` n times in one batch; how many were allowed.
async fn allowed_of(conn: &mut RawConn, id: u32, key: &str, rule_name: &str, n: usize) -> usize {
    let checks = (0..n).map(|_| vec![rule(key, rule_name, 0)]).collect();
    conn.check(id, batch_of(checks))
        .await
        .iter()
        .filter(|r| decision(r).allowed)
        .count()
}

async fn rule_burst(admin: std::net::SocketAddr, name: &str) -> Option<u64> {
    let v = http(admin, "GET", &format!("/v1/rules/{name}"), None)
        .await
        .json();
    v["burst"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_file_applies_while_clients_check() {
    let dir = TempDir::new("edit");
    let (server, path) = start_with_rules(&dir, RULES).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;

    assert_eq!(allowed_of(&mut conn, 1, "rl:{a}:fresh1", "api", 7).await, 5);
    // A key part-way through its bucket before the change: 4 of 5 taken.
    assert_eq!(allowed_of(&mut conn, 2, "rl:{a}:carry", "api", 4).await, 4);

    // A client checking in a loop through the whole reload.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let background = {
        let (stop, done, addr) = (stop.clone(), done.clone(), server.addr);
        tokio::spawn(async move {
            let mut conn = RawConn::ready(addr).await;
            let mut id = 100;
            while !stop.load(Ordering::Relaxed) {
                id += 1;
                let results = conn
                    .check(id, batch_of(vec![vec![rule("rl:{bg}:k", "api", 1)]]))
                    .await;
                // A decision every time: never an error, never a dropped
                // connection (check() panics on either).
                decision(&results[0]);
                done.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    eventually("background checks", || async {
        (done.load(Ordering::Relaxed) > 10).then_some(())
    })
    .await;

    write_atomically(&path, &RULES.replace("burst: 5", "burst: 3"));
    eventually("the edited rule", || async {
        (rule_burst(admin, "api").await == Some(3)).then_some(())
    })
    .await;
    let before = done.load(Ordering::Relaxed);
    eventually("checks after the reload", || async {
        (done.load(Ordering::Relaxed) > before + 10).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    background
        .await
        .expect("the background client never failed");

    // The new burst is in force for new keys...
    assert_eq!(allowed_of(&mut conn, 3, "rl:{a}:fresh2", "api", 7).await, 3);
    // ...and at once for existing ones: 4 taken is more than a burst of 3.
    let d = decision(
        &conn
            .check(4, batch_of(vec![vec![rule("rl:{a}:carry", "api", 1)]]))
            .await[0],
    );
    assert!(!d.allowed);
    assert_eq!((d.limit, d.remaining), (3, 0));
    server.stop().await;
}

#[tokio::test]
async fn invalid_reloads_change_nothing_and_say_where() {
    let dir = TempDir::new("invalid");
    let (server, path) = start_with_rules(&dir, RULES).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;
    let shown = path.display().to_string();

    let cases = [
        // (file text, line, what the reason says)
        // Not YAML: a tab in the indentation.
        ("rules:\n  - name: api\n\trate: 1/s\n", 3, "tab character"),
        (
            "rules:\n  - name: api\n    rate: 1/s\n    burts: 3\n",
            4,
            "unknown field `burts`",
        ),
        (
            "rules:\n  - name: api\n    rate: 1/s\n  - name: bad\n    rate: 0/s\n",
            5,
            "whole number of at least 1",
        ),
    ];
    for (i, (text, line, reason)) in cases.iter().enumerate() {
        // Through the file watcher: logged, counted, kept for the API.
        write_atomically(&path, text);
        let status = eventually("the failed reload", || async {
            let v = http(admin, "GET", "/v1/rules", None).await.json();
            let failed = v["last_reload"]["ok"] == false
                && v["last_reload"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains(reason));
            failed.then_some(v)
        })
        .await;
        let error = status["last_reload"]["error"].as_str().unwrap();
        assert!(
            error.starts_with(&format!("{shown}:{line}:")),
            "case {i}: {error}"
        );
        assert_eq!(status["last_reload"]["source"], "file-change");
        assert_eq!(
            status["rules"].as_array().unwrap().len(),
            2,
            "old rules kept"
        );

        // Through the API: the answer itself reports file, line and reason.
        let answer = http(admin, "POST", "/v1/rules/reload", None).await;
        assert_eq!(answer.status, 422, "case {i}: {}", answer.text());
        let v = answer.json();
        assert_eq!(v["line"], *line as u64, "case {i}: {v}");
        assert_eq!(v["file"], shown);
        assert!(v["reason"].as_str().unwrap().contains(reason), "{v}");
        assert_eq!(v["rules_in_force"], 2);
    }

    // The old rules still serve, unchanged.
    assert_eq!(allowed_of(&mut conn, 1, "rl:{i}:k", "api", 7).await, 5);
    let metrics = scrape(admin).await;
    let errors: f64 = metrics
        .samples
        .iter()
        .filter(|s| {
            s.metric == "tollgate_rule_reloads_total" && s.labels.get("outcome") == Some("error")
        })
        .map(|s| value(&s.value))
        .sum();
    assert!(errors >= 6.0, "{errors} failed reloads counted");

    // A good file is picked up again.
    write_atomically(&path, &RULES.replace("burst: 5", "burst: 2"));
    eventually("the good file", || async {
        (rule_burst(admin, "api").await == Some(2)).then_some(())
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn the_admin_api_edits_rules() {
    let server = TestServer::start_admin(|_| {}).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;

    // Unknown rules are a per-check error; the other checks proceed.
    let r = conn
        .check(
            1,
            batch_of(vec![
                vec![rule("k", "burst-2", 0)],
                vec![tb("k2", 1, 1000, 1, 1)],
            ]),
        )
        .await;
    assert_eq!(r[0], CheckResult::Error(ErrorCode::UnknownRule));
    assert!(allowed(&r[1]));

    let created = http(
        admin,
        "PUT",
        "/v1/rules/burst-2",
        Some(r#"{"rate": "1/s", "burst": 2, "default-cost": 2, "failure-mode": "closed"}"#),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(created.json()["name"], "burst-2");
    let got = http(admin, "GET", "/v1/rules/burst-2", None).await.json();
    assert_eq!(got["failure-mode"], "closed");
    assert_eq!(got["rate"], "1/s");
    // Default cost 2 on a bucket of 2: one check at cost 0 takes all.
    assert_eq!(allowed_of(&mut conn, 2, "rl:{p}:a", "burst-2", 2).await, 1);

    // Invalid bodies change nothing and say why.
    for (body, status, reason) in [
        (
            r#"{"rate": "1/s", "burts": 2}"#,
            422,
            "unknown field `burts`",
        ),
        (r#"{"rate": "0/s"}"#, 422, "at least 1"),
        (
            r#"{"rate": "1/s", "algorithm": "sliding-window", "burst": 1}"#,
            422,
            "burst does not apply to sliding-window",
        ),
        (r#"{"name": "other", "rate": "1/s"}"#, 422, "path names"),
        ("not json", 422, "expected"),
    ] {
        let a = http(admin, "PUT", "/v1/rules/burst-2", Some(body)).await;
        assert_eq!(a.status, status, "{body}: {}", a.text());
        assert!(
            a.json()["error"].as_str().unwrap().contains(reason),
            "{body}: {}",
            a.text()
        );
    }
    let bad_name = http(admin, "PUT", "/v1/rules/a%20b", Some(r#"{"rate": "1/s"}"#)).await;
    assert_eq!(bad_name.status, 422, "{}", bad_name.text());
    assert_eq!(rule_burst(admin, "burst-2").await, Some(2));

    // Replace: 200, and the new numbers apply.
    let replaced = http(
        admin,
        "PUT",
        "/v1/rules/burst-2",
        Some(r#"{"rate": "1/s", "burst": 4}"#),
    )
    .await;
    assert_eq!(replaced.status, 200);
    assert_eq!(allowed_of(&mut conn, 3, "rl:{p}:b", "burst-2", 6).await, 4);

    let list = http(admin, "GET", "/v1/rules", None).await.json();
    assert_eq!(list["rules"].as_array().unwrap().len(), 1);
    assert_eq!(list["source"], serde_json::Value::Null);

    // Delete: the rule is gone for checks at once.
    assert_eq!(
        http(admin, "DELETE", "/v1/rules/burst-2", None)
            .await
            .status,
        200
    );
    let r = conn
        .check(4, batch_of(vec![vec![rule("k", "burst-2", 0)]]))
        .await;
    assert_eq!(r[0], CheckResult::Error(ErrorCode::UnknownRule));
    assert_eq!(
        http(admin, "DELETE", "/v1/rules/burst-2", None)
            .await
            .status,
        404
    );
    assert_eq!(
        http(admin, "GET", "/v1/rules/burst-2", None).await.status,
        404
    );

    // No rules file: nothing to reload. Errors are JSON everywhere.
    let a = http(admin, "POST", "/v1/rules/reload", None).await;
    assert_eq!(a.status, 409);
    assert!(a.json()["error"].as_str().unwrap().contains("--rules"));
    let a = http(admin, "GET", "/v2/nothing", None).await;
    assert_eq!(a.status, 404);
    assert!(a.json()["error"].is_string());
    let a = http(admin, "POST", "/v1/rules", None).await;
    assert_eq!(a.status, 405);
    assert!(a.json()["error"].is_string());
    let a = http(admin, "GET", "/v1/throttled?top=x", None).await;
    assert_eq!(a.status, 400);
    assert!(a.json()["error"].is_string());

    assert_eq!(http(admin, "GET", "/healthz", None).await.status, 200);
    assert_eq!(http(admin, "GET", "/readyz", None).await.status, 200);
    server.stop().await;
}

/// Without a rules file, a reload asked for is refused (409) and is not
/// a failed reload: nothing was tried, so no alarm is raised (no error
/// recorded for `tollgate rules`, none counted).
#[tokio::test]
async fn a_reload_without_a_rules_file_is_refused_not_recorded() {
    let server = TestServer::start_admin(|_| {}).await;
    let admin = server.admin.unwrap();
    let refused = http(admin, "POST", "/v1/rules/reload", None).await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    let status = http(admin, "GET", "/v1/rules", None).await.json();
    assert_eq!(status["last_reload"], serde_json::Value::Null, "{status}");
    let metrics = http(admin, "GET", "/metrics", None).await.text();
    assert!(
        metrics.contains("tollgate_rule_reloads_total{outcome=\"error\",source=\"admin-api\"} 0"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test]
async fn reload_through_the_api_replaces_api_edits() {
    let dir = TempDir::new("api-reload");
    let (server, _path) = start_with_rules(&dir, RULES).await;
    let admin = server.admin.unwrap();
    let put = http(admin, "PUT", "/v1/rules/extra", Some(r#"{"rate": "5/s"}"#)).await;
    assert_eq!(put.status, 201);
    let a = http(admin, "POST", "/v1/rules/reload", None).await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["rules"], 2);
    assert_eq!(
        http(admin, "GET", "/v1/rules/extra", None).await.status,
        404
    );
    let status = http(admin, "GET", "/v1/rules", None).await.json();
    assert_eq!(status["last_reload"]["ok"], true);
    assert_eq!(status["last_reload"]["source"], "admin-api");
    server.stop().await;
}

#[tokio::test]
async fn shadow_rules_allow_and_say_they_would_deny() {
    let dir = TempDir::new("shadow");
    let text = "\
rules:
  - {name: enforced, rate: 1/s, burst: 10}
  - {name: trial, rate: 1/s, burst: 2, shadow: true}
";
    let (server, _) = start_with_rules(&dir, text).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;

    // Alone: two pass, then allowed-but-shadow-denied with the denial's numbers.
    let r = conn
        .check(
            1,
            batch_of((0..4).map(|_| vec![rule("rl:{s}:t", "trial", 1)]).collect()),
        )
        .await;
    let d: Vec<Decision> = r.iter().map(decision).collect();
    assert!(d.iter().all(|d| d.allowed));
    assert!(!d[0].shadow_denied && !d[1].shadow_denied);
    assert!(d[2].shadow_denied && d[3].shadow_denied);
    assert_eq!(
        (d[2].limit, d[2].remaining, d[2].retry_after_ms),
        (2, 0, 1000)
    );

    // In a group with an enforced rule: the enforced pair is charged, the
    // answer names the shadow pair that would have denied.
    let group = vec![
        rule("rl:{s}:e", "enforced", 1),
        rule("rl:{s}:t", "trial", 1),
    ];
    let d = decision(&conn.check(2, batch_of(vec![group.clone()])).await[0]);
    assert!(d.allowed && d.shadow_denied);
    assert_eq!(d.pair, 1);
    // The enforced pair was charged: 10 - 1 - 1 = 8 left after another.
    let d = decision(
        &conn
            .check(3, batch_of(vec![vec![rule("rl:{s}:e", "enforced", 1)]]))
            .await[0],
    );
    assert_eq!(d.remaining, 8);

    // Counted by rule and decision.
    let m = scrape(admin).await;
    assert_eq!(check_count(&m, "trial", "shadow_denied"), 3.0);
    assert_eq!(check_count(&m, "trial", "allowed"), 2.0);
    assert_eq!(check_count(&m, "enforced", "allowed"), 1.0);
    // Shadow denials are not throttling: nothing in the top keys.
    let top = http(admin, "GET", "/v1/throttled", None).await.json();
    assert!(top["keys"].as_array().unwrap().is_empty(), "{top}");
    server.stop().await;
}

/// A shadow trial of another window algorithm on an enforced window's own
/// key is refused InvalidLimit, as the same group without shadow is: the
/// group is evaluated in two parts, and the trial's state would replace
/// the enforced count (a key holds one state besides its token bucket).
#[tokio::test]
async fn a_shadow_pair_may_not_replace_an_enforced_pairs_state() {
    let dir = TempDir::new("shadow-clash");
    let text = "\
rules:
  - {name: windows, algorithm: fixed-window, rate: 10/min}
  - {name: trial, algorithm: sliding-window, rate: 10/min, shadow: true}
";
    let (server, _) = start_with_rules(&dir, text).await;
    let mut conn = RawConn::ready(server.addr).await;
    let group = vec![rule("rl:{w}:k", "windows", 3), rule("rl:{w}:k", "trial", 1)];
    let r = conn.check(1, batch_of(vec![group])).await;
    assert_eq!(r[0], CheckResult::Error(ErrorCode::InvalidLimit), "{r:?}");
    // Nothing was charged: the enforced window still holds all ten.
    let d = decision(
        &conn
            .check(2, batch_of(vec![vec![rule("rl:{w}:k", "windows", 1)]]))
            .await[0],
    );
    assert_eq!(d.remaining, 9);
    server.stop().await;
}

/// Scrapes `/metrics` over HTTP and parses it with a Prometheus text-format
/// parser; fails on malformed or duplicate metric names.
async fn scrape(admin: std::net::SocketAddr) -> prometheus_parse::Scrape {
    let a = http(admin, "GET", "/metrics", None).await;
    assert_eq!(a.status, 200);
    let text = a.text();
    let mut typed = HashSet::new();
    let mut names = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().unwrap();
            assert!(typed.insert(name.to_owned()), "duplicate metric {name}");
            assert!(valid_metric_name(name), "malformed metric name {name:?}");
            assert!(name.starts_with("tollgate_"), "unprefixed metric {name}");
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(valid_metric_name(name), "malformed sample name {name:?}");
            *names
                .entry(line.split(' ').next().unwrap().to_owned())
                .or_insert(0) += 1;
        }
    }
    for (series, n) in names {
        assert_eq!(n, 1, "series {series} exposed {n} times");
    }
    let lines = text.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text format");
    assert!(!scrape.samples.is_empty());
    scrape
}

fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn value(v: &prometheus_parse::Value) -> f64 {
    match v {
        prometheus_parse::Value::Counter(x)
        | prometheus_parse::Value::Gauge(x)
        | prometheus_parse::Value::Untyped(x) => *x,
        _ => 0.0,
    }
}

fn check_count(m: &prometheus_parse::Scrape, rule: &str, decision: &str) -> f64 {
    m.samples
        .iter()
        .filter(|s| {
            s.metric == "tollgate_checks_total"
                && s.labels.get("rule") == Some(rule)
                && s.labels.get("decision") == Some(decision)
        })
        .map(|s| value(&s.value))
        .sum()
}
