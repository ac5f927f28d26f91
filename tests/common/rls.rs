//! A raw HTTP/2 client (the `h2` crate) for the Envoy RLS port: gRPC
//! `ShouldRateLimit` calls written and read by hand, so a test can also
//! send what no well-behaved gRPC client would (half bodies, no token).

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use std::net::SocketAddr;
use tokio::net::TcpStream;

pub const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// gRPC status codes.
pub const OK: u32 = 0;
pub const FAILED_PRECONDITION: u32 = 9;
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const OUT_OF_RANGE: u32 = 11;
pub const UNAUTHENTICATED: u32 = 16;

/// An HTTP/2 connection to `addr` (None: refused).
pub async fn h2_client(addr: SocketAddr) -> Option<SendRequest<Bytes>> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    let (send, conn) = h2::client::handshake(tcp).await.ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(send)
}

/// The headers of a ShouldRateLimit call.
pub fn request(addr: SocketAddr, token: Option<&str>) -> hyper::Request<()> {
    let mut r = hyper::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        r = r.header("authorization", format!("Bearer {token}"));
    }
    r.body(()).unwrap()
}

/// A protobuf length-delimited field (every length here is under 128).
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    assert!(bytes.len() < 128);
    let mut out = vec![(number << 3) | 2, bytes.len() as u8];
    out.extend_from_slice(bytes);
    out
}

/// A ShouldRateLimit request of one descriptor (`key=value`) limited by
/// an override of 10 per minute, as a gRPC message (length-prefixed).
pub fn message(domain: &str, key: &str, value: &str) -> Bytes {
    message_of(domain, &[(key, value)])
}

/// The same with one descriptor per `(key, value)`.
pub fn message_of(domain: &str, descriptors: &[(&str, &str)]) -> Bytes {
    let mut request = field(1, domain.as_bytes());
    for (key, value) in descriptors {
        let entry = [field(1, key.as_bytes()), field(2, value.as_bytes())].concat();
        let limit = [0x08, 10, 0x10, 2]; // requests_per_unit 10, unit MINUTE
        request.extend(field(2, &[field(1, &entry), field(2, &limit)].concat()));
    }
    let mut framed = vec![0];
    framed.extend_from_slice(&(request.len() as u32).to_be_bytes());
    framed.extend_from_slice(&request);
    Bytes::from(framed)
}

/// The answer of one call.
#[derive(Debug)]
pub struct Answer {
    pub status: u32,
    /// grpc-message, percent-decoded.
    pub message: String,
    /// The response message, length-prefixed.
    pub body: Bytes,
}

impl Answer {
    /// Each descriptor status's `limit_remaining`, from the response.
    pub fn remaining(&self) -> Vec<u64> {
        let message = self.body.get(5..).unwrap_or_default();
        fields(message)
            .into_iter()
            .filter_map(|(n, v)| (n == 2).then_some(v).and_then(Value::bytes))
            .map(|status| {
                fields(status)
                    .into_iter()
                    .find_map(|(n, v)| match (n, v) {
                        (3, Value::Varint(r)) => Some(r),
                        _ => None,
                    })
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// One call: its status, message and response body.
pub async fn call(
    send: &SendRequest<Bytes>,
    addr: SocketAddr,
    token: Option<&str>,
    body: Bytes,
) -> Result<Answer, h2::Error> {
    let mut send = send.clone().ready().await?;
    let (response, mut stream) = send.send_request(request(addr, token), false)?;
    stream.send_data(body, true)?;
    let (parts, mut body) = response.await?.into_parts();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?.unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .or_else(|| trailers.get(name))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Ok(Answer {
        status: header("grpc-status")
            .and_then(|s| s.parse().ok())
            .expect("a grpc-status"),
        message: percent_decoded(&header("grpc-message").unwrap_or_default()),
        body: data.freeze(),
    })
}

/// gRPC's percent-encoding of grpc-message, undone.
fn percent_decoded(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        let hex = |b: Option<u8>| char::from(b.unwrap_or(b'?')).to_digit(16);
        if b == b'%' {
            let (hi, lo) = (hex(bytes.next()), hex(bytes.next()));
            out.push((hi.unwrap_or(0) * 16 + lo.unwrap_or(0)) as u8);
        } else {
            out.push(b);
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A protobuf field's value (the wire types these messages use).
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

impl<'a> Value<'a> {
    fn bytes(self) -> Option<&'a [u8]> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Varint(_) => None,
        }
    }
}

/// The fields of a protobuf message, in order.
fn fields(mut buf: &[u8]) -> Vec<(u64, Value<'_>)> {
    fn varint(buf: &mut &[u8]) -> u64 {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let (b, rest) = buf.split_first().expect("a whole varint");
            *buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let tag = varint(&mut buf);
        let value = match tag & 7 {
            0 => Value::Varint(varint(&mut buf)),
            2 => {
                let len = varint(&mut buf) as usize;
                let (b, rest) = buf.split_at(len);
                buf = rest;
                Value::Bytes(b)
            }
            other => panic!("wire type {other} not expected here"),
        };
        out.push((tag >> 3, value));
    }
    out
}
