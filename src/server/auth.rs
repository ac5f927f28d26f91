//! What a connection's credentials prove: a HELLO token makes it a client
//! or a node ([`Authenticator`]); an `Authorization: Bearer` header opens
//! the admin API ([`AdminAuth`]).
//!
//! Invariants:
//! - every comparison of a secret is constant-time (`subtle`) and every
//!   configured secret is compared, so how long an answer takes does not
//!   tell which secret, or how much of one, a guess got right (a secret's
//!   length may show: it is not the secret);
//! - node privilege (replicate, promote, announce a role) comes only from
//!   the cluster secret, or, on a node run `--insecure` without one, from
//!   any HELLO; never from a client token;
//! - two secrets of each kind are accepted at once (`--*-next`), so a
//!   secret can be rotated without refusing anyone in between.

use crate::config::AuthSettings;
use subtle::{Choice, ConstantTimeEq};

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
}

/// What a connection may do, by what its HELLO proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Privilege {
    /// Checks and the rest of the client protocol; read-only STATUS.
    Client,
    /// Also replication, PROMOTE and STATUS announces: another node.
    Node,
}

/// Judges HELLO tokens.
#[derive(Debug, Clone)]
pub(crate) struct Authenticator {
    clients: Secrets,
    cluster: Secrets,
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
            cluster,
        }
    }

    /// What a HELLO carrying `token` (empty: none) may do; `None`: refused
    /// (AuthFailed).
    pub fn hello(&self, token: &[u8]) -> Option<Privilege> {
        // Both compared whatever the outcome of the first.
        let node = !self.cluster.is_empty() && self.cluster.matches(token);
        let client = self.clients.is_empty() || self.clients.matches(token);
        match (node, client) {
            (true, _) => Some(Privilege::Node),
            (false, true) if self.open_control => Some(Privilege::Node),
            (false, true) => Some(Privilege::Client),
            (false, false) => None,
        }
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

    #[test]
    fn the_cluster_secret_alone_makes_a_node() {
        let auth = Authenticator::new(&settings(|a| {
            a.auth_token = Some("client-1".into());
            a.auth_token_next = Some("client-2".into());
            a.cluster_secret = Some("cluster".into());
        }));
        assert_eq!(auth.hello(b"client-1"), Some(Privilege::Client));
        assert_eq!(auth.hello(b"client-2"), Some(Privilege::Client));
        assert_eq!(auth.hello(b"cluster"), Some(Privilege::Node));
        assert_eq!(auth.hello(b"client-3"), None);
        assert_eq!(auth.hello(b""), None);
        assert_eq!(auth.hello(b"clust"), None);
    }

    #[test]
    fn without_a_cluster_secret_no_one_is_a_node_unless_insecure() {
        let open = Authenticator::new(&settings(|_| {}));
        assert_eq!(open.hello(b""), Some(Privilege::Client));
        assert_eq!(open.hello(b"anything"), Some(Privilege::Client));
        let insecure = Authenticator::new(&settings(|a| a.insecure = true));
        assert_eq!(insecure.hello(b""), Some(Privilege::Node));
        // --insecure does not open control when a secret is set.
        let with_secret = Authenticator::new(&settings(|a| {
            a.insecure = true;
            a.cluster_secret = Some("cluster".into());
        }));
        assert_eq!(with_secret.hello(b""), Some(Privilege::Client));
        assert_eq!(with_secret.hello(b"cluster"), Some(Privilege::Node));
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
