//! `tollgate check`: one key against an inline limit or a named rule, with
//! the flags of each algorithm; also PEEK (`--peek`) and REFUND (`--refund`).

use super::remote::{connect_routed, ServerArgs};
use super::render::render;
use crate::units::{parse_duration, parse_millis, Rate};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use std::process::ExitCode;
use std::time::Duration;
use tollgate_protocol::{Algorithm, CheckBatch, CheckResult, Limit, LimitRef, Pair, RuleName};

/// How `check`'s flags map to each algorithm's limit (shown by `--help`).
pub(super) const ALGORITHM_HELP: &str = "\
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

/// `--algorithm`: the wire algorithm by its name (`Algorithm::name`), the
/// names listed in the help as a value enum's would be.
fn algorithm_parser() -> impl TypedValueParser<Value = Algorithm> {
    PossibleValuesParser::new(Algorithm::ALL.map(Algorithm::name))
        .try_map(|name: String| Algorithm::from_name(&name).ok_or("not an algorithm"))
}

/// Lease time to live of `--algorithm concurrency` without `--lease-ttl`.
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub server: ServerArgs,
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
    #[arg(long, value_parser = algorithm_parser(), default_value = "token-bucket")]
    pub algorithm: Algorithm,
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
        let algorithm = self.algorithm;
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

pub(super) async fn run(args: CheckArgs) -> ExitCode {
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
    let mut batch = CheckBatch::with_capacity(args.repeat.into());
    for _ in 0..args.repeat {
        batch.push(Pair {
            key: args.key.clone().into(),
            limit: limit.clone(),
            cost: args.cost,
        });
    }
    // The client's cluster mode: the key's owner answers, found from the
    // map of the node given, and found again (until the timeout) when it
    // cannot be reached or answers MOVED or TryAgain (nothing was charged
    // then). A single server stands for a cluster of one shard.
    let client = match connect_routed(&args.server, args.timeout).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let results = if args.peek {
        client.peek_batch(batch).await
    } else if args.refund {
        client.refund_batch(batch).await
    } else {
        client.check_batch(batch).await
    };
    client.close();
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
