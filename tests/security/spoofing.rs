//! A plain client (one that completed HELLO with a client token, or none)
//! tries what only a node may do: announce itself as a primary, promote a
//! standby, attach as a standby. Each is refused and changes nothing. A
//! node that proved the cluster secret may, but not with an absurd epoch.

use crate::common::*;
use tollgate::config::ServerConfig;
use tollgate_protocol::{
    Announce, ErrorCode, NodeScope, ReplRequest, ReplResponse, Request, Response, Role,
};

const SECRET: &str = "cluster-secret-for-tests";

/// A node of a pair: it has the cluster secret.
fn node(c: &mut ServerConfig) {
    c.auth.cluster_secret = Some(SECRET.into());
}

/// A connection that proved the cluster secret (over its challenge).
async fn as_node(addr: std::net::SocketAddr) -> RawConn {
    let mut c = RawConn::connect(addr).await;
    match c.node_hello(SECRET, NodeScope::Cluster).await {
        Some(Response::HelloOk { .. }) => c,
        other => panic!("node HELLO: {other:?}"),
    }
}

async fn hello(addr: std::net::SocketAddr, token: Option<&str>) -> RawConn {
    let mut c = RawConn::connect(addr).await;
    match c.hello(token).await {
        Some(Response::HelloOk { .. }) => c,
        other => panic!("HELLO: {other:?}"),
    }
}

/// A primary and a standby of it, both with the cluster secret, once the
/// standby is attached and in sync.
async fn pair() -> (TestServer, TestServer) {
    let primary = TestServer::start_with(node).await;
    let addr = primary.addr.to_string();
    let standby = TestServer::start_with(|c| {
        node(c);
        c.replication.replica_of = Some(addr);
    })
    .await;
    let (p, s) = (primary.addr, standby.addr);
    eventually("the standby follows the primary", || async move {
        let attached = status_at(p).await.field("replica_connected") == Some(1);
        let synced = status_at(s).await.field("synced") == Some(1);
        (attached && synced).then_some(())
    })
    .await;
    (primary, standby)
}

fn announce(epoch: u64, addr: &str) -> Request {
    Request::Repl(ReplRequest::Status {
        announce: Some(Announce {
            role: Role::Primary,
            epoch,
            addr: addr.into(),
        }),
    })
}

fn error_code(r: &(u32, Response)) -> ErrorCode {
    match r {
        (_, Response::Error { code, .. }) => *code,
        other => panic!("expected an ERROR, got {other:?}"),
    }
}

async fn status(conn: &mut RawConn) -> tollgate_protocol::NodeStatus {
    conn.send(90, &Request::Repl(ReplRequest::Status { announce: None }))
        .await;
    match conn.recv().await {
        (90, Response::Repl(ReplResponse::Status(s))) => s,
        other => panic!("STATUS: {other:?}"),
    }
}

/// STATUS on a fresh connection.
async fn status_at(addr: std::net::SocketAddr) -> tollgate_protocol::NodeStatus {
    status(&mut RawConn::ready(addr).await).await
}

/// The node still answers CHECKs as a primary at `epoch`.
async fn still_primary(conn: &mut RawConn, epoch: u64) {
    let s = status(conn).await;
    assert_eq!((s.role, s.epoch), (Role::Primary, epoch), "{s:?}");
    let r = conn
        .check(
            91,
            batch_of(vec![vec![tb("rl:{x}:after", 10, 1000, 10, 1)]]),
        )
        .await;
    assert!(allowed(&r[0]), "{r:?}");
}

#[tokio::test]
async fn a_spoofed_status_announce_is_refused_and_changes_nothing() {
    let server = TestServer::start_with(node).await;
    let mut c = RawConn::ready(server.addr).await;
    c.send(
        1,
        &Request::Repl(ReplRequest::Status {
            announce: Some(Announce {
                role: Role::Primary,
                epoch: 1 << 40,
                addr: "127.0.0.1:1".into(),
            }),
        }),
    )
    .await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
    // Same connection, and a fresh one: still primary at epoch 1.
    still_primary(&mut c, 1).await;
    still_primary(&mut RawConn::ready(server.addr).await, 1).await;
    server.stop().await;
}

#[tokio::test]
async fn a_spoofed_promote_is_refused_and_the_standby_stays_a_standby() {
    let (primary, standby) = pair().await;
    let mut s = RawConn::ready(standby.addr).await;
    s.send(1, &Request::Repl(ReplRequest::Promote)).await;
    assert_eq!(error_code(&s.recv().await), ErrorCode::AuthFailed);
    let after = status(&mut s).await;
    assert_eq!((after.role, after.epoch), (Role::Standby, 1), "{after:?}");
    // One primary, still serving.
    still_primary(&mut RawConn::ready(primary.addr).await, 1).await;
    standby.stop().await;
    primary.stop().await;
}

