//! Node authentication (PROTOCOL.md §15): a node proves the cluster
//! secret over a nonce the server draws for its connection, so the bytes
//! of a real node's handshake, recorded and replayed, open nothing; a node
//! secret sent as it is in HELLO is refused; and a connection that proved
//! the region secret may send USAGE, never replicate, promote or hand off.

use crate::common::*;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::config::ServerConfig;
use tollgate_protocol::{ErrorCode, NodeScope, ReplRequest, ReplResponse, Request, Response, Role};

const SECRET: &str = "node-auth-tests-cluster-secret";
const REGION_SECRET: &str = "node-auth-tests-region-secret";
const CLIENT_TOKEN: &str = "node-auth-tests-client-token";

fn node(c: &mut ServerConfig) {
    c.auth.cluster_secret = Some(SECRET.into());
    c.auth.region_secret = Some(REGION_SECRET.into());
}

/// A relay to `to` that records every byte its first client sends.
async fn recording_relay(to: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let sent = Arc::new(Mutex::new(Vec::new()));
    let record = sent.clone();
    tokio::spawn(async move {
        let Ok((inbound, _)) = listener.accept().await else {
            return;
        };
        let Ok(outbound) = TcpStream::connect(to).await else {
            return;
        };
        let (mut in_read, mut in_write) = inbound.into_split();
        let (mut out_read, mut out_write) = outbound.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut out_read, &mut in_write).await;
        });
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = in_read.read(&mut buf).await {
            record.lock().unwrap().extend_from_slice(&buf[..n]);
            if out_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    (addr, sent)
}

/// The first `n` whole frames of `bytes`.
fn first_frames(bytes: &[u8], n: usize) -> Vec<u8> {
    let mut end = 0;
    for _ in 0..n {
        let len = u32::from_be_bytes(bytes[end..end + 4].try_into().unwrap()) as usize;
        end += 4 + len;
    }
    bytes[..end].to_vec()
}

