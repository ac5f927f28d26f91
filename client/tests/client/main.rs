//! Black-box tests of the client against scripted fake servers on real
//! sockets (127.0.0.1, port 0). The fake servers speak the protocol through
//! `tollgate-protocol`'s codec, so each test scripts one behaviour: answer
//! out of order, never answer, drop the connection, refuse the handshake...
//!
//! Here the scaffolding (fake servers, configs); the failures (a silent,
//! absent, stuck, dropping or refusing server) in `failures.rs`; what calls
//! become on the wire (order, coalescing, limits, admin calls, config,
//! priorities) in `calls.rs`; cluster mode against one node in
//! `cluster.rs`.
//!
//! Every test runs under `within` (a hard timeout) so a bug hangs nothing.
//! Timing is only asserted with generous bounds; the real checks are
//! structural (which variant, which caller got which answer, how many
//! connections or frames the server saw).

mod calls;
mod cluster;
mod failures;

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tollgate_client::{
    Algorithm, CheckBatch, CheckResult, Client, ClientConfig, ConfigError, Error, ErrorCode,
    LeaseRef, Limit, Outcome, Pair, Role, ServerInfo, ServerLimits, Undecided,
    WireDecision as Decision,
};
use tollgate_protocol::{
    decode_request, encode_response, Request, RequestId, Response, PROTOCOL_VERSION,
};

/// Hard bound on any one test.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for calls that must not time out in a test.
const PATIENT: Duration = Duration::from_secs(10);
/// Epoch the fake servers announce.
const EPOCH: u64 = 7;

async fn within<F: Future>(test: F) -> F::Output {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("test did not finish in time")
}

fn config(deadline: Duration) -> ClientConfig {
    ClientConfig {
        deadline,
        connect_timeout: Duration::from_secs(1),
        fallback: None,
        ..ClientConfig::default()
    }
}

/// Token bucket "5/s burst 10".
fn limit() -> Limit {
    Limit {
        algorithm: Algorithm::TokenBucket,
        count: 5,
        period_ms: 1000,
        burst: 10,
    }
}

fn pair(key: &str) -> Pair {
    Pair {
        key: Bytes::copy_from_slice(key.as_bytes()),
        limit: limit().into(),
        cost: 1,
    }
}

fn hello_ok(limits: ServerLimits) -> Response {
    Response::HelloOk {
        version: PROTOCOL_VERSION,
        role: Role::Primary,
        epoch: EPOCH,
        offset: 0,
        limits,
    }
}

/// A decision that tags its answer: `remaining` is the number in the key
/// `k<n>`, so a caller can tell whether it got its own answer. A key
/// `lease<n>` is answered as a concurrency acquire holding lease `n`.
fn decision_for(key: &[u8]) -> CheckResult {
    let key = std::str::from_utf8(key).unwrap_or_default();
    let number = |prefix| {
        key.strip_prefix(prefix)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    CheckResult::Decision(Decision {
        allowed: true,
        shadow_denied: false,
        pair: 0,
        limit: 10,
        remaining: number("k"),
        reset_after_ms: 200,
        retry_after_ms: 0,
        lease: key.starts_with("lease").then(|| number("lease")),
    })
}

fn remaining(outcome: &Outcome) -> Option<u64> {
    outcome.decision().map(|d| d.remaining)
}

/// The scripted answer to a request, as a well-behaved server would give it.
fn answer(request: &Request) -> Response {
    match request {
        Request::Ping => Response::Pong,
        Request::Check(batch) | Request::Peek(batch) => Response::Checked(
            batch
                .iter()
                .map(|check| match &check[0].key[..] {
                    b"invalid" => CheckResult::Error(ErrorCode::InvalidLimit),
                    key => decision_for(key),
                })
                .collect(),
        ),
        // CHECK2: a key `shed` is shed, as an overloaded server would.
        Request::Check2(tagged) => Response::Checked(
            tagged
                .iter()
                .map(|(_, check)| match &check[0].key[..] {
                    b"shed" => CheckResult::Error(ErrorCode::Shed),
                    key => decision_for(key),
                })
                .collect(),
        ),
        Request::Refund(batch) => Response::Checked(
            batch
                .iter()
                .map(|check| match &check[0].key[..] {
                    b"leases" => CheckResult::Error(ErrorCode::InvalidLimit),
                    key => decision_for(key),
                })
                .collect(),
        ),
        Request::Reset(keys) => Response::ResetDone(keys.len() as u32),
        // Odd lease ids are the ones still held.
        Request::Release(leases) => {
            Response::Released(leases.iter().filter(|l| l.lease % 2 == 1).count() as u32)
        }
        Request::Hello { .. } => panic!("second HELLO"),
        Request::Repl(_) | Request::Topology | Request::Usage(_) | Request::NodeChallenge => {
            Response::Error {
                code: ErrorCode::UnknownOpcode,
                message: "not scripted".into(),
            }
        }
    }
}

/// The server side of one connection.
struct Peer {
    stream: TcpStream,
    buf: BytesMut,
    /// Decoded but not yet handed out.
    backlog: VecDeque<(RequestId, Request)>,
}

impl Peer {
    async fn accept(listener: &TcpListener) -> Self {
        let (stream, _) = listener.accept().await.expect("accept");
        Self {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            backlog: VecDeque::new(),
        }
    }

    /// Reads once; returns the requests that read completed (possibly none),
    /// or `None` at end of stream.
    async fn read_some(&mut self) -> Option<Vec<(RequestId, Request)>> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(64 * 1024);
        }
        let n = self.stream.read_buf(&mut self.buf).await.ok()?;
        if n == 0 {
            return None;
        }
        let mut requests = Vec::new();
        while let Some(request) =
            decode_request(&mut self.buf, &ServerLimits::default()).expect("valid request")
        {
            requests.push(request);
        }
        Some(requests)
    }

    /// The next `n` requests, or fewer if the client closes.
    async fn requests(&mut self, n: usize) -> Vec<(RequestId, Request)> {
        while self.backlog.len() < n {
            match self.read_some().await {
                Some(requests) => self.backlog.extend(requests),
                None => break,
            }
        }
        let n = n.min(self.backlog.len());
        self.backlog.drain(..n).collect()
    }

    async fn next_request(&mut self) -> Option<(RequestId, Request)> {
        self.requests(1).await.pop()
    }

    /// Sends all `answers` with one write.
    async fn send(&mut self, answers: &[(RequestId, Response)]) {
        let mut out = BytesMut::new();
        for (id, response) in answers {
            encode_response(*id, response, &mut out).expect("encodable response");
        }
        // The client may be gone already; that is its business.
        let _ = self.stream.write_all(&out).await;
    }

    /// Reads HELLO and accepts it; returns the HELLO.
    async fn handshake(&mut self, limits: ServerLimits) -> Request {
        let (id, hello) = self.next_request().await.expect("HELLO");
        assert!(matches!(hello, Request::Hello { .. }), "{hello:?}");
        self.send(&[(id, hello_ok(limits))]).await;
        hello
    }

    /// Answers every request in order until the client closes.
    async fn serve(mut self) {
        while let Some((id, request)) = self.next_request().await {
            self.send(&[(id, answer(&request))]).await;
        }
    }
}

/// A well-behaved server: accepts any number of connections, handshakes with
/// `limits` and answers everything. Returns the count of accepted connections.
fn spawn_server(listener: TcpListener, limits: ServerLimits) -> Arc<AtomicUsize> {
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let mut peer = Peer::accept(&listener).await;
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                peer.handshake(limits).await;
                peer.serve().await;
            });
        }
    });
    accepted
}

async fn listen() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}
