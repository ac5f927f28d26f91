//! Node authentication (`PROTOCOL.md` §15): a node proves that it holds a
//! node secret without the secret crossing the wire.
//!
//! The node asks for a challenge (NODE_CHALLENGE, before HELLO); the
//! server answers CHALLENGE with a fresh random nonce; the node's HELLO
//! then carries, as its token, [`node_proof`]: HMAC-SHA256 keyed with the
//! secret over the nonce and the scope's context. A recorded HELLO is
//! worthless on another connection, whose nonce differs.
//!
//! Two scopes, two contexts: a proof made for the region exchange can
//! never pass for one made for the cluster, even under the same key.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the server's nonce in CHALLENGE.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (HMAC-SHA256), HELLO's token after a challenge.
pub const PROOF_LEN: usize = 32;

/// Which node secret a proof is made with, and so what the connection may
/// do once the server accepts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeScope {
    /// The cluster secret: every node-to-node request.
    Cluster,
    /// The region secret: USAGE (and PING) only.
    Region,
}

impl NodeScope {
    /// The bytes hashed after the nonce (ASCII, no terminator).
    pub const fn context(self) -> &'static [u8] {
        match self {
            Self::Cluster => b"tollgate node auth v1 cluster",
            Self::Region => b"tollgate node auth v1 region",
        }
    }
}

/// HMAC-SHA256(key = `secret`, message = `nonce` || `scope.context()`).
pub fn node_proof(secret: &[u8], nonce: &[u8; NONCE_LEN], scope: NodeScope) -> [u8; PROOF_LEN] {
    // HMAC takes a key of any length (a long one is hashed first), so
    // building it cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    mac.update(nonce);
    mac.update(scope.context());
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_depends_on_secret_nonce_and_scope() {
        let nonce = [7u8; NONCE_LEN];
        let p = node_proof(b"secret", &nonce, NodeScope::Cluster);
        assert_eq!(p, node_proof(b"secret", &nonce, NodeScope::Cluster));
        assert_ne!(p, node_proof(b"secret", &nonce, NodeScope::Region));
        assert_ne!(p, node_proof(b"secreT", &nonce, NodeScope::Cluster));
        assert_ne!(
            p,
            node_proof(b"secret", &[8u8; NONCE_LEN], NodeScope::Cluster)
        );
    }

    /// RFC 4231 test case 2, as a check that this is plain HMAC-SHA256
    /// over nonce || context (so any language's HMAC reproduces it).
    #[test]
    fn it_is_plain_hmac_sha256() {
        let mut mac = Hmac::<Sha256>::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        let tag: [u8; 32] = mac.finalize().into_bytes().into();
        assert_eq!(tag[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    }
}
