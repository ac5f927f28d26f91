//! The settings that name other nodes and etcd: a lease etcd would not
//! grant.

use super::*;

/// A cluster-mode node's settings that validate (with the feature).
fn cluster_node() -> ServerConfig {
    let mut c = ServerConfig::with_listen("127.0.0.1:7700".parse().unwrap());
    c.cluster.etcd = Some("127.0.0.1:2379".into());
    c.cluster.cluster = Some("prod".into());
    c.cluster.shard = Some(0);
    c.auth.cluster_secret = Some("cluster-secret-for-tests".into());
    c
}

#[test]
fn a_lease_ttl_past_etcds_ceiling_is_refused() {
    let mut c = cluster_node();
    // 2^63 s and more used to reach etcd as a negative TTL (granted as
    // 2 s), then panic the standby duties' `lease_ttl * 2`.
    for secs in [9_000_000_001, 1 << 63, u64::MAX] {
        c.cluster.lease_ttl = Duration::from_secs(secs);
        assert_eq!(
            c.validate(),
            Err(ConfigError::LeaseTtlTooLong {
                secs,
                max: 9_000_000_000
            })
        );
    }
    c.cluster.lease_ttl = MAX_LEASE_TTL;
    #[cfg(feature = "cluster")]
    assert_eq!(c.validate(), Ok(()));
}
