//! Decision events to a NATS broker that asks for TLS and credentials: a
//! real `nats-server` (TLS with an rcgen certificate, a user and password,
//! or a token, in its config file) and real `tollgate serve` processes
//! given the secrets through the environment. Events arrive with the right
//! settings; wrong credentials or a foreign CA are logged, naming what to
//! check, and the server keeps answering checks.

use crate::certs::{write_ca, Ca, Validity};
use crate::common::{allowed, batch_of, tb, RawConn, TempDir, PATIENCE};
use crate::harness::{eventually, free_addr, BIN};
use crate::process::KillOnDrop;
use futures_util::StreamExt;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SUBJECT: &str = "secure.decisions";
const USER: &str = "tollgate";
const PASSWORD: &str = "nats-password-for-tests";
const TOKEN: &str = "nats-token-for-tests";

/// A nats-server on 127.0.0.1 and a free port, from a config file.
struct Nats {
    addr: String,
    _child: KillOnDrop,
}

/// Starts `nats-server -c` with `config` (listen address added).
fn nats_server(dir: &Path, config: &str) -> Nats {
    let file = dir.join("nats.conf");
    std::fs::write(&file, format!("host: 127.0.0.1\nport: -1\n{config}")).unwrap();
    let mut child = Command::new("nats-server")
        .arg("-c")
        .arg(&file)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run nats-server ({e}): run scripts/deps.sh (Debian package nats-server)")
        });
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let child = KillOnDrop(child);
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| Some(l.split("client connections on ").nth(1)?.trim().to_owned()))
        .expect("nats-server listens");
    // Keep reading its log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Nats {
        addr,
        _child: child,
    }
}

/// The broker's TLS files: a CA and a certificate for 127.0.0.1.
struct Pki {
    dir: TempDir,
    ca: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Self {
        let dir = TempDir::new(name);
        let root = Ca::root("nats test root");
        let ca = write_ca(&dir.0, "ca.pem", &root.pem());
        root.issue("nats", Validity::Now).write(&dir.0, "nats");
        Self { dir, ca }
    }

    fn tls_block(&self) -> String {
        let path = |f: &str| self.dir.path(f).display().to_string();
        format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n}}\n",
            path("nats.crt"),
            path("nats.key")
        )
    }
}

/// A `tollgate serve` process (JSON logs kept) and its addresses.
struct Serve {
    addr: String,
    admin: String,
    logs: Arc<Mutex<Vec<Value>>>,
    _child: KillOnDrop,
}

impl Serve {
    /// Starts `serve` with `args` and `env`; returns once it serves.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Self {
        let addr = free_addr();
        let mut child = Command::new(BIN)
            .args(["serve", "--listen", &addr, "--admin", "127.0.0.1:0"])
            .args(["--log-format", "json", "--events-sample", "1"])
            .args(["--events-subject", SUBJECT])
            .args(args)
            .env_remove("TOLLGATE_CLUSTER_SECRET")
            .env_remove("TOLLGATE_EVENTS_USER")
            .env_remove("TOLLGATE_EVENTS_PASSWORD")
            .env_remove("TOLLGATE_EVENTS_TOKEN")
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let child = KillOnDrop(child);
        let logs: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = logs.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if v["fields"]["message"] == "tollgate serving" {
                    let _ = tx.send(v["fields"]["admin"].as_str().unwrap_or("").to_owned());
                }
                kept.lock().unwrap().push(v);
            }
        });
        let admin = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the server logs that it serves");
        Self {
            addr,
            admin,
            logs,
            _child: child,
        }
    }

    /// The first log line whose message is `message`.
    async fn logged(&self, message: &str) -> Value {
        eventually(message, || async {
            self.logs
                .lock()
                .unwrap()
                .iter()
                .find(|v| v["fields"]["message"] == message)
                .cloned()
        })
        .await
    }

    /// Checks `key` twice under a burst of 1: one allowed, one denied.
    async fn allow_then_deny(&self, key: &str) {
        let mut conn = RawConn::ready(self.addr.parse().unwrap()).await;
        let pair = || vec![tb(key, 1, 60_000, 1, 1)];
        let results = conn.check(1, batch_of(vec![pair(), pair()])).await;
        assert!(allowed(&results[0]) && !allowed(&results[1]), "{results:?}");
    }
}

