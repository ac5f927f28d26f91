//! The messages of protocol v1, as Rust values.
//!
//! These types are what the codec produces and consumes; they carry no I/O.
//! Every message travels in one frame whose header holds an opcode and a
//! request id (see `PROTOCOL.md`). Requests flow client -> server, responses
//! server -> client, and a response carries the id of the request it answers,
//! so a client may pipeline requests and match answers in any order.
//!
//! Keys are [`Bytes`] sliced out of the received frame (no copy); anything that
//! stores a key beyond the life of the request must copy it.

use bytes::Bytes;

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: u16 = 1;

/// A request id chosen by the client; echoed in the response.
pub type RequestId = u32;

/// `retry_after_ms` value meaning "never": the cost can never be admitted
/// under this limit (for example a cost larger than the burst).
pub const RETRY_NEVER: u64 = u64::MAX;

/// Limiting algorithm named by a [`Limit`]. Wire values are stable.
///
/// How each reads the limit's numbers (see `PROTOCOL.md` §8):
///
/// | algorithm | `count` | `period_ms` | `burst` |
/// |---|---|---|---|
/// | token bucket | tokens refilled per period | refill period | capacity, >= 1 |
/// | sliding window | requests per window | window | 0 |
/// | fixed window | requests per window | window | 0 |
/// | sliding log | requests per window | window | 0 |
/// | leaky bucket | requests per period (spacing `period / count`) | period | tolerance, >= 1 |
/// | concurrency | most in flight | lease time to live | 0 |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Algorithm {
    /// Token bucket (GCRA): `count` tokens per `period_ms` refill, up to `burst`.
    TokenBucket = 1,
    /// Sliding window counter: at most `count` per `period_ms` window,
    /// previous window weighted by its overlap. `burst` must be 0.
    SlidingWindow = 2,
    /// Fixed window counter: at most `count` per window of `period_ms`
    /// aligned on the server clock (2x across a boundary). `burst` must be 0.
    FixedWindow = 3,
    /// Sliding log: exactly at most `count` in any `period_ms`, for small
    /// counts (server cap `max_log_entries`). `burst` must be 0.
    SlidingLog = 4,
    /// Leaky bucket as a meter: one unit per `period_ms / count`, up to
    /// `burst` (>= 1) early.
    LeakyBucket = 5,
    /// Concurrency: at most `count` in flight, each allowed check holding a
    /// lease that lives `period_ms` unless released first. `burst` must be 0.
    Concurrency = 6,
}

impl Algorithm {
    /// Every algorithm, in wire order.
    pub const ALL: [Algorithm; 6] = [
        Self::TokenBucket,
        Self::SlidingWindow,
        Self::FixedWindow,
        Self::SlidingLog,
        Self::LeakyBucket,
        Self::Concurrency,
    ];

    /// Decodes a wire value.
    pub fn from_wire(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| *a as u8 == v)
    }

    /// The name used on the command line, in rules files and in logs.
    pub fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token-bucket",
            Self::SlidingWindow => "sliding-window",
            Self::FixedWindow => "fixed-window",
            Self::SlidingLog => "sliding-log",
            Self::LeakyBucket => "leaky-bucket",
            Self::Concurrency => "concurrency",
        }
    }

    /// The algorithm of a [`name`](Self::name) (exact, lowercase).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// An inline limit, as carried by one (key, limit) pair.
///
/// The codec checks only its shape; whether the numbers make sense
/// (non-zero rate, no overflow) is checked by the server, which answers a bad
/// limit with a per-check [`ErrorCode::InvalidLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    pub algorithm: Algorithm,
    /// Tokens (token bucket), requests (windows, log, leaky bucket) per
    /// `period_ms`, or units in flight (concurrency).
    pub count: u64,
    /// The refill period, window length or lease time to live, in
    /// milliseconds.
    pub period_ms: u64,
    /// Bucket capacity (token bucket) or tolerance (leaky bucket); 0 for
    /// the others.
    pub burst: u64,
}

/// Longest rule name, in bytes (the wire's `name_len` is 1..=64).
pub const MAX_RULE_NAME_LEN: usize = 64;

