//! Who may talk to a server ([`AuthSettings`]: client tokens, the cluster
//! secret, the admin token, `--insecure`), how its ports are encrypted
//! ([`TlsSettings`]), and protected mode ([`protected_mode`]): a port that
//! hosts other than this one can reach must ask for credentials unless
//! `--insecure` says otherwise.
//!
//! Invariants checked here, before anything listens:
//! - every secret is 1 to 255 bytes (it travels in HELLO's `token` field,
//!   or in an `Authorization` header);
//! - the cluster secret differs from every client token, so holding a
//!   client token never grants node-to-node control;
//! - pair mode (`--peer`, `--replica-of`) has a cluster secret, unless
//!   `--insecure`;
//! - `--tls-cert` and `--tls-key` come together; mTLS and the CA for the
//!   other node need them.

use super::{human, redacted, redacted_list, ConfigError, ServerConfig};
use crate::units::parse_duration;
use clap::Args;
use serde::Serialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub const DEFAULT_TLS_POLL: &str = "5s";
/// HELLO's `token_len` is one byte.
pub const MAX_SECRET_LEN: usize = 255;
/// Shortest client token or cluster secret accepted: 16 bytes (128 bits
/// when random) cannot be guessed by trying, the more so as a wrong token
/// closes the connection.
pub const MIN_SECRET_LEN: usize = 16;

/// Secrets: what clients, other nodes and operators must present.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "Security")]
#[serde(rename_all = "kebab-case")]
pub struct AuthSettings {
    /// Token clients must present in HELLO (none: clients need no token).
    #[arg(long, env = "TOLLGATE_AUTH_TOKEN", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub auth_token: Option<String>,

    /// A second client token accepted beside --auth-token, so tokens can be
    /// rotated without a window in which some clients are refused.
    #[arg(long, env = "TOLLGATE_AUTH_TOKEN_NEXT", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub auth_token_next: Option<String>,

    /// Secret the nodes of a pair present to each other in HELLO; only a
    /// connection that presents it may replicate, promote or announce a
    /// role. Required in pair mode; must differ from the client tokens.
    #[arg(long, env = "TOLLGATE_CLUSTER_SECRET", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub cluster_secret: Option<String>,

    /// A second cluster secret accepted (never presented), for rotation.
    #[arg(long, env = "TOLLGATE_CLUSTER_SECRET_NEXT", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub cluster_secret_next: Option<String>,

    /// Secret of the usage exchange between regions: this node's region
    /// senders prove it (instead of the cluster secret) to the other
    /// regions, and a connection proving it here may send USAGE and
    /// nothing else a node may (no replication, PROMOTE or HANDOFF).
    /// The same in every region; must differ from the other secrets.
    #[arg(long, env = "TOLLGATE_REGION_SECRET", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub region_secret: Option<String>,

    /// A secret this region shares with one peer region, NAME=SECRET
    /// (repeatable, or comma-separated; NAME is a --region-peer, and that
    /// region names this one with the same secret): this node's sender to
    /// NAME proves it instead of --region-secret, and a connection proving
    /// it here speaks for region NAME alone. USAGE naming NAME is then
    /// taken only over such a connection.
    #[arg(
        long,
        value_name = "NAME=SECRET",
        env = "TOLLGATE_REGION_PEER_SECRET",
        hide_env_values = true,
        value_delimiter = ','
    )]
    #[serde(serialize_with = "redacted_list")]
    pub region_peer_secret: Vec<String>,

    /// Bearer token the admin API requires (`Authorization: Bearer ...`)
    /// on every endpoint but /healthz and /readyz (none: no auth).
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub admin_token: Option<String>,

    /// A second admin token accepted beside --admin-token, for rotation.
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN_NEXT", hide_env_values = true)]
    #[serde(serialize_with = "redacted")]
    pub admin_token_next: Option<String>,

    /// Serve GET /metrics without the admin token (for scrapers that hold
    /// none).
    #[arg(long)]
    pub admin_open_metrics: bool,

    /// Run unprotected on purpose: listen beyond loopback without
    /// authentication, and, without a cluster secret, accept node-to-node
    /// control (replication, promotion, role announces) from any client.
    #[arg(long)]
    pub insecure: bool,
}

impl AuthSettings {
    /// `--region-peer-secret` as (region, secret) pairs (entries without
    /// `=` are left out: `validate` refuses them).
    pub fn region_peer_secrets(&self) -> Vec<(String, String)> {
        self.region_peer_secret
            .iter()
            .filter_map(|text| text.split_once('='))
            .map(|(name, secret)| (name.to_owned(), secret.to_owned()))
            .collect()
    }
}

