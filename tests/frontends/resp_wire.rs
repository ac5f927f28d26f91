//! Raw RESP on a socket: what no client library sends. Oversized and
//! malformed input gets one protocol error and the connection closes;
//! everyone else is still served. Inline commands (a human with netcat)
//! are answered.

use super::common::{TestServer, PATIENCE};
use super::redis_cli;
use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Sends `bytes` and reads until the server closes the connection.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.expect("the server closes a broken stream");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn oversized_and_malformed_input_is_a_protocol_error() {
    let server = TestServer::start_resp(|c| c.frontends.resp_max_args = 8).await;
    let resp = server.resp.unwrap();
    let cases: [(&[u8], &str); 5] = [
        (
            b"*9\r\n",
            "too many arguments in one command (9, at most 8)",
        ),
        (b"*-5\r\n", "invalid multibulk length"),
        (b"*1\r\n$99999999\r\n", "argument of 99999999 bytes"),
        (b"*1\r\n+PING\r\n", "expected '$', got '+'"),
        (b"*1\r\n$4\r\nPINGxx", "bulk string not followed by CRLF"),
    ];
    for (input, expected) in cases {
        let out = exchange(resp, input).await;
        assert!(
            out.starts_with("-ERR Protocol error") && out.contains(expected),
            "{input:?}: {out}"
        );
    }
    // A command answered before the broken one still gets its reply.
    let out = exchange(resp, b"*1\r\n$4\r\nPING\r\n*x\r\n").await;
    assert!(out.starts_with("+PONG\r\n-ERR Protocol error"), "{out}");
    // Inline commands, then QUIT closes.
    let out = exchange(resp, b"PING\r\nINCRBY inline 3\r\nQUIT\r\n").await;
    assert_eq!(out, "+PONG\r\n:3\r\n+OK\r\n");
    assert_eq!(redis_cli(resp, &["PING"]).await.trim(), "PONG");
    server.stop().await;
}

#[tokio::test]
async fn a_pipeline_without_expire_gets_the_default_window() {
    let server = TestServer::start_resp(|c| {
        c.frontends.resp_counter_window = std::time::Duration::from_secs(10)
    })
    .await;
    let resp = server.resp.unwrap();
    // t = 1000 s: the 10 s window ends at 1010 s.
    assert_eq!(redis_cli(resp, &["INCR", "plain"]).await.trim(), "1");
    assert_eq!(redis_cli(resp, &["PTTL", "plain"]).await.trim(), "10000");
    // In the same pipeline as its EXPIRE: the EXPIRE's window from the start.
    let out = exchange(
        resp,
        b"INCR piped\r\nEXPIRE piped 3600\r\nPTTL piped\r\nQUIT\r\n",
    )
    .await;
    assert_eq!(out, ":1\r\n:1\r\n:2600000\r\n+OK\r\n");
    server.stop().await;
}
