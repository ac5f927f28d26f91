//! `tollgate health`: asks the admin API's `/healthz` (or `/readyz`) and
//! exits 0 on 200. The container health check: it needs no auth token (both
//! paths are open) and no HTTP tool in the image.

use super::remote::{admin_json, AdminArgs};
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The admin API (address; `--tls-ca` when it speaks HTTPS; no token
    /// is needed for /healthz and /readyz).
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Ask /readyz (serving, not draining) instead of /healthz.
    #[arg(long)]
    pub ready: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// Exit codes: 0 on 200, 1 on another status (503 while starting or
/// draining), 2 when the admin API cannot be reached.
pub(super) async fn run(args: HealthArgs) -> ExitCode {
    let path = if args.ready { "/readyz" } else { "/healthz" };
    match admin_json(&args.admin, hyper::Method::GET, path, args.timeout).await {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}