/// TLS on every port: the protocol port (and so replication), the admin
/// API, and this node's own connections to its peer and primary.
#[derive(Debug, Clone, Default, Args, Serialize)]
#[command(next_help_heading = "TLS")]
#[serde(rename_all = "kebab-case")]
pub struct TlsSettings {
    /// Certificate chain (PEM) for the protocol and admin ports; with
    /// --tls-key every port speaks TLS only. Under mTLS the node also
    /// presents it as its client certificate to its peer and primary.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,

    /// CA (PEM) client certificates must chain to: the protocol port then
    /// requires a certificate from every client (mTLS). The admin port
    /// does not (probes hold none): it has --admin-token.
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,

    /// CA (PEM) this node verifies its peer's and primary's certificates
    /// against; pair mode with TLS needs it.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,

    /// How often the TLS files are checked for changes (0s: only on
    /// SIGHUP). New handshakes use the new certificate; open connections
    /// keep theirs.
    #[arg(long, default_value = DEFAULT_TLS_POLL, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub tls_poll: Duration,
}

impl TlsSettings {
    /// Whether the ports speak TLS.
    pub fn enabled(&self) -> bool {
        self.tls_cert.is_some()
    }
}

/// A port as protected mode judges it.
#[derive(Debug, Clone, Copy)]
pub struct Exposure {
    /// The port as the error names it, e.g. "the protocol port (--listen)".
    pub port: &'static str,
    pub addr: SocketAddr,
    /// What someone who reaches the port could do without credentials.
    pub risk: &'static str,
    /// Whether the port asks every connection for credentials.
    pub authenticated: bool,
    /// What would make it ask, e.g. "--auth-token (or TOLLGATE_AUTH_TOKEN)".
    pub fix: &'static str,
}

/// Protected mode: a port bound beyond loopback must authenticate, unless
/// `insecure` says the operator wants it open. Every listening port runs
/// through this check (the protocol and admin ports today).
pub fn protected_mode(exposure: &Exposure, insecure: bool) -> Result<(), ConfigError> {
    let loopback = exposure.addr.ip().to_canonical().is_loopback();
    if loopback || exposure.authenticated || insecure {
        return Ok(());
    }
    Err(ConfigError::Unprotected {
        port: exposure.port,
        addr: exposure.addr,
        risk: exposure.risk,
        fix: exposure.fix,
    })
}

impl ServerConfig {
    /// The protocol port, for protected mode: client tokens or mTLS
    /// authenticate it.
    pub fn protocol_exposure(&self, addr: SocketAddr) -> Exposure {
        Exposure {
            port: "the protocol port (--listen)",
            addr,
            risk: "charge, reset and exhaust any key",
            authenticated: self.auth.auth_token.is_some() || self.tls.tls_client_ca.is_some(),
            fix: "--auth-token (or TOLLGATE_AUTH_TOKEN), or --tls-client-ca for mTLS",
        }
    }

    /// The admin port, for protected mode: the admin token authenticates it.
    pub fn admin_exposure(&self, addr: SocketAddr) -> Exposure {
        Exposure {
            port: "the admin API (--admin)",
            addr,
            risk: "replace or delete the rules and promote the node",
            authenticated: self.auth.admin_token.is_some(),
            fix: "--admin-token (or TOLLGATE_ADMIN_TOKEN)",
        }
    }

    /// The security rules of the module docs, protected mode included.
    pub(super) fn validate_security(&self) -> Result<(), ConfigError> {
        let auth = &self.auth;
        // Client tokens and node secrets open the check path or a node's
        // control to the network: held to MIN_SECRET_LEN. The admin token is
        // not (an operator's, usually behind a loopback or private port).
        let secrets = [
            ("auth-token", &auth.auth_token, true),
            ("auth-token-next", &auth.auth_token_next, true),
            ("cluster-secret", &auth.cluster_secret, true),
            ("cluster-secret-next", &auth.cluster_secret_next, true),
            ("region-secret", &auth.region_secret, true),
            ("admin-token", &auth.admin_token, false),
            ("admin-token-next", &auth.admin_token_next, false),
        ];
        secret_lengths(&secrets)?;
        for (next, current, has_current) in [
            ("auth-token-next", "auth-token", auth.auth_token.is_some()),
            (
                "cluster-secret-next",
                "cluster-secret",
                auth.cluster_secret.is_some(),
            ),
            (
                "admin-token-next",
                "admin-token",
                auth.admin_token.is_some(),
            ),
        ] {
            let given = secrets.iter().any(|(n, s, _)| *n == next && s.is_some());
            if given && !has_current {
                return Err(ConfigError::NextWithoutCurrent { next, current });
            }
        }
        let cluster = [&auth.cluster_secret, &auth.cluster_secret_next];
        let clients = [&auth.auth_token, &auth.auth_token_next];
        if cluster
            .iter()
            .filter_map(|s| s.as_deref())
            .any(|c| clients.iter().any(|t| t.as_deref() == Some(c)))
        {
            return Err(ConfigError::ClusterSecretIsAClientToken);
        }
        if let Some(region) = auth.region_secret.as_deref() {
            if cluster
                .iter()
                .chain(&clients)
                .any(|s| s.as_deref() == Some(region))
            {
                return Err(ConfigError::RegionSecretReused);
            }
        }
        self.validate_region_peer_secrets()?;
        if self.replication.pair_mode() && auth.cluster_secret.is_none() && !auth.insecure {
            return Err(ConfigError::PairWithoutSecret);
        }
        let exchange_secret = auth.cluster_secret.is_some()
            || auth.region_secret.is_some()
            || !auth.region_peer_secret.is_empty();
        if !self.regions.region_peer.is_empty() && !exchange_secret && !auth.insecure {
            return Err(ConfigError::RegionsWithoutSecret);
        }
        if self.cluster.enabled() && auth.cluster_secret.is_none() && !auth.insecure {
            return Err(ConfigError::ClusterWithoutSecret);
        }
        self.validate_tls()?;
        protected_mode(&self.protocol_exposure(self.network.listen), auth.insecure)?;
        if let super::AdminAddr::On(addr) = self.admin.listen {
            protected_mode(&self.admin_exposure(addr), auth.insecure)?;
        }
        Ok(())
    }

