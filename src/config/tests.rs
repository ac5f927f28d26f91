//! Defaults and the typed errors of impossible settings.

use super::*;

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
    let mut c = base;
    c.network.frame_timeout = Duration::ZERO;
    assert_eq!(
        c.validate(),
        Err(ConfigError::ZeroDuration {
            name: "frame-timeout"
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
        assert_eq!(c.validate(), Ok(()));
        let etcd = c.cluster.etcd_settings().unwrap();
        assert_eq!(etcd.lease_ttl, crate::cluster::DEFAULT_LEASE_TTL);
        assert_eq!(etcd.lease_margin, crate::cluster::DEFAULT_LEASE_MARGIN);
        assert_eq!(
            etcd.keepalive_interval,
            crate::cluster::DEFAULT_KEEPALIVE_INTERVAL
        );
        assert_eq!(
            etcd.request_timeout,
            crate::cluster::DEFAULT_REQUEST_TIMEOUT
        );
        c.cluster.lease_ttl = Duration::from_millis(1500);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("whole seconds"), "{err}");
        c.cluster.lease_ttl = Duration::from_secs(5);
        c.cluster.cluster = Some("a/b".into());
        assert!(c.validate().is_err());
    }
    #[cfg(not(feature = "cluster"))]
    {
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("built without cluster mode"), "{err}");
    }
}
