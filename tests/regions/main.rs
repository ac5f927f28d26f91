//! Global limits across regions (docs/GLOBAL-LIMITS.md, PROTOCOL.md §16):
//! three regions on loopback, each a real server with its own counters,
//! exchanging usage through relays that add 100 ms each way.
//!
//! The assertions are counts (units admitted, units imported, messages
//! answered), never durations; every wait is for an event, with a generous
//! deadline.

#[path = "../common/mod.rs"]
mod common;
mod delay;
mod drain;
mod frame_bound;
#[allow(dead_code)]
#[path = "../replication/harness.rs"]
mod harness;
mod journal_bound;
mod partial;
mod peer_text;
mod process;
mod spoofing;

use common::{batch_of, eventually, http, rule, RawConn, TempDir, PATIENCE};
use delay::DelayRelay;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tollgate::config::ServerConfig;
use tollgate::server::Server;
use tollgate_protocol::{CheckResult, Decision, ErrorCode, Request, Response, UsageReport};

const SECRET: &str = "regions-test-cluster-secret";
const NAMES: [&str; 3] = ["us", "eu", "ap"];
const ONE_WAY: Duration = Duration::from_millis(100);
/// The default exchange interval.
const DEFAULT_INTERVAL: Duration = Duration::from_millis(500);
/// Where two regions drain a key together as fast as the test can: a
/// shorter interval, so that one interval of that traffic stays within
/// 10% of the limit (overshoot is about one interval of traffic).
const BUSY_INTERVAL: Duration = Duration::from_millis(200);

/// Every rule: 600 units, refilled at 600 an hour (one every 6 s, so the
/// test sees a handful at most); `sliding` over a one-hour window; `pair`
/// shared by two of the three regions only.
const RULES: &str = "\
rules:
  - name: bucket
    algorithm: token-bucket
    rate: 600/h
    global: [us, eu, ap]
  - name: sliding
    algorithm: sliding-window
    rate: 600/h
    global: [us, eu, ap]
  - name: pair
    algorithm: token-bucket
    rate: 600/h
    global: [us, eu]
";
const LIMIT: u64 = 600;
/// Units a bucket may refill over a test (600/h for well under a minute).
const REFILL: u64 = 10;

struct Region {
    addr: SocketAddr,
    admin: SocketAddr,
    conn: RawConn,
    next_id: u32,
}

/// Three regions; relays[(i, j)] carries region i's traffic to region j.
struct World {
    regions: Vec<Region>,
    relays: HashMap<(usize, usize), DelayRelay>,
    shutdown: CancellationToken,
    _dir: TempDir,
}

impl World {
    /// Three regions exchanging usage every `interval`.
    async fn start(name: &str, interval: Duration) -> World {
        Self::start_with(name, interval, |_, _| {}).await
    }

    /// [`World::start`], with region `i`'s config changed by `tune(i, _)`.
    async fn start_with(
        name: &str,
        interval: Duration,
        tune: impl Fn(usize, &mut ServerConfig),
    ) -> World {
        let dir = TempDir::new(name);
        let rules = dir.path("rules.yaml");
        std::fs::write(&rules, RULES).unwrap();
        let mut listeners = Vec::new();
        for _ in NAMES {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut relays = HashMap::new();
        for i in 0..NAMES.len() {
            for (j, to) in addrs.iter().enumerate() {
                if i != j {
                    let relay = DelayRelay::start(to.to_string(), ONE_WAY).await;
                    relays.insert((i, j), relay);
                }
            }
        }
        let shutdown = CancellationToken::new();
        let mut regions = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let mut config = ServerConfig::with_listen(addrs[i]);
            config.auth.cluster_secret = Some(SECRET.into());
            config.rules.file = Some(rules.clone());
            config.regions.region = Some(NAMES[i].into());
            config.regions.exchange_interval = interval;
            config.regions.region_peer = (0..NAMES.len())
                .filter(|&j| j != i)
                .map(|j| format!("{}={}", NAMES[j], relays[&(i, j)].addr))
                .collect();
            tune(i, &mut config);
            config.validate().expect("valid region config");
            let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let admin_addr = admin.local_addr().unwrap();
            let server = Server::new(config)
                .expect("server starts")
                .with_admin(admin);
            tokio::spawn(server.run(listener, shutdown.clone()));
            regions.push(Region {
                addr: addrs[i],
                admin: admin_addr,
                conn: RawConn::ready(addrs[i]).await,
                next_id: 10,
            });
        }
        World {
            regions,
            relays,
            shutdown,
            _dir: dir,
        }
    }

