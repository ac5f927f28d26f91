//! Routes: which requests a policy applies to, and whose identifier it
//! counts.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use http::{HeaderName, Method, Request};
use tollgate_client::Policy;

/// A custom identifier extractor: the request head in, the identifier out.
pub type ExtractFn = Arc<dyn Fn(&http::request::Parts) -> Option<Vec<u8>> + Send + Sync>;

/// Where the caller's identifier comes from.
#[derive(Clone)]
pub enum KeyExtractor {
    /// A request header's value (e.g. `x-api-key`). Missing or empty: 400.
    Header(HeaderName),
    /// The peer's IP address, from axum's `ConnectInfo<SocketAddr>` (serve
    /// with `into_make_service_with_connect_info`); without it: 400.
    Ip,
    /// The request path: one counter per endpoint.
    Path,
    /// Anything else; `None` (or an empty identifier) is a 400.
    Custom(ExtractFn),
}

/// A header name that is not one.
#[derive(Debug, thiserror::Error)]
#[error("invalid header name {0:?}")]
pub struct KeyExtractorError(String);

impl KeyExtractor {
    /// The identifier in header `name`.
    pub fn header(name: &str) -> Result<Self, KeyExtractorError> {
        HeaderName::try_from(name)
            .map(Self::Header)
            .map_err(|_| KeyExtractorError(name.to_owned()))
    }

    /// The identifier of a request, if it has one.
    pub(crate) fn extract<B>(&self, request: &Request<B>) -> Option<Vec<u8>> {
        let id = match self {
            Self::Header(name) => request.headers().get(name)?.as_bytes().to_vec(),
            Self::Ip => request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip().to_string().into_bytes())?,
            Self::Path => request.uri().path().as_bytes().to_vec(),
            Self::Custom(f) => {
                let (parts, ()) = clone_parts(request).into_parts();
                f(&parts)?
            }
        };
        (!id.is_empty()).then_some(id)
    }
}

/// The head of a request, without its body, for a custom extractor.
fn clone_parts<B>(request: &Request<B>) -> Request<()> {
    let mut head = Request::builder()
        .method(request.method().clone())
        .uri(request.uri().clone())
        .version(request.version())
        .body(())
        .unwrap_or_default();
    *head.headers_mut() = request.headers().clone();
    head
}

impl std::fmt::Debug for KeyExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header(h) => write!(f, "Header({h})"),
            Self::Ip => f.write_str("Ip"),
            Self::Path => f.write_str("Path"),
            Self::Custom(_) => f.write_str("Custom"),
        }
    }
}

/// A policy applied to the requests a method and a path match.
#[derive(Debug, Clone)]
pub struct Route {
    method: Option<Method>,
    /// An exact path, or a prefix when it ends in `*`.
    path: String,
    pub(crate) key: KeyExtractor,
    pub(crate) policy: Arc<Policy>,
    pub(crate) cost: u32,
}

impl Route {
    /// Requests of any method to `path` (a prefix when it ends in `*`).
    pub fn any(path: &str, key: KeyExtractor, policy: Policy) -> Self {
        Self {
            method: None,
            path: path.to_owned(),
            key,
            policy: Arc::new(policy),
            cost: 1,
        }
    }

    /// `GET` requests to `path`.
    pub fn get(path: &str, key: KeyExtractor, policy: Policy) -> Self {
        Self::any(path, key, policy).method(Method::GET)
    }

    /// `POST` requests to `path`.
    pub fn post(path: &str, key: KeyExtractor, policy: Policy) -> Self {
        Self::any(path, key, policy).method(Method::POST)
    }

    /// Only requests of `method`.
    pub fn method(mut self, method: Method) -> Self {
        self.method = Some(method);
        self
    }

    /// Units each request takes (default 1).
    pub fn cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    pub(crate) fn matches<B>(&self, request: &Request<B>) -> bool {
        if self.method.as_ref().is_some_and(|m| m != request.method()) {
            return false;
        }
        let path = request.uri().path();
        match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == self.path,
        }
    }
}

#[cfg(test)]
mod tests {
    use tollgate_client::{Limit, Rate};

    use super::*;

    fn policy() -> Policy {
        Policy::new("p")
            .unwrap()
            .limit("l", Limit::token_bucket(Rate::per_second(1), 1))
            .unwrap()
    }

    #[test]
    fn routes_match_method_and_path() {
        let exact = Route::get("/api/search", KeyExtractor::Path, policy());
        let req = |m: Method, p: &str| Request::builder().method(m).uri(p).body(()).unwrap();
        assert!(exact.matches(&req(Method::GET, "/api/search")));
        assert!(!exact.matches(&req(Method::POST, "/api/search")));
        assert!(!exact.matches(&req(Method::GET, "/api/search/x")));
        let prefix = Route::any("/api/*", KeyExtractor::Path, policy());
        assert!(prefix.matches(&req(Method::DELETE, "/api/x/y")));
        assert!(!prefix.matches(&req(Method::GET, "/health")));
    }

    #[test]
    fn empty_or_missing_identifiers_are_none() {
        let key = KeyExtractor::header("x-api-key").unwrap();
        let with = |v: &str| Request::builder().header("x-api-key", v).body(()).unwrap();
        assert_eq!(key.extract(&with("k1")), Some(b"k1".to_vec()));
        assert_eq!(key.extract(&with("")), None);
        assert_eq!(key.extract(&Request::new(())), None);
        assert_eq!(KeyExtractor::Ip.extract(&Request::new(())), None);
        let custom = KeyExtractor::Custom(Arc::new(|p: &http::request::Parts| {
            p.uri.query().map(|q| q.as_bytes().to_vec())
        }));
        let r = Request::builder().uri("/x?tenant=7").body(()).unwrap();
        assert_eq!(custom.extract(&r), Some(b"tenant=7".to_vec()));
        assert!(KeyExtractor::header("bad header").is_err());
    }
}
