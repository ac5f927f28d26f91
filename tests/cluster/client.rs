//! The client crate's cluster mode against 3 shards x 2 real nodes and a
//! real etcd: one seed is enough to check every shard's keys, a batch
//! across shards is split and answered in order, a slot move costs one
//! MOVED and then checks go straight to the new owner, a check of a moving
//! slot waits out TryAgain within its deadline, and a killed primary's keys
//! are decided by its successor within the call's deadline.

use std::time::Duration;

use tollgate::cluster::{begin_move, load_topology, ShardId, SlotRange};
use tollgate::slot::Slot;
use tollgate_client::{Client, ClientConfig, Outcome, Rejection};
use tollgate_protocol::{CheckBatch, CheckResult, ErrorCode, LimitRef, Pair};

use crate::etcd::EtcdCluster;
use crate::nodes::*;
use crate::router::Router;
use crate::*;

/// A cluster client seeded with `seed` alone. The background refresh is
/// pushed out of the test's way, so only MOVED and failures refresh the map
/// (and the redirect counts are exact); every call may wait 20 s.
async fn cluster_client(seed: &str) -> Client {
    let config = ClientConfig {
        deadline: Duration::from_secs(20),
        connect_timeout: Duration::from_millis(500),
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        topology_refresh: Duration::from_secs(3600),
        client_name: "cluster-client-test".into(),
        fallback: None,
        ..ClientConfig::default()
    };
    Client::connect_cluster(vec![seed.to_owned()], config)
        .await
        .expect("the seed answers TOPOLOGY")
}

/// The shard owning each key, from the map a raw router reads of `seed`.
async fn shards_of(seed: &str, keys: &[String]) -> Vec<u16> {
    let mut router = Router::new(vec![seed.to_owned()]);
    assert!(router.refresh().await, "{seed} answers TOPOLOGY");
    let map = router.map().expect("a map");
    keys.iter()
        .map(|k| {
            map.owner(Slot::of(k.as_bytes()).get())
                .expect("an owner")
                .id
        })
        .collect()
}

