//! `tollgate usage KEY`: a key's state and its use of each rule (admin API).

use super::remote::{admin_json, AdminArgs};
use crate::admin_client::segment;
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// The key, e.g. `rl:{acme}:search`.
    pub key: String,
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Only under this rule.
    #[arg(long)]
    pub rule: Option<String>,
    /// Print the API's JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(super) async fn run(args: UsageArgs) -> ExitCode {
    let mut path = format!("/v1/limits/{}", segment(&args.key));
    if let Some(rule) = &args.rule {
        path.push_str(&format!("?rule={}", segment(rule)));
    }
    let v = match admin_json(&args.admin, hyper::Method::GET, &path, args.timeout).await {
        Ok(v) => v,
        Err(code) => return code,
    };
    if args.json {
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    if v["state"].is_null() {
        println!("{}: no state (every limit is full)", args.key);
        return ExitCode::SUCCESS;
    }
    println!(
        "{} (slot {}): {} state, expires in {} ms",
        args.key,
        v["slot"],
        v["state"]["algorithm"].as_str().unwrap_or("?"),
        v["state"]["expires_in_ms"]
    );
    let empty = Vec::new();
    for u in v["usage"].as_array().unwrap_or(&empty) {
        println!(
            "  {:<24} used {} of {}, remaining {}, full again in {} ms{}",
            u["rule"].as_str().unwrap_or("?"),
            u["used"],
            u["limit"],
            u["remaining"],
            u["reset_after_ms"],
            if u["shadow"] == true { " (shadow)" } else { "" },
        );
    }
    ExitCode::SUCCESS
}
