//! TLS with real handshakes on in-process servers: a good chain, an
//! expired and a wrong-CA certificate refused, mTLS, the admin port, and
//! certificate reloads that keep open connections working.

use crate::certs::{client_config, write_ca, Ca, Leaf, Validity};
use crate::common::*;
use rustls::ClientConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::admin_client::AdminTarget;
use tollgate::config::ServerConfig;
use tollgate::server::TlsReloadSource;
use tollgate_protocol::{Request, Response, PROTOCOL_VERSION};

/// HELLO on `conn`: true when HELLO_OK comes back, false when the server
/// closed the connection (under TLS 1.3 a refused client certificate
/// shows only here, after the client thinks the handshake is done).
async fn hello(conn: &mut RawConn) -> bool {
    match conn.hello(None).await {
        Some(Response::HelloOk { .. }) => true,
        None => false,
        Some(other) => panic!("HELLO: {other:?}"),
    }
}

/// A TLS connection to a test server.
async fn tls_connect(
    addr: std::net::SocketAddr,
    config: Arc<ClientConfig>,
) -> Result<(RawConn, Vec<u8>), std::io::Error> {
    crate::certs::tls_connect(&addr.to_string(), config).await
}

/// Whether a client with `config` gets through the handshake and HELLO.
async fn admitted(addr: std::net::SocketAddr, config: Arc<ClientConfig>) -> bool {
    match tls_connect(addr, config).await {
        Ok((mut conn, _)) => hello(&mut conn).await,
        Err(_) => false,
    }
}

/// A server presenting `leaf` (`client_ca`: mTLS).
fn with_tls(dir: &TempDir, leaf: &Leaf, client_ca: Option<&str>) -> impl FnOnce(&mut ServerConfig) {
    let files = leaf.write(&dir.0, "server");
    let client_ca = client_ca.map(|pem| write_ca(&dir.0, "client-ca.pem", pem));
    move |c: &mut ServerConfig| {
        c.tls.tls_cert = Some(files.cert);
        c.tls.tls_key = Some(files.key);
        c.tls.tls_client_ca = client_ca;
    }
}

/// The admin API's `/metrics` over HTTPS, trusting `ca` (a file).
async fn metrics(server: &TestServer, ca: &std::path::Path) -> String {
    let admin = AdminTarget::plain(&server.admin.unwrap().to_string())
        .with_ca(ca)
        .unwrap();
    tollgate::admin_client::request(&admin, hyper::Method::GET, "/metrics", None, PATIENCE)
        .await
        .unwrap()
        .text()
}

/// A TLS server with a certificate of a fresh root (files in `dir`), and
/// a connection to it past HELLO.
async fn served_over_tls(dir: &TempDir) -> (TestServer, RawConn) {
    let root = Ca::root("root");
    let leaf = root.issue("server", Validity::Now);
    let server = TestServer::start_with(with_tls(dir, &leaf, None)).await;
    let (mut conn, _) = tls_connect(server.addr, client_config(&root.pem(), None))
        .await
        .unwrap();
    assert!(hello(&mut conn).await);
    (server, conn)
}

async fn ping(conn: &mut RawConn, id: u32) {
    conn.send(id, &Request::Ping).await;
    assert!(matches!(conn.recv().await, (got, Response::Pong) if got == id));
}

