//! `tollgate serve`: settings from flags over the config file over the
//! defaults, listeners, signals, then the server until SIGINT/SIGTERM.

use super::logging::init_logging;
use super::signals::{cancel_on_signal, reload_on_sighup};
use super::{Cli, Command};
use crate::config::{AdminAddr, ConfigFile, ServerConfig};
use crate::server::Server;
use clap::{Args, CommandFactory, FromArgMatches};
use std::path::PathBuf;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Read settings from this YAML file: the flags' names without the
    /// dashes, e.g. `max-memory: 1GiB`. Flags and environment variables
    /// override it.
    #[arg(long = "config", value_name = "FILE")]
    pub config_file: Option<PathBuf>,
    /// Print the effective settings (defaults, file and flags merged) as
    /// JSON and exit. The output loads back with --config.
    #[arg(long)]
    pub print_config: bool,
    // Last: each section opens its own --help heading.
    #[command(flatten)]
    pub config: ServerConfig,
}

/// With `serve --config FILE`, parses `argv` again with the file's settings
/// as the flags' defaults, so whatever the command line (or an environment
/// variable) says wins over the file.
pub(super) fn with_config_file(cli: Cli, argv: Vec<std::ffi::OsString>) -> Result<Cli, ExitCode> {
    let Command::Serve(args) = &cli.command else {
        return Ok(cli);
    };
    let Some(path) = &args.config_file else {
        return Ok(cli);
    };
    let file = match ConfigFile::load(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: config file: {e}");
            return Err(ExitCode::from(2));
        }
    };
    let command = Cli::command().mut_subcommand("serve", |serve| file.apply(serve));
    let matches = command
        .try_get_matches_from(argv)
        .unwrap_or_else(|e| e.exit());
    Ok(Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
}

pub(super) async fn run(args: ServeArgs) -> ExitCode {
    let config = args.config;
    if let Err(e) = config.validate() {
        eprintln!("error: invalid settings: {e}");
        return ExitCode::from(2);
    }
    if args.print_config {
        println!(
            "{}",
            serde_json::to_string_pretty(&config).expect("settings serialize")
        );
        return ExitCode::SUCCESS;
    }
    init_logging(config.logging.log_format);
    let listener = match tokio::net::TcpListener::bind(config.network.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.network.listen, error = %e, "cannot listen");
            return ExitCode::from(2);
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let admin = match config.admin.listen {
        AdminAddr::Off => None,
        AdminAddr::On(at) => match tokio::net::TcpListener::bind(at).await {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::error!(admin = %at, error = %e, "cannot listen for the admin API");
                return ExitCode::from(2);
            }
        },
    };
    let admin_addr = admin
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map_or_else(|| "none".to_owned(), |a| a.to_string());
    let mut server = match Server::new(config) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(admin) = admin {
        server = server.with_admin(admin);
    }
    tracing::info!(
        listen = %addr,
        admin = %admin_addr,
        tls = server.tls().is_some(),
        rules = server.rules().current().len(),
        version = env!("CARGO_PKG_VERSION"),
        "tollgate serving"
    );
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    tokio::spawn(reload_on_sighup(
        server.rules(),
        server.tls(),
        shutdown.clone(),
    ));
    match server.run(listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}
