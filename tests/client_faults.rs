//! The client under real faults of real `tollgate serve` processes: SIGSTOP
//! (a hung server: connections stay open, nothing answers) and SIGKILL
//! mid-load. Every call answers within its deadline (a generous bound, not
//! a benchmark), the node's breaker opens, the local fallback limits, and
//! the client recovers by itself; with a standby, a hung primary is
//! abandoned for it.

#[path = "replication/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use harness::{eventually, free_addr, start_pair, Node};
use tokio::time::Instant;
use tollgate_client::{
    BreakerConfig, BreakerState, Client, ClientConfig, FallbackConfig, Limit, Outcome, Rate,
    Source, Undecided,
};

/// The call deadline of these clients.
const DEADLINE: Duration = Duration::from_millis(50);
/// Generous bound on any call's duration: its deadline plus scheduling
/// slack on a loaded 2-core machine. Not a performance figure.
const ANSWER_BOUND: Duration = Duration::from_secs(2);

fn config(registry: &prometheus::Registry) -> ClientConfig {
    ClientConfig {
        deadline: DEADLINE,
        connect_timeout: Duration::from_millis(300),
        probe_timeout: Duration::from_millis(100),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        breaker: BreakerConfig {
            open_for: Duration::from_millis(200),
            open_max: Duration::from_secs(1),
            ..BreakerConfig::default()
        },
        fallback: Some(FallbackConfig {
            gateways: 1,
            max_keys: 1000,
        }),
        client_name: "faults".into(),
        metrics: Some(registry.clone()),
        ..ClientConfig::default()
    }
}

/// A key limited to 5 per minute: the fallback must deny it too.
fn hot() -> Limit {
    Limit::token_bucket(Rate::per_minute(5), 5)
}

/// Background load: tasks checking keys in a loop, recording the longest
/// call and the last outcome's kind.
struct Load {
    stop: Arc<AtomicBool>,
    longest_us: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(client: &Client, tasks: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let longest_us = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let tasks = (0..tasks)
            .map(|t| {
                let (client, stop, longest_us, calls) = (
                    client.clone(),
                    stop.clone(),
                    longest_us.clone(),
                    calls.clone(),
                );
                tokio::spawn(async move {
                    let limit = Limit::token_bucket(Rate::per_second(1000), 1000);
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        let _ = client
                            .check(format!("rl:{{load{t}-{i}}}:x"), limit, 1)
                            .await;
                        let took = started.elapsed().as_micros() as u64;
                        longest_us.fetch_max(took, Ordering::Relaxed);
                        calls.fetch_add(1, Ordering::Relaxed);
                        i = (i + 1) % 100;
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            })
            .collect();
        Self {
            stop,
            longest_us,
            calls,
            tasks,
        }
    }

    async fn stop(self) -> (Duration, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load task");
        }
        (
            Duration::from_micros(self.longest_us.load(Ordering::Relaxed)),
            self.calls.load(Ordering::Relaxed),
        )
    }
}

fn breaker(client: &Client) -> BreakerState {
    client.breakers()[0].1
}

/// The value of a client metric with these label values.
fn metric(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            labels.iter().all(|(k, v)| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == *k && l.value() == *v)
            })
        })
        .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_then_sigkill_mid_load_breaker_opens_fallback_limits_client_recovers() {
    let mut node = Node::start(&free_addr(), &[]);
    let registry = prometheus::Registry::new();
    let client = Client::connect(node.addr.clone(), config(&registry))
        .await
        .expect("connect");
    let load = Load::start(&client, 4);
    let hot_key = "rl:{hot}:x";
    assert!(matches!(
        client.check(hot_key, hot(), 1).await,
        Outcome::Decided(_)
    ));

    // Hung server: calls time out, the breaker opens, then calls fail fast
    // and the fallback decides them.
    node.pause();
    eventually("the breaker opens", || async {
        (breaker(&client) != BreakerState::Closed).then_some(())
    })
    .await;
    let outcome = client.check(hot_key, hot(), 1).await;
    assert!(
        matches!(outcome, Outcome::Fallback { .. }),
        "while hung: {outcome:?}"
    );
    // The fallback holds the whole limit (1 gateway): 5 per minute, the
    // one the server already took not known here. So at most 5 more pass.
    let mut passed = u32::from(outcome.is_allowed());
    for _ in 0..10 {
        let o = client.check(hot_key, hot(), 1).await;
        if let Some(d) = o.decision() {
            assert_eq!(d.source, Source::Fallback, "{o:?}");
        }
        passed += u32::from(o.is_allowed());
    }
    assert_eq!(passed, 5, "the fallback limits");

    // Resumed: the breaker's probe goes through and the server decides again.
    node.resume();
    eventually("decided by the server again", || async {
        matches!(
            client.check("rl:{after}:x", hot(), 1).await,
            Outcome::Decided(_)
        )
        .then_some(())
    })
    .await;
    assert_eq!(breaker(&client), BreakerState::Closed);

    // Killed: connection lost, the fallback decides; restarted: recovered.
    node.kill();
    eventually("the fallback decides without a server", || async {
        let o = client.check("rl:{dead}:x", hot(), 1).await;
        matches!(
            o,
            Outcome::Fallback {
                why: Undecided::ConnectionLost | Undecided::Unavailable | Undecided::BreakerOpen,
                ..
            }
        )
        .then_some(())
    })
    .await;
    node.restart();
    eventually("recovered after the restart", || async {
        matches!(
            client.check("rl:{back}:x", hot(), 1).await,
            Outcome::Decided(_)
        )
        .then_some(())
    })
    .await;

    let (longest, calls) = load.stop().await;
    assert!(calls > 0);
    assert!(
        longest < ANSWER_BOUND,
        "a call took {longest:?} (deadline {DEADLINE:?})"
    );
    // Metrics saw all of it.
    let node_label = [("node", node.addr.as_str())];
    assert!(
        metric(
            &registry,
            "tollgate_client_breaker_transitions_total",
            &[node_label[0], ("to", "open")]
        ) >= 1.0
    );
    assert!(
        metric(
            &registry,
            "tollgate_client_decisions_total",
            &[("source", "fallback"), ("decision", "denied")]
        ) >= 1.0
    );
    assert!(
        metric(
            &registry,
            "tollgate_client_decisions_total",
            &[("source", "server")]
        ) >= 1.0
    );
    client.close();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_primary_is_abandoned_for_its_standby() {
    let (a, b) = start_pair("1s").await;
    let (a_addr, b_addr) = (a.addr.clone(), b.addr.clone());
    let registry = prometheus::Registry::new();
    let client = Client::new_shard(vec![a_addr.clone(), b_addr.clone()], config(&registry))
        .expect("valid config");
    eventually("the shard serves", || async {
        matches!(
            client.check("rl:{s}:x", hot(), 1).await,
            Outcome::Decided(_)
        )
        .then_some(())
    })
    .await;
    assert_eq!(client.connected_addr().as_deref(), Some(a_addr.as_str()));
    let load = Load::start(&client, 2);

    // A hangs with its connections open; B takes over after 1 s of
    // silence; the client drops A's suspect connection and finds B.
    a.pause();
    eventually("the client follows the standby", || async {
        let o = client.check("rl:{t}:x", hot(), 1).await;
        (matches!(o, Outcome::Decided(_))
            && client.connected_addr().as_deref() == Some(b_addr.as_str()))
        .then_some(())
    })
    .await;
    let (longest, _) = load.stop().await;
    assert!(longest < ANSWER_BOUND, "a call took {longest:?}");
    a.resume();
    drop(b);
    client.close();
}
