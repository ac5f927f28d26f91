//! Defaults and the typed errors of impossible settings.

use super::*;

mod nodes;

#[test]
fn defaults_are_valid_and_named() {
    let c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    c.validate().unwrap();
    assert_eq!(c.limits.max_frame, DEFAULT_MAX_FRAME);
    assert_eq!(c.limits.max_batch, DEFAULT_MAX_BATCH);
    assert_eq!(c.network.idle_timeout, Duration::from_secs(300));
    assert_eq!(c.store.sweep_interval, Duration::from_millis(100));
    assert_eq!(c.store.max_log_entries, 1000);
}

#[test]
fn impossible_settings_are_typed_errors() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    let mut c = base.clone();
    c.store.max_memory = Some(1 << 20);
    c.store.stripes = 1024;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::MemoryTooSmall { share: 1024, .. })
    ));
    c.store.stripes = 64;
    assert_eq!(c.validate(), Ok(()));
    let mut c = base.clone();
    c.limits.max_batch = 0;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::TooSmall {
            name: "max-batch",
            ..
        })
    ));
    let mut c = base.clone();
    c.limits.max_frame = 100;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::FrameTooSmallForGroup { .. })
    ));
    let mut c = base.clone();
    c.limits.max_frame = u32::MAX;
    assert!(matches!(c.validate(), Err(ConfigError::TooLarge { .. })));
    let mut c = base.clone();
    c.store.max_log_entries = 0;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::TooSmall {
            name: "max-log-entries",
            ..
        })
    ));
    c.store.max_log_entries = MAX_LOG_ENTRIES_CEILING + 1;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::TooLarge {
            name: "max-log-entries",
            ..
        })
    ));
    let mut c = base.clone();
    c.network.frame_timeout = Duration::ZERO;
    assert_eq!(
        c.validate(),
        Err(ConfigError::ZeroDuration {
            name: "frame-timeout"
        })
    );
    // The status page reloads in whole seconds: 1.5 s is refused, not
    // cut to 1 s.
    let mut c = base;
    c.admin.status_refresh = Duration::from_millis(1500);
    assert_eq!(
        c.validate(),
        Err(ConfigError::NotWholeSeconds {
            name: "status-refresh",
            value: Duration::from_millis(1500),
        })
    );
}

#[test]
fn replication_timeouts_must_outlast_the_heartbeat() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    assert_eq!(base.replication.heartbeat, Duration::from_millis(100));
    assert_eq!(base.replication.repl_flush, Duration::from_millis(10));
    assert_eq!(base.replication.repl_backlog, 16 << 20);
    assert_eq!(base.replication.failover_after, None);
    let mut c = base.clone();
    c.replication.failover_after = Some(Duration::from_millis(100));
    assert!(matches!(
        c.validate(),
        Err(ConfigError::NotLongerThan {
            name: "failover-after",
            ..
        })
    ));
    let mut c = base.clone();
    c.replication.repl_timeout = Duration::from_millis(50);
    assert!(matches!(
        c.validate(),
        Err(ConfigError::NotLongerThan {
            name: "repl-timeout",
            ..
        })
    ));
    let mut c = base;
    c.replication.repl_buffer_cap = 0;
    assert!(c.validate().is_err());
}

#[test]
fn cluster_mode_needs_its_three_settings_and_no_pair_settings() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    assert!(!base.cluster.enabled());
    let mut c = base.clone();
    c.cluster.etcd = Some("127.0.0.1:2379".into());
    c.cluster.cluster = Some("prod".into());
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("--shard is missing"), "{err}");
    c.cluster.shard = Some(0);
    c.replication.peer = Some("10.0.0.2:7700".into());
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("--peer is a pair-mode setting"), "{err}");
    c.replication.peer = None;
    #[cfg(feature = "cluster")]
    {
        assert_eq!(c.validate(), Err(ConfigError::ClusterWithoutSecret));
        c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
        assert_eq!(c.validate(), Ok(()));
    }
    #[cfg(not(feature = "cluster"))]
    {
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("built without cluster mode"), "{err}");
    }
}

