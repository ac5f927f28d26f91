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

    /// `--etcd` (bare `HOST:PORT`: https is implied by the CA).
    fn etcd(&self) -> Vec<String> {
        flags(&["--etcd", &self.endpoint])
    }

    /// `--etcd-tls-ca`.
    fn ca(&self, ca: &Path) -> Vec<String> {
        flags(&["--etcd-tls-ca", &ca.to_string_lossy()])
    }

    /// The client certificate and its key.
    fn cert(&self) -> Vec<String> {
        flags(&[
            "--etcd-cert",
            &self.client.cert.to_string_lossy(),
            "--etcd-key",
            &self.client.key.to_string_lossy(),
        ])
    }

    /// The `tollgate` user, its password read from a file.
    fn user(&self) -> Vec<String> {
        flags(&[
            "--etcd-user",
            "tollgate",
            "--etcd-password-file",
            &self.password_file.to_string_lossy(),
        ])
    }

    /// Every flag a client needs.
    fn good_flags(&self) -> Vec<String> {
        [self.etcd(), self.ca(&self.ca), self.cert(), self.user()].concat()
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

/// Environment variables given to a command.
type Env<'a> = &'a [(&'a str, &'a str)];

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
    let init = [
        flags(&["init", "--cluster", "sec", "--shards", "1"]),
        s.good_flags(),
    ]
    .concat();
    let (code, out) = cluster_cli(&init, &[]);
    assert_eq!(code, 0, "cluster init with the right credentials: {out}");

    // The endpoint written https://, the password from the environment.
    let https = flags(&["--etcd", &format!("https://{}", s.endpoint)]);
    let user = flags(&["--etcd-user", "tollgate"]);
    let env_access = [https.clone(), s.ca(&s.ca), s.cert(), user.clone()].concat();
    let password = [("TOLLGATE_ETCD_PASSWORD", PASSWORD)];
    let (code, out) = status_with(&env_access, &password, "sec");
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("cluster sec: 1 shards"), "{out}");

    let wrong = [("TOLLGATE_ETCD_PASSWORD", "not-the-password")];
    let closed = flags(&["--etcd", &free_addr()]);
    // (what, flags, environment, what the error must say); each exits 2.
    let refused: [(&str, Vec<String>, Env, &[&str]); 8] = [
        (
            "a wrong password",
            env_access.clone(),
            &wrong,
            &["etcd refused connect", "authentication failed"],
        ),
        (
            "no user: etcd refuses the request itself",
            [s.etcd(), s.ca(&s.ca), s.cert()].concat(),
            &[],
            &["etcd refused read the cluster", "permission denied"],
        ),
        (
            "a CA that did not sign etcd's certificate",
            [s.etcd(), s.ca(&s.rogue_ca), s.cert(), s.user()].concat(),
            &[],
            &["TLS with etcd failed", "UnknownIssuer"],
        ),
        (
            "no client certificate: etcd ends the handshake",
            [s.etcd(), s.ca(&s.ca), s.user()].concat(),
            &[],
            &["TLS with etcd failed"],
        ),
        (
            "nothing listens: the last connection error",
            closed,
            &[],
            &["no member reached within 2s", "connect"],
        ),
        // Refused before anything is sent.
        (
            "a certificate without its key",
            [s.etcd(), s.ca(&s.ca), s.cert()[..2].to_vec()].concat(),
            &[],
            &["--etcd-cert needs --etcd-key"],
        ),
        (
            "https without a CA",
            https,
            &[],
            &["https needs --etcd-tls-ca"],
        ),
        (
            "a user without a password",
            [s.etcd(), s.ca(&s.ca), s.cert(), user].concat(),
            &[],
            &["--etcd-user needs a password"],
        ),
    ];
    for (what, access, env, says) in refused {
        let (code, out) = status_with(&access, env, "sec");
        assert_eq!(code, 2, "{what}: {out}");
        for needle in says {
            assert!(out.contains(needle), "{what}: {out}");
        }
    }
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
    let init = [
        flags(&["init", "--cluster", "sec", "--shards", "1"]),
        s.good_flags(),
    ]
    .concat();
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

    let wrong = flags(&["--etcd-user", "tollgate", "--etcd-password", "nope"]);
    let refused: [(&str, Vec<String>, &str); 4] = [
        (
            "a wrong password",
            [s.etcd(), s.ca(&s.ca), s.cert(), wrong].concat(),
            "authentication failed",
        ),
        (
            "no user",
            [s.etcd(), s.ca(&s.ca), s.cert()].concat(),
            "etcd refused",
        ),
        (
            "an untrusted CA",
            [s.etcd(), s.ca(&s.rogue_ca), s.cert(), s.user()].concat(),
            "TLS with etcd failed",
        ),
        (
            "a certificate without its key",
            [s.etcd(), s.ca(&s.ca), s.cert()[..2].to_vec()].concat(),
            "--etcd-cert needs --etcd-key",
        ),
    ];
    for (what, access, says) in refused {
        let (code, out) = serve_refused(&access);
        assert_eq!(code, 2, "{what}: {out}");
        assert!(out.contains(says), "{what}: {out}");
    }
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
