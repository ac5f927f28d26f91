//! The real `tollgate` binary: `serve` on defaults, `check` (every
//! algorithm), `release`, `ping`, `health` here; flags, `--print-config`,
//! config files, rules at start and on SIGHUP, and the RESP front end from
//! the command line in `config.rs`; a graceful exit on SIGTERM;
//! `--huge-pages` in `huge_pages.rs`.

mod config;
mod huge_pages;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// A `tollgate serve` child on 127.0.0.1:0 (admin API too); the ports are
/// read from its log.
struct ServeProcess {
    child: Child,
    addr: String,
    admin: String,
    /// The RESP front end's address ("none" unless `--resp`).
    resp: String,
    /// Log lines after the "serving" one.
    log: std::sync::mpsc::Receiver<String>,
}

impl ServeProcess {
    fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // The receiver gone: stop reading, closing the pipe.
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (addr, admin, resp) = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(20))
                .expect("server logs its address");
            let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
            if v["fields"]["message"] == "tollgate serving" {
                let field = |name: &str| v["fields"][name].as_str().unwrap().to_owned();
                break (field("listen"), field("admin"), field("resp"));
            }
        };
        ServeProcess {
            child,
            addr,
            admin,
            resp,
            log: rx,
        }
    }

    /// Waits for a log line whose message is `message`; returns it as JSON.
    fn wait_for_log(&self, message: &str) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .log
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no log line {message:?}"));
            let v: serde_json::Value = serde_json::from_str(&line).expect("json log line");
            if v["fields"]["message"] == message {
                return v;
            }
        }
    }

    fn signal(&self, name: &str) {
        let pid = self.child.id().to_string();
        let status = Command::new("kill").args([name, &pid]).status().unwrap();
        assert!(status.success());
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tollgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn decisions(stdout: &str) -> Vec<serde_json::Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[test]
fn check_gives_the_seed_token_bucket_numbers() {
    let server = ServeProcess::start(&[]);
    let key = "rl:{acme}:search";
    let base = [
        "check",
        "--server",
        &server.addr,
        "--key",
        key,
        "--rate",
        "5/s",
        "--burst",
        "10",
        "--json",
    ];

    // 12 at once: 10 allowed, 2 denied with retry-after 0.2 s.
    let first = Instant::now();
    let (code, out, err) = tollgate(&[&base[..], &["--repeat", "12"]].concat());
    assert_eq!(code, 0, "{err}");
    let d = decisions(&out);
    assert_eq!(d.len(), 12);
    assert!(d[..10].iter().all(|d| d["allowed"] == true));
    assert_eq!(d[9]["remaining"], 0);
    for denied in &d[10..] {
        assert_eq!(denied["allowed"], false);
        assert_eq!(denied["limit"], 10);
        assert_eq!(denied["retry_after_ms"], 200);
    }

    // About a second later: about 5 more (one per 200 ms elapsed).
    std::thread::sleep(Duration::from_secs(1));
    let (code, out, _) = tollgate(&[&base[..], &["--repeat", "10"]].concat());
    let elapsed = first.elapsed();
    assert_eq!(code, 0);
    let allowed = decisions(&out)
        .iter()
        .filter(|d| d["allowed"] == true)
        .count();
    let refilled = (elapsed.as_millis() / 200).min(10) as usize;
    assert!(
        (5..=refilled.max(5)).contains(&allowed),
        "{allowed} allowed after {elapsed:?}"
    );

    // Human output and PEEK.
    let (code, out, _) = tollgate(&[
        "check",
        "--server",
        &server.addr,
        "--key",
        "other",
        "--rate",
        "5/s",
        "--peek",
    ]);
    assert_eq!(code, 0);
    assert!(out.starts_with("allowed limit=5 remaining=4"), "{out}");
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn sliding_window_and_cost_from_the_cli() {
    let server = ServeProcess::start(&[]);
    let args = |cost: &str| {
        vec![
            "check".to_owned(),
            "--server".into(),
            server.addr.clone(),
            "--key".into(),
            "sw".into(),
            "--algorithm".into(),
            "sliding-window".into(),
            "--rate".into(),
            "100/min".into(),
            "--cost".into(),
            cost.into(),
            "--json".into(),
        ]
    };
    let run = |cost: &str| {
        let a = args(cost);
        tollgate(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (code, out, _) = run("60");
    assert_eq!(code, 0);
    assert_eq!(decisions(&out)[0]["remaining"], 40);
    let (_, out, _) = run("41");
    let d = &decisions(&out)[0];
    assert_eq!(d["allowed"], false);
    // Over the limit entirely: never.
    let (_, out, _) = run("101");
    assert_eq!(
        decisions(&out)[0]["retry_after_ms"],
        serde_json::Value::Null
    );
    drop(server);
}

#[test]
fn every_algorithm_inline_from_the_cli_then_release() {
    let server = ServeProcess::start(&[]);
    // Six identical checks in one frame are evaluated at one server instant,
    // so how many pass does not depend on timing.
    for (name, flags, passes) in [
        ("token-bucket", &["--rate", "5/s", "--burst", "3"][..], 3),
        ("sliding-window", &["--rate", "4/min"], 4),
        ("fixed-window", &["--rate", "8/min", "--window", "30s"], 4),
        ("sliding-log", &["--rate", "4/min"], 4),
        ("leaky-bucket", &["--rate", "1/min", "--burst", "2"], 2),
        (
            "concurrency",
            &["--max-in-flight", "2", "--lease-ttl", "1m"],
            2,
        ),
    ] {
        let key = format!("cli:{name}");
        let mut args = vec![
            "check",
            "--server",
            &server.addr,
            "--key",
            &key,
            "--algorithm",
            name,
            "--repeat",
            "6",
            "--json",
        ];
        args.extend_from_slice(flags);
        let (code, out, err) = tollgate(&args);
        assert_eq!(code, 0, "{name}: {err}");
        let d = decisions(&out);
        let allowed = d.iter().filter(|d| d["allowed"] == true).count();
        assert_eq!(allowed, passes, "{name}: {out}");
        let leases = d.iter().filter(|d| d.get("lease").is_some()).count();
        let expected = if name == "concurrency" { passes } else { 0 };
        assert_eq!(leases, expected, "{name}: {out}");
    }

    // Release one of the concurrency leases, then once more.
    let (_, out, _) = tollgate(&[
        "check",
        "--server",
        &server.addr,
        "--key",
        "cli:concurrency",
        "--algorithm",
        "concurrency",
        "--max-in-flight",
        "2",
        "--lease-ttl",
        "1m",
        "--peek",
        "--json",
    ]);
    assert_eq!(decisions(&out)[0]["allowed"], false, "both slots held");
    let (_, out, _) = tollgate(&[
        "check",
        "--server",
        &server.addr,
        "--key",
        "cli:released",
        "--rate",
        "1/min",
        "--algorithm",
        "concurrency",
        "--json",
    ]);
    let lease = decisions(&out)[0]["lease"].as_u64().expect("a lease");
    let release = |lease: u64| {
        let lease = lease.to_string();
        tollgate(&[
            "release",
            "--server",
            &server.addr,
            "--key",
            "cli:released",
            "--lease",
            &lease,
        ])
    };
    let (code, out, err) = release(lease);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("released lease"), "{out}");
    let (code, out, _) = release(lease);
    assert_eq!(code, 1);
    assert!(out.contains("was not held"), "{out}");

    // Refund from the CLI: give back 2 of the sliding log's 4.
    let (code, out, err) = tollgate(&[
        "check",
        "--server",
        &server.addr,
        "--key",
        "cli:sliding-log",
        "--algorithm",
        "sliding-log",
        "--rate",
        "4/min",
        "--cost",
        "2",
        "--refund",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(decisions(&out)[0]["remaining"], 2);
    drop(server);
}

/// With the reader of its log gone (stderr a closed pipe: a log shipper
/// that died), the server keeps serving and still exits cleanly on
/// SIGTERM; a line it cannot write is dropped. (tracing-subscriber told of
/// a failed write with `eprintln!`, which panics on a closed stderr: the
/// server died at its next log line, or hung in its shutdown.)
#[test]
fn a_closed_log_pipe_neither_stops_nor_hangs_the_server() {
    let mut server = ServeProcess::start(&[]);
    // The SIGHUP handler is in place once one reload is logged (before it,
    // SIGHUP's default action would end the process).
    server.signal("-HUP");
    server.wait_for_log("SIGHUP: reloading rules and certificates");
    // The reader stops at the next line and closes its end of the pipe.
    drop(std::mem::replace(
        &mut server.log,
        std::sync::mpsc::channel().1,
    ));
    server.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    // Logged into the closed pipe.
    server.signal("-HUP");
    std::thread::sleep(Duration::from_millis(300));
    let (code, out, err) = tollgate(&["ping", "--server", &server.addr]);
    assert_eq!(code, 0, "still serving: {out} {err}");
    let status = server.terminate();
    assert!(status.success(), "a clean exit, not a panic: {status:?}");
}

#[test]
fn ping_and_connection_errors() {
    let server = ServeProcess::start(&[]);
    let (code, out, _) = tollgate(&["ping", "--server", &server.addr]);
    assert_eq!(code, 0);
    assert!(out.starts_with("PONG"), "{out}");
    drop(server);
    // Nothing listening there any more: a clear error and exit code 2.
    let (code, _, err) = tollgate(&["ping", "--server", "127.0.0.1:1", "--timeout", "500ms"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach"), "{err}");
}

#[test]
fn health_asks_healthz_and_readyz_of_the_admin_api() {
    let server = ServeProcess::start(&[]);
    let (code, out, err) = tollgate(&["health", "--admin", &server.admin]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "ok");
    let (code, out, err) = tollgate(&["health", "--ready", "--admin", &server.admin]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "ready");
    drop(server);
    // Nothing listening: unhealthy, with the reason.
    let (code, _, err) = tollgate(&["health", "--admin", "127.0.0.1:1", "--timeout", "500ms"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot reach"), "{err}");
}
