//! Safe retries and load shedding for CHECK2 (PROTOCOL.md §5): how long and
//! how many idempotency keys the server remembers, and the backlog at which
//! it sheds low, then normal priority checks.
//!
//! Invariant (checked by `validate`): normal priority is never shed at a
//! backlog where low priority is not, so low always goes first.

use super::{at_least, at_most, human, ConfigError};
use crate::units::{parse_bytes, parse_duration};
use clap::Args;
use serde::Serialize;
use std::time::Duration;

pub const DEFAULT_DEDUP_WINDOW: &str = "2s";
pub const DEFAULT_DEDUP_CAPACITY: usize = 256 << 10;
pub const DEFAULT_SHED_LOW_BACKLOG: &str = "8KiB";
pub const DEFAULT_SHED_NORMAL_BACKLOG: &str = "24KiB";

/// Longest de-duplication window: keys are for retries, not for history.
pub const MAX_DEDUP_WINDOW: Duration = Duration::from_secs(3600);
/// Most idempotency keys remembered (each about 100 bytes).
pub const MAX_DEDUP_CAPACITY: usize = 1 << 24;

/// CHECK2: retried checks answered from memory, and shedding by priority.
#[derive(Debug, Clone, Args, Serialize)]
#[command(next_help_heading = "Retries and overload (CHECK2)")]
#[serde(rename_all = "kebab-case")]
pub struct OverloadSettings {
    /// How long the answer to a CHECK2 check is remembered under its
    /// idempotency key: a retry within it is answered the same and not
    /// charged again.
    #[arg(long, default_value = DEFAULT_DEDUP_WINDOW, value_parser = parse_duration)]
    #[serde(serialize_with = "human")]
    pub dedup_window: Duration,

    /// Most idempotency keys remembered at once; when full, the oldest are
    /// forgotten first (bounded memory, about 100 bytes a key).
    #[arg(long, default_value_t = DEFAULT_DEDUP_CAPACITY)]
    pub dedup_capacity: usize,

    /// Shed low-priority CHECK2 checks while a connection has more than
    /// this many request bytes received and not yet answered behind the
    /// frame being answered.
    #[arg(long, default_value = DEFAULT_SHED_LOW_BACKLOG, value_parser = parse_bytes)]
    pub shed_low_backlog: usize,

    /// Shed normal-priority CHECK2 checks too above this backlog (at least
    /// --shed-low-backlog). High priority is never shed.
    #[arg(long, default_value = DEFAULT_SHED_NORMAL_BACKLOG, value_parser = parse_bytes)]
    pub shed_normal_backlog: usize,
}

impl OverloadSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.dedup_window.is_zero() {
            return Err(ConfigError::ZeroDuration {
                name: "dedup-window",
            });
        }
        at_most(
            "dedup-window (seconds)",
            self.dedup_window.as_secs(),
            MAX_DEDUP_WINDOW.as_secs(),
        )?;
        at_least("dedup-capacity", self.dedup_capacity as u64, 1)?;
        at_most(
            "dedup-capacity",
            self.dedup_capacity as u64,
            MAX_DEDUP_CAPACITY as u64,
        )?;
        at_least(
            "shed-normal-backlog",
            self.shed_normal_backlog as u64,
            self.shed_low_backlog as u64,
        )
    }
}
