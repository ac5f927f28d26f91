//! Server settings, grouped by concern: every limit has a named default, a
//! flag, and the same name in the config file.
//!
//! `tollgate serve` runs on these defaults with no config file. Each
//! section ([`NetworkSettings`], [`AuthSettings`], [`TlsSettings`],
//! [`LimitSettings`], [`StoreSettings`], [`RuleSettings`],
//! [`OverloadSettings`], [`ReplicationSettings`], [`ClusterSettings`], [`AdminSettings`],
//! [`FrontendSettings`],
//! [`LogSettings`]) is flattened into the command line (`--kebab-case`
//! flags, one `--help` heading each) and into one flat namespace of names
//! shared by the flags, the config file and `--print-config`.
//! [`ServerConfig::validate`] only checks and returns a typed error; an
//! impossible combination stops the server at start with that message.
//!
//! Each layer reads its own section: the server the network and limits, the
//! node its replication settings, the store a `StoreConfig` the node
//! builds from them (`ServerConfig::store_config`, in node/store_settings.rs:
//! the store does not know this module, nor this module the store).

mod admin_hosts;
mod cluster;
mod events;
mod file;
mod frontends;
mod overload;
mod regions;
mod replication;
mod sections;
mod security;

pub use crate::addr::is_host_name;
pub use admin_hosts::{AllowedHostError, AllowedHosts};
pub use cluster::*;
pub use events::*;
pub use file::{ConfigFile, FileError};
pub use frontends::*;
pub use overload::*;
pub use regions::*;
pub use replication::*;
pub use sections::*;
pub use security::*;

use crate::units::{format_duration, UnitError};
use clap::Args;
use serde::{Serialize, Serializer};
use std::net::SocketAddr;
use std::time::Duration;

/// Every setting of `tollgate serve`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct ServerConfig {
    #[command(flatten)]
    #[serde(flatten)]
    pub network: NetworkSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub auth: AuthSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub limits: LimitSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub store: StoreSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub rules: RuleSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub overload: OverloadSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub replication: ReplicationSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub regions: RegionSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub cluster: ClusterSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub admin: AdminSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub frontends: FrontendSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub events: EventSettings,
    #[command(flatten)]
    #[serde(flatten)]
    pub logging: LogSettings,
}

