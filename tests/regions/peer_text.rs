//! Text a peer region chose reaches the logs escaped: a real `tollgate
//! serve` (text log format) exchanges with a fake peer that refuses its
//! USAGE with an error message holding a newline and a terminal escape,
//! then answers in the name of a region spelt the same way. Neither shows
//! raw in the server's log, and each shows escaped on its own line.

use crate::harness::{free_addr, BIN};
use bytes::BytesMut;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tollgate_protocol::{
    decode_request, encode_response, ErrorCode, Request, Response, Role, ServerLimits, UsageAck,
    PROTOCOL_VERSION,
};

const FORGED: &str = "no\n2026-01-01T00:00:00Z  INFO tollgate: FORGED role change\u{1b}[2J";
const FORGED_ESCAPED: &str =
    r"no\n2026-01-01T00:00:00Z  INFO tollgate: FORGED role change\u{1b}[2J";

/// Serves one connection as a hostile peer region: HELLO_OK, then the
/// first USAGE refused with `FORGED`, every later one acknowledged in the
/// name of region `FORGED`.
async fn hostile_peer(listener: TcpListener) {
    let limits = ServerLimits::default();
    let mut usages = 0;
    loop {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut rbuf = BytesMut::new();
        loop {
            let (id, request) = match decode_request(&mut rbuf, &limits) {
                Ok(Some(r)) => r,
                Ok(None) => match stream.read_buf(&mut rbuf).await {
                    Ok(n) if n > 0 => continue,
                    _ => break,
                },
                Err(e) => panic!("{e}"),
            };
            let answer = match request {
                // Any nonce will do: this peer checks no proof.
                Request::NodeChallenge => Response::Challenge {
                    nonce: [7; tollgate_protocol::NONCE_LEN],
                },
                Request::Hello { .. } => Response::HelloOk {
                    version: PROTOCOL_VERSION,
                    role: Role::Primary,
                    epoch: 1,
                    offset: 0,
                    limits,
                },
                Request::Usage(report) => {
                    usages += 1;
                    if usages == 1 {
                        Response::Error {
                            code: ErrorCode::Malformed,
                            message: FORGED.into(),
                        }
                    } else {
                        Response::UsageOk(UsageAck {
                            region: FORGED.into(),
                            seq: report.seq,
                            duplicate: false,
                        })
                    }
                }
                other => panic!("{other:?}"),
            };
            let mut wbuf = BytesMut::new();
            encode_response(id, &answer, &mut wbuf).unwrap();
            if stream.write_all(&wbuf).await.is_err() {
                break;
            }
        }
    }
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_regions_text_is_escaped_in_the_log() {
    let dir = crate::common::TempDir::new("peer-text");
    let rules = dir.path("rules.yaml");
    std::fs::write(&rules, crate::process::RULES).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peer = format!("b={}", listener.local_addr().unwrap());
    tokio::spawn(hostile_peer(listener));
    let addr = free_addr();
    let child = Command::new(BIN)
        .args(["serve", "--listen", &addr, "--log-format", "text"])
        .args(["--rules", rules.to_str().unwrap(), "--region", "a"])
        .args(["--region-peer", &peer, "--exchange-interval", "100ms"])
        .env("TOLLGATE_CLUSTER_SECRET", crate::harness::CLUSTER_SECRET)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let stderr = child.0.stderr.take().unwrap();
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = lines.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            log.lock().unwrap().push(line);
        }
    });
    let logged = |what: &'static str| {
        let lines = lines.clone();
        crate::harness::eventually(what, move || {
            let lines = lines.clone();
            async move {
                let lines = lines.lock().unwrap();
                lines.iter().find(|l| l.contains(what)).cloned()
            }
        })
    };
    let refused = logged("peer region refused our usage").await;
    assert!(refused.contains(FORGED_ESCAPED), "{refused}");
    let other = logged("leads to another region").await;
    assert!(other.contains(FORGED_ESCAPED), "{other}");
    drop(child);
    for line in lines.lock().unwrap().iter() {
        assert!(
            !line.contains('\u{1b}'),
            "a raw escape in the log: {line:?}"
        );
        assert!(
            !line.contains("FORGED") || line.contains(r"no\n"),
            "a line of the peer's making: {line:?}"
        );
    }
}