#[test]
fn protected_mode_refuses_an_open_port_beyond_loopback() {
    let open = ServerConfig::with_listen("0.0.0.0:7700".parse().unwrap());
    let err = open.validate().unwrap_err();
    assert!(matches!(
        err,
        ConfigError::Unprotected {
            port: "the protocol port (--listen)",
            ..
        }
    ));
    let text = err.to_string();
    for hint in ["0.0.0.0:7700", "--auth-token", "127.0.0.1", "--insecure"] {
        assert!(text.contains(hint), "{text} lacks {hint}");
    }
    // A client token, or mTLS, or --insecure opens it.
    let mut c = open.clone();
    c.auth.auth_token = Some("client-token-for-tests".into());
    c.validate().unwrap();
    let mut c = open.clone();
    c.tls.tls_cert = Some("c.pem".into());
    c.tls.tls_key = Some("k.pem".into());
    c.tls.tls_client_ca = Some("ca.pem".into());
    c.validate().unwrap();
    let mut c = open.clone();
    c.auth.insecure = true;
    c.validate().unwrap();
    // The admin port needs its own token.
    let mut c = open.clone();
    c.auth.auth_token = Some("client-token-for-tests".into());
    c.admin.listen = AdminAddr::On("[::]:7701".parse().unwrap());
    let err = c.validate().unwrap_err();
    assert!(err.to_string().contains("--admin-token"), "{err}");
    c.auth.admin_token = Some("a".into());
    c.validate().unwrap();
    // Loopback needs nothing, v4 or v6.
    for addr in ["127.0.0.1:7700", "[::1]:7700", "127.0.0.2:0"] {
        ServerConfig::with_listen(addr.parse().unwrap())
            .validate()
            .unwrap();
    }
    // The function itself, for any port.
    let exposure = Exposure {
        port: "a port",
        addr: "10.1.2.3:1".parse().unwrap(),
        risk: "do harm",
        authenticated: false,
        fix: "--x",
    };
    assert!(protected_mode(&exposure, false).is_err());
    assert!(protected_mode(&exposure, true).is_ok());
}

#[test]
fn pair_mode_needs_a_cluster_secret_distinct_from_client_tokens() {
    let mut c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    c.replication.peer = Some("127.0.0.1:7800".into());
    let err = c.validate().unwrap_err();
    assert_eq!(err, ConfigError::PairWithoutSecret);
    for hint in ["--cluster-secret", "TOLLGATE_CLUSTER_SECRET", "--insecure"] {
        assert!(err.to_string().contains(hint), "{err}");
    }
    let mut insecure = c.clone();
    insecure.auth.insecure = true;
    insecure.validate().unwrap();
    c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
    c.validate().unwrap();
    c.auth.auth_token = Some("client-token-for-tests".into());
    c.auth.auth_token_next = Some("cluster-secret-for-tests".into());
    assert_eq!(c.validate(), Err(ConfigError::ClusterSecretIsAClientToken));
    c.auth.auth_token_next = None;
    c.validate().unwrap();
    c.auth.cluster_secret = Some("x".repeat(256));
    assert!(matches!(
        c.validate(),
        Err(ConfigError::SecretLength {
            name: "cluster-secret",
            len: 256,
            ..
        })
    ));
    c.auth.cluster_secret = Some(String::new());
    assert!(c.validate().is_err());
    c.auth.cluster_secret = None;
    c.auth.cluster_secret_next = Some("next-cluster-secret-for-tests".into());
    assert!(matches!(
        c.validate(),
        Err(ConfigError::NextWithoutCurrent {
            next: "cluster-secret-next",
            ..
        })
    ));
}

#[test]
fn the_region_secret_differs_from_the_other_secrets() {
    let mut c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    let (cluster, next, client) = (
        "cluster-secret-of-tests",
        "next-cluster-secret-of-tests",
        "client-token-of-tests",
    );
    c.auth.cluster_secret = Some(cluster.into());
    c.auth.cluster_secret_next = Some(next.into());
    c.auth.auth_token = Some(client.into());
    for reused in [cluster, next, client] {
        c.auth.region_secret = Some(reused.into());
        assert_eq!(
            c.validate(),
            Err(ConfigError::RegionSecretReused),
            "{reused}"
        );
    }
    c.auth.region_secret = Some("region-secret-of-tests".into());
    c.validate().unwrap();
    c.auth.region_secret = Some("x".repeat(256));
    assert!(matches!(
        c.validate(),
        Err(ConfigError::SecretLength {
            name: "region-secret",
            ..
        })
    ));
}

