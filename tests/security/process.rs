//! Real `tollgate serve` processes: a pair replicates and fails over over
//! mutual TLS with the cluster secret, a wrong secret gets nowhere, and
//! SIGHUP reloads the certificate.

use crate::certs::{client_config, tls_connect, write_ca, Ca, Files, Validity};
use crate::common::{RawConn, TempDir, PATIENCE};
use crate::harness::{eventually, free_addr, Node, BIN};
use std::process::{Command, Stdio};
use std::sync::Arc;
use tollgate::admin_client::{request, AdminTarget};
use tollgate_protocol::{Algorithm, CheckResult, Limit, Pair, Request, Response};

/// Runs `tollgate serve ARGS` (JSON logs) with `env` until it logs a line
/// holding `needle`, which is returned (None: it exited first); then kills
/// it.
pub async fn serve_until_logged(
    args: &[&str],
    env: &[(&str, &str)],
    needle: &'static str,
) -> Option<String> {
    let child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .args(["--log-format", "json"])
        .env_remove("TOLLGATE_CLUSTER_SECRET")
        .envs(env.iter().copied())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(child);
    let stderr = child.0.stderr.take().unwrap();
    tokio::task::spawn_blocking(move || {
        std::io::BufRead::lines(std::io::BufReader::new(stderr))
            .map_while(Result::ok)
            .find(|l| l.contains(needle))
    })
    .await
    .unwrap()
}

pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The certificates of a pair under mutual TLS: one CA for nodes and
/// gateways, each node's certificate also its client certificate.
struct Pki {
    dir: TempDir,
    root: Ca,
    ca: std::path::PathBuf,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = TempDir::new(name);
        let root = Ca::root("tollgate test root");
        let ca = write_ca(&dir.0, "ca.pem", &root.pem());
        Self { dir, root, ca }
    }

    fn node(&self, name: &str) -> Files {
        self.root
            .issue(name, Validity::Now)
            .write(&self.dir.0, name)
    }

    /// `serve` flags for a node of the pair with its certificate.
    fn flags(&self, files: &Files) -> Vec<String> {
        let ca = self.ca.display().to_string();
        vec![
            "--tls-cert".into(),
            files.cert.display().to_string(),
            "--tls-key".into(),
            files.key.display().to_string(),
            "--tls-client-ca".into(),
            ca.clone(),
            "--tls-ca".into(),
            ca,
        ]
    }

    fn admin(&self, addr: &str) -> AdminTarget {
        AdminTarget::plain(addr).with_ca(&self.ca).unwrap()
    }

    /// A gateway's protocol connection: TLS with its client certificate.
    async fn gateway(&self, addr: &str) -> RawConn {
        let leaf = self.root.issue("gateway", Validity::Now);
        let config = client_config(&self.root.pem(), Some(&leaf));
        tls_conn(addr, config)
            .await
            .expect("the gateway is admitted")
    }
}

/// A TLS connection through HELLO.
async fn tls_conn(addr: &str, config: Arc<rustls::ClientConfig>) -> std::io::Result<RawConn> {
    let (mut conn, _) = tls_connect(addr, config).await?;
    match conn.hello(None).await {
        Some(Response::HelloOk { .. }) => Ok(conn),
        other => Err(std::io::Error::other(format!("HELLO: {other:?}"))),
    }
}

async fn replication(pki: &Pki, admin: &str) -> serde_json::Value {
    request(
        &pki.admin(admin),
        hyper::Method::GET,
        "/v1/replication",
        None,
        PATIENCE,
    )
    .await
    .map(|a| a.json())
    .unwrap_or_default()
}

fn hot(key: &str) -> Pair {
    Pair {
        key: bytes::Bytes::copy_from_slice(key.as_bytes()),
        limit: Limit {
            algorithm: Algorithm::TokenBucket,
            count: 1,
            period_ms: 3_600_000,
            burst: 5,
        }
        .into(),
        cost: 1,
    }
}

