//! Client settings: every limit and timeout the client applies, each with a
//! named default.
//!
//! Invariants: the defaults are tuned for a gateway on the request path (a
//! call never waits more than [`DEFAULT_DEADLINE`], undecided calls pass,
//! a hung node is cut off by its circuit breaker, a local fallback limits
//! while the server cannot be reached); [`ClientConfig::validate`] only
//! checks and never changes a value, and [`Client::new`](crate::Client::new)
//! refuses an invalid config with [`Error::Config`](crate::Error::Config):
//! a bad config never silently turns limiting off.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tollgate_protocol::DEFAULT_CLIENT_MAX_FRAME;

mod error;
mod failure;

pub use error::ConfigError;
pub use failure::*;

/// Default time budget of one call, connecting included. The limiter sits on
/// every API request, so it may add a few milliseconds at most.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);
/// Default bound on one connection attempt: TCP connect plus handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default name sent in HELLO, shown in the server's logs.
pub const DEFAULT_CLIENT_NAME: &str = "tollgate-client";
/// Default wait after the first failed connection attempt.
pub const DEFAULT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Default ceiling of the exponential backoff between attempts.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Default cap on a response frame body: the largest response a v1 server
/// can send (a CHECKED of 65535 results), so a conforming server is never
/// refused while a broken one cannot make us buffer more than ~2 MiB.
pub const DEFAULT_MAX_FRAME: u32 = DEFAULT_CLIENT_MAX_FRAME;
/// Default number of requests that may wait for the connection's writer.
pub const DEFAULT_MAX_QUEUED: usize = 4096;
/// Default idle time before TCP keepalive probes start (the kernel then
/// notices a peer host that vanished without closing the connection).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(10);
/// Default wait for the PING sent on a connection that let a call time
/// out; no answer by then and the connection is dropped.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Default interval between refreshes of the rule table from the admin API.
pub const DEFAULT_RULES_REFRESH: Duration = Duration::from_secs(10);
/// Default bound on one fetch of the rule table.
pub const DEFAULT_RULES_TIMEOUT: Duration = Duration::from_secs(1);

/// Default interval between refreshes of the slot map in cluster mode
/// (besides the refreshes a MOVED, a TryAgain or an unreachable node
/// trigger).
pub const DEFAULT_TOPOLOGY_REFRESH: Duration = Duration::from_secs(5);
/// Default first wait before retrying a check answered TryAgain (a slot
/// moving, a shard without primary) in cluster mode; doubles with each
/// retry, within the call's deadline.
pub const DEFAULT_TRY_AGAIN_BACKOFF: Duration = Duration::from_millis(20);

/// Longest client name and auth token: their HELLO length fields are one byte.
pub const MAX_HELLO_FIELD_LEN: usize = u8::MAX as usize;
/// Smallest usable `max_frame`: the body of a HELLO_OK (opcode, request id,
/// version, role, epoch, offset and the four server limits).
pub const MIN_MAX_FRAME: u32 = 1 + 4 + 2 + 1 + 8 + 8 + 4 + 2 + 1 + 2;

/// What an undecided call means for the request being limited.
///
/// The default is [`FailMode::Open`]: the limiter must never be the reason
/// the API is down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailMode {
    /// Let the request through when no decision could be had.
    #[default]
    Open,
    /// Refuse the request when no decision could be had.
    Closed,
}

impl FailMode {
    /// The name used in rules files and by the admin API: `open`, `closed`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
        }
    }
}

/// Parses a rule's `failure-mode` as the server's admin API reports it
/// (`GET /v1/rules`), so a gateway can honour it when the server is
/// unreachable.
impl std::str::FromStr for FailMode {
    type Err = UnknownFailMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(Self::Open),
            "closed" => Ok(Self::Closed),
            other => Err(UnknownFailMode(other.to_owned())),
        }
    }
}

/// A failure mode other than `open` or `closed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown failure mode {0:?} (expected open or closed)")]
pub struct UnknownFailMode(pub String);

