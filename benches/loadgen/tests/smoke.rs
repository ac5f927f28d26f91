//! Smoke tests: the built `tollgate-bench` binary runs for about a second
//! against a real Tollgate server started in-process on 127.0.0.1:0 (and
//! against a redis-server on a free loopback port),
//! and prints a JSON line with decided checks and no errors. `--plot` runs
//! against both and must write an SVG, or an HTML page, naming each target
//! and drawing its samples. `kernel-share.sh` must print every figure it
//! promises for a real run. redis-server is required (scripts/test.sh
//! installs it): without it the Redis tests fail.
//!
//! No timing is asserted: only that checks were decided and none failed.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate::config::ServerConfig;
use tollgate::server::Server;

/// Generous bound so a broken generator fails the test instead of hanging.
const PATIENCE: Duration = Duration::from_secs(60);

/// Runs the generator with `args`, returns its stdout lines parsed as JSON.
fn bench(args: &[&str]) -> Vec<serde_json::Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tollgate-bench");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for tollgate-bench") {
            break status;
        }
        if started.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tollgate-bench did not finish within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(
        status.success(),
        "tollgate-bench {args:?} failed ({status}):\n{stderr}"
    );
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect()
}

/// The checks every successful line must pass.
fn assert_decided_without_errors(line: &serde_json::Value, target: &str) {
    assert_eq!(line["target"], target, "{line}");
    assert!(line["ops_per_sec"].as_f64().unwrap() > 0.0, "{line}");
    assert!(line["checks"].as_u64().unwrap() > 0, "{line}");
    assert_eq!(line["errors"], 0, "{line}");
    for field in ["p50_us", "p99_us", "p999_us", "max_us"] {
        assert!(line[field].as_f64().is_some(), "{field} in {line}");
    }
}

/// A Tollgate server on 127.0.0.1:0, stopped when dropped.
struct TollgateServer {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl TollgateServer {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let shutdown = CancellationToken::new();
        let server = Server::new(ServerConfig::with_listen(addr)).expect("server starts");
        tokio::spawn(server.run(listener, shutdown.clone()));
        Self { addr, shutdown }
    }
}

