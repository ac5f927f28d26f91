//! Test harness: real servers on port 0 and raw protocol connections.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tollgate::clock::ManualClock;
use tollgate::config::ServerConfig;
use tollgate::server::Server;
use tollgate::server::TlsReloader;
use tollgate::store::Store;
use tollgate::tls::Socket;
use tollgate_protocol::{
    decode_response, encode_request, Algorithm, CheckBatch, Limit, Pair, Request, RequestId,
    Response, PROTOCOL_VERSION,
};

/// Generous bound so a broken test fails instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(10);
pub const S: u64 = 1_000_000_000;

/// Which ports beside the protocol port a [`TestServer`] listens on.
#[derive(Default)]
struct Ports {
    admin: bool,
    resp: bool,
    envoy: bool,
}

pub struct TestServer {
    pub addr: SocketAddr,
    /// The admin API, when started with [`TestServer::start_admin`].
    pub admin: Option<SocketAddr>,
    /// The RESP front end, when started with [`TestServer::start_resp`].
    pub resp: Option<SocketAddr>,
    /// The Envoy rate limit service, when started with
    /// [`TestServer::start_envoy`].
    pub envoy: Option<SocketAddr>,
    pub rules: Arc<tollgate::rules::Rules>,
    pub store: Arc<Store>,
    pub clock: Arc<ManualClock>,
    /// Reloads the certificates, when the server runs TLS.
    pub tls: Option<TlsReloader>,
    pub shutdown: CancellationToken,
    pub join: JoinHandle<std::io::Result<()>>,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A server on 127.0.0.1:0 with a manual clock at t = 1000 s.
    pub async fn start_with(tune: impl FnOnce(&mut ServerConfig)) -> Self {
        Self::start_inner(tune, Ports::default()).await
    }

    /// Like [`start_with`](Self::start_with), with the admin API on
    /// 127.0.0.1:0 too.
    pub async fn start_admin(tune: impl FnOnce(&mut ServerConfig)) -> Self {
        let ports = Ports {
            admin: true,
            ..Ports::default()
        };
        Self::start_inner(tune, ports).await
    }

    /// Like [`start_with`](Self::start_with), with the RESP front end on
    /// 127.0.0.1:0 too.
    pub async fn start_resp(tune: impl FnOnce(&mut ServerConfig)) -> Self {
        let ports = Ports {
            resp: true,
            ..Ports::default()
        };
        Self::start_inner(tune, ports).await
    }

    /// Like [`start_with`](Self::start_with), with the Envoy rate limit
    /// service on 127.0.0.1:0 too (a build with the feature `envoy`).
    pub async fn start_envoy(tune: impl FnOnce(&mut ServerConfig)) -> Self {
        let ports = Ports {
            envoy: true,
            ..Ports::default()
        };
        Self::start_inner(tune, ports).await
    }

