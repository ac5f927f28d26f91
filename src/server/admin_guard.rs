//! What the admin API refuses before it looks at a token or a route: the
//! ways a browser can be made to call it for someone else.
//!
//! - DNS rebinding: a page of `evil.example`, whose name is then made to
//!   resolve to the admin address, reads it as its own origin; its requests
//!   carry `Host: evil.example`. A `Host` that is not an IP address,
//!   `localhost` or a name of `--admin-allowed-hosts` gets 421.
//! - Cross-site requests (CSRF): a page anywhere can make a browser POST to
//!   `http://127.0.0.1:7701/v1/promote`. Browsers mark such a request with
//!   `Origin` and `Sec-Fetch-Site`; a state-changing request (any method
//!   but GET, HEAD, OPTIONS, TRACE) whose `Origin` is not the admin API's
//!   own, or whose `Sec-Fetch-Site` is `cross-site` or `same-site`, gets 403.
//! - Bodies a form can send: a state-changing request with a body must say
//!   `Content-Type: application/json` (one without a body may say
//!   nothing); anything else gets 415. No endpoint takes another type, and
//!   a form cannot send this one without the browser asking first (CORS
//!   preflight, which the admin API never grants).
//!
//! Invariants: the probes (`/healthz`, `/readyz`) skip the `Host` check
//! (health checkers send all sorts of names; they tell nothing); requests
//! without `Origin`, `Sec-Fetch-Site` or `Host` (curl, the CLI, HTTP/1.0
//! probes: no browser omits them) pass those checks; a refusal names its
//! reason and what to change, with the offending value escaped and cut.

use crate::config::{is_host_name, AllowedHosts};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST, ORIGIN, TRANSFER_ENCODING};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use prometheus::{IntCounterVec, Opts, Registry};
use std::net::IpAddr;

/// Endpoints any `Host` may reach: load balancers' and orchestrators'
/// probes use whatever name they were given, and these tell nothing.
const PROBES: [&str; 2] = ["/healthz", "/readyz"];

/// The longest piece of a refused header quoted back (and logged).
const MAX_QUOTED: usize = 64;

/// Judges requests before anything else of the admin API sees them.
#[derive(Debug, Clone)]
pub(super) struct RequestGuard {
    hosts: AllowedHosts,
    /// `tollgate_admin_refused_total{check}`.
    refused: IntCounterVec,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refusal {
    #[error("this admin API does not answer for host {0:?}: it answers for IP addresses, `localhost` and the names of --admin-allowed-hosts (a name reaching it unlisted may be DNS rebinding)")]
    Host(String),
    #[error("state-changing requests from another origin ({0:?}) are refused: the admin API is not for web pages of other sites (CSRF)")]
    Origin(String),
    #[error("state-changing requests a browser marks `Sec-Fetch-Site: {0}` are refused: the admin API is not for web pages of other sites (CSRF)")]
    FetchSite(String),
    #[error("a request body must be JSON sent with `Content-Type: application/json`, not {0:?}")]
    ContentType(String),
}

impl Refusal {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Host(_) => StatusCode::MISDIRECTED_REQUEST,
            Self::Origin(_) | Self::FetchSite(_) => StatusCode::FORBIDDEN,
            Self::ContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        }
    }

    /// The check that refused, as the error body's `refused` field.
    pub fn check(&self) -> &'static str {
        match self {
            Self::Host(_) => "host",
            Self::Origin(_) => "origin",
            Self::FetchSite(_) => "sec-fetch-site",
            Self::ContentType(_) => "content-type",
        }
    }
}

impl RequestGuard {
    pub fn new(hosts: Option<AllowedHosts>, registry: &Registry) -> prometheus::Result<Self> {
        let refused = IntCounterVec::new(
            Opts::new(
                "tollgate_admin_refused_total",
                "Admin API requests refused before the token check, by the check \
                 that refused them (host, origin, sec-fetch-site, content-type).",
            ),
            &["check"],
        )?;
        registry.register(Box::new(refused.clone()))?;
        Ok(Self {
            hosts: hosts.unwrap_or_default(),
            refused,
        })
    }

    /// Whether a request may go on to the token check and its endpoint (a
    /// refusal is counted).
    pub fn judge(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        let verdict = self.verdict(method, uri, headers);
        if let Err(refusal) = &verdict {
            self.refused.with_label_values(&[refusal.check()]).inc();
        }
        verdict
    }

    fn verdict(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        if !PROBES.contains(&uri.path()) {
            // An absolute-form target names a host too; both must pass.
            if let Some(authority) = uri.authority() {
                self.host(authority.as_str())?;
            }
            let mut hosts = headers.get_all(HOST).iter();
            if let (Some(_), Some(second)) = (hosts.next(), hosts.next()) {
                // Which one a proxy in front would have used is anyone's guess.
                return Err(Refusal::Host(quote(second)));
            }
            if let Some(host) = headers.get(HOST).filter(|h| !h.is_empty()) {
                self.host(host.to_str().map_err(|_| Refusal::Host(quote(host)))?)?;
            }
        }
        if is_safe(method) {
            return Ok(());
        }
        same_origin(headers)?;
        json_or_empty(headers)
    }

