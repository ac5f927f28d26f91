//! The `tollgate` binary's commands: `serve`, `check`, `release`, `ping`,
//! `rules`, `usage`, `status`, `promote`, `health`.
//!
//! `serve` runs the server on built-in defaults (every setting a flag);
//! the others are small clients over `tollgate-client`,
//! handy for smoke tests and for seeing what a limit does before putting it
//! in a gateway; `rules` and `usage` wrap the admin HTTP API. Exit codes:
//! 0 success, 1 the server refused the request (or, for `release`, the
//! lease was no longer held), 2 usage or connection errors.

use crate::admin_client::{self, segment};
use crate::config::{AdminAddr, LogFormat, ServerConfig};
use crate::rules::ReloadSource;
use crate::server::Server;
use crate::units::{parse_duration, parse_millis, Rate};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tollgate_client::{Client, ClientConfig};
use tollgate_protocol::{
    Algorithm, CheckBatch, CheckResult, Decision, Limit, LimitRef, Pair, RuleName, RETRY_NEVER,
};

/// How `check`'s flags map to each algorithm's limit (shown by `--help`).
const ALGORITHM_HELP: &str = "\
Algorithms (--algorithm) and the flags each takes:
  token-bucket (default)  --rate R [--burst B]
      refills R continuously, holds at most B (default: R's count)
  sliding-window          --rate R [--window W]
      at most R per window W (default: R's period), the previous window
      weighted by its overlap
  fixed-window            --rate R [--window W]
      at most R per window W aligned on the server clock; up to 2x the
      limit can pass across a window boundary
  sliding-log             --rate R [--window W]
      exactly at most R in any span W; for small limits (the count per
      window is capped by the server's --max-log-entries, default 1000)
  leaky-bucket            --rate R [--burst B]
      one request every R's period/count, smoothly; B early arrivals
      tolerated (default 1: strict spacing)
  concurrency             --max-in-flight N [--lease-ttl D]   (or --rate N/D)
      at most N in flight; an allowed check prints a lease id, held for D
      (default 30s) unless freed first with `tollgate release`

With --window, R is scaled to the window and must come out whole: 100/min
over --window 30s is 50 per 30 s.";

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
    #[command(after_help = ALGORITHM_HELP)]
    Check(CheckArgs),
    /// Release a concurrency lease acquired by a check.
    Release(ReleaseArgs),
    /// Round-trip a PING to a server.
    Ping(PingArgs),
    /// Show a node's role, epoch, replication offset, primary and lag.
    Status(StatusArgs),
    /// Make a standby the primary (its epoch goes up by one).
    Promote(PingArgs),
    /// List the server's named rules (admin API), or reload them.
    Rules(RulesArgs),
    /// Show the current usage of a key under the server's rules (admin API).
    Usage(UsageArgs),
    /// Exit 0 when the admin API answers /healthz (or /readyz) with 200:
    /// the container health check, which needs no auth token and no curl.
    Health(HealthArgs),
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Admin API address.
    #[arg(long, default_value = crate::config::DEFAULT_ADMIN)]
    pub admin: String,
    /// Ask /readyz (serving, not draining) instead of /healthz.
    #[arg(long)]
    pub ready: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct RulesArgs {
    /// Admin API address.
    #[arg(long, default_value = crate::config::DEFAULT_ADMIN)]
    pub admin: String,
    /// Reload the rules file first (POST /v1/rules/reload).
    #[arg(long)]
    pub reload: bool,
    /// Print the API's JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// The key, e.g. `rl:{acme}:search`.
    pub key: String,
    /// Admin API address.
    #[arg(long, default_value = crate::config::DEFAULT_ADMIN)]
    pub admin: String,
    /// Only under this rule.
    #[arg(long)]
    pub rule: Option<String>,
    /// Print the API's JSON as it is.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ServerConfig,
    /// Print the effective settings as JSON and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmArg {
    TokenBucket,
    SlidingWindow,
    FixedWindow,
    SlidingLog,
    LeakyBucket,
    Concurrency,
}

impl AlgorithmArg {
    pub fn algorithm(self) -> Algorithm {
        match self {
            Self::TokenBucket => Algorithm::TokenBucket,
            Self::SlidingWindow => Algorithm::SlidingWindow,
            Self::FixedWindow => Algorithm::FixedWindow,
            Self::SlidingLog => Algorithm::SlidingLog,
            Self::LeakyBucket => Algorithm::LeakyBucket,
            Self::Concurrency => Algorithm::Concurrency,
        }
    }
}

/// Lease time to live of `--algorithm concurrency` without `--lease-ttl`.
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Server address.
    #[arg(long, default_value = crate::config::DEFAULT_LISTEN)]
    pub server: String,
    /// The key to check, e.g. `rl:{apikey}:search`.
    #[arg(long)]
    pub key: String,
    /// Check against this named rule of the server instead of an inline
    /// limit (`--cost 0`: the rule's default cost).
    #[arg(
        long,
        conflicts_with_all = ["rate", "burst", "window", "algorithm", "max_in_flight", "lease_ttl"]
    )]
    pub rule: Option<String>,
    /// The limiting algorithm (see below for the flags each takes).
    #[arg(long, value_enum, default_value_t = AlgorithmArg::TokenBucket)]
    pub algorithm: AlgorithmArg,
    /// Rate: `5/s`, `100/min`, `10000/day` (concurrency: N/lease-ttl).
    #[arg(long)]
    pub rate: Option<Rate>,
    /// Bucket capacity (token-bucket; default: the rate's count) or
    /// tolerance (leaky-bucket; default 1).
    #[arg(long)]
    pub burst: Option<u64>,
    /// Window length (sliding-window, fixed-window, sliding-log; default:
    /// the rate's period).
    #[arg(long, value_parser = parse_millis)]
    pub window: Option<u64>,
    /// Most units in flight (concurrency).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: Option<u64>,
    /// How long a lease lives unless released (concurrency; default 30s).
    #[arg(long, value_parser = parse_millis)]
    pub lease_ttl: Option<u64>,
    /// Units this request takes.
    #[arg(long, default_value_t = 1)]
    pub cost: u32,
    /// Send this many identical checks in one batch ("at once").
    #[arg(long, default_value_t = 1)]
    pub repeat: u16,
    /// Answer without charging (PEEK).
    #[arg(long, conflicts_with = "refund")]
    pub peek: bool,
    /// Give `--cost` units back instead of taking them (REFUND).
    #[arg(long)]
    pub refund: bool,
    /// Print one JSON object per decision.
    #[arg(long)]
    pub json: bool,
    /// Give up after this long.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Server address.
    #[arg(long, default_value = crate::config::DEFAULT_LISTEN)]
    pub server: String,
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

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[arg(long, default_value = crate::config::DEFAULT_LISTEN)]
    pub server: String,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct PingArgs {
    #[arg(long, default_value = crate::config::DEFAULT_LISTEN)]
    pub server: String,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// A command-line mistake, found before anything is sent.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum UsageError {
    #[error("{flag} does not apply to {algorithm} (see `tollgate check --help`)")]
    FlagNotFor {
        flag: &'static str,
        algorithm: &'static str,
    },
    #[error("{algorithm} needs --rate (or name a server rule with --rule)")]
    MissingRate { algorithm: &'static str },
    #[error("concurrency needs --max-in-flight N (and optionally --lease-ttl D), or --rate N/D")]
    MissingMaxInFlight,
    #[error(
        "concurrency takes either --rate N/D or --max-in-flight N and --lease-ttl D, not both"
    )]
    RateAndMaxInFlight,
    #[error("rate {rate} over a {window_ms} ms window is not a whole count of at least 1")]
    UnevenWindow { rate: Rate, window_ms: u64 },
    #[error("--repeat must be at least 1")]
    ZeroRepeat,
    #[error("--rule: {0}")]
    RuleName(#[from] tollgate_protocol::InvalidRuleName),
}

impl CheckArgs {
    /// The rule or inline limit these flags describe.
    pub fn limit_ref(&self) -> Result<LimitRef, UsageError> {
        match &self.rule {
            Some(name) => Ok(LimitRef::Rule(RuleName::try_from(name.as_str())?)),
            None => self.limit().map(LimitRef::Inline),
        }
    }

    /// The wire limit these flags describe.
    pub fn limit(&self) -> Result<Limit, UsageError> {
        let algorithm = self.algorithm.algorithm();
        let name = algorithm.name();
        let refuse = |flag: &'static str, given: bool| {
            if given {
                Err(UsageError::FlagNotFor {
                    flag,
                    algorithm: name,
                })
            } else {
                Ok(())
            }
        };
        let rate = || self.rate.ok_or(UsageError::MissingRate { algorithm: name });
        if algorithm != Algorithm::Concurrency {
            refuse("--max-in-flight", self.max_in_flight.is_some())?;
            refuse("--lease-ttl", self.lease_ttl.is_some())?;
        }
        let limit = |count, period_ms, burst| Limit {
            algorithm,
            count,
            period_ms,
            burst,
        };
        match algorithm {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                refuse("--window", self.window.is_some())?;
                let rate = rate()?;
                // A token bucket grants its rate's count at once by default;
                // a leaky bucket spaces requests strictly by default.
                let default_burst = if algorithm == Algorithm::TokenBucket {
                    rate.count
                } else {
                    1
                };
                Ok(limit(
                    rate.count,
                    rate.period_ms,
                    self.burst.unwrap_or(default_burst),
                ))
            }
            Algorithm::SlidingWindow | Algorithm::FixedWindow | Algorithm::SlidingLog => {
                refuse("--burst", self.burst.is_some())?;
                let rate = rate()?;
                let window_ms = self.window.unwrap_or(rate.period_ms);
                let scaled = u128::from(rate.count) * u128::from(window_ms);
                let period = u128::from(rate.period_ms);
                let uneven = UsageError::UnevenWindow { rate, window_ms };
                if scaled % period != 0 || scaled < period {
                    return Err(uneven);
                }
                let count = u64::try_from(scaled / period).map_err(|_| uneven)?;
                Ok(limit(count, window_ms, 0))
            }
            Algorithm::Concurrency => {
                refuse("--burst", self.burst.is_some())?;
                refuse("--window", self.window.is_some())?;
                let (count, ttl_ms) = match (self.rate, self.max_in_flight) {
                    (Some(_), Some(_)) => return Err(UsageError::RateAndMaxInFlight),
                    (Some(_), None) if self.lease_ttl.is_some() => {
                        return Err(UsageError::RateAndMaxInFlight)
                    }
                    (Some(rate), None) => (rate.count, rate.period_ms),
                    (None, Some(n)) => (n, self.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL_MS)),
                    (None, None) => return Err(UsageError::MissingMaxInFlight),
                };
                Ok(limit(count, ttl_ms, 0))
            }
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::Serve(args) => runtime.block_on(serve(*args)),
        Command::Check(args) => runtime.block_on(check(args)),
        Command::Release(args) => runtime.block_on(release(args)),
        Command::Ping(args) => runtime.block_on(ping(args)),
        Command::Status(args) => runtime.block_on(status(args)),
        Command::Promote(args) => runtime.block_on(promote(args)),
        Command::Rules(args) => runtime.block_on(rules(args)),
        Command::Usage(args) => runtime.block_on(usage(args)),
        Command::Health(args) => runtime.block_on(health(args)),
    }
}

