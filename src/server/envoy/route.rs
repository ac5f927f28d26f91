//! Cluster mode on the Envoy port: a call whose descriptors' keys are not
//! all this node's to serve is refused whole, before anything is charged,
//! with the owner named the way RESP's MOVED names it.
//!
//! ```text
//!  a key's slot is another shard's   -> FAILED_PRECONDITION
//!                                       "MOVED <slot> <host>:<port>"
//!  no primary / lease / slot moving  -> UNAVAILABLE "try again: ..."
//!  this node not serving (standby)   -> UNAVAILABLE naming the primary
//! ```
//!
//! The owner's address is its protocol address's host on this node's
//! Envoy port (every node of a deployment runs the front end on the same
//! port), so Envoy's operator, or a client that routes by slot, can tell
//! where the key is served. Envoy itself sends every call to one cluster;
//! it applies its `failure_mode_deny` to the error.

use crate::node::{Gate, Refusal};
use crate::server::frontend::on_port;
use tonic::Status;

/// Screens a call's keys (all of them, in descriptor order) through the
/// node's gate; `port` is this node's Envoy port.
pub(super) fn screen<'k>(
    gate: &Gate<'_>,
    keys: impl Iterator<Item = &'k [u8]>,
    port: u16,
) -> Result<(), Status> {
    gate.screen_keys(keys).map_err(|r| refused(&r, port))
}

/// The gRPC answer of a node's refusal.
pub(super) fn refused(refusal: &Refusal, port: u16) -> Status {
    match refusal {
        Refusal::Moved { slot, addr, .. } => {
            let (host, port) = on_port(addr, port);
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host
            };
            Status::failed_precondition(format!("MOVED {slot} {host}:{port}"))
        }
        other => Status::unavailable(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moved_names_the_owner_on_this_envoy_port() {
        let moved = |addr: &str| Refusal::Moved {
            slot: 42,
            addr: addr.into(),
            version: 3,
        };
        let status = refused(&moved("10.0.0.7:7700"), 8081);
        assert_eq!(status.code(), tonic::Code::FailedPrecondition);
        assert_eq!(status.message(), "MOVED 42 10.0.0.7:8081");
        assert_eq!(
            refused(&moved("[::1]:7700"), 8081).message(),
            "MOVED 42 [::1]:8081"
        );
        let standby = Refusal::NotPrimary {
            primary: Some("10.0.0.1:7700".into()),
            epoch: 2,
        };
        assert_eq!(refused(&standby, 8081).code(), tonic::Code::Unavailable);
    }
}
