//! What a connection's credentials prove: a HELLO token makes it a client,
//! and a HELLO proving a node secret over the connection's challenge makes
//! it a node or a region peer ([`Authenticator`]); an `Authorization:
//! Bearer` header opens the admin API ([`AdminAuth`]).
//!
//! Invariants:
//! - every comparison of a secret is constant-time (`subtle`) and every
//!   configured secret is compared, so how long an answer takes does not
//!   tell which secret, or how much of one, a guess got right (a secret's
//!   length may show: it is not the secret);
//! - node privilege (replicate, promote, announce a role) comes only from
//!   a proof of the cluster secret over a nonce this server drew for the
//!   connection, or, on a node run `--insecure` without one, from any
//!   HELLO; never from a client token, and never from a node secret sent
//!   as it is (it is refused: a recorded HELLO must not open a node
//!   connection);
//! - the region secret opens a region connection, which may send USAGE
//!   and nothing else a node may; a secret shared with one peer region
//!   (`--region-peer-secret`) opens one that speaks for that region alone;
//! - two secrets of each kind are accepted at once (`--*-next`), so a
//!   secret can be rotated without refusing anyone in between.

use crate::config::AuthSettings;
use subtle::{Choice, ConstantTimeEq};
use tollgate_protocol::{node_proof, NodeScope, NONCE_LEN};

/// The secrets of one kind in force: the current one and, during a
/// rotation, the next.
#[derive(Debug, Clone, Default)]
pub(crate) struct Secrets(Vec<Vec<u8>>);

impl Secrets {
    pub fn new(current: Option<&str>, next: Option<&str>) -> Self {
        Self(
            [current, next]
                .into_iter()
                .flatten()
                .map(|s| s.as_bytes().to_vec())
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `given` is one of the secrets, in time that does not depend
    /// on which (or on how much of one) matched.
    pub fn matches(&self, given: &[u8]) -> bool {
        let hit = self
            .0
            .iter()
            .fold(Choice::from(0), |hit, secret| hit | secret.ct_eq(given));
        bool::from(hit)
    }

    /// Whether `proof` is the proof of one of the secrets over `nonce`
    /// in `scope`, in time that does not depend on which matched.
    pub fn proves(&self, proof: &[u8], nonce: &[u8; NONCE_LEN], scope: NodeScope) -> bool {
        let hit = self.0.iter().fold(Choice::from(0), |hit, secret| {
            hit | node_proof(secret, nonce, scope).ct_eq(proof)
        });
        bool::from(hit)
    }
}

pub(crate) use crate::engine::Privilege;

/// Why a HELLO was refused (AuthFailed); the message the client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AuthRefusal {
    #[error("missing or wrong auth token")]
    WrongToken,
    /// A node secret itself in HELLO: nodes answer a challenge instead,
    /// so a recorded HELLO cannot be replayed.
    #[error("a node secret is never sent in HELLO: a node asks for a NODE_CHALLENGE and proves the secret over its nonce (PROTOCOL.md §15)")]
    SecretInHello,
    #[error("the proof of a node secret does not match this connection's challenge")]
    WrongProof,
}

/// Judges HELLO tokens, and the proofs nodes make of their secrets over
/// a connection's challenge.
#[derive(Debug, Clone)]
pub(crate) struct Authenticator {
    clients: Secrets,
    cluster: Secrets,
    /// `--region-secret`: proves a region peer, for USAGE only.
    region: Secrets,
    /// `--region-peer-secret`: each proves one peer region by name.
    peers: Vec<(String, Secrets)>,
    /// No cluster secret and `--insecure`: any client may act as a node.
    open_control: bool,
}

impl Authenticator {
    pub fn new(auth: &AuthSettings) -> Self {
        let cluster = Secrets::new(
            auth.cluster_secret.as_deref(),
            auth.cluster_secret_next.as_deref(),
        );
        Self {
            clients: Secrets::new(auth.auth_token.as_deref(), auth.auth_token_next.as_deref()),
            open_control: cluster.is_empty() && auth.insecure,
            region: Secrets::new(auth.region_secret.as_deref(), None),
            peers: auth
                .region_peer_secrets()
                .into_iter()
                .map(|(name, secret)| (name, Secrets::new(Some(&secret), None)))
                .collect(),
            cluster,
        }
    }

