//! The client's error type.
//!
//! Every variant carries the numbers that explain it, so a log line says
//! what went wrong without a debugger. `Error` is `Clone` (sources are kept
//! behind `Arc`) because one failed connection attempt is reported to every
//! call that waited for it, and is kept as the cause of the backoff that
//! follows.
//!
//! The calls that answer a rate-limit question ([`Client::check`] and
//! friends) do not return `Error`: they fold it into an
//! [`Undecided`] reason (`outcome::Failure::from_error`, crate-private).
//!
//! [`Client::check`]: crate::Client::check

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tollgate_protocol::{DecodeError, EncodeError, ErrorCode};

use crate::config::ConfigError;
use crate::undecided::Undecided;

/// Why a call or a connection attempt failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid client configuration: {0}")]
    Config(#[from] ConfigError),

    /// Resolving or connecting to the server failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: Arc<io::Error>,
    },

    /// The connection attempt (TCP connect and handshake) took longer than
    /// the configured connect timeout.
    #[error("connecting to {addr} took longer than {after:?}")]
    ConnectTimeout { addr: String, after: Duration },

    /// Reading or writing an established connection failed.
    #[error("i/o error: {0}")]
    Io(#[source] Arc<io::Error>),

    /// The call got no answer within its deadline. The request may still
    /// have reached the server (and been charged).
    #[error("no answer within the deadline of {after:?}")]
    Timeout { after: Duration },

    /// The server refused the handshake (or spoke another version).
    #[error("handshake refused: {code}: {message}")]
    Handshake { code: ErrorCode, message: String },

    /// The server answered the whole request with an ERROR frame.
    #[error("server error: {code}: {message}")]
    Server { code: ErrorCode, message: String },

    /// A response frame could not be decoded.
    #[error("undecodable response: {0}")]
    Protocol(#[source] Arc<DecodeError>),

    /// A request does not fit the wire format.
    #[error("cannot encode the request: {0}")]
    Encode(#[source] Arc<EncodeError>),

    /// The server answered with a message that does not answer the request.
    #[error("unexpected {got} in answer to {request}")]
    UnexpectedResponse {
        request: &'static str,
        got: &'static str,
    },

    /// A CHECKED answer with a different number of results than checks sent.
    #[error("{got} results in answer to {expected} checks")]
    ResultCount { expected: usize, got: usize },

    /// More checks (or reset keys) in one request than the server accepts
    /// (checked locally, from the limits the server announced).
    #[error("batch of {checks} exceeds the server's limit of {max}")]
    BatchTooLarge { checks: usize, max: u16 },

    /// More pairs in one atomic group than the server accepts.
    #[error("check {check} has {pairs} pairs, the server's limit is {max}")]
    GroupTooLarge { check: usize, pairs: usize, max: u8 },

    /// A check with no pairs.
    #[error("check {check} has no pairs")]
    EmptyGroup { check: usize },

    #[error("key of {len} bytes exceeds the server's limit of {max}")]
    KeyTooLong { len: usize, max: u16 },

    #[error("empty key")]
    EmptyKey,

    /// The keys of an atomic group are in two hash slots (checked locally:
    /// the server would answer CrossSlot).
    #[error("the group's keys are in slots {first} and {other}; a group's keys must share a {{hash tag}}")]
    CrossSlot { first: u16, other: u16 },

    /// A pair's inline limit or cost is impossible (checked locally, as
    /// PROTOCOL.md §8 says every server checks it: the server would answer
    /// InvalidLimit).
    #[error("invalid limit in pair {pair}: {reason}")]
    InvalidLimit { pair: usize, reason: &'static str },

    /// The encoded request is larger than the server's frame limit. Refused
    /// locally: the server would close the connection, failing every other
    /// call on it.
    #[error("request frame of {len} bytes exceeds the server's limit of {max}")]
    FrameTooLarge { len: usize, max: u32 },

    /// The server cannot be reached right now: the last connection attempt
    /// failed (`cause`) and the next one is due in `retry_in`. Returned at
    /// once, without touching the network.
    #[error("server unavailable (next attempt in {retry_in:?}): {cause}")]
    Unavailable {
        retry_in: Duration,
        #[source]
        cause: Arc<Error>,
    },

    /// No node of the shard answered the handshake as primary: `standbys`
    /// answered as standbys, the others could not be reached (`last_error`
    /// says why, for one of them).
    #[error("no primary among {tried} addresses ({standbys} standbys){}", last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NoPrimary {
        tried: usize,
        standbys: usize,
        last_error: Option<Arc<Error>>,
    },

    /// The connection closed while the call was waiting for its answer.
    #[error("connection lost before the answer arrived")]
    ConnectionLost,

    /// The circuit breaker of the node is open: it failed too many calls
    /// recently. Returned at once, without touching the network; a probe
    /// call goes through in `retry_in`.
    #[error("circuit breaker of {addr} is open (probe in {retry_in:?})")]
    BreakerOpen { addr: String, retry_in: Duration },

    /// More requests are waiting for the connection's writer than
    /// `max_queued`: the connection is saturated. Returned at once.
    #[error("{queued} requests already wait for the connection (max_queued)")]
    Overloaded { queued: usize },

    /// A key could not be built from the caller's identifier.
    #[error("cannot build the key: {0}")]
    Key(#[from] crate::key::KeyError),

    /// Fetching the rule table from the admin API failed.
    #[error("cannot fetch the rules from the admin API at {addr}: {reason}")]
    Rules { addr: String, reason: String },

    /// Cluster mode: the slot's node answered MOVED again after the client
    /// had followed one MOVED and refreshed its slot map (a stale node, or
    /// a map changing faster than the call's deadline).
    #[error("slot {slot} redirected again (to {addr}) after one MOVED and a map refresh")]
    Moved { slot: u16, addr: String },

    /// Cluster mode: no shard of the client's slot map (version `version`)
    /// has a node for the slot (no map yet, or the shard has no node).
    #[error("no node serves slot {slot} in the slot map (version {version})")]
    NoOwner { slot: u16, version: u64 },

    /// Cluster mode: no seed or known node answered TOPOLOGY.
    #[error("no node answered TOPOLOGY (tried {tried}){}", last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    NoTopology {
        tried: usize,
        last_error: Option<Arc<Error>>,
    },

    /// [`Client::close`](crate::Client::close) was called.
    #[error("client closed")]
    Closed,
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        Self::Protocol(Arc::new(e))
    }
}

impl From<EncodeError> for Error {
    fn from(e: EncodeError) -> Self {
        Self::Encode(Arc::new(e))
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Self::Io(Arc::new(e))
    }
}

/// A short reason for a per-check error code, as [`Error::summary`] says it
/// (the summary of [`Error::Server`] with that code).
pub fn code_summary(code: ErrorCode) -> String {
    match Undecided::from_code(code) {
        Some(why) => why.to_string(),
        None => format!("request rejected: {code}"),
    }
}
