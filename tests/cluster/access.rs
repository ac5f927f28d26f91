//! etcd with access control: its client port speaks TLS only and demands
//! a client certificate (`--client-cert-auth`), and `auth enable` is on
//! with a `tollgate` user allowed only the `/tollgate/` prefix. `tollgate
//! cluster init` / `status` and a `tollgate serve --etcd` node work with
//! the right CA, certificate and password; a wrong or missing password, an
//! untrusted CA or a missing client certificate fail with an error that
//! says so, and bad flag combinations are refused before anything is sent.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use etcd_client::Permission;
use tollgate::cluster::{init, load_topology, status, Etcd, EtcdAccess, EtcdSettings};

use crate::certs::{write_ca, Ca, Files, Validity};
use crate::common::TempDir;
use crate::etcd::{ClientTls, EtcdCluster};
use crate::nodes::{tollgate, LEASE_FLAGS};
use crate::procs::{free_addr, Node, BIN, CLUSTER_SECRET};
use crate::*;

const ROOT_PASSWORD: &str = "root-password-for-the-test";
const PASSWORD: &str = "tollgate-password-for-the-test";

/// A secured etcd and the files a client needs to reach it.
struct Secured {
    /// Kept running while the test runs.
    _etcd: EtcdCluster,
    /// etcd's endpoint, `HOST:PORT`.
    endpoint: String,
    /// The CA that signed etcd's and the client's certificates.
    ca: PathBuf,
    /// A CA that signed nothing etcd knows.
    rogue_ca: PathBuf,
    client: Files,
    password_file: PathBuf,
    _dir: TempDir,
}

impl Secured {
    async fn start(name: &str) -> Self {
        Self::start_with(name, &[]).await
    }

    /// [`start`](Self::start), etcd started with `extra` flags too.
    async fn start_with(name: &str, extra: &[&str]) -> Self {
        let dir = TempDir::new(name);
        let ca = Ca::root("etcd test CA");
        let server = ca.issue("etcd", Validity::Now).write(&dir.0, "etcd");
        // The client certificate's CN is no etcd user: with
        // --client-cert-auth etcd would take a CN as the user name when a
        // request carries no token.
        let client_leaf = ca.issue("tollgate-node", Validity::Now);
        let client = client_leaf.write(&dir.0, "client");
        let ca_file = write_ca(&dir.0, "ca.pem", &ca.pem());
        let rogue_ca = write_ca(&dir.0, "rogue.pem", &Ca::root("rogue CA").pem());
        let password_file = dir.path("password");
        std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
        let etcd = EtcdCluster::single_tls(
            ClientTls {
                cert: server.cert,
                key: server.key,
                ca_pem: ca.pem(),
                client_ca: Some(ca_file.clone()),
                probe: Some((client_leaf.chain.clone(), client_leaf.key.clone())),
            },
            extra,
        )
        .await;
        enable_auth(&etcd).await;
        let endpoint = etcd.endpoint(0);
        Secured {
            _etcd: etcd,
            endpoint,
            ca: ca_file,
            rogue_ca,
            client,
            password_file,
            _dir: dir,
        }
    }

    /// The TLS flags with `ca` as the CA (`https://` implied).
    fn tls_flags(&self, ca: &Path) -> Vec<String> {
        flags(&[
            "--etcd",
            &self.endpoint,
            "--etcd-tls-ca",
            &ca.to_string_lossy(),
            "--etcd-cert",
            &self.client.cert.to_string_lossy(),
            "--etcd-key",
            &self.client.key.to_string_lossy(),
        ])
    }

    /// Every flag a client needs, the password read from its file.
    fn good_flags(&self) -> Vec<String> {
        let mut f = self.tls_flags(&self.ca);
        f.extend(flags(&[
            "--etcd-user",
            "tollgate",
            "--etcd-password-file",
            &self.password_file.to_string_lossy(),
        ]));
        f
    }

