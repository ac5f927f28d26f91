//! Why the server could not decide a check: the availability reasons an
//! [`Outcome`](crate::Outcome) carries, and which server error codes are
//! such reasons (the others say the request is wrong). Below both the
//! outcome and the error type, which each describe themselves with it.

use std::fmt;

use tollgate_protocol::ErrorCode;

/// Why the server could not decide. All of these are about availability;
/// a request that is wrong is [`Outcome::Rejected`](crate::Outcome::Rejected) instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Undecided {
    /// No answer within the call's deadline. The request may still have
    /// reached the server and been charged.
    DeadlineExceeded,
    /// The server cannot be reached: connecting failed, or the client is
    /// backing off after failures (or was closed).
    Unavailable,
    /// The node's circuit breaker is open; nothing was sent.
    BreakerOpen,
    /// The connection closed while the call waited for its answer.
    ConnectionLost,
    /// Too many requests already wait for the connection; nothing was sent.
    Overloaded,
    /// The server could not serve the request (shutting down, not primary,
    /// at its memory cap, shed under overload, internal error, refused
    /// handshake).
    ServerError(ErrorCode),
    /// The server's answer could not be understood (version skew or a bug).
    Protocol,
}

impl Undecided {
    /// The availability reason of a server error code; `None` for codes that
    /// say the request itself is wrong (those are rejections).
    pub fn from_code(code: ErrorCode) -> Option<Self> {
        match code {
            ErrorCode::InvalidLimit
            | ErrorCode::CrossSlot
            | ErrorCode::BatchTooLarge
            | ErrorCode::KeyTooLong
            | ErrorCode::Malformed
            | ErrorCode::FrameTooLarge
            | ErrorCode::UnknownOpcode
            | ErrorCode::UnknownRule
            | ErrorCode::IdempotencyKeyReused => None,
            ErrorCode::UnsupportedVersion
            | ErrorCode::AuthFailed
            | ErrorCode::HandshakeRequired
            | ErrorCode::ShuttingDown
            | ErrorCode::NotPrimary
            | ErrorCode::StaleEpoch
            | ErrorCode::Internal
            | ErrorCode::StoreFull
            | ErrorCode::TryAgain
            | ErrorCode::Shed
            | ErrorCode::TooManyConnections
            | ErrorCode::Overloaded
            | ErrorCode::Unknown(_) => Some(Self::ServerError(code)),
        }
    }

    /// The metric label of the reason: `deadline`, `unavailable`,
    /// `breaker_open`, `connection_lost`, `overloaded`, `server_error`,
    /// `protocol`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::DeadlineExceeded => "deadline",
            Self::Unavailable => "unavailable",
            Self::BreakerOpen => "breaker_open",
            Self::ConnectionLost => "connection_lost",
            Self::Overloaded => "overloaded",
            Self::ServerError(_) => "server_error",
            Self::Protocol => "protocol",
        }
    }
}

impl fmt::Display for Undecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeadlineExceeded => f.write_str("deadline exceeded"),
            Self::Unavailable => f.write_str("server unavailable"),
            Self::BreakerOpen => f.write_str("circuit breaker open"),
            Self::ConnectionLost => f.write_str("connection lost"),
            Self::Overloaded => f.write_str("connection overloaded"),
            Self::ServerError(code) => write!(f, "server error: {code}"),
            Self::Protocol => f.write_str("undecodable answer"),
        }
    }
}
