//! The settings, one struct per concern. Each field is a `--kebab-case`
//! flag and, under the same name, a key of the config file; its doc comment
//! is its `--help` text. Each section checks its own fields
//! (`validate`), so every rule sits next to the numbers it bounds.

use super::{at_least, at_most, human, ConfigError};
use crate::huge_pages::HugePages;
use crate::units::{parse_bytes, parse_duration};
use clap::Args;
use serde::{Serialize, Serializer};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;
use tollgate_protocol::ServerLimits;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:7700";
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 1_000;
pub const DEFAULT_BACKLOG: u32 = 1024;
pub const DEFAULT_SHED_IDLE_AFTER: &str = "1m";
pub const DEFAULT_MAX_CONNECTION_MEMORY: &str = "64MiB";
pub const DEFAULT_IDLE_TIMEOUT: &str = "5m";
pub const DEFAULT_FRAME_TIMEOUT: &str = "10s";
pub const DEFAULT_HANDSHAKE_TIMEOUT: &str = "10s";
pub const DEFAULT_WRITE_TIMEOUT: &str = "10s";
pub const DEFAULT_SHUTDOWN_GRACE: &str = "10s";
pub const DEFAULT_MAX_FRAME: u32 = tollgate_protocol::DEFAULT_MAX_FRAME;
pub const DEFAULT_MAX_BATCH: u16 = tollgate_protocol::DEFAULT_MAX_BATCH;
pub const DEFAULT_MAX_GROUP: u8 = tollgate_protocol::DEFAULT_MAX_GROUP;
pub const DEFAULT_MAX_KEY_LEN: u16 = tollgate_protocol::DEFAULT_MAX_KEY_LEN;
/// The store's own default (a test in node/store_settings.rs holds them equal).
pub const DEFAULT_STRIPES: usize = 1024;
pub const DEFAULT_SWEEP_INTERVAL: &str = "100ms";
pub const DEFAULT_SWEEP_STRIPES: usize = 64;
pub const DEFAULT_MAX_LOG_ENTRIES: u64 = crate::algorithm::DEFAULT_MAX_LOG_ENTRIES;
pub const DEFAULT_RULES_POLL: &str = "1s";
pub const DEFAULT_ADMIN: &str = "127.0.0.1:7701";
pub const DEFAULT_THROTTLED_KEYS: usize = 1024;
pub const DEFAULT_THROTTLED_WINDOW: &str = "1m";
pub const DEFAULT_STATUS_REFRESH: &str = "5s";
pub const DEFAULT_THROTTLED_METRIC_KEYS: usize = 10;
/// Most keys `tollgate_throttled_key_denials` may label: each is a series.
pub const MAX_THROTTLED_METRIC_KEYS: usize = 1000;

/// Hard ceilings no setting may pass, so a typo cannot make the server
/// reserve absurd buffers.
pub const MAX_FRAME_CEILING: u32 = 64 << 20;
/// 1M timestamps are 8 MB for one key: more is surely a typo.
pub const MAX_LOG_ENTRIES_CEILING: u64 = 1 << 20;
/// Most keys the throttled-keys sketch may track.
pub const MAX_THROTTLED_KEYS: usize = 1 << 20;
/// Smallest memory share of one stripe: below it a stripe could not hold a
/// useful number of keys.
pub const MIN_STRIPE_MEMORY: usize = 16 << 10;

/// The protocol port: where it listens, who may connect, how long a
/// connection may take over each step.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Network")]
#[serde(rename_all = "kebab-case")]
pub struct NetworkSettings {
    /// Address to listen on for the binary protocol.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Most client connections served at once. When full, a new connection
    /// takes the place of the one idle longest (see --shed-idle-after), or
    /// is answered TooManyConnections and closed.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,

