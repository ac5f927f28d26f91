//! `tollgate rules`: the server's named rules as a table (admin API), after
//! a reload if asked.

use super::remote::{admin_json, AdminArgs};
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct RulesArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Reload the rules file first (POST /v1/rules/reload).
    #[arg(long)]
    pub reload: bool,
    /// Print the API's JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(super) async fn run(args: RulesArgs) -> ExitCode {
    if args.reload {
        match admin_json(
            &args.admin,
            hyper::Method::POST,
            "/v1/rules/reload",
            args.timeout,
        )
        .await
        {
            Ok(v) if !args.json => println!("reloaded: {} rules", v["rules"]),
            Ok(_) => {}
            Err(code) => return code,
        }
    }
    let v = match admin_json(&args.admin, hyper::Method::GET, "/v1/rules", args.timeout).await {
        Ok(v) => v,
        Err(code) => return code,
    };
    if args.json {
        println!("{v}");
        return ExitCode::SUCCESS;
    }
    let empty = Vec::new();
    let rules = v["rules"].as_array().unwrap_or(&empty);
    println!(
        "{:<24} {:<15} {:>12} {:>8} {:>8} {:>5} {:<7} SHADOW",
        "NAME", "ALGORITHM", "RATE", "BURST", "WINDOW", "COST", "FAILURE"
    );
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for r in rules {
        println!(
            "{:<24} {:<15} {:>12} {:>8} {:>8} {:>5} {:<7} {}",
            text(&r["name"]),
            text(&r["algorithm"]),
            text(&r["rate"]),
            text(&r["burst"]),
            text(&r["window"]),
            text(&r["default-cost"]),
            text(&r["failure-mode"]),
            text(&r["shadow"]),
        );
    }
    if let Some(status) = v["last_reload"].as_object() {
        if status.get("ok") == Some(&serde_json::Value::Bool(false)) {
            eprintln!(
                "warning: the last reload failed: {}",
                text(&v["last_reload"]["error"])
            );
        }
    }
    ExitCode::SUCCESS
}
