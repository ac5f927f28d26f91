//! Slot moves between real shards: while the move is pending nobody
//! admits the slots (a check gets TryAgain on its own, a RESET is refused
//! whole), the states reach the target, ownership flips in one etcd
//! transaction, and a client with the old map reaches the new owner after
//! one MOVED.

use tollgate::cluster::{begin_move, load_topology, ShardId, SlotRange};
use tollgate::slot::Slot;
use tollgate_protocol::{CheckResult, ErrorCode, Request, Response};

use crate::etcd::EtcdCluster;
use crate::nodes::*;
use crate::router::{Outcome, Router};
use crate::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_range_moves_with_its_states_and_clients_follow_after_one_moved() {
    let d = Deployment::start(EtcdCluster::single().await, "moves", 2, 2).await;
    let source = d.primary(0).await.addr.clone();
    let target = d.primary(1).await;
    let k = keys("moves");
    // Slots 0-1023 belong to shard 0; keys in them, and one outside.
    let range = SlotRange::new(0, 1023).unwrap();
    let all = keys_named("mv", 4000);
    let moving: Vec<&String> = all
        .iter()
        .filter(|key| range.contains(Slot::of(key.as_bytes()).get()))
        .take(20)
        .collect();
    let staying = all
        .iter()
        .find(|key| {
            let s = Slot::of(key.as_bytes()).get();
            (1024..8192).contains(&s)
        })
        .unwrap();
    let mut router = Router::new(vec![source.clone()]);
    for (i, key) in moving.iter().enumerate() {
        for _ in 0..=i % 5 {
            assert!(router.check(key, LIMIT, 1).await.allowed());
        }
    }

    // The target's primary answers nothing for now: the move stays pending.
    target.pause();
    let (_, version) = load_topology(&d.client, &k).await.unwrap();
    begin_move(&d.client, &k, range, ShardId(1), version)
        .await
        .unwrap();
    eventually("the source's map shows the move", || async {
        let mut r = Router::new(vec![source.clone()]);
        r.refresh().await;
        r.map().filter(|m| !m.moving.is_empty()).map(|_| ())
    })
    .await;
    // A check of a moving slot: TryAgain on its own, the others served.
    let checked = router
        .call(&source, &Request::Check(batch(&[moving[0], staying])))
        .await
        .expect("an answer");
    let still_pending = |d: &Deployment| {
        let (c, k) = (d.client.clone(), k.clone());
        async move { !load_topology(&c, &k).await.unwrap().0.moving.is_empty() }
    };
    assert!(still_pending(&d).await, "the move must still be pending");
    match checked {
        Response::Checked(r) => {
            assert!(
                matches!(r[0], CheckResult::Error(ErrorCode::TryAgain)),
                "{r:?}"
            );
            assert!(
                matches!(r[1], CheckResult::Decision(ref d) if d.allowed),
                "{r:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A RESET with a moving key is refused whole.
    let reset = router
        .call(
            &source,
            &Request::Reset(vec![moving[1].as_bytes().to_vec().into()]),
        )
        .await
        .expect("an answer");
    assert!(
        matches!(
            &reset,
            Response::Error {
                code: ErrorCode::TryAgain,
                ..
            }
        ),
        "{reset:?}"
    );
    assert!(still_pending(&d).await, "the move must still be pending");
    target.resume();

    // The source copies the states and flips the slots to shard 1.
    let flipped = eventually("the slots belong to shard 1", || async {
        let (t, v) = load_topology(&d.client, &k).await.ok()?;
        let owned = t
            .shard(ShardId(1))
            .is_some_and(|s| s.slots.iter().any(|r| r.covers(range)));
        (owned && t.moving.is_empty()).then_some(v)
    })
    .await;
    let owner = d.primary(1).await.addr.clone();
    // The router's map is older: one MOVED, then the new owner answers,
    // with every charge made on the source.
    for (i, key) in moving.iter().enumerate() {
        let answer = router.send_check(key, Request::Peek(batch(&[key]))).await;
        let Outcome::Decided(d) = &answer.outcome else {
            panic!("{key}: {answer:?}");
        };
        assert_eq!(answer.node, owner, "{key}");
        if i == 0 {
            assert_eq!(
                answer.moved, 1,
                "the first check after the flip: {answer:?}"
            );
        } else {
            assert_eq!(answer.moved, 0, "the map is fresh by now: {answer:?}");
        }
        let charged = (i % 5 + 1) as u64;
        assert_eq!(d.remaining, LIMIT.burst - charged - 1, "{key}");
    }
    assert_eq!(router.map().unwrap().version, flipped);
    // The CLI waits for the same: another range moved with it, back.
    let out = d.move_slots("0-1023", 0);
    assert!(out.contains("belong to shard 0"), "{out}");
    let answer = router
        .send_check(moving[0], Request::Peek(batch(&[moving[0]])))
        .await;
    assert!(
        matches!(answer.outcome, Outcome::Decided(ref d) if d.remaining == LIMIT.burst - 2),
        "{answer:?}"
    );
    // The source primary counted its move; nodes count their redirects.
    let admin = &d.nodes[0].iter().find(|n| n.addr == source).unwrap().admin;
    let metrics = http_get(admin, "/metrics").await.expect("/metrics");
    assert!(
        metrics.contains("tollgate_cluster_slot_moves_total 1"),
        "{metrics}"
    );
}
