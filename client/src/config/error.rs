//! Why a [`ClientConfig`](super::ClientConfig) is unusable: what its
//! `validate` (and each settings group's part of it) answers.

use std::time::Duration;

/// Why a [`ClientConfig`](super::ClientConfig) is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{field} must be greater than zero")]
    ZeroDuration { field: &'static str },
    #[error("backoff_min ({min:?}) exceeds backoff_max ({max:?})")]
    BackoffInverted { min: Duration, max: Duration },
    #[error("{field} of {len} bytes exceeds the limit of {max}")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("max_frame of {max_frame} bytes cannot hold a handshake answer ({min} bytes)")]
    MaxFrameTooSmall { max_frame: u32, min: u32 },
    #[error("max_queued must be at least 1")]
    ZeroQueue,
    #[error("{field} must be at least 1")]
    Zero { field: &'static str },
    #[error("{field} must be a percentage from 1 to 100, got {value}")]
    Percent { field: &'static str, value: u8 },
    #[error("{min_field} ({min:?}) exceeds {max_field} ({max:?})")]
    Inverted {
        min_field: &'static str,
        min: Duration,
        max_field: &'static str,
        max: Duration,
    },
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("cannot register the client's metrics: {reason}")]
    Metrics { reason: String },
}