/// The next event on `sub` for `key` (earlier ones skipped).
async fn event_for(sub: &mut async_nats::Subscriber, key: &str) -> Value {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let message = sub.next().await.expect("the subscription is open");
            let v: Value = serde_json::from_slice(&message.payload).expect("JSON");
            if v["key"] == key {
                return v;
            }
        }
    })
    .await
    .expect("an event arrives")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_nats_over_tls_with_a_password_from_the_environment() {
    let pki = Pki::new("events-tls");
    let auth = format!("authorization {{\n  user: {USER}\n  password: {PASSWORD}\n}}\n");
    let nats = nats_server(&pki.dir.0, &format!("{}{auth}", pki.tls_block()));
    let url = format!("tls://{}", nats.addr);
    let subscriber =
        async_nats::ConnectOptions::with_user_and_password(USER.into(), PASSWORD.into())
            .add_root_certificates(pki.ca.clone())
            .connect(url.as_str())
            .await
            .expect("the test's subscriber connects");
    let mut sub = subscriber.subscribe(SUBJECT).await.unwrap();
    subscriber.flush().await.unwrap();

    let ca = pki.ca.display().to_string();
    let server = Serve::start(
        &["--events", &url, "--events-tls-ca", &ca],
        &[
            ("TOLLGATE_EVENTS_USER", USER),
            ("TOLLGATE_EVENTS_PASSWORD", PASSWORD),
        ],
    );
    server.allow_then_deny("tls:key").await;
    let first = event_for(&mut sub, "tls:key").await;
    assert_eq!(first["decision"], "allowed", "{first}");
    let second = event_for(&mut sub, "tls:key").await;
    assert_eq!(second["decision"], "denied", "{second}");
    let connected = server.logged("decision events to NATS").await;
    assert_eq!(connected["fields"]["tls"], true, "{connected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_token_from_the_environment_is_presented() {
    let dir = TempDir::new("events-token");
    let nats = nats_server(&dir.0, &format!("authorization {{\n  token: {TOKEN}\n}}\n"));
    let url = format!("nats://{}", nats.addr);
    let subscriber = async_nats::ConnectOptions::with_token(TOKEN.into())
        .connect(url.as_str())
        .await
        .unwrap();
    let mut sub = subscriber.subscribe(SUBJECT).await.unwrap();
    subscriber.flush().await.unwrap();
    let server = Serve::start(&["--events", &url], &[("TOLLGATE_EVENTS_TOKEN", TOKEN)]);
    server.allow_then_deny("token:key").await;
    assert_eq!(
        event_for(&mut sub, "token:key").await["decision"],
        "allowed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_nats_credentials_or_ca_are_logged_and_checks_still_answered() {
    let pki = Pki::new("events-refused");
    let auth = format!("authorization {{\n  user: {USER}\n  password: {PASSWORD}\n}}\n");
    let nats = nats_server(&pki.dir.0, &format!("{}{auth}", pki.tls_block()));
    let url = format!("tls://{}", nats.addr);
    let ca = pki.ca.display().to_string();
    let foreign = write_ca(&pki.dir.0, "foreign.pem", &Ca::root("someone else").pem());
    let foreign = foreign.display().to_string();

    let cases = [
        (ca.as_str(), "not-the-password", "--events-password"),
        (foreign.as_str(), PASSWORD, "--events-tls-ca"),
    ];
    for (ca, password, named) in cases {
        let server = Serve::start(
            &[
                "--events",
                &url,
                "--events-tls-ca",
                ca,
                "--events-user",
                USER,
            ],
            &[("TOLLGATE_EVENTS_PASSWORD", password)],
        );
        let error = server
            .logged("decision events: cannot connect to NATS")
            .await;
        let hint = error["fields"]["hint"].as_str().unwrap_or_default();
        assert!(hint.contains(named), "{error}");
        assert_eq!(error["level"], "ERROR", "{error}");
        // The password never reaches the log.
        let logs = serde_json::to_string(&*server.logs.lock().unwrap()).unwrap();
        assert!(!logs.contains(PASSWORD) && !logs.contains("not-the-password"));
        // Checks are answered as before, events or not.
        for i in 0..3 {
            server.allow_then_deny(&format!("refused:{i}")).await;
        }
        let health = tollgate::admin_client::call(
            &server.admin,
            hyper::Method::GET,
            "/healthz",
            None,
            PATIENCE,
        )
        .await
        .unwrap();
        assert_eq!(health.status, 200);
    }
}

#[test]
fn credentials_must_come_whole() {
    let refused = |args: &[&str]| {
        let out = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--admin", "none"])
            .args(["--events", "nats://127.0.0.1:4222"])
            .args(args)
            .env_remove("TOLLGATE_EVENTS_USER")
            .env_remove("TOLLGATE_EVENTS_PASSWORD")
            .env_remove("TOLLGATE_EVENTS_TOKEN")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(refused(&["--events-user", "u"]).contains("--events-password"));
    assert!(refused(&["--events-password", "p"]).contains("--events-user"));
    let both = refused(&[
        "--events-token",
        "t",
        "--events-user",
        "u",
        "--events-password",
        "p",
    ]);
    assert!(both.contains("not both"), "{both}");
    let missing = refused(&["--events-tls-ca", "/nonexistent/ca.pem"]);
    assert!(missing.contains("--events-tls-ca"), "{missing}");
}