/// Charges `key` once on `conn`: whether it passed.
async fn charge(conn: &mut RawConn, id: u32, key: &str) -> bool {
    let mut batch = tollgate_protocol::CheckBatch::default();
    batch.push(hot(key));
    matches!(&conn.check(id, batch).await[0], CheckResult::Decision(d) if d.allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_replicates_and_fails_over_over_mutual_tls() {
    let pki = Pki::new("pair-mtls");
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let a_flags = pki.flags(&pki.node("node-a"));
    let b_flags = pki.flags(&pki.node("node-b"));
    let with = |flags: &[String], more: &[&str]| -> Vec<String> {
        flags
            .iter()
            .cloned()
            .chain(more.iter().map(|s| s.to_string()))
            .collect()
    };
    let a_args = with(&a_flags, &["--peer", &b_addr]);
    let a = Node::start(
        &a_addr,
        &a_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let b_args = with(
        &b_flags,
        &[
            "--replica-of",
            &a_addr,
            "--peer",
            &a_addr,
            "--admin-token",
            "adm",
        ],
    );
    let b = Node::start(
        &b_addr,
        &b_args.iter().map(String::as_str).collect::<Vec<_>>(),
    );

    eventually("A settles as primary", || async {
        (replication(&pki, &a.admin).await["role"] == "primary").then_some(())
    })
    .await;
    let mut gw = pki.gateway(&a_addr).await;
    for i in 0..5 {
        assert!(charge(&mut gw, 10 + i, "rl:{tls}:login").await);
    }
    assert!(!charge(&mut gw, 20, "rl:{tls}:login").await);
    let primary_offset = replication(&pki, &a.admin).await["offset"]
        .as_u64()
        .unwrap();
    let b_admin = pki.admin(&b.admin).with_token(Some("adm".into()));
    eventually("the standby syncs over TLS", || async {
        let v = request(
            &b_admin,
            hyper::Method::GET,
            "/v1/replication",
            None,
            PATIENCE,
        )
        .await
        .ok()?
        .json();
        (v["synced"] == 1 && v["offset"].as_u64()? >= primary_offset).then_some(())
    })
    .await;

    // The operator promotes B with the CLI over HTTPS; A, probing B over
    // TLS, steps down and follows it.
    let out = Command::new(BIN)
        .args(["promote", "--admin", &b.admin, "--tls-ca"])
        .arg(&pki.ca)
        .env("TOLLGATE_ADMIN_TOKEN", "adm")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains(&format!("{b_addr} promoted to primary at epoch 2")),
        "{text}"
    );
    eventually("the old primary follows the new one", || async {
        let v = replication(&pki, &a.admin).await;
        (v["role"] == "standby" && v["primary"] == b_addr.as_str() && v["synced"] == 1)
            .then_some(())
    })
    .await;
    // The exhausted key stayed exhausted across the failover.
    let mut gw = pki.gateway(&b_addr).await;
    assert!(!charge(&mut gw, 30, "rl:{tls}:login").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_with_the_wrong_secret_gets_nothing() {
    let a = Node::start(&free_addr(), &[]);
    let refused = serve_until_logged(
        &[
            "--listen",
            &free_addr(),
            "--admin",
            "none",
            "--replica-of",
            &a.addr,
        ],
        &[("TOLLGATE_CLUSTER_SECRET", "not-the-pair-secret")],
        "replication connection ended",
    )
    .await
    .expect("the standby logs why it cannot replicate");
    assert!(
        refused.contains("AuthFailed") || refused.contains("authentication"),
        "{refused}"
    );
    let v = tollgate::admin_client::call(
        &a.admin,
        hyper::Method::GET,
        "/v1/replication",
        None,
        PATIENCE,
    )
    .await
    .unwrap()
    .json();
    assert_eq!(v["replica_connected"], 0);
    assert_eq!(v["full_syncs"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_keeps_open_connections() {
    let pki = Pki::new("sighup");
    let first = pki.root.issue("first", Validity::Now);
    let files = first.write(&pki.dir.0, "node");
    let flags = [
        "--tls-cert",
        &files.cert.display().to_string(),
        "--tls-key",
        &files.key.display().to_string(),
        "--tls-poll",
        "0s",
    ]
    .map(str::to_owned);
    let node = Node::start(
        &free_addr(),
        &flags.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let trust = || client_config(&pki.root.pem(), None);
    let presented = |addr: String| async move { Some(tls_connect(&addr, trust()).await.ok()?.1) };
    assert_eq!(presented(node.addr.clone()).await, Some(first.der.clone()));
    let mut old = tls_conn(&node.addr, trust()).await.unwrap();

    let second = pki.root.issue("second", Validity::Now);
    second.write(&pki.dir.0, "node");
    // Not polled: still the first until the signal.
    assert_eq!(presented(node.addr.clone()).await, Some(first.der.clone()));
    let sent = Command::new("kill")
        .args(["-HUP", &node.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    eventually("new handshakes present the new certificate", || {
        let (addr, want) = (node.addr.clone(), second.der.clone());
        async move { (presented(addr).await? == want).then_some(()) }
    })
    .await;
    old.send(7, &Request::Ping).await;
    assert!(matches!(old.recv().await, (7, Response::Pong)));
    assert!(!node.logged("TLS certificate reloaded").is_empty());
}