    /// Most connections served at once from one client address (IPv6: one
    /// /64); more are answered TooManyConnections and closed.
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS_PER_IP)]
    pub max_connections_per_ip: usize,

    /// Connections the kernel queues for the server to accept (the listen
    /// backlog; the kernel caps it at net.core.somaxconn).
    #[arg(long, default_value_t = DEFAULT_BACKLOG)]
    pub backlog: u32,

    /// When the server is full, the connection that has sent nothing for
    /// longest is closed (TooManyConnections) to make room for a new one,
    /// if it has been quiet at least this long (`0s`: never).
    #[arg(long, default_value = DEFAULT_SHED_IDLE_AFTER, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub shed_idle_after: Duration,

    /// Memory all connections together may take for frames larger than a
    /// connection's own 16 KiB read buffer, e.g. `64MiB`. A frame that
    /// finds none waits for room, and is answered Overloaded (the
    /// connection closes) if none frees within --frame-timeout. Long RESP
    /// commands, queued RESP MULTI commands and Envoy RLS calls in flight
    /// (--envoy-max-message each) draw from it too.
    #[arg(long, default_value = DEFAULT_MAX_CONNECTION_MEMORY, value_parser = parse_bytes)]
    pub max_connection_memory: usize,

    /// Close a connection that sends nothing for this long (Envoy RLS: that
    /// makes no authorized call).
    #[arg(long, default_value = DEFAULT_IDLE_TIMEOUT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub idle_timeout: Duration,

    /// Close a connection whose started frame does not complete within this.
    #[arg(long, default_value = DEFAULT_FRAME_TIMEOUT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub frame_timeout: Duration,

    /// Close a connection that has not sent HELLO within this (Envoy RLS:
    /// its first authorized call).
    #[arg(long, default_value = DEFAULT_HANDSHAKE_TIMEOUT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub handshake_timeout: Duration,

    /// Close a connection that does not read its answers within this.
    #[arg(long, default_value = DEFAULT_WRITE_TIMEOUT, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub write_timeout: Duration,

    /// On SIGINT/SIGTERM, how long in-flight requests may take to drain.
    #[arg(long, default_value = DEFAULT_SHUTDOWN_GRACE, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub shutdown_grace: Duration,
}

impl NetworkSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        at_least("max-connections", self.max_connections as u64, 1)?;
        at_least(
            "max-connections-per-ip",
            self.max_connections_per_ip as u64,
            1,
        )?;
        at_least("backlog", self.backlog.into(), 1)?;
        for (name, d) in [
            ("idle-timeout", self.idle_timeout),
            ("frame-timeout", self.frame_timeout),
            ("handshake-timeout", self.handshake_timeout),
            ("write-timeout", self.write_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration { name });
            }
        }
        Ok(())
    }
}

/// A frame size in the byte units of `--max-memory`: the wire's length
/// field is a u32, so a size beyond it is refused here, not truncated.
fn parse_frame_bytes(s: &str) -> Result<u32, String> {
    let bytes = parse_bytes(s).map_err(|e| e.to_string())?;
    u32::try_from(bytes).map_err(|_| format!("{s} is more than a frame can hold (4 GiB - 1 bytes)"))
}

/// What one frame may carry; told to clients in HELLO_OK.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Request limits")]
#[serde(rename_all = "kebab-case")]
pub struct LimitSettings {
    /// Largest frame accepted, in bytes (header excluded): `1048576`,
    /// `1MiB`, `512KiB`.
    #[arg(long, default_value_t = DEFAULT_MAX_FRAME, value_parser = parse_frame_bytes)]
    pub max_frame: u32,

    /// Most checks in one CHECK/PEEK/REFUND frame (and keys in one RESET,
    /// leases in one RELEASE).
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH)]
    pub max_batch: u16,

    /// Most (key, limit) pairs in one atomic group.
    #[arg(long, default_value_t = DEFAULT_MAX_GROUP)]
    pub max_group: u8,

    /// Longest key accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_KEY_LEN)]
    pub max_key_len: u16,
}

