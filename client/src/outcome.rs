//! The answer to a rate-limit question: a server decision, or the reason
//! there is none.
//!
//! Invariants: an [`Outcome`] never hides a failure as a decision, and never
//! turns one into a panic or an `Err` the caller must unwrap on the request
//! path. What an undecided outcome means for the request is the caller's
//! policy, given as a [`FailMode`]; the default is fail-open.
//!
//! Undecided reasons come in two kinds, kept apart so that dashboards do not
//! mix them: availability ([`DeadlineExceeded`](Undecided::DeadlineExceeded),
//! [`Unavailable`](Undecided::Unavailable),
//! [`ConnectionLost`](Undecided::ConnectionLost),
//! [`ServerError`](Undecided::ServerError),
//! [`Protocol`](Undecided::Protocol)) and caller bugs
//! ([`Rejected`](Undecided::Rejected): an invalid limit, keys of a group in
//! different slots, a key or batch over the server's limits).

use std::fmt;

use tollgate_protocol::{CheckResult, Decision, ErrorCode};

use crate::config::FailMode;
use crate::error::Error;

/// What a check or peek came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The server decided (allowed or denied, with the numbers for the
    /// rate-limit headers).
    Decided(Decision),
    /// No decision could be had; the caller's [`FailMode`] decides.
    Undecided(Undecided),
}

/// Why an [`Outcome`] carries no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Undecided {
    /// No answer within the call's deadline. The request may still have
    /// reached the server and been charged.
    DeadlineExceeded,
    /// The server cannot be reached: connecting failed, or the client is
    /// backing off after failures (or was closed).
    Unavailable,
    /// The connection closed while the call waited for its answer.
    ConnectionLost,
    /// The server could not serve the request (shutting down, not primary,
    /// internal error, refused handshake).
    ServerError(ErrorCode),
    /// The request is wrong and will stay wrong: invalid limit or cost,
    /// keys of a group in different slots, a key or batch over the server's
    /// limits. A bug in the caller; log it.
    Rejected(ErrorCode),
    /// The server's answer could not be understood (version skew or a bug).
    Protocol,
}

impl Outcome {
    /// Whether to let the request through, given what an undecided outcome
    /// should mean.
    pub fn allowed(&self, mode: FailMode) -> bool {
        match self {
            Self::Decided(decision) => decision.allowed,
            Self::Undecided(_) => mode == FailMode::Open,
        }
    }

    /// Whether to let the request through, **failing open**: an undecided
    /// outcome allows. Same as `allowed(FailMode::Open)`; for the client's
    /// configured mode use [`Client::allows`](crate::Client::allows).
    pub fn is_allowed(&self) -> bool {
        self.allowed(FailMode::Open)
    }

    /// The server's decision, if there is one.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::Decided(decision) => Some(decision),
            Self::Undecided(_) => None,
        }
    }

    /// The concurrency lease an allowed check acquired, to
    /// [`release`](crate::Client::release) when the work is done.
    pub fn lease(&self) -> Option<u64> {
        self.decision().and_then(|d| d.lease)
    }

    /// Why there is no decision, if there is none.
    pub fn undecided(&self) -> Option<Undecided> {
        match self {
            Self::Decided(_) => None,
            Self::Undecided(why) => Some(*why),
        }
    }

    /// The outcome of one check's result.
    pub fn from_result(result: CheckResult) -> Self {
        match result {
            CheckResult::Decision(decision) => Self::Decided(decision),
            CheckResult::Error(code) => Self::Undecided(Undecided::from_code(code)),
        }
    }
}

impl Undecided {
    /// Classifies a server error code: request problems are
    /// [`Rejected`](Self::Rejected), everything else a
    /// [`ServerError`](Self::ServerError).
    pub fn from_code(code: ErrorCode) -> Self {
        match code {
            ErrorCode::InvalidLimit
            | ErrorCode::CrossSlot
            | ErrorCode::BatchTooLarge
            | ErrorCode::KeyTooLong
            | ErrorCode::Malformed
            | ErrorCode::FrameTooLarge
            | ErrorCode::UnknownOpcode
            | ErrorCode::UnknownRule => Self::Rejected(code),
            ErrorCode::UnsupportedVersion
            | ErrorCode::AuthFailed
            | ErrorCode::HandshakeRequired
            | ErrorCode::ShuttingDown
            | ErrorCode::NotPrimary
            | ErrorCode::StaleEpoch
            | ErrorCode::Internal
            | ErrorCode::StoreFull
            | ErrorCode::TryAgain
            | ErrorCode::Unknown(_) => Self::ServerError(code),
        }
    }

