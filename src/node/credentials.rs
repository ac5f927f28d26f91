//! What this node presents to other nodes ([`Credentials`]): the secret
//! it proves over another node's challenge, chosen by the link's scope
//! (the cluster, or the region exchange with one peer), or the client
//! token it says HELLO with when it holds no secret (PROTOCOL.md §15).

use tollgate_protocol::NodeScope;

/// What this node presents to other nodes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    /// `--cluster-secret`: proved over the other node's challenge.
    pub cluster: Option<String>,
    /// `--region-secret`: what the region senders prove instead, when set.
    pub region: Option<String>,
    /// `--region-peer-secret`: what the sender to one peer region proves
    /// before any other secret, (region, secret).
    pub region_peers: Vec<(String, String)>,
    /// Without a cluster secret (only with `--insecure`): the client token,
    /// if any, sent in HELLO as any client's.
    pub token: Option<String>,
}

impl Credentials {
    /// The secret to prove for `scope` to peer region `peer` (None: not a
    /// region link), and the scope it is proved in (the region exchange
    /// takes the secret shared with that peer, else the region secret,
    /// else the cluster secret); None: no secret, HELLO with the client
    /// token.
    pub(super) fn secret_for(
        &self,
        scope: NodeScope,
        peer: Option<&str>,
    ) -> Option<(&str, NodeScope)> {
        let own = peer.and_then(|name| {
            self.region_peers
                .iter()
                .find(|(region, _)| region == name)
                .map(|(_, secret)| secret.as_str())
        });
        let region = match scope {
            NodeScope::Region => own.or(self.region.as_deref()),
            NodeScope::Cluster => None,
        };
        match (region, self.cluster.as_deref()) {
            (Some(region), _) => Some((region, NodeScope::Region)),
            (None, Some(cluster)) => Some((cluster, NodeScope::Cluster)),
            (None, None) => None,
        }
    }
}