    /// A `Host` value (`name[:port]`, `address[:port]`, `[v6][:port]`).
    fn host(&self, value: &str) -> Result<(), Refusal> {
        let refused = || Refusal::Host(cut(value));
        let authority: Authority = value.parse().map_err(|_| refused())?;
        // After the host, only a port (a number) may follow.
        let port = &authority.as_str()[authority.host().len()..];
        let port_ok = port.is_empty()
            || port
                .strip_prefix(':')
                .is_some_and(|p| p.parse::<u16>().is_ok());
        if authority.as_str().contains('@') || !port_ok {
            return Err(refused());
        }
        let host = authority.host();
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if bare.parse::<IpAddr>().is_ok() || self.hosts.any() {
            return Ok(());
        }
        let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        if is_host_name(&name) && (name == "localhost" || self.hosts.lists(&name)) {
            return Ok(());
        }
        Err(refused())
    }
}

/// Methods that change nothing (RFC 9110 "safe"): the admin API's reads.
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

/// A browser's request from another origin: `Origin` is not
/// `scheme://<Host>` (or is `null`), or `Sec-Fetch-Site` says another site.
fn same_origin(headers: &HeaderMap) -> Result<(), Refusal> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.as_bytes();
        if site.eq_ignore_ascii_case(b"cross-site") || site.eq_ignore_ascii_case(b"same-site") {
            return Err(Refusal::FetchSite(String::from_utf8_lossy(site).into()));
        }
    }
    let mut origins = headers.get_all(ORIGIN).iter();
    let Some(origin) = origins.next() else {
        return Ok(());
    };
    if let Some(second) = origins.next() {
        // No browser sends two; which one would count is anyone's guess.
        return Err(Refusal::Origin(quote(second)));
    }
    let host = headers.get(HOST).map(HeaderValue::as_bytes);
    // `scheme://host[:port]`: the part after the scheme must be the Host
    // the request was sent to (a proxy may change the scheme, not that).
    let own = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .is_some_and(|(scheme, authority)| {
            matches!(scheme, "http" | "https")
                && host.is_some_and(|h| h.eq_ignore_ascii_case(authority.as_bytes()))
        });
    if own {
        Ok(())
    } else {
        Err(Refusal::Origin(quote(origin)))
    }
}

/// A body only as JSON; no `Content-Type` only without a body.
fn json_or_empty(headers: &HeaderMap) -> Result<(), Refusal> {
    match headers.get(CONTENT_TYPE) {
        Some(value) => {
            let essence = value
                .to_str()
                .ok()
                .map(|v| v.split(';').next().unwrap_or_default().trim());
            if essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
                Ok(())
            } else {
                Err(Refusal::ContentType(quote(value)))
            }
        }
        None => {
            let empty = !headers.contains_key(TRANSFER_ENCODING)
                && headers
                    .get(CONTENT_LENGTH)
                    .is_none_or(|l| l.as_bytes() == b"0");
            if empty {
                Ok(())
            } else {
                Err(Refusal::ContentType("no Content-Type".into()))
            }
        }
    }
}

/// A header value as text, cut to [`MAX_QUOTED`] characters.
fn quote(value: &HeaderValue) -> String {
    cut(&String::from_utf8_lossy(value.as_bytes()))
}