    /// Classifies a client error. Requests refused locally (checked against
    /// the limits the server announced) map to the code the server would
    /// have answered, so they read the same in logs.
    pub fn from_error(error: &Error) -> Self {
        match error {
            Error::Timeout { .. } => Self::DeadlineExceeded,
            Error::Config(_)
            | Error::Connect { .. }
            | Error::ConnectTimeout { .. }
            | Error::Unavailable { .. }
            | Error::NoPrimary { .. }
            | Error::Closed => Self::Unavailable,
            Error::Io(_) | Error::ConnectionLost => Self::ConnectionLost,
            Error::Handshake { code, .. } => Self::ServerError(*code),
            Error::Server { code, .. } => Self::from_code(*code),
            Error::Protocol(_) | Error::UnexpectedResponse { .. } | Error::ResultCount { .. } => {
                Self::Protocol
            }
            Error::BatchTooLarge { .. } | Error::GroupTooLarge { .. } => {
                Self::Rejected(ErrorCode::BatchTooLarge)
            }
            Error::KeyTooLong { .. } => Self::Rejected(ErrorCode::KeyTooLong),
            Error::FrameTooLarge { .. } => Self::Rejected(ErrorCode::FrameTooLarge),
            Error::EmptyKey | Error::EmptyGroup { .. } | Error::Encode(_) => {
                Self::Rejected(ErrorCode::Malformed)
            }
        }
    }

    /// True for [`Rejected`](Self::Rejected): the caller sent a request
    /// that can never be decided; retrying will not help.
    pub fn is_caller_error(&self) -> bool {
        matches!(self, Self::Rejected(_))
    }
}

impl fmt::Display for Undecided {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeadlineExceeded => f.write_str("deadline exceeded"),
            Self::Unavailable => f.write_str("server unavailable"),
            Self::ConnectionLost => f.write_str("connection lost"),
            Self::ServerError(code) => write!(f, "server error: {code}"),
            Self::Rejected(code) => write!(f, "request rejected: {code}"),
            Self::Protocol => f.write_str("undecodable answer"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn decision(allowed: bool) -> Decision {
        Decision {
            allowed,
            shadow_denied: false,
            pair: 0,
            limit: 10,
            remaining: if allowed { 9 } else { 0 },
            reset_after_ms: 100,
            retry_after_ms: if allowed { 0 } else { 100 },
            lease: None,
        }
    }

    #[test]
    fn decided_outcomes_ignore_the_fail_mode() {
        for mode in [FailMode::Open, FailMode::Closed] {
            assert!(Outcome::Decided(decision(true)).allowed(mode));
            assert!(!Outcome::Decided(decision(false)).allowed(mode));
        }
    }

    #[test]
    fn undecided_outcomes_follow_the_fail_mode_and_default_open() {
        let outcome = Outcome::Undecided(Undecided::DeadlineExceeded);
        assert!(outcome.allowed(FailMode::Open));
        assert!(!outcome.allowed(FailMode::Closed));
        assert!(outcome.is_allowed());
        assert_eq!(outcome.decision(), None);
        assert_eq!(outcome.undecided(), Some(Undecided::DeadlineExceeded));
        assert_eq!(outcome.lease(), None);
    }

    #[test]
    fn the_lease_of_an_allowed_acquire() {
        let leased = Decision {
            lease: Some(42),
            ..decision(true)
        };
        assert_eq!(Outcome::Decided(leased).lease(), Some(42));
        assert_eq!(Outcome::Decided(decision(true)).lease(), None);
    }

    #[test]
    fn caller_bugs_are_kept_apart_from_availability() {
        assert_eq!(
            Undecided::from_code(ErrorCode::InvalidLimit),
            Undecided::Rejected(ErrorCode::InvalidLimit)
        );
        assert_eq!(
            Undecided::from_code(ErrorCode::CrossSlot),
            Undecided::Rejected(ErrorCode::CrossSlot)
        );
        assert_eq!(
            Undecided::from_code(ErrorCode::ShuttingDown),
            Undecided::ServerError(ErrorCode::ShuttingDown)
        );
        assert!(Undecided::from_code(ErrorCode::CrossSlot).is_caller_error());
        assert!(!Undecided::from_code(ErrorCode::NotPrimary).is_caller_error());
    }

    #[test]
    fn errors_map_to_their_reason() {
        let timeout = Error::Timeout {
            after: Duration::from_millis(5),
        };
        assert_eq!(Undecided::from_error(&timeout), Undecided::DeadlineExceeded);
        let unavailable = Error::Unavailable {
            retry_in: Duration::from_millis(40),
            cause: std::sync::Arc::new(Error::ConnectionLost),
        };
        assert_eq!(Undecided::from_error(&unavailable), Undecided::Unavailable);
        assert_eq!(
            Undecided::from_error(&Error::ConnectionLost),
            Undecided::ConnectionLost
        );
        assert_eq!(
            Undecided::from_error(&Error::KeyTooLong { len: 300, max: 256 }),
            Undecided::Rejected(ErrorCode::KeyTooLong)
        );
        assert_eq!(
            Undecided::from_error(&Error::Server {
                code: ErrorCode::InvalidLimit,
                message: String::new(),
            }),
            Undecided::Rejected(ErrorCode::InvalidLimit)
        );
    }
}