#[test]
fn tls_settings_come_whole() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    let mut c = base.clone();
    c.tls.tls_cert = Some("c.pem".into());
    assert_eq!(c.validate(), Err(ConfigError::TlsHalf));
    let mut c = base.clone();
    c.tls.tls_client_ca = Some("ca.pem".into());
    assert_eq!(
        c.validate(),
        Err(ConfigError::TlsNeedsCert {
            name: "tls-client-ca"
        })
    );
    let mut c = base.clone();
    c.tls.tls_cert = Some("c.pem".into());
    c.tls.tls_key = Some("k.pem".into());
    c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
    c.replication.replica_of = Some("127.0.0.1:7800".into());
    assert_eq!(c.validate(), Err(ConfigError::PairTlsWithoutCa));
    c.tls.tls_ca = Some("ca.pem".into());
    c.validate().unwrap();
}

#[test]
fn retry_and_shedding_settings_are_bounded() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    assert_eq!(base.overload.dedup_window, Duration::from_secs(2));
    assert_eq!(base.overload.dedup_capacity, DEFAULT_DEDUP_CAPACITY);
    assert_eq!(base.overload.shed_low_backlog, 8 << 10);
    assert_eq!(base.overload.shed_normal_backlog, 24 << 10);
    let mut c = base.clone();
    c.overload.shed_normal_backlog = c.overload.shed_low_backlog - 1;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::TooSmall {
            name: "shed-normal-backlog",
            ..
        })
    ));
    let mut c = base.clone();
    c.overload.dedup_window = Duration::ZERO;
    assert!(matches!(
        c.validate(),
        Err(ConfigError::ZeroDuration {
            name: "dedup-window"
        })
    ));
    let mut c = base.clone();
    c.overload.dedup_capacity = 0;
    assert!(matches!(c.validate(), Err(ConfigError::TooSmall { .. })));
    c.overload.dedup_capacity = MAX_DEDUP_CAPACITY + 1;
    assert!(matches!(c.validate(), Err(ConfigError::TooLarge { .. })));
}

#[test]
fn region_settings_are_checked() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    assert_eq!(base.regions.exchange_interval, Duration::from_millis(500));
    let mut c = base.clone();
    c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
    c.regions.region = Some("eu".into());
    c.regions.region_peer = vec!["us=10.0.0.1:7700".into(), "ap=10.0.0.2:7700".into()];
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(c.regions.peers().unwrap()[1].addr, "10.0.0.2:7700");
    // Default ceiling: an equal share of the regions a rule lists.
    let share = |regions| super::ceiling_share(c.regions.region_ceiling, regions);
    assert!((share(3) - 1.0 / 3.0).abs() < 1e-9);
    assert!((share(2) - 0.5).abs() < 1e-9);
    for bad in ["us", "eu=10.0.0.3:7700", "us=", "x y=h:1"] {
        let mut d = c.clone();
        d.regions.region_peer.push(bad.into());
        assert!(
            matches!(d.validate(), Err(ConfigError::RegionPeer { .. })),
            "{bad}"
        );
    }
    let mut d = c.clone();
    d.regions.region_peer.push("us=10.0.0.9:7700".into());
    assert!(
        matches!(d.validate(), Err(ConfigError::RegionPeer { reason, .. }) if reason.contains("twice"))
    );
    let mut d = c.clone();
    d.regions.region = None;
    assert_eq!(d.validate(), Err(ConfigError::PeersWithoutRegion));
    let mut d = c.clone();
    d.auth.cluster_secret = None;
    assert_eq!(d.validate(), Err(ConfigError::RegionsWithoutSecret));
    for share in [0.0, 1.5, f64::NAN] {
        let mut d = c.clone();
        d.regions.region_ceiling = Some(share);
        assert!(
            matches!(d.validate(), Err(ConfigError::CeilingShare(_))),
            "{share}"
        );
    }
    let mut d = c.clone();
    d.regions.exchange_interval = Duration::ZERO;
    assert!(matches!(
        d.validate(),
        Err(ConfigError::ZeroDuration { .. })
    ));
    let mut d = c;
    d.regions.region = Some("".into());
    assert!(matches!(d.validate(), Err(ConfigError::RegionName(_))));
}

