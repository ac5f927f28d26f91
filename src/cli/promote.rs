//! `tollgate promote`: make a node the primary through its admin API
//! (`POST /v1/promote`). Promotion is an operator's action, authenticated
//! by the admin token; the protocol's PROMOTE is for the nodes of a pair.

use super::remote::{admin_json, AdminArgs};
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct PromoteArgs {
    #[command(flatten)]
    pub admin: AdminArgs,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(super) async fn run(args: PromoteArgs) -> ExitCode {
    let v = match admin_json(
        &args.admin,
        hyper::Method::POST,
        "/v1/promote",
        args.timeout,
    )
    .await
    {
        Ok(v) => v,
        Err(code) => return code,
    };
    let node = v["addr"].as_str().unwrap_or(&args.admin.admin);
    let epoch = &v["epoch"];
    if v["was_primary"] == true {
        println!("{node} is already primary at epoch {epoch}");
    } else {
        println!("{node} promoted to primary at epoch {epoch}");
    }
    ExitCode::SUCCESS
}
