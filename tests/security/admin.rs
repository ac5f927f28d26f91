//! The admin API's bearer token: 401 without it or with a wrong one, the
//! probes always open, /metrics open on request, two tokens during a
//! rotation, and the operator's promotion (POST /v1/promote).

use crate::common::*;
use hyper::Method;
use tollgate::admin_client::{request, AdminTarget, Answer};
use tollgate::config::ServerConfig;

const TOKEN: &str = "admin-token-for-tests";
const NEXT: &str = "admin-token-rotated-in";

async fn call(server: &TestServer, method: Method, path: &str, token: Option<&str>) -> Answer {
    let target =
        AdminTarget::plain(&server.admin.unwrap().to_string()).with_token(token.map(str::to_owned));
    request(&target, method, path, None, PATIENCE)
        .await
        .unwrap()
}

fn guarded(c: &mut ServerConfig) {
    c.auth.admin_token = Some(TOKEN.into());
}

#[tokio::test]
async fn the_admin_api_wants_its_token_except_for_the_probes() {
    let server = TestServer::start_admin(guarded).await;
    for path in [
        "/",
        "/v1/rules",
        "/v1/throttled",
        "/v1/replication",
        "/metrics",
        "/nowhere",
    ] {
        for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
            let a = call(&server, Method::GET, path, token).await;
            assert_eq!(a.status, 401, "{path} with {token:?}: {}", a.text());
            assert!(a.json()["error"].as_str().unwrap().contains("admin token"));
        }
    }
    // Writes too, and nothing changes.
    for (method, path) in [
        (Method::DELETE, "/v1/rules/x"),
        (Method::POST, "/v1/rules/reload"),
        (Method::POST, "/v1/promote"),
    ] {
        assert_eq!(call(&server, method, path, None).await.status, 401);
    }
    // The right token works; so do the probes without one.
    assert_eq!(
        call(&server, Method::GET, "/v1/rules", Some(TOKEN))
            .await
            .status,
        200
    );
    assert_eq!(
        call(&server, Method::GET, "/metrics", Some(TOKEN))
            .await
            .status,
        200
    );
    assert_eq!(
        call(&server, Method::GET, "/nowhere", Some(TOKEN))
            .await
            .status,
        404
    );
    assert_eq!(
        call(&server, Method::GET, "/healthz", None).await.status,
        200
    );
    assert_eq!(
        call(&server, Method::GET, "/readyz", None).await.status,
        200
    );
    // The plain helper (no token) is refused the same way.
    let a = http(server.admin.unwrap(), "GET", "/v1/rules", None).await;
    assert_eq!(a.status, 401);
    server.stop().await;
}

/// The status and the JSON body of the one answer on `stream` (the server
/// closes the connection after it).
async fn answer_of(stream: &mut tokio::net::TcpStream) -> (u16, serde_json::Value) {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer))
        .await
        .expect("an answer, then the close")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).expect("a JSON body"))
}

