//! Protected mode and pair mode: a server refuses to start (or to run on
//! a listener it is handed) with a port beyond loopback that asks for no
//! credentials, or in pair mode without a cluster secret, and says how to
//! fix it; with authentication, or `--insecure` said explicitly, it starts.

use crate::common::PATIENCE;
use crate::harness::{Node, BIN};
use crate::process::serve_until_logged;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate::config::ServerConfig;
use tollgate::server::Server;

/// Runs `tollgate serve ARGS` expecting it to refuse to start: its exit
/// code and what it printed.
fn refused_to_start(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .env_remove("TOLLGATE_CLUSTER_SECRET")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.code().unwrap_or(-1), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("`serve {args:?}` started: it should have refused");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn protected_mode_refuses_open_ports_beyond_loopback() {
    let (code, err) = refused_to_start(&["--listen", "0.0.0.0:0", "--admin", "none"], &[]);
    assert_eq!(code, 2, "{err}");
    for hint in [
        "0.0.0.0:0",
        "--auth-token",
        "--tls-client-ca",
        "127.0.0.1",
        "--insecure",
    ] {
        assert!(err.contains(hint), "{err} lacks {hint}");
    }
    let (code, err) = refused_to_start(&["--listen", "127.0.0.1:0", "--admin", "0.0.0.0:0"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--admin-token"), "{err}");
}

#[test]
fn pair_mode_without_a_cluster_secret_refuses_to_start() {
    let (code, err) = refused_to_start(&["--listen", "127.0.0.1:0", "--peer", "127.0.0.1:1"], &[]);
    assert_eq!(code, 2, "{err}");
    for hint in ["--cluster-secret", "TOLLGATE_CLUSTER_SECRET", "--insecure"] {
        assert!(err.contains(hint), "{err} lacks {hint}");
    }
    // A secret equal to the client token is refused too.
    let (code, err) = refused_to_start(
        &["--listen", "127.0.0.1:0", "--replica-of", "127.0.0.1:1"],
        &[
            ("TOLLGATE_CLUSTER_SECRET", "the-same-secret-twice"),
            ("TOLLGATE_AUTH_TOKEN", "the-same-secret-twice"),
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("must differ"), "{err}");
}

#[test]
fn a_short_client_token_or_cluster_secret_refuses_to_start() {
    for (var, name) in [
        ("TOLLGATE_AUTH_TOKEN", "--auth-token"),
        ("TOLLGATE_CLUSTER_SECRET", "--cluster-secret"),
    ] {
        let (code, err) = refused_to_start(
            &["--listen", "127.0.0.1:0", "--admin", "none"],
            &[(var, "fifteen-bytes!!")],
        );
        assert_eq!(code, 2, "{err}");
        for hint in [name, "15 bytes", "at least 16 bytes", "openssl rand"] {
            assert!(err.contains(hint), "{err} lacks {hint}");
        }
    }
}

#[tokio::test]
async fn open_ports_beyond_loopback_start_with_auth_or_insecure() {
    // --insecure, said explicitly.
    let node = Node::start("0.0.0.0:0", &["--insecure"]);
    drop(node);
    // A client token from the environment and an admin token.
    let serving = serve_until_logged(
        &["--listen", "0.0.0.0:0", "--admin", "0.0.0.0:0"],
        &[
            ("TOLLGATE_AUTH_TOKEN", "client-t0ken-from-env"),
            ("TOLLGATE_ADMIN_TOKEN", "adm1n"),
        ],
        "tollgate serving",
    )
    .await;
    assert!(serving.is_some());
}

#[tokio::test]
async fn the_server_refuses_an_open_listener_it_is_handed() {
    // Embedding code that binds its own listener gets the same check.
    let config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let err = Server::new(config)
        .unwrap()
        .run(listener, CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(err.to_string().contains("--auth-token"), "{err}");
    let mut config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
    config.auth.auth_token = Some("t".into());
    let server = Server::new(config).unwrap();
    let stop = CancellationToken::new();
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let running = tokio::spawn(server.run(listener, stop.clone()));
    stop.cancel();
    running.await.unwrap().unwrap();
}