fn cut(text: &str) -> String {
    let mut out: String = text.chars().take(MAX_QUOTED).collect();
    if out.len() < text.len() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    impl RequestGuard {
        fn with(hosts: Option<&str>) -> Self {
            Self::new(hosts.map(|h| h.parse().unwrap()), &Registry::new()).unwrap()
        }
    }

    fn request(
        guard: &RequestGuard,
        method: Method,
        target: &str,
        headers: &[(&str, &str)],
    ) -> Result<(), Refusal> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        guard.judge(&method, &target.parse().unwrap(), &map)
    }

    fn check(r: Result<(), Refusal>) -> Option<&'static str> {
        r.err().map(|e| e.check())
    }

    #[test]
    fn hosts_are_addresses_localhost_or_listed() {
        let open = RequestGuard::with(None);
        let listed = RequestGuard::with(Some("admin.example.com"));
        for host in [
            "127.0.0.1:7701",
            "127.0.0.1",
            "[::1]:7701",
            "10.1.2.3:7701",
            "localhost:7701",
            "LOCALHOST.",
        ] {
            assert_eq!(
                request(&open, Method::GET, "/v1/rules", &[("host", host)]),
                Ok(()),
                "{host}"
            );
        }
        for host in [
            "evil.example",
            "evil.example:7701",
            "localhost.evil.example",
            "user@127.0.0.1",
            "a b",
            "[::1",
            "127.0.0.1:abc",
            "127.0.0.1:99999",
        ] {
            assert_eq!(
                check(request(&open, Method::GET, "/v1/rules", &[("host", host)])),
                Some("host"),
                "{host}"
            );
        }
        let admin = [("host", "Admin.Example.com:443")];
        assert_eq!(request(&listed, Method::GET, "/metrics", &admin), Ok(()));
        assert!(request(&open, Method::GET, "/metrics", &admin).is_err());
        let twice = [("host", "127.0.0.1"), ("host", "evil.example")];
        assert_eq!(
            check(request(&open, Method::GET, "/v1/rules", &twice)),
            Some("host")
        );
        // The probes answer any name; no Host at all is no browser.
        assert_eq!(
            request(&open, Method::GET, "/healthz", &[("host", "evil.example")]),
            Ok(())
        );
        assert_eq!(request(&open, Method::GET, "/v1/rules", &[]), Ok(()));
        // An absolute-form target is judged too.
        let absolute = request(
            &open,
            Method::GET,
            "http://evil.example/v1/rules",
            &[("host", "127.0.0.1")],
        );
        assert_eq!(check(absolute), Some("host"));
        let any = RequestGuard::with(Some("*"));
        assert_eq!(
            request(&any, Method::GET, "/", &[("host", "evil.example")]),
            Ok(())
        );
    }

    #[test]
    fn state_changes_come_from_the_admin_origin_only() {
        let g = RequestGuard::with(None);
        let host = ("host", "127.0.0.1:7701");
        let promote =
            |headers: &[(&str, &str)]| check(request(&g, Method::POST, "/v1/promote", headers));
        assert_eq!(promote(&[host]), None);
        assert_eq!(promote(&[host, ("origin", "http://127.0.0.1:7701")]), None);
        assert_eq!(
            promote(&[
                host,
                ("origin", "https://127.0.0.1:7701"),
                ("sec-fetch-site", "same-origin")
            ]),
            None
        );
        assert_eq!(
            promote(&[host, ("origin", "https://evil.example")]),
            Some("origin")
        );
        assert_eq!(promote(&[host, ("origin", "null")]), Some("origin"));
        // Two origins, the first its own: refused, whichever would count.
        let both = [
            host,
            ("origin", "http://127.0.0.1:7701"),
            ("origin", "http://evil.example"),
        ];
        assert_eq!(promote(&both), Some("origin"));
        assert_eq!(
            promote(&[host, ("origin", "http://127.0.0.1:8080")]),
            Some("origin")
        );
        assert_eq!(
            promote(&[("origin", "http://127.0.0.1:7701")]),
            Some("origin")
        );
        assert_eq!(
            promote(&[host, ("sec-fetch-site", "cross-site")]),
            Some("sec-fetch-site")
        );
        assert_eq!(
            promote(&[host, ("sec-fetch-site", "same-site")]),
            Some("sec-fetch-site")
        );
        // Reads are not judged by origin: a page cannot read the answer.
        let read = request(
            &g,
            Method::GET,
            "/v1/rules",
            &[host, ("origin", "https://evil.example")],
        );
        assert_eq!(read, Ok(()));
        let delete = request(
            &g,
            Method::DELETE,
            "/v1/rules/x",
            &[host, ("origin", "https://evil.example")],
        );
        assert_eq!(check(delete), Some("origin"));
    }

    #[test]
    fn bodies_are_json() {
        let g = RequestGuard::with(None);
        let put =
            |headers: &[(&str, &str)]| check(request(&g, Method::PUT, "/v1/rules/x", headers));
        assert_eq!(
            put(&[
                ("content-type", "application/json"),
                ("content-length", "2")
            ]),
            None
        );
        assert_eq!(
            put(&[("content-type", "Application/JSON; charset=utf-8")]),
            None
        );
        assert_eq!(put(&[("content-length", "0")]), None);
        assert_eq!(put(&[]), None);
        for bad in [
            "application/x-www-form-urlencoded",
            "text/plain",
            "multipart/form-data; boundary=x",
            "application/jsonx",
        ] {
            assert_eq!(put(&[("content-type", bad)]), Some("content-type"), "{bad}");
        }
        assert_eq!(put(&[("content-length", "2")]), Some("content-type"));
        assert_eq!(
            put(&[("transfer-encoding", "chunked")]),
            Some("content-type")
        );
        // A read's body is nobody's business.
        let get = request(
            &g,
            Method::GET,
            "/v1/rules",
            &[("content-type", "text/plain")],
        );
        assert_eq!(get, Ok(()));
    }
}