    /// What a HELLO carrying `token` (empty: none) may do, on a connection
    /// that was sent `challenge` (a NODE_CHALLENGE's nonce) or none.
    ///
    /// After a challenge the token must be the proof of a node secret
    /// (`node_proof`), unless this server holds no node secret at all (it
    /// then judges the token as a client's). Without one, a node secret
    /// itself is refused, whatever the client tokens.
    ///
    /// The region is the peer region a `--region-peer-secret` proof names:
    /// the connection speaks for it alone.
    pub fn handshake(
        &self,
        token: &[u8],
        challenge: Option<&[u8; NONCE_LEN]>,
    ) -> Result<(Privilege, Option<&str>), AuthRefusal> {
        let has_node_secrets =
            !(self.cluster.is_empty() && self.region.is_empty() && self.peers.is_empty());
        if let (Some(nonce), true) = (challenge, has_node_secrets) {
            // Every scope and peer computed and compared whatever the outcome.
            let node = self.cluster.proves(token, nonce, NodeScope::Cluster);
            let region = self.region.proves(token, nonce, NodeScope::Region);
            let peer = self.peers.iter().fold(None, |found, (name, secret)| {
                let hit = secret.proves(token, nonce, NodeScope::Region);
                found.or(hit.then_some(name.as_str()))
            });
            return match (node, region, peer) {
                (true, ..) => Ok((Privilege::Node, None)),
                (false, _, Some(name)) => Ok((Privilege::Region, Some(name))),
                (false, true, None) => Ok((Privilege::Region, None)),
                (false, false, None) => Err(AuthRefusal::WrongProof),
            };
        }
        // All compared whatever the outcome of the first.
        let peer = self
            .peers
            .iter()
            .fold(false, |hit, (_, secret)| hit | secret.matches(token));
        let secret = self.cluster.matches(token) | self.region.matches(token) | peer;
        let client = self.clients.is_empty() || self.clients.matches(token);
        match (secret, client) {
            (true, _) => Err(AuthRefusal::SecretInHello),
            (false, true) if self.open_control => Ok((Privilege::Node, None)),
            (false, true) => Ok((Privilege::Client, None)),
            (false, false) => Err(AuthRefusal::WrongToken),
        }
    }

    /// What a client's HELLO `token` counts as for the retry memory: the
    /// token where client tokens are required; nothing where they are not
    /// (PROTOCOL.md §4: the token is then ignored, and an unchecked token
    /// proves no one: every client is one identity).
    pub fn identity<'t>(&self, token: &'t [u8]) -> &'t [u8] {
        if self.clients.is_empty() {
            &[]
        } else {
            token
        }
    }

    /// What a token alone may do (no challenge: the RESP and Envoy front
    /// ends, which take client tokens); `None`: refused.
    pub fn hello(&self, token: &[u8]) -> Option<Privilege> {
        self.handshake(token, None)
            .ok()
            .map(|(privilege, _)| privilege)
    }

    /// Whether region `name` has a secret of its own here: its USAGE is
    /// then taken only over a connection that proved it.
    pub fn region_has_own_secret(&self, name: &str) -> bool {
        self.peers.iter().any(|(peer, _)| peer == name)
    }
}

/// Judges the admin API's bearer tokens.
#[derive(Debug, Clone)]
pub(crate) struct AdminAuth {
    tokens: Secrets,
    open_metrics: bool,
}

/// Endpoints that never need a token: probes must reach them.
const ALWAYS_OPEN: [&str; 2] = ["/healthz", "/readyz"];

impl AdminAuth {
    pub fn new(auth: &AuthSettings) -> Self {
        Self {
            tokens: Secrets::new(
                auth.admin_token.as_deref(),
                auth.admin_token_next.as_deref(),
            ),
            open_metrics: auth.admin_open_metrics,
        }
    }