/// `limit_kind` wire value of a pair that names a rule; values 1..=127 are
/// inline algorithm codes.
pub const LIMIT_KIND_RULE: u8 = 0x80;

/// The name of a rule configured on the server: 1..=64 bytes of UTF-8.
///
/// Holds a slice of the received frame when decoded (no copy). The invariant
/// (length and UTF-8) is checked by every constructor, so a `RuleName` always
/// encodes.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RuleName(Bytes);

/// Why a string is not a rule name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRuleName {
    #[error("rule name must be 1 to {MAX_RULE_NAME_LEN} bytes, got {0}")]
    Length(usize),
    #[error("rule name is not valid UTF-8")]
    Utf8,
}

impl RuleName {
    /// Checks `name` (1..=64 bytes of UTF-8) and wraps it without copying.
    pub fn new(name: impl Into<Bytes>) -> Result<Self, InvalidRuleName> {
        let name = name.into();
        if name.is_empty() || name.len() > MAX_RULE_NAME_LEN {
            return Err(InvalidRuleName::Length(name.len()));
        }
        if std::str::from_utf8(&name).is_err() {
            return Err(InvalidRuleName::Utf8);
        }
        Ok(Self(name))
    }

    /// A rule name from a static string; panics if it is not one (for
    /// constants in code and tests).
    pub fn from_static(name: &'static str) -> Self {
        match Self::new(Bytes::from_static(name.as_bytes())) {
            Ok(n) => n,
            Err(e) => panic!("{name:?}: {e}"),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_str(&self) -> &str {
        // Checked by every constructor; the fallback is unreachable.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a rule name has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl std::fmt::Display for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl TryFrom<&str> for RuleName {
    type Error = InvalidRuleName;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(Bytes::copy_from_slice(s.as_bytes()))
    }
}

impl TryFrom<String> for RuleName {
    type Error = InvalidRuleName;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(Bytes::from(s))
    }
}

/// The limit of a pair: carried inline, or a rule configured on the server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitRef {
    Inline(Limit),
    /// Resolved by the server against its current rules; an unknown name is
    /// a per-check [`ErrorCode::UnknownRule`].
    Rule(RuleName),
}

impl From<Limit> for LimitRef {
    fn from(limit: Limit) -> Self {
        Self::Inline(limit)
    }
}

impl From<RuleName> for LimitRef {
    fn from(name: RuleName) -> Self {
        Self::Rule(name)
    }
}

/// One (key, limit, cost) pair of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub key: Bytes,
    pub limit: LimitRef,
    /// How many units this request takes (in a REFUND, how many units to
    /// give back). Inline limits: >= 1 (validated by the server). Rule
    /// references: 0 means the rule's default cost.
    pub cost: u32,
}

impl Pair {
    /// A pair with an inline limit.
    pub fn inline(key: impl Into<Bytes>, limit: Limit, cost: u32) -> Self {
        Self {
            key: key.into(),
            limit: LimitRef::Inline(limit),
            cost,
        }
    }

    /// A pair naming a rule; `cost` 0 takes the rule's default cost.
    pub fn rule(key: impl Into<Bytes>, rule: RuleName, cost: u32) -> Self {
        Self {
            key: key.into(),
            limit: LimitRef::Rule(rule),
            cost,
        }
    }
}

/// One lease to release: the key it was acquired on and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    pub key: Bytes,
    /// The id from the allowed decision that acquired it.
    pub lease: u64,
}

/// A batch of independent checks, each an atomic group of one or more pairs.
///
/// Stored flat (all pairs in one vector, each check a range of it) so that a
/// decoded frame costs two allocations whatever its size.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckBatch {
    pairs: Vec<Pair>,
    /// End index (exclusive) into `pairs` of each check, ascending.
    ends: Vec<u32>,
}

impl CheckBatch {
    /// An empty batch with room for `checks` checks of about one pair each.
    pub fn with_capacity(checks: usize) -> Self {
        Self {
            pairs: Vec::with_capacity(checks),
            ends: Vec::with_capacity(checks),
        }
    }

