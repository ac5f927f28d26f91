//! Where a cluster's state lives in etcd: every key under one prefix per
//! cluster name, `/tollgate/<cluster>/`.
//!
//! | Key | Value (JSON) | Lease |
//! |---|---|---|
//! | `topology` | [`Topology`](super::Topology): slot ranges per shard, moves in progress | none |
//! | `nodes/<addr>` | [`NodeRecord`](super::NodeRecord): the node's shard and addresses | the node's |
//! | `primary/<shard>` | [`PrimaryRecord`](super::PrimaryRecord): who is the shard's primary | the primary's |
//!
//! The topology's version is its key's `mod_revision`; a shard's epoch is
//! its `primary/<shard>` key's `create_revision`. Cluster names are limited
//! to `[A-Za-z0-9._-]`, so one cluster's prefix is never a prefix of
//! another's.

use super::{ClusterError, ShardId};

/// Longest cluster name, in bytes.
pub const MAX_CLUSTER_NAME_LEN: usize = 64;

/// The keys of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyspace {
    cluster: String,
    prefix: String,
}

/// What a key under the prefix names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    Topology,
    Node(String),
    Primary(ShardId),
    /// Under the prefix but not a key this version writes.
    Other,
}

impl Keyspace {
    pub fn new(cluster: &str) -> Result<Self, ClusterError> {
        let valid = !cluster.is_empty()
            && cluster.len() <= MAX_CLUSTER_NAME_LEN
            && cluster
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid {
            return Err(ClusterError::ClusterName {
                name: cluster.to_owned(),
            });
        }
        Ok(Self {
            cluster: cluster.to_owned(),
            prefix: format!("/tollgate/{cluster}/"),
        })
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Every key of the cluster starts with this.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn topology(&self) -> String {
        format!("{}topology", self.prefix)
    }

    pub fn node(&self, addr: &str) -> String {
        format!("{}nodes/{addr}", self.prefix)
    }

    pub fn primary(&self, shard: ShardId) -> String {
        format!("{}primary/{shard}", self.prefix)
    }

    /// What `key` names, or None when it is not under the prefix.
    pub fn parse(&self, key: &[u8]) -> Option<KeyKind> {
        let rest = std::str::from_utf8(key.strip_prefix(self.prefix.as_bytes())?).ok()?;
        Some(if rest == "topology" {
            KeyKind::Topology
        } else if let Some(addr) = rest.strip_prefix("nodes/") {
            KeyKind::Node(addr.to_owned())
        } else if let Some(shard) = rest
            .strip_prefix("primary/")
            .and_then(|s| s.parse::<u16>().ok())
        {
            KeyKind::Primary(ShardId(shard))
        } else {
            KeyKind::Other
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_names_are_checked() {
        let k = Keyspace::new("prod-eu.1").unwrap();
        assert_eq!(k.topology(), "/tollgate/prod-eu.1/topology");
        assert_eq!(k.parse(k.topology().as_bytes()), Some(KeyKind::Topology));
        assert_eq!(
            k.parse(k.node("10.0.0.1:7700").as_bytes()),
            Some(KeyKind::Node("10.0.0.1:7700".into()))
        );
        assert_eq!(
            k.parse(k.primary(ShardId(12)).as_bytes()),
            Some(KeyKind::Primary(ShardId(12)))
        );
        assert_eq!(k.parse(b"/tollgate/prod-eu.1/x"), Some(KeyKind::Other));
        assert_eq!(k.parse(b"/tollgate/prod-eu.10/topology"), None);
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(Keyspace::new(bad).is_err(), "{bad:?}");
        }
    }
}
