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
