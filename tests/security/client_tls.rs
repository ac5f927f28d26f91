//! The client crate and the CLI over TLS (`ClientConfig::tls`,
//! `--tls-ca`): a server under TLS is reached through a CA file, and not
//! by a client that trusts another CA or speaks plain TCP.

use crate::certs::{write_ca, Ca, Validity};
use crate::common::{tb, TempDir, TestServer, PATIENCE};
use crate::harness::BIN;
use std::process::Command;
use tollgate_client::tls::tls_trusting;
use tollgate_client::{Client, ClientConfig, Outcome};

fn config(tls: Option<std::sync::Arc<rustls::ClientConfig>>) -> ClientConfig {
    ClientConfig {
        deadline: PATIENCE,
        connect_timeout: PATIENCE,
        fallback: None,
        tls,
        ..ClientConfig::default()
    }
}

/// `tollgate ARGS`: exit code, stdout, stderr (off the runtime's threads,
/// which serve the in-process server meanwhile).
async fn tollgate(args: Vec<String>) -> (i32, String, String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN)
            .args(&args)
            .env_remove("TOLLGATE_AUTH_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_and_the_cli_speak_tls_verified_by_a_ca_file() {
    let dir = TempDir::new("client-tls");
    let root = Ca::root("tollgate test root");
    let files = root.issue("server", Validity::Now).write(&dir.0, "server");
    let ca = write_ca(&dir.0, "ca.pem", &root.pem());
    let other = write_ca(&dir.0, "other.pem", &Ca::root("another root").pem());
    let server = TestServer::start_with(move |c| {
        c.tls.tls_cert = Some(files.cert);
        c.tls.tls_key = Some(files.key);
    })
    .await;
    let addr = server.addr.to_string();

    let client = Client::connect(addr.clone(), config(Some(tls_trusting(&ca).unwrap())))
        .await
        .expect("the client connects over TLS");
    let decide = |client: Client| async move {
        let p = tb("rl:{tls}:k", 1, 60_000, 1, 1);
        match client.check(p.key, p.limit, p.cost).await {
            Outcome::Decided(d) => d.allowed,
            other => panic!("{other:?}"),
        }
    };
    assert!(decide(client.clone()).await);
    assert!(!decide(client).await, "the server counted the first check");

    let wrong = Client::connect(addr.clone(), config(Some(tls_trusting(&other).unwrap()))).await;
    assert!(wrong.is_err(), "a server signed by another CA is trusted");
    let plain = Client::connect(addr.clone(), config(None)).await;
    assert!(plain.is_err(), "plain TCP got through to a TLS port");

    let cli = |ca: &std::path::Path| {
        let args = [
            "ping",
            "--server",
            &addr,
            "--tls-ca",
            &ca.display().to_string(),
        ];
        tollgate(args.map(String::from).to_vec())
    };
    let (code, out, err) = cli(&ca).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("PONG"), "{out}");
    let (code, _, err) = cli(&other).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot reach"), "{err}");
    let (code, _, err) = tollgate(vec!["ping".into(), "--server".into(), addr.clone()]).await;
    assert_eq!(code, 2, "{err}");
    server.stop().await;
}
