//! redis-benchmark against the RESP front end: it connects as it would to
//! Redis (reading CONFIG at start), pipelines commands over several
//! connections, and every one of them is counted: the bucket and the
//! counter hold exactly what was sent. No figure is asserted (the box is
//! loaded); docs/BENCHMARKS.md records them.

use super::common::TestServer;
use super::{redis_cli, run, stdout_of};

fn bench_args(port: u16, command: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["-h", "127.0.0.1", "-p", &port.to_string()]
        .iter()
        .chain(&["-n", "2000", "-c", "4", "-P", "8", "-q"])
        .map(|s| s.to_string())
        .collect();
    args.extend(command.iter().map(|s| s.to_string()));
    args
}

#[tokio::test]
async fn redis_benchmark_charges_every_request() {
    let server = TestServer::start_resp(|_| {}).await;
    let resp = server.resp.unwrap();
    // A bucket of 100000 that refills one token an hour: the clock does
    // not move, so what is left is what the benchmark did not take.
    let throttle = ["CL.THROTTLE", "bench", "99999", "1", "3600"];
    let out = run("redis-benchmark", &bench_args(resp.port(), &throttle)).await;
    let text = stdout_of(&out, "redis-benchmark CL.THROTTLE");
    assert!(text.contains("requests per second"), "{text}");
    let peek = redis_cli(resp, &["CL.THROTTLE", "bench", "99999", "1", "3600", "0"]).await;
    assert_eq!(peek.lines().nth(2), Some("98000"), "{peek}");

    let out = run(
        "redis-benchmark",
        &bench_args(resp.port(), &["INCR", "hits"]),
    )
    .await;
    let text = stdout_of(&out, "redis-benchmark INCR");
    assert!(text.contains("requests per second"), "{text}");
    assert_eq!(redis_cli(resp, &["GET", "hits"]).await.trim(), "2000");
    server.stop().await;
}