/// A rule's body must come whole, in time and small: one sent slowly or
/// not at all is answered 408 once the head's bound has passed (its
/// connection and bytes are not held for good: 400 such connections held
/// 1.8 MB each before), one past 64 KiB 413, both as `{"error"}` like
/// every admin error.
#[tokio::test]
async fn a_rule_body_must_come_whole_in_time_and_small() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start_admin(|c| {
        c.network.handshake_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    let admin = server.admin.unwrap();
    let head = |len: usize| {
        format!(
            "PUT /v1/rules/x HTTP/1.1\r\nHost: {admin}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n"
        )
    };
    // Two megabytes announced, one byte sent, then nothing.
    let mut slow = tokio::net::TcpStream::connect(admin).await.unwrap();
    slow.write_all(format!("{}{{", head(2_000_000)).as_bytes())
        .await
        .unwrap();
    let (status, body) = answer_of(&mut slow).await;
    assert_eq!(status, 408, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("did not arrive"),
        "{body}"
    );
    // One byte past the bound, of a larger body announced.
    let mut large = tokio::net::TcpStream::connect(admin).await.unwrap();
    let bytes = vec![b' '; (64 << 10) + 1];
    large.write_all(head(100_000).as_bytes()).await.unwrap();
    large.write_all(&bytes).await.unwrap();
    let (status, body) = answer_of(&mut large).await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("at most"),
        "{body}"
    );
    // The server serves on: a rule of the right size goes in.
    let mut good = tokio::net::TcpStream::connect(admin).await.unwrap();
    let rule = r#"{"algorithm":"token-bucket","rate":"5/s","burst":10}"#;
    good.write_all(
        format!(
            "{}{rule}",
            head(rule.len()).replace("HTTP/1.1\r\n", "HTTP/1.1\r\nConnection: close\r\n")
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (status, body) = answer_of(&mut good).await;
    assert_eq!(status, 201, "{body}");
    server.stop().await;
}

#[tokio::test]
async fn two_admin_tokens_work_during_a_rotation_and_metrics_may_be_open() {
    let server = TestServer::start_admin(|c| {
        guarded(c);
        c.auth.admin_token_next = Some(NEXT.into());
        c.auth.admin_open_metrics = true;
    })
    .await;
    for token in [TOKEN, NEXT] {
        assert_eq!(
            call(&server, Method::GET, "/v1/rules", Some(token))
                .await
                .status,
            200
        );
    }
    assert_eq!(
        call(&server, Method::GET, "/metrics", None).await.status,
        200
    );
    assert_eq!(
        call(&server, Method::GET, "/v1/throttled", None)
            .await
            .status,
        401
    );
    server.stop().await;
}

#[tokio::test]
async fn an_operator_promotes_a_standby_through_the_admin_api() {
    let primary = TestServer::start_admin(|c| {
        guarded(c);
        c.auth.cluster_secret = Some("cluster-secret-for-admin-tests".into());
    })
    .await;
    let addr = primary.addr.to_string();
    let standby = TestServer::start_admin(|c| {
        guarded(c);
        c.auth.cluster_secret = Some("cluster-secret-for-admin-tests".into());
        c.replication.replica_of = Some(addr);
    })
    .await;
    eventually("the standby is in sync", || async {
        let v = call(&standby, Method::GET, "/v1/replication", Some(TOKEN))
            .await
            .json();
        (v["synced"] == 1).then_some(())
    })
    .await;
    assert_eq!(
        call(&standby, Method::POST, "/v1/promote", None)
            .await
            .status,
        401
    );
    let a = call(&standby, Method::POST, "/v1/promote", Some(TOKEN)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let v = a.json();
    assert_eq!(
        (v["role"].as_str(), v["epoch"].as_u64()),
        (Some("primary"), Some(2))
    );
    assert_eq!(v["was_primary"], false);
    assert_eq!(v["addr"], standby.addr.to_string());
    // Again: already primary.
    let v = call(&standby, Method::POST, "/v1/promote", Some(TOKEN))
        .await
        .json();
    assert_eq!(
        (v["epoch"].as_u64(), v["was_primary"].as_bool()),
        (Some(2), Some(true))
    );
    standby.stop().await;
    primary.stop().await;
}

// What a browser can be made to send for someone else, as raw HTTP to a
// real `tollgate serve`: DNS rebinding (a foreign Host), cross-site
// requests (a foreign Origin, Sec-Fetch-Site) and form bodies.

mod browser {
    use crate::harness::{eventually, free_addr, Node, BIN};
    use serde_json::Value;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The longest answer read back (the status page is a few KiB).
    const MAX_ANSWER: u64 = 1 << 20;

    /// Sends `head` (request line and headers, without the blank line,
    /// `Connection: close` added) and `body` to `admin`; returns the status
    /// and the body (JSON, or the text as a JSON string).
    async fn raw(admin: &str, head: &str, body: &str) -> (u16, Value) {
        let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
        let request = format!("{head}\r\nConnection: close\r\n\r\n{body}");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(
            crate::common::PATIENCE,
            (&mut stream).take(MAX_ANSWER).read_to_end(&mut answer),
        )
        .await
        .expect("the admin API answers")
        .unwrap();
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let (status_line, rest) = answer.split_once("\r\n").expect("a status line");
        let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let body = rest.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let json = serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.to_owned()));
        (status, json)
    }

    /// A request as curl sends it: `Host` is the address it was given.
    async fn get(admin: &str, path: &str) -> (u16, Value) {
        raw(admin, &format!("GET {path} HTTP/1.1\r\nHost: {admin}"), "").await
    }

    async fn role(admin: &str) -> Value {
        let (status, v) = get(admin, "/v1/replication").await;
        assert_eq!(status, 200, "{v}");
        v["role"].clone()
    }

    fn refused(answer: &(u16, Value), status: u16, check: &str) {
        assert_eq!(answer.0, status, "{}", answer.1);
        assert_eq!(answer.1["refused"], check, "{}", answer.1);
        assert!(answer.1["error"].as_str().is_some_and(|e| !e.is_empty()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cross_site_request_cannot_promote_a_standby() {
        let (a_addr, b_addr) = (free_addr(), free_addr());
        let _a = Node::start(&a_addr, &["--peer", &b_addr, "--failover-after", "1h"]);
        let b = Node::start(
            &b_addr,
            &[
                "--replica-of",
                &a_addr,
                "--peer",
                &a_addr,
                "--failover-after",
                "1h",
            ],
        );
        let admin = b.admin.as_str();
        eventually("B is a standby", || async {
            (role(admin).await == "standby").then_some(())
        })
        .await;
        let promote = |headers: &str, body: &str| {
            let head = format!("POST /v1/promote HTTP/1.1\r\n{headers}");
            let body = body.to_owned();
            async move { raw(admin, &head, &body).await }
        };
        // A form on evil.example posting to the admin address.
        let h = format!("Host: {admin}\r\nOrigin: https://evil.example\r\nContent-Length: 0");
        refused(&promote(&h, "").await, 403, "origin");
        let h = format!(
            "Host: {admin}\r\nOrigin: null\r\nContent-Type: application/json\r\nContent-Length: 2"
        );
        refused(&promote(&h, "{}").await, 403, "origin");
        // A browser that sends Sec-Fetch-Site but no Origin.
        let h = format!("Host: {admin}\r\nSec-Fetch-Site: cross-site\r\nContent-Length: 0");
        refused(&promote(&h, "").await, 403, "sec-fetch-site");
        // A form body, even from no origin at all.
        let h = format!(
            "Host: {admin}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 3"
        );
        refused(&promote(&h, "a=b").await, 415, "content-type");
        // DNS rebinding: the page's own name, resolved to the admin address.
        let h = "Host: evil.example\r\nOrigin: http://evil.example\r\nContent-Length: 0";
        refused(&promote(h, "").await, 421, "host");
        assert_eq!(
            role(admin).await,
            "standby",
            "no refused request promoted B"
        );

        // The admin API's own page may, and so may curl.
        let own = format!("Host: {admin}\r\nOrigin: http://{admin}\r\nContent-Length: 0");
        let (status, v) = promote(&own, "").await;
        assert_eq!((status, &v["role"]), (200, &Value::from("primary")), "{v}");
        // The CLI's client still gets through (already primary: exit 0).
        let out = tokio::process::Command::new(BIN)
            .args(["promote", "--admin", admin])
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(said.contains("already primary"), "{said}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rebound_name_reads_nothing_and_bodies_must_be_json() {
        let node = Node::start(&free_addr(), &[]);
        let admin = node.admin.as_str();
        let port = admin.rsplit(':').next().unwrap();
        let put = |content_type: &str, body: &str| {
            let head = format!(
                "PUT /v1/rules/login HTTP/1.1\r\nHost: {admin}\r\nContent-Type: {content_type}\r\nContent-Length: {}",
                body.len()
            );
            let body = body.to_owned();
            async move { raw(admin, &head, &body).await }
        };
        let rule = r#"{"rate": "5/s"}"#;
        // A form, and JSON sent as text/plain (a form's enctype can do
        // that): neither creates the rule.
        refused(
            &put("application/x-www-form-urlencoded", "rate=5%2Fs").await,
            415,
            "content-type",
        );
        refused(&put("text/plain", rule).await, 415, "content-type");
        assert_eq!(get(admin, "/v1/rules/login").await.0, 404);
        let (status, v) = put("application/json; charset=utf-8", rule).await;
        assert_eq!(status, 201, "{v}");
        // Nor can another origin delete it, or replace it with JSON.
        let h = format!(
            "DELETE /v1/rules/login HTTP/1.1\r\nHost: {admin}\r\nOrigin: https://evil.example"
        );
        refused(&raw(admin, &h, "").await, 403, "origin");
        let h = format!(
            "PUT /v1/rules/login HTTP/1.1\r\nHost: {admin}\r\nSec-Fetch-Site: same-site\r\nContent-Type: application/json\r\nContent-Length: 15"
        );
        refused(
            &raw(admin, &h, r#"{"rate": "9/s"}"#).await,
            403,
            "sec-fetch-site",
        );
        let (status, v) = get(admin, "/v1/rules/login").await;
        assert_eq!((status, &v["rate"]), (200, &Value::from("5/s")), "{v}");
        // A key with state, for /v1/limits.
        let mut conn = crate::common::RawConn::ready(node.addr.parse().unwrap()).await;
        let batch = crate::common::batch_of(vec![vec![crate::common::rule(
            "user:secret-key",
            "login",
            1,
        )]]);
        assert!(crate::common::allowed(&conn.check(1, batch).await[0]));

        for path in [
            "/v1/rules",
            "/v1/limits/user:secret-key",
            "/",
            "/metrics",
            "/nowhere",
        ] {
            for host in [
                "evil.example".to_owned(),
                format!("evil.example:{port}"),
                format!("localhost.evil.example:{port}"),
            ] {
                let answer = raw(admin, &format!("GET {path} HTTP/1.1\r\nHost: {host}"), "").await;
                refused(&answer, 421, "host");
                let text = answer.1.to_string();
                assert!(
                    !text.contains("login") && !text.contains("secret-key"),
                    "{text}"
                );
            }
        }
        // The probes answer any name; addresses and localhost read all.
        let probe = raw(admin, "GET /readyz HTTP/1.1\r\nHost: lb.example", "").await;
        assert_eq!(probe.0, 200, "{}", probe.1);
        for host in [
            admin.to_owned(),
            format!("localhost:{port}"),
            format!("[::1]:{port}"),
        ] {
            let (status, v) = raw(
                admin,
                &format!("GET /v1/rules HTTP/1.1\r\nHost: {host}"),
                "",
            )
            .await;
            assert_eq!(status, 200, "{host}: {v}");
            assert_eq!(v["rules"][0]["name"], "login", "{v}");
        }
        let (status, v) = get(admin, "/v1/limits/user:secret-key").await;
        assert_eq!(
            (status, &v["usage"][0]["used"]),
            (200, &Value::from(1)),
            "{v}"
        );
        // A refusal is counted by check.
        let (_, metrics) = get(admin, "/metrics").await;
        let metrics = metrics.as_str().unwrap_or_default().to_owned();
        assert!(
            metrics.contains("tollgate_admin_refused_total{check=\"host\"} 15"),
            "{metrics}"
        );
        assert!(
            metrics.contains("tollgate_admin_refused_total{check=\"content-type\"} 2"),
            "{metrics}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn names_behind_a_proxy_are_listed_with_admin_allowed_hosts() {
        let node = Node::start(
            &free_addr(),
            &[
                "--admin-allowed-hosts",
                "tollgate-admin.example,Proxy.Example.",
            ],
        );
        let admin = node.admin.as_str();
        for host in ["tollgate-admin.example:7701", "proxy.example", admin] {
            let (status, v) = raw(
                admin,
                &format!("GET /v1/rules HTTP/1.1\r\nHost: {host}"),
                "",
            )
            .await;
            assert_eq!(status, 200, "{host}: {v}");
        }
        refused(
            &raw(admin, "GET /v1/rules HTTP/1.1\r\nHost: evil.example", "").await,
            421,
            "host",
        );
        // A listed name still needs its own origin to change anything.
        let head = "POST /v1/rules/reload HTTP/1.1\r\nHost: proxy.example\r\nOrigin: https://evil.example\r\nContent-Length: 0";
        refused(&raw(admin, head, "").await, 403, "origin");
    }
}
