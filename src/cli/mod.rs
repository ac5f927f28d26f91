//! The `tollgate` binary's commands, one file each: [`serve`], [`check`],
//! [`release`], [`ping`], [`status`], [`promote`], [`rules`], [`usage`],
//! [`health`], [`cluster`];
//! beside them what several share: [`render`](mod@render) (how answers print),
//! `remote` (reaching a server), `signals` and `logging` (of `serve`).
//!
//! `serve` runs the server on built-in defaults (every setting a flag, or a
//! key of `--config FILE`); the others are small clients over
//! `tollgate-client` (`check` and `release` in its cluster mode, so any
//! node of a cluster serves every key), handy for smoke tests and for seeing what a limit does
//! before putting it in a gateway; `rules`, `usage` and `promote` wrap the
//! admin HTTP API. Exit codes: 0 success, 1 the server refused the request (or, for
//! `release`, the lease was no longer held), 2 usage or connection errors.

pub mod check;
pub mod cluster;
pub mod health;
mod logging;
pub mod ping;
pub mod promote;
pub mod release;
mod remote;
pub mod render;
pub mod rules;
pub mod serve;
mod signals;
pub mod status;
pub mod usage;

pub use check::{CheckArgs, UsageError, DEFAULT_LEASE_TTL_MS};
pub use health::HealthArgs;
pub use ping::PingArgs;
pub use promote::PromoteArgs;
pub use release::ReleaseArgs;
pub use render::{render, render_status};
pub use rules::RulesArgs;
pub use serve::ServeArgs;
pub use status::StatusArgs;
pub use usage::UsageArgs;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "In-memory rate-limit counter server"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (defaults need no config file).
    Serve(Box<ServeArgs>),
    /// Check (and charge) one key against an inline limit or a named rule.
    #[command(after_help = check::ALGORITHM_HELP)]
    Check(CheckArgs),
    /// Release a concurrency lease acquired by a check.
    Release(ReleaseArgs),
    /// Round-trip a PING to a server.
    Ping(PingArgs),
    /// Show a node's role, epoch, replication offset, primary and lag.
    Status(StatusArgs),
    /// Make a standby the primary through its admin API (its epoch goes up
    /// by one).
    Promote(PromoteArgs),
    /// List the server's named rules (admin API), or reload them.
    Rules(RulesArgs),
    /// Show the current usage of a key under the server's rules (admin API).
    Usage(UsageArgs),
    /// Exit 0 when the admin API answers /healthz (or /readyz) with 200:
    /// the container health check, which needs no auth token and no curl.
    Health(HealthArgs),
    /// Cluster mode: create a cluster in etcd, show it, move slots.
    Cluster(cluster::ClusterArgs),
}

pub fn main() -> ExitCode {
    // Before anything allocates much: see `huge_pages::hold`.
    let held = crate::huge_pages::hold();
    let argv: Vec<_> = std::env::args_os().collect();
    let cli = match serve::with_config_file(Cli::parse_from(&argv), argv) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // The heap's huge-page policy: before the runtime starts its threads and
    // before the store allocates (src/huge_pages.rs); `serve` logs it.
    let huge_pages = match &cli.command {
        Command::Serve(args) => Some(held.and_then(|h| h.apply(args.config.store.huge_pages))),
        _ => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve::run(*args, huge_pages)),
        Command::Check(args) => runtime.block_on(check::run(args)),
        Command::Release(args) => runtime.block_on(release::run(args)),
        Command::Ping(args) => runtime.block_on(ping::run(args)),
        Command::Status(args) => runtime.block_on(status::run(args)),
        Command::Promote(args) => runtime.block_on(promote::run(args)),
        Command::Rules(args) => runtime.block_on(rules::run(args)),
        Command::Usage(args) => runtime.block_on(usage::run(args)),
        Command::Health(args) => runtime.block_on(health::run(args)),
        Command::Cluster(args) => runtime.block_on(cluster::run(args)),
    }
}

#[cfg(test)]
mod tests;
