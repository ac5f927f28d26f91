//! Replication and failover with real `tollgate serve` processes: full
//! sync under load, SIGKILL of the primary, the old primary's return, a
//! network cut through a fault-injecting proxy, and a standby that falls
//! behind. Bounds on time are only those the issue names (promotion within
//! `--failover-after` + 1 s); everything else polls with a generous
//! deadline.

mod harness;
mod pause;
mod proxy;

use harness::*;
use proxy::Proxy;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_client::{
    Algorithm, Announce, CheckBatch, CheckResult, Client, Error, ErrorCode, Limit, Outcome, Role,
    Undecided,
};

/// The keys of a scenario, each with the limit it is charged under.
fn keyset(prefix: &str, n: usize) -> Vec<(String, Limit)> {
    (0..n)
        .map(|i| (format!("rl:{{{prefix}{i}}}:x"), limit_of(i)))
        .collect()
}

/// Charges `keys[range]` once each, in batches.
async fn charge(client: &Client, keys: &[(String, Limit)]) {
    for chunk in keys.chunks(500) {
        let mut batch = CheckBatch::default();
        for (key, limit) in chunk {
            batch.push(pair(key, *limit, 1));
        }
        client.check_batch(batch).await.expect("checks answered");
    }
}

/// Every key answers a PEEK the same on both nodes (one refill step of
/// slack on `remaining`; the limits refill far slower than a test runs).
async fn assert_same_counters(primary: &str, standby: &str, keys: &[(String, Limit)]) {
    let (p, s) = (client(primary), client(standby));
    for chunk in keys.chunks(500) {
        let mut batch = CheckBatch::default();
        for (key, limit) in chunk {
            batch.push(pair(key, *limit, 1));
        }
        let on_primary = p.peek_batch(batch.clone()).await.expect("primary peeks");
        let on_standby = s.peek_batch(batch).await.expect("standby peeks");
        for (((key, limit), dp), ds) in chunk.iter().zip(on_primary).zip(on_standby) {
            let (CheckResult::Decision(dp), CheckResult::Decision(ds)) = (dp, ds) else {
                panic!("{key}: not decided");
            };
            assert_eq!(dp.limit, ds.limit, "{key}");
            assert!(
                dp.remaining.abs_diff(ds.remaining) <= 1,
                "{key} ({:?}): primary {} remaining, standby {}",
                limit.algorithm,
                dp.remaining,
                ds.remaining
            );
        }
    }
}