/// Sum over every running node of `tollgate_cluster_redirects_total`.
async fn redirects(d: &Deployment) -> u64 {
    let mut total = 0;
    for node in d.nodes.iter().flatten().filter(|n| n.running()) {
        let metrics = http_get(&node.admin, "/metrics").await.expect("/metrics");
        total += metrics
            .lines()
            .find_map(|l| l.strip_prefix("tollgate_cluster_redirects_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .expect("the redirect counter");
    }
    total
}

fn remaining(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Decided(d) => d.remaining,
        other => panic!("expected a server decision: {other:?}"),
    }
}

fn pair(key: &str) -> Pair {
    Pair {
        key: key.as_bytes().to_vec().into(),
        limit: LimitRef::Inline(LIMIT),
        cost: 1,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_seed_reaches_every_shard_and_batches_come_back_in_order() {
    let d = Deployment::start(EtcdCluster::single().await, "client", 3, 2).await;
    // A standby as the only seed: it knows the map, serves no check.
    let seed = d.standby(2).await.addr.clone();
    let client = cluster_client(&seed).await;
    let stats = client.cluster_stats().expect("cluster mode");
    assert_eq!(stats.shards, 3);
    assert_eq!(stats.version, d.status().await.version);
    let shards = client.cluster_shards();
    assert!(
        shards.iter().all(|(_, nodes)| nodes.len() == 2),
        "{shards:?}"
    );

    let keys = keys_named("cc", 60);
    let owners = shards_of(&seed, &keys).await;
    for shard in 0..3 {
        assert!(owners.contains(&shard), "keys of shard {shard}: {owners:?}");
    }
    let redirects_before = redirects(&d).await;
    // Key i charged i % 4 + 1 times, one call each.
    for (i, key) in keys.iter().enumerate() {
        for n in 0..=(i % 4) {
            let outcome = client.check(key.clone(), LIMIT, 1).await;
            assert_eq!(remaining(&outcome), LIMIT.burst - 1 - n as u64, "{key}");
        }
    }
    // Routed by slot from the start: no node redirected anything.
    assert_eq!(client.cluster_stats().unwrap().moved, 0);
    assert_eq!(redirects(&d).await, redirects_before);

    // One batch over every shard, with a cross-slot group in the middle:
    // split per shard, merged back in the batch's order.
    let mut batch = CheckBatch::default();
    for key in &keys[..30] {
        batch.push(pair(key));
    }
    batch.push_check([pair(&keys[0]), pair(&keys[1])]);
    for key in &keys[30..] {
        batch.push(pair(key));
    }
    let results = client.peek_batch(batch).await.expect("a batch answer");
    assert_eq!(results.len(), keys.len() + 1);
    let mut expected = keys.iter().enumerate().map(|(i, k)| (k, i));
    for (position, result) in results.iter().enumerate() {
        if position == 30 {
            assert_eq!(*result, CheckResult::Error(ErrorCode::CrossSlot));
            continue;
        }
        let (key, i) = expected.next().unwrap();
        match result {
            CheckResult::Decision(dec) => assert_eq!(
                dec.remaining,
                // A PEEK answers as if it charged its cost.
                LIMIT.burst - (i % 4 + 1) as u64 - 1,
                "{key} at {position}"
            ),
            other => panic!("{key} at {position}: {other:?}"),
        }
    }
    // An atomic group stays on one slot: refused locally, as the server would.
    let group = client
        .check_group(vec![pair(&keys[0]), pair(&keys[1])])
        .await;
    assert!(
        matches!(
            group,
            Outcome::Rejected(Rejection {
                code: ErrorCode::CrossSlot,
                ..
            })
        ),
        "{group:?}"
    );
    // RESET over every shard: split, counts summed.
    let reset = client
        .reset(keys.iter().map(|k| k.as_bytes().to_vec().into()).collect())
        .await
        .expect("reset");
    assert_eq!(reset, keys.len() as u32);
    assert_eq!(
        remaining(&client.peek(keys[5].clone(), LIMIT, 1).await),
        LIMIT.burst - 1
    );
    assert_eq!(redirects(&d).await, redirects_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_slot_move_one_moved_then_straight_to_the_new_owner() {
    let d = Deployment::start(EtcdCluster::single().await, "clientmv", 3, 2).await;
    let seed = d.primary(2).await.addr.clone();
    let client = cluster_client(&seed).await;
    // Keys of slots 0-1023 (shard 0's).
    let moving: Vec<String> = keys_named("cm", 4000)
        .into_iter()
        .filter(|k| Slot::of(k.as_bytes()).get() < 1024)
        .take(10)
        .collect();
    assert_eq!(moving.len(), 10);
    for key in &moving {
        assert_eq!(
            remaining(&client.check(key.clone(), LIMIT, 1).await),
            LIMIT.burst - 1
        );
    }
    let version = client.cluster_stats().unwrap().version;

    let out = d.move_slots("0-1023", 1);
    assert!(out.contains("belong to shard 1"), "{out}");
    let before = redirects(&d).await;
    // The client's map is older: the first check is answered MOVED by the
    // old owner, the map is refreshed, the new owner decides (with the
    // state the move copied).
    assert_eq!(
        remaining(&client.check(moving[0].clone(), LIMIT, 1).await),
        LIMIT.burst - 2
    );
    let stats = client.cluster_stats().unwrap();
    assert_eq!(stats.moved, 1, "{stats:?}");
    assert!(stats.version > version, "{stats:?}");
    assert_eq!(redirects(&d).await, before + 1);
    // From then on every key of the range goes straight to shard 1.
    for key in &moving[1..] {
        assert_eq!(
            remaining(&client.check(key.clone(), LIMIT, 1).await),
            LIMIT.burst - 2,
            "{key}"
        );
    }
    assert_eq!(client.cluster_stats().unwrap().moved, 1);
    assert_eq!(redirects(&d).await, before + 1);
    let owner = d.primary(1).await.addr.clone();
    let shards = client.cluster_shards();
    assert!(
        shards
            .iter()
            .any(|(id, nodes)| *id == 1 && nodes[0] == owner),
        "{shards:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primarys_keys_are_decided_by_its_successor_within_the_deadline() {
    let mut d = Deployment::start(EtcdCluster::single().await, "clientkill", 3, 2).await;
    let seed = d.primary(2).await.addr.clone();
    let client = cluster_client(&seed).await;
    let keys = keys_named("ck", 60);
    let owners = shards_of(&seed, &keys).await;
    let key = keys[owners
        .iter()
        .position(|&s| s == 0)
        .expect("a key of shard 0")]
    .clone();
    assert_eq!(
        remaining(&client.check(key.clone(), LIMIT, 1).await),
        LIMIT.burst - 1
    );
    let old = d.primary(0).await.addr.clone();
    let successor = d.standby(0).await.addr.clone();
    d.nodes[0]
        .iter_mut()
        .find(|n| n.addr == old)
        .expect("the primary")
        .kill();

    // A call already on the dying connection may be lost (it may have been
    // charged, so it is not resent); the next one waits out the election
    // within its deadline: the shard's round finds no primary, the client
    // waits, refreshes the map and tries again until the successor serves.
    let mut outcome = client.check(key.clone(), LIMIT, 1).await;
    if !matches!(outcome, Outcome::Decided(_)) {
        outcome = client.check(key.clone(), LIMIT, 1).await;
    }
    assert!(
        matches!(outcome, Outcome::Decided(ref dec) if dec.allowed),
        "{outcome:?}"
    );
    let status = d.status().await;
    assert_eq!(
        status.shards[0].primary.as_ref().map(|p| p.addr.as_str()),
        Some(successor.as_str())
    );
    assert!(client.cluster_stats().unwrap().retries > 0);
    // Other shards were never disturbed.
    let other = keys[owners.iter().position(|&s| s == 1).unwrap()].clone();
    assert!(client.check(other, LIMIT, 1).await.is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_of_a_moving_slot_waits_out_try_again_within_its_deadline() {
    let d = Deployment::start(EtcdCluster::single().await, "clientta", 3, 2).await;
    let source = d.primary(0).await.addr.clone();
    let client = cluster_client(&d.primary(2).await.addr).await;
    let key = keys_named("ct", 4000)
        .into_iter()
        .find(|k| Slot::of(k.as_bytes()).get() < 1024)
        .expect("a key of slots 0-1023");
    assert_eq!(
        remaining(&client.check(key.clone(), LIMIT, 1).await),
        LIMIT.burst - 1
    );
    // The target's primary answers nothing: the move stays pending, and
    // every node answers TryAgain for the slots.
    let target = d.primary(1).await;
    target.pause();
    let k = keys("clientta");
    let (_, version) = load_topology(&d.client, &k).await.unwrap();
    begin_move(
        &d.client,
        &k,
        SlotRange::new(0, 1023).unwrap(),
        ShardId(1),
        version,
    )
    .await
    .unwrap();
    eventually("the source's map shows the move", || async {
        let mut r = Router::new(vec![source.clone()]);
        r.refresh().await;
        r.map().filter(|m| !m.moving.is_empty()).map(|_| ())
    })
    .await;
    // With the default 5 ms budget the check is undecided at once.
    let quick = client
        .with_deadline(Duration::from_millis(5))
        .check(key.clone(), LIMIT, 1)
        .await;
    assert!(matches!(quick, Outcome::Undecided { .. }), "{quick:?}");
    // With a long one it waits (resending after TryAgain) until the move
    // is done, then the new owner decides, with the state that moved.
    let waiting = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        async move { client.check(key, LIMIT, 1).await }
    });
    eventually(
        "the check has been answered TryAgain and resent",
        || async { (client.cluster_stats().unwrap().retries > 0).then_some(()) },
    )
    .await;
    target.resume();
    let outcome = within("the waiting check", waiting).await.unwrap();
    assert_eq!(remaining(&outcome), LIMIT.burst - 2, "{outcome:?}");
}
