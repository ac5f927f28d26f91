//! The systems under test, behind one small trait.
//!
//! A [`Target`] opens connections; a [`Connection`] turns `batch` key picks
//! into one request (a Tollgate CHECK frame, or a Redis pipeline of
//! `batch` commands written at once) and sends it. The driver keeps
//! `--pipeline` such requests in flight per connection and never looks
//! inside them.
//!
//! Invariants:
//! - building a request is synchronous and owns everything it needs, so the
//!   send future borrows only the connection and the driver can hold many
//!   of them at once;
//! - every check of a request ends up counted exactly once in its
//!   [`Answer`]: allowed, denied, or an error with a reason. Nothing is
//!   dropped silently.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use crate::workload::{KeyPicker, KeySpace, Rule};

pub mod redis;
pub mod tollgate;

/// Which kind of server a target is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// Tollgate's binary protocol, through `tollgate-client`.
    Tollgate,
    /// The same, through the client's cluster mode seeded with the address
    /// (a slot map from TOPOLOGY, each check routed by its key's slot).
    TollgateCluster,
    /// Redis running the seeds' token-bucket Lua script (EVALSHA).
    Redis,
    /// throttlecrab-server's RESP `THROTTLE` command (GCRA).
    Throttlecrab,
    /// Redis with the redis-cell module loaded: `CL.THROTTLE` (GCRA).
    RedisCell,
}

impl TargetKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Tollgate => "tollgate",
            Self::TollgateCluster => "tollgate-cluster",
            Self::Redis => "redis",
            Self::Throttlecrab => "throttlecrab",
            Self::RedisCell => "redis-cell",
        }
    }
}

/// `KIND=ADDR`, as given to `--target` and `--compare`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetSpec {
    pub kind: TargetKind,
    /// `host:port`.
    pub addr: String,
}

impl FromStr for TargetSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, addr) = s
            .split_once('=')
            .ok_or_else(|| format!("target {s:?} must look like KIND=HOST:PORT"))?;
        let kind = match kind.trim() {
            "tollgate" => TargetKind::Tollgate,
            "tollgate-cluster" => TargetKind::TollgateCluster,
            "redis" => TargetKind::Redis,
            "throttlecrab" => TargetKind::Throttlecrab,
            "redis-cell" => TargetKind::RedisCell,
            other => {
                return Err(format!(
                    "unknown target {other:?} (expected tollgate, tollgate-cluster, redis, redis-cell or throttlecrab)"
                ))
            }
        };
        let addr = addr.trim();
        if addr.is_empty() || !addr.contains(':') {
            return Err(format!("target address {addr:?} must be HOST:PORT"));
        }
        Ok(Self {
            kind,
            addr: addr.to_owned(),
        })
    }
}

impl fmt::Display for TargetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.kind.name(), self.addr)
    }
}

/// What a target needs to know to build its requests.
#[derive(Debug, Clone, Copy)]
pub struct RequestShape {
    pub keys: KeySpace,
    pub rule: Rule,
    /// Checks per request.
    pub batch: u32,
    /// How long one request may take before it counts as an error.
    pub deadline: Duration,
}

/// How one request came out, check by check.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub allowed: u32,
    pub denied: u32,
    pub errors: u32,
    /// Why (some of) the checks failed; set whenever `errors > 0`.
    pub error: Option<Cow<'static, str>>,
}

impl Answer {
    /// Every check of the request failed for one reason.
    pub fn failed(checks: u32, reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            errors: checks,
            error: Some(reason.into()),
            ..Self::default()
        }
    }

    /// Counts one more failed check.
    pub fn add_error(&mut self, reason: impl Into<Cow<'static, str>>) {
        self.errors += 1;
        if self.error.is_none() {
            self.error = Some(reason.into());
        }
    }
}

/// Why a target could not be used at all.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("cannot connect to {target} at {addr}: {reason}")]
    Connect {
        target: &'static str,
        addr: String,
        reason: String,
    },
    #[error("{target} at {addr}: setup failed: {reason}")]
    Setup {
        target: &'static str,
        addr: String,
        reason: String,
    },
    #[error("batch of {batch} checks exceeds {target}'s limit of {max} per request")]
    BatchTooLarge {
        target: &'static str,
        batch: u32,
        max: u32,
    },
}

/// A server under test.
pub trait Target: Send + Sync + 'static {
    type Conn: Connection;

    /// `tollgate`, `redis`, ...
    fn name(&self) -> &'static str;

    /// Opens one connection (one TCP connection), ready for requests.
    fn connect(&self) -> impl Future<Output = Result<Self::Conn, TargetError>> + Send;

    /// The server's self-description (version, limits), after the first
    /// connection; for the report.
    fn server_info(&self) -> String;
}

/// One connection to a server under test.
pub trait Connection: Send + Sync + 'static {
    /// A request ready to send: `batch` checks, keys already picked.
    type Request: Send + 'static;

    /// Picks `batch` keys and builds the request for them.
    fn build(&self, picker: &mut KeyPicker) -> Self::Request;

    /// Sends `request` and waits for its answer (at most the deadline).
    fn send(&self, request: Self::Request) -> impl Future<Output = Answer> + Send + '_;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_specs_parse() {
        let t: TargetSpec = "tollgate=127.0.0.1:7700".parse().unwrap();
        assert_eq!(t.kind, TargetKind::Tollgate);
        assert_eq!(t.addr, "127.0.0.1:7700");
        assert_eq!(t.to_string(), "tollgate=127.0.0.1:7700");
        let r: TargetSpec = "redis=localhost:6390".parse().unwrap();
        assert_eq!(r.kind, TargetKind::Redis);
        let c: TargetSpec = "tollgate-cluster=127.0.0.1:7700".parse().unwrap();
        assert_eq!(c.kind, TargetKind::TollgateCluster);
        assert_eq!(c.to_string(), "tollgate-cluster=127.0.0.1:7700");
        assert!("memcached=1.2.3.4:5".parse::<TargetSpec>().is_err());
        assert!("redis=".parse::<TargetSpec>().is_err());
        assert!("127.0.0.1:7700".parse::<TargetSpec>().is_err());
    }

    #[test]
    fn answers_count_errors_with_their_first_reason() {
        let mut a = Answer::default();
        a.allowed += 2;
        a.add_error("timeout");
        a.add_error("other");
        assert_eq!(a.errors, 2);
        assert_eq!(a.error.as_deref(), Some("timeout"));
        let f = Answer::failed(5, "connection lost");
        assert_eq!((f.allowed, f.denied, f.errors), (0, 0, 5));
    }
}