    async fn start_inner(tune: impl FnOnce(&mut ServerConfig), ports: Ports) -> Self {
        let mut config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
        tune(&mut config);
        config.validate().expect("test config is valid");
        let listener = TcpListener::bind(config.network.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let clock = Arc::new(ManualClock::new(1000 * S));
        let mut server = Server::with_clock(config, clock.clone()).expect("server starts");
        let mut admin_addr = None;
        if ports.admin {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            admin_addr = Some(l.local_addr().unwrap());
            server = server.with_admin(l);
        }
        let mut resp = None;
        if ports.resp {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            resp = Some(l.local_addr().unwrap());
            server = server.with_resp(l);
        }
        let mut envoy = None;
        if ports.envoy {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            envoy = Some(l.local_addr().unwrap());
            server = server.with_envoy_rls(l);
        }
        let store = server.store();
        let rules = server.rules();
        let tls = server.tls();
        let shutdown = CancellationToken::new();
        let join = tokio::spawn(server.run(listener, shutdown.clone()));
        TestServer {
            addr,
            admin: admin_addr,
            resp,
            envoy,
            rules,
            store,
            clock,
            tls,
            shutdown,
            join,
        }
    }

    /// Cancels and waits for the server to finish draining.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, self.join)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }
}

pub fn tb(key: &str, count: u64, period_ms: u64, burst: u64, cost: u32) -> Pair {
    Pair {
        key: Bytes::copy_from_slice(key.as_bytes()),
        limit: Limit {
            algorithm: Algorithm::TokenBucket,
            count,
            period_ms,
            burst,
        }
        .into(),
        cost,
    }
}

/// A pair naming a rule.
pub fn rule(key: &str, name: &str, cost: u32) -> Pair {
    Pair::rule(
        Bytes::copy_from_slice(key.as_bytes()),
        tollgate_protocol::RuleName::try_from(name).unwrap(),
        cost,
    )
}

/// One admin API call over real HTTP.
pub async fn http(
    admin: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> tollgate::admin_client::Answer {
    tollgate::admin_client::call(
        &admin.to_string(),
        method.parse().unwrap(),
        path,
        body.map(|b| b.as_bytes().to_vec()),
        PATIENCE,
    )
    .await
    .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Polls `probe` until it returns Some, or fails after [`PATIENCE`].
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Writes `text` to `path` the way editors and config managers do: a new
/// file renamed over the old one, so a reader never sees half of it.
pub fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A fresh directory under the system's temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-test-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn path(&self, file: &str) -> std::path::PathBuf {
        self.0.join(file)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn batch_of(checks: Vec<Vec<Pair>>) -> CheckBatch {
    let mut b = CheckBatch::default();
    for c in checks {
        b.push_check(c);
    }
    b
}

/// A protocol connection driven by hand, frame by frame (plain TCP, or
/// TLS made by the test).
pub struct RawConn {
    pub stream: Socket,
    rbuf: BytesMut,
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Self::over(Socket::Plain(stream))
    }

    /// A connection over a socket the test opened (a TLS one).
    pub fn over(stream: Socket) -> Self {
        RawConn {
            stream,
            rbuf: BytesMut::new(),
        }
    }

    /// Connects and completes the handshake.
    pub async fn ready(addr: SocketAddr) -> Self {
        let mut c = Self::connect(addr).await;
        match c.hello(None).await {
            Some(Response::HelloOk { .. }) => c,
            other => panic!("handshake failed: {other:?}"),
        }
    }

    /// Sends HELLO (request id 1) with `token`, if any: the answer, or None
    /// when the server closed the connection instead.
    pub async fn hello(&mut self, token: Option<&str>) -> Option<Response> {
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "test".into(),
            auth_token: token.map(|t| Bytes::copy_from_slice(t.as_bytes())),
        };
        self.send(1, &hello).await;
        let (id, answer) = self.try_recv().await?;
        assert_eq!(id, 1, "{answer:?}");
        Some(answer)
    }

    /// A node's handshake (PROTOCOL.md §15): NODE_CHALLENGE (id 1), then
    /// HELLO (id 2) whose token proves `secret` in `scope` over the nonce.
    /// The HELLO's answer, or None when the server closed the connection.
    pub async fn node_hello(
        &mut self,
        secret: &str,
        scope: tollgate_protocol::NodeScope,
    ) -> Option<Response> {
        let nonce = self.challenge().await;
        let proof = tollgate_protocol::node_proof(secret.as_bytes(), &nonce, scope);
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "test node".into(),
            auth_token: Some(Bytes::copy_from_slice(&proof)),
        };
        self.send(2, &hello).await;
        let (id, answer) = self.try_recv().await?;
        assert_eq!(id, 2, "{answer:?}");
        Some(answer)
    }

    /// NODE_CHALLENGE (id 1): the server's nonce.
    pub async fn challenge(&mut self) -> [u8; tollgate_protocol::NONCE_LEN] {
        self.send(1, &Request::NodeChallenge).await;
        match self.recv().await {
            (1, Response::Challenge { nonce }) => nonce,
            other => panic!("NODE_CHALLENGE: {other:?}"),
        }
    }

    pub async fn send(&mut self, id: RequestId, req: &Request) {
        let mut buf = BytesMut::new();
        encode_request(id, req, &mut buf).unwrap();
        self.send_raw(&buf).await;
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next response, or None when the server closed the connection.
    pub async fn try_recv(&mut self) -> Option<(RequestId, Response)> {
        tokio::time::timeout(PATIENCE, async {
            loop {
                if let Some(r) = decode_response(&mut self.rbuf, 64 << 20).unwrap() {
                    return Some(r);
                }
                match self.stream.read_buf(&mut self.rbuf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("server answers in time")
    }

    pub async fn recv(&mut self) -> (RequestId, Response) {
        self.try_recv().await.expect("connection open")
    }

    /// Asserts the server closes the connection without further answers.
    pub async fn expect_closed(&mut self) {
        if let Some(r) = self.try_recv().await {
            panic!("expected close, got {r:?}");
        }
    }

    pub async fn check(
        &mut self,
        id: RequestId,
        batch: CheckBatch,
    ) -> Vec<tollgate_protocol::CheckResult> {
        self.send(id, &Request::Check(batch)).await;
        match self.recv().await {
            (rid, Response::Checked(results)) if rid == id => results,
            other => panic!("expected CHECKED {id}, got {other:?}"),
        }
    }
}

pub fn allowed(r: &tollgate_protocol::CheckResult) -> bool {
    matches!(r, tollgate_protocol::CheckResult::Decision(d) if d.allowed)
}
