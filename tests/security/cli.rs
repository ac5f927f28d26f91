//! The CLI presents the tokens a protected server asks for: the client
//! token (`--auth-token`, `TOLLGATE_AUTH_TOKEN`) to the protocol port, the
//! admin token (`--admin-token`, `TOLLGATE_ADMIN_TOKEN`) to the admin API.

use crate::harness::{free_addr, Node, BIN};
use std::process::Command;

/// `tollgate ARGS` with `env`: exit code, stdout, stderr.
fn tollgate(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("TOLLGATE_AUTH_TOKEN")
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_cli_presents_the_client_and_admin_tokens() {
    let node = Node::start(
        &free_addr(),
        &[
            "--auth-token",
            "client-token-for-cli",
            "--admin-token",
            "admin-tok",
        ],
    );
    let server = node.addr.as_str();
    let (code, _, err) = tollgate(&["ping", "--server", server], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("authentication failed"), "{err}");
    let (code, out, err) = tollgate(
        &[
            "ping",
            "--server",
            server,
            "--auth-token",
            "client-token-for-cli",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("PONG"), "{out}");
    let token = [("TOLLGATE_AUTH_TOKEN", "client-token-for-cli")];
    let (code, out, err) = tollgate(
        &[
            "check",
            "--server",
            server,
            "--key",
            "rl:{cli}:k",
            "--rate",
            "5/s",
        ],
        &token,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("allowed"), "{out}");
    // Read-only STATUS stays open to clients.
    let (code, out, err) = tollgate(&["status", "--server", server], &token);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("role: primary"), "{out}");

    let admin = node.admin.as_str();
    let (code, _, err) = tollgate(&["rules", "--admin", admin], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401") && err.contains("admin token"), "{err}");
    let (code, _, err) = tollgate(
        &["rules", "--admin", admin],
        &[("TOLLGATE_ADMIN_TOKEN", "admin-tok")],
    );
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tollgate(
        &[
            "usage",
            "rl:{cli}:k",
            "--admin",
            admin,
            "--admin-token",
            "admin-tok",
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tollgate(
        &["promote", "--admin", admin, "--admin-token", "admin-tok"],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("is already primary at epoch 1"), "{out}");
}
