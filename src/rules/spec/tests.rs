//! Parsing and validating rule specs: good files, every error with its line.

use super::*;
use crate::algorithm::DEFAULT_MAX_LOG_ENTRIES;

fn parse(text: &str) -> Result<Vec<RuleSpec>, SpecError> {
    parse_yaml(text, DEFAULT_MAX_LOG_ENTRIES)
}

fn parse_json(body: &[u8], name: &str) -> Result<(RuleSpec, Limit), SpecError> {
    super::parse_json(body, name, DEFAULT_MAX_LOG_ENTRIES)
}

const GOOD: &str = "\
rules:
  - name: api-per-second
    rate: 100/s
    burst: 200
  - name: api-per-day
    algorithm: sliding-window
    rate: 10000/day
    failure-mode: closed
  - name: search
    algorithm: sliding-window
    rate: 100/min
    window: 30s
    default-cost: 2
    shadow: true
";

#[test]
fn a_good_file_gives_its_limits() {
    let rules = parse(GOOD).unwrap();
    assert_eq!(rules.len(), 3);
    let limits: Vec<Limit> = rules
        .iter()
        .map(|r| r.validate(DEFAULT_MAX_LOG_ENTRIES).unwrap())
        .collect();
    assert_eq!(
        limits[0],
        Limit {
            algorithm: Algorithm::TokenBucket,
            count: 100,
            period_ms: 1000,
            burst: 200
        }
    );
    assert_eq!(
        limits[1],
        Limit {
            algorithm: Algorithm::SlidingWindow,
            count: 10_000,
            period_ms: 86_400_000,
            burst: 0
        }
    );
    assert_eq!((limits[2].count, limits[2].period_ms), (50, 30_000));
    assert_eq!(rules[1].failure_mode, FailureMode::Closed);
    assert_eq!(rules[0].failure_mode, FailureMode::Open);
    assert!(rules[2].shadow && !rules[0].shadow);
    assert_eq!((rules[0].default_cost, rules[2].default_cost), (1, 2));
}

fn error(text: &str) -> SpecError {
    parse(text).expect_err("must be refused")
}

#[test]
fn errors_carry_the_line_and_the_reason() {
    // Unknown field: at the field.
    let e = error("rules:\n  - name: a\n    rate: 1/s\n    burts: 3\n");
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.reason.contains("unknown field `burts`"), "{e}");
    // Impossible rate: at the value.
    let e = error("rules:\n  - name: a\n    rate: 0/s\n");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.reason.contains("whole number of at least 1"), "{e}");
    // Semantic, across fields: at the rule.
    let e = error("rules:\n  - name: a\n    rate: 1/s\n  - name: b\n    algorithm: sliding-window\n    rate: 1/s\n    burst: 4\n");
    assert_eq!(e.line, Some(4), "{e}");
    assert!(
        e.reason.contains("burst does not apply to sliding-window"),
        "{e}"
    );
    // Overflowing numbers: the limit's own bounds.
    let e = error("rules:\n  - name: a\n    rate: 10000000000/ms\n");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.reason.contains("rate too high"), "{e}");
    // Duplicates: at the second one.
    let e = error("rules:\n  - {name: a, rate: 1/s}\n  - {name: a, rate: 2/s}\n");
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.reason.contains("duplicate rule name"), "{e}");
    // Unknown algorithm, bad names, bad YAML, wrong top level.
    let e = error("rules:\n  - {name: a, rate: 1/s, algorithm: leaky}\n");
    assert!(e.reason.contains("unknown variant `leaky`"), "{e}");
    let e = error("rules:\n  - {name: 'a b', rate: 1/s}\n");
    assert!(e.reason.contains("must be 1 to 64"), "{e}");
    let e = error("rules:\n  - {rate: 1/s}\n");
    assert!(e.reason.contains("name is missing"), "{e}");
    let e = error("rules: [\n");
    assert!(e.line.is_some(), "{e}");
    let e = error("rule:\n  - {name: a, rate: 1/s}\n");
    assert!(e.reason.contains("unknown field `rule`"), "{e}");
    let e = error("rules:\n  - {name: a, rate: 1/s, default-cost: 0}\n");
    assert!(e.reason.contains("default-cost"), "{e}");
    let e = error("rules:\n  - {name: a, rate: 5/s, algorithm: sliding-window, window: 1500ms}\n");
    assert!(e.reason.contains("not a whole count"), "{e}");
    assert!(error("").reason.contains("empty"));
}

#[test]
fn every_algorithm_maps_rate_burst_and_window_to_its_limit() {
    let rules = parse(
        "\
rules:
  - {name: tb, algorithm: token-bucket, rate: 100/min}
  - {name: sw, algorithm: sliding-window, rate: 100/min, window: 30s}
  - {name: fw, algorithm: fixed-window, rate: 10000/day}
  - {name: sl, algorithm: sliding-log, rate: 5/min, window: 2m}
  - {name: lb, algorithm: leaky-bucket, rate: 10/s}
  - {name: lb3, algorithm: leaky-bucket, rate: 10/s, burst: 3}
  - {name: cc, algorithm: concurrency, rate: 8/30s}
",
    )
    .unwrap();
    let got: Vec<(Algorithm, u64, u64, u64)> = rules
        .iter()
        .map(|r| {
            let l = r.validate(DEFAULT_MAX_LOG_ENTRIES).unwrap();
            (l.algorithm, l.count, l.period_ms, l.burst)
        })
        .collect();
    assert_eq!(
        got,
        [
            (Algorithm::TokenBucket, 100, 60_000, 100),
            (Algorithm::SlidingWindow, 50, 30_000, 0),
            (Algorithm::FixedWindow, 10_000, 86_400_000, 0),
            (Algorithm::SlidingLog, 10, 120_000, 0),
            (Algorithm::LeakyBucket, 10, 1000, 1),
            (Algorithm::LeakyBucket, 10, 1000, 3),
            (Algorithm::Concurrency, 8, 30_000, 0),
        ]
    );
}

