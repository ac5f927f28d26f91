//! Human units on the command line and in config: rates, durations and
//! byte sizes. The parsers live in the protocol crate
//! ([`tollgate_protocol::units`]) so that clients and gateways read `"5/s"`
//! exactly as the server does; this module re-exports them under the
//! server's historical path.

pub use tollgate_protocol::units::*;
