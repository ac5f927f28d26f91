//! Black-box tests of the client against scripted fake servers on real
//! sockets (127.0.0.1, port 0). The fake servers speak the protocol through
//! `tollgate-protocol`'s codec, so each test scripts one behaviour: answer
//! out of order, never answer, drop the connection, refuse the handshake...
//!
//! Every test runs under `within` (a hard timeout) so a bug hangs nothing.
//! Timing is only asserted with generous bounds; the real checks are
//! structural (which variant, which caller got which answer, how many
//! connections or frames the server saw).

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
        Request::Repl(_) | Request::Topology => Response::Error {
            code: ErrorCode::UnknownOpcode,
            message: "not scripted".into(),
        },
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

/// (1) Many tasks pipeline calls on one connection; the server answers them
/// in reverse order; each caller gets its own answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_answers_reach_their_callers() {
    within(async {
        const CALLS: usize = 64;
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            // The client may merge calls that queue together into one
            // frame, so wait for CALLS checks, not CALLS frames.
            let mut requests = Vec::new();
            let mut checks = 0;
            while checks < CALLS {
                let (id, request) = peer.next_request().await.expect("a request");
                checks += match &request {
                    Request::Check(batch) => batch.len(),
                    other => panic!("unexpected {other:?}"),
                };
                requests.push((id, request));
            }
            let answers: Vec<_> = requests
                .iter()
                .rev()
                .map(|(id, request)| (*id, answer(request)))
                .collect();
            peer.send(&answers).await;
            peer // keeps the connection open until the test is done
        });

        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connect");
        let calls: Vec<_> = (0..CALLS as u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i), "caller {i} got {outcome:?}");
        }
        assert_eq!(client.in_flight(), 0);
        drop(server.await.expect("server"));
    })
    .await;
}

/// (2) A server that never answers: the call is undecided at its deadline,
/// fail-open allows and fail-closed denies, nothing stays pending, and the
/// answer that comes too late does not confuse the next call.
#[tokio::test]
async fn silent_server_gives_deadline_exceeded_within_the_deadline() {
    within(async {
        let (listener, addr) = listen().await;
        let (timed_out, timed_out_rx) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            let (late_id, late) = peer.next_request().await.expect("first check");
            timed_out_rx.await.expect("signal");
            // Far too late: the caller gave up. Claims a remaining of 999.
            let late_answer = match answer(&late) {
                Response::Checked(_) => Response::Checked(vec![decision_for(b"k999")]),
                other => other,
            };
            peer.send(&[(late_id, late_answer)]).await;
            // The timeout made the connection suspect: the client probes it
            // with a PING, answered here, before the second check comes.
            loop {
                let (id, request) = peer.next_request().await.expect("second check");
                peer.send(&[(id, answer(&request))]).await;
                if request != Request::Ping {
                    break;
                }
            }
            // Read and never answer from here on.
            while peer.next_request().await.is_some() {}
        });

        let deadline = Duration::from_millis(50);
        let client = Client::connect(addr.to_string(), config(deadline))
            .await
            .expect("connect");
        let started = Instant::now();
        let outcome = client.check("k0", limit(), 1).await;
        let took = started.elapsed();
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::DeadlineExceeded,
                    ..
                }
            ),
            "{:?}",
            outcome
        );
        assert!(outcome.is_allowed(), "the default is fail-open");
        assert!(took >= deadline, "gave up early: {took:?}");
        assert!(
            took < Duration::from_secs(2),
            "deadline not enforced: {took:?}"
        );
        assert_eq!(client.in_flight(), 0, "timed-out call left a pending entry");

        timed_out.send(()).expect("server waits");
        let outcome = client.with_deadline(PATIENT).check("k1", limit(), 1).await;
        assert_eq!(remaining(&outcome), Some(1), "{outcome:?}");

        // A call whose future is dropped (e.g. by the caller's own select)
        // leaves nothing behind either.
        let patient = client.with_deadline(PATIENT);
        let dropped =
            tokio::time::timeout(Duration::from_millis(50), patient.check("k2", limit(), 1)).await;
        assert!(dropped.is_err());
        assert_eq!(client.in_flight(), 0, "dropped call left a pending entry");

        // Result-returning calls report the deadline with its number.
        match client.ping().await {
            Err(Error::Timeout { after }) => assert_eq!(after, deadline),
            other => panic!("expected a timeout, got {other:?}"),
        }
        server.abort();
    })
    .await;
}

