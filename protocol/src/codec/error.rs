//! Decode and encode errors.
//!
//! Each variant carries the numbers that explain it (lengths, counts,
//! limits), so a log line says what was wrong without a hex dump. A decode
//! error is either *fatal* (the byte stream can no longer be split into
//! frames, so the connection must close) or *per frame* (the bad frame was
//! consumed whole and the server answers it with an ERROR frame carrying its
//! request id and [`DecodeError::code`]).

use crate::message::{ErrorCode, RequestId};

/// Why bytes could not be decoded into a message.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The length header announces more than the receiver accepts. Fatal:
    /// the body is neither read nor skipped.
    #[error("frame body of {len} bytes exceeds the limit of {max}")]
    FrameTooLarge { len: u32, max: u32 },

    /// The length header announces less than opcode + request id. Fatal: a
    /// header that small is not a frame, so the stream is out of step.
    #[error("frame body of {len} bytes is shorter than the 5-byte minimum")]
    FrameTooShort { len: u32 },

    #[error("request {request_id}: unknown opcode {opcode:#04x}")]
    UnknownOpcode { request_id: RequestId, opcode: u8 },

    /// A field runs past the end of the frame. `offset` is where the field
    /// starts in the payload (after opcode and request id).
    #[error(
        "request {request_id}: opcode {opcode:#04x} needs {needed} bytes at payload offset \
         {offset}, only {available} left in the frame"
    )]
    Truncated {
        request_id: RequestId,
        opcode: u8,
        offset: usize,
        needed: usize,
        available: usize,
    },

    /// The message ended before the frame did.
    #[error("request {request_id}: {extra} bytes left in the frame after opcode {opcode:#04x}")]
    TrailingBytes {
        request_id: RequestId,
        opcode: u8,
        extra: usize,
    },

    /// A CHECK/PEEK/REFUND with no checks, or a RESET/RELEASE with no keys.
    #[error("request {request_id}: opcode {opcode:#04x} with an empty batch")]
    EmptyBatch { request_id: RequestId, opcode: u8 },

    /// More checks (or RESET keys, or RELEASE leases) than `max_batch`.
    #[error("request {request_id}: batch of {count} exceeds the limit of {max}")]
    BatchTooLarge {
        request_id: RequestId,
        count: u16,
        max: u16,
    },

    /// A check (index `check` in its batch) with no pairs.
    #[error("request {request_id}: check {check} has no pairs")]
    EmptyGroup { request_id: RequestId, check: u16 },

    /// A check with more pairs than `max_group`.
    #[error("request {request_id}: check {check} has {count} pairs, the limit is {max}")]
    GroupTooLarge {
        request_id: RequestId,
        check: u16,
        count: u8,
        max: u8,
    },

    #[error("request {request_id}: empty key")]
    EmptyKey { request_id: RequestId },

    #[error("request {request_id}: key of {len} bytes exceeds the limit of {max}")]
    KeyTooLong {
        request_id: RequestId,
        len: u16,
        max: u16,
    },

    #[error("request {request_id}: unknown algorithm {algorithm}")]
    UnknownAlgorithm {
        request_id: RequestId,
        algorithm: u8,
    },

    /// A pair's `limit_kind` is neither an algorithm code (1..=127) nor a
    /// rule reference (0x80).
    #[error("request {request_id}: unknown limit kind {kind:#04x}")]
    UnknownLimitKind { request_id: RequestId, kind: u8 },

    /// A rule reference whose `name_len` is 0 or above 64.
    #[error("request {request_id}: rule name of {len} bytes (must be 1 to 64)")]
    RuleNameLength { request_id: RequestId, len: u8 },

    /// `field` names the text field ("client name", "error message",
    /// "rule name").
    #[error("request {request_id}: {field} is not valid UTF-8")]
    InvalidUtf8 {
        request_id: RequestId,
        field: &'static str,
    },

    /// A HELLO for another protocol version. The rest of its payload is not
    /// read: only the version field's place is the same in every version.
    #[error("request {request_id}: protocol version {version} is not supported")]
    UnsupportedVersion { request_id: RequestId, version: u16 },

    /// (Responses) a HELLO_OK with a role other than primary or standby.
    #[error("request {request_id}: unknown role {role}")]
    UnknownRole { request_id: RequestId, role: u8 },

    /// (Responses) a CHECKED result whose status is not 0, 1, 2, 3 or 4.
    #[error("request {request_id}: unknown result status {status}")]
    UnknownStatus { request_id: RequestId, status: u8 },

    /// A field holds a value its layout does not allow: a flag byte other
    /// than 0 or 1, a table state other than 0-2, a state in the wrong
    /// table, snapshot slots that are not a power-of-two split (§13).
    #[error("request {request_id}: opcode {opcode:#04x}: invalid {field} {value}")]
    InvalidValue {
        request_id: RequestId,
        opcode: u8,
        field: &'static str,
        value: u64,
    },

    /// The peer closed the stream in the middle of a frame. Fatal.
    #[error("stream ended inside a frame, {buffered} bytes buffered")]
    UnexpectedEof { buffered: usize },

    /// Reading the socket failed (tokio-util's `Decoder` requires this). Fatal.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl DecodeError {
    /// True when the stream can no longer be framed and the connection must
    /// close. Every other error consumed exactly its frame, so decoding goes
    /// on with the next one.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::FrameTooLarge { .. }
                | Self::FrameTooShort { .. }
                | Self::UnexpectedEof { .. }
                | Self::Io(_)
        )
    }

    /// The id of the bad frame, when its header could be read (always, for
    /// non-fatal errors).
    pub fn request_id(&self) -> Option<RequestId> {
        match *self {
            Self::UnknownOpcode { request_id, .. }
            | Self::Truncated { request_id, .. }
            | Self::TrailingBytes { request_id, .. }
            | Self::EmptyBatch { request_id, .. }
            | Self::BatchTooLarge { request_id, .. }
            | Self::EmptyGroup { request_id, .. }
            | Self::GroupTooLarge { request_id, .. }
            | Self::EmptyKey { request_id }
            | Self::KeyTooLong { request_id, .. }
            | Self::UnknownAlgorithm { request_id, .. }
            | Self::UnknownLimitKind { request_id, .. }
            | Self::RuleNameLength { request_id, .. }
            | Self::InvalidUtf8 { request_id, .. }
            | Self::UnsupportedVersion { request_id, .. }
            | Self::UnknownRole { request_id, .. }
            | Self::UnknownStatus { request_id, .. }
            | Self::InvalidValue { request_id, .. } => Some(request_id),
            Self::FrameTooLarge { .. }
            | Self::FrameTooShort { .. }
            | Self::UnexpectedEof { .. }
            | Self::Io(_) => None,
        }
    }

    /// The code a server answers this error with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            Self::UnknownOpcode { .. } => ErrorCode::UnknownOpcode,
            Self::BatchTooLarge { .. } | Self::GroupTooLarge { .. } => ErrorCode::BatchTooLarge,
            Self::KeyTooLong { .. } => ErrorCode::KeyTooLong,
            Self::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            Self::FrameTooShort { .. }
            | Self::Truncated { .. }
            | Self::TrailingBytes { .. }
            | Self::EmptyBatch { .. }
            | Self::EmptyGroup { .. }
            | Self::EmptyKey { .. }
            | Self::UnknownAlgorithm { .. }
            | Self::UnknownLimitKind { .. }
            | Self::RuleNameLength { .. }
            | Self::InvalidUtf8 { .. }
            | Self::UnknownRole { .. }
            | Self::UnknownStatus { .. }
            | Self::InvalidValue { .. }
            | Self::UnexpectedEof { .. } => ErrorCode::Malformed,
            Self::Io(_) => ErrorCode::Internal,
        }
    }
}

/// Why a message could not be encoded: a value does not fit its wire field.
/// The destination buffer is left as it was.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// `field` names what overflowed ("key", "pairs in a group", ...); `len`
    /// is its length or count, `max` what its wire field can carry.
    #[error("{field}: {len} does not fit the wire field (at most {max})")]
    TooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },

    /// The whole body exceeds what a `u32` length prefix can carry.
    #[error("frame body of {len} bytes does not fit a u32 length")]
    FrameTooLarge { len: usize },

    /// Writing the socket failed (tokio-util's `Encoder` requires this).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
