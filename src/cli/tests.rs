//! Flag parsing of the data commands and the rendering of answers.

use super::*;
use tollgate_protocol::{Algorithm, Decision, LimitRef, RuleName, RETRY_NEVER};

fn args(extra: &[&str]) -> Result<CheckArgs, clap::Error> {
    let mut argv = vec!["tollgate", "check", "--key", "k"];
    argv.extend_from_slice(extra);
    match Cli::try_parse_from(argv)?.command {
        Command::Check(a) => Ok(a),
        _ => unreachable!(),
    }
}

#[test]
fn token_bucket_flags() {
    let l = args(&["--rate", "5/s", "--burst", "10"])
        .unwrap()
        .limit()
        .unwrap();
    assert_eq!((l.count, l.period_ms, l.burst), (5, 1000, 10));
    let l = args(&["--rate", "100/min"]).unwrap().limit().unwrap();
    assert_eq!((l.count, l.period_ms, l.burst), (100, 60_000, 100));
}

#[test]
fn sliding_window_flags() {
    let a = args(&[
        "--rate",
        "100/min",
        "--algorithm",
        "sliding-window",
        "--window",
        "30s",
    ]);
    let l = a.unwrap().limit().unwrap();
    assert_eq!(
        (l.algorithm, l.count, l.period_ms, l.burst),
        (Algorithm::SlidingWindow, 50, 30_000, 0)
    );
    let a = args(&[
        "--rate",
        "5/s",
        "--algorithm",
        "sliding-window",
        "--window",
        "1500ms",
    ]);
    assert!(matches!(
        a.unwrap().limit(),
        Err(UsageError::UnevenWindow { .. })
    ));
    let a = args(&[
        "--rate",
        "5/s",
        "--algorithm",
        "sliding-window",
        "--burst",
        "3",
    ]);
    assert_eq!(
        a.unwrap().limit(),
        Err(UsageError::FlagNotFor {
            flag: "--burst",
            algorithm: "sliding-window"
        })
    );
    let a = args(&["--rate", "5/s", "--window", "3s"]);
    assert_eq!(
        a.unwrap().limit(),
        Err(UsageError::FlagNotFor {
            flag: "--window",
            algorithm: "token-bucket"
        })
    );
}

/// (algorithm, count, period_ms, burst) of a flag set.
fn shape(extra: &[&str]) -> Result<(Algorithm, u64, u64, u64), UsageError> {
    let l = args(extra).expect("flags parse").limit()?;
    Ok((l.algorithm, l.count, l.period_ms, l.burst))
}

#[test]
fn every_algorithm_by_name_with_its_flags() {
    use Algorithm::*;
    for (flags, expected) in [
        (
            &[
                "--algorithm",
                "token-bucket",
                "--rate",
                "100/s",
                "--burst",
                "200",
            ][..],
            (TokenBucket, 100, 1000, 200),
        ),
        (
            &["--algorithm", "sliding-window", "--rate", "100/min"],
            (SlidingWindow, 100, 60_000, 0),
        ),
        (
            &["--algorithm", "fixed-window", "--rate", "10000/day"],
            (FixedWindow, 10_000, 86_400_000, 0),
        ),
        (
            &[
                "--algorithm",
                "fixed-window",
                "--rate",
                "60/min",
                "--window",
                "10s",
            ],
            (FixedWindow, 10, 10_000, 0),
        ),
        (
            &[
                "--algorithm",
                "sliding-log",
                "--rate",
                "5/s",
                "--window",
                "2s",
            ],
            (SlidingLog, 10, 2000, 0),
        ),
        (
            &["--algorithm", "leaky-bucket", "--rate", "10/s"],
            (LeakyBucket, 10, 1000, 1),
        ),
        (
            &[
                "--algorithm",
                "leaky-bucket",
                "--rate",
                "10/s",
                "--burst",
                "4",
            ],
            (LeakyBucket, 10, 1000, 4),
        ),
        (
            &["--algorithm", "concurrency", "--max-in-flight", "8"],
            (Concurrency, 8, 30_000, 0),
        ),
        (
            &[
                "--algorithm",
                "concurrency",
                "--max-in-flight",
                "8",
                "--lease-ttl",
                "2m",
            ],
            (Concurrency, 8, 120_000, 0),
        ),
        (
            &["--algorithm", "concurrency", "--rate", "3/45s"],
            (Concurrency, 3, 45_000, 0),
        ),
    ] {
        assert_eq!(shape(flags), Ok(expected), "{flags:?}");
    }
    // Every wire algorithm has a flag value with its name.
    for a in Algorithm::ALL {
        let parsed = args(&["--algorithm", a.name()]).unwrap();
        assert_eq!(parsed.algorithm, a);
    }
}

