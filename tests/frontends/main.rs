//! The drop-in front ends driven by real clients nobody on the team wrote:
//! `redis-cli`, redis-py and `redis-benchmark` against the RESP front end
//! (`--resp`), each against a real server on 127.0.0.1:0 with a manual
//! clock, so every number a reply carries is known in advance. The
//! The Envoy rate limit service (feature `envoy`) is driven by a Python
//! grpcio client generated from the project's proto/ files. The
//! programs come from scripts/deps.sh (redis-tools, the virtualenv
//! target/py); a missing one fails its test, never skips it. The raw-socket
//! tests feed the parser what no client sends (oversized, malformed).

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "envoy")]
mod envoy_rls;
mod resp_bench;
mod resp_cli;
mod resp_py;
mod resp_wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Output;

/// Runs `program` with `args` to completion (within the test's patience)
/// and returns what it printed; panics, naming scripts/deps.sh, when the
/// program is missing.
pub async fn run(program: &str, args: &[String]) -> Output {
    let mut command = std::process::Command::new(program);
    command.args(args);
    let child = tokio::task::spawn_blocking(move || command.output());
    tokio::time::timeout(common::PATIENCE * 6, child)
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} did not finish"))
        .expect("the blocking task runs")
        .unwrap_or_else(|e| {
            panic!("cannot run {program} ({e}): run scripts/deps.sh, which installs it")
        })
}

/// The standard output of a program that must have succeeded.
pub fn stdout_of(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `redis-cli -h 127.0.0.1 -p PORT` followed by `words`.
pub async fn redis_cli(addr: SocketAddr, words: &[&str]) -> String {
    let mut args = vec![
        "-h".to_owned(),
        addr.ip().to_string(),
        "-p".to_owned(),
        addr.port().to_string(),
    ];
    args.extend(words.iter().map(|w| w.to_string()));
    let out = run("redis-cli", &args).await;
    stdout_of(&out, &format!("redis-cli {words:?}"))
}

/// The virtualenv's Python, where scripts/deps.sh installed redis-py.
pub fn python() -> PathBuf {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/py/bin/python3");
    assert!(
        py.exists(),
        "{} is missing: run scripts/deps.sh (it installs redis-py and grpcio there)",
        py.display()
    );
    py
}
