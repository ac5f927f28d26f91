//! Reaching a server from the CLI: a protocol client for the data
//! commands ([`ServerArgs`]), an admin API call for `rules`, `usage` and
//! `promote` ([`AdminArgs`]). A failure prints why and becomes the exit code
//! (2: cannot reach; 1: the server refused).

use crate::admin_client::{self, AdminTarget};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tollgate_client::{Client, ClientConfig};

/// Which server a data command talks to, and the token it presents.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Server address.
    #[arg(long, default_value = crate::config::DEFAULT_LISTEN)]
    pub server: String,
    /// Client token for HELLO (the server's --auth-token).
    #[arg(long, env = "TOLLGATE_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// Speak TLS to the server, verifying its certificate against this CA
    /// (PEM); the certificate must name the host part of --server.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

/// Which admin API a command calls, and how.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Admin API address.
    #[arg(long, default_value = crate::config::DEFAULT_ADMIN)]
    pub admin: String,
    /// Admin API token, sent as `Authorization: Bearer` (the server's
    /// --admin-token).
    #[arg(long, env = "TOLLGATE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Speak HTTPS to the admin API, verifying its certificate against
    /// this CA (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

/// Longest one connection attempt of a keyed command may take, so a node
/// that accepts connections but answers nothing (paused) does not hold the
/// whole `--timeout`: the cluster client then asks the map again and may
/// find the slot's new primary.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

fn config(
    server: &ServerArgs,
    timeout: Duration,
    connect_timeout: Duration,
) -> Result<ClientConfig, ExitCode> {
    let tls = match &server.tls_ca {
        Some(ca) => Some(tollgate_client::tls::tls_trusting(ca).map_err(|e| {
            eprintln!("error: --tls-ca: {e}");
            ExitCode::from(2)
        })?),
        None => None,
    };
    Ok(ClientConfig {
        tls,
        deadline: timeout,
        connect_timeout,
        client_name: "tollgate-cli".into(),
        auth_token: server.auth_token.clone().map(String::into_bytes),
        ..ClientConfig::default()
    })
}

/// A client to `server`, every call bounded by `timeout`.
pub(super) async fn connect(server: &ServerArgs, timeout: Duration) -> Result<Client, ExitCode> {
    let addr = &server.server;
    Client::connect(addr.clone(), config(server, timeout, timeout)?)
        .await
        .map_err(|e| {
            eprintln!("error: cannot reach {addr}: {e}");
            ExitCode::from(2)
        })
}

/// A cluster-mode client seeded with `server` (any node of a cluster, or a
/// single server), for commands about keys: each key goes to its slot's
/// primary, following MOVED and waiting out TryAgain within `timeout`.
pub(super) async fn connect_routed(
    server: &ServerArgs,
    timeout: Duration,
) -> Result<Client, ExitCode> {
    let addr = &server.server;
    let config = config(server, timeout, timeout.min(ATTEMPT_TIMEOUT))?;
    Client::connect_cluster(vec![addr.clone()], config)
        .await
        .map_err(|e| {
            eprintln!("error: cannot reach {addr}: {e}");
            ExitCode::from(2)
        })
}

/// One admin API call for the CLI: the JSON answer, or the exit code after
/// printing why not.
pub(super) async fn admin_json(
    admin: &AdminArgs,
    method: hyper::Method,
    path: &str,
    timeout: Duration,
) -> Result<serde_json::Value, ExitCode> {
    let mut target = AdminTarget::plain(&admin.admin).with_token(admin.admin_token.clone());
    if let Some(ca) = &admin.tls_ca {
        target = target.with_ca(ca).map_err(|e| {
            eprintln!("error: --tls-ca: {e}");
            ExitCode::from(2)
        })?;
    }
    match admin_client::request(&target, method, path, None, timeout).await {
        Ok(a) if a.status.is_success() => Ok(a.json()),
        Ok(a) => {
            let v = a.json();
            let msg = v["error"].as_str().map_or_else(|| a.text(), str::to_owned);
            eprintln!("error: {} ({})", msg, a.status);
            Err(ExitCode::from(1))
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}