#[test]
fn flags_that_do_not_fit_the_algorithm_are_refused() {
    let refused = |flag, algorithm| Err(UsageError::FlagNotFor { flag, algorithm });
    for (flags, expected) in [
        (
            &[
                "--algorithm",
                "fixed-window",
                "--rate",
                "5/s",
                "--burst",
                "2",
            ][..],
            refused("--burst", "fixed-window"),
        ),
        (
            &[
                "--algorithm",
                "sliding-log",
                "--rate",
                "5/s",
                "--burst",
                "2",
            ],
            refused("--burst", "sliding-log"),
        ),
        (
            &[
                "--algorithm",
                "leaky-bucket",
                "--rate",
                "5/s",
                "--window",
                "2s",
            ],
            refused("--window", "leaky-bucket"),
        ),
        (
            &["--rate", "5/s", "--max-in-flight", "2"],
            refused("--max-in-flight", "token-bucket"),
        ),
        (
            &[
                "--algorithm",
                "sliding-window",
                "--rate",
                "5/s",
                "--lease-ttl",
                "2s",
            ],
            refused("--lease-ttl", "sliding-window"),
        ),
        (
            &[
                "--algorithm",
                "concurrency",
                "--max-in-flight",
                "2",
                "--burst",
                "1",
            ],
            refused("--burst", "concurrency"),
        ),
        (
            &[
                "--algorithm",
                "concurrency",
                "--max-in-flight",
                "2",
                "--window",
                "1s",
            ],
            refused("--window", "concurrency"),
        ),
        (
            &[
                "--algorithm",
                "concurrency",
                "--rate",
                "2/s",
                "--max-in-flight",
                "2",
            ],
            Err(UsageError::RateAndMaxInFlight),
        ),
        (
            &[
                "--algorithm",
                "concurrency",
                "--rate",
                "2/s",
                "--lease-ttl",
                "3s",
            ],
            Err(UsageError::RateAndMaxInFlight),
        ),
        (
            &["--algorithm", "concurrency", "--lease-ttl", "3s"],
            Err(UsageError::MissingMaxInFlight),
        ),
        (
            &["--algorithm", "fixed-window"],
            Err(UsageError::MissingRate {
                algorithm: "fixed-window",
            }),
        ),
    ] {
        assert_eq!(shape(flags), expected, "{flags:?}");
    }
    assert!(args(&["--rate", "5/s", "--peek", "--refund"]).is_err());
    assert!(args(&["--algorithm", "concurrency", "--max-in-flight", "0"]).is_err());
    assert!(args(&["--algorithm", "no-such-thing", "--rate", "5/s"]).is_err());
}

#[test]
fn help_documents_every_algorithm() {
    let mut help = Vec::new();
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.find_subcommand_mut("check")
        .unwrap()
        .write_long_help(&mut help)
        .unwrap();
    let help = String::from_utf8(help).unwrap();
    for a in Algorithm::ALL {
        assert!(help.contains(a.name()), "--help lacks {}", a.name());
    }
    assert!(help.contains("--max-in-flight N [--lease-ttl D]"));
}

#[test]
fn release_flags() {
    let cli = Cli::try_parse_from(["tollgate", "release", "--key", "k", "--lease", "42"]);
    match cli.unwrap().command {
        Command::Release(a) => assert_eq!((a.key.as_str(), a.lease), ("k", 42)),
        other => panic!("{other:?}"),
    }
    assert!(Cli::try_parse_from(["tollgate", "release", "--key", "k"]).is_err());
}

