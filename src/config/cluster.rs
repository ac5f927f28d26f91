//! Cluster mode's settings: how the node reaches etcd, which cluster and
//! shard it joins, and the lease that fences its writes as a primary.

use super::{human, redacted, ConfigError, ReplicationSettings};
use crate::addr::etcd_endpoint;
use crate::units::parse_duration;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_LEASE_TTL: &str = "5s";
pub const DEFAULT_LEASE_MARGIN: &str = "500ms";
pub const DEFAULT_LEASE_RENEW: &str = "1s";
pub const DEFAULT_ETCD_TIMEOUT: &str = "2s";
pub const DEFAULT_CAMPAIGN_DELAY: &str = "1s";

/// Cluster mode: the node joins a cluster recorded in etcd (`cluster
/// init`), as a primary or a standby of its shard, elected by etcd. Only
/// with the cargo feature `cluster`; off while `--etcd` is unset.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Cluster")]
#[serde(rename_all = "kebab-case")]
pub struct ClusterSettings {
    /// etcd members, HOST:PORT[,HOST:PORT...]: join the cluster named by
    /// --cluster, as a node of shard --shard (cluster mode).
    #[arg(long, value_name = "HOST:PORT[,...]")]
    pub etcd: Option<String>,

    /// The cluster's name, as given to `tollgate cluster init`.
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,

    /// The shard this node serves, as its primary or a standby (0 to the
    /// number of shards minus one).
    #[arg(long, value_name = "S")]
    pub shard: Option<u16>,

    /// TTL of this node's etcd lease (whole seconds, at most etcd's
    /// 9000000000s): a primary that stops renewing it is replaced after
    /// about this long.
    #[arg(long, default_value = DEFAULT_LEASE_TTL, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub lease_ttl: Duration,

    /// Taken off the lease's expiry when the node computes until when it may
    /// serve as primary: covers clock rate differences with etcd.
    #[arg(long, default_value = DEFAULT_LEASE_MARGIN, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub lease_margin: Duration,

    /// How often the lease is renewed.
    #[arg(long, default_value = DEFAULT_LEASE_RENEW, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub lease_renew: Duration,

    /// Longest wait for one etcd request (and for a connection to a member).
    #[arg(long, default_value = DEFAULT_ETCD_TIMEOUT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub etcd_timeout: Duration,

    /// A node whose copy of its shard is not known complete (it restarted
    /// empty, or lost its stream) waits this long after its shard lost its
    /// primary before it runs for election, so that a standby holding the
    /// data wins.
    #[arg(long, default_value = DEFAULT_CAMPAIGN_DELAY, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub campaign_delay: Duration,

    #[command(flatten)]
    #[serde(flatten)]
    pub etcd_access: EtcdAccessArgs,
}

impl ClusterSettings {
    /// Whether the node runs in cluster mode.
    pub fn enabled(&self) -> bool {
        self.etcd.is_some() || self.cluster.is_some() || self.shard.is_some()
    }

    pub(super) fn validate(&self, replication: &ReplicationSettings) -> Result<(), ConfigError> {
        if !self.enabled() {
            return Ok(());
        }
        let missing = [
            ("etcd", self.etcd.is_none()),
            ("cluster", self.cluster.is_none()),
            ("shard", self.shard.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(ConfigError::Cluster(format!(
                "cluster mode needs --etcd, --cluster and --shard together (--{name} is missing)"
            )));
        }
        let pair = [
            ("peer", replication.peer.is_some()),
            ("replica-of", replication.replica_of.is_some()),
            ("failover-after", replication.failover_after.is_some()),
        ];
        if let Some((name, _)) = pair.iter().find(|(_, set)| *set) {
            return Err(ConfigError::Cluster(format!(
                "--{name} is a pair-mode setting: in cluster mode etcd elects each shard's primary"
            )));
        }
        // An endpoint with no port, or one out of range, was dialled on
        // port 80 (etcd-client's URL default) instead of being refused.
        let endpoints = self.etcd.as_deref().unwrap_or_default();
        for endpoint in endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            etcd_endpoint(endpoint).map_err(|reason| ConfigError::Address {
                flag: "etcd",
                value: endpoint.to_owned(),
                reason,
            })?;
        }
        if self.campaign_delay.is_zero() {
            return Err(ConfigError::ZeroDuration {
                name: "campaign-delay",
            });
        }
        // The rest of the lease timings, the credentials and the cluster's
        // name are checked by the control plane's own rules when the node builds
        // its etcd settings from these (node::cluster::settings), which
        // `tollgate serve` does right after this.
        #[cfg(not(feature = "cluster"))]
        return Err(ConfigError::Cluster(
            "this binary was built without cluster mode (cargo feature `cluster`)".into(),
        ));
        #[cfg(feature = "cluster")]
        Ok(())
    }
}

/// How to authenticate to etcd: TLS and an etcd user. The same flags on
/// `tollgate serve` and every `tollgate cluster` command.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct EtcdAccessArgs {
    /// CA certificate(s), PEM, that signed etcd's client certificate: talk
    /// to etcd over TLS (a HOST:PORT endpoint means https://).
    #[arg(long, value_name = "FILE", env = "TOLLGATE_ETCD_TLS_CA")]
    pub etcd_tls_ca: Option<PathBuf>,

    /// Client certificate, PEM, presented to etcd (for etcd's
    /// --client-cert-auth); needs --etcd-key and --etcd-tls-ca.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key of --etcd-cert, PEM.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,

    /// etcd user (etcd with `auth enable`); needs a password.
    #[arg(long, value_name = "NAME", env = "TOLLGATE_ETCD_USER")]
    pub etcd_user: Option<String>,

    /// The etcd user's password. Prefer TOLLGATE_ETCD_PASSWORD or
    /// --etcd-password-file: a command line is visible to every local user.
    #[arg(
        long,
        value_name = "PASS",
        env = "TOLLGATE_ETCD_PASSWORD",
        hide_env_values = true
    )]
    #[serde(serialize_with = "redacted")]
    pub etcd_password: Option<String>,

    /// A file whose first line is the etcd user's password.
    #[arg(long, value_name = "FILE", env = "TOLLGATE_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
}