/// Settings of a [`Client`](crate::Client). Build with struct update syntax
/// over [`ClientConfig::default()`].
#[derive(Clone)]
pub struct ClientConfig {
    /// Time budget of one call, from the call to its answer, including any
    /// wait for a connection. Override per call with
    /// [`Client::with_deadline`](crate::Client::with_deadline).
    pub deadline: Duration,
    /// Bound on one connection attempt (TCP connect and handshake). Attempts
    /// run in the background, so a call never waits longer than its deadline
    /// for one.
    pub connect_timeout: Duration,
    /// Name sent in HELLO (at most 255 bytes).
    pub client_name: String,
    /// Shared secret sent in HELLO when the server requires one (at most 255
    /// bytes).
    pub auth_token: Option<Vec<u8>>,
    /// What an undecided check means when neither the call
    /// ([`Client::with_fail_mode`](crate::Client::with_fail_mode)) nor the
    /// named rule (its `failure-mode` in the rule table) says otherwise.
    pub fail_mode: FailMode,
    /// Wait after the first failed connection attempt; doubles with each
    /// further failure up to `backoff_max`. Jittered (between half and all of
    /// it) so a fleet of gateways does not reconnect in lockstep.
    pub backoff_min: Duration,
    /// Ceiling of the backoff.
    pub backoff_max: Duration,
    /// Largest response frame body accepted, in bytes; a larger one closes
    /// the connection.
    pub max_frame: u32,
    /// Requests that may wait for the connection's writer; a call finding the
    /// queue full is undecided at once (`Overloaded`) rather than queueing
    /// behind a saturated connection.
    pub max_queued: usize,
    /// TCP keepalive idle time (`None`: off).
    pub keepalive: Option<Duration>,
    /// Wait for the PING probe sent on a connection that let a call time
    /// out ("suspect"); no answer within it and the connection is dropped, so
    /// the next call reconnects (for a shard: to whichever node is primary).
    pub probe_timeout: Duration,
    /// The circuit breaker kept per node.
    pub breaker: BreakerConfig,
    /// The local limiter that decides fail-open checks the server could not
    /// (`None`: undecided checks just follow their fail mode).
    pub fallback: Option<FallbackConfig>,
    /// Token leasing for hot keys (`None`: off, every check asks the server).
    pub lease: Option<LeaseConfig>,
    /// The server's admin API (`host:port`), from which the rule table (each
    /// rule's limit and failure mode) is fetched and refreshed. `None`: rules
    /// are known only by name, and undecided rule checks take `fail_mode`.
    pub admin: Option<String>,
    /// Interval between refreshes of the rule table.
    pub rules_refresh: Duration,
    /// Cluster mode ([`Client::cluster`](crate::Client::cluster)): interval
    /// between background refreshes of the slot map.
    pub topology_refresh: Duration,
    /// Cluster mode: first wait before retrying after TryAgain or an
    /// unreachable shard; doubles per retry, bounded by the call's deadline.
    pub try_again_backoff: Duration,
    /// Prometheus registry the client's metrics are registered in (`None`:
    /// no metrics).
    pub metrics: Option<prometheus::Registry>,
    /// TLS for every connection to a node (`None`: plain TCP). The node's
    /// certificate must carry the host part of its address (a DNS name or
    /// an IP address); present a client certificate here for mTLS. Build
    /// a config that trusts one CA file with
    /// [`tls_trusting`](crate::tls::tls_trusting).
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            deadline: DEFAULT_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            client_name: DEFAULT_CLIENT_NAME.to_owned(),
            auth_token: None,
            fail_mode: FailMode::default(),
            backoff_min: DEFAULT_BACKOFF_MIN,
            backoff_max: DEFAULT_BACKOFF_MAX,
            max_frame: DEFAULT_MAX_FRAME,
            max_queued: DEFAULT_MAX_QUEUED,
            keepalive: Some(DEFAULT_KEEPALIVE),
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            breaker: BreakerConfig::default(),
            fallback: Some(FallbackConfig::default()),
            lease: None,
            admin: None,
            rules_refresh: DEFAULT_RULES_REFRESH,
            topology_refresh: DEFAULT_TOPOLOGY_REFRESH,
            try_again_backoff: DEFAULT_TRY_AGAIN_BACKOFF,
            metrics: None,
            tls: None,
        }
    }
}

// Hand-written so that the auth token never reaches a log line.
impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("deadline", &self.deadline)
            .field("connect_timeout", &self.connect_timeout)
            .field("client_name", &self.client_name)
            .field(
                "auth_token",
                &self.auth_token.as_ref().map(|_| "<redacted>"),
            )
            .field("fail_mode", &self.fail_mode)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("max_frame", &self.max_frame)
            .field("max_queued", &self.max_queued)
            .field("keepalive", &self.keepalive)
            .field("probe_timeout", &self.probe_timeout)
            .field("breaker", &self.breaker)
            .field("fallback", &self.fallback)
            .field("lease", &self.lease)
            .field("admin", &self.admin)
            .field("rules_refresh", &self.rules_refresh)
            .field("topology_refresh", &self.topology_refresh)
            .field("try_again_backoff", &self.try_again_backoff)
            .field("metrics", &self.metrics.as_ref().map(|_| "<registry>"))
            .field("tls", &self.tls.as_ref().map(|_| "<rustls config>"))
            .finish()
    }
}

