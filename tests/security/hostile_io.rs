//! Hostile input over real sockets, beyond the connection count: half-sent
//! frames stay inside `--max-connection-memory`, the listen backlog is the
//! configured one, and a client name cannot forge a log line.

use crate::common::{http, RawConn, TestServer, PATIENCE};
use crate::harness::{free_addr, BIN};
use crate::process::KillOnDrop;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;
use tollgate_protocol::{ErrorCode, Request, Response, PROTOCOL_VERSION};

const MIB: usize = 1 << 20;

/// The header of a PING frame whose body is `len` bytes (padding the
/// server refuses as Malformed once it has all of it), and the body's
/// first bytes.
fn padded_ping_start(id: u32, len: u32) -> Vec<u8> {
    let mut start = len.to_be_bytes().to_vec();
    start.push(0x02);
    start.extend_from_slice(&id.to_be_bytes());
    start
}

async fn metric(admin: std::net::SocketAddr, name: &str) -> f64 {
    let text = http(admin, "GET", "/metrics", None).await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} missing"))
        .trim()
        .parse()
        .unwrap()
}

/// 300 connections each announce a 1 MiB frame and send only its start:
/// together they would need 300 MiB, the budget is 8 MiB, and the server
/// holds no more than that while still serving everyone else.
#[tokio::test]
async fn half_sent_frames_stay_within_the_connection_memory_budget() {
    let server = TestServer::start_admin(|c| {
        c.limits.max_frame = MIB as u32;
        c.network.max_connection_memory = 8 * MIB;
    })
    .await;
    let admin = server.admin.unwrap();
    let mut senders = Vec::new();
    for _ in 0..300 {
        let mut c = RawConn::ready(server.addr).await;
        let mut start = padded_ping_start(9, MIB as u32);
        start.resize(4096, 0);
        c.send_raw(&start).await;
        senders.push(c);
    }
    // Every frame that got memory holds exactly its size beyond 16 KiB.
    let per_frame = (MIB + 4 - 16 * 1024) as f64;
    let used = crate::common::eventually("frames to take the budget", || async {
        let used = metric(admin, "tollgate_connection_memory_bytes").await;
        (used >= per_frame * 7.0).then_some(used)
    })
    .await;
    assert!(
        used <= (8 * MIB) as f64,
        "{used} bytes held past the budget"
    );
    let mut by = RawConn::ready(server.addr).await;
    by.send(1, &Request::Ping).await;
    assert_eq!(by.recv().await, (1, Response::Pong));
    server.stop().await;
}

/// A frame that waits for memory longer than --frame-timeout is answered
/// Overloaded (request id 0) and its connection closes; the holder, which
/// keeps completing frames in time, keeps its memory and is served.
#[tokio::test]
async fn a_frame_that_finds_no_memory_in_time_is_answered_overloaded() {
    let frame = 200_000u32;
    let server = TestServer::start_with(|c| {
        c.limits.max_frame = 256 * 1024;
        // Room for one large frame, not two.
        c.network.max_connection_memory = 256 * 1024 + 4;
        c.network.frame_timeout = Duration::from_secs(3);
    })
    .await;
    let mut holder = RawConn::ready(server.addr).await;
    holder.send_raw(&padded_ping_start(5, frame)).await;
    // Let the holder's header be read and its memory taken first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut waiter = RawConn::ready(server.addr).await;
    waiter.send_raw(&padded_ping_start(6, frame)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The holder completes its frame and starts the next large one in the
    // same write: it keeps the memory, with a fresh frame deadline.
    let mut rest = vec![0u8; frame as usize - 5];
    rest.extend_from_slice(&padded_ping_start(7, frame));
    holder.send_raw(&rest).await;
    match holder.recv().await {
        (5, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::Malformed),
        other => panic!("expected Malformed for the padded PING: {other:?}"),
    }
    match waiter.recv().await {
        (
            0,
            Response::Error {
                code: ErrorCode::Overloaded,
                message,
            },
        ) => assert!(message.contains("--max-connection-memory"), "{message}"),
        other => panic!("expected Overloaded: {other:?}"),
    }
    waiter.expect_closed().await;
    // The holder finishes its second frame and goes on.
    holder.send_raw(&vec![0u8; frame as usize - 5]).await;
    assert!(matches!(holder.recv().await, (7, Response::Error { .. })));
    holder.send(8, &Request::Ping).await;
    assert_eq!(holder.recv().await, (8, Response::Pong));
    server.stop().await;
}

/// 600 connects to a listener that accepts none all complete: the
/// kernel queues them (tokio's own `bind` asks for 128, and the rest
/// would hang in SYN retransmits).
#[tokio::test]
async fn the_listen_backlog_is_the_configured_one() {
    let listener = tollgate::server::bind("127.0.0.1:0".parse().unwrap(), 1024).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut connects = tokio::task::JoinSet::new();
    for _ in 0..600 {
        connects.spawn(async move {
            tokio::time::timeout(PATIENCE, tokio::net::TcpStream::connect(addr)).await
        });
    }
    let mut open = Vec::new();
    while let Some(r) = connects.join_next().await {
        let stream = r.unwrap().expect("connect queued by the kernel").unwrap();
        open.push(stream);
    }
    assert_eq!(open.len(), 600);
    drop(listener);
}

/// A client name holding a newline and a terminal escape shows up escaped
/// on the one log line it belongs to (text log format).
#[tokio::test]
async fn a_client_name_cannot_forge_a_log_line() {
    let addr = free_addr();
    let child = Command::new(BIN)
        .args(["serve", "--listen", &addr, "--log-format", "text"])
        .env_remove("TOLLGATE_CLUSTER_SECRET")
        .env("RUST_LOG", "tollgate=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let stderr = child.0.stderr.take().unwrap();
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let mut c = crate::common::eventually("the server listens", || async {
        tokio::net::TcpStream::connect(addr)
            .await
            .ok()
            .map(|s| RawConn::over(tollgate::tls::Socket::Plain(s)))
    })
    .await;
    let forged = "gw\n2026-01-01T00:00:00Z  INFO tollgate: FORGED role change\u{1b}[2J";
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: forged.into(),
        auth_token: None,
    };
    c.send(1, &hello).await;
    assert!(matches!(c.recv().await, (1, Response::HelloOk { .. })));
    let line = tokio::time::timeout(PATIENCE, async {
        loop {
            let line = lines.recv().await.expect("server log open");
            if line.contains("handshake done") {
                return line;
            }
        }
    })
    .await
    .expect("the handshake is logged");
    assert!(
        line.contains(r"gw\n2026-01-01T00:00:00Z  INFO tollgate: FORGED role change\u{1b}[2J"),
        "{line}"
    );
    drop(c);
    drop(child);
    while let Some(line) = lines.recv().await {
        assert!(!line.contains("FORGED") || line.contains(r"gw\n"), "{line}");
    }
}