async fn serve(args: ServeArgs) -> ExitCode {
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
    init_logging(config.log_format);
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(listen = %config.listen, error = %e, "cannot listen");
            return ExitCode::from(2);
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let admin = match config.admin {
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
        rules = server.rules().current().len(),
        version = env!("CARGO_PKG_VERSION"),
        "tollgate serving"
    );
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    tokio::spawn(reload_on_sighup(server.rules(), shutdown.clone()));
    match server.run(listener, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn cancel_on_signal(token: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    token.cancel();
}

/// SIGHUP reloads the rules file (a bad file leaves the rules as they were;
/// the outcome is logged and counted by the rules themselves).
async fn reload_on_sighup(rules: std::sync::Arc<crate::rules::Rules>, stop: CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::error!("cannot install the SIGHUP handler");
            return;
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                got = hup.recv() => if got.is_none() { return },
            }
            tracing::info!("SIGHUP: reloading rules");
            let _ = rules.reload(ReloadSource::Signal).await;
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (rules, stop);
    }
}

fn client_config(timeout: Duration) -> ClientConfig {
    ClientConfig {
        deadline: timeout,
        connect_timeout: timeout,
        client_name: "tollgate-cli".into(),
        ..ClientConfig::default()
    }
}

async fn check(args: CheckArgs) -> ExitCode {
    let limit = match args.limit_ref() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.repeat == 0 {
        eprintln!("error: {}", UsageError::ZeroRepeat);
        return ExitCode::from(2);
    }
    let client = match Client::connect(args.server.clone(), client_config(args.timeout)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach {}: {e}", args.server);
            return ExitCode::from(2);
        }
    };
    let mut batch = CheckBatch::with_capacity(args.repeat.into());
    for _ in 0..args.repeat {
        batch.push(Pair {
            key: args.key.clone().into(),
            limit: limit.clone(),
            cost: args.cost,
        });
    }
    let results = if args.peek {
        client.peek_batch(batch).await
    } else if args.refund {
        client.refund_batch(batch).await
    } else {
        client.check_batch(batch).await
    };
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut code = ExitCode::SUCCESS;
    for result in results {
        match result {
            CheckResult::Decision(d) => println!("{}", render(&d, args.json)),
            CheckResult::Error(e) => {
                eprintln!("error: server refused the check: {e}");
                code = ExitCode::from(1);
            }
        }
    }
    code
}

