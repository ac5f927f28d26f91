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

/// A client to `server`, every call bounded by `timeout`.
pub(super) async fn connect(server: &ServerArgs, timeout: Duration) -> Result<Client, ExitCode> {
    let config = ClientConfig {
        deadline: timeout,
        connect_timeout: timeout,
        client_name: "tollgate-cli".into(),
        auth_token: server.auth_token.clone().map(String::into_bytes),
        ..ClientConfig::default()
    };
    let addr = &server.server;
    Client::connect(addr.clone(), config).await.map_err(|e| {
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
