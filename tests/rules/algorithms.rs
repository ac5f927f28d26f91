//! Rules of every algorithm over real sockets: what each admits, its
//! leases (concurrency) and refunds, and the metrics they move.

use super::*;

/// REFUND frames, answered with the CHECKED results.
async fn refund(
    conn: &mut RawConn,
    id: u32,
    checks: Vec<Vec<tollgate_protocol::Pair>>,
) -> Vec<CheckResult> {
    conn.send(id, &Request::Refund(batch_of(checks))).await;
    match conn.recv().await {
        (rid, Response::Checked(results)) if rid == id => results,
        other => panic!("expected CHECKED {id}, got {other:?}"),
    }
}

async fn release(conn: &mut RawConn, id: u32, key: &str, lease: u64) -> u32 {
    let lease = LeaseRef {
        key: bytes::Bytes::copy_from_slice(key.as_bytes()),
        lease,
    };
    conn.send(id, &Request::Release(vec![lease])).await;
    match conn.recv().await {
        (rid, Response::Released(n)) if rid == id => n,
        other => panic!("expected RELEASED {id}, got {other:?}"),
    }
}

#[tokio::test]
async fn rules_of_every_algorithm_with_leases_and_refunds() {
    let dir = TempDir::new("algorithms");
    let text = "\
rules:
  - {name: jobs, algorithm: concurrency, rate: 2/30s}
  - {name: daily, algorithm: fixed-window, rate: 3/day, default-cost: 1}
  - {name: exact, algorithm: sliding-log, rate: 2/min}
  - {name: drip, algorithm: leaky-bucket, rate: 1/s, burst: 2}
  - {name: trial, rate: 1/s, burst: 1, shadow: true}
  - {name: trial-jobs, algorithm: concurrency, rate: 1/30s, shadow: true}
";
    let (server, _) = start_with_rules(&dir, text).await;
    let admin = server.admin.unwrap();
    let mut conn = RawConn::ready(server.addr).await;
    let count_allowed = |r: &[CheckResult]| r.iter().filter(|r| allowed(r)).count();

    // Concurrency under a rule: leases on the wire, released by id.
    let r = conn
        .check(
            1,
            batch_of(
                (0..3)
                    .map(|_| vec![rule("cc:{a}:jobs", "jobs", 0)])
                    .collect(),
            ),
        )
        .await;
    let d: Vec<Decision> = r.iter().map(decision).collect();
    assert!(d[0].allowed && d[1].allowed && !d[2].allowed, "{d:?}");
    let (first, second) = (d[0].lease.unwrap(), d[1].lease.unwrap());
    assert_ne!(first, second);
    assert_eq!(d[2].lease, None);
    assert_eq!(release(&mut conn, 2, "cc:{a}:jobs", first).await, 1);
    assert_eq!(release(&mut conn, 3, "cc:{a}:jobs", first).await, 0);
    let d = decision(
        &conn
            .check(4, batch_of(vec![vec![rule("cc:{a}:jobs", "jobs", 1)]]))
            .await[0],
    );
    assert!(d.allowed && d.lease.is_some());
    // What the admin API sees of that key: two of two in flight.
    let v = http(
        admin,
        "GET",
        "/v1/limits/cc%3A%7Ba%7D%3Ajobs?rule=jobs",
        None,
    )
    .await
    .json();
    assert_eq!(v["state"]["algorithm"], "concurrency", "{v}");
    assert_eq!(
        (
            v["usage"][0]["used"].as_u64(),
            v["usage"][0]["remaining"].as_u64()
        ),
        (Some(2), Some(0)),
        "{v}"
    );

    // The window and log algorithms, and the leaky bucket's tolerance.
    for (id, key, name, n, passing) in [
        (5, "rl:{a}:daily", "daily", 4, 3),
        (6, "rl:{a}:exact", "exact", 3, 2),
        (7, "rl:{a}:drip", "drip", 3, 2),
    ] {
        let r = conn
            .check(
                id,
                batch_of((0..n).map(|_| vec![rule(key, name, 0)]).collect()),
            )
            .await;
        assert_eq!(count_allowed(&r), passing, "{name}: {r:?}");
    }

    // REFUND naming a rule works as inline: cost 0 is the default cost.
    let r = refund(&mut conn, 8, vec![vec![rule("rl:{a}:daily", "daily", 0)]]).await;
    let d = decision(&r[0]);
    assert!(d.allowed);
    assert_eq!((d.limit, d.remaining), (3, 1));
    let r = conn
        .check(9, batch_of(vec![vec![rule("rl:{a}:daily", "daily", 1)]]))
        .await;
    assert!(allowed(&r[0]));
    // Unknown names and leases are refused per check, like inline pairs.
    let r = refund(
        &mut conn,
        10,
        vec![
            vec![rule("rl:{a}:daily", "no-such-rule", 1)],
            vec![rule("cc:{a}:jobs", "jobs", 1)],
            vec![rule("rl:{a}:exact", "exact", 2)],
        ],
    )
    .await;
    assert_eq!(r[0], CheckResult::Error(ErrorCode::UnknownRule));
    assert_eq!(r[1], CheckResult::Error(ErrorCode::InvalidLimit));
    assert_eq!(decision(&r[2]).remaining, 2);

    // A key holding a bucket beside its window: the admin API reads both.
    let r = conn
        .check(30, batch_of(vec![vec![rule("rl:{a}:daily", "trial", 1)]]))
        .await;
    assert!(allowed(&r[0]));
    let v = http(admin, "GET", "/v1/limits/rl%3A%7Ba%7D%3Adaily", None)
        .await
        .json();
    let states: Vec<&str> = v["states"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["algorithm"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["token-bucket", "fixed-window"], "{v}");
    assert_eq!(v["state"]["algorithm"], "token-bucket", "{v}");
    let usage: Vec<(&str, u64)> = v["usage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["rule"].as_str().unwrap(), u["used"].as_u64().unwrap()))
        .collect();
    assert_eq!(usage, [("trial", 1), ("daily", 3)], "{v}");

    // Shadow mode with a lease: the enforced concurrency pair's lease is
    // the answer even when the shadow rule would deny (status 3 wins), and
    // the would-be denial is counted.
    let group = || vec![rule("cc:{g}:jobs", "jobs", 1), rule("rl:{g}:t", "trial", 1)];
    let d = decision(&conn.check(11, batch_of(vec![group()])).await[0]);
    assert!(d.allowed && !d.shadow_denied && d.lease.is_some(), "{d:?}");
    let d = decision(&conn.check(12, batch_of(vec![group()])).await[0]);
    assert!(d.allowed && !d.shadow_denied, "{d:?}");
    let lease = d.lease.expect("the enforced pair's lease");
    assert_eq!(d.pair, 0, "the enforced decision");
    assert_eq!(release(&mut conn, 13, "cc:{g}:jobs", lease).await, 1);
    // Without a lease the shadow denial is status 4 as usual.
    let d = decision(
        &conn
            .check(14, batch_of(vec![vec![rule("rl:{g}:t", "trial", 1)]]))
            .await[0],
    );
    assert!(d.allowed && d.shadow_denied && d.lease.is_none(), "{d:?}");

    // A shadow concurrency rule that passes hands out its lease too.
    let d = decision(
        &conn
            .check(
                15,
                batch_of(vec![vec![
                    rule("rl:{h}:d", "daily", 1),
                    rule("cc:{h}:t", "trial-jobs", 1),
                ]]),
            )
            .await[0],
    );
    let lease = d.lease.expect("the shadow part's lease");
    assert_eq!(release(&mut conn, 16, "cc:{h}:t", lease).await, 1);
    // One lease per check, across the enforced and the shadow part.
    let r = conn
        .check(
            17,
            batch_of(vec![vec![
                rule("cc:{i}:a", "jobs", 1),
                rule("cc:{i}:b", "trial-jobs", 1),
            ]]),
        )
        .await;
    assert_eq!(r[0], CheckResult::Error(ErrorCode::InvalidLimit));

    let m = scrape(admin).await;
    assert_eq!(check_count(&m, "trial", "shadow_denied"), 2.0);
    assert_eq!(check_count(&m, "jobs", "denied"), 1.0);
    server.stop().await;
}