#[test]
fn max_frame_takes_byte_units_and_refuses_what_a_u32_cannot_hold() {
    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        config: ServerConfig,
    }
    let parse = |v: &str| {
        <Wrapper as clap::Parser>::try_parse_from(["tollgate", "--max-frame", v])
            .map(|w| w.config.limits.max_frame)
    };
    assert_eq!(parse("1048576").unwrap(), 1 << 20);
    assert_eq!(parse("1MiB").unwrap(), 1 << 20);
    assert_eq!(parse("512KiB").unwrap(), 512 << 10);
    assert!(parse("4GiB").is_err());
    assert!(parse("1 parsec").is_err());
}

#[test]
fn client_tokens_and_cluster_secrets_are_at_least_16_bytes() {
    let base = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    let short = "fifteen-bytes!!".to_owned();
    let long = "sixteen-bytes!!!".to_owned();
    let mut c = base.clone();
    c.auth.auth_token = Some(short.clone());
    assert_eq!(
        c.validate(),
        Err(ConfigError::SecretTooShort {
            name: "auth-token",
            len: 15,
            min: 16
        })
    );
    c.auth.auth_token = Some(long.clone());
    c.validate().unwrap();
    c.auth.auth_token_next = Some(short.clone());
    assert!(matches!(
        c.validate(),
        Err(ConfigError::SecretTooShort {
            name: "auth-token-next",
            ..
        })
    ));
    let mut c = base.clone();
    c.auth.cluster_secret = Some(short.clone());
    let err = c.validate().unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::SecretTooShort {
                name: "cluster-secret",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("openssl rand"), "{err}");
    let mut c = base.clone();
    c.auth.region_secret = Some(short.clone());
    assert!(matches!(
        c.validate(),
        Err(ConfigError::SecretTooShort {
            name: "region-secret",
            ..
        })
    ));
    // The admin token guards a loopback port by default: not held to it.
    let mut c = base.clone();
    c.auth.admin_token = Some("adm1n".into());
    c.validate().unwrap();
}

#[test]
fn region_peer_secrets_name_a_peer_once_and_are_secrets_of_their_own() {
    let mut c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    c.regions.region = Some("eu".into());
    c.regions.region_peer = vec!["us=10.0.0.1:7700".into(), "ap=10.0.0.2:7700".into()];
    c.auth.cluster_secret = Some("cluster-secret-of-tests".into());
    c.auth.region_peer_secret = vec!["us=us-and-eu-secret-0001".into()];
    c.validate().unwrap();
    assert_eq!(
        c.auth.region_peer_secrets(),
        vec![("us".to_owned(), "us-and-eu-secret-0001".to_owned())]
    );
    let cases: [(&[&str], &str); 6] = [
        (&["sa=us-and-eu-secret-0001"], "not a --region-peer"),
        (
            &["us=us-and-eu-secret-0001", "ap=us-and-eu-secret-0001"],
            "same secret",
        ),
        (&["us"], "NAME=SECRET"),
        (&["us=short"], "16 to 255"),
        (&["us=cluster-secret-of-tests"], "another secret"),
        (
            &["us=us-and-eu-secret-0001", "us=us-and-eu-secret-0002"],
            "twice",
        ),
    ];
    for (given, why) in cases {
        let mut d = c.clone();
        d.auth.region_peer_secret = given.iter().map(|s| s.to_string()).collect();
        let err = d.validate().unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, ConfigError::RegionPeerSecret { .. }) && text.contains(why),
            "{given:?}: {text}"
        );
        assert!(
            !text.contains("secret-0001") && !text.contains("short"),
            "{text}"
        );
    }
    // Per-peer secrets alone are enough for an exchange.
    let mut alone = c.clone();
    alone.auth.cluster_secret = None;
    alone.validate().unwrap();
}

#[test]
fn the_events_linger_is_at_most_a_second() {
    let mut c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    assert_eq!(c.events.events_linger, Duration::from_millis(5));
    c.events.events_linger = Duration::ZERO;
    assert_eq!(c.validate(), Ok(()));
    c.events.events_linger = Duration::from_millis(1001);
    let refused = c.validate().unwrap_err();
    assert_eq!(
        refused.to_string(),
        "events-linger must be at most 1s, got 1s 1ms"
    );
}