    /// The library's own connection, as the `tollgate` user.
    async fn connect(&self) -> Etcd {
        let settings = EtcdSettings {
            access: EtcdAccess {
                tls_ca: Some(self.ca.clone()),
                cert: Some(self.client.cert.clone()),
                key: Some(self.client.key.clone()),
                user: Some("tollgate".into()),
                password: Some(PASSWORD.into()),
                password_file: None,
            },
            ..settings(vec![format!("https://{}", self.endpoint)])
        };
        Etcd::connect(&settings).await.expect("connect as tollgate")
    }
}

fn flags(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Root, and a `tollgate` user whose role may read and write `/tollgate/`
/// and nothing else; then `auth enable`.
async fn enable_auth(etcd: &EtcdCluster) {
    let mut c = etcd.probe(0).await.expect("the harness reaches etcd");
    c.user_add("root", ROOT_PASSWORD, None).await.unwrap();
    c.role_add("root").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.user_add("tollgate", PASSWORD, None).await.unwrap();
    c.role_add("tollgate").await.unwrap();
    c.role_grant_permission(
        "tollgate",
        Permission::read_write("/tollgate/").with_prefix(),
    )
    .await
    .unwrap();
    c.user_grant_role("tollgate", "tollgate").await.unwrap();
    c.auth_enable().await.unwrap();
}

/// `tollgate cluster ARGS` with `env`.
fn cluster_cli(args: &[String], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("cluster")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run tollgate cluster");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `cluster status` of cluster `name` with `access` flags: exit code and
/// output.
fn status_with(access: &[String], env: &[(&str, &str)], name: &str) -> (i32, String) {
    let mut args = flags(&["status", "--cluster", name, "--timeout", "2s"]);
    args.extend(access.iter().cloned());
    cluster_cli(&args, env)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reaches_etcd_over_mtls_as_an_etcd_user_and_says_why_it_cannot() {
    let s = Secured::start("etcd-access-cli").await;
    let mut init = flags(&["init", "--cluster", "sec", "--shards", "1"]);
    init.extend(s.good_flags());
    let (code, out) = cluster_cli(&init, &[]);
    assert_eq!(code, 0, "cluster init with the right credentials: {out}");

    // The password from the environment, the endpoint written https://.
    let mut env_flags = s.tls_flags(&s.ca);
    env_flags[1] = format!("https://{}", s.endpoint);
    env_flags.extend(flags(&["--etcd-user", "tollgate"]));
    let (code, out) = status_with(&env_flags, &[("TOLLGATE_ETCD_PASSWORD", PASSWORD)], "sec");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("cluster sec: 1 shards"), "{out}");

    let (code, out) = status_with(
        &env_flags,
        &[("TOLLGATE_ETCD_PASSWORD", "not-the-password")],
        "sec",
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("etcd refused connect") && out.contains("authentication failed"),
        "a wrong password: {out}"
    );

    // TLS right, no user: etcd refuses the request itself.
    let (code, out) = status_with(&s.tls_flags(&s.ca), &[], "sec");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("etcd refused"), "no user: {out}");

    // A CA that did not sign etcd's certificate: never connects.
    let mut rogue = s.tls_flags(&s.rogue_ca);
    rogue.extend(s.good_flags().split_off(8));
    let (code, out) = status_with(&rogue, &[], "sec");
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("TLS with etcd failed") && out.contains("UnknownIssuer"),
        "an untrusted CA: {out}"
    );

    // No client certificate: etcd ends the handshake.
    let mut no_cert = s.tls_flags(&s.ca);
    no_cert.truncate(4);
    no_cert.extend(s.good_flags().split_off(8));
    let (code, out) = status_with(&no_cert, &[], "sec");
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("TLS with etcd failed"),
        "no client certificate: {out}"
    );

    // Nothing listens there: the last connection error is reported.
    let closed = flags(&["--etcd", &free_addr(), "--timeout", "1s"]);
    let (code, out) = cluster_cli(
        &[flags(&["status", "--cluster", "sec"]), closed].concat(),
        &[],
    );
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("no member reached within 1s") && out.contains("connect"),
        "no etcd: {out}"
    );

    // Refused before anything is sent.
    let mut cert_only = s.tls_flags(&s.ca);
    cert_only.truncate(6);
    let (code, out) = status_with(&cert_only, &[], "sec");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--etcd-cert needs --etcd-key"), "{out}");
    let https_without_ca = flags(&["--etcd", &format!("https://{}", s.endpoint)]);
    let (code, out) = status_with(&https_without_ca, &[], "sec");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("https needs --etcd-tls-ca"), "{out}");
    let user_without_password = {
        let mut f = s.tls_flags(&s.ca);
        f.extend(flags(&["--etcd-user", "tollgate"]));
        f
    };
    let (code, out) = status_with(&user_without_password, &[], "sec");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--etcd-user needs a password"), "{out}");
}