    /// One CHECK of `units` in region `r`: allowed?
    async fn check(&mut self, r: usize, key: &str, rule_name: &str) -> bool {
        let region = &mut self.regions[r];
        region.next_id += 1;
        let results = region
            .conn
            .check(
                region.next_id,
                batch_of(vec![vec![rule(key, rule_name, 1)]]),
            )
            .await;
        common::allowed(&results[0])
    }

    /// PEEK in region `r`.
    async fn peek(&mut self, r: usize, key: &str, rule_name: &str) -> Decision {
        let region = &mut self.regions[r];
        region.next_id += 1;
        let id = region.next_id;
        let batch = batch_of(vec![vec![rule(key, rule_name, 1)]]);
        region.conn.send(id, &Request::Peek(batch)).await;
        match region.conn.recv().await {
            (got, Response::Checked(results)) if got == id => match &results[0] {
                CheckResult::Decision(d) => *d,
                other => panic!("PEEK: {other:?}"),
            },
            other => panic!("PEEK: {other:?}"),
        }
    }

    async fn status(&self, r: usize) -> Value {
        let answer = http(self.regions[r].admin, "GET", "/v1/regions", None).await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        answer.json()
    }

    /// Cuts the link between regions `a` and `b`, both ways (each still
    /// reaches the third), or heals it.
    fn cut_link(&self, (a, b): (usize, usize), cut: bool) {
        for pair in [(a, b), (b, a)] {
            if cut {
                self.relays[&pair].cut();
            } else {
                self.relays[&pair].heal();
            }
        }
    }

