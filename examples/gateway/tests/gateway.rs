//! The example gateway over real HTTP against a real Tollgate server
//! (in-process, on 127.0.0.1:0 with its admin API and a rules file):
//! limits, headers, bypass attempts, fail-closed per rule, and the local
//! fallback while the server is gone.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{HeaderMap, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tollgate_client::{Client, ClientConfig, FallbackConfig};

/// Generous bound so a broken test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

struct Tollgate {
    addr: SocketAddr,
    admin: SocketAddr,
    stop: CancellationToken,
    join: tokio::task::JoinHandle<std::io::Result<()>>,
    _rules: tempfile_path::TempFile,
}

mod tempfile_path {
    /// A file in the temp dir, removed on drop.
    pub struct TempFile(pub std::path::PathBuf);

    impl TempFile {
        pub fn with(contents: &str) -> Self {
            let path = std::env::temp_dir().join(format!(
                "tollgate-gateway-test-{}-{}.yaml",
                std::process::id(),
                fastrand_like()
            ));
            std::fs::write(&path, contents).expect("write rules");
            Self(path)
        }
    }

    fn fastrand_like() -> u128 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

const RULES: &str = "rules:\n  - name: login\n    algorithm: sliding-window\n    rate: 3/min\n    failure-mode: closed\n";

impl Tollgate {
    async fn start() -> Self {
        let rules = tempfile_path::TempFile::with(RULES);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = admin_listener.local_addr().unwrap();
        let mut config = tollgate::config::ServerConfig::with_listen(addr);
        config.rules.file = Some(rules.0.clone());
        let server = tollgate::server::Server::new(config)
            .expect("server starts")
            .with_admin(admin_listener);
        let stop = CancellationToken::new();
        let join = tokio::spawn(server.run(listener, stop.clone()));
        Self {
            addr,
            admin,
            stop,
            join,
            _rules: rules,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(PATIENCE, self.join).await;
    }
}

/// Starts the example gateway on 127.0.0.1:0 in front of `tollgate`.
async fn gateway(tollgate: &Tollgate, config: ClientConfig) -> (SocketAddr, Client) {
    let client = Client::connect(
        tollgate.addr.to_string(),
        ClientConfig {
            admin: Some(tollgate.admin.to_string()),
            ..config
        },
    )
    .await
    .expect("connect");
    assert!(client.rules().get("login").is_some(), "rule table fetched");
    let app = tollgate_example_gateway::app(client.clone()).expect("app");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    (addr, client)
}

fn config() -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_millis(500),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        ..ClientConfig::default()
    }
}

