//! Tollgate wire protocol v1.
//!
//! Byte layout: `PROTOCOL.md` beside this crate (the normative spec).
//! - [`message`]: requests, responses and their parts as Rust values
//!   ([`replication`], [`cluster`] and [`regions`] hold those of §13, §14
//!   and §16);
//! - [`node_auth`]: the proof a node makes of its secret (§15);
//! - [`slot`]: the slot of a key (CRC16 and hash tags, as Redis Cluster);
//! - [`units`]: the `5/s` rate and `250ms` duration parsers everyone shares;
//! - `limits`: [`Limit`] constructors and the reading of a rule's fields;
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

pub mod cluster;
pub mod codec;
mod limits;
pub mod message;
pub mod node_auth;
pub mod regions;
pub mod replication;
pub mod slot;
pub mod units;

pub use cluster::*;
pub use codec::*;
pub use limits::RuleFieldError;
pub use message::*;
pub use node_auth::*;
pub use regions::*;
pub use replication::*;