impl LimitSettings {
    /// The limits as the protocol states them.
    pub fn server_limits(&self) -> ServerLimits {
        ServerLimits {
            max_frame: self.max_frame,
            max_batch: self.max_batch,
            max_group: self.max_group,
            max_key_len: self.max_key_len,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        at_least("max-batch", self.max_batch.into(), 1)?;
        at_least("max-group", self.max_group.into(), 1)?;
        at_least("max-key-len", self.max_key_len.into(), 1)?;
        at_most("max-frame", self.max_frame.into(), MAX_FRAME_CEILING.into())?;
        // header (5) + count (2) + group count (1) + pairs of the longest key,
        // each naming a rule of the longest name (larger than an inline limit).
        let pair = 2 + u64::from(self.max_key_len) + 1 + 1 + 64 + 4;
        let needed = 5 + 2 + 1 + u64::from(self.max_group) * pair;
        if u64::from(self.max_frame) < needed {
            return Err(ConfigError::FrameTooSmallForGroup {
                max_frame: self.max_frame,
                max_group: self.max_group,
                max_key_len: self.max_key_len,
                needed,
            });
        }
        Ok(())
    }
}

/// The counter store: its locks, its expiry sweeper, its memory.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Store")]
#[serde(rename_all = "kebab-case")]
pub struct StoreSettings {
    /// Lock stripes of the store (rounded up to a power of two, at most 16384).
    #[arg(long, default_value_t = DEFAULT_STRIPES)]
    pub stripes: usize,

    /// How often the sweeper drops expired keys.
    #[arg(long, default_value = DEFAULT_SWEEP_INTERVAL, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub sweep_interval: Duration,

    /// Stripes the sweeper visits per tick (bounds the work of one tick).
    #[arg(long, default_value_t = DEFAULT_SWEEP_STRIPES)]
    pub sweep_stripes: usize,

    /// Most timestamps one key may hold (8 bytes each): the largest count of
    /// a sliding-log limit, and of a concurrency limit (one lease each).
    /// Larger sliding-log limits are refused (use sliding-window).
    #[arg(long, default_value_t = DEFAULT_MAX_LOG_ENTRIES)]
    pub max_log_entries: u64,

    /// Cap on the memory the counter tables reserve, e.g. `1GiB` (none: no
    /// cap). Each stripe gets an equal share; see --on-full.
    #[arg(long, value_parser = parse_bytes)]
    pub max_memory: Option<usize>,

    /// At the memory cap, a new key either evicts the keys closest to expiry
    /// (`evict`) or is refused with StoreFull (`refuse`). Expired keys always
    /// go first; keys that already hold state always keep working.
    #[arg(long, value_enum, default_value_t = OnFull::Evict)]
    pub on_full: OnFull,

    /// `on` backs the heap with transparent huge pages (2 MiB) where the
    /// host's THP mode is `madvise` or `always`: fewer TLB misses on the
    /// tables, more checks per second at a million keys and more, and more
    /// resident memory per key. `off` (the default) keeps the process off
    /// THP, even under `always`.
    #[arg(long, value_enum, default_value_t = HugePages::Off)]
    pub huge_pages: HugePages,
}

impl StoreSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        at_least("stripes", self.stripes as u64, 1)?;
        at_least("sweep-stripes", self.sweep_stripes as u64, 1)?;
        at_least("max-log-entries", self.max_log_entries, 1)?;
        if let Some(max_memory) = self.max_memory {
            let stripes = self
                .stripes
                .clamp(1, usize::from(crate::slot::SLOT_COUNT))
                .next_power_of_two();
            let share = max_memory / stripes;
            if share < MIN_STRIPE_MEMORY {
                return Err(ConfigError::MemoryTooSmall {
                    max_memory,
                    stripes,
                    share,
                    min: MIN_STRIPE_MEMORY,
                });
            }
        }
        at_most(
            "max-log-entries",
            self.max_log_entries,
            MAX_LOG_ENTRIES_CEILING,
        )?;
        if self.sweep_interval.is_zero() {
            return Err(ConfigError::ZeroDuration {
                name: "sweep-interval",
            });
        }
        Ok(())
    }
}

/// At the memory cap: evict or refuse (the store's `Full`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFull {
    Evict,
    Refuse,
}