/// `tollgate serve` in cluster mode with `access` flags, expected to fail
/// at start: its exit code and what it printed.
fn serve_refused(access: &[String]) -> (i32, String) {
    let mut args = flags(&[
        "serve",
        "--listen",
        &free_addr(),
        "--admin",
        "127.0.0.1:0",
        "--cluster",
        "sec",
        "--shard",
        "0",
    ]);
    args.extend(LEASE_FLAGS.iter().map(|s| s.to_string()));
    args.extend(access.iter().cloned());
    let mut child = Command::new(BIN)
        .args(&args)
        .env("TOLLGATE_CLUSTER_SECRET", CLUSTER_SECRET)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tollgate serve");
    let deadline = std::time::Instant::now() + PATIENCE;
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve with {access:?} should have stopped");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().expect("its output");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joins_over_mtls_as_an_etcd_user_and_is_refused_without_them() {
    let s = Secured::start("etcd-access-node").await;
    let mut init = flags(&["init", "--cluster", "sec", "--shards", "1"]);
    init.extend(s.good_flags());
    let (code, out) = cluster_cli(&init, &[]);
    assert_eq!(code, 0, "{out}");

    let mut node_flags = s.good_flags();
    node_flags.extend(flags(&["--cluster", "sec", "--shard", "0"]));
    node_flags.extend(LEASE_FLAGS.iter().map(|s| s.to_string()));
    let node_flags: Vec<&str> = node_flags.iter().map(String::as_str).collect();
    let node = Node::start(&free_addr(), &node_flags);
    let etcd = s.connect().await;
    let k = keys("sec");
    eventually("the node is shard 0's primary", || async {
        let st = status(&etcd, &k).await.ok()?;
        let primary = st.shards[0].primary.as_ref()?;
        (primary.addr == node.addr).then_some(())
    })
    .await;
    // Its routing table (read and watched from etcd as that user) serves.
    eventually("the node answers a check", || async {
        let (code, out, _) = tollgate(&[
            "check", "--server", &node.addr, "--key", "k", "--rate", "100/h", "--json",
        ]);
        (code == 0 && out.contains("\"allowed\":true")).then_some(())
    })
    .await;

    let mut wrong = s.tls_flags(&s.ca);
    wrong.extend(flags(&[
        "--etcd-user",
        "tollgate",
        "--etcd-password",
        "nope",
    ]));
    let (code, out) = serve_refused(&wrong);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("authentication failed"),
        "a wrong password: {out}"
    );

    let (code, out) = serve_refused(&s.tls_flags(&s.ca));
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("etcd refused"), "no user: {out}");

    let mut rogue = s.tls_flags(&s.rogue_ca);
    rogue.extend(s.good_flags().split_off(8));
    let (code, out) = serve_refused(&rogue);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("certificate"), "an untrusted CA: {out}");

    let mut cert_only = s.tls_flags(&s.ca);
    cert_only.truncate(6);
    let (code, out) = serve_refused(&cert_only);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("--etcd-cert needs --etcd-key"), "{out}");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_etcd_token_is_renewed_on_the_next_request() {
    // etcd forgets a token unused for a second (its default: 5 minutes,
    // as long as a standby may go without a unary request).
    let s = Secured::start_with("etcd-access-token", &["--auth-token-ttl", "1"]).await;
    let etcd = s.connect().await;
    let k = keys("ttl");
    let (_, version) = init(&etcd, &k, 1).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, again) = load_topology(&etcd, &k)
        .await
        .expect("a request after the token expired gets a new one");
    assert_eq!(again, version);
}