impl ClientConfig {
    /// Checks every setting; changes nothing. The first unusable setting
    /// is the error, in the order of the steps below.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_connection()?;
        self.validate_timers()?;
        self.breaker.validate()?;
        if let Some(f) = &self.fallback {
            f.validate()?;
        }
        if let Some(l) = &self.lease {
            l.validate()?;
        }
        if let Some(admin) = &self.admin {
            if admin.trim().is_empty() {
                return Err(ConfigError::Empty { field: "admin" });
            }
        }
        Ok(())
    }

    /// The connection's settings: its deadlines and backoff, the HELLO
    /// fields, frame size and queue.
    fn validate_connection(&self) -> Result<(), ConfigError> {
        if self.deadline.is_zero() {
            return Err(ConfigError::ZeroDuration { field: "deadline" });
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::ZeroDuration {
                field: "connect_timeout",
            });
        }
        if self.backoff_min.is_zero() {
            return Err(ConfigError::ZeroDuration {
                field: "backoff_min",
            });
        }
        if self.backoff_min > self.backoff_max {
            return Err(ConfigError::BackoffInverted {
                min: self.backoff_min,
                max: self.backoff_max,
            });
        }
        let token_len = self.auth_token.as_ref().map_or(0, Vec::len);
        for (field, len) in [
            ("client_name", self.client_name.len()),
            ("auth_token", token_len),
        ] {
            if len > MAX_HELLO_FIELD_LEN {
                return Err(ConfigError::TooLong {
                    field,
                    len,
                    max: MAX_HELLO_FIELD_LEN,
                });
            }
        }
        if self.max_frame < MIN_MAX_FRAME {
            return Err(ConfigError::MaxFrameTooSmall {
                max_frame: self.max_frame,
                min: MIN_MAX_FRAME,
            });
        }
        if self.max_queued == 0 {
            return Err(ConfigError::ZeroQueue);
        }
        Ok(())
    }

    /// The periods of the background work: keepalive, probes, refreshes.
    fn validate_timers(&self) -> Result<(), ConfigError> {
        if self.keepalive.is_some_and(|k| k.is_zero()) {
            return Err(ConfigError::ZeroDuration { field: "keepalive" });
        }
        for (field, d) in [
            ("probe_timeout", self.probe_timeout),
            ("rules_refresh", self.rules_refresh),
            ("topology_refresh", self.topology_refresh),
            ("try_again_backoff", self.try_again_backoff),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration { field });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_fail_open() {
        let config = ClientConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert_eq!(config.fail_mode, FailMode::Open);
        assert_eq!(config.deadline, Duration::from_millis(5));
        assert_eq!(config.fallback, Some(FallbackConfig::default()));
        assert_eq!(config.lease, None);
        let leasing = ClientConfig {
            lease: Some(LeaseConfig::default()),
            ..ClientConfig::default()
        };
        assert_eq!(leasing.validate(), Ok(()));
    }

    #[test]
    fn validate_checks_the_failure_settings() {
        let config = ClientConfig {
            breaker: BreakerConfig {
                error_percent: 0,
                ..BreakerConfig::default()
            },
            ..ClientConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::Percent {
                field: "breaker.error_percent",
                value: 0
            })
        );
        let config = ClientConfig {
            fallback: Some(FallbackConfig {
                gateways: 0,
                ..FallbackConfig::default()
            }),
            ..ClientConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::Zero {
                field: "fallback.gateways"
            })
        );
        let config = ClientConfig {
            breaker: BreakerConfig {
                open_for: Duration::from_secs(20),
                ..BreakerConfig::default()
            },
            ..ClientConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Inverted { .. })
        ));
    }

    #[test]
    fn failure_modes_parse_as_the_admin_api_writes_them() {
        assert_eq!("open".parse(), Ok(FailMode::Open));
        assert_eq!("closed".parse(), Ok(FailMode::Closed));
        assert_eq!(
            "Closed".parse::<FailMode>(),
            Err(UnknownFailMode("Closed".into()))
        );
        assert_eq!(FailMode::Closed.name(), "closed");
    }

    #[test]
    fn validate_reports_the_numbers() {
        let config = ClientConfig {
            backoff_min: Duration::from_secs(3),
            ..ClientConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::BackoffInverted {
                min: Duration::from_secs(3),
                max: DEFAULT_BACKOFF_MAX,
            })
        );
        let config = ClientConfig {
            client_name: "x".repeat(256),
            ..ClientConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::TooLong {
                field: "client_name",
                len: 256,
                max: 255,
            })
        );
        let config = ClientConfig {
            max_frame: 10,
            ..ClientConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::MaxFrameTooSmall {
                max_frame: 10,
                min: 33,
            })
        );
    }

    #[test]
    fn debug_hides_the_token() {
        let config = ClientConfig {
            auth_token: Some(b"s3cret".to_vec()),
            ..ClientConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
