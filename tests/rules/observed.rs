//! What the server shows of its rules: usage, the throttled keys and the
//! metrics exposition (well-formed, unique, moving with the checks).

use super::*;

#[tokio::test]
async fn usage_and_throttled_keys() {
    let dir = TempDir::new("usage");
    let (server, _) = start_with_rules(&dir, RULES).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;

    assert_eq!(allowed_of(&mut conn, 1, "rl:{u}:a", "api", 2).await, 2);
    let v = http(admin, "GET", "/v1/limits/rl%3A%7Bu%7D%3Aa", None)
        .await
        .json();
    assert_eq!(v["key"], "rl:{u}:a");
    assert_eq!(v["state"]["algorithm"], "token-bucket");
    let usage = v["usage"].as_array().unwrap();
    assert_eq!(usage.len(), 1, "only rules of the key's algorithm: {v}");
    assert_eq!(usage[0]["rule"], "api");
    assert_eq!(
        (usage[0]["used"].as_u64(), usage[0]["remaining"].as_u64()),
        (Some(2), Some(3))
    );
    // Reading is free: the same numbers again.
    let again = http(admin, "GET", "/v1/limits/rl%3A%7Bu%7D%3Aa?rule=api", None)
        .await
        .json();
    assert_eq!(again["usage"][0]["remaining"], 3);
    let none = http(admin, "GET", "/v1/limits/never-seen", None)
        .await
        .json();
    assert_eq!(none["state"], serde_json::Value::Null);
    assert_eq!(
        http(admin, "GET", "/v1/limits/k?rule=nope", None)
            .await
            .status,
        404
    );

    // Denials: key b three times, key c once.
    for (id, key, n) in [(2, "rl:{u}:b", 8), (3, "rl:{u}:c", 6)] {
        allowed_of(&mut conn, id, key, "api", n).await;
    }
    let top = http(admin, "GET", "/v1/throttled?top=2", None).await.json();
    let keys = top["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        (keys[0]["key"].as_str(), keys[0]["denied"].as_u64()),
        (Some("rl:{u}:b"), Some(3))
    );
    assert_eq!(
        (keys[1]["key"].as_str(), keys[1]["denied"].as_u64()),
        (Some("rl:{u}:c"), Some(1))
    );
    server.stop().await;
}

#[tokio::test]
async fn metrics_parse_are_unique_and_move() {
    let server = TestServer::start_admin(|_| {}).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;
    let before = scrape(admin).await;
    assert_eq!(check_count(&before, "inline", "allowed"), 0.0);

    let checks = (0..3).map(|_| vec![tb("m", 1, 1000, 2, 1)]).collect();
    conn.check(1, batch_of(checks)).await;
    conn.check(2, batch_of(vec![vec![rule("m", "nope", 1)]]))
        .await;

    let after = scrape(admin).await;
    assert_eq!(check_count(&after, "inline", "allowed"), 2.0);
    assert_eq!(check_count(&after, "inline", "denied"), 1.0);
    let sample = |name: &str, label: Option<(&str, &str)>| -> f64 {
        after
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
            .map(|s| value(&s.value))
            .sum()
    };
    assert_eq!(
        sample(
            "tollgate_protocol_errors_total",
            Some(("code", "UnknownRule"))
        ),
        1.0
    );
    assert_eq!(sample("tollgate_connections", None), 1.0);
    assert!(sample("tollgate_connections_accepted_total", None) >= 1.0);
    // Two frames: one of 3 checks, one of 1.
    let histogram_count = |name: &str| match &after
        .samples
        .iter()
        .find(|s| s.metric == name)
        .unwrap_or_else(|| panic!("{name} missing"))
        .value
    {
        prometheus_parse::Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
        other => panic!("{name} is not a histogram: {other:?}"),
    };
    assert_eq!(histogram_count("tollgate_check_batch_size"), 2.0);
    assert_eq!(
        histogram_count("tollgate_check_frame_duration_seconds"),
        2.0
    );
    for name in [
        "tollgate_keys",
        "tollgate_keys_expired_total",
        "tollgate_rules",
        "tollgate_rule_reloads_total",
    ] {
        assert!(
            after.docs.contains_key(name),
            "{name} is not exposed: {:?}",
            after.docs.keys()
        );
    }
    server.stop().await;
}

/// Keys are bytes: `/v1/limits` reads a key that is not UTF-8 (percent-encoded
/// byte by byte, as docs/ADMIN.md says) and shows it lossily with `key_hex`.
#[tokio::test]
async fn usage_of_a_key_that_is_not_utf8() {
    let dir = TempDir::new("usage-bytes");
    let (server, _) = start_with_rules(&dir, RULES).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;
    let mut pair = tb("", 1, 1000, 5, 2);
    pair.key = bytes::Bytes::from_static(b"rl:{u}:\xff\x00");
    conn.check(1, batch_of(vec![vec![pair]])).await;

    let v = http(
        admin,
        "GET",
        "/v1/limits/rl%3A%7Bu%7D%3A%FF%00?rule=api",
        None,
    )
    .await;
    assert_eq!(v.status, 200, "{}", v.text());
    let v = v.json();
    assert_eq!(v["key_hex"], "726c3a7b757d3aff00");
    assert_eq!(v["key"], "rl:{u}:\u{fffd}\u{0}");
    assert_eq!(v["state"]["algorithm"], "token-bucket");
    assert_eq!(v["usage"][0]["used"], 2);
    // A UTF-8 key has no `key_hex`.
    let plain = http(admin, "GET", "/v1/limits/plain", None).await.json();
    assert!(plain.get("key_hex").is_none(), "{plain}");
    server.stop().await;
}