/// Named rules: the file and how often it is looked at.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Rules")]
#[serde(rename_all = "kebab-case")]
pub struct RuleSettings {
    /// Rules file (YAML) naming the rules checks may refer to; reloaded on
    /// change, on SIGHUP and by the admin API.
    #[arg(id = "rules", long = "rules", value_name = "FILE")]
    #[serde(rename = "rules")]
    pub file: Option<PathBuf>,

    /// How often the rules file is checked for changes (0s: never).
    #[arg(id = "rules_poll", long = "rules-poll", value_name = "RULES_POLL", default_value = DEFAULT_RULES_POLL, value_parser = parse_duration)]
    #[serde(rename = "rules-poll", serialize_with = "human")]
    pub poll: Duration,
}

/// The admin HTTP API and what it reports.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Admin API")]
#[serde(rename_all = "kebab-case")]
pub struct AdminSettings {
    /// Address of the admin HTTP API (health, rules, usage, metrics), or
    /// `none`.
    #[arg(id = "admin", long = "admin", value_name = "ADDR", default_value = DEFAULT_ADMIN)]
    #[serde(rename = "admin")]
    pub listen: AdminAddr,

    /// Denied keys tracked for `GET /v1/throttled` (fixed memory).
    #[arg(long, default_value_t = DEFAULT_THROTTLED_KEYS)]
    pub throttled_keys: usize,

    /// Window over which `GET /v1/throttled` counts denials (it reports the
    /// current and the previous window).
    #[arg(long, default_value = DEFAULT_THROTTLED_WINDOW, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub throttled_window: Duration,

    /// Most throttled keys exported as `tollgate_throttled_key_denials{key}`
    /// series on `/metrics` (0: none).
    #[arg(long, default_value_t = DEFAULT_THROTTLED_METRIC_KEYS)]
    pub throttled_metric_keys: usize,

    /// How often the status page (`GET /` on the admin port) reloads
    /// itself in the browser (whole seconds, at least 1s).
    #[arg(long, default_value = DEFAULT_STATUS_REFRESH, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub status_refresh: Duration,

    /// Host names the admin API answers for, beside IP addresses and
    /// `localhost` (comma-separated; `*`: any). Any other `Host` gets 421:
    /// a name reaching the admin port that is not listed is DNS rebinding.
    #[arg(long, env = "TOLLGATE_ADMIN_ALLOWED_HOSTS", value_name = "HOST[,HOST]")]
    pub admin_allowed_hosts: Option<super::AllowedHosts>,
}

impl AdminSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        at_least("throttled-keys", self.throttled_keys as u64, 1)?;
        at_most(
            "throttled-keys",
            self.throttled_keys as u64,
            MAX_THROTTLED_KEYS as u64,
        )?;
        if self.throttled_window.is_zero() {
            return Err(ConfigError::ZeroDuration {
                name: "throttled-window",
            });
        }
        at_most(
            "throttled-metric-keys",
            self.throttled_metric_keys as u64,
            MAX_THROTTLED_METRIC_KEYS as u64,
        )?;
        at_least("status-refresh (seconds)", self.status_refresh.as_secs(), 1)?;
        // The page's refresh is given in seconds: a fraction would be
        // dropped without a word.
        if self.status_refresh.subsec_nanos() != 0 {
            return Err(ConfigError::NotWholeSeconds {
                name: "status-refresh",
                value: self.status_refresh,
            });
        }
        Ok(())
    }
}

/// Where the admin HTTP API listens: an address, or `none` for no admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminAddr {
    Off,
    On(SocketAddr),
}

impl FromStr for AdminAddr {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("none") {
            Ok(Self::Off)
        } else {
            s.parse().map(Self::On)
        }
    }
}

impl fmt::Display for AdminAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("none"),
            Self::On(addr) => addr.fmt(f),
        }
    }
}

impl Serialize for AdminAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The server's own log lines.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Logging")]
#[serde(rename_all = "kebab-case")]
pub struct LogSettings {
    /// Log format (lines on stderr; RUST_LOG filters them).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    Text,
    Json,
}
