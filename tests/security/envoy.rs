//! The Envoy RLS port (`--envoy-rls`) against hostile clients, on a real
//! `tollgate serve` process spoken to with a raw HTTP/2 client (the `h2`
//! crate): unauthenticated calls with huge bodies, silent sockets, wrong
//! tokens, a message over `--envoy-max-message`.

use crate::at_scale::{raise_fd_limit, Server, KIB, MIB};
use crate::common::{allowed, tb, RawConn, PATIENCE};
use crate::harness::{eventually, free_addr};
use crate::rls::{
    call, h2_client, message, request, OK, OUT_OF_RANGE, RESOURCE_EXHAUSTED, UNAUTHENTICATED,
};
use bytes::Bytes;
use h2::client::SendRequest;
use std::net::SocketAddr;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tollgate_protocol::{ErrorCode, Request, Response, PROTOCOL_VERSION};

/// The server's client token (and the protocol port's).
const TOKEN: &str = "envoy-client-token-0123456789";
/// Connections opened at once (below the listen backlog of 1024).
const WAVE: usize = 500;
/// `--envoy-max-message`'s default: also each connection's HTTP/2 window.
const MAX_MESSAGE: u64 = 64 * KIB;
/// What one RLS connection costs the server besides unread request data:
/// its HTTP/2 state and buffers, task, deadlines and place (16 KiB
/// measured for a silent one; the rest is allocator slack).
const PER_CONNECTION: u64 = 24 * KIB;
/// A 4 MiB message's first MiB, shared by every sender (h2 slices it).
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

/// A server with the RLS port and a client token.
struct Rls {
    server: Server,
    envoy: SocketAddr,
}

impl Rls {
    async fn start(args: &[&str]) -> Self {
        let envoy = free_addr();
        let mut all = vec!["--envoy-rls", &envoy, "--auth-token", TOKEN];
        all.extend_from_slice(args);
        let server = Server::start(&all).await;
        let envoy: SocketAddr = envoy.parse().unwrap();
        eventually("the RLS port listens", || async move {
            TcpStream::connect(envoy).await.ok()
        })
        .await;
        Self { server, envoy }
    }

    async fn auth_failures(&self) -> f64 {
        let name = "tollgate_auth_failures_total{port=\"envoy\"}";
        self.server.metric(name).await
    }
}

/// A valid call on a new connection is answered OK (overall_code OK:
/// the response message starts with field 1 = 1).
async fn answers_a_valid_call(addr: SocketAddr) -> Option<()> {
    let send = h2_client(addr).await?;
    let call = call(&send, addr, Some(TOKEN), message("edge", "user", "u1"));
    let answer = tokio::time::timeout(PATIENCE, call).await.ok()?.ok()?;
    assert_eq!(answer.status, OK, "{answer:?}");
    assert_eq!(answer.body.get(5..7), Some(&[0x08, 0x01][..]), "{answer:?}");
    Some(())
}

/// A protocol client's CHECK is answered: its connection, or None when it
/// found no room.
async fn answers_a_check(addr: SocketAddr) -> Option<RawConn> {
    let mut c = RawConn::connect(addr).await;
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "test".into(),
        auth_token: Some(Bytes::from_static(TOKEN.as_bytes())),
    };
    c.send(1, &hello).await;
    match c.try_recv().await {
        Some((1, Response::HelloOk { .. })) => {}
        Some((
            0,
            Response::Error {
                code: ErrorCode::TooManyConnections,
                ..
            },
        )) => return None,
        other => panic!("HELLO: {other:?}"),
    }
    let mut batch = tollgate_protocol::CheckBatch::default();
    batch.push(tb("envoy-scale", 100, 60_000, 100, 1));
    assert!(allowed(&c.check(2, batch).await[0]));
    Some(c)
}

/// How an unauthenticated call with a huge body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Partial {
    /// Answered with this grpc-status before the body was taken.
    Answered(u32),
    /// Reset, or its connection failed, before an answer was read.
    Failed,
    /// The server took the whole MiB sent without answering.
    Absorbed,
}