/// A setting that cannot work, found before the server starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} must be at least {min}, got {value}")]
    TooSmall {
        name: &'static str,
        value: u64,
        min: u64,
    },
    #[error("{name} must be at most {max}, got {value}")]
    TooLarge {
        name: &'static str,
        value: u64,
        max: u64,
    },
    #[error("max-frame {max_frame} cannot hold one check of max-group {max_group} pairs with keys of max-key-len {max_key_len}: needs {needed}")]
    FrameTooSmallForGroup {
        max_frame: u32,
        max_group: u8,
        max_key_len: u16,
        needed: u64,
    },
    #[error("max-memory {max_memory} gives each of the {stripes} stripes {share} bytes, under the {min} a stripe needs: raise --max-memory or lower --stripes")]
    MemoryTooSmall {
        max_memory: usize,
        stripes: usize,
        share: usize,
        min: usize,
    },
    #[error("{name} must be non-zero")]
    ZeroDuration { name: &'static str },
    #[error("{name} must be at most {max}, got {value}")]
    TooLong {
        name: &'static str,
        value: String,
        max: String,
    },
    #[error("{name} ({value}) must be longer than {than} ({bound})")]
    NotLongerThan {
        name: &'static str,
        value: String,
        than: &'static str,
        bound: String,
    },
    #[error("{name} must be whole seconds, got {value:?}")]
    NotWholeSeconds { name: &'static str, value: Duration },
    #[error("{0}")]
    Cluster(String),
    #[error("--{flag} {value:?}: {reason}")]
    Address {
        flag: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("--{flag} {value} is this node itself (its --listen or --advertise): a node cannot follow or probe itself; name the other node of the pair")]
    ItsOwnPeer { flag: &'static str, value: String },
    #[error(transparent)]
    Unit(#[from] UnitError),
    #[error("refusing to listen on {addr} for {port} without authentication: anyone who can reach it could {risk}. Set {fix}, listen on a loopback address such as 127.0.0.1, or pass --insecure to run it open on purpose")]
    Unprotected {
        port: &'static str,
        addr: SocketAddr,
        risk: &'static str,
        fix: &'static str,
    },
    #[error("pair mode (--peer or --replica-of) needs --cluster-secret (or TOLLGATE_CLUSTER_SECRET), the same on both nodes, and different from the client tokens: without it the nodes could not replicate to each other. Generate one, e.g. `openssl rand -hex 32`; or pass --insecure to let any client replicate and change roles")]
    PairWithoutSecret,
    #[error("cluster mode (--etcd) needs --cluster-secret (or TOLLGATE_CLUSTER_SECRET), the same on every node of the cluster, and different from the client tokens: the nodes replicate and hand states to each other with it. Generate one, e.g. `openssl rand -hex 32`; or pass --insecure to let any client do so")]
    ClusterWithoutSecret,
    #[error("--cluster-secret must differ from the client tokens (--auth-token, --auth-token-next): a client holding the token could otherwise control the node")]
    ClusterSecretIsAClientToken,
    #[error("{name} must be 1 to {max} bytes, got {len}")]
    SecretLength {
        name: &'static str,
        len: usize,
        max: usize,
    },
    #[error("--region-secret must differ from the cluster secrets and the client tokens: a region peer holding it may send USAGE only")]
    RegionSecretReused,
    #[error("--region-peer-secret for region {region:?}: {reason}")]
    RegionPeerSecret { region: String, reason: String },
    #[error("--{name} is {len} bytes: a client token or node secret must be at least {min} bytes, so it cannot be guessed. Generate one, e.g. `openssl rand -hex 32`")]
    SecretTooShort {
        name: &'static str,
        len: usize,
        min: usize,
    },
    #[error("--{next} is the second secret accepted during a rotation: it needs --{current}")]
    NextWithoutCurrent {
        next: &'static str,
        current: &'static str,
    },
    #[error("--tls-cert and --tls-key go together: give both, or neither")]
    TlsHalf,
    #[error("--{name} needs --tls-cert and --tls-key")]
    TlsNeedsCert { name: &'static str },
    #[error("region name {0:?} must be 1 to 64 characters out of A-Z a-z 0-9 _ - .")]
    RegionName(String),
    #[error("--region-peer {value:?}: {reason}")]
    RegionPeer { value: String, reason: String },
    #[error("--region-peer needs --region: the peers must know which region this node is")]
    PeersWithoutRegion,
    #[error("--region-peer needs --region-secret (or TOLLGATE_REGION_SECRET) or --cluster-secret (or TOLLGATE_CLUSTER_SECRET), the same in every region: the usage exchange is a node-to-node exchange. Or pass --insecure to let any client send usage")]
    RegionsWithoutSecret,
    #[error("--region-ceiling must be a share in (0, 1], got {0}")]
    CeilingShare(String),
    #[error("--{flag} needs a build with the cargo feature `{feature}` (cargo build --features {feature})")]
    NotBuiltIn {
        flag: &'static str,
        feature: &'static str,
    },
    #[error("--events {url:?} is not a NATS address: give nats://HOST:PORT (or tls://HOST:PORT)")]
    EventsUrl { url: String },
    #[error("--events-subject {subject:?} must be 1 to {max} bytes of dot-separated tokens, without spaces or the wildcards * and >")]
    EventsSubject { subject: String, max: usize },
    #[error("{name} must be a fraction from 0 to 1, got {value}")]
    NotAFraction { name: &'static str, value: String },
    #[error("pair mode, cluster mode or region peers with TLS need --tls-ca: the CA that signed the other nodes' certificates, to verify them")]
    PairTlsWithoutCa,
    #[error("decision events credentials: {reason}")]
    EventsAuth { reason: &'static str },
}

impl ServerConfig {
    /// The settings `tollgate serve` uses with no flags, listening on `listen`.
    pub fn with_listen(listen: SocketAddr) -> Self {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            config: ServerConfig,
        }
        let mut config = <Wrapper as clap::Parser>::parse_from(["tollgate"]).config;
        config.network.listen = listen;
        config
    }

    /// Checks every section; the first impossible setting is the error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.network.validate()?;
        self.limits.validate()?;
        // One frame of the largest size must be able to arrive.
        let largest = u64::from(self.limits.max_frame) + 4;
        at_least(
            "max-connection-memory",
            self.network.max_connection_memory as u64,
            largest,
        )?;
        self.store.validate()?;
        self.overload.validate()?;
        self.replication.validate(self.network.listen)?;
        self.regions.validate()?;
        self.cluster.validate(&self.replication)?;
        self.admin.validate()?;
        self.events.validate()?;
        self.validate_security()?;
        self.validate_frontends()
    }
}

fn at_least(name: &'static str, value: u64, min: u64) -> Result<(), ConfigError> {
    if value < min {
        return Err(ConfigError::TooSmall { name, value, min });
    }
    Ok(())
}

fn at_most(name: &'static str, value: u64, max: u64) -> Result<(), ConfigError> {
    if value > max {
        return Err(ConfigError::TooLarge { name, value, max });
    }
    Ok(())
}

fn at_most_long(name: &'static str, value: Duration, max: Duration) -> Result<(), ConfigError> {
    if value > max {
        return Err(ConfigError::TooLong {
            name,
            value: format_duration(value),
            max: format_duration(max),
        });
    }
    Ok(())
}

fn longer(
    name: &'static str,
    value: Duration,
    than: &'static str,
    bound: Duration,
) -> Result<(), ConfigError> {
    if value <= bound {
        return Err(ConfigError::NotLongerThan {
            name,
            value: format_duration(value),
            than,
            bound: format_duration(bound),
        });
    }
    Ok(())
}

fn human<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

fn human_opt<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_duration(*d)),
        None => s.serialize_none(),
    }
}

/// What `--print-config` shows of a secret.
pub const REDACTED: &str = "<redacted>";

fn redacted<S: Serializer>(t: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(_) => s.serialize_str(REDACTED),
        None => s.serialize_none(),
    }
}

/// A list of secrets, as `--print-config` shows it.
fn redacted_list<S: Serializer>(t: &[String], s: S) -> Result<S::Ok, S::Error> {
    if t.is_empty() {
        s.serialize_none()
    } else {
        s.serialize_str(REDACTED)
    }
}

#[cfg(test)]
mod tests;