/// (3) Nothing listening: the call is Unavailable at once; during the
/// backoff window calls fail fast without even trying to connect, though a
/// server has come up meanwhile.
#[tokio::test]
async fn nothing_listening_is_unavailable_and_backoff_fails_fast() {
    within(async {
        let addr = listen().await.1; // the listener is dropped: the port is closed
        let config = ClientConfig {
            backoff_min: Duration::from_secs(30),
            backoff_max: Duration::from_secs(60),
            ..config(Duration::from_secs(2))
        };

        match Client::connect(addr.to_string(), config.clone()).await {
            Err(Error::Connect { addr: a, .. }) => assert_eq!(a, addr.to_string()),
            other => panic!("expected a connect error, got {other:?}"),
        }

        let client = Client::new(addr.to_string(), config).expect("valid config");
        let started = Instant::now();
        let outcome = client.check("k", limit(), 1).await;
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ),
            "{:?}",
            outcome
        );
        assert!(outcome.is_allowed());
        assert!(started.elapsed() < Duration::from_millis(500));

        // The server comes up, but the client is backing off: no attempt.
        let listener = TcpListener::bind(addr).await.expect("rebind");
        for _ in 0..20 {
            match client.ping().await {
                Err(Error::Unavailable { retry_in, cause }) => {
                    // First failure: a delay in [backoff_min / 2, backoff_min].
                    assert!(retry_in > Duration::from_secs(10), "{retry_in:?}");
                    assert!(matches!(*cause, Error::Connect { .. }), "{cause:?}");
                }
                other => panic!("expected Unavailable, got {other:?}"),
            }
            assert!(matches!(
                client.check("k", limit(), 1).await,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ));
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(200), listener.accept())
                .await
                .is_err(),
            "the client connected while backing off"
        );
    })
    .await;
}

/// (3b) A server that accepts but never answers HELLO: the attempt ends at
/// the connect timeout, and then calls fail fast instead of waiting for
/// another connect timeout.
#[tokio::test]
async fn stuck_handshake_times_out_then_calls_fail_fast() {
    within(async {
        // The kernel completes the TCP handshake from the backlog; nobody
        // ever reads the HELLO.
        let (_listener, addr) = listen().await;
        let connect_timeout = Duration::from_secs(1);
        let config = ClientConfig {
            connect_timeout,
            backoff_min: Duration::from_secs(30),
            backoff_max: Duration::from_secs(60),
            ..config(Duration::from_secs(5))
        };

        match Client::connect(addr.to_string(), config.clone()).await {
            Err(Error::ConnectTimeout { after, .. }) => assert_eq!(after, connect_timeout),
            other => panic!("expected a connect timeout, got {other:?}"),
        }

        let client = Client::new(addr.to_string(), config).expect("valid config");
        // The first call waits for the attempt (its deadline is longer).
        match client.ping().await {
            Err(Error::Unavailable { cause, .. }) => {
                assert!(matches!(*cause, Error::ConnectTimeout { .. }), "{cause:?}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        let started = Instant::now();
        let outcome = client.check("k", limit(), 1).await;
        assert!(
            matches!(
                outcome,
                Outcome::Undecided {
                    why: Undecided::Unavailable,
                    ..
                }
            ),
            "{:?}",
            outcome
        );
        assert!(
            started.elapsed() < connect_timeout / 2,
            "waited {:?} while backing off",
            started.elapsed()
        );
    })
    .await;
}

/// (4) The server drops the connection: every pending call fails at once
/// (long before its deadline) with ConnectionLost, and the next call
/// reconnects to the server restarted on the same port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connection_fails_pending_calls_and_next_call_reconnects() {
    within(async {
        const CALLS: usize = 8;
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            // Coalesced or not, the server holds all the checks unanswered.
            let mut received = 0;
            while received < CALLS {
                for (_, request) in peer.read_some().await.expect("client open") {
                    if let Request::Check(batch) = request {
                        received += batch.len();
                    }
                }
            }
            // Dropping both ends the connection and frees the port.
            drop(peer);
            drop(listener);
            received
        });

        let deadline = Duration::from_secs(20);
        let client = Client::connect(addr.to_string(), config(deadline))
            .await
            .expect("connect");
        let started = Instant::now();
        let calls: Vec<_> = (0..CALLS)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.check(format!("k{i}"), limit(), 1).await })
            })
            .collect();
        assert_eq!(server.await.expect("server"), CALLS);
        for call in calls {
            assert!(matches!(
                call.await.expect("call task"),
                Outcome::Undecided {
                    why: Undecided::ConnectionLost,
                    ..
                }
            ));
        }
        assert!(
            started.elapsed() < deadline / 2,
            "calls waited for their deadline"
        );
        assert_eq!(client.in_flight(), 0);

        let listener = TcpListener::bind(addr).await.expect("rebind the same port");
        let accepted = spawn_server(listener, ServerLimits::default());
        let outcome = client.check("k5", limit(), 1).await;
        assert_eq!(remaining(&outcome), Some(5), "{outcome:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(client.server_info().map(|i| i.epoch), Some(EPOCH));
    })
    .await;
}

