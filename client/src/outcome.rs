//! The answer to a rate-limit question, and the one way to act on it.
//!
//! Invariants:
//! - [`Outcome::is_allowed`] is the only decision a gateway needs: a
//!   decision says itself, an undecided outcome carries the fail mode that
//!   applied to it (the call's, the rule's from the rule table, or the
//!   client's default), a rejected request is **never** allowed;
//! - a request the server (or the client, before anything else: module
//!   `validity`) refused as invalid is [`Outcome::Rejected`], never
//!   undecided, whether or not the server can be reached: a key the caller
//!   let grow past the limit, keys of a group in two slots or an unknown
//!   rule would otherwise pass under fail-open forever;
//! - an outcome never hides a failure as a server decision, and never turns
//!   one into a panic or an `Err` on the request path.

use std::fmt;

use tollgate_protocol::ErrorCode;

use crate::config::FailMode;
use crate::decision::Decision;
use crate::error::Error;
pub use crate::undecided::Undecided;

/// What a check came to.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// A decision: the server's, or spent from a lease (see
    /// [`Decision::source`]).
    Decided(Decision),
    /// The server could not decide (`why`) and the check fails open, so the
    /// local fallback limiter decided it.
    Fallback { decision: Decision, why: Undecided },
    /// The server could not decide, and there is no fallback for this check
    /// (fail-closed, no local limiter, or a rule the client does not know):
    /// `fail_mode` says what it means.
    Undecided { why: Undecided, fail_mode: FailMode },
    /// The request is invalid and will stay so: never allowed, whatever the
    /// fail mode. A bug in the caller (or an attack on its key scheme).
    Rejected(Rejection),
}

/// Why a request was refused as invalid.
#[derive(Debug, Clone)]
pub struct Rejection {
    /// The server's code, or the code the server would have answered for a
    /// request refused locally (KeyTooLong, BatchTooLarge, Malformed, ...).
    pub code: ErrorCode,
    /// The client's own error, for requests refused before sending (it
    /// carries the numbers, e.g. the key length and the limit).
    pub error: Option<Error>,
}

impl Outcome {
    /// Whether to let the request through. Decisions say so themselves;
    /// an undecided outcome follows the fail mode it carries; a rejected
    /// request never passes.
    pub fn is_allowed(&self) -> bool {
        match self {
            Self::Decided(decision) | Self::Fallback { decision, .. } => decision.allowed,
            Self::Undecided { fail_mode, .. } => *fail_mode == FailMode::Open,
            Self::Rejected(_) => false,
        }
    }

    /// The decision (the server's, a lease's or the fallback's), if any.
    pub fn decision(&self) -> Option<&Decision> {
        match self {
            Self::Decided(decision) | Self::Fallback { decision, .. } => Some(decision),
            Self::Undecided { .. } | Self::Rejected(_) => None,
        }
    }

    /// The concurrency lease an allowed check acquired, to
    /// [`release`](crate::Client::release) when the work is done.
    pub fn lease(&self) -> Option<u64> {
        self.decision().and_then(|d| d.lease)
    }

    /// Why the server could not decide, if it could not (the fallback may
    /// still have decided).
    pub fn undecided(&self) -> Option<Undecided> {
        match self {
            Self::Fallback { why, .. } | Self::Undecided { why, .. } => Some(*why),
            Self::Decided(_) | Self::Rejected(_) => None,
        }
    }

    /// The rejection, if the request was invalid.
    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Self::Rejected(r) => Some(r),
            _ => None,
        }
    }

    /// A short label for metrics and logs: `allowed`, `denied`, `undecided`,
    /// `rejected`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Decided(d) | Self::Fallback { decision: d, .. } if d.allowed => "allowed",
            Self::Decided(_) | Self::Fallback { .. } => "denied",
            Self::Undecided { .. } => "undecided",
            Self::Rejected(_) => "rejected",
        }
    }
}

/// How a failed call reads: no decision for an availability reason, or a
/// request that is wrong.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    Undecided(Undecided),
    Rejected(Rejection),
}

impl Failure {
    /// Classifies a per-check or per-request server error code.
    pub(crate) fn from_code(code: ErrorCode) -> Self {
        match Undecided::from_code(code) {
            Some(why) => Self::Undecided(why),
            None => Self::Rejected(Rejection { code, error: None }),
        }
    }

    /// Classifies a client error. Requests refused locally (checked against
    /// the limits the server announced) are rejected with the code the
    /// server would have answered.
    pub(crate) fn from_error(error: &Error) -> Self {
        let rejected = |code| {
            Self::Rejected(Rejection {
                code,
                error: Some(error.clone()),
            })
        };
        match error {
            Error::Timeout { .. } => Self::Undecided(Undecided::DeadlineExceeded),
            // While the shard backs off after a refused handshake, calls
            // carry the refusal as the cause: it stays the server's error
            // code (an auth misconfiguration), not an outage.
            Error::Unavailable { cause, .. } if matches!(**cause, Error::Handshake { .. }) => {
                Self::from_error(cause)
            }
            Error::Config(_)
            | Error::Connect { .. }
            | Error::ConnectTimeout { .. }
            | Error::Unavailable { .. }
            | Error::NoPrimary { .. }
            | Error::Rules { .. }
            | Error::Moved { .. }
            | Error::NoOwner { .. }
            | Error::NoTopology { .. }
            | Error::Closed => Self::Undecided(Undecided::Unavailable),
            Error::BreakerOpen { .. } => Self::Undecided(Undecided::BreakerOpen),
            Error::Overloaded { .. } => Self::Undecided(Undecided::Overloaded),
            Error::Io(_) | Error::ConnectionLost => Self::Undecided(Undecided::ConnectionLost),
            Error::Handshake { code, .. } => Self::Undecided(Undecided::ServerError(*code)),
            Error::Server { code, .. } => Self::from_code(*code),
            Error::Protocol(_) | Error::UnexpectedResponse { .. } | Error::ResultCount { .. } => {
                Self::Undecided(Undecided::Protocol)
            }
            Error::BatchTooLarge { .. } | Error::GroupTooLarge { .. } => {
                rejected(ErrorCode::BatchTooLarge)
            }
            Error::KeyTooLong { .. } | Error::Key(crate::key::KeyError::KeyTooLong { .. }) => {
                rejected(ErrorCode::KeyTooLong)
            }
            Error::Key(_) => rejected(ErrorCode::Malformed),
            Error::FrameTooLarge { .. } => rejected(ErrorCode::FrameTooLarge),
            Error::CrossSlot { .. } => rejected(ErrorCode::CrossSlot),
            Error::InvalidLimit { .. } => rejected(ErrorCode::InvalidLimit),
            Error::EmptyKey | Error::EmptyGroup { .. } | Error::Encode(_) => {
                rejected(ErrorCode::Malformed)
            }
        }
    }
}