/// A client hammering the shard until `stop`, counting answers.
struct Load {
    stop: Arc<AtomicBool>,
    decided: Arc<AtomicU64>,
    /// Decided answers since `mark` was last reset.
    since_mark: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(client: Client, keys: Vec<(String, Limit)>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let decided = Arc::new(AtomicU64::new(0));
        let since_mark = Arc::new(AtomicU64::new(0));
        let (s, d, m) = (stop.clone(), decided.clone(), since_mark.clone());
        let task = tokio::spawn(async move {
            let mut i = 0usize;
            while !s.load(Ordering::Relaxed) {
                let (key, limit) = &keys[i % keys.len()];
                i += 1;
                if let Outcome::Decided(_) = client.check(key.clone(), *limit, 1).await {
                    d.fetch_add(1, Ordering::Relaxed);
                    m.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Load {
            stop,
            decided,
            since_mark,
            task,
        }
    }

    fn mark(&self) {
        self.since_mark.store(0, Ordering::Relaxed);
    }

    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("load task");
        self.decided.load(Ordering::Relaxed)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_started_later_holds_the_same_counters_after_a_full_sync() {
    let a = Node::start(&free_addr(), &[]);
    let keys = keyset("sync", 300);
    let ca = client(&a.addr);
    for _ in 0..3 {
        charge(&ca, &keys).await;
    }
    // Clients keep charging the primary while the standby starts and syncs.
    let load = Load::start(client(&a.addr), keys.clone());
    let b = Node::start(
        &free_addr(),
        &["--replica-of", &a.addr, "--serve-stale-reads"],
    );
    let synced = eventually("the standby is in sync", || async {
        status(&b.addr)
            .await
            .filter(|s| s.field("synced") == Some(1))
    })
    .await;
    assert_eq!(synced.role, Role::Standby);
    assert_eq!(synced.primary, a.addr);
    assert_eq!(synced.epoch, 1);
    // More changes stream after the full sync.
    eventually("changes stream after the sync", || async {
        let s = status(&b.addr).await?;
        (s.offset >= synced.offset + 20).then_some(())
    })
    .await;
    assert!(load.stop().await > 0);
    caught_up(&a.addr, &b.addr).await;
    assert_same_counters(&a.addr, &b.addr, &keys).await;
    let a_status = status(&a.addr).await.unwrap();
    assert_eq!(a_status.field("full_syncs"), Some(1));
    assert_eq!(a_status.field("replica_connected"), Some(1));
    // The admin API reports the same.
    let v = tollgate::admin_client::call(
        &b.admin,
        hyper::Method::GET,
        "/v1/replication",
        None,
        Duration::from_secs(5),
    )
    .await
    .expect("/v1/replication")
    .json();
    assert_eq!(v["role"], "standby");
    assert_eq!(v["primary"], a.addr.as_str());
    assert_eq!(v["epoch"], 1);
    assert_eq!(v["synced"], 1);

    // The standby refuses checks and names its primary.
    let mut batch = CheckBatch::default();
    batch.push(pair(&keys[0].0, keys[0].1, 1));
    match client(&b.addr).check_batch(batch).await {
        Err(Error::Server {
            code: ErrorCode::NotPrimary,
            message,
        }) => assert!(message.contains(&a.addr), "{message}"),
        other => panic!("a standby must refuse checks: {other:?}"),
    }
    // Without --serve-stale-reads it refuses PEEK too.
    let c = Node::start(&free_addr(), &["--replica-of", &a.addr]);
    caught_up(&a.addr, &c.addr).await;
    assert!(matches!(
        client(&c.addr).peek(keys[0].0.clone(), keys[0].1, 1).await,
        Outcome::Undecided {
            why: Undecided::ServerError(ErrorCode::NotPrimary),
            ..
        }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_primary_promotes_the_standby_and_the_old_primary_returns_as_standby() {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    let common = ["--failover-after", "1s", "--serve-stale-reads"];
    let mut a = Node::start(&a_addr, &[&["--peer", &b_addr][..], &common].concat());
    role_is(&a_addr, Role::Primary).await;
    let b = Node::start(
        &b_addr,
        &[&["--replica-of", &a_addr, "--peer", &a_addr][..], &common].concat(),
    );
    caught_up(&a_addr, &b_addr).await;

    let shard = Client::new_shard(
        vec![a_addr.clone(), b_addr.clone()],
        config(Duration::from_millis(500)),
    )
    .expect("valid config");
    // A key exhausted on the primary: 5 pass, then it is denied for a minute.
    let hot = Limit {
        algorithm: Algorithm::TokenBucket,
        count: 1,
        period_ms: 60_000,
        burst: 5,
    };
    let hot_key = "rl:{hot}:login";
    for i in 0..6 {
        let o = shard.check(hot_key, hot, 1).await;
        assert_eq!(
            o.decision().map(|d| d.allowed),
            Some(i < 5),
            "check {i}: {o:?}"
        );
    }
    assert_eq!(shard.connected_addr().as_deref(), Some(a_addr.as_str()));
    let load = Load::start(shard.clone(), keyset("load", 50));
    // The exhaustion reached the standby (see docs/REPLICATION.md: at most one flush
    // interval of updates is lost; here we wait past it).
    caught_up(&a_addr, &b_addr).await;

    let killed = Instant::now();
    a.kill();
    let promoted = role_is(&b_addr, Role::Primary).await;
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(2),
        "promoted {took:?} after the kill; --failover-after 1s + 1 s allowed"
    );
    assert_eq!(promoted.epoch, 2);
    assert_eq!(promoted.field("promotions"), Some(1));
    assert!(!b.logged("role change").is_empty());

    // Clients continue against the new primary.
    load.mark();
    eventually("the load is decided again", || async {
        (load.since_mark.load(Ordering::Relaxed) >= 20).then_some(())
    })
    .await;
    assert_eq!(shard.connected_addr().as_deref(), Some(b_addr.as_str()));
    // Still exhausted: no reset burst.
    let o = shard.check(hot_key, hot, 1).await;
    assert_eq!(o.decision().map(|d| d.allowed), Some(false), "{o:?}");

    // The old primary, restarted with the same flags, comes back as a
    // standby of the new primary at its epoch, and serves no checks.
    a.restart();
    let back = eventually("the old primary follows the new one", || async {
        status(&a_addr).await.filter(|s| {
            s.role == Role::Standby
                && s.epoch == 2
                && s.primary == b_addr
                && s.field("synced") == Some(1)
        })
    })
    .await;
    assert_eq!(back.field("promotions"), Some(0));
    let reasons: Vec<_> = a
        .logged("role change")
        .iter()
        .map(|f| f["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    // One role change, to a standby of B. Which of two events settles it
    // is a race, and both are right: its own start-up question to B, or
    // B's announce (B probes every heartbeat) arriving first.
    assert!(
        matches!(
            reasons.iter().map(String::as_str).collect::<Vec<_>>()[..],
            ["start: the peer is primary"]
                | ["told of a primary at a higher epoch than the one followed"]
        ),
        "{:#?}",
        a.logged("role change")
    );
    assert!(matches!(
        client(&a_addr).check(hot_key, hot, 1).await,
        Outcome::Undecided {
            why: Undecided::ServerError(ErrorCode::NotPrimary),
            ..
        }
    ));
    // The returning node holds the exhausted key too, and B stays primary.
    assert_eq!(peek(&client(&a_addr), hot_key, hot).await.remaining, 0);
    let b_now = status(&b_addr).await.unwrap();
    assert_eq!((b_now.role, b_now.epoch), (Role::Primary, 2));
    assert!(load.stop().await > 0);
    let o = shard.check(hot_key, hot, 1).await;
    assert_eq!(o.decision().map(|d| d.allowed), Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_cut_and_its_healing_end_with_one_primary_and_converged_state() {
    let (a_addr, b_addr) = (free_addr(), free_addr());
    // Every byte between the two nodes goes through a proxy: B reaches A
    // through `to_a` (replication and probes), A reaches B through `to_b`.
    let to_a = Proxy::start(&a_addr).await;
    let to_b = Proxy::start(&b_addr).await;
    let common = ["--failover-after", "1s", "--serve-stale-reads"];
    let a = Node::start(&a_addr, &[&["--peer", &to_b.addr()][..], &common].concat());
    role_is(&a_addr, Role::Primary).await;
    let to_a_addr = to_a.addr();
    let b = Node::start(
        &b_addr,
        &[
            &["--replica-of", &to_a_addr, "--peer", &to_a_addr][..],
            &common,
        ]
        .concat(),
    );
    caught_up(&a_addr, &b_addr).await;
    let (ca, cb) = (client(&a_addr), client(&b_addr));
    let tb = Limit {
        algorithm: Algorithm::TokenBucket,
        count: 1,
        period_ms: 60_000,
        burst: 50,
    };
    for _ in 0..3 {
        assert!(ca.check("rl:{p}:before", tb, 1).await.is_allowed());
    }
    caught_up(&a_addr, &b_addr).await;

    to_a.cut();
    to_b.cut();
    // The standby hears nothing and takes over; the old primary cannot
    // see it and keeps serving: two primaries while the cut lasts.
    let b_primary = role_is(&b_addr, Role::Primary).await;
    assert_eq!(b_primary.epoch, 2);
    let a_during = status(&a_addr).await.unwrap();
    assert_eq!((a_during.role, a_during.epoch), (Role::Primary, 1));
    for _ in 0..5 {
        assert!(ca.check("rl:{p}:split", tb, 1).await.is_allowed());
    }
    for _ in 0..2 {
        assert!(cb.check("rl:{p}:split", tb, 1).await.is_allowed());
    }

    to_a.heal();
    to_b.heal();
    // The lower epoch steps down and resyncs from the higher one.
    eventually("the old primary steps down and resyncs", || async {
        status(&a_addr)
            .await
            .filter(|s| s.role == Role::Standby && s.epoch == 2 && s.field("synced") == Some(1))
    })
    .await;
    let b_after = status(&b_addr).await.unwrap();
    assert_eq!((b_after.role, b_after.epoch), (Role::Primary, 2));
    caught_up(&b_addr, &a_addr).await;
    // Converged on the merge of both copies: A handed its states to B
    // before resyncing, and per key the copy with less quota left won, so
    // A's 5 divergent charges stand (B's 2 are within them: a merge takes
    // the larger, not the sum), and what both had before the cut is kept.
    // (A PEEK answers as a check would: `remaining` after one more unit.)
    assert_eq!(peek(&ca, "rl:{p}:split", tb).await.remaining, 50 - 5 - 1);
    assert_eq!(peek(&cb, "rl:{p}:split", tb).await.remaining, 50 - 5 - 1);
    assert_eq!(peek(&ca, "rl:{p}:before", tb).await.remaining, 50 - 3 - 1);
    assert_eq!(peek(&cb, "rl:{p}:before", tb).await.remaining, 50 - 3 - 1);
    let stepped_down = a.logged("role change");
    assert!(
        stepped_down
            .iter()
            .any(|f| f["from"] == "primary" && f["to"] == "standby"),
        "{stepped_down:?}"
    );
    // And it stays that way: one primary.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sa, sb) = (
        status(&a_addr).await.unwrap(),
        status(&b_addr).await.unwrap(),
    );
    assert_eq!((sa.role, sb.role), (Role::Standby, Role::Primary));
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_falls_behind_is_resynced_and_the_primary_stays_bounded() {
    let a_addr = free_addr();
    let a = Node::start(
        &a_addr,
        &[
            "--stripes",
            "16",
            "--repl-buffer-cap",
            "32",
            "--repl-backlog",
            "65536",
            // Long enough that the stuck standby is held, not dropped.
            "--repl-timeout",
            "10s",
        ],
    );
    let to_a = Proxy::start(&a_addr).await;
    let b = Node::start(
        &free_addr(),
        &["--replica-of", &to_a.addr(), "--serve-stale-reads"],
    );
    caught_up(&a_addr, &b.addr).await;
    let ca = client(&a_addr);
    let keys = keyset("lag", 4000);

    // The standby stops reading (its link is cut) while clients go on
    // charging keys on the primary, a few at a time: 64 keys a round spread
    // over 16 stripes stay far below the cap of 32 per stripe between two
    // drains, so the buffers can only fill when the sender is stuck on the
    // standby's socket.
    to_a.cut();
    let cap = status(&a_addr).await.unwrap().field("buffer_cap").unwrap();
    assert_eq!(cap, 16 * 32);
    let mut round = 0;
    let overflowed = eventually("the change buffers hit their cap", || {
        round += 1;
        let (keys, ca, a_addr) = (&keys, &ca, &a_addr);
        let offset = (round * 64) % (keys.len() - 64);
        async move {
            charge(ca, &keys[offset..offset + 64]).await;
            let s = status(a_addr).await?;
            Some(s).filter(|s| s.field("buffer_overflows").unwrap_or(0) > 0)
        }
    })
    .await;
    assert!(
        overflowed.field("lag_offsets").unwrap() > 0,
        "{overflowed:?}"
    );
    // Bounded while the standby is stuck: the buffers never hold more than
    // their cap, the backlog never more than its size (plus one frame).
    let mut worst_buffered = overflowed.field("buffered_changes").unwrap();
    for i in 0..20 {
        charge(&ca, &keys[i * 64..(i + 1) * 64]).await;
        let s = status(&a_addr).await.unwrap();
        worst_buffered = worst_buffered.max(s.field("buffered_changes").unwrap());
        assert!(s.field("backlog_bytes").unwrap() <= 65536 + 70_000);
    }
    assert!(worst_buffered <= cap, "{worst_buffered} > {cap}");
    // The metric says the same.
    let metrics = tollgate::admin_client::call(
        &a.admin,
        hyper::Method::GET,
        "/metrics",
        None,
        Duration::from_secs(5),
    )
    .await
    .expect("/metrics")
    .text();
    let overflows: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("tollgate_replication_buffer_overflows_total "))
        .expect("the overflow metric")
        .parse()
        .unwrap();
    assert!(overflows >= 1.0, "{overflows}");

    // Healed: the standby is resynced (stripes sent whole, or a full sync
    // if it was dropped) and ends with the primary's counters.
    to_a.heal();
    caught_up(&a_addr, &b.addr).await;
    let s = status(&a_addr).await.unwrap();
    assert!(
        s.field("stripe_resyncs").unwrap() + s.field("full_syncs").unwrap() >= 2,
        "{s:?}"
    );
    assert_same_counters(&a_addr, &b.addr, &keys).await;
}

/// Records carry every algorithm's state exactly, so a standby answers like
/// the primary for all of them, leases included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promote_by_command_keeps_leases_and_windows() {
    let a = Node::start(&free_addr(), &["--serve-stale-reads"]);
    let b = Node::start(&free_addr(), &["--replica-of", &a.addr]);
    caught_up(&a.addr, &b.addr).await;
    let ca = client(&a.addr);
    let leases = limit_of(4);
    let mut held = Vec::new();
    for _ in 0..3 {
        let o = ca.check("cc:{jobs}:run", leases, 1).await;
        held.push(o.lease().expect("a lease"));
    }
    let window = limit_of(1);
    for _ in 0..7 {
        assert!(ca.check("rl:{w}:day", window, 1).await.is_allowed());
    }
    caught_up(&a.addr, &b.addr).await;

    // Promotion is an operator's action, through the admin API.
    let out = std::process::Command::new(BIN)
        .args(["promote", "--admin", &b.admin])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("promoted to primary at epoch 2"), "{text}");
    // (A PEEK answers as a check would: `remaining` after one more unit.)
    let cb = client(&b.addr);
    assert_eq!(
        peek(&cb, "cc:{jobs}:run", leases).await.remaining,
        50 - 3 - 1
    );
    assert_eq!(peek(&cb, "rl:{w}:day", window).await.remaining, 50 - 7 - 1);
    // A lease taken on the old primary is released on the new one.
    assert!(cb.release("cc:{jobs}:run", held[1]).await.unwrap());
    assert_eq!(
        peek(&cb, "cc:{jobs}:run", leases).await.remaining,
        50 - 2 - 1
    );
    let status_out = std::process::Command::new(BIN)
        .args(["status", "--server", &b.addr, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&status_out.stdout).unwrap();
    assert_eq!(v["role"], "primary");
    assert_eq!(v["epoch"], 2);
    // The old primary has no peer configured, so it still thinks it is
    // primary (epoch 1) until told: a STATUS announce (what a peer probe
    // sends) makes it step down, hand its states to the new primary, and
    // resync from it. Only from a connection that proved the cluster
    // secret: a plain client's announce is refused.
    assert_eq!(status(&a.addr).await.unwrap().role, Role::Primary);
    let b_primary = Announce {
        role: Role::Primary,
        epoch: 2,
        addr: b.addr.clone(),
    };
    match client(&a.addr).status_announcing(b_primary.clone()).await {
        Err(Error::Server {
            code: ErrorCode::AuthFailed,
            ..
        }) => {}
        other => panic!("a plain client's announce must be refused: {other:?}"),
    }
    assert_eq!(status(&a.addr).await.unwrap().role, Role::Primary);
    let told = match announce_as_node(&a.addr, b_primary).await {
        tollgate_protocol::Response::Repl(tollgate_protocol::ReplResponse::Status(s)) => s,
        other => panic!("a node's announce: {other:?}"),
    };
    assert_eq!((told.role, told.epoch), (Role::Standby, 2));
    caught_up(&b.addr, &a.addr).await;
    assert_eq!(a.logged("handed our states to the primary").len(), 1);
    // The handed-over copy still held the lease released on B: a merge
    // never gives quota back (leases are united), so it is held again
    // until it expires or is released once more.
    for c in [client(&a.addr), client(&b.addr)] {
        assert_eq!(
            peek(&c, "cc:{jobs}:run", leases).await.remaining,
            50 - 3 - 1
        );
        assert_eq!(peek(&c, "rl:{w}:day", window).await.remaining, 50 - 7 - 1);
    }
    assert!(client(&b.addr)
        .release("cc:{jobs}:run", held[1])
        .await
        .unwrap());
}

/// A standby whose connection breaks (its process lives on) resumes from
/// the primary's backlog instead of syncing everything again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_standby_resumes_from_the_backlog() {
    let a = Node::start(&free_addr(), &["--serve-stale-reads"]);
    let to_a = Proxy::start(&a.addr).await;
    let b = Node::start(
        &free_addr(),
        &["--replica-of", &to_a.addr(), "--serve-stale-reads"],
    );
    let keys = keyset("resume", 200);
    let ca = client(&a.addr);
    charge(&ca, &keys).await;
    caught_up(&a.addr, &b.addr).await;
    for _ in 0..5 {
        to_a.sever();
        charge(&ca, &keys[..50]).await;
        caught_up(&a.addr, &b.addr).await;
    }
    let s = status(&a.addr).await.unwrap();
    assert_eq!(s.field("full_syncs"), Some(1), "{s:?}");
    let resumed = a.logged("standby attached; resuming from the backlog");
    assert!(!resumed.is_empty());
    assert_same_counters(&a.addr, &b.addr, &keys).await;
}