/// (5) Automatic coalescing: concurrent `check()` calls queued on one
/// connection at the same moment leave as **one** CHECK frame, and each
/// call gets its own result back. Deterministic on the current-thread
/// runtime: its run queue is FIFO (no LIFO slot), so all spawned calls run,
/// each queueing its request, before the writer task is polled; the writer
/// then takes the whole queue at once.
#[tokio::test]
async fn concurrent_checks_leave_as_one_check_frame() {
    within(async {
        const CALLS: usize = 32;
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(ServerLimits::default()).await;
            let mut requests = Vec::new();
            let mut checks = 0;
            while checks < CALLS {
                let frames = peer.read_some().await.expect("client open");
                for (_, request) in &frames {
                    if let Request::Check(batch) = request {
                        checks += batch.len();
                    }
                }
                requests.extend(frames);
            }
            let answers: Vec<_> = requests
                .iter()
                .map(|(id, request)| (*id, answer(request)))
                .collect();
            peer.send(&answers).await;
            (requests.len(), peer)
        });

        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connect");
        let calls: Vec<_> = (0..CALLS as u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i));
        }
        let (frames, _peer) = server.await.expect("server");
        assert_eq!(frames, 1, "{CALLS} concurrent checks in {frames} frames");
    })
    .await;
}

/// (6) The server refuses the handshake: `connect` returns the typed error,
/// with the code and message the server sent. The HELLO carried the
/// configured name and token.
#[tokio::test]
async fn refused_handshake_is_a_typed_error() {
    within(async {
        let (listener, addr) = listen().await;
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            let (id, hello) = peer.next_request().await.expect("HELLO");
            peer.send(&[(
                id,
                Response::Error {
                    code: ErrorCode::UnsupportedVersion,
                    message: "only version 9".into(),
                },
            )])
            .await;
            hello
        });
        let config = ClientConfig {
            client_name: "gateway-eu-1".into(),
            auth_token: Some(b"s3cret".to_vec()),
            ..config(PATIENT)
        };
        match Client::connect(addr.to_string(), config).await {
            Err(Error::Handshake { code, message }) => {
                assert_eq!(code, ErrorCode::UnsupportedVersion);
                assert_eq!(message, "only version 9");
            }
            other => panic!("expected a handshake error, got {other:?}"),
        }
        assert_eq!(
            server.await.expect("server"),
            Request::Hello {
                version: PROTOCOL_VERSION,
                client_name: "gateway-eu-1".into(),
                auth_token: Some(Bytes::from_static(b"s3cret")),
            }
        );
    })
    .await;
}

/// Concurrent calls on a lazy client start exactly one connection attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_calls_share_one_connection_attempt() {
    within(async {
        const CALLS: u64 = 50;
        let (listener, addr) = listen().await;
        let accepted = spawn_server(listener, ServerLimits::default());
        let client = Client::new(addr.to_string(), config(PATIENT)).expect("valid config");
        assert_eq!(client.server_info(), None, "new() must not connect");
        let calls: Vec<_> = (0..CALLS)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { (i, client.check(format!("k{i}"), limit(), 1).await) })
            })
            .collect();
        for call in calls {
            let (i, outcome) = call.await.expect("call task");
            assert_eq!(remaining(&outcome), Some(i));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    })
    .await;
}