    /// Whether a request for `path` with this `Authorization` header value
    /// may be served.
    pub fn allows(&self, path: &str, authorization: Option<&[u8]>) -> bool {
        if self.tokens.is_empty()
            || ALWAYS_OPEN.contains(&path)
            || (self.open_metrics && path == "/metrics")
        {
            return true;
        }
        let Some(token) = authorization.and_then(bearer) else {
            return false;
        };
        self.tokens.matches(token)
    }
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is
/// case-insensitive, RFC 7235).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(f: impl FnOnce(&mut AuthSettings)) -> AuthSettings {
        let mut a = AuthSettings::default();
        f(&mut a);
        a
    }

    const NONCE: [u8; NONCE_LEN] = [9; NONCE_LEN];

    /// What a handshake grants, without the region it may bind.
    fn privilege(
        auth: &Authenticator,
        token: &[u8],
        challenge: Option<&[u8; NONCE_LEN]>,
    ) -> Result<Privilege, AuthRefusal> {
        auth.handshake(token, challenge).map(|(p, _)| p)
    }

    #[test]
    fn a_peer_regions_own_secret_binds_the_connection_to_it() {
        let auth = Authenticator::new(&settings(|a| {
            a.cluster_secret = Some("cluster".into());
            a.region_secret = Some("region".into());
            a.region_peer_secret = vec!["us=us-secret".into(), "ap=ap-secret".into()];
        }));
        let us = proof("us-secret", NodeScope::Region);
        let ap = proof("ap-secret", NodeScope::Region);
        let shared = proof("region", NodeScope::Region);
        assert_eq!(
            auth.handshake(&us, Some(&NONCE)),
            Ok((Privilege::Region, Some("us")))
        );
        assert_eq!(
            auth.handshake(&ap, Some(&NONCE)),
            Ok((Privilege::Region, Some("ap")))
        );
        assert_eq!(
            auth.handshake(&shared, Some(&NONCE)),
            Ok((Privilege::Region, None))
        );
        // In the cluster scope, sent as it is, or without a challenge: nothing.
        let wrong_scope = proof("us-secret", NodeScope::Cluster);
        assert_eq!(
            auth.handshake(&wrong_scope, Some(&NONCE)),
            Err(AuthRefusal::WrongProof)
        );
        assert_eq!(
            auth.handshake(b"us-secret", None),
            Err(AuthRefusal::SecretInHello)
        );
        assert!(auth.region_has_own_secret("us"));
        assert!(!auth.region_has_own_secret("eu"));
    }

    fn proof(secret: &str, scope: NodeScope) -> [u8; 32] {
        node_proof(secret.as_bytes(), &NONCE, scope)
    }

    #[test]
    fn only_a_proof_of_the_cluster_secret_makes_a_node() {
        let auth = Authenticator::new(&settings(|a| {
            a.auth_token = Some("client-1".into());
            a.auth_token_next = Some("client-2".into());
            a.cluster_secret = Some("cluster".into());
            a.region_secret = Some("region".into());
        }));
        assert_eq!(privilege(&auth, b"client-1", None), Ok(Privilege::Client));
        assert_eq!(privilege(&auth, b"client-2", None), Ok(Privilege::Client));
        assert_eq!(
            privilege(&auth, b"client-3", None),
            Err(AuthRefusal::WrongToken)
        );
        assert_eq!(privilege(&auth, b"", None), Err(AuthRefusal::WrongToken));
        assert_eq!(
            privilege(&auth, b"clust", None),
            Err(AuthRefusal::WrongToken)
        );
        // A secret sent as it is opens nothing, with or without a challenge.
        for secret in [&b"cluster"[..], b"region"] {
            assert_eq!(
                privilege(&auth, secret, None),
                Err(AuthRefusal::SecretInHello)
            );
            assert_eq!(
                privilege(&auth, secret, Some(&NONCE)),
                Err(AuthRefusal::WrongProof)
            );
        }
        let node = proof("cluster", NodeScope::Cluster);
        let region = proof("region", NodeScope::Region);
        assert_eq!(privilege(&auth, &node, Some(&NONCE)), Ok(Privilege::Node));
        assert_eq!(
            privilege(&auth, &region, Some(&NONCE)),
            Ok(Privilege::Region)
        );
        // A proof over another nonce, or in the other scope, is refused.
        assert_eq!(
            privilege(&auth, &node, Some(&[1; 32])),
            Err(AuthRefusal::WrongProof)
        );
        let swapped = proof("region", NodeScope::Cluster);
        assert_eq!(
            privilege(&auth, &swapped, Some(&NONCE)),
            Err(AuthRefusal::WrongProof)
        );
        // After a challenge a client token is no proof.
        assert_eq!(
            privilege(&auth, b"client-1", Some(&NONCE)),
            Err(AuthRefusal::WrongProof)
        );
        // A proof without a challenge is just a wrong token.
        assert_eq!(privilege(&auth, &node, None), Err(AuthRefusal::WrongToken));
    }

    #[test]
    fn without_a_cluster_secret_no_one_is_a_node_unless_insecure() {
        let open = Authenticator::new(&settings(|_| {}));
        assert_eq!(privilege(&open, b"", None), Ok(Privilege::Client));
        assert_eq!(privilege(&open, b"anything", None), Ok(Privilege::Client));
        // No node secret here: a challenge changes nothing.
        assert_eq!(
            privilege(&open, b"anything", Some(&NONCE)),
            Ok(Privilege::Client)
        );
        let insecure = Authenticator::new(&settings(|a| a.insecure = true));
        assert_eq!(privilege(&insecure, b"", None), Ok(Privilege::Node));
        // --insecure does not open control when a secret is set.
        let with_secret = Authenticator::new(&settings(|a| {
            a.insecure = true;
            a.cluster_secret = Some("cluster".into());
        }));
        assert_eq!(privilege(&with_secret, b"", None), Ok(Privilege::Client));
        let node = proof("cluster", NodeScope::Cluster);
        assert_eq!(
            privilege(&with_secret, &node, Some(&NONCE)),
            Ok(Privilege::Node)
        );
    }

    #[test]
    fn the_admin_token_guards_all_but_the_probes() {
        let auth = AdminAuth::new(&settings(|a| {
            a.admin_token = Some("adm".into());
            a.admin_token_next = Some("adm2".into());
        }));
        assert!(auth.allows("/healthz", None));
        assert!(auth.allows("/readyz", None));
        assert!(!auth.allows("/metrics", None));
        assert!(!auth.allows("/v1/rules", None));
        assert!(!auth.allows("/v1/rules", Some(b"Bearer nope")));
        assert!(!auth.allows("/v1/rules", Some(b"Basic adm")));
        assert!(!auth.allows("/v1/rules", Some(b"Bearer")));
        assert!(auth.allows("/v1/rules", Some(b"Bearer adm")));
        assert!(auth.allows("/v1/rules", Some(b"bearer adm2")));
        let open_metrics = AdminAuth::new(&settings(|a| {
            a.admin_token = Some("adm".into());
            a.admin_open_metrics = true;
        }));
        assert!(open_metrics.allows("/metrics", None));
        assert!(!open_metrics.allows("/v1/throttled", None));
        assert!(AdminAuth::new(&settings(|_| {})).allows("/v1/rules", None));
    }
}