fn refused_auth(answer: Option<Response>) {
    match answer {
        Some(Response::Error {
            code: ErrorCode::AuthFailed,
            ..
        }) => {}
        other => panic!("expected AuthFailed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_node_handshake_replayed_on_a_new_connection_is_refused() {
    for client_token in [Some(CLIENT_TOKEN), None] {
        let tune = |c: &mut ServerConfig| {
            node(c);
            c.auth.auth_token = client_token.map(Into::into);
        };
        let primary = TestServer::start_with(tune).await;
        // A real standby attaches through a relay that records what it
        // sends: its handshake, then REPLICATE.
        let (relay, sent) = recording_relay(primary.addr).await;
        let standby = TestServer::start_with(|c| {
            tune(c);
            c.replication.replica_of = Some(relay.to_string());
        })
        .await;
        let p = primary.addr;
        eventually("the standby attaches through the relay", || async move {
            let mut c = RawConn::connect(p).await;
            c.hello(client_token).await?;
            c.send(2, &Request::Repl(ReplRequest::Status { announce: None }))
                .await;
            match c.recv().await {
                (2, Response::Repl(ReplResponse::Status(s))) => {
                    (s.field("replica_connected") == Some(1)).then_some(())
                }
                other => panic!("STATUS: {other:?}"),
            }
        })
        .await;
        let recorded = sent.lock().unwrap().clone();
        // NODE_CHALLENGE (opcode 0x0D), then the HELLO proving the secret:
        // the secret itself is nowhere in what the standby sent.
        assert_eq!(recorded[4], 0x0D, "{recorded:02x?}");
        let handshake = first_frames(&recorded, 2);
        assert!(!recorded
            .windows(SECRET.len())
            .any(|w| w == SECRET.as_bytes()));
        // Replayed, byte for byte, on a new connection: a new nonce, and
        // the recorded proof does not prove the secret over it.
        let mut replay = RawConn::connect(primary.addr).await;
        replay.send_raw(&handshake).await;
        assert!(matches!(
            replay.try_recv().await,
            Some((1, Response::Challenge { .. }))
        ));
        refused_auth(replay.try_recv().await.map(|(_, r)| r));
        assert!(replay.try_recv().await.is_none(), "the connection closes");
        // The recorded HELLO alone, without asking for a challenge, is no
        // better: a proof is not a client token.
        let hello = &handshake[9..];
        let mut replay = RawConn::connect(primary.addr).await;
        replay.send_raw(hello).await;
        match (client_token, replay.try_recv().await) {
            (Some(_), Some((_, Response::Error { code, .. }))) => {
                assert_eq!(code, ErrorCode::AuthFailed)
            }
            // No client token required: anyone is a client, and only that.
            (None, Some((_, Response::HelloOk { .. }))) => {
                replay.send(3, &Request::Repl(ReplRequest::Promote)).await;
                match replay.recv().await {
                    (3, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::AuthFailed),
                    other => panic!("PROMOTE: {other:?}"),
                }
            }
            other => panic!("{other:?}"),
        }
        standby.stop().await;
        primary.stop().await;
    }
}

#[tokio::test]
async fn a_node_secret_sent_in_hello_is_refused() {
    // The old node HELLO: the cluster secret as the token, as every node
    // sent it before challenges; and the region secret the same way.
    let server = TestServer::start_with(node).await;
    for secret in [SECRET, REGION_SECRET] {
        let mut c = RawConn::connect(server.addr).await;
        refused_auth(c.hello(Some(secret)).await);
        assert!(c.try_recv().await.is_none(), "the connection closes");
    }
    // A proof in the wrong scope, or of a wrong secret, is refused too.
    for (secret, scope) in [
        (REGION_SECRET, NodeScope::Cluster),
        (SECRET, NodeScope::Region),
        ("not-the-secret-at-all", NodeScope::Cluster),
    ] {
        let mut c = RawConn::connect(server.addr).await;
        refused_auth(c.node_hello(secret, scope).await);
    }
    // One challenge per connection.
    let mut c = RawConn::connect(server.addr).await;
    c.challenge().await;
    c.send(2, &Request::NodeChallenge).await;
    match c.try_recv().await {
        Some((2, Response::Error { code, .. })) => assert_eq!(code, ErrorCode::HandshakeRequired),
        other => panic!("{other:?}"),
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_connection_may_send_usage_only() {
    // A standby, whose primary is elsewhere: PROMOTE would make it one.
    let primary = TestServer::start_with(node).await;
    let addr = primary.addr.to_string();
    let standby = TestServer::start_with(|c| {
        node(c);
        c.replication.replica_of = Some(addr);
    })
    .await;
    for target in [primary.addr, standby.addr] {
        let mut region = RawConn::connect(target).await;
        assert!(matches!(
            region.node_hello(REGION_SECRET, NodeScope::Region).await,
            Some(Response::HelloOk { .. })
        ));
        let node_requests = [
            Request::Repl(ReplRequest::Promote),
            Request::Repl(ReplRequest::Replicate {
                replid: 0,
                offset: 0,
                epoch: 1,
                advertise: "127.0.0.1:1".into(),
            }),
            Request::Repl(ReplRequest::Handoff {
                epoch: 1,
                records: vec![],
            }),
            Request::Repl(ReplRequest::Status {
                announce: Some(tollgate_protocol::Announce {
                    role: Role::Primary,
                    epoch: 9,
                    addr: "127.0.0.1:1".into(),
                }),
            }),
            Request::Check(batch_of(vec![vec![tb("rl:{region}:k", 10, 1000, 10, 1)]])),
            Request::Reset(vec![Bytes::from_static(b"rl:{region}:k")]),
        ];
        for (id, request) in (10..).zip(node_requests) {
            region.send(id, &request).await;
            match region.recv().await {
                (got, Response::Error { code, .. }) if got == id => {
                    assert_eq!(code, ErrorCode::AuthFailed, "{request:?}")
                }
                other => panic!("{request:?}: {other:?}"),
            }
        }
        // PING still answered, and the connection stays open.
        region.send(30, &Request::Ping).await;
        assert!(matches!(region.recv().await, (30, Response::Pong)));
    }
    // Nothing changed: the standby is still a standby of epoch 1, the
    // primary still has its standby attached.
    let mut n = RawConn::connect(standby.addr).await;
    assert!(matches!(
        n.node_hello(SECRET, NodeScope::Cluster).await,
        Some(Response::HelloOk {
            role: Role::Standby,
            epoch: 1,
            ..
        })
    ));
    // The cluster secret's proof still makes a node: PROMOTE is served.
    n.send(40, &Request::Repl(ReplRequest::Promote)).await;
    assert!(matches!(
        n.recv().await,
        (40, Response::Repl(ReplResponse::Promoted { .. }))
    ));
    standby.stop().await;
    primary.stop().await;
}