impl Drop for TollgateServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_against_tollgate_prints_a_json_line() {
    let server = TollgateServer::start().await;
    let target = format!("tollgate={}", server.addr);
    let lines = tokio::task::spawn_blocking(move || {
        bench(&[
            "--target",
            &target,
            "--connections",
            "2",
            "--pipeline",
            "4",
            "--batch",
            "8",
            "--keys",
            "1000",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--threads",
            "1",
            "--json",
            "--quiet",
        ])
    })
    .await
    .unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_decided_without_errors(line, "tollgate");
    assert_eq!(line["mode"], "closed");
    assert_eq!(line["batch"], 8);
    assert_eq!(line["pipeline"], 4);
    assert_eq!(line["connections"], 2);
    assert_eq!(line["distribution"], "uniform");
    assert!(line["rate"].is_null());
    assert!(line["send_lag_p99_us"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_zipf_against_tollgate_prints_a_json_line() {
    let server = TollgateServer::start().await;
    let target = format!("tollgate={}", server.addr);
    let lines = tokio::task::spawn_blocking(move || {
        bench(&[
            "--target",
            &target,
            "--connections",
            "3",
            "--pipeline",
            "8",
            "--keys",
            "500",
            "--distribution",
            "zipf",
            "--zipf-skew",
            "1.1",
            "--rate",
            "2000",
            "--duration",
            "1s",
            "--warmup",
            "0s",
            "--threads",
            "1",
            "--json",
            "--quiet",
        ])
    })
    .await
    .unwrap();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_decided_without_errors(line, "tollgate");
    assert_eq!(line["mode"], "open");
    assert_eq!(line["rate"], 2000.0);
    assert_eq!(line["distribution"], "zipf");
    assert_eq!(line["zipf_skew"], 1.1);
    for field in ["send_lag_p99_us", "service_p50_us", "service_p99_us"] {
        assert!(line[field].as_f64().is_some(), "{field} in {line}");
    }
}

#[test]
fn nothing_decided_fails_the_run() {
    // A port with nothing listening: connecting fails, the run must not
    // pass as if it had measured something.
    let port = free_port();
    let status = Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args([
            "--target",
            &format!("tollgate=127.0.0.1:{port}"),
            "--duration",
            "100ms",
            "--warmup",
            "0s",
            "--json",
            "--quiet",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run tollgate-bench");
    assert!(!status.success());
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let listener = StdListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A redis-server on a free loopback port, nothing kept on disk; killed
/// when dropped.
struct RedisServer {
    child: Child,
    port: u16,
    dir: std::path::PathBuf,
}

impl RedisServer {
    /// `None` when redis-server is not installed.
    fn start() -> Option<Self> {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("tollgate-bench-smoke-{port}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        };
        let server = Self { child, port, dir };
        let started = Instant::now();
        while !server.answers_ping() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not come up on port {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
    }

    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 7];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A short run of 2 connections x pipeline 2 x batch 4 over 1000 keys
/// against `compare` (KIND=ADDR,...), measured for `duration`; `extra`
/// flags appended. Its JSON lines.
async fn small_compare_run(
    compare: String,
    duration: &str,
    extra: &[&str],
) -> Vec<serde_json::Value> {
    let mut args: Vec<String> = [
        "--compare",
        &compare,
        "--connections",
        "2",
        "--pipeline",
        "2",
        "--batch",
        "4",
        "--keys",
        "1000",
        "--duration",
        duration,
        "--warmup",
        "100ms",
        "--threads",
        "1",
        "--json",
        "--quiet",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    tokio::task::spawn_blocking(move || bench(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .await
        .unwrap()
}

/// A redis-server, which scripts/test.sh installs: its absence fails the
/// test rather than skipping it.
fn redis() -> RedisServer {
    RedisServer::start()
        .expect("redis-server is not installed (scripts/test.sh installs it with apt-get)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_against_redis() {
    let redis = redis();
    let server = TollgateServer::start().await;
    let compare = format!("tollgate={},redis=127.0.0.1:{}", server.addr, redis.port);
    let lines = small_compare_run(compare, "1s", &[]).await;
    drop(redis);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_decided_without_errors(&lines[0], "tollgate");
    assert_decided_without_errors(&lines[1], "redis");
    assert!(
        lines[1]["server"].as_str().unwrap().contains("sha"),
        "{}",
        lines[1]
    );
}

/// The `points` of every `<polyline>` drawn in `colour` (plotters draws a
/// line series as one polyline).
fn polylines(svg: &roxmltree::Document<'_>, colour: &str) -> Vec<usize> {
    svg.descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .filter(|n| n.attribute("stroke") == Some(colour))
        .map(|n| {
            n.attribute("points")
                .unwrap_or("")
                .split_whitespace()
                .count()
        })
        .collect()
}

/// Checks a plot of a tollgate-and-redis run: an SVG document naming each
/// target, with a throughput line per target of one point per interval.
fn assert_plot_of_both(svg_text: &str, tollgate: &str, redis: &str) {
    let svg = roxmltree::Document::parse(svg_text)
        .unwrap_or_else(|e| panic!("not well-formed SVG ({e}):\n{svg_text}"));
    assert!(svg.root_element().has_tag_name("svg"));
    let text: String = svg
        .descendants()
        .filter_map(|n| n.text())
        .collect::<Vec<_>>()
        .join("\n");
    for expected in [
        format!("tollgate {tollgate}"),
        format!("redis {redis}"),
        "tollgate p99.9".to_owned(),
        "redis p50".to_owned(),
        "checks/s".to_owned(),
    ] {
        assert!(
            text.contains(&expected),
            "no {expected:?} in the text:\n{text}"
        );
    }
    // 1.2 s in 200 ms intervals: 6 samples each. The first two colours of
    // the palette are the two targets, in run order.
    for colour in ["#1F77B4", "#D62728"] {
        let lines = polylines(&svg, colour);
        assert!(
            lines.iter().filter(|&&points| points == 6).count() >= 2,
            "{colour}: throughput and p50 lines of 6 points, got {lines:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plot_draws_every_target_as_svg_and_html() {
    let redis = redis();
    let server = TollgateServer::start().await;
    let (tollgate, redis_addr) = (server.addr.to_string(), format!("127.0.0.1:{}", redis.port));
    let dir = std::env::temp_dir().join(format!("tollgate-bench-plot-{}", redis.port));
    std::fs::create_dir_all(&dir).unwrap();
    let (svg_path, html_path) = (dir.join("run.svg"), dir.join("run.html"));
    let compare = format!("tollgate={tollgate},redis={redis_addr}");
    for path in [&svg_path, &html_path] {
        let plot = ["--plot", path.to_str().unwrap(), "--plot-interval", "200ms"];
        let lines = small_compare_run(compare.clone(), "1200ms", &plot).await;
        assert_decided_without_errors(&lines[0], "tollgate");
        assert_decided_without_errors(&lines[1], "redis");
    }
    drop(redis);

    assert_plot_of_both(
        &std::fs::read_to_string(&svg_path).unwrap(),
        &tollgate,
        &redis_addr,
    );
    let page = std::fs::read_to_string(&html_path).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    assert!(page.trim_end().ends_with("</html>"), "{page}");
    let svg_start = page.find("<svg").expect("the page holds the SVG");
    let svg_end = page.find("</svg>").expect("the SVG ends") + "</svg>".len();
    assert_plot_of_both(&page[svg_start..svg_end], &tollgate, &redis_addr);
    for expected in [
        format!("<td>tollgate</td><td>{tollgate}</td>"),
        format!("<td>redis</td><td>{redis_addr}</td>"),
        "--plot-interval 200ms".to_owned(),
        "tollgate / redis:".to_owned(),
    ] {
        assert!(page.contains(&expected), "no {expected:?} in the page");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plot_refuses_a_file_it_cannot_write_before_running() {
    // A wrong extension is refused up front (exit 2), before any target
    // is measured: nothing listens on this port.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
        .args(["--target", &format!("tollgate=127.0.0.1:{}", free_port())])
        .args(["--plot", "run.png", "--quiet"])
        .output()
        .expect("run tollgate-bench");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".svg or .html"), "{stderr}");
}

/// `kernel-share.sh` (the CPU split of docs/BENCHMARKS.md, "What 12x would
/// take") runs the built generator against a real server and prints every
/// figure it promises, the server's own line included (the server runs in
/// this process, so `SERVER_PID` is ours). Only presence and sign are
/// checked: the figures themselves are the box's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_share_splits_the_box_cpu_under_a_run() {
    let server = TollgateServer::start().await;
    let target = format!("tollgate={}", server.addr);
    let output = tokio::task::spawn_blocking(move || {
        Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/kernel-share.sh"))
            .args([&target, "--connections", "4", "--pipeline", "4"])
            .args(["--keys", "1000", "--threads", "1"])
            .env("BENCH", env!("CARGO_BIN_EXE_tollgate-bench"))
            .env("DURATION", "3")
            .env("WARMUP", "1")
            .env("SERVER_PID", std::process::id().to_string())
            .output()
            .expect("run kernel-share.sh")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "kernel-share.sh failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let figure = |label: &str| -> f64 {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} line in:\n{stdout}"));
        line[label.len()..]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("no figure after {label:?} in {line:?}"))
    };
    assert!(figure("checks/s") > 0.0, "{stdout}");
    assert!(figure("TCP segments/s (sent)") > 0.0, "{stdout}");
    assert!(figure("kernel CPU per check") >= 0.0, "{stdout}");
    assert!(figure("user CPU per check") >= 0.0, "{stdout}");
    assert!(figure("  generator: user") >= 0.0, "{stdout}");
    assert!(figure("  server:    user") >= 0.0, "{stdout}");
    assert!(stdout.contains("checks per segment"), "{stdout}");

    // A window too short to sample is refused before anything runs.
    let refused = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/kernel-share.sh"))
        .arg("tollgate=127.0.0.1:1")
        .env("BENCH", env!("CARGO_BIN_EXE_tollgate-bench"))
        .env("DURATION", "2")
        .output()
        .expect("run kernel-share.sh");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}
