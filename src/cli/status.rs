//! `tollgate status`: a node's role, epoch, offsets, primary and lag.

use super::remote::{connect, ServerArgs};
use super::render::render_status;
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(super) async fn run(args: StatusArgs) -> ExitCode {
    let client = match connect(&args.server, args.timeout).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.status().await {
        Ok(s) => {
            println!("{}", render_status(&s, args.json));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
