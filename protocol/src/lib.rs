//! Tollgate wire protocol v1.
//!
//! Byte layout: `PROTOCOL.md` beside this crate (the normative spec).
//! - [`message`]: requests, responses and their parts as Rust values;
//! - [`codec`]: pure encode/decode functions over `BytesMut`, bounded by
//!   [`ServerLimits`], plus thin tokio-util `Encoder`/`Decoder` wrappers.
//!
//! # Layout
//!
//! ```text
//! socket bytes -> BytesMut -> take_frame (header checked vs max_frame)
//!              -> split_to(..).freeze() -> payload reader (limits checked)
//!              -> (RequestId, Request)  -> server -> Response
//!              -> encode_response / encode_checked -> BytesMut -> socket
//! ```

pub mod codec;
pub mod message;
pub mod replication;

pub use codec::*;
pub use message::*;
pub use replication::*;