    /// Appends one check made of `pairs` (an atomic group when more than one).
    pub fn push_check<I: IntoIterator<Item = Pair>>(&mut self, pairs: I) {
        self.pairs.extend(pairs);
        self.ends.push(self.pairs.len() as u32);
    }

    /// Appends a single-pair check.
    pub fn push(&mut self, pair: Pair) {
        self.push_check(std::iter::once(pair));
    }

    /// Number of checks.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total number of pairs over all checks.
    pub fn pair_count(&self) -> usize {
        self.pairs.len()
    }

    /// The checks in order, each as the slice of its pairs.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[Pair]> + '_ {
        let mut start = 0usize;
        self.ends.iter().map(move |&end| {
            let s = &self.pairs[start..end as usize];
            start = end as usize;
            s
        })
    }

    /// Empties the batch, keeping its allocations.
    pub fn clear(&mut self) {
        self.pairs.clear();
        self.ends.clear();
    }
}

/// Client -> server messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Must be the first frame of a connection.
    Hello {
        version: u16,
        /// Free-form client name for logs (<= 255 bytes, UTF-8).
        client_name: String,
        /// Shared secret when the server requires one (<= 255 bytes).
        auth_token: Option<Bytes>,
    },
    Ping,
    /// Charge each check that passes.
    Check(CheckBatch),
    /// Answer as `Check` would, without charging anything.
    Peek(CheckBatch),
    /// Forget the state of these keys.
    Reset(Vec<Bytes>),
    /// Give back units already charged: each pair's `cost` is the amount
    /// returned. Answered with CHECKED (the decisions after the refund).
    Refund(CheckBatch),
    /// Free concurrency leases before they expire.
    Release(Vec<LeaseRef>),
    /// Replication and operations: REPLICATE, REPL_ACK, PROMOTE, STATUS.
    Repl(crate::replication::ReplRequest),
    /// The cluster's slot map (answered by TOPOLOGY_OK).
    Topology,
}

/// Role of the answering node (replication fills in `Standby`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Role {
    Primary = 1,
    Standby = 2,
}

impl Role {
    /// Decodes a wire value.
    pub fn from_wire(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Primary),
            2 => Some(Self::Standby),
            _ => None,
        }
    }
}

/// Default largest frame body a server accepts: 1 MiB.
pub const DEFAULT_MAX_FRAME: u32 = 1024 * 1024;
/// Default most checks in one CHECK/PEEK/REFUND, or keys in one RESET or
/// RELEASE.
pub const DEFAULT_MAX_BATCH: u16 = 1024;
/// Default most pairs in one atomic group.
pub const DEFAULT_MAX_GROUP: u8 = 16;
/// Default longest key, in bytes.
pub const DEFAULT_MAX_KEY_LEN: u16 = 256;

/// The server's limits, told to the client in the handshake so a client can
/// size its batches without trial and error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Largest frame body (opcode + request id + payload), in bytes.
    pub max_frame: u32,
    /// Most checks in one CHECK/PEEK/REFUND, or keys in one RESET or
    /// RELEASE.
    pub max_batch: u16,
    /// Most pairs in one check (atomic group).
    pub max_group: u8,
    /// Longest key, in bytes.
    pub max_key_len: u16,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_frame: DEFAULT_MAX_FRAME,
            max_batch: DEFAULT_MAX_BATCH,
            max_group: DEFAULT_MAX_GROUP,
            max_key_len: DEFAULT_MAX_KEY_LEN,
        }
    }
}

/// The answer to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckResult {
    Decision(Decision),
    /// This check was not evaluated; nothing was charged for it.
    Error(ErrorCode),
}

