//! A minimal HTTP/1 client for the admin API: what `tollgate rules`,
//! `tollgate usage` and `tollgate promote` (and the tests) use. One request
//! per connection, JSON bodies, a deadline on the whole exchange, the
//! admin token as a bearer token, TLS when given a CA to verify the server
//! by. Built on hyper's connection API, which the admin server's stack
//! already brings, rather than a second HTTP stack.

use crate::tls::{Socket, TlsError};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::TlsConnector;

/// An admin API and how to reach it.
#[derive(Debug, Clone)]
pub struct AdminTarget {
    /// host:port.
    pub addr: String,
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// HTTPS, verifying the server against this config's CA.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl AdminTarget {
    /// Plain HTTP, no token.
    pub fn plain(addr: &str) -> Self {
        Self {
            addr: addr.to_owned(),
            token: None,
            tls: None,
        }
    }

    /// HTTPS verified against the CA in `ca` (PEM).
    pub fn with_ca(mut self, ca: &Path) -> Result<Self, TlsError> {
        self.tls = Some(crate::tls::client_config(ca)?);
        Ok(self)
    }

    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }
}

/// Characters left as they are in a path segment (RFC 3986 unreserved).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encodes one path segment (a key may hold `/`, `{`, spaces...).
pub fn segment(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot reach the admin API at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("bad request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request to `addr` (host:port, plain HTTP, no token) and reads
/// the whole answer.
pub async fn call(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Answer, AdminError> {
    request(&AdminTarget::plain(addr), method, path, body, timeout).await
}

/// Sends one request to `target` and reads the whole answer.
pub async fn request(
    target: &AdminTarget,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Answer, AdminError> {
    tokio::time::timeout(timeout, exchange(target, method, path, body, timeout))
        .await
        .map_err(|_| AdminError::Timeout(timeout))?
}

async fn exchange(
    target: &AdminTarget,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Answer, AdminError> {
    let addr = target.addr.as_str();
    let connector = target.tls.clone().map(TlsConnector::from);
    let stream: Socket = crate::tls::connect(addr, connector.as_ref(), timeout)
        .await
        .map_err(|source| AdminError::Connect {
            addr: addr.to_owned(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Drives the connection; ends when the exchange is over.
    let driver = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "admin client connection");
        }
    });
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, addr);
    if body.is_some() {
        request = request.header(hyper::header::CONTENT_TYPE, "application/json");
    }
    if let Some(token) = &target.token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    drop(sender);
    driver.abort();
    Ok(Answer { status, body })
}
