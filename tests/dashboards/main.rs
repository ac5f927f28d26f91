//! The Grafana dashboard (deploy/grafana/) and the Prometheus alert rules
//! (deploy/prometheus/) against a running server, so they cannot drift
//! from the code: every PromQL expression is extracted, and each
//! `tollgate_*` metric it names (and each label it matches on) must be in
//! the `/metrics` of a real server on 127.0.0.1:0. `promtool check rules`
//! (Debian's `prometheus` package, installed by scripts/deps.sh) must pass:
//! a missing promtool is a failure. The `tollgate_cluster_*` metrics exist
//! only on a node in cluster mode; tests/cluster checks those.

#[path = "../common/mod.rs"]
mod common;
mod promql;

use common::*;
use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const ALERTS: &str = "deploy/prometheus/alerts.yml";
const DASHBOARD: &str = "deploy/grafana/tollgate.json";

#[test]
fn the_extraction_skips_strings_and_reads_selectors() {
    let uses = promql::uses(
        r#"sum by (rule) (rate(tollgate_checks_total{instance=~"tollgate_x", decision="denied"}[5m])) / tollgate_keys"#,
    );
    let names: Vec<&str> = uses.iter().map(|u| u.metric.as_str()).collect();
    assert_eq!(names, ["tollgate_checks_total", "tollgate_keys"]);
    let labels: Vec<&str> = uses[0].labels.iter().map(String::as_str).collect();
    assert_eq!(labels, ["decision", "instance"]);
    let exported = promql::exported(
        "# HELP x\ntollgate_checks_total{rule=\"a,b}\",decision=\"denied\"} 3\ntollgate_keys 1\n",
    );
    let labels: Vec<&str> = exported["tollgate_checks_total"]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(labels, ["decision", "rule"]);
    // A metric or a label the server lacks is found.
    let exprs = [promql::Expr {
        origin: "t".into(),
        text: r#"tollgate_keys{shard="1"} + tollgate_nope"#.into(),
    }];
    assert_eq!(promql::missing(&exprs, &exported, |_| true).len(), 2);
}

#[test]
fn every_panel_and_alert_has_a_query_and_the_issue_s_alerts_exist() {
    let exprs = promql::expressions(Path::new(ROOT));
    assert!(exprs.len() > 20, "{exprs:?}");
    for e in &exprs {
        assert!(
            !promql::uses(&e.text).is_empty() || e.text.starts_with("up{"),
            "{}: names no tollgate metric: {}",
            e.origin,
            e.text
        );
    }
    let alerts: BTreeSet<&str> = exprs
        .iter()
        .filter_map(|e| e.origin.strip_prefix(&format!("{ROOT}/{ALERTS}: ")))
        .collect();
    for wanted in [
        "TollgateStandbyLagging",
        "TollgateNoPrimary",
        "TollgateShardWithoutPrimary",
        "TollgateMemoryNearCap",
        "TollgateKeysRefused",
        "TollgateErrorRate",
        "TollgateGlobalRuleCapped",
    ] {
        assert!(alerts.contains(wanted), "no alert {wanted}: {alerts:?}");
    }

    // The dashboard's panels: unique ids, on the 24-column grid, each
    // query on the dashboard's data source variable.
    let text = std::fs::read_to_string(Path::new(ROOT).join(DASHBOARD)).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64().unwrap()), "duplicate id: {p}");
        let grid = &p["gridPos"];
        let (x, w) = (grid["x"].as_u64().unwrap(), grid["w"].as_u64().unwrap());
        assert!(x + w <= 24, "off the grid: {}", p["title"]);
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        }
    }
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_name_is_in_metrics() {
    // In a region, with a peer (never reached) and a global rule shared
    // with it, so that the region's series exist too.
    let server = TestServer::start_admin(|c| {
        c.store.max_memory = Some(64 << 20);
        c.auth.cluster_secret = Some("dashboards-test-cluster-secret".into());
        c.regions.region = Some("here".into());
        c.regions.region_peer = vec!["there=127.0.0.1:9".into()];
    })
    .await;
    let admin = server.admin.unwrap();
    let put = http(admin, "PUT", "/v1/rules/api", Some(r#"{"rate": "1/s"}"#)).await;
    assert_eq!(put.status, 201, "{}", put.text());
    let global = r#"{"rate": "1/s", "global": ["here", "there"]}"#;
    let put = http(admin, "PUT", "/v1/rules/shared", Some(global)).await;
    assert_eq!(put.status, 201, "{}", put.text());
    // A denial, so the throttled-keys series exists.
    let mut conn = RawConn::ready(server.addr).await;
    let results = conn
        .check(
            1,
            batch_of(vec![vec![rule("k", "api", 1)], vec![rule("k", "api", 1)]]),
        )
        .await;
    assert_eq!(results.iter().filter(|r| allowed(r)).count(), 1);
    let scrape = http(admin, "GET", "/metrics", None).await;
    assert_eq!(scrape.status, 200);
    let exported = promql::exported(&scrape.text());
    assert!(exported.contains_key("tollgate_throttled_key_denials"));

    let exprs = promql::expressions(Path::new(ROOT));
    let problems = promql::missing(&exprs, &exported, |m| !m.starts_with("tollgate_cluster_"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The cluster panels and alert are there, for tests/cluster to check.
    assert!(exprs
        .iter()
        .any(|e| e.text.contains("tollgate_cluster_redirects_total")));
    server.stop().await;
}

#[test]
fn promtool_accepts_the_alert_rules() {
    let output = std::process::Command::new("promtool")
        .args(["check", "rules", ALERTS])
        .current_dir(ROOT)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): run scripts/deps.sh (Debian package prometheus)")
        });
    assert!(
        output.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