/// One decision as a line of text or a JSON object. A concurrency
/// acquire's lease is shown (`lease=ID`, `"lease": ID`) when there is one.
pub fn render(d: &Decision, json: bool) -> String {
    let retry = (d.retry_after_ms != RETRY_NEVER).then_some(d.retry_after_ms);
    if json {
        let mut v = serde_json::json!({
            "allowed": d.allowed,
            "limit": d.limit,
            "remaining": d.remaining,
            "reset_after_ms": d.reset_after_ms,
            "retry_after_ms": retry,
        });
        if let Some(lease) = d.lease {
            v["lease"] = lease.into();
        }
        v.to_string()
    } else {
        let verdict = if d.allowed { "allowed" } else { "denied " };
        let retry = retry.map_or("never".to_owned(), |ms| format!("{ms}ms"));
        let lease = d.lease.map_or(String::new(), |id| format!(" lease={id}"));
        format!(
            "{verdict} limit={} remaining={} reset_after={}ms retry_after={retry}{lease}",
            d.limit, d.remaining, d.reset_after_ms
        )
    }
}

async fn release(args: ReleaseArgs) -> ExitCode {
    let client = match Client::connect(args.server.clone(), client_config(args.timeout)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach {}: {e}", args.server);
            return ExitCode::from(2);
        }
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

async fn ping(args: PingArgs) -> ExitCode {
    let client = match Client::connect(args.server.clone(), client_config(args.timeout)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach {}: {e}", args.server);
            return ExitCode::from(2);
        }
    };
    match client.ping().await {
        Ok(rtt) => {
            println!("PONG from {} in {:?}", args.server, rtt);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// One admin API call for the CLI: the JSON answer, or the exit code after
/// printing why not.
async fn admin_json(
    admin: &str,
    method: hyper::Method,
    path: &str,
    timeout: Duration,
) -> Result<serde_json::Value, ExitCode> {
    match admin_client::call(admin, method, path, None, timeout).await {
        Ok(a) if a.status.is_success() => Ok(a.json()),
        Ok(a) => {
            let v = a.json();
            let msg = v["error"].as_str().map_or_else(|| a.text(), str::to_owned);
            eprintln!("error: {} ({})", msg, a.status);
            Err(ExitCode::from(1))
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

async fn rules(args: RulesArgs) -> ExitCode {
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

/// Exit codes: 0 on 200, 1 on another status (503 while starting or
/// draining), 2 when the admin API cannot be reached.
async fn health(args: HealthArgs) -> ExitCode {
    let path = if args.ready { "/readyz" } else { "/healthz" };
    match admin_json(&args.admin, hyper::Method::GET, path, args.timeout).await {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

async fn usage(args: UsageArgs) -> ExitCode {
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

async fn status(args: StatusArgs) -> ExitCode {
    let client = match Client::connect(args.server.clone(), client_config(args.timeout)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach {}: {e}", args.server);
            return ExitCode::from(2);
        }
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

/// A STATUS answer as `key: value` lines or one JSON object.
pub fn render_status(s: &tollgate_protocol::NodeStatus, json: bool) -> String {
    let role = match s.role {
        tollgate_protocol::Role::Primary => "primary",
        tollgate_protocol::Role::Standby => "standby",
    };
    if json {
        crate::repl::status_json(s).to_string()
    } else {
        let mut out = format!(
            "role: {role}\nepoch: {}\noffset: {}\naddr: {}\nprimary: {}",
            s.epoch,
            s.offset,
            s.addr,
            if s.primary.is_empty() {
                "-"
            } else {
                &s.primary
            }
        );
        if let Some(lag) = s.field("lag_ms") {
            out.push_str(&format!("\nlag: {lag}ms"));
        }
        for (name, value) in &s.fields {
            out.push_str(&format!("\n{name}: {value}"));
        }
        out
    }
}

async fn promote(args: PingArgs) -> ExitCode {
    let client = match Client::connect(args.server.clone(), client_config(args.timeout)).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: cannot reach {}: {e}", args.server);
            return ExitCode::from(2);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Result<CheckArgs, clap::Error> {
        let mut argv = vec!["tollgate", "check", "--key", "k"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Check(a) => Ok(a),
            _ => unreachable!(),
        }
    }

    #[test]
    fn token_bucket_flags() {
        let l = args(&["--rate", "5/s", "--burst", "10"])
            .unwrap()
            .limit()
            .unwrap();
        assert_eq!((l.count, l.period_ms, l.burst), (5, 1000, 10));
        let l = args(&["--rate", "100/min"]).unwrap().limit().unwrap();
        assert_eq!((l.count, l.period_ms, l.burst), (100, 60_000, 100));
    }

    #[test]
    fn sliding_window_flags() {
        let a = args(&[
            "--rate",
            "100/min",
            "--algorithm",
            "sliding-window",
            "--window",
            "30s",
        ]);
        let l = a.unwrap().limit().unwrap();
        assert_eq!(
            (l.algorithm, l.count, l.period_ms, l.burst),
            (Algorithm::SlidingWindow, 50, 30_000, 0)
        );
        let a = args(&[
            "--rate",
            "5/s",
            "--algorithm",
            "sliding-window",
            "--window",
            "1500ms",
        ]);
        assert!(matches!(
            a.unwrap().limit(),
            Err(UsageError::UnevenWindow { .. })
        ));
        let a = args(&[
            "--rate",
            "5/s",
            "--algorithm",
            "sliding-window",
            "--burst",
            "3",
        ]);
        assert_eq!(
            a.unwrap().limit(),
            Err(UsageError::FlagNotFor {
                flag: "--burst",
                algorithm: "sliding-window"
            })
        );
        let a = args(&["--rate", "5/s", "--window", "3s"]);
        assert_eq!(
            a.unwrap().limit(),
            Err(UsageError::FlagNotFor {
                flag: "--window",
                algorithm: "token-bucket"
            })
        );
    }

    /// (algorithm, count, period_ms, burst) of a flag set.
    fn shape(extra: &[&str]) -> Result<(Algorithm, u64, u64, u64), UsageError> {
        let l = args(extra).expect("flags parse").limit()?;
        Ok((l.algorithm, l.count, l.period_ms, l.burst))
    }

    #[test]
    fn every_algorithm_by_name_with_its_flags() {
        use Algorithm::*;
        for (flags, expected) in [
            (
                &[
                    "--algorithm",
                    "token-bucket",
                    "--rate",
                    "100/s",
                    "--burst",
                    "200",
                ][..],
                (TokenBucket, 100, 1000, 200),
            ),
            (
                &["--algorithm", "sliding-window", "--rate", "100/min"],
                (SlidingWindow, 100, 60_000, 0),
            ),
            (
                &["--algorithm", "fixed-window", "--rate", "10000/day"],
                (FixedWindow, 10_000, 86_400_000, 0),
            ),
            (
                &[
                    "--algorithm",
                    "fixed-window",
                    "--rate",
                    "60/min",
                    "--window",
                    "10s",
                ],
                (FixedWindow, 10, 10_000, 0),
            ),
            (
                &[
                    "--algorithm",
                    "sliding-log",
                    "--rate",
                    "5/s",
                    "--window",
                    "2s",
                ],
                (SlidingLog, 10, 2000, 0),
            ),
            (
                &["--algorithm", "leaky-bucket", "--rate", "10/s"],
                (LeakyBucket, 10, 1000, 1),
            ),
            (
                &[
                    "--algorithm",
                    "leaky-bucket",
                    "--rate",
                    "10/s",
                    "--burst",
                    "4",
                ],
                (LeakyBucket, 10, 1000, 4),
            ),
            (
                &["--algorithm", "concurrency", "--max-in-flight", "8"],
                (Concurrency, 8, 30_000, 0),
            ),
            (
                &[
                    "--algorithm",
                    "concurrency",
                    "--max-in-flight",
                    "8",
                    "--lease-ttl",
                    "2m",
                ],
                (Concurrency, 8, 120_000, 0),
            ),
            (
                &["--algorithm", "concurrency", "--rate", "3/45s"],
                (Concurrency, 3, 45_000, 0),
            ),
        ] {
            assert_eq!(shape(flags), Ok(expected), "{flags:?}");
        }
        // Every wire algorithm has a flag value with its name.
        for a in Algorithm::ALL {
            let parsed = args(&["--algorithm", a.name()]).unwrap();
            assert_eq!(parsed.algorithm.algorithm(), a);
        }
    }

    #[test]
    fn flags_that_do_not_fit_the_algorithm_are_refused() {
        let refused = |flag, algorithm| Err(UsageError::FlagNotFor { flag, algorithm });
        for (flags, expected) in [
            (
                &[
                    "--algorithm",
                    "fixed-window",
                    "--rate",
                    "5/s",
                    "--burst",
                    "2",
                ][..],
                refused("--burst", "fixed-window"),
            ),
            (
                &[
                    "--algorithm",
                    "sliding-log",
                    "--rate",
                    "5/s",
                    "--burst",
                    "2",
                ],
                refused("--burst", "sliding-log"),
            ),
            (
                &[
                    "--algorithm",
                    "leaky-bucket",
                    "--rate",
                    "5/s",
                    "--window",
                    "2s",
                ],
                refused("--window", "leaky-bucket"),
            ),
            (
                &["--rate", "5/s", "--max-in-flight", "2"],
                refused("--max-in-flight", "token-bucket"),
            ),
            (
                &[
                    "--algorithm",
                    "sliding-window",
                    "--rate",
                    "5/s",
                    "--lease-ttl",
                    "2s",
                ],
                refused("--lease-ttl", "sliding-window"),
            ),
            (
                &[
                    "--algorithm",
                    "concurrency",
                    "--max-in-flight",
                    "2",
                    "--burst",
                    "1",
                ],
                refused("--burst", "concurrency"),
            ),
            (
                &[
                    "--algorithm",
                    "concurrency",
                    "--max-in-flight",
                    "2",
                    "--window",
                    "1s",
                ],
                refused("--window", "concurrency"),
            ),
            (
                &[
                    "--algorithm",
                    "concurrency",
                    "--rate",
                    "2/s",
                    "--max-in-flight",
                    "2",
                ],
                Err(UsageError::RateAndMaxInFlight),
            ),
            (
                &[
                    "--algorithm",
                    "concurrency",
                    "--rate",
                    "2/s",
                    "--lease-ttl",
                    "3s",
                ],
                Err(UsageError::RateAndMaxInFlight),
            ),
            (
                &["--algorithm", "concurrency", "--lease-ttl", "3s"],
                Err(UsageError::MissingMaxInFlight),
            ),
            (
                &["--algorithm", "fixed-window"],
                Err(UsageError::MissingRate {
                    algorithm: "fixed-window",
                }),
            ),
        ] {
            assert_eq!(shape(flags), expected, "{flags:?}");
        }
        assert!(args(&["--rate", "5/s", "--peek", "--refund"]).is_err());
        assert!(args(&["--algorithm", "concurrency", "--max-in-flight", "0"]).is_err());
        assert!(args(&["--algorithm", "no-such-thing", "--rate", "5/s"]).is_err());
    }

    #[test]
    fn help_documents_every_algorithm() {
        let mut help = Vec::new();
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.find_subcommand_mut("check")
            .unwrap()
            .write_long_help(&mut help)
            .unwrap();
        let help = String::from_utf8(help).unwrap();
        for a in Algorithm::ALL {
            assert!(help.contains(a.name()), "--help lacks {}", a.name());
        }
        assert!(help.contains("--max-in-flight N [--lease-ttl D]"));
    }

    #[test]
    fn release_flags() {
        let cli = Cli::try_parse_from(["tollgate", "release", "--key", "k", "--lease", "42"]);
        match cli.unwrap().command {
            Command::Release(a) => assert_eq!((a.key.as_str(), a.lease), ("k", 42)),
            other => panic!("{other:?}"),
        }
        assert!(Cli::try_parse_from(["tollgate", "release", "--key", "k"]).is_err());
    }

    #[test]
    fn bad_numbers_are_usage_errors() {
        for bad in [
            vec!["--rate", "0/s"],
            vec!["--rate", "-1/s"],
            vec!["--rate", "NaN/s"],
            vec!["--rate", "5/s", "--cost", "-1"],
            vec!["--rate", "5/s", "--cost", "99999999999"],
            vec!["--rate", "5/s", "--burst", "-3"],
            vec!["--rate", "5/s", "--window", "0s"],
        ] {
            assert!(args(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rule_flag_names_a_rule_instead_of_a_limit() {
        let a = args(&["--rule", "search", "--cost", "0", "--refund"]).unwrap();
        assert_eq!(
            a.limit_ref(),
            Ok(LimitRef::Rule(RuleName::from_static("search")))
        );
        let a = args(&["--rate", "5/s"]).unwrap();
        assert!(matches!(a.limit_ref(), Ok(LimitRef::Inline(_))));
        assert!(matches!(
            args(&["--rule", &"x".repeat(65)]).unwrap().limit_ref(),
            Err(UsageError::RuleName(_))
        ));
        // A rule carries its own numbers: no limit flag goes with it.
        for flags in [
            &["--rule", "r", "--rate", "5/s"][..],
            &["--rule", "r", "--burst", "2"],
            &["--rule", "r", "--window", "1s"],
            &["--rule", "r", "--algorithm", "fixed-window"],
            &["--rule", "r", "--max-in-flight", "2"],
            &["--rule", "r", "--lease-ttl", "1s"],
        ] {
            assert!(args(flags).is_err(), "{flags:?}");
        }
        // Neither a rule nor a rate: said before anything is sent.
        assert_eq!(
            args(&[]).unwrap().limit_ref(),
            Err(UsageError::MissingRate {
                algorithm: "token-bucket"
            })
        );
    }

    #[test]
    fn json_rendering() {
        let d = Decision {
            allowed: false,
            shadow_denied: false,
            pair: 0,
            limit: 10,
            remaining: 0,
            reset_after_ms: 2000,
            retry_after_ms: RETRY_NEVER,
            lease: None,
        };
        let v: serde_json::Value = serde_json::from_str(&render(&d, true)).unwrap();
        assert_eq!(v["allowed"], false);
        assert_eq!(v["retry_after_ms"], serde_json::Value::Null);
        assert_eq!(v["reset_after_ms"], 2000);
        assert_eq!(v.get("lease"), None);
        assert!(render(&d, false).contains("retry_after=never"));
        let leased = Decision {
            allowed: true,
            retry_after_ms: 0,
            lease: Some(77),
            ..d
        };
        let v: serde_json::Value = serde_json::from_str(&render(&leased, true)).unwrap();
        assert_eq!(v["lease"], 77);
        assert!(render(&leased, false).ends_with("retry_after=0ms lease=77"));
    }
}