/// Sends HEADERS without a token and a 4 MiB message's length prefix and
/// first MiB, as fast as the server's window lets it.
async fn unauthenticated_partial_call(addr: SocketAddr) -> (Partial, SendRequest<Bytes>) {
    let send = h2_client(addr).await.expect("connects");
    let mut ready = send.clone().ready().await.expect("ready");
    let (response, mut stream) = ready.send_request(request(addr, None), false).unwrap();
    let mut prefix = vec![0];
    prefix.extend_from_slice(&(4 * MIB as u32).to_be_bytes());
    stream.send_data(Bytes::from(prefix), false).unwrap();
    let push = async {
        let mut sent = 0;
        while sent < ZEROS.len() {
            stream.reserve_capacity(ZEROS.len() - sent);
            let Some(Ok(n)) = std::future::poll_fn(|cx| stream.poll_capacity(cx)).await else {
                // Reset by the server: its answer tells.
                return std::future::pending().await;
            };
            let chunk = Bytes::from_static(&ZEROS[sent..sent + n]);
            if stream.send_data(chunk, false).is_err() {
                return std::future::pending().await;
            }
            sent += n;
        }
    };
    let outcome = tokio::select! {
        r = response => match r {
            Ok(r) => Partial::Answered(
                r.headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .expect("a grpc-status"),
            ),
            Err(_) => Partial::Failed,
        },
        () = push => Partial::Absorbed,
    };
    (outcome, send)
}

/// 2,000 connections each open a call with no token and start a 4 MiB
/// message. Before the fix tonic read each whole message before the token
/// was checked (2,000 x 1 MiB sent = 2 GiB held); now each call is refused
/// from its headers and the server's RSS stays under
///
///   base (RSS of the idle server)
///   + 2,000 x (--envoy-max-message (64 KiB, the connection's HTTP/2
///     window: the most request data it can have sent unread)
///     + PER_CONNECTION)
///
/// (PER_CONNECTION below). Measured on a 2-core Linux box (debug build):
/// base 26 MiB, peak 79 MiB, bound 198 MiB; before the fix 260 MiB at the
/// same moment and growing, as the server read on. Meanwhile a protocol
/// CHECK and a valid RLS call are answered, and a call with the token but
/// a message over --envoy-max-message is refused from its length prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_unauthenticated_partial_4mib_calls_keep_the_rls_port_bounded() {
    const CALLS: usize = 2_000;
    raise_fd_limit(CALLS as u64 + 256);
    let rls = Rls::start(&[
        "--max-connections-per-ip",
        "2100",
        // The refused callers' connections stay while we measure.
        "--handshake-timeout",
        "5m",
    ])
    .await;
    let base = rls.server.rss();
    let bound = base + CALLS as u64 * (MAX_MESSAGE + PER_CONNECTION);
    let mut held = Vec::with_capacity(CALLS);
    let mut statuses = Vec::with_capacity(CALLS);
    let mut peak = 0;
    while held.len() < CALLS {
        let mut wave = JoinSet::new();
        for _ in 0..WAVE.min(CALLS - held.len()) {
            wave.spawn(unauthenticated_partial_call(rls.envoy));
        }
        while let Some(done) = wave.join_next().await {
            let (status, send) = done.unwrap();
            statuses.push(status);
            held.push(send);
        }
        peak = peak.max(rls.server.rss());
    }
    assert!(answers_a_check(rls.server.addr).await.is_some());
    answers_a_valid_call(rls.envoy)
        .await
        .expect("a valid call is answered");
    peak = peak.max(rls.server.rss());
    eprintln!(
        "server RSS: {} MiB before, {} MiB peak with {CALLS} unauthenticated partial \
         calls (bound {} MiB; unbounded: {} MiB)",
        base / MIB,
        peak / MIB,
        bound / MIB,
        CALLS as u64 * ZEROS.len() as u64 / MIB
    );
    assert!(
        peak <= bound,
        "server RSS {peak} bytes past the bound {bound} (base {base})"
    );
    assert!(
        !statuses.contains(&Partial::Absorbed),
        "a body was taken before the token was checked"
    );
    let answered = statuses.iter().filter(|s| **s != Partial::Failed);
    assert!(
        answered
            .clone()
            .all(|s| *s == Partial::Answered(UNAUTHENTICATED)),
        "{statuses:?}"
    );
    assert!(answered.count() >= CALLS * 99 / 100);
    assert_eq!(rls.auth_failures().await, CALLS as f64);

    // With the token, a message announced over --envoy-max-message is
    // refused from its 5-byte prefix, not waited for.
    let send = h2_client(rls.envoy).await.unwrap();
    let mut prefix = vec![0];
    prefix.extend_from_slice(&(4 * MIB as u32).to_be_bytes());
    prefix.extend_from_slice(&ZEROS[..16 * KIB as usize]);
    let answer = tokio::time::timeout(
        PATIENCE,
        call(&send, rls.envoy, Some(TOKEN), Bytes::from(prefix)),
    )
    .await
    .expect("refused, not waited for")
    .unwrap();
    assert_eq!(answer.status, OUT_OF_RANGE, "{answer:?}");
    drop(held);
}