/// Requests over the limits the server announced are refused locally (the
/// server never sees them); per-check and whole-request server errors are
/// reported apart; reset, peek, ping and close work.
#[tokio::test]
async fn server_limits_errors_and_admin_calls() {
    within(async {
        let limits = ServerLimits {
            // A CHECK body is 5 (opcode, id) + 2 + per check 1 + per pair
            // (31 + key length): two single checks with keys of 2 and 7
            // bytes take 80 bytes and fit; a group of two 8-byte keys takes
            // 86 and does not.
            max_frame: 84,
            max_batch: 2,
            max_group: 2,
            max_key_len: 8,
        };
        let (listener, addr) = listen().await;
        let (seen, mut seen_rx) = mpsc::unbounded_channel::<Request>();
        let server = tokio::spawn(async move {
            let mut peer = Peer::accept(&listener).await;
            peer.handshake(limits).await;
            while let Some((id, request)) = peer.next_request().await {
                let response = match &request {
                    Request::Check(batch)
                        if &batch.iter().next().unwrap()[0].key[..] == b"drain" =>
                    {
                        Response::Error {
                            code: ErrorCode::ShuttingDown,
                            message: "draining".into(),
                        }
                    }
                    other => answer(other),
                };
                seen.send(request).expect("test alive");
                peer.send(&[(id, response)]).await;
            }
        });

        let client = Client::connect(addr.to_string(), config(PATIENT))
            .await
            .expect("connect");
        assert_eq!(
            client.server_info(),
            Some(ServerInfo {
                version: PROTOCOL_VERSION,
                role: Role::Primary,
                epoch: EPOCH,
                offset: 0,
                limits,
            })
        );

        // Refused locally.
        let mut batch = CheckBatch::default();
        for i in 0..3 {
            batch.push(pair(&format!("k{i}")));
        }
        assert!(matches!(
            client.check_batch(batch).await,
            Err(Error::BatchTooLarge { checks: 3, max: 2 })
        ));
        assert!(matches!(
            client.check("k23456789", limit(), 1).await,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::KeyTooLong,
                ..
            })
        ));
        assert!(matches!(
            client
                .check_group(vec![pair("{a}1"), pair("{a}2"), pair("{a}3")])
                .await,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::BatchTooLarge,
                ..
            })
        ));
        let oversized = client
            .check_group(vec![pair("{a}12345"), pair("{a}23456")])
            .await;
        assert!(matches!(
            oversized,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::FrameTooLarge,
                ..
            })
        ));
        assert!(!oversized.is_allowed(), "a rejected request never passes");
        assert_eq!(client.reset(Vec::new()).await.expect("empty reset"), 0);
        assert!(
            seen_rx.try_recv().is_err(),
            "a refused request reached the server"
        );

        // Answered by the server.
        assert_eq!(remaining(&client.check("k3", limit(), 1).await), Some(3));
        assert_eq!(remaining(&client.peek("k4", limit(), 1).await), Some(4));
        let invalid = client.check("invalid", limit(), 1).await;
        assert!(matches!(
            invalid,
            Outcome::Rejected(tollgate_client::Rejection {
                code: ErrorCode::InvalidLimit,
                ..
            })
        ));
        assert!(!invalid.is_allowed(), "rejected, whatever the fail mode");
        assert!(matches!(
            client.check("drain", limit(), 1).await,
            Outcome::Undecided {
                why: Undecided::ServerError(ErrorCode::ShuttingDown),
                ..
            }
        ));
        let mut batch = CheckBatch::default();
        batch.push(pair("k1"));
        batch.push(pair("invalid"));
        let results = client.peek_batch(batch).await.expect("peek batch");
        assert_eq!(results[0], decision_for(b"k1"));
        assert_eq!(results[1], CheckResult::Error(ErrorCode::InvalidLimit));
        assert_eq!(
            client
                .reset(vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")])
                .await
                .expect("reset"),
            2
        );
        client.ping().await.expect("ping");

        // Leases: the id of an allowed acquire, then released by id.
        let acquired = client.check("lease7", limit(), 1).await;
        assert_eq!(acquired.lease(), Some(7));
        assert!(client.release("lease7", 7).await.expect("release"));
        assert!(!client.release("lease7", 8).await.expect("release"));
        let leases = |ids: &[u64]| -> Vec<LeaseRef> {
            ids.iter()
                .map(|&lease| LeaseRef {
                    key: Bytes::from_static(b"lease"),
                    lease,
                })
                .collect()
        };
        assert_eq!(
            client.release_many(leases(&[1, 3])).await.expect("release"),
            2
        );
        assert_eq!(client.release_many(Vec::new()).await.expect("empty"), 0);
        // Refunds: the decision after it, or the per-check refusal as an error.
        let refunded = client.refund("k6", limit(), 3).await.expect("refund");
        assert_eq!(refunded.remaining, 6);
        let refused = client.refund("leases", limit(), 1).await;
        assert!(
            matches!(
                refused,
                Err(Error::Server {
                    code: ErrorCode::InvalidLimit,
                    ..
                })
            ),
            "{refused:?}"
        );
        let mut batch = CheckBatch::default();
        batch.push(pair("k2"));
        batch.push(pair("leases"));
        let results = client.refund_batch(batch).await.expect("refund batch");
        assert_eq!(results[0], decision_for(b"k2"));
        assert_eq!(results[1], CheckResult::Error(ErrorCode::InvalidLimit));
        // Refused locally, like the other requests.
        assert!(matches!(
            client.release_many(leases(&[1, 3, 5])).await,
            Err(Error::BatchTooLarge { checks: 3, max: 2 })
        ));
        assert!(matches!(
            client.release("k23456789", 1).await,
            Err(Error::KeyTooLong { len: 9, max: 8 })
        ));
        assert!(matches!(
            client
                .refund_group(vec![pair("{a}1"), pair("{a}2"), pair("{a}3")])
                .await,
            Err(Error::GroupTooLarge { .. })
        ));

        let kinds: Vec<&str> = std::iter::from_fn(|| seen_rx.try_recv().ok())
            .map(|request| match request {
                Request::Check(_) => "check",
                Request::Peek(_) => "peek",
                Request::Reset(_) => "reset",
                Request::Refund(_) => "refund",
                Request::Release(_) => "release",
                Request::Ping => "ping",
                Request::Hello { .. } => "hello",
                Request::Repl(_) => "repl",
                Request::Topology => "topology",
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "check", "peek", "check", "check", "peek", "reset", "ping", "check", "release",
                "release", "release", "refund", "refund", "refund"
            ]
        );

        client.close();
        assert!(matches!(client.ping().await, Err(Error::Closed)));
        assert!(matches!(
            client.check("k1", limit(), 1).await,
            Outcome::Undecided {
                why: Undecided::Unavailable,
                ..
            }
        ));
        // The server sees the connection end.
        server.await.expect("server");
    })
    .await;
}

/// An invalid configuration is refused before any network activity, with
/// the numbers, by `connect` and by `new` alike.
#[tokio::test]
async fn invalid_config_is_refused_with_its_numbers() {
    within(async {
        let (listener, addr) = listen().await;
        let config = ClientConfig {
            backoff_min: Duration::from_secs(5),
            backoff_max: Duration::from_secs(1),
            ..config(PATIENT)
        };
        match Client::connect(addr.to_string(), config.clone()).await {
            Err(Error::Config(ConfigError::BackoffInverted { min, max })) => {
                assert_eq!((min, max), (Duration::from_secs(5), Duration::from_secs(1)));
            }
            other => panic!("expected a config error, got {other:?}"),
        }
        // `new` refuses it too: never a client that silently fails open.
        assert!(matches!(
            Client::new(addr.to_string(), config),
            Err(Error::Config(ConfigError::BackoffInverted { .. }))
        ));
        assert!(
            tokio::time::timeout(Duration::from_millis(100), listener.accept())
                .await
                .is_err(),
            "connected despite an invalid config"
        );
    })
    .await;
}
