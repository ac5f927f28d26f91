//! `tollgate release`: give a concurrency lease back before its time.

use super::remote::{connect, ServerArgs};
use crate::units::parse_duration;
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The key the lease was acquired on.
    #[arg(long)]
    pub key: String,
    /// The lease id printed by the check that acquired it.
    #[arg(long)]
    pub lease: u64,
    /// Give up after this long.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

pub(super) async fn run(args: ReleaseArgs) -> ExitCode {
    let client = match connect(&args.server, args.timeout).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.release(args.key.clone(), args.lease).await {
        Ok(true) => {
            println!("released lease {} of {}", args.lease, args.key);
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!(
                "lease {} of {} was not held (released already, or expired)",
                args.lease, args.key
            );
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