/// One real HTTP/1 request; the status and headers of the answer.
async fn request(
    gateway: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> (StatusCode, HeaderMap) {
    let exchange = async {
        let stream = TcpStream::connect(gateway).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", gateway.to_string());
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let response = sender
            .send_request(builder.body(Empty::<Bytes>::new()).unwrap())
            .await
            .expect("response");
        let (parts, body) = response.into_parts();
        let _ = body.collect().await;
        (parts.status, parts.headers)
    };
    tokio::time::timeout(PATIENCE, exchange)
        .await
        .expect("answered in time")
}

async fn search(gateway: SocketAddr, key: &[u8]) -> (StatusCode, HeaderMap) {
    request(gateway, "GET", "/api/search", &[("x-api-key", key)]).await
}

/// Searches with `key` until one is denied (at most `max`); checks that a
/// 429 came, and that what passed before it is at least `burst` and at most
/// `burst` plus what `per_second` refilled meanwhile (a loaded machine may
/// be slow; the bound uses the time it took, never a fixed one). Returns
/// how many passed.
async fn passes_then_429(gateway: SocketAddr, key: &[u8], burst: u64, per_second: u64) -> u64 {
    let started = std::time::Instant::now();
    let mut passed = 0u64;
    loop {
        let (status, _) = search(gateway, key).await;
        match status {
            StatusCode::OK => passed += 1,
            StatusCode::TOO_MANY_REQUESTS => break,
            other => panic!("unexpected {other} for {:?}", String::from_utf8_lossy(key)),
        }
        assert!(passed <= 1000, "never denied: a free pass");
    }
    let refilled = (started.elapsed().as_secs_f64() * per_second as f64).ceil() as u64;
    assert!(
        (burst..=burst + refilled).contains(&passed),
        "{passed} passed for {:?} (burst {burst}, refilled {refilled})",
        String::from_utf8_lossy(key)
    );
    passed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_pass_then_429_with_the_rate_limit_headers() {
    let tollgate = Tollgate::start().await;
    let (gw, _client) = gateway(&tollgate, config()).await;

    let (status, h) = search(gw, b"acme").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(h["x-ratelimit-limit"], "10");
    assert_eq!(h["x-ratelimit-remaining"], "9");
    assert_eq!(
        h["ratelimit-policy"],
        "\"per-second\";q=10;w=1, \"per-day\";q=1000;w=86400"
    );
    assert_eq!(h["ratelimit"], "\"per-second\";r=9;t=1");
    assert!(h.get("retry-after").is_none());

    passes_then_429(gw, b"acme", 9, 10).await;
    let (status, h) = search(gw, b"acme").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h["retry-after"], "1");
    assert_eq!(h["x-ratelimit-remaining"], "0");
    assert!(h["ratelimit"]
        .to_str()
        .unwrap()
        .starts_with("\"per-second\";r=0;"));

    // Not limited.
    let (status, _) = request(gw, "GET", "/health", &[]).await;
    assert_eq!(status, StatusCode::OK);
    tollgate.stop().await;
}

/// The bypasses of issue 11 (`x-api-key: }` got CrossSlot, a 300-byte key
/// KeyTooLong, an empty key was accepted, each answered 200 forever under
/// fail-open): now each is limited like any caller, or refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bypass_attempts_get_400_or_429_never_a_free_pass() {
    let tollgate = Tollgate::start().await;
    let (gw, _client) = gateway(&tollgate, config()).await;

    for key in [
        b"}".to_vec(),
        b"{".to_vec(),
        b"a}b{c".to_vec(),
        vec![b'k'; 300],
    ] {
        passes_then_429(gw, &key, 10, 10).await;
    }
    // Two 300-byte keys differing in their last byte are two callers.
    let mut other = vec![b'k'; 300];
    other[299] = b'j';
    assert_eq!(search(gw, &other).await.0, StatusCode::OK);

    let (status, _) = search(gw, b"").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "empty key");
    let (status, _) = request(gw, "GET", "/api/search", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "missing key");
    tollgate.stop().await;
}

/// `login` is fail-closed in the server's rule table, `search` fail-open
/// (the default) with the local fallback: with the server gone, logins get
/// 503 and searches are limited locally, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_gone_login_fails_closed_search_falls_back_to_the_local_limit() {
    let tollgate = Tollgate::start().await;
    let (gw, client) = gateway(
        &tollgate,
        ClientConfig {
            fallback: Some(FallbackConfig {
                gateways: 2,
                max_keys: 1000,
            }),
            ..config()
        },
    )
    .await;
    let login = || request(gw, "POST", "/login", &[]);
    for _ in 0..3 {
        assert_eq!(login().await.0, StatusCode::OK);
    }
    assert_eq!(login().await.0, StatusCode::TOO_MANY_REQUESTS, "3/min");

    tollgate.stop().await;
    let (status, h) = login().await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "login is fail-closed"
    );
    assert_eq!(h["retry-after"], "1");
    // Search: 10/s burst 10 over 2 gateways: 5 locally (refilling 5/s),
    // then 429.
    passes_then_429(gw, b"acme", 5, 5).await;
    let (_, h) = search(gw, b"acme").await;
    assert_eq!(h["x-ratelimit-limit"], "5");
    client.close();
}
