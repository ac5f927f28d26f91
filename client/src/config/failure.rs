//! Settings of the client's failure behaviour: the circuit breaker kept
//! per node, the local fallback limiter, and token leasing. Each with a
//! named default; checked by [`ClientConfig::validate`](super::ClientConfig::validate).

use std::time::Duration;

use super::error::ConfigError;

/// Default consecutive timeouts that open a node's breaker.
pub const DEFAULT_BREAKER_CONSECUTIVE: u32 = 5;
/// Default share of failed calls (percent) that opens a node's breaker.
pub const DEFAULT_BREAKER_ERROR_PERCENT: u8 = 50;
/// Default fewest calls in the window before the error rate counts.
pub const DEFAULT_BREAKER_MIN_CALLS: u32 = 20;
/// Default length of the window the error rate is measured over.
pub const DEFAULT_BREAKER_WINDOW: Duration = Duration::from_secs(10);
/// Default time a breaker stays open before a probe call goes through.
pub const DEFAULT_BREAKER_OPEN_FOR: Duration = Duration::from_millis(500);
/// Default ceiling of the open time, which doubles while probes fail.
pub const DEFAULT_BREAKER_OPEN_MAX: Duration = Duration::from_secs(10);

/// When a node's circuit breaker opens (see the `breaker` module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Opens after this many calls in a row failed (timed out, or their
    /// connection was lost or could not be made) with no answer between.
    pub consecutive_failures: u32,
    /// Opens when at least this percentage of the calls in the window
    /// failed (1..=100) ...
    pub error_percent: u8,
    /// ... and the window holds at least this many calls.
    pub min_calls: u32,
    /// Length of the error-rate window.
    pub window: Duration,
    /// How long the breaker stays open before one probe call goes through.
    pub open_for: Duration,
    /// Ceiling of the open time; it doubles each time a probe fails.
    pub open_max: Duration,
}

impl BreakerConfig {
    /// A breaker that never opens: for clients that must see a node the
    /// moment it answers again (a server probing its replication peer).
    pub fn never_open() -> Self {
        Self {
            consecutive_failures: u32::MAX,
            error_percent: 100,
            min_calls: u32::MAX,
            ..Self::default()
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (field, d) in [
            ("breaker.window", self.window),
            ("breaker.open_for", self.open_for),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration { field });
            }
        }
        if self.consecutive_failures == 0 {
            return Err(ConfigError::Zero {
                field: "breaker.consecutive_failures",
            });
        }
        if !(1..=100).contains(&self.error_percent) {
            return Err(ConfigError::Percent {
                field: "breaker.error_percent",
                value: self.error_percent,
            });
        }
        if self.open_for > self.open_max {
            return Err(ConfigError::Inverted {
                min_field: "breaker.open_for",
                min: self.open_for,
                max_field: "breaker.open_max",
                max: self.open_max,
            });
        }
        Ok(())
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: DEFAULT_BREAKER_CONSECUTIVE,
            error_percent: DEFAULT_BREAKER_ERROR_PERCENT,
            min_calls: DEFAULT_BREAKER_MIN_CALLS,
            window: DEFAULT_BREAKER_WINDOW,
            open_for: DEFAULT_BREAKER_OPEN_FOR,
            open_max: DEFAULT_BREAKER_OPEN_MAX,
        }
    }
}

/// Default number of gateways sharing a limit, for the local fallback.
pub const DEFAULT_FALLBACK_GATEWAYS: u32 = 1;
/// Default most keys the local fallback limiter tracks.
pub const DEFAULT_FALLBACK_MAX_KEYS: usize = 100_000;

/// The local fallback limiter: while the server cannot decide (breaker
/// open, unreachable, timed out), fail-open checks are decided by an
/// in-memory bucket per key holding `limit / gateways` (seed 002: "crude but
/// still blocks abuse").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackConfig {
    /// Gateways that share each limit: each enforces `1 / gateways` of it
    /// (at least one unit). 1 enforces the whole limit locally.
    pub gateways: u32,
    /// Most keys tracked; beyond it the least recently used key is evicted
    /// (it starts again with a full bucket).
    pub max_keys: usize,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        Self {
            gateways: DEFAULT_FALLBACK_GATEWAYS,
            max_keys: DEFAULT_FALLBACK_MAX_KEYS,
        }
    }
}

impl FallbackConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.gateways == 0 {
            return Err(ConfigError::Zero {
                field: "fallback.gateways",
            });
        }
        if self.max_keys == 0 {
            return Err(ConfigError::Zero {
                field: "fallback.max_keys",
            });
        }
        Ok(())
    }
}

/// Default most tokens one lease takes.
pub const DEFAULT_LEASE_MAX: u32 = 20;
/// Default time a lease is kept; what it has not spent by then is refunded.
pub const DEFAULT_LEASE_HOLD: Duration = Duration::from_millis(100);
/// Default checks of one key per second at this gateway before it leases.
pub const DEFAULT_LEASE_HOT_AFTER: u32 = 50;
/// Default capacity divisor: a lease never exceeds `capacity / 10`.
pub const DEFAULT_LEASE_CAPACITY_DIVISOR: u32 = 10;
/// Default most keys with a lease or a hit count.
pub const DEFAULT_LEASE_MAX_KEYS: usize = 10_000;

/// Token leasing for hot token-bucket keys (seed 002): a check of a hot key
/// charges `1 + lease` at the server, and the gateway spends the extra
/// tokens locally without a round trip; what is unspent after `hold` goes
/// back with a REFUND. Admission can run ahead of the server's view by at
/// most `gateways × lease` units per key (tokens charged earlier, spent
/// later); nothing is ever admitted that the server did not charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Most tokens one lease takes.
    pub max_lease: u32,
    /// A lease is what the limit refills in `hold`, at most `max_lease` and
    /// at most `capacity / capacity_divisor`; below 2 the key is not leased
    /// (small limits always ask the server).
    pub capacity_divisor: u32,
    /// How long leased tokens are kept before the rest is refunded.
    pub hold: Duration,
    /// Checks of a key within one second at this gateway before it leases:
    /// keys with little traffic always go to the server.
    pub hot_after: u32,
    /// Most keys tracked (leases and hit counts), least recently used evicted
    /// (an evicted lease is refunded).
    pub max_keys: usize,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            max_lease: DEFAULT_LEASE_MAX,
            capacity_divisor: DEFAULT_LEASE_CAPACITY_DIVISOR,
            hold: DEFAULT_LEASE_HOLD,
            hot_after: DEFAULT_LEASE_HOT_AFTER,
            max_keys: DEFAULT_LEASE_MAX_KEYS,
        }
    }
}

impl LeaseConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("lease.max_lease", self.max_lease),
            ("lease.capacity_divisor", self.capacity_divisor),
            ("lease.hot_after", self.hot_after),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if self.max_keys == 0 {
            return Err(ConfigError::Zero {
                field: "lease.max_keys",
            });
        }
        if self.hold.is_zero() {
            return Err(ConfigError::ZeroDuration {
                field: "lease.hold",
            });
        }
        Ok(())
    }
}
