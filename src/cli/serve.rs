//! `tollgate serve`: settings from flags over the config file over the
//! defaults, listeners, signals, then the server until SIGINT/SIGTERM.

use super::logging::init_logging;
use super::signals::{cancel_on_signal, reload_on_sighup};
use super::{Cli, Command};
use crate::config::{AdminAddr, ConfigError, ConfigFile, ServerConfig};
use crate::huge_pages::{self, HostMode, HugePages};
use crate::server::Server;
use clap::{Args, CommandFactory, FromArgMatches};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio::net::TcpListener;
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

pub(super) async fn run(
    args: ServeArgs,
    heap_pages: Option<std::io::Result<huge_pages::Applied>>,
) -> ExitCode {
    let config = args.config;
    if let Err(e) = validate(&config) {
        eprintln!("error: invalid settings: {e}");
        return ExitCode::from(2);
    }
    if args.print_config {
        let text = serde_json::to_string_pretty(&config).expect("settings serialize");
        // A reader that stops early (`| head`) is no error: `println!`
        // would panic on the closed pipe.
        let _ = writeln!(std::io::stdout().lock(), "{text}");
        return ExitCode::SUCCESS;
    }
    init_logging(config.logging.log_format);
    if let Some(applied) = heap_pages {
        log_huge_pages(applied);
    }
    let Ok(listeners) = Listeners::bind(&config).await else {
        return ExitCode::from(2);
    };
    let built = if config.cluster.enabled() {
        join_cluster(config, &listeners.protocol, listeners.admin.as_ref()).await
    } else {
        Server::new(config)
    };
    match built {
        Ok(server) => serve(server, listeners).await,
        Err(e) => {
            tracing::error!(error = %e, "cannot start");
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Every port `serve` listens on, bound before the server is built: a port
/// that cannot be had stops it at start.
struct Listeners {
    protocol: TcpListener,
    admin: Option<TcpListener>,
    resp: Option<TcpListener>,
    envoy: Option<TcpListener>,
}

impl Listeners {
    /// Binds the configured ports; Err (logged) when one cannot be had.
    async fn bind(config: &ServerConfig) -> Result<Self, ()> {
        let protocol = match crate::server::bind(config.network.listen, config.network.backlog) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(listen = %config.network.listen, error = %e, "cannot listen");
                return Err(());
            }
        };
        let admin = match config.admin.listen {
            AdminAddr::Off => None,
            AdminAddr::On(at) => match TcpListener::bind(at).await {
                Ok(l) => Some(l),
                Err(e) => {
                    tracing::error!(admin = %at, error = %e, "cannot listen for the admin API");
                    return Err(());
                }
            },
        };
        let backlog = config.network.backlog;
        Ok(Self {
            protocol,
            admin,
            resp: bind_frontend(config.frontends.resp, backlog, "RESP front end").await?,
            envoy: bind_frontend(
                config.frontends.envoy_rls,
                backlog,
                "Envoy rate limit service",
            )
            .await?,
        })
    }
}

/// Hands the ports to the server, logs where it serves, and runs it until
/// SIGINT/SIGTERM (SIGHUP reloads the rules and the TLS files).
async fn serve(mut server: Server, listeners: Listeners) -> ExitCode {
    let Listeners {
        protocol,
        admin,
        resp,
        envoy,
    } = listeners;
    let addr = protocol
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let admin_addr = listening_on(admin.as_ref());
    let resp_addr = listening_on(resp.as_ref());
    let envoy_addr = listening_on(envoy.as_ref());
    if let Some(admin) = admin {
        server = server.with_admin(admin);
    }
    if let Some(resp) = resp {
        server = server.with_resp(resp);
    }
    if let Some(envoy) = envoy {
        server = server.with_envoy_rls(envoy);
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    tokio::spawn(reload_on_sighup(
        server.rules(),
        server.tls(),
        shutdown.clone(),
    ));
    // Logged once the signals are handled: a supervisor may signal
    // from here on.
    tracing::info!(
        listen = %addr,
        admin = %admin_addr,
        resp = %resp_addr,
        envoy_rls = %envoy_addr,
        tls = server.tls().is_some(),
        rules = server.rules().current().len(),
        version = env!("CARGO_PKG_VERSION"),
        "tollgate serving"
    );
    match server.run(protocol, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}

/// The settings' checks: as plain values (`config`), then cluster mode's
/// by the control plane's rules.
fn validate(config: &ServerConfig) -> Result<(), ConfigError> {
    config.validate()?;
    #[cfg(feature = "cluster")]
    crate::node::check_cluster_settings(&config.cluster)?;
    Ok(())
}

/// What `--huge-pages` came to: logged once at start, with a warning when
/// `on` cannot take effect on this host.
fn log_huge_pages(applied: std::io::Result<huge_pages::Applied>) {
    let applied = match applied {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "cannot set the heap's huge-page policy");
            return;
        }
    };
    let mode = applied.mode.name();
    let host = applied.host.map_or("none", HostMode::name);
    tracing::info!(
        huge_pages = mode,
        host_thp = host,
        effective = applied.effective(),
        "heap pages"
    );
    if applied.mode == HugePages::On {
        if applied.process_disabled {
            tracing::warn!(
                "--huge-pages on has no effect: transparent huge pages are disabled for this \
                 process (PR_SET_THP_DISABLE, inherited from its parent)"
            );
        } else if !applied.effective() {
            tracing::warn!(
                host_thp = host,
                "--huge-pages on has no effect: the host's THP mode \
                 (/sys/kernel/mm/transparent_hugepage/enabled) is not madvise or always"
            );
        }
    }
}

/// Cluster mode: registers this node in etcd under the address others
/// reach it at (`--advertise`, else the bound address, which must then be
/// a real one, not `0.0.0.0`).
#[cfg(feature = "cluster")]
async fn join_cluster(
    config: ServerConfig,
    listener: &TcpListener,
    admin: Option<&TcpListener>,
) -> Result<Server, crate::server::StartError> {
    use crate::cluster::ClusterError;
    let bound = listener.local_addr().map_err(|e| {
        crate::server::StartError::Cluster(ClusterError::Settings(format!(
            "cannot read the listen address: {e}"
        )))
    })?;
    let advertise = match &config.replication.advertise {
        Some(a) => a.clone(),
        None if bound.ip().is_unspecified() => {
            return Err(ClusterError::Settings(format!(
                "listening on {bound}: give --advertise HOST:PORT, the address other nodes and \
                 clients reach this node at"
            ))
            .into())
        }
        None => bound.to_string(),
    };
    let admin =
        admin
            .and_then(|l| l.local_addr().ok())
            .map(|a| match &config.replication.advertise {
                // Reachable at the advertised host, on the admin port.
                Some(host) if a.ip().is_unspecified() => host
                    .rsplit_once(':')
                    .map_or_else(|| a.to_string(), |(h, _)| format!("{h}:{}", a.port())),
                _ => a.to_string(),
            });
    Server::join_cluster(config, advertise, admin).await
}

/// Without the `cluster` feature, settings validation refuses `--etcd`
/// before this is reached.
#[cfg(not(feature = "cluster"))]
async fn join_cluster(
    config: ServerConfig,
    _listener: &TcpListener,
    _admin: Option<&TcpListener>,
) -> Result<Server, crate::server::StartError> {
    Server::new(config)
}

/// Binds a drop-in front end's port when it is configured; Err (logged)
/// when it cannot listen.
async fn bind_frontend(
    at: Option<std::net::SocketAddr>,
    backlog: u32,
    what: &str,
) -> Result<Option<TcpListener>, ()> {
    let Some(at) = at else { return Ok(None) };
    // With --backlog, as the protocol port: tokio's own bind asks for 128,
    // and a burst of new connections past it waits on SYN-ACK retries.
    match crate::server::bind(at, backlog) {
        Ok(l) => Ok(Some(l)),
        Err(e) => {
            tracing::error!(addr = %at, error = %e, "cannot listen for the {what}");
            Err(())
        }
    }
}

/// The address a listener is bound to, for the log ("none": not running).
fn listening_on(listener: Option<&TcpListener>) -> String {
    listener
        .and_then(|l| l.local_addr().ok())
        .map_or_else(|| "none".to_owned(), |a| a.to_string())
}
