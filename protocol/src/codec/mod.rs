//! The v1 codec: pure functions between frames in a `BytesMut` and
//! [`message`](crate::message) values, plus thin tokio-util wrappers.
//!
//! Invariants every decoder keeps (see `PROTOCOL.md` for the byte layout):
//! - the 4-byte length header is checked against `max_frame` (and the 5-byte
//!   minimum) before any memory is reserved, so a hostile peer cannot make us
//!   allocate more than `max_frame` per connection;
//! - "need more bytes" is `Ok(None)`: nothing is consumed and exactly the
//!   missing bytes are reserved;
//! - a complete frame is taken with one `split_to(..).freeze()` and parsed
//!   from that `Bytes`, so keys are slices of the frame, never copies;
//! - a [`DecodeError`] that is not [fatal](DecodeError::is_fatal) has consumed
//!   exactly the bad frame, so the next call goes on with the next frame;
//! - no input can make a decoder panic: every read is length-checked first,
//!   and lengths are never computed with unchecked arithmetic;
//! - announced counts never size an allocation beyond what the payload can
//!   actually hold (and request counts are checked against
//!   [`ServerLimits`](crate::ServerLimits) first).
//!
//! Encoders write the frame length by reserving the 4 header bytes and
//! patching them once the body is written (one pass). A request or response
//! that does not fit the wire fields is an [`EncodeError`], and leaves the
//! destination buffer as it was.
//!
//! The encoding is canonical: re-encoding a decoded request gives back the
//! exact bytes of its frame (the fuzz targets check this).

mod cluster;
mod error;
mod fields;
mod frame;
mod framed;
mod regions;
mod replication;
mod request;
mod response;

pub use error::{DecodeError, EncodeError};
pub use framed::{ClientCodec, ServerCodec};
pub use regions::UsageFrame;
pub use replication::ChangesFrame;
pub use request::{decode_request, encode_checks, encode_request};
pub use response::{decode_response, encode_checked, encode_response};

/// Bytes of the length prefix in front of every frame body.
pub const FRAME_HEADER_LEN: usize = 4;

/// Smallest valid frame body: opcode (1) + request id (4).
pub const MIN_FRAME_BODY: u32 = 5;

/// Largest HELLO body: opcode, request id, version, then a client name and
/// a token of 255 bytes each with their length bytes. Before a connection's
/// HELLO is accepted, a server caps frames at this (PROTOCOL.md §4), so an
/// unauthenticated peer cannot make it buffer a `max_frame` body.
pub const MAX_HELLO_FRAME: u32 = MIN_FRAME_BODY + 2 + 1 + 255 + 1 + 255;

/// Longest ERROR message the encoder sends, in bytes; longer messages are cut
/// on a char boundary. Keeps error frames small whatever the server puts in.
pub const MAX_ERROR_MESSAGE_LEN: usize = 1024;

/// Largest body a v1 server can send: a CHECKED with 65535 results of 42 bytes
/// each (allowed with a lease, the longest result; every other response is
/// smaller). The default response frame cap of [`ClientCodec`], so a
/// conforming server's answer is never refused however the server's own
/// limits are set.
pub const DEFAULT_CLIENT_MAX_FRAME: u32 = 5 + 2 + 42 * u16::MAX as u32;

/// Frame opcodes. Requests have the high bit clear, responses set.
pub mod opcode {
    pub const HELLO: u8 = 0x01;
    pub const PING: u8 = 0x02;
    pub const CHECK: u8 = 0x03;
    pub const PEEK: u8 = 0x04;
    pub const RESET: u8 = 0x05;
    /// Same payload as CHECK; answered by CHECKED.
    pub const REFUND: u8 = 0x06;
    pub const RELEASE: u8 = 0x07;
    /// Replication (PROTOCOL.md §13): a standby asks to follow.
    pub const REPLICATE: u8 = 0x08;
    /// A standby's progress on the replication connection; not answered.
    pub const REPL_ACK: u8 = 0x09;
    pub const PROMOTE: u8 = 0x0A;
    pub const STATUS: u8 = 0x0B;
    /// States handed to a primary, merged conservatively.
    pub const HANDOFF: u8 = 0x0C;
    /// Node authentication (PROTOCOL.md §15): a node asks for a nonce
    /// before its HELLO.
    pub const NODE_CHALLENGE: u8 = 0x0D;
    /// Cluster (PROTOCOL.md §14): the slot map.
    pub const TOPOLOGY: u8 = 0x10;
    /// A CHECK whose checks carry an idempotency key and a priority
    /// (PROTOCOL.md §5); answered by CHECKED.
    pub const CHECK2: u8 = 0x30;
    /// Regions (PROTOCOL.md §16): one region's usage of global keys.
    pub const USAGE: u8 = 0x20;

    pub const HELLO_OK: u8 = 0x81;
    pub const PONG: u8 = 0x82;
    /// Answers CHECK, CHECK2, PEEK and REFUND.
    pub const CHECKED: u8 = 0x83;
    pub const RESET_DONE: u8 = 0x85;
    pub const RELEASED: u8 = 0x87;
    /// Answers REPLICATE; the stream's frames follow.
    pub const REPL_STREAM: u8 = 0x88;
    pub const REPL_SNAPSHOT: u8 = 0x89;
    pub const REPL_CHANGES: u8 = 0x8A;
    pub const REPL_HEARTBEAT: u8 = 0x8B;
    /// Answers STATUS.
    pub const STATUS_OK: u8 = 0x8C;
    /// Answers PROMOTE.
    pub const PROMOTED: u8 = 0x8D;
    /// Answers HANDOFF.
    pub const HANDED_OFF: u8 = 0x8E;
    /// Answers NODE_CHALLENGE: the nonce to prove a node secret over.
    pub const CHALLENGE: u8 = 0x8F;
    /// Answers TOPOLOGY.
    pub const TOPOLOGY_OK: u8 = 0x90;
    /// Answers any request whose slot another node serves.
    pub const MOVED: u8 = 0x91;
    /// Answers USAGE.
    pub const USAGE_OK: u8 = 0xA0;
    pub const ERROR: u8 = 0xFF;
}
