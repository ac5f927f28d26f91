//! Connection exhaustion over real sockets: a full server answers a
//! newcomer TooManyConnections instead of leaving it in the kernel's
//! queue, the per-address cap, shedding the quietest connection to make
//! room, and the pre-HELLO frame cap.

use crate::common::{RawConn, TestServer, PATIENCE};
use bytes::Bytes;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpSocket;
use tollgate::tls::Socket;
use tollgate_protocol::{ErrorCode, Request, Response, MAX_HELLO_FRAME, PROTOCOL_VERSION};

/// The connection's only frame is ERROR TooManyConnections with request
/// id 0, whose message holds `needle`; then the server closes it.
pub async fn expect_refused(c: &mut RawConn, needle: &str) {
    match c.try_recv().await {
        Some((
            0,
            Response::Error {
                code: ErrorCode::TooManyConnections,
                message,
            },
        )) => assert!(message.contains(needle), "{message}"),
        other => panic!("expected TooManyConnections, got {other:?}"),
    }
    c.expect_closed().await;
}

/// A connection from `source` (any port) to `addr`.
async fn connect_from(source: &str, addr: SocketAddr) -> RawConn {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    RawConn::over(Socket::Plain(stream))
}

/// HELLO on `c`: true when admitted, false when refused for room.
async fn admitted(c: &mut RawConn) -> bool {
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "test".into(),
        auth_token: None,
    };
    c.send(1, &hello).await;
    match c.try_recv().await {
        Some((1, Response::HelloOk { .. })) => true,
        Some((
            0,
            Response::Error {
                code: ErrorCode::TooManyConnections,
                ..
            },
        )) => false,
        other => panic!("HELLO: {other:?}"),
    }
}

async fn ping(c: &mut RawConn, id: u32) {
    c.send(id, &Request::Ping).await;
    assert_eq!(c.recv().await, (id, Response::Pong));
}

#[tokio::test]
async fn a_full_server_answers_too_many_connections_instead_of_queueing() {
    let server = TestServer::start_with(|c| {
        c.network.max_connections = 2;
        c.network.shed_idle_after = Duration::ZERO;
    })
    .await;
    let mut first = RawConn::ready(server.addr).await;
    let mut second = RawConn::ready(server.addr).await;
    // The newcomer is told without sending anything: it is not left
    // waiting in the kernel's accept queue.
    let mut third = RawConn::connect(server.addr).await;
    expect_refused(&mut third, "--max-connections").await;
    ping(&mut first, 2).await;
    ping(&mut second, 2).await;
    // A place frees when a connection ends.
    drop(first);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut fresh = loop {
        let mut c = RawConn::connect(server.addr).await;
        if admitted(&mut c).await {
            break c;
        }
        assert!(tokio::time::Instant::now() < deadline, "no place freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    ping(&mut fresh, 2).await;
    server.stop().await;
}

#[tokio::test]
async fn one_address_gets_at_most_max_connections_per_ip() {
    let server = TestServer::start_with(|c| c.network.max_connections_per_ip = 2).await;
    let mut a = connect_from("127.0.0.1", server.addr).await;
    let mut b = connect_from("127.0.0.1", server.addr).await;
    assert!(admitted(&mut a).await);
    assert!(admitted(&mut b).await);
    let mut c = connect_from("127.0.0.1", server.addr).await;
    expect_refused(&mut c, "from 127.0.0.1").await;
    // Another address still gets in, and the first two are served.
    let mut other = connect_from("127.0.0.2", server.addr).await;
    assert!(admitted(&mut other).await);
    ping(&mut other, 2).await;
    ping(&mut a, 2).await;
    ping(&mut b, 2).await;
    server.stop().await;
}

/// The scenario scaled down: every place held by idle sockets
/// that completed HELLO, and a fresh client is still answered, because
/// the quietest connection makes room.
#[tokio::test]
async fn when_full_of_idle_connections_a_fresh_client_is_still_answered() {
    const MAX: usize = 300;
    let server = TestServer::start_with(|c| {
        c.network.max_connections = MAX;
        c.network.shed_idle_after = Duration::from_millis(1);
    })
    .await;
    let mut idle = Vec::with_capacity(MAX);
    idle.push(RawConn::ready(server.addr).await);
    // The first is quiet longest by a clear margin (activity is kept in
    // milliseconds).
    tokio::time::sleep(Duration::from_millis(20)).await;
    for _ in 1..MAX {
        idle.push(RawConn::ready(server.addr).await);
    }
    // Quiet for longer than --shed-idle-after.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut fresh = RawConn::connect(server.addr).await;
    assert!(admitted(&mut fresh).await, "the fresh client is admitted");
    ping(&mut fresh, 2).await;
    // The quietest (the first opened) was told why and closed.
    expect_refused(&mut idle[0], "make room").await;
    server.stop().await;
}

#[tokio::test]
async fn before_hello_frames_are_capped_at_hello_size() {
    let server = TestServer::start().await;
    // One byte over the largest HELLO: refused from the header alone.
    let mut c = RawConn::connect(server.addr).await;
    let len = MAX_HELLO_FRAME + 1;
    let mut header = len.to_be_bytes().to_vec();
    header.extend_from_slice(&[0x01, 0, 0, 0, 1]);
    c.send_raw(&header).await;
    match c.recv().await {
        (0, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::FrameTooLarge),
        other => panic!("expected FrameTooLarge: {other:?}"),
    }
    c.expect_closed().await;

    // The largest HELLO itself fits.
    let mut c = RawConn::connect(server.addr).await;
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: "n".repeat(255),
        auth_token: Some(Bytes::from(vec![b't'; 255])),
    };
    c.send(1, &hello).await;
    assert!(matches!(c.recv().await, (1, Response::HelloOk { .. })));
    // After HELLO the full max_frame applies again: a 2,000-byte frame is
    // read whole (and refused for its padding alone, the connection goes on).
    let mut frame = 2000u32.to_be_bytes().to_vec();
    frame.extend_from_slice(&[0x02, 0, 0, 0, 7]);
    frame.resize(4 + 2000, 0);
    c.send_raw(&frame).await;
    match c.recv().await {
        (7, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::Malformed),
        other => panic!("expected Malformed: {other:?}"),
    }
    ping(&mut c, 8).await;
    server.stop().await;
}
