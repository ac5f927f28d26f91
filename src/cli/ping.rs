//! `tollgate ping`: one PING round trip.

use super::remote::{connect, ServerArgs};
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

/// `tollgate ping`'s arguments.
#[derive(Debug, Args)]
pub struct PingArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(super) async fn run(args: PingArgs) -> ExitCode {
    let client = match connect(&args.server, args.timeout).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.ping().await {
        Ok(rtt) => {
            println!("PONG from {} in {:?}", args.server.server, rtt);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
