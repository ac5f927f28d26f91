//! The control plane's settings, made from the server's: `config` holds
//! the cluster flags as plain values, and the etcd settings, their checks
//! and the keyspace are the control plane's (`crate::cluster`), so they
//! are built here, where both are known.

use crate::cluster::{EtcdAccess, EtcdSettings, Keyspace};
use crate::config::{ClusterSettings, ConfigError, EtcdAccessArgs};

/// How the node talks to etcd.
pub(crate) fn etcd_settings(config: &ClusterSettings) -> Result<EtcdSettings, String> {
    let endpoints = EtcdSettings::parse_endpoints(config.etcd.as_deref().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    Ok(EtcdSettings {
        endpoints,
        lease_ttl: config.lease_ttl,
        lease_margin: config.lease_margin,
        keepalive_interval: config.lease_renew,
        request_timeout: config.etcd_timeout,
        connect_timeout: config.etcd_timeout,
        access: etcd_access(&config.etcd_access),
    })
}

/// The credentials, as the control plane takes them (checked when the
/// settings are validated, files read when connecting).
pub(crate) fn etcd_access(args: &EtcdAccessArgs) -> EtcdAccess {
    EtcdAccess {
        tls_ca: args.etcd_tls_ca.clone(),
        cert: args.etcd_cert.clone(),
        key: args.etcd_key.clone(),
        user: args.etcd_user.clone(),
        password: args.etcd_password.clone(),
        password_file: args.etcd_password_file.clone(),
    }
}

/// The control plane's own checks of cluster mode's settings (endpoints,
/// lease timings, credentials, the cluster's name), after
/// [`ServerConfig::validate`](crate::config::ServerConfig::validate)
/// checked them as plain values. Nothing to check outside cluster mode.
pub(crate) fn check_settings(config: &ClusterSettings) -> Result<(), ConfigError> {
    if !config.enabled() {
        return Ok(());
    }
    let etcd = etcd_settings(config).map_err(ConfigError::Cluster)?;
    etcd.validate()
        .map_err(|e| ConfigError::Cluster(e.to_string()))?;
    Keyspace::new(config.cluster.as_deref().unwrap_or_default())
        .map_err(|e| ConfigError::Cluster(e.to_string()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServerConfig;
    use std::time::Duration;

    #[test]
    fn the_flags_defaults_are_the_control_planes() {
        let mut c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
        assert_eq!(check_settings(&c.cluster), Ok(()), "not in cluster mode");
        c.cluster.etcd = Some("127.0.0.1:2379".into());
        c.cluster.cluster = Some("prod".into());
        c.cluster.shard = Some(0);
        assert_eq!(check_settings(&c.cluster), Ok(()));
        let etcd = etcd_settings(&c.cluster).unwrap();
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
    }

    #[test]
    fn the_control_plane_refuses_what_etcd_cannot_take() {
        let mut c = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
        c.cluster.etcd = Some("127.0.0.1:2379".into());
        c.cluster.cluster = Some("prod".into());
        c.cluster.shard = Some(0);
        c.cluster.lease_ttl = Duration::from_millis(1500);
        let err = check_settings(&c.cluster).unwrap_err().to_string();
        assert!(err.contains("whole seconds"), "{err}");
        c.cluster.lease_ttl = Duration::from_secs(5);
        c.cluster.cluster = Some("a/b".into());
        assert!(check_settings(&c.cluster).is_err());
        c.cluster.cluster = Some("prod".into());
        c.cluster.etcd = Some(" , ".into());
        let err = check_settings(&c.cluster).unwrap_err().to_string();
        assert!(err.contains("no etcd endpoint"), "{err}");
    }
}