#[tokio::test]
async fn a_spoofed_replicate_is_refused_and_the_real_standby_stays_attached() {
    let (primary, standby) = pair().await;
    let mut p = RawConn::ready(primary.addr).await;
    let attached = status(&mut p).await;
    let mut c = RawConn::ready(primary.addr).await;
    c.send(
        1,
        &Request::Repl(ReplRequest::Replicate {
            replid: 0,
            offset: 0,
            epoch: 1,
            advertise: "127.0.0.1:1".into(),
        }),
    )
    .await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
    // The connection is still an ordinary one, and the node a primary.
    still_primary(&mut c, 1).await;
    let after = status(&mut p).await;
    assert_eq!(after.field("replica_connected"), Some(1), "{after:?}");
    assert_eq!(after.field("full_syncs"), attached.field("full_syncs"));
    standby.stop().await;
    primary.stop().await;
}

#[tokio::test]
async fn a_client_token_is_not_the_cluster_secret() {
    let server = TestServer::start_with(|c| {
        node(c);
        c.auth.auth_token = Some("client-token-for-spoofing".into());
    })
    .await;
    let mut c = hello(server.addr, Some("client-token-for-spoofing")).await;
    c.send(1, &announce(5, "127.0.0.1:1")).await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
    c.send(2, &Request::Repl(ReplRequest::Promote)).await;
    assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
    // The node itself passes HELLO with the secret although it is not a
    // client token, and may announce (here: a standby at the same epoch).
    let mut n = as_node(server.addr).await;
    let standby = Announce {
        role: Role::Standby,
        epoch: 1,
        addr: "127.0.0.1:1".into(),
    };
    n.send(
        3,
        &Request::Repl(ReplRequest::Status {
            announce: Some(standby),
        }),
    )
    .await;
    assert!(matches!(
        n.recv().await,
        (3, Response::Repl(ReplResponse::Status(_)))
    ));
    still_primary(&mut c, 1).await;
    server.stop().await;
}

#[tokio::test]
async fn without_a_cluster_secret_no_connection_may_control_the_node() {
    let server = TestServer::start().await;
    for token in [None, Some(SECRET), Some("anything")] {
        let mut c = hello(server.addr, token).await;
        c.send(1, &announce(7, "127.0.0.1:1")).await;
        assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
        c.send(2, &Request::Repl(ReplRequest::Promote)).await;
        assert_eq!(error_code(&c.recv().await), ErrorCode::AuthFailed);
    }
    still_primary(&mut RawConn::ready(server.addr).await, 1).await;
    server.stop().await;
}

#[tokio::test]
async fn insecure_without_a_secret_lets_any_client_control_the_node() {
    let server = TestServer::start_with(|c| c.auth.insecure = true).await;
    let mut c = RawConn::ready(server.addr).await;
    c.send(1, &announce(3, "127.0.0.1:1")).await;
    match c.recv().await {
        (1, Response::Repl(ReplResponse::Status(s))) => {
            assert_eq!((s.role, s.epoch), (Role::Standby, 3), "{s:?}")
        }
        other => panic!("{other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn a_node_announcing_an_absurd_epoch_is_refused_and_changes_nothing() {
    let server = TestServer::start_with(node).await;
    let mut n = as_node(server.addr).await;
    for epoch in [
        u64::MAX,
        1 << 40,
        1 + tollgate::config::DEFAULT_MAX_EPOCH_GAP + 1,
    ] {
        n.send(1, &announce(epoch, "127.0.0.1:1")).await;
        match n.recv().await {
            (1, Response::Error { code, message }) => {
                assert_eq!(code, ErrorCode::Malformed);
                assert!(message.contains("refused: more than"), "{message}");
                assert!(message.contains(&epoch.to_string()), "{message}");
            }
            other => panic!("epoch {epoch}: {other:?}"),
        }
        // A standby asking to replicate with it is refused the same way.
        n.send(
            2,
            &Request::Repl(ReplRequest::Replicate {
                replid: 0,
                offset: u64::MAX,
                epoch,
                advertise: "127.0.0.1:1".into(),
            }),
        )
        .await;
        assert_eq!(error_code(&n.recv().await), ErrorCode::Malformed);
    }
    // Nothing was believed: a promotion (by the operator) takes epoch 2,
    // not u64::MAX + 1.
    still_primary(&mut n, 1).await;
    let s = status(&mut n).await;
    assert_eq!(s.field("role_changes"), Some(0));
    server.stop().await;
}