#[tokio::test]
async fn a_good_chain_serves_checks_and_plain_tcp_is_refused() {
    let dir = TempDir::new("tls-chain");
    let root = Ca::root("root");
    let leaf = root.intermediate("intermediate").issue_chained("server");
    let server = TestServer::start_admin(with_tls(&dir, &leaf, None)).await;

    let (mut conn, presented) = tls_connect(server.addr, client_config(&root.pem(), None))
        .await
        .expect("a chain to the trusted root is accepted");
    assert_eq!(presented, leaf.der);
    assert!(hello(&mut conn).await);
    let r = conn
        .check(2, batch_of(vec![vec![tb("rl:{tls}:a", 10, 1000, 10, 1)]]))
        .await;
    assert!(allowed(&r[0]));

    // A client that does not speak TLS gets no frame (at most a TLS
    // alert) and is counted.
    let mut plain = TcpStream::connect(server.addr).await.unwrap();
    let mut hello = bytes::BytesMut::new();
    tollgate_protocol::encode_request(
        1,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "plain".into(),
            auth_token: None,
        },
        &mut hello,
    )
    .unwrap();
    plain.write_all(&hello).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, plain.read_to_end(&mut answer))
        .await
        .expect("the server closes")
        .ok();
    assert!(answer.is_empty() || answer[0] == 0x15, "{answer:02x?}");
    let ca = write_ca(&dir.0, "root.pem", &root.pem());
    let text = metrics(&server, &ca).await;
    assert!(
        text.contains("tollgate_tls_handshake_failures_total 1"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_expired_or_foreign_server_certificate_is_refused_by_the_client() {
    let dir = TempDir::new("tls-expired");
    let root = Ca::root("root");
    let expired = root.issue("server", Validity::Expired);
    let server = TestServer::start_with(with_tls(&dir, &expired, None)).await;
    let err = tls_connect(server.addr, client_config(&root.pem(), None))
        .await
        .err()
        .expect("an expired certificate is refused");
    assert!(err.to_string().to_lowercase().contains("expired"), "{err}");
    server.stop().await;

    let dir = TempDir::new("tls-foreign");
    let other = Ca::root("another root");
    let foreign = other.issue("server", Validity::Now);
    let server = TestServer::start_with(with_tls(&dir, &foreign, None)).await;
    let err = tls_connect(server.addr, client_config(&root.pem(), None))
        .await
        .err()
        .expect("a certificate of an untrusted CA is refused");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    server.stop().await;
}

#[tokio::test]
async fn mtls_admits_only_clients_with_a_valid_certificate_of_the_ca() {
    let dir = TempDir::new("tls-mtls");
    let root = Ca::root("root");
    let clients = Ca::root("clients");
    let server_leaf = root.issue("server", Validity::Now);
    let server = TestServer::start_admin(with_tls(&dir, &server_leaf, Some(&clients.pem()))).await;
    let trust = root.pem();

    let good = clients.issue("gateway", Validity::Now);
    assert!(admitted(server.addr, client_config(&trust, Some(&good))).await);
    // No certificate, one from another CA, an expired one: refused.
    assert!(!admitted(server.addr, client_config(&trust, None)).await);
    let foreign = root.issue("gateway", Validity::Now);
    assert!(!admitted(server.addr, client_config(&trust, Some(&foreign))).await);
    let expired = clients.issue("gateway", Validity::Expired);
    assert!(!admitted(server.addr, client_config(&trust, Some(&expired))).await);
    // The admin port asks for no client certificate (probes hold none).
    let text = metrics(&server, &write_ca(&dir.0, "root.pem", &trust)).await;
    assert!(
        text.contains("tollgate_tls_handshake_failures_total 3"),
        "{text}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_admin_port_speaks_tls_only() {
    let dir = TempDir::new("tls-admin");
    let root = Ca::root("root");
    let leaf = root.issue("server", Validity::Now);
    let server = TestServer::start_admin(with_tls(&dir, &leaf, None)).await;
    let admin = server.admin.unwrap().to_string();
    let https = AdminTarget::plain(&admin)
        .with_ca(&write_ca(&dir.0, "root.pem", &root.pem()))
        .unwrap();
    let a =
        tollgate::admin_client::request(&https, hyper::Method::GET, "/v1/rules", None, PATIENCE)
            .await
            .unwrap();
    assert_eq!(a.status, 200, "{}", a.text());
    // Plain HTTP gets no answer.
    let plain = tollgate::admin_client::call(
        &admin,
        hyper::Method::GET,
        "/healthz",
        None,
        Duration::from_secs(2),
    )
    .await;
    assert!(plain.is_err(), "{plain:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_reload_serves_the_new_certificate_to_new_connections_only() {
    let dir = TempDir::new("tls-reload");
    let root = Ca::root("root");
    let first = root.issue("first", Validity::Now);
    let server = TestServer::start_with(|c| {
        with_tls(&dir, &first, None)(c);
        c.tls.tls_poll = Duration::ZERO;
    })
    .await;
    let trust = || client_config(&root.pem(), None);
    let (mut old, presented) = tls_connect(server.addr, trust()).await.unwrap();
    assert_eq!(presented, first.der);
    assert!(hello(&mut old).await);

    let second = root.issue("second", Validity::Now);
    second.write(&dir.0, "server");
    // What SIGHUP does.
    let reloader = server.tls.clone().expect("a TLS server");
    reloader.reload(TlsReloadSource::Signal).unwrap();
    let (mut new, presented) = tls_connect(server.addr, trust()).await.unwrap();
    assert_eq!(presented, second.der);
    assert!(hello(&mut new).await);
    ping(&mut old, 2).await;

    // A broken pair (the key of another certificate) is refused; the
    // certificate in force stays.
    let third = root.issue("third", Validity::Now);
    write_atomically(&dir.path("server.key"), &third.key);
    assert!(reloader.reload(TlsReloadSource::Signal).is_err());
    let (_, presented) = tls_connect(server.addr, trust()).await.unwrap();
    assert_eq!(presented, second.der);
    ping(&mut old, 3).await;
    ping(&mut new, 4).await;
    server.stop().await;
}

#[tokio::test]
async fn a_changed_certificate_file_is_picked_up_by_itself() {
    let dir = TempDir::new("tls-poll");
    let root = Ca::root("root");
    let first = root.issue("first", Validity::Now);
    let server = TestServer::start_with(|c| {
        with_tls(&dir, &first, None)(c);
        c.tls.tls_poll = Duration::from_millis(20);
    })
    .await;
    let trust = || client_config(&root.pem(), None);
    let (mut old, _) = tls_connect(server.addr, trust()).await.unwrap();
    assert!(hello(&mut old).await);
    let second = root.issue("second", Validity::Now);
    second.write(&dir.0, "server");
    let addr = server.addr;
    eventually("new handshakes present the new certificate", || {
        let config = trust();
        let want = second.der.clone();
        async move {
            let (_, presented) = tls_connect(addr, config).await.ok()?;
            (presented == want).then_some(())
        }
    })
    .await;
    ping(&mut old, 2).await;
    server.stop().await;
}

/// Megabytes of answers to one pipelined burst over TLS, read only once
/// the server has filled the socket and had to wait: every answer arrives
/// whole.
#[tokio::test]
async fn a_large_pipelined_burst_arrives_whole_over_tls() {
    let dir = TempDir::new("tls-burst");
    let (server, conn) = served_over_tls(&dir).await;
    let frames = 60;
    let mut wire = bytes::BytesMut::new();
    for id in 2..2 + frames {
        let checks = (0..1000)
            .map(|i| vec![tb(&format!("rl:{{b{id}}}:{i}"), 10, 1000, 10, 1)])
            .collect();
        let check = Request::Check(batch_of(checks));
        tollgate_protocol::encode_request(id, &check, &mut wire).unwrap();
    }
    let RawConn { stream, .. } = conn;
    let (mut rd, mut wr) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        wr.write_all(&wire).await.unwrap();
        wr.flush().await.unwrap();
        wr
    });
    // Let the answers pile up first.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut buf = bytes::BytesMut::new();
    let mut answered = 0;
    while answered < frames {
        match tollgate_protocol::decode_response(&mut buf, 64 << 20).unwrap() {
            Some((_, Response::Checked(results))) => {
                assert_eq!(results.len(), 1000);
                answered += 1;
            }
            Some(other) => panic!("{other:?}"),
            None => {
                let read = tokio::time::timeout(PATIENCE, rd.read_buf(&mut buf)).await;
                let n = read.expect("the rest of the answers arrives").unwrap();
                assert!(n > 0, "closed after {answered} answers");
            }
        }
    }
    drop(writer.await.unwrap());
    server.stop().await;
}

/// Shedding's backlog over TLS: what waits in the kernel behind a full
/// read buffer counts here too (PROTOCOL.md §5; the kernel holds TLS
/// records, not yet decrypted): under the default bounds (8 KiB low,
/// 24 KiB normal), a 48 KiB burst of CHECK2 frames has normal priority
/// shed too, high never.
#[tokio::test]
async fn shedding_counts_the_backlog_waiting_in_the_kernel_over_tls() {
    use tollgate_protocol::{
        CheckResult, CheckTag, ErrorCode, IdempotencyKey, Priority, TaggedBatch,
    };
    let dir = TempDir::new("tls-shed");
    let (server, mut conn) = served_over_tls(&dir).await;
    let frames = 300u32;
    let mut wire = bytes::BytesMut::new();
    for i in 0..frames {
        let mut batch = TaggedBatch::default();
        for (n, priority) in [Priority::Low, Priority::Normal, Priority::High]
            .into_iter()
            .enumerate()
        {
            let key = IdempotencyKey::from_u128(u128::from(i) * 3 + n as u128 + 1);
            let pair = tb(&format!("rl:{{s{i}}}:{n}"), 1, 60_000, 5, 1);
            batch.push(CheckTag::new(key, priority), pair);
        }
        tollgate_protocol::encode_request(i + 2, &Request::Check2(batch), &mut wire).unwrap();
    }
    conn.send_raw(&wire).await;
    let mut shed = [0u32; 3];
    for _ in 0..frames {
        let Response::Checked(results) = conn.recv().await.1 else {
            panic!("CHECKED expected")
        };
        for (p, result) in results.iter().enumerate() {
            shed[p] += u32::from(*result == CheckResult::Error(ErrorCode::Shed));
        }
    }
    assert!(shed[1] > 0, "normal priority shed past 24 KiB: {shed:?}");
    assert!(shed[0] >= shed[1], "low shed wherever normal is: {shed:?}");
    assert_eq!(shed[2], 0, "high never shed");
    server.stop().await;
}