/// A rate-limit decision, as the gateway needs it for its headers.
///
/// For a group this reports one pair: when allowed, the pair with the least
/// remaining; when denied, the denying pair with the longest retry-after.
/// When a rule in shadow mode would have denied, the check is allowed
/// (`allowed` and `shadow_denied` both true) and the other fields describe
/// that would-be denial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Allowed only because the denying rule is in shadow mode (wire status
    /// 4). Meaningful only with `allowed`: a denial is encoded as a denial
    /// whatever this says. Never set together with a `lease`: the wire has
    /// no status for both, and the encoder writes such a decision as status
    /// 3. A check whose enforced pairs acquired a lease while a shadow rule
    /// would have denied is answered with the enforced decision and its
    /// lease; the server counts the shadow denial in its metrics only.
    pub shadow_denied: bool,
    /// Index, within the check, of the pair this decision describes.
    pub pair: u8,
    /// The limit of that pair (burst for a token bucket, count for a window).
    pub limit: u64,
    /// Units still available after this request.
    pub remaining: u64,
    /// Milliseconds until the pair's state is back to full.
    pub reset_after_ms: u64,
    /// When denied, milliseconds until the same request could pass
    /// ([`RETRY_NEVER`] when it never can); 0 when allowed.
    pub retry_after_ms: u64,
    /// The lease an allowed CHECK acquired on the group's concurrency pair,
    /// to RELEASE when done; `None` otherwise. Only an allowed decision
    /// carries one (status 3 on the wire): the encoder drops it from a
    /// denied decision.
    pub lease: Option<u64>,
}

/// Server -> client messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    HelloOk {
        version: u16,
        role: Role,
        epoch: u64,
        /// Replication offset of the node (0 when replication is off).
        offset: u64,
        limits: ServerLimits,
    },
    Pong,
    /// One result per check, in the order of the request.
    Checked(Vec<CheckResult>),
    /// Number of keys that held state and were removed.
    ResetDone(u32),
    /// Number of leases that were live and have been freed.
    Released(u32),
    /// The whole request failed (or the connection is about to close).
    Error {
        code: ErrorCode,
        message: String,
    },
    /// Replication and operations: REPL_STREAM and the stream's frames,
    /// STATUS_OK, PROMOTED.
    Repl(crate::replication::ReplResponse),
    /// TOPOLOGY_OK: the cluster's slot map.
    Topology(crate::cluster::ClusterTopology),
    /// MOVED: the request's slot is served elsewhere; nothing was
    /// evaluated or charged.
    Moved(crate::cluster::Moved),
}

/// Typed error codes. Wire values are stable; unknown values decode as
/// [`ErrorCode::Unknown`] so an old client can still read a newer server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The frame body does not follow the message layout.
    Malformed,
    UnknownOpcode,
    /// The frame is larger than the server accepts; the connection closes.
    FrameTooLarge,
    /// More checks in one frame than `max_batch`, or more pairs in a group
    /// than `max_group`.
    BatchTooLarge,
    KeyTooLong,
    UnsupportedVersion,
    AuthFailed,
    /// A request arrived before `Hello`.
    HandshakeRequired,
    /// Per check: a zero, overflowing or otherwise impossible limit or cost.
    InvalidLimit,
    /// Per check: the pairs of a group do not share a hash slot.
    CrossSlot,
    /// The server is draining and takes no new requests.
    ShuttingDown,
    /// The node is not the primary (replication).
    NotPrimary,
    Internal,
    /// Per check: a pair names a rule the server does not have.
    UnknownRule,
    /// Per check: the store is at its memory cap and refuses new keys
    /// (policy `refuse`); existing keys keep working.
    StoreFull,
    /// REPLICATE from a standby that knows a higher epoch than this
    /// primary's: this primary is stale and must not be followed.
    StaleEpoch,
    /// Cluster mode: nobody may serve the slot right now (it is being
    /// moved, or its shard has no primary, or this primary's lease
    /// deadline passed). Nothing was charged; retry shortly, after
    /// fetching TOPOLOGY again.
    TryAgain,
    Unknown(u16),
}