/// 10,000 TCP connections to the RLS port that never send a byte fill
/// --max-connections (10,000): they hold places but, never having made
/// an authorized call, are shed once quiet for --shed-idle-after, so a
/// protocol client and a valid RLS call still find room. RSS stays under
/// base + 10,000 x PER_CONNECTION; measured (debug build): base 25 MiB,
/// peak 182 MiB (16 KiB a connection), bound 259 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_silent_rls_connections_leave_room_for_a_check_and_a_call() {
    const SILENT: usize = 10_000;
    raise_fd_limit(SILENT as u64 + 256);
    let rls = Rls::start(&[
        "--max-connections",
        "10000",
        "--max-connections-per-ip",
        "10100",
        "--shed-idle-after",
        "1s",
        // Shedding, not the handshake deadline, makes the room here.
        "--handshake-timeout",
        "5m",
    ])
    .await;
    let base = rls.server.rss();
    let bound = base + SILENT as u64 * PER_CONNECTION;
    // Each wave is accepted before the next is opened: past the listen
    // backlog the kernel would hold a silent connection's handshake back
    // for seconds (SYN-ACK retries), not the server.
    let accepted = "tollgate_frontend_connections_total{frontend=\"envoy\"}";
    let mut silent = Vec::with_capacity(SILENT);
    while silent.len() < SILENT {
        let mut wave = JoinSet::new();
        for _ in 0..WAVE.min(SILENT - silent.len()) {
            let addr = rls.envoy;
            wave.spawn(async move { TcpStream::connect(addr).await.unwrap() });
        }
        while let Some(c) = wave.join_next().await {
            silent.push(c.unwrap());
        }
        eventually("the wave is accepted", || async {
            (rls.server.metric(accepted).await > silent.len() as f64).then_some(())
        })
        .await;
    }
    let mut peak = rls.server.rss();
    // Kept open: the RLS call below needs a place of its own.
    let _protocol = eventually("a protocol client finds room", || async {
        answers_a_check(rls.server.addr).await
    })
    .await;
    eventually("a valid RLS call finds room", || async {
        answers_a_valid_call(rls.envoy).await
    })
    .await;
    peak = peak.max(rls.server.rss());
    let shed = rls.server.metric("tollgate_connections_shed_total").await;
    eprintln!(
        "server RSS: {} MiB before, {} MiB peak with {SILENT} silent RLS connections \
         (bound {} MiB; {shed} shed to make room)",
        base / MIB,
        peak / MIB,
        bound / MIB,
    );
    assert!(shed >= 2.0, "{shed} shed");
    assert!(
        peak <= bound,
        "server RSS {peak} bytes past the bound {bound} (base {base})"
    );
}

/// A connection that makes no authorized call within --handshake-timeout
/// is closed (the server's SETTINGS, then the end of the stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_rls_connection_is_closed_after_the_handshake_timeout() {
    let rls = Rls::start(&["--handshake-timeout", "1s"]).await;
    let mut silent = TcpStream::connect(rls.envoy).await.unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(PATIENCE, silent.read_to_end(&mut sink)).await;
    assert!(read.is_ok(), "still open after {PATIENCE:?}");
    answers_a_valid_call(rls.envoy)
        .await
        .expect("others are served");
}

