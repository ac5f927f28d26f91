//! `tollgate-bench`: measures rate-limit checks per second and their latency
//! against Tollgate and, with the same workload in the same run, against
//! Redis running the seeds' token-bucket Lua script (and, optionally,
//! throttlecrab-server).
//!
//! ```text
//! tollgate-bench --compare tollgate=127.0.0.1:7700,redis=127.0.0.1:6390 \
//!     --connections 50 --pipeline 16 --keys 1000000 --duration 10s
//! ```
//!
//! # Layout
//!
//! ```text
//!  main (CLI) -> for each target, one after another:
//!     driver: connections x pipeline requests in flight (closed loop)
//!             or released by a pacer on a fixed schedule (open loop)
//!       -> targets::{tollgate, redis}: build a request of `batch` checks
//!          (keys from workload::KeyPicker), send it, count the answer
//!       -> recorder::Recorder (HDR histogram, counters, error reasons,
//!          per-interval timeline::Timeline with --plot)
//!  -> report: table, ratios, `--json` lines; plot: `--plot` SVG/HTML
//! ```
//!
//! - [`workload`]: key names, uniform/zipf pickers, the limit, the open-loop
//!   schedule;
//! - [`targets`]: the `Target`/`Connection` trait and its implementations;
//! - [`driver`]: closed and open loops, the pacer, the progress bar;
//! - [`recorder`]: what each connection records;
//! - [`timeline`]: per-interval samples for `--plot`;
//! - [`report`]: summaries, the table and the JSON line;
//! - [`plot`]: throughput and latency over time as SVG or an HTML page.

mod driver;
mod pipeline;
mod plot;
mod recorder;
mod report;
mod targets;
mod timeline;
mod workload;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use mimalloc::MiMalloc;
use tollgate_client::{Priority, RuleName};

use crate::driver::Plan;
use crate::report::{Summary, WorkloadFields};
use crate::targets::redis::RespTarget;
use crate::targets::tollgate::{Options as TollgateOptions, TollgateTarget};
use crate::targets::{RequestShape, Target, TargetError, TargetKind, TargetSpec};
use crate::workload::{KeyDistribution, KeySpace, LimitRate, Rule};

/// The generator shares the machine with the server it measures, so every
/// cycle it spends is taken from the server. glibc's allocator showed as
/// ~12% of the generator's profile (malloc_consolidate on each request's
/// task of over 1 KiB); mimalloc is a drop-in fix. It changes only this
/// binary, never the servers under test.
#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

/// Load generator for Tollgate, with Redis + Lua (and throttlecrab) as
/// baselines under the same workload.
///
/// Every target gets the same keys (`rl:{NNNNNNNNNNNN}`), distribution,
/// token-bucket rule, connections and requests in flight. A request is one
/// Tollgate CHECK frame of --batch checks, or for RESP targets a pipeline of
/// --batch commands written at once (EVALSHA for Redis, THROTTLE for
/// throttlecrab): `--pipeline P --batch B` keeps P*B checks in flight per
/// connection on every target.
#[derive(Debug, Parser)]
#[command(name = "tollgate-bench", version, about, long_about = None)]
struct Args {
    /// A target as KIND=HOST:PORT (tollgate, tollgate-cluster: the client's
    /// cluster mode seeded with the address, redis, redis-cell: Redis with
    /// the redis-cell module, throttlecrab); repeatable. Targets run one
    /// after another.
    #[arg(long, value_name = "KIND=ADDR")]
    target: Vec<TargetSpec>,

    /// Comma-separated targets to run one after another with the same
    /// settings, printing tollgate / each other ratios, e.g.
    /// tollgate=127.0.0.1:7700,redis=127.0.0.1:6390.
    #[arg(long, value_name = "KIND=ADDR,...", value_delimiter = ',')]
    compare: Vec<TargetSpec>,

    /// TCP connections per target.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    connections: u32,

    /// Requests in flight per connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pipeline: u32,