impl ErrorCode {
    /// Every code this crate knows, in wire order (1..=17).
    pub const KNOWN: [ErrorCode; 17] = [
        Self::Malformed,
        Self::UnknownOpcode,
        Self::FrameTooLarge,
        Self::BatchTooLarge,
        Self::KeyTooLong,
        Self::UnsupportedVersion,
        Self::AuthFailed,
        Self::HandshakeRequired,
        Self::InvalidLimit,
        Self::CrossSlot,
        Self::ShuttingDown,
        Self::NotPrimary,
        Self::Internal,
        Self::UnknownRule,
        Self::StoreFull,
        Self::StaleEpoch,
        Self::TryAgain,
    ];

    /// The code's name as in the spec's error table (`"CrossSlot"`);
    /// `"Unknown"` for codes this crate does not know.
    pub fn name(self) -> &'static str {
        match self {
            Self::Malformed => "Malformed",
            Self::UnknownOpcode => "UnknownOpcode",
            Self::FrameTooLarge => "FrameTooLarge",
            Self::BatchTooLarge => "BatchTooLarge",
            Self::KeyTooLong => "KeyTooLong",
            Self::UnsupportedVersion => "UnsupportedVersion",
            Self::AuthFailed => "AuthFailed",
            Self::HandshakeRequired => "HandshakeRequired",
            Self::InvalidLimit => "InvalidLimit",
            Self::CrossSlot => "CrossSlot",
            Self::ShuttingDown => "ShuttingDown",
            Self::NotPrimary => "NotPrimary",
            Self::Internal => "Internal",
            Self::UnknownRule => "UnknownRule",
            Self::StoreFull => "StoreFull",
            Self::StaleEpoch => "StaleEpoch",
            Self::TryAgain => "TryAgain",
            Self::Unknown(_) => "Unknown",
        }
    }

    pub fn to_wire(self) -> u16 {
        match self {
            Self::Malformed => 1,
            Self::UnknownOpcode => 2,
            Self::FrameTooLarge => 3,
            Self::BatchTooLarge => 4,
            Self::KeyTooLong => 5,
            Self::UnsupportedVersion => 6,
            Self::AuthFailed => 7,
            Self::HandshakeRequired => 8,
            Self::InvalidLimit => 9,
            Self::CrossSlot => 10,
            Self::ShuttingDown => 11,
            Self::NotPrimary => 12,
            Self::Internal => 13,
            Self::UnknownRule => 14,
            Self::StoreFull => 15,
            Self::StaleEpoch => 16,
            Self::TryAgain => 17,
            Self::Unknown(v) => v,
        }
    }

    pub fn from_wire(v: u16) -> Self {
        match v {
            1 => Self::Malformed,
            2 => Self::UnknownOpcode,
            3 => Self::FrameTooLarge,
            4 => Self::BatchTooLarge,
            5 => Self::KeyTooLong,
            6 => Self::UnsupportedVersion,
            7 => Self::AuthFailed,
            8 => Self::HandshakeRequired,
            9 => Self::InvalidLimit,
            10 => Self::CrossSlot,
            11 => Self::ShuttingDown,
            12 => Self::NotPrimary,
            13 => Self::Internal,
            14 => Self::UnknownRule,
            15 => Self::StoreFull,
            16 => Self::StaleEpoch,
            17 => Self::TryAgain,
            other => Self::Unknown(other),
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Self::Malformed => "malformed frame",
            Self::UnknownOpcode => "unknown opcode",
            Self::FrameTooLarge => "frame too large",
            Self::BatchTooLarge => "batch too large",
            Self::KeyTooLong => "key too long",
            Self::UnsupportedVersion => "unsupported protocol version",
            Self::AuthFailed => "authentication failed",
            Self::HandshakeRequired => "handshake required",
            Self::InvalidLimit => "invalid limit or cost",
            Self::CrossSlot => "keys of a group are in different slots",
            Self::ShuttingDown => "server shutting down",
            Self::NotPrimary => "not primary",
            Self::Internal => "internal error",
            Self::UnknownRule => "unknown rule",
            Self::StoreFull => "store full: new keys refused at the memory cap",
            Self::StaleEpoch => "stale epoch",
            Self::TryAgain => "try again: the slot is moving or its shard has no primary",
            Self::Unknown(v) => return write!(f, "unknown error code {v}"),
        };
        f.write_str(s)
    }
}
