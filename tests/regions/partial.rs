//! Cuts that are not a clean split: two regions lose each other while each
//! still reaches the third, which does not pass on what it hears. Neither
//! is cut off from a majority of all its peers, so only a rule judged by
//! its own peers, or `--region-cut-off any`, caps them.

use super::*;
use tollgate::config::CutOff;

/// Waits until region `r` sees `peer` stalled.
async fn sees_stalled(world: &World, r: usize, peer: &str) {
    eventually("the cut link seen stalled", || async {
        let s = world.status(r).await;
        let stalled = s["peers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["region"] == peer && p["stalled"] == true);
        stalled.then_some(())
    })
    .await;
}

/// What region `r` says of the global rule `name`: its entry in
/// `GET /v1/regions`'s `rules`, and its `tollgate_region_rule_capped`
/// series (None when it has none).
async fn rule_seen(world: &World, r: usize, name: &str) -> (Value, Option<u64>) {
    let status = world.status(r).await;
    let rules = status["rules"].as_array().expect("rules").clone();
    let state = rules.into_iter().find(|s| s["rule"] == name).expect(name);
    let admin = world.regions[r].admin;
    let text = http(admin, "GET", "/metrics", None).await.text();
    let series = format!("tollgate_region_rule_capped{{rule=\"{name}\"}} ");
    let capped = text
        .lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .map(|v| v.trim().parse().unwrap());
    (state, capped)
}

/// `pair` is shared by us and eu only: when they lose each other, each is
/// capped at its ceiling of that rule, half of it (the regions the rule
/// lists), though both still hear ap. Before, neither was capped (one of
/// two peers stalled is no majority) and each admitted the whole limit;
/// and a ceiling was a third (the regions configured), not a half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_of_two_regions_is_capped_when_those_two_lose_each_other() {
    let mut world = World::start("partial-pair", BUSY_INTERVAL).await;
    in_step(&world).await;
    let (us, eu) = (0, 1);
    for r in [us, eu] {
        let (pair, capped) = rule_seen(&world, r, "pair").await;
        assert_eq!(pair["capped"], false, "in step: {pair}");
        assert_eq!(capped, Some(0), "in step");
    }
    world.cut_link((us, eu), true);
    sees_stalled(&world, us, "eu").await;
    sees_stalled(&world, eu, "us").await;
    // Not cut off as a whole: ap still answers both.
    assert!(world.status(us).await["cut_off"] == false);
    // The operator sees which rule is capped, and at what, where the
    // cut-off flag says nothing: `pair`, at half its count, in both; the
    // rule of all three (one of its two peers stalled) in neither.
    for r in [us, eu] {
        let (pair, capped) = rule_seen(&world, r, "pair").await;
        assert_eq!(
            (&pair["capped"], capped),
            (&Value::from(true), Some(1)),
            "{pair}"
        );
        assert_eq!(pair["shared"], true);
        assert_eq!(pair["ceiling_count"], 300, "{pair}");
        assert_eq!(pair["regions"], serde_json::json!(["us", "eu"]));
        let (bucket, capped) = rule_seen(&world, r, "bucket").await;
        assert_eq!(
            (&bucket["capped"], capped),
            (&Value::from(false), Some(0)),
            "{bucket}"
        );
        assert_eq!(bucket["ceiling_count"], 200, "{bucket}");
    }
    // ap does not take part in `pair`: regional there, with no series.
    let (pair, capped) = rule_seen(&world, 2, "pair").await;
    assert_eq!(
        (&pair["shared"], &pair["capped"], capped),
        (&Value::from(false), &Value::from(false), None)
    );

    let key = "rl:{customer}:pair";
    let in_us = drain_rule(&mut world, (&[us], "pair"), key, 50).await[0];
    let in_eu = drain_rule(&mut world, (&[eu], "pair"), key, 50).await[0];
    eprintln!("pair cut in two: us admitted {in_us}, eu {in_eu}");
    for (name, admitted) in [("us", in_us), ("eu", in_eu)] {
        assert!(
            (270..=300 + REFILL).contains(&admitted),
            "{name} admitted {admitted}; its ceiling is 300 (600 / 2)"
        );
    }
}

/// Under `--region-cut-off any`, a rule of all three regions is capped in
/// us and eu once they lose each other, and ap, which hears both, admits
/// what is left: the three together stay within the limit. (Under the
/// default, majority, us and eu would each admit up to the whole limit
/// less ap's usage: docs/GLOBAL-LIMITS.md.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_any_a_lost_link_caps_both_ends_and_the_sum_holds() {
    let mut world = World::start_with("partial-any", BUSY_INTERVAL, |_, c| {
        c.regions.region_cut_off = CutOff::Any;
    })
    .await;
    in_step(&world).await;
    let (us, eu, ap) = (0, 1, 2);
    world.cut_link((us, eu), true);
    sees_stalled(&world, us, "eu").await;
    sees_stalled(&world, eu, "us").await;
    for r in [us, eu] {
        eventually("cut off under any", || async {
            (world.status(r).await["cut_off"] == true).then_some(())
        })
        .await;
    }
    assert!(world.status(ap).await["cut_off"] == false);

    let key = "rl:{customer}:any";
    let in_us = drain(&mut world, &[us], key, 50).await[0];
    let in_eu = drain(&mut world, &[eu], key, 50).await[0];
    for (name, admitted) in [("us", in_us), ("eu", in_eu)] {
        assert!(
            (180..=200 + REFILL).contains(&admitted),
            "{name} admitted {admitted}; its ceiling is 200 (600 / 3)"
        );
    }
    // ap has heard of both (within two exchanges): what is left.
    let in_ap = drain(&mut world, &[ap], key, 100).await[0];
    let all = in_us + in_eu + in_ap;
    eprintln!("any: us {in_us}, eu {in_eu}, ap {in_ap}: {all} of {LIMIT}");
    assert!(
        all <= LIMIT + LIMIT / 10 + REFILL,
        "{all} admitted in all, over the limit {LIMIT} + 10%"
    );
}
