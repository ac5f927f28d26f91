//! Connection exhaustion over real sockets: a full server answers a
//! newcomer TooManyConnections instead of leaving it in the kernel's
//! queue, the per-address cap, shedding the quietest connection to make
//! room, the pre-HELLO frame cap, and the RESP front end's share of the
//! same places.

use crate::common::{RawConn, TestServer, PATIENCE};
use bytes::Bytes;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// A RESP connection to `addr` that answered PING.
async fn resp_ready(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    resp_ping(&mut s).await;
    s
}

async fn resp_ping(s: &mut tokio::net::TcpStream) {
    s.write_all(b"PING\r\n").await.unwrap();
    let mut buf = [0u8; 7];
    tokio::time::timeout(PATIENCE, s.read_exact(&mut buf))
        .await
        .expect("PONG in time")
        .unwrap();
    assert_eq!(&buf, b"+PONG\r\n");
}

/// What the server sends a RESP connection before closing it.
async fn resp_until_closed(s: &mut tokio::net::TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut out))
        .await
        .expect("the server closes a refused connection")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// The RESP front end is accepted then admitted like the protocol port,
/// from the same places: a refused Redis client reads Redis's own
/// "max number of clients" error instead of hanging in the kernel's queue.
#[tokio::test]
async fn the_front_ends_share_the_places_and_a_refused_redis_client_is_told() {
    let server = TestServer::start_resp(|c| {
        c.network.max_connections = 2;
        c.network.shed_idle_after = Duration::ZERO;
    })
    .await;
    let resp = server.resp.unwrap();
    let mut redis = resp_ready(resp).await;
    let mut proto = RawConn::ready(server.addr).await;
    let mut refused = tokio::net::TcpStream::connect(resp).await.unwrap();
    let said = resp_until_closed(&mut refused).await;
    assert!(
        said.starts_with("-ERR max number of clients reached (")
            && said.contains("--max-connections")
            && said.ends_with(")\r\n"),
        "{said}"
    );
    // The protocol port counts the RESP connection too.
    let mut third = RawConn::connect(server.addr).await;
    expect_refused(&mut third, "--max-connections").await;
    resp_ping(&mut redis).await;
    ping(&mut proto, 2).await;
    // Closing the RESP connection frees its place for either port.
    drop(redis);
    resp_ready_when_free(resp).await;
    server.stop().await;
}

/// A front end's connection is never the one shed to make room (it has no
/// way to be told, and ends on its own idle timeout): the quietest
/// *protocol* connection goes instead, and with only front-end connections
/// left to choose from the newcomer is refused.
#[tokio::test]
async fn shedding_passes_over_front_end_connections() {
    let server = TestServer::start_resp(|c| {
        c.network.max_connections = 2;
        c.network.shed_idle_after = Duration::from_millis(1);
    })
    .await;
    let resp = server.resp.unwrap();
    // The RESP connection is the quietest by far.
    let mut redis = resp_ready(resp).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut quiet = RawConn::ready(server.addr).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut fresh = RawConn::connect(server.addr).await;
    assert!(admitted(&mut fresh).await, "room is made");
    expect_refused(&mut quiet, "make room").await;
    resp_ping(&mut redis).await;
    ping(&mut fresh, 2).await;
    // Now the places are a RESP connection and a protocol one; with the
    // protocol one gone only the RESP connection is left, never shed.
    drop(fresh);
    let mut second = resp_ready_when_free(resp).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut last = RawConn::connect(server.addr).await;
    expect_refused(&mut last, "--max-connections").await;
    resp_ping(&mut redis).await;
    resp_ping(&mut second).await;
    server.stop().await;
}

/// A RESP connection once a place is free (a closed connection's place
/// is freed when the server notices the close).
async fn resp_ready_when_free(addr: SocketAddr) -> tokio::net::TcpStream {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"PING\r\n").await.unwrap();
        let mut buf = [0u8; 7];
        if let Ok(Ok(_)) = tokio::time::timeout(PATIENCE, c.read_exact(&mut buf)).await {
            if &buf == b"+PONG\r\n" {
                return c;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "no place freed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