#[test]
fn bad_numbers_are_usage_errors() {
    for bad in [
        vec!["--rate", "0/s"],
        vec!["--rate", "-1/s"],
        vec!["--rate", "NaN/s"],
        vec!["--rate", "5/s", "--cost", "-1"],
        vec!["--rate", "5/s", "--cost", "99999999999"],
        vec!["--rate", "5/s", "--burst", "-3"],
        vec!["--rate", "5/s", "--window", "0s"],
    ] {
        assert!(args(&bad).is_err(), "{bad:?}");
    }
}

#[test]
fn rule_flag_names_a_rule_instead_of_a_limit() {
    let a = args(&["--rule", "search", "--cost", "0", "--refund"]).unwrap();
    assert_eq!(
        a.limit_ref(),
        Ok(LimitRef::Rule(RuleName::from_static("search")))
    );
    let a = args(&["--rate", "5/s"]).unwrap();
    assert!(matches!(a.limit_ref(), Ok(LimitRef::Inline(_))));
    assert!(matches!(
        args(&["--rule", &"x".repeat(65)]).unwrap().limit_ref(),
        Err(UsageError::RuleName(_))
    ));
    // A rule carries its own numbers: no limit flag goes with it.
    for flags in [
        &["--rule", "r", "--rate", "5/s"][..],
        &["--rule", "r", "--burst", "2"],
        &["--rule", "r", "--window", "1s"],
        &["--rule", "r", "--algorithm", "fixed-window"],
        &["--rule", "r", "--max-in-flight", "2"],
        &["--rule", "r", "--lease-ttl", "1s"],
    ] {
        assert!(args(flags).is_err(), "{flags:?}");
    }
    // Neither a rule nor a rate: said before anything is sent.
    assert_eq!(
        args(&[]).unwrap().limit_ref(),
        Err(UsageError::MissingRate {
            algorithm: "token-bucket"
        })
    );
}

#[test]
fn json_rendering() {
    let d = Decision {
        allowed: false,
        shadow_denied: false,
        pair: 0,
        limit: 10,
        remaining: 0,
        reset_after_ms: 2000,
        retry_after_ms: RETRY_NEVER,
        lease: None,
    };
    let v: serde_json::Value = serde_json::from_str(&render(&d, true)).unwrap();
    assert_eq!(v["allowed"], false);
    assert_eq!(v["retry_after_ms"], serde_json::Value::Null);
    assert_eq!(v["reset_after_ms"], 2000);
    assert_eq!(v.get("lease"), None);
    assert!(render(&d, false).contains("retry_after=never"));
    let leased = Decision {
        allowed: true,
        retry_after_ms: 0,
        lease: Some(77),
        ..d
    };
    let v: serde_json::Value = serde_json::from_str(&render(&leased, true)).unwrap();
    assert_eq!(v["lease"], 77);
    assert!(render(&leased, false).ends_with("retry_after=0ms lease=77"));
}

#[test]
fn cluster_init_refuses_every_bad_shard_count_alike() {
    let init = |shards: &str| {
        Cli::try_parse_from([
            "tollgate",
            "cluster",
            "init",
            "--etcd",
            "127.0.0.1:2379",
            "--cluster",
            "c",
            "--shards",
            shards,
        ])
    };
    for bad in ["0", "16385", "65536", "many"] {
        let err = init(bad).unwrap_err();
        // A bad flag: exit 2, the control plane's own words.
        assert_eq!(err.exit_code(), 2, "{bad}");
        let text = err.to_string();
        assert!(
            text.contains("a cluster needs 1 to 16384 shards"),
            "{bad}: {text}"
        );
    }
    assert!(init("16384").is_ok());
}

#[test]
fn cluster_commands_refuse_an_etcd_endpoint_without_a_valid_port() {
    for bad in ["127.0.0.1:99999", "notahost", " , "] {
        let err = Cli::try_parse_from([
            "tollgate",
            "cluster",
            "status",
            "--etcd",
            bad,
            "--cluster",
            "c",
        ])
        .unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
    }
    assert!(Cli::try_parse_from([
        "tollgate",
        "cluster",
        "status",
        "--etcd",
        "http://127.0.0.1:2379",
        "--cluster",
        "c",
    ])
    .is_ok());
}