/// Three calls with a wrong (or no) token close their connection, each
/// counted in tollgate_auth_failures_total{port="envoy"}; a connection
/// with the right token is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_tokens_close_the_rls_connection_and_are_counted() {
    let rls = Rls::start(&[]).await;
    let addr = rls.envoy;
    let good = h2_client(addr).await.unwrap();
    let bad = h2_client(addr).await.unwrap();
    let wrong = Some("not-the-client-token-0123");
    for (i, token) in [wrong, None].into_iter().enumerate() {
        let answer = call(&bad, addr, token, message("edge", "user", "u2"))
            .await
            .unwrap_or_else(|e| panic!("refusal {i} answered: {e}"));
        assert_eq!(answer.status, UNAUTHENTICATED);
        let answer = call(&good, addr, Some(TOKEN), message("edge", "user", "u3"))
            .await
            .unwrap();
        assert_eq!(answer.status, OK);
    }
    // The third closes the connection (its answer may or may not arrive
    // first); a fourth finds it closed.
    let third = call(&bad, addr, wrong, message("edge", "user", "u2")).await;
    assert!(third.as_ref().is_err() || third.as_ref().unwrap().status == UNAUTHENTICATED);
    let fourth = tokio::time::timeout(PATIENCE, async {
        call(&bad, addr, Some(TOKEN), message("edge", "user", "u2")).await
    })
    .await
    .expect("the closed connection fails at once");
    assert!(fourth.is_err(), "served after 3 refused tokens: {fourth:?}");
    assert_eq!(rls.auth_failures().await, 3.0);
    let answer = call(&good, addr, Some(TOKEN), message("edge", "user", "u3"))
        .await
        .unwrap();
    assert_eq!(answer.status, OK);
}

/// An authorized call holds `--envoy-max-message` bytes of
/// `--max-connection-memory` from its headers until it ends: with a 2 MiB
/// budget and 512 KiB messages, four calls whose bodies have not finished
/// arriving take it all (the gauge shows it), a fifth is answered
/// RESOURCE_EXHAUSTED unread, and once the four are cancelled the budget
/// is back to 0 and calls are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorized_calls_draw_their_message_size_from_the_connection_memory_budget() {
    const HELD: u64 = 512 * KIB;
    let rls = Rls::start(&[
        "--max-connection-memory",
        "2MiB",
        "--envoy-max-message",
        "512KiB",
    ])
    .await;
    let addr = rls.envoy;
    let gauge = "tollgate_connection_memory_bytes";
    let holder = h2_client(addr).await.unwrap();
    let mut open = Vec::new();
    for _ in 0..4 {
        let mut ready = holder.clone().ready().await.unwrap();
        let (response, mut stream) = ready
            .send_request(request(addr, Some(TOKEN)), false)
            .unwrap();
        // A 100-byte message announced, 10 bytes of it sent: tonic waits
        // for the rest, the call stays open.
        let mut partial = vec![0];
        partial.extend_from_slice(&100u32.to_be_bytes());
        partial.extend_from_slice(&[0; 10]);
        stream.send_data(Bytes::from(partial), false).unwrap();
        open.push((response, stream));
    }
    let server = &rls.server;
    eventually("four calls hold the whole budget", || async {
        (server.metric(gauge).await == (4 * HELD) as f64).then_some(())
    })
    .await;
    let other = h2_client(addr).await.unwrap();
    let answer = call(&other, addr, Some(TOKEN), message("edge", "user", "u4"))
        .await
        .unwrap();
    assert_eq!(answer.status, RESOURCE_EXHAUSTED, "{answer:?}");
    assert!(
        answer.message.contains("--max-connection-memory"),
        "{answer:?}"
    );
    // Cancelled calls (RST_STREAM) give their share back.
    for (_, mut stream) in open {
        stream.send_reset(h2::Reason::CANCEL);
    }
    eventually("the budget is given back", || async {
        (server.metric(gauge).await == 0.0).then_some(())
    })
    .await;
    let answer = call(&other, addr, Some(TOKEN), message("edge", "user", "u4"))
        .await
        .unwrap();
    assert_eq!(answer.status, OK, "{answer:?}");
    assert_eq!(
        server.metric(gauge).await,
        0.0,
        "a finished call gave back its share"
    );
}
