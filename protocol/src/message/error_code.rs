//! The typed error codes of ERROR frames and per-check errors.

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
    /// The server is at its connection limit (in all, or for the client's
    /// address) and could not make room: sent with request id 0 as the
    /// connection's only frame, then the connection closes. Retry after a
    /// pause, or on another node.
    TooManyConnections,
    /// The server's memory for connection buffers stayed spent while a
    /// frame larger than a connection's initial buffer waited for room:
    /// sent with request id 0, then the connection closes. Nothing in the
    /// unread frame was evaluated; retry after a pause.
    Overloaded,
    /// Per check of a CHECK2: the server is overloaded and shed this check
    /// by its priority (low first). Nothing was charged; retry later.
    Shed,
    /// Per check of a CHECK2: its idempotency key is remembered for a
    /// check of another client, or for another check (other keys, limits
    /// or costs). Nothing was charged and the remembered answer was not
    /// given; the key is the client's bug (or someone else's guess).
    IdempotencyKeyReused,
    Unknown(u16),
}

impl ErrorCode {
    /// Every code this crate knows, in wire order (1..=21).
    pub const KNOWN: [ErrorCode; 21] = [
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
        Self::TooManyConnections,
        Self::Overloaded,
        Self::Shed,
        Self::IdempotencyKeyReused,
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
            Self::TooManyConnections => "TooManyConnections",
            Self::Overloaded => "Overloaded",
            Self::Shed => "Shed",
            Self::IdempotencyKeyReused => "IdempotencyKeyReused",
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
            Self::TooManyConnections => 18,
            Self::Overloaded => 19,
            Self::Shed => 20,
            Self::IdempotencyKeyReused => 21,
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
            18 => Self::TooManyConnections,
            19 => Self::Overloaded,
            20 => Self::Shed,
            21 => Self::IdempotencyKeyReused,
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
            Self::TooManyConnections => "too many connections",
            Self::Overloaded => "overloaded: no memory left for connection buffers",
            Self::Shed => "shed: the server is overloaded and sheds lower priorities first",
            Self::IdempotencyKeyReused => {
                "idempotency key reused by another client or for another check"
            }
            Self::Unknown(v) => return write!(f, "unknown error code {v}"),
        };
        f.write_str(s)
    }
}
