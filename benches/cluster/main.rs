//! Cluster mode's figures for docs/BENCHMARKS.md (a benchmark, not a
//! test): a real etcd and 3 shards x 2 real nodes (this build's release
//! binary), for each lease TTL asked:
//!
//! - **etcd load in steady state**: etcd's own counters over a quiet
//!   interval (raft proposals, puts, transactions, range reads, lease
//!   renewals) per second;
//! - **failover time**: SIGKILL of shard 0's primary, then the time until
//!   its lease expired and another node is primary in etcd, and until a
//!   routing client has a check of a shard-0 key allowed by the new
//!   primary; several rounds (the killed node restarts in between).
//!
//! ```sh
//! cargo bench --bench cluster --features cluster -- [--ttl 2,5] [--rounds 5] [--steady 30]
//! ```
//!
//! It reuses the cluster tests' harness (etcd members, node processes, the
//! minimal routing client), so the figures come from the code the tests
//! check.

#[allow(dead_code)]
#[path = "../../tests/cluster/etcd.rs"]
mod etcd;
#[allow(dead_code)]
#[path = "../../tests/cluster/nodes.rs"]
mod nodes;
#[allow(dead_code)]
#[path = "../../tests/replication/harness.rs"]
mod procs;
#[allow(dead_code)]
#[path = "../../tests/cluster/router.rs"]
mod router;
#[allow(dead_code)]
#[path = "../../tests/cluster/support.rs"]
mod support;

pub use support::*;

use std::time::Duration;

use etcd::EtcdCluster;
use nodes::{keys_named, Deployment};
use router::Router;
use tokio::time::Instant;
use tollgate::slot::Slot;
use tollgate_protocol::{Algorithm, Limit};

/// A limit no check of the benchmark exhausts.
const WIDE: Limit = Limit {
    algorithm: Algorithm::TokenBucket,
    count: 1_000_000,
    period_ms: 1_000,
    burst: 1_000_000,
};

/// etcd's counters this benchmark reads, by metric name.
const COUNTERS: [&str; 6] = [
    "etcd_server_proposals_committed_total",
    "etcd_mvcc_put_total",
    "etcd_mvcc_txn_total",
    "etcd_mvcc_delete_total",
    "etcd_mvcc_range_total",
    "etcd_debugging_lease_renewed_total",
];

struct Args {
    ttls: Vec<u64>,
    rounds: usize,
    steady: Duration,
}

fn args() -> Args {
    let mut args = Args {
        ttls: vec![2, 5],
        rounds: 5,
        steady: Duration::from_secs(30),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} takes a value"));
        match flag.as_str() {
            "--ttl" => {
                args.ttls = value()
                    .split(',')
                    .map(|t| t.parse().expect("--ttl: whole seconds"))
                    .collect()
            }
            "--rounds" => args.rounds = value().parse().expect("--rounds N"),
            "--steady" => args.steady = Duration::from_secs(value().parse().expect("--steady S")),
            // cargo bench passes --bench.
            "--bench" => {}
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// etcd's counters now.
async fn counters(endpoint: &str) -> Vec<f64> {
    let text = http_get(endpoint, "/metrics").await.expect("etcd /metrics");
    COUNTERS
        .iter()
        .map(|name| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or(0.0)
        })
        .collect()
}

/// The lease flags for a TTL: renewals at the defaults' ratio (1 s for
/// 5 s), the margin and timeouts at their defaults or below.
fn lease_flags(ttl: u64) -> Vec<String> {
    let renew_ms = (ttl * 1000 / 5).max(500);
    [
        "--lease-ttl".to_owned(),
        format!("{ttl}s"),
        "--lease-renew".to_owned(),
        format!("{renew_ms}ms"),
        "--lease-margin".to_owned(),
        "500ms".to_owned(),
        "--etcd-timeout".to_owned(),
        "1s".to_owned(),
    ]
    .to_vec()
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "median {:.0} ms (min {:.0}, max {:.0}, n={})",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1]),
        v.len()
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    for &ttl in &args.ttls {
        let flags = lease_flags(ttl);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut d =
            Deployment::start_with(EtcdCluster::single().await, "bench", 3, 2, &flags).await;
        println!("lease TTL {ttl}s, flags {}", flags.join(" "));

        // Steady state: nothing but renewals should reach etcd.
        let endpoint = d.etcd.endpoint(0);
        let before = counters(&endpoint).await;
        tokio::time::sleep(args.steady).await;
        let after = counters(&endpoint).await;
        let secs = args.steady.as_secs_f64();
        println!("  etcd, steady state over {secs:.0} s, 6 nodes:");
        for (i, name) in COUNTERS.iter().enumerate() {
            println!("    {name}: {:.2}/s", (after[i] - before[i]) / secs);
        }

        // Failover of shard 0, several times.
        let mut router = Router::new(d.addrs());
        router.deadline = Duration::from_millis(200);
        router.attempt = Duration::from_millis(100);
        router.refresh().await;
        let map = router.map().unwrap().clone();
        let key = keys_named("failover", 1000)
            .into_iter()
            .find(|k| map.owner(Slot::of(k.as_bytes()).get()).map(|s| s.id) == Some(0))
            .unwrap();
        let (mut elected, mut served) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds {
            let primary = d.primary(0).await.addr.clone();
            let i = d.nodes[0].iter().position(|n| n.addr == primary).unwrap();
            assert!(router.check(&key, WIDE, 1).await.allowed());
            let killed = Instant::now();
            d.nodes[0][i].kill();
            let mut seen_elected = None;
            loop {
                if seen_elected.is_none() {
                    let s = d.status().await;
                    if s.shards[0]
                        .primary
                        .as_ref()
                        .is_some_and(|p| p.addr != primary)
                    {
                        seen_elected = Some(killed.elapsed());
                    }
                }
                let answer = router.check(&key, WIDE, 1).await;
                if answer.allowed() && answer.node != primary {
                    served.push(killed.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            elected.push(seen_elected.unwrap_or_else(|| killed.elapsed()));
            d.nodes[0][i].restart();
            d.settled().await;
        }
        println!(
            "  failover of shard 0 after SIGKILL of its primary ({} rounds):",
            args.rounds
        );
        println!("    another node primary in etcd: {}", summary(elected));
        println!("    a client's check allowed by it: {}", summary(served));
    }
}
