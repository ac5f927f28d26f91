//! A minimal HTTP/1 client for the admin API: what `tollgate rules` and
//! `tollgate usage` (and the tests) use. One request per connection, JSON
//! bodies, a deadline on the whole exchange. Built on hyper's connection
//! API, which the admin server's stack already brings, rather than a second
//! HTTP stack.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use std::time::Duration;
use tokio::net::TcpStream;

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

/// Sends one request to `addr` (host:port) and reads the whole answer.
pub async fn call(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Answer, AdminError> {
    tokio::time::timeout(timeout, exchange(addr, method, path, body))
        .await
        .map_err(|_| AdminError::Timeout(timeout))?
}

async fn exchange(
    addr: &str,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Answer, AdminError> {
    let stream = TcpStream::connect(addr)
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
    let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    drop(sender);
    driver.abort();
    Ok(Answer { status, body })
}