    /// Checks per request: one Tollgate frame, or a RESP pipeline of that
    /// many commands.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    batch: u32,

    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    keys: u32,

    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = Dist::Uniform)]
    distribution: Dist,

    /// Zipf exponent (with --distribution zipf): key of rank r is drawn
    /// with probability proportional to 1/r^skew.
    #[arg(long, default_value_t = 0.99)]
    zipf_skew: f64,

    /// Tokens each check takes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    cost: u32,

    /// Token bucket refill as COUNT/PERIOD. The default (100/min, burst
    /// 100) is the seeds' Lua benchmark rule (capacity 100, 1.67 tokens/s),
    /// so figures cross-check with redis-baseline.sh; with many keys nearly
    /// every check is allowed.
    #[arg(long, default_value = "100/min", value_name = "COUNT/PERIOD")]
    limit_rate: LimitRate,

    /// Token bucket capacity.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    limit_burst: u64,

    /// Open loop: send this many checks per second (over all connections)
    /// on a fixed schedule and measure latency from each request's intended
    /// send time. Without it the run is closed loop (as fast as answers
    /// come).
    #[arg(long, value_name = "CHECKS_PER_S")]
    rate: Option<f64>,

    /// Measured time per target, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,

    /// Unmeasured time before it, e.g. 2s.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,

    /// How long one request may take before its checks count as errors.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    deadline: Duration,

    /// Worker threads of the generator (default: the number of CPUs).
    #[arg(long)]
    threads: Option<usize>,

    /// Seed of the key pickers: the same seed draws the same keys for
    /// every target.
    #[arg(long, default_value_t = 1)]
    seed: u64,

    /// Print one JSON line per target on stdout (the human table then goes
    /// to stderr).
    #[arg(long)]
    json: bool,

    /// No progress bar (it is also hidden when stderr is not a terminal).
    #[arg(long, short)]
    quiet: bool,

    /// Draw throughput and latency percentiles (p50, p99, p99.9) over time
    /// for every target into this file: .svg, or .html (the SVG in a
    /// self-contained page with the command, the table and the ratios).
    #[arg(long, value_name = "FILE.svg|FILE.html")]
    plot: Option<PathBuf>,

    /// Tollgate targets: check by this rule of the server's rules file
    /// (`--rules`) instead of the inline token bucket (--limit-rate and
    /// --limit-burst then only describe the run).
    #[arg(long, value_name = "NAME")]
    rule: Option<String>,

    /// Tollgate targets: send each check as CHECK2 with this priority and
    /// its own idempotency key (the server's dedup remembers every answer);
    /// needs --batch 1.
    #[arg(long, value_enum)]
    priority: Option<PriorityArg>,

    /// Tollgate targets: connect over TLS, verifying the server against
    /// this CA (PEM).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,

    /// Length of each plotted sample (with --plot).
    #[arg(long, default_value = timeline::DEFAULT_PLOT_INTERVAL, value_parser = humantime::parse_duration)]
    plot_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PriorityArg {
    Low,
    Normal,
    High,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Dist {
    Uniform,
    Zipf,
}

impl Args {
    fn targets(&self) -> Vec<TargetSpec> {
        self.target
            .iter()
            .chain(self.compare.iter())
            .cloned()
            .collect()
    }

    fn distribution(&self) -> KeyDistribution {
        match self.distribution {
            Dist::Uniform => KeyDistribution::Uniform,
            Dist::Zipf => KeyDistribution::Zipf {
                skew: self.zipf_skew,
            },
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.targets().is_empty() {
            return Err(
                "name at least one target: --target tollgate=127.0.0.1:7700, \
                        or --compare tollgate=...,redis=..."
                    .to_owned(),
            );
        }
        if self.duration.is_zero() {
            return Err("--duration must be more than 0".to_owned());
        }
        if self.deadline.is_zero() {
            return Err("--deadline must be more than 0".to_owned());
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!(
                    "--rate {rate} must be a positive number of checks/s"
                ));
            }
        }
        if self.distribution == Dist::Zipf && (self.zipf_skew.is_nan() || self.zipf_skew < 0.0) {
            return Err(format!("--zipf-skew {} must be >= 0", self.zipf_skew));
        }
        if self.priority.is_some() && self.batch != 1 {
            return Err("--priority sends single checks: it needs --batch 1".to_owned());
        }
        if let Some(name) = &self.rule {
            RuleName::new(name.clone().into_bytes())
                .map_err(|e| format!("--rule {name:?}: {e}"))?;
        }
        if self.threads == Some(0) {
            return Err("--threads must be at least 1".to_owned());
        }
        if let Some(path) = &self.plot {
            plot::Format::of(path).map_err(|e| e.to_string())?;
            if self.plot_interval.is_zero() {
                return Err("--plot-interval must be more than 0".to_owned());
            }
            let samples = self.duration.as_nanos() / self.plot_interval.as_nanos();
            if samples > timeline::MAX_SAMPLES as u128 {
                return Err(format!(
                    "--plot-interval {:?} gives {samples} samples over --duration {:?}; \
                     at most {} are kept",
                    self.plot_interval,
                    self.duration,
                    timeline::MAX_SAMPLES
                ));
            }
        }
        Ok(())
    }

    /// What the Tollgate targets send beyond the request shape.
    fn tollgate_options(&self) -> Result<TollgateOptions, String> {
        let tls = match &self.tls_ca {
            Some(ca) => Some(
                tollgate_client::tls::tls_trusting(ca)
                    .map_err(|e| format!("--tls-ca {}: {e}", ca.display()))?,
            ),
            None => None,
        };
        Ok(TollgateOptions {
            rule: self
                .rule
                .as_ref()
                .and_then(|name| RuleName::new(name.clone().into_bytes()).ok()),
            priority: self.priority.map(|p| match p {
                PriorityArg::Low => Priority::Low,
                PriorityArg::Normal => Priority::Normal,
                PriorityArg::High => Priority::High,
            }),
            tls,
        })
    }

    fn workload_fields(&self, threads: usize) -> WorkloadFields {
        WorkloadFields {
            mode: if self.rate.is_some() {
                "open"
            } else {
                "closed"
            },
            connections: self.connections,
            pipeline: self.pipeline,
            batch: self.batch,
            keys: self.keys,
            distribution: match self.distribution {
                Dist::Uniform => "uniform",
                Dist::Zipf => "zipf",
            },
            zipf_skew: (self.distribution == Dist::Zipf).then_some(self.zipf_skew),
            cost: self.cost,
            limit_rate: self.limit_rate.to_string(),
            limit_burst: self.limit_burst,
            rate: self.rate,
            duration_s: self.duration.as_secs_f64(),
            warmup_s: self.warmup.as_secs_f64(),
            threads,
            deadline_ms: self.deadline.as_millis() as u64,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(message) = args.check() {
        eprintln!("tollgate-bench: {message}");
        return ExitCode::from(2);
    }
    let options = match args.tollgate_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("tollgate-bench: {message}");
            return ExitCode::from(2);
        }
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
        .expect("build the tokio runtime");

    let keys = KeySpace::new(args.keys);
    let shape = RequestShape {
        keys,
        rule: Rule {
            rate: args.limit_rate,
            burst: args.limit_burst,
            cost: args.cost,
        },
        batch: args.batch,
        deadline: args.deadline,
    };
    let plan = Plan {
        connections: args.connections,
        pipeline: args.pipeline,
        batch: args.batch,
        keys: args.keys,
        distribution: args.distribution(),
        seed: args.seed,
        warmup: args.warmup,
        duration: args.duration,
        rate: args.rate,
        progress: !args.quiet && std::io::stderr().is_terminal(),
        sample_every: args.plot.as_ref().map(|_| args.plot_interval),
    };
    let workload = args.workload_fields(threads);

    let mut summaries = Vec::new();
    let mut failed = false;
    for spec in args.targets() {
        if !args.quiet {
            eprintln!("tollgate-bench: {spec} ...");
        }
        let result = runtime.block_on(run_one(
            &spec,
            shape,
            options.clone(),
            plan,
            workload.clone(),
        ));
        match result {
            Ok(summary) => {
                if summary.checks == 0 {
                    eprintln!(
                        "tollgate-bench: {spec}: no check was decided ({} errors: {:?})",
                        summary.errors, summary.errors_by_reason
                    );
                    failed = true;
                } else if summary.errors > 0 {
                    eprintln!(
                        "tollgate-bench: {spec}: {} checks failed: {:?}",
                        summary.errors, summary.errors_by_reason
                    );
                }
                if args.json {
                    println!("{}", summary.json_line());
                }
                summaries.push(summary);
            }
            Err(e) => {
                eprintln!("tollgate-bench: {e}");
                failed = true;
            }
        }
    }

    if !summaries.is_empty() {
        let table = report::table(&summaries);
        if args.json {
            eprint!("{table}");
        } else {
            print!("{table}");
        }
    }
    if let Some(path) = &args.plot {
        let command: Vec<String> = std::env::args().map(|a| shell_word(&a)).collect();
        match plot::write(path, &summaries, &command.join(" ")) {
            Ok(()) if !args.quiet => eprintln!("tollgate-bench: plot in {}", path.display()),
            Ok(()) => {}
            Err(e) => {
                eprintln!("tollgate-bench: {e}");
                failed = true;
            }
        }
    }
    // Connections and their tasks end with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// An argument as a shell would need it to read it back.
fn shell_word(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=.,:/@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

async fn run_one(
    spec: &TargetSpec,
    shape: RequestShape,
    options: TollgateOptions,
    plan: Plan,
    workload: WorkloadFields,
) -> Result<Summary, TargetError> {
    match spec.kind {
        TargetKind::Tollgate | TargetKind::TollgateCluster => {
            let cluster = spec.kind == TargetKind::TollgateCluster;
            let target = Arc::new(TollgateTarget::new(
                spec.addr.clone(),
                shape,
                cluster,
                options,
            ));
            measure(spec, target, plan, workload).await
        }
        TargetKind::Redis | TargetKind::Throttlecrab | TargetKind::RedisCell => {
            let target = Arc::new(RespTarget::new(spec.kind, spec.addr.clone(), shape)?);
            measure(spec, target, plan, workload).await
        }
    }
}

async fn measure<T: Target>(
    spec: &TargetSpec,
    target: Arc<T>,
    plan: Plan,
    workload: WorkloadFields,
) -> Result<Summary, TargetError> {
    let recorder = driver::run(Arc::clone(&target), plan).await?;
    Ok(Summary::new(
        spec.kind.name(),
        spec.addr.clone(),
        target.server_info(),
        &recorder,
        workload,
    ))
}