impl Error {
    /// A short reason for counting failures (`deadline exceeded`, `request
    /// rejected: key too long`, ...): what an outcome would say about it.
    pub fn summary(&self) -> String {
        match Failure::from_error(self) {
            Failure::Undecided(why) => why.to_string(),
            Failure::Rejected(r) => format!("request rejected: {}", r.code),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Some(e) => write!(f, "request rejected: {e}"),
            None => write!(f, "request rejected: {}", self.code),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_protocol::{Limit, LimitRef};

    use super::*;
    use crate::decision::{Binding, Source};

    fn decision(allowed: bool) -> Decision {
        let limit = Limit::token_bucket(tollgate_protocol::units::Rate::per_second(5), 10);
        Decision {
            allowed,
            shadow_denied: false,
            source: Source::Server,
            binding: Binding::of(0, &LimitRef::Inline(limit), None, |_| None),
            limit: 10,
            remaining: 0,
            reset_after: Duration::from_millis(100),
            full_after: Duration::from_millis(100),
            retry_after: Some(Duration::ZERO),
            lease: None,
        }
    }

    #[test]
    fn one_way_to_decide() {
        assert!(Outcome::Decided(decision(true)).is_allowed());
        assert!(!Outcome::Decided(decision(false)).is_allowed());
        let open = Outcome::Undecided {
            why: Undecided::DeadlineExceeded,
            fail_mode: FailMode::Open,
        };
        assert!(open.is_allowed());
        assert_eq!(open.undecided(), Some(Undecided::DeadlineExceeded));
        let closed = Outcome::Undecided {
            why: Undecided::BreakerOpen,
            fail_mode: FailMode::Closed,
        };
        assert!(!closed.is_allowed());
        let fallback = Outcome::Fallback {
            decision: decision(false),
            why: Undecided::BreakerOpen,
        };
        assert!(!fallback.is_allowed());
        assert_eq!(fallback.label(), "denied");
    }

    #[test]
    fn rejected_requests_never_pass() {
        for code in [
            ErrorCode::CrossSlot,
            ErrorCode::KeyTooLong,
            ErrorCode::Malformed,
            ErrorCode::UnknownRule,
            ErrorCode::InvalidLimit,
        ] {
            let Failure::Rejected(r) = Failure::from_code(code) else {
                panic!("{code:?} is a rejection");
            };
            let outcome = Outcome::Rejected(r);
            assert!(!outcome.is_allowed(), "{code:?}");
            assert_eq!(outcome.label(), "rejected");
        }
        let local = Failure::from_error(&Error::KeyTooLong { len: 300, max: 256 });
        assert!(matches!(
            local,
            Failure::Rejected(Rejection {
                code: ErrorCode::KeyTooLong,
                error: Some(Error::KeyTooLong { len: 300, max: 256 })
            })
        ));
        assert!(matches!(
            Failure::from_error(&Error::EmptyKey),
            Failure::Rejected(Rejection {
                code: ErrorCode::Malformed,
                ..
            })
        ));
    }

    #[test]
    fn availability_errors_are_undecided() {
        let undecided = |f: Failure| match f {
            Failure::Undecided(why) => why,
            Failure::Rejected(r) => panic!("rejected: {r}"),
        };
        assert_eq!(
            undecided(Failure::from_code(ErrorCode::NotPrimary)),
            Undecided::ServerError(ErrorCode::NotPrimary)
        );
        assert_eq!(
            undecided(Failure::from_error(&Error::Timeout {
                after: Duration::from_millis(5)
            })),
            Undecided::DeadlineExceeded
        );
        assert_eq!(
            undecided(Failure::from_error(&Error::BreakerOpen {
                addr: "a:1".into(),
                retry_in: Duration::from_millis(5)
            })),
            Undecided::BreakerOpen
        );
        assert_eq!(
            undecided(Failure::from_error(&Error::ConnectionLost)),
            Undecided::ConnectionLost
        );
        let refused = Error::Handshake {
            code: ErrorCode::AuthFailed,
            message: "bad token".into(),
        };
        let backing_off = Error::Unavailable {
            retry_in: Duration::from_millis(50),
            cause: std::sync::Arc::new(refused.clone()),
        };
        for error in [refused, backing_off] {
            assert_eq!(
                undecided(Failure::from_error(&error)),
                Undecided::ServerError(ErrorCode::AuthFailed),
                "{error}"
            );
        }
    }
}
