//! Reaching a server from the CLI: a protocol client for the data
//! commands, an admin API call for `rules` and `usage`. A failure prints why
//! and becomes the exit code (2: cannot reach; 1: the server refused).

use crate::admin_client;
use std::process::ExitCode;
use std::time::Duration;
use tollgate_client::{Client, ClientConfig};

/// A client to `server`, every call bounded by `timeout`.
pub(super) async fn connect(server: &str, timeout: Duration) -> Result<Client, ExitCode> {
    let config = ClientConfig {
        deadline: timeout,
        connect_timeout: timeout,
        client_name: "tollgate-cli".into(),
        ..ClientConfig::default()
    };
    Client::connect(server.to_owned(), config)
        .await
        .map_err(|e| {
            eprintln!("error: cannot reach {server}: {e}");
            ExitCode::from(2)
        })
}

/// One admin API call for the CLI: the JSON answer, or the exit code after
/// printing why not.
pub(super) async fn admin_json(
    admin: &str,
    method: hyper::Method,
    path: &str,
    timeout: Duration,
) -> Result<serde_json::Value, ExitCode> {
    match admin_client::call(admin, method, path, None, timeout).await {
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