#[test]
fn fields_an_algorithm_does_not_take_are_refused() {
    for (algorithm, field) in [
        ("token-bucket", "window: 1m"),
        ("leaky-bucket", "window: 1m"),
        ("sliding-window", "burst: 2"),
        ("fixed-window", "burst: 2"),
        ("sliding-log", "burst: 2"),
        ("concurrency", "burst: 2"),
        ("concurrency", "window: 1m"),
    ] {
        let e = error(&format!(
            "rules:\n  - {{name: a, algorithm: {algorithm}, rate: 5/s, {field}}}\n"
        ));
        let field = field.split(':').next().unwrap();
        assert!(
            e.reason
                .contains(&format!("{field} does not apply to {algorithm}")),
            "{e}"
        );
    }
}

#[test]
fn logs_and_concurrency_are_bounded_by_max_log_entries() {
    let text = "rules:\n  - {name: a, algorithm: sliding-log, rate: 50/s}\n";
    assert!(parse_yaml(text, 50).is_ok());
    let e = parse_yaml(text, 49).unwrap_err();
    assert!(e.reason.contains("max-log-entries (49)"), "{e}");
    let text = "rules:\n  - {name: a, algorithm: concurrency, rate: 50/30s}\n";
    assert!(parse_yaml(text, 50).is_ok());
    let e = parse_yaml(text, 49).unwrap_err();
    assert!(e.reason.contains("max-log-entries (49)"), "{e}");
    let e = super::parse_json(
        br#"{"rate": "2000/min", "algorithm": "sliding-log"}"#,
        "x",
        DEFAULT_MAX_LOG_ENTRIES,
    )
    .unwrap_err();
    assert!(e.reason.contains("use sliding-window"), "{e}");
}

#[test]
fn no_rules_is_valid() {
    assert!(parse("rules: []\n").unwrap().is_empty());
    assert!(parse("rules:\n").unwrap().is_empty());
}

#[test]
fn too_many_rules_are_refused() {
    let mut text = String::from("rules:\n");
    for i in 0..=MAX_RULES {
        text.push_str(&format!("  - {{name: r{i}, rate: 1/s}}\n"));
    }
    assert!(error(&text).reason.contains("more than 1024 rules"));
}

#[test]
fn json_bodies_are_validated_like_the_file() {
    let (spec, limit) = parse_json(br#"{"rate": "5/s", "burst": 10}"#, "x").unwrap();
    assert_eq!(spec.name, "x");
    assert_eq!((limit.count, limit.burst), (5, 10));
    let e = parse_json(br#"{"rate": "5/s", "burts": 10}"#, "x").unwrap_err();
    assert!(e.reason.contains("unknown field `burts`"), "{e}");
    let e = parse_json(br#"{"name": "y", "rate": "5/s"}"#, "x").unwrap_err();
    assert!(e.reason.contains("path names"), "{e}");
    let e = parse_json(
        br#"{"rate": "5/s", "algorithm": "sliding-window", "burst": 1}"#,
        "x",
    )
    .unwrap_err();
    assert!(e.reason.contains("does not apply to sliding-window"), "{e}");
    assert!(parse_json(b"{", "x").is_err());
}

#[test]
fn global_rules_list_valid_regions_and_a_shareable_algorithm() {
    let rules =
        parse("rules:\n  - name: g\n    algorithm: fixed-window\n    rate: 10/min\n    global: [us, eu-west.1]\n")
            .unwrap();
    assert_eq!(
        rules[0].global,
        vec!["us".to_owned(), "eu-west.1".to_owned()]
    );
    // Not global: nothing is written back for it.
    let plain = parse("rules:\n  - name: p\n    rate: 1/s\n").unwrap();
    assert!(plain[0].global.is_empty());
    assert!(!serde_json::to_string(&plain[0]).unwrap().contains("global"));
    let e = error("rules:\n  - name: g\n    rate: 1/s\n    global: [us, \"e u\"]\n");
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.reason.contains("\"e u\""), "{e}");
    let e = error("rules:\n  - name: g\n    rate: 1/s\n    global: [us, eu, us]\n");
    assert!(e.reason.contains("names region \"us\" twice"), "{e}");
    for algorithm in ["sliding-log", "leaky-bucket", "concurrency"] {
        let e = error(&format!(
            "rules:\n  - name: g\n    algorithm: {algorithm}\n    rate: 5/s\n    global: [us]\n"
        ));
        assert!(e.reason.contains("cannot be global"), "{algorithm}: {e}");
    }
}

#[test]
fn every_algorithm_has_its_name_in_rules_files() {
    let mut names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
    let mut listed = algorithm_name::NAMES.to_vec();
    names.sort_unstable();
    listed.sort_unstable();
    assert_eq!(names, listed);
    for algorithm in Algorithm::ALL {
        let yaml = format!(
            "rules:\n  - {{name: a, rate: 1/s, algorithm: {}}}\n",
            algorithm.name()
        );
        let specs = parse(&yaml).expect("a known name");
        assert_eq!(specs[0].algorithm, algorithm);
    }
}