    fn validate_tls(&self) -> Result<(), ConfigError> {
        let tls = &self.tls;
        if tls.tls_cert.is_some() != tls.tls_key.is_some() {
            return Err(ConfigError::TlsHalf);
        }
        if !tls.enabled() {
            for (name, given) in [
                ("tls-client-ca", tls.tls_client_ca.is_some()),
                ("tls-ca", tls.tls_ca.is_some()),
            ] {
                if given {
                    return Err(ConfigError::TlsNeedsCert { name });
                }
            }
        }
        let nodes_connect = self.replication.pair_mode()
            || self.cluster.enabled()
            || !self.regions.region_peer.is_empty();
        if tls.enabled() && nodes_connect && tls.tls_ca.is_none() {
            return Err(ConfigError::PairTlsWithoutCa);
        }
        Ok(())
    }
}

impl ServerConfig {
    /// `--region-peer-secret`: NAME=SECRET of a configured peer region,
    /// each named once, each secret of a node secret's length and no other
    /// secret of this node (the error names the region, never the secret).
    fn validate_region_peer_secrets(&self) -> Result<(), ConfigError> {
        let auth = &self.auth;
        let peers = self.regions.peers()?;
        let others = [
            &auth.auth_token,
            &auth.auth_token_next,
            &auth.cluster_secret,
            &auth.cluster_secret_next,
            &auth.region_secret,
        ];
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for text in &auth.region_peer_secret {
            let bad = |region: &str, reason: &str| ConfigError::RegionPeerSecret {
                region: region.to_owned(),
                reason: reason.to_owned(),
            };
            let Some((name, secret)) = text.split_once('=') else {
                return Err(bad("?", "expected NAME=SECRET"));
            };
            if !peers.iter().any(|p| p.name == name) {
                return Err(bad(name, "not a --region-peer"));
            }
            if seen.iter().any(|(region, _)| *region == name) {
                return Err(bad(name, "the region is named twice"));
            }
            // A secret proves one region: shared by two, it would name neither.
            if seen.iter().any(|(_, other)| *other == secret) {
                return Err(bad(name, "another peer region has the same secret"));
            }
            seen.push((name, secret));
            if secret.len() < MIN_SECRET_LEN || secret.len() > MAX_SECRET_LEN {
                return Err(bad(name, "a secret is 16 to 255 bytes"));
            }
            if others.iter().any(|o| o.as_deref() == Some(secret)) {
                return Err(bad(name, "the secret is also another secret of this node"));
            }
        }
        Ok(())
    }
}

/// Every secret fits HELLO (1 to 255 bytes); client tokens and cluster
/// secrets (those marked) are at least [`MIN_SECRET_LEN`]. The admin
/// token is not held to the minimum: it guards a loopback port by
/// default, and operators type it.
fn secret_lengths(secrets: &[(&'static str, &Option<String>, bool)]) -> Result<(), ConfigError> {
    for &(name, secret, held_to_min) in secrets {
        let Some(s) = secret else { continue };
        if s.is_empty() || s.len() > MAX_SECRET_LEN {
            return Err(ConfigError::SecretLength {
                name,
                len: s.len(),
                max: MAX_SECRET_LEN,
            });
        }
        if held_to_min && s.len() < MIN_SECRET_LEN {
            return Err(ConfigError::SecretTooShort {
                name,
                len: s.len(),
                min: MIN_SECRET_LEN,
            });
        }
    }
    Ok(())
}