    /// Cuts region `r` off from the others, both ways.
    fn isolate(&self, r: usize, cut: bool) {
        for ((i, j), relay) in &self.relays {
            if *i == r || *j == r {
                if cut {
                    relay.cut();
                } else {
                    relay.heal();
                }
            }
        }
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A number out of a peer's entry in region `r`'s `/v1/regions`.
fn peer_field(status: &Value, peer: &str, field: &str) -> u64 {
    status["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["region"] == peer)
        .unwrap_or_else(|| panic!("no peer {peer} in {status}"))[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

/// Waits until every region has heard from every peer (the exchange runs).
async fn in_step(world: &World) {
    for (r, name) in NAMES.iter().enumerate() {
        eventually("every peer answering", || async {
            let s = world.status(r).await;
            let ok = NAMES
                .iter()
                .filter(|n| *n != name)
                .all(|n| peer_field(&s, n, "messages_acked") >= 2);
            (ok && s["cut_off"] == false).then_some(())
        })
        .await;
    }
}

/// A customer spreads traffic over the three regions, then shifts it all
/// to one: the regions together admit at most the limit plus about one
/// interval of traffic, and the one region still gets nearly all of it.
async fn spread_then_shift(rule_name: &str) {
    let mut world = World::start(&format!("shift-{rule_name}"), DEFAULT_INTERVAL).await;
    in_step(&world).await;
    let key = "rl:{customer}:shift";
    let mut admitted = 0u64;
    // Spread: 10 checks a second in each region, 300 units in all.
    for _ in 0..100 {
        for r in 0..NAMES.len() {
            admitted += u64::from(world.check(r, key, rule_name).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(admitted, 300, "nothing is denied below the limit");
    // Shift: everything to `us`, until it has denied for a while (the
    // other regions' last usage has arrived by then).
    let mut denied_in_a_row = 0;
    let mut checks = 0;
    while denied_in_a_row < 100 {
        checks += 1;
        assert!(checks < 5_000, "us never stopped admitting");
        if world.check(0, key, rule_name).await {
            admitted += 1;
            denied_in_a_row = 0;
        } else {
            denied_in_a_row += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("{rule_name}: {admitted} admitted in all regions of a limit of {LIMIT}");
    let most = LIMIT + LIMIT / 10 + REFILL;
    assert!(
        admitted <= most,
        "{rule_name}: {admitted} admitted in all, over the limit {LIMIT} + 10%"
    );
    assert!(
        admitted >= LIMIT * 9 / 10,
        "{rule_name}: the shifted customer was throttled early: {admitted} of {LIMIT}"
    );
    // And every region now knows: none admits the customer any more.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    for (r, name) in NAMES.iter().enumerate().skip(1) {
        while world.peek(r, key, rule_name).await.allowed {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} still admits the customer"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shift_to_one_region_stays_within_the_global_bucket() {
    spread_then_shift("bucket").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shift_to_one_region_stays_within_the_global_window() {
    spread_then_shift("sliding").await;
}

/// Checks of `key` under `bucket` round-robin over `regions` (one round
/// every 30 ms at most) until `streak` checks in a row are denied; what
/// each admitted.
async fn drain(world: &mut World, regions: &[usize], key: &str, streak: u32) -> Vec<u64> {
    drain_rule(world, (regions, "bucket"), key, streak).await
}

/// [`drain`] under the rule `rule_name`.
async fn drain_rule(
    world: &mut World,
    (regions, rule_name): (&[usize], &str),
    key: &str,
    streak: u32,
) -> Vec<u64> {
    let mut admitted = vec![0u64; regions.len()];
    let mut denied_in_a_row = 0;
    let mut checks = 0;
    while denied_in_a_row < streak {
        for (k, &r) in regions.iter().enumerate() {
            checks += 1;
            assert!(checks < 10_000, "the regions never stopped admitting");
            if world.check(r, key, rule_name).await {
                admitted[k] += 1;
                denied_in_a_row = 0;
            } else {
                denied_in_a_row += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    admitted
}

/// One region is cut off: the other two keep enforcing the limit between
/// them, the cut one stops at its ceiling (a third of the limit), and once
/// healed all converge within two exchanges each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_region_caps_at_its_ceiling_and_converges_after_healing() {
    let mut world = World::start("cut", BUSY_INTERVAL).await;
    in_step(&world).await;
    let key = "rl:{customer}:cut";
    let (us, eu, ap) = (0, 1, 2);
    world.isolate(ap, true);
    eventually("ap sees itself cut off", || async {
        (world.status(ap).await["cut_off"] == true).then_some(())
    })
    .await;
    eventually("us and eu see ap stalled", || async {
        let (a, b) = (world.status(us).await, world.status(eu).await);
        let stalled = |s: &Value| {
            s["cut_off"] == false
                && s["peers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["region"] == "ap" && p["stalled"] == true)
        };
        (stalled(&a) && stalled(&b)).then_some(())
    })
    .await;

    // The cut region: its ceiling, 600 / 3 = 200, and no more.
    let ap_admitted = drain(&mut world, &[ap], key, 50).await[0];
    assert!(
        (180..=200).contains(&ap_admitted),
        "ap admitted {ap_admitted}, its ceiling is 200"
    );
    let denials = world.status(ap).await;
    assert!(denials["cut_off"] == true);
    // A check naming a rule ap does not have beside the global one is
    // refused UnknownRule, as on any node, not answered with the
    // ceiling's denial.
    let region = &mut world.regions[ap];
    region.next_id += 1;
    let pairs = vec![
        rule(key, "bucket", 1),
        rule("rl:{customer}:x", "no-such-rule", 1),
    ];
    let results = region
        .conn
        .check(region.next_id, batch_of(vec![pairs]))
        .await;
    assert_eq!(results[0], CheckResult::Error(ErrorCode::UnknownRule));
    // `pair` (us and eu) does not list ap: regional there, never capped.
    // 400 units pass its whole limit of 600, not a ceiling's share.
    region.next_id += 1;
    let pairs = vec![rule("rl:{customer}:pair-in-ap", "pair", 400)];
    let results = region
        .conn
        .check(region.next_id, batch_of(vec![pairs]))
        .await;
    assert!(common::allowed(&results[0]), "{results:?}");
    // The two still in touch: the whole limit between them, not more.
    let others = drain(&mut world, &[us, eu], key, 100).await;
    let both = others[0] + others[1];
    eprintln!("cut off: ap admitted {ap_admitted}, us and eu {others:?}");
    assert!(
        (LIMIT * 9 / 10..=LIMIT + LIMIT / 10 + REFILL).contains(&both),
        "us and eu admitted {others:?} together, the limit is {LIMIT}"
    );
    assert!(others[0] > 0 && others[1] > 0, "{others:?}");

    // Heal, then count two answered messages each way between ap and the
    // others: by then everything used during the cut has been applied.
    let acked = |s: &Value, peer: &str| peer_field(s, peer, "messages_acked");
    let before: Vec<Value> = vec![
        world.status(us).await,
        world.status(eu).await,
        world.status(ap).await,
    ];
    world.isolate(ap, false);
    for (r, peer) in [(us, "ap"), (eu, "ap"), (ap, "us"), (ap, "eu")] {
        let from = acked(&before[r], peer);
        eventually("two exchanges after healing", || async {
            (acked(&world.status(r).await, peer) >= from + 2).then_some(())
        })
        .await;
    }
    let imported = |s: &Value, peer: &str| peer_field(s, peer, "units_imported");
    let after = [
        world.status(us).await,
        world.status(eu).await,
        world.status(ap).await,
    ];
    // Nothing was used on this pair of servers before the cut but these
    // checks, so the units imported are exactly the other side's.
    assert_eq!(imported(&after[us], "ap"), ap_admitted);
    assert_eq!(imported(&after[eu], "ap"), ap_admitted);
    assert_eq!(imported(&after[ap], "us"), others[0]);
    assert_eq!(imported(&after[ap], "eu"), others[1]);
    // The monitor re-assesses once per interval: the acks above may have
    // come in just after its last look.
    eventually("ap back in step", || async {
        (world.status(ap).await["cut_off"] == false).then_some(())
    })
    .await;
    // Converged: every region denies the customer, whose usage is now over
    // the limit everywhere.
    for r in [us, eu, ap] {
        let d = world.peek(r, key, "bucket").await;
        assert!(!d.allowed, "region {} still admits: {d:?}", NAMES[r]);
    }
}

/// USAGE is a node-to-node request: a client connection is refused and
/// nothing is charged; a node connection from an unknown region too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_needs_a_node_connection_and_a_known_region() {
    let mut world = World::start("auth", DEFAULT_INTERVAL).await;
    let key = "rl:{customer}:forged";
    let report = |region: &str| UsageReport {
        region: region.into(),
        // Newer than eu's own session (its start time), which may have
        // reached us already: an older one would be refused.
        session: u64::MAX / 2,
        seq: 1,
        sent_at: 0,
        entries: vec![tollgate_protocol::UsageEntry {
            key: bytes::Bytes::from_static(b"rl:{customer}:forged"),
            rule: "bucket".try_into().unwrap(),
            charged: 500,
            refunded: 0,
            at: u64::MAX / 2,
        }],
    };
    let us = world.regions[0].addr;
    let mut client = RawConn::ready(us).await;
    client.send(5, &Request::Usage(report("eu"))).await;
    match client.recv().await {
        (5, Response::Error { code, .. }) => assert_eq!(code, ErrorCode::AuthFailed),
        other => panic!("{other:?}"),
    }
    let mut node = RawConn::connect(us).await;
    assert!(matches!(
        node.node_hello(SECRET, tollgate_protocol::NodeScope::Cluster)
            .await,
        Some(Response::HelloOk { .. })
    ));
    node.send(6, &Request::Usage(report("mars"))).await;
    match node.recv().await {
        (6, Response::Error { code, message }) => {
            assert_eq!(code, ErrorCode::Malformed);
            assert!(message.contains("mars"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(world.peek(0, key, "bucket").await.remaining >= LIMIT - 1 - REFILL);
    // From a known region: applied once, a retry is a duplicate.
    for duplicate in [false, true] {
        node.send(7, &Request::Usage(report("eu"))).await;
        match node.recv().await {
            (7, Response::UsageOk(ack)) => {
                assert_eq!(ack.region, "us");
                assert_eq!(ack.duplicate, duplicate);
            }
            other => panic!("{other:?}"),
        }
    }
    let d = world.peek(0, key, "bucket").await;
    assert!(d.remaining < LIMIT - 400, "charged once: {d:?}");
    assert!(
        d.remaining >= LIMIT - 501 - REFILL,
        "charged once, not twice: {d:?}"
    );
}

/// Each region with its own cluster secret, all sharing the region
/// secret: the exchange runs on the region secret alone (a peer proving
/// it may send USAGE, nothing else: tests/security/node_auth.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_with_their_own_cluster_secrets_exchange_under_the_region_secret() {
    let mut world = World::start_with("region-secret", DEFAULT_INTERVAL, |i, c| {
        c.auth.cluster_secret = Some(format!("{SECRET}-of-{}", NAMES[i]));
        c.auth.region_secret = Some("regions-test-region-secret".into());
    })
    .await;
    in_step(&world).await;
    let key = "rl:{region-secret}:k";
    for _ in 0..5 {
        assert!(world.check(0, key, "bucket").await);
    }
    for (r, name) in NAMES.iter().enumerate().skip(1) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while world.peek(r, key, "bucket").await.remaining > LIMIT - 5 {
            assert!(tokio::time::Instant::now() < deadline, "{name} never heard");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Two global rules naming different regions, checked in one frame, in
/// either order: each check's usage reaches the regions its own rule
/// names and no other (a frame keeps the last rule's peers; a check under
/// another rule must not reuse them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_of_a_frame_reaches_the_regions_its_own_rule_names() {
    const COST: u32 = 50;
    let mut world = World::start("own-peers", DEFAULT_INTERVAL).await;
    in_step(&world).await;
    let sent = |status: &Value, peer: &str| peer_field(status, peer, "keys_sent");
    let before = world.status(0).await;
    let frames = [
        [("rl:{a}:own", "bucket"), ("rl:{b}:own", "pair")],
        [("rl:{c}:own", "pair"), ("rl:{d}:own", "bucket")],
    ];
    for frame in frames {
        let region = &mut world.regions[0];
        region.next_id += 1;
        let batch = batch_of(frame.iter().map(|(k, r)| vec![rule(k, r, COST)]).collect());
        let results = region.conn.check(region.next_id, batch).await;
        assert!(results.iter().all(common::allowed), "{results:?}");
    }
    // Recorded before the answers left: every message to ap sealed from
    // now on carries what is meant for it, so two more answered hold it.
    let acked_after_checks = peer_field(&world.status(0).await, "ap", "messages_acked");
    eventually("two more messages from us to ap answered", || async {
        let acked = peer_field(&world.status(0).await, "ap", "messages_acked");
        (acked >= acked_after_checks + 2).then_some(())
    })
    .await;
    eventually("us sending all four keys to eu", || async {
        (sent(&world.status(0).await, "eu") >= sent(&before, "eu") + 4).then_some(())
    })
    .await;
    // What us sent: the keys of `pair` to eu only (ap ignores a rule that
    // does not name it, so only the sender's count shows a stray key).
    let after = world.status(0).await;
    assert_eq!(
        sent(&after, "eu") - sent(&before, "eu"),
        4,
        "eu: every check"
    );
    assert_eq!(
        sent(&after, "ap") - sent(&before, "ap"),
        2,
        "ap: `bucket`'s"
    );
    // What they took in: every unit in eu, `bucket`'s in ap.
    let eu = peer_field(&world.status(1).await, "us", "units_imported");
    let ap = peer_field(&world.status(2).await, "us", "units_imported");
    assert_eq!(eu, 4 * u64::from(COST), "eu: every check");
    assert_eq!(ap, 2 * u64::from(COST), "ap: the `bucket` checks only");
    let d = world.peek(2, "rl:{d}:own", "bucket").await;
    assert!(d.remaining <= LIMIT - u64::from(COST) + REFILL, "{d:?}");
}
