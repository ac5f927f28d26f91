//! `tollgate promote`: make a standby the primary (PROMOTE).

use super::ping::PingArgs;
use super::remote::connect;
use std::process::ExitCode;

pub(super) async fn run(args: PingArgs) -> ExitCode {
    let client = match connect(&args.server, args.timeout).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match client.promote().await {
        Ok((epoch, true)) => {
            println!("{} is already primary at epoch {epoch}", args.server);
            ExitCode::SUCCESS
        }
        Ok((epoch, false)) => {
            println!("{} promoted to primary at epoch {epoch}", args.server);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
