//! A cluster of real nodes routes every key: TOPOLOGY from any node,
//! MOVED from a node that does not own a key's slot (nothing charged), a
//! standby redirecting to its primary, a batch across shards answered
//! MOVED as a whole, and the CLI reaching every key through any node.

use tollgate::slot::Slot;
use tollgate_protocol::{CheckResult, Request, Response};

use crate::etcd::EtcdCluster;
use crate::nodes::*;
use crate::router::{Outcome, Router};

/// The first of `keys` whose slot shard `shard` owns in `map`.
fn key_of<'k>(router: &Router, keys: &'k [String], shard: u16) -> &'k str {
    let map = router.map().expect("a map");
    keys.iter()
        .find(|k| map.owner(Slot::of(k.as_bytes()).get()).map(|s| s.id) == Some(shard))
        .expect("a key of the shard")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_routes_every_key_to_its_shard() {
    let d = Deployment::start(EtcdCluster::single().await, "routing", 2, 2).await;
    let status = d.settled().await;
    let standby0 = d.standby(0).await.addr.clone();
    let primary0 = d.primary(0).await.addr.clone();
    let primary1 = d.primary(1).await.addr.clone();

    // Any node, a standby included, answers the whole map.
    let mut router = Router::new(vec![standby0.clone()]);
    assert!(router.refresh().await);
    let map = router.map().unwrap().clone();
    assert_eq!(map.version, status.version);
    assert_eq!(map.shards.len(), 2);
    for (info, shard) in map.shards.iter().zip(&status.shards) {
        let p = shard.primary.as_ref().unwrap();
        assert_eq!(
            (info.primary.as_str(), info.epoch),
            (p.addr.as_str(), p.epoch)
        );
        assert_eq!(info.standbys.len(), 1);
    }

    // Routed by slot: each key reaches its shard's primary directly.
    let keys = keys_named("route", 200);
    for key in &keys {
        let answer = router.check(key, LIMIT, 1).await;
        assert!(answer.allowed(), "{key}: {answer:?}");
        assert_eq!(answer.moved, 0, "{key}");
        let owner = map.owner(Slot::of(key.as_bytes()).get()).unwrap();
        assert_eq!(answer.node, owner.primary, "{key}");
    }

    // A key of shard 1 sent to shard 0's primary: MOVED, nothing charged.
    let k1 = key_of(&router, &keys, 1).to_owned();
    let k0 = key_of(&router, &keys, 0).to_owned();
    let moved = router
        .call(&primary0, &Request::Check(batch(&[&k1])))
        .await
        .expect("an answer");
    let Response::Moved(m) = moved else {
        panic!("expected MOVED: {moved:?}")
    };
    assert_eq!(m.slot, Slot::of(k1.as_bytes()).get());
    assert_eq!(m.addr, primary1);
    assert_eq!(m.version, status.version);
    // A standby sends its own shard's keys to its primary.
    let moved = router
        .call(&standby0, &Request::Check(batch(&[&k0])))
        .await
        .expect("an answer");
    assert!(
        matches!(&moved, Response::Moved(m) if m.addr == primary0),
        "{moved:?}"
    );
    // A batch across the two shards is MOVED whole, for its first foreign
    // key; none of its checks is charged.
    let before = peek(&mut router, &k0).await;
    let moved = router
        .call(&primary0, &Request::Check(batch(&[&k0, &k1, &k0])))
        .await
        .expect("an answer");
    assert!(
        matches!(&moved, Response::Moved(m) if m.slot == Slot::of(k1.as_bytes()).get()),
        "{moved:?}"
    );
    assert_eq!(peek(&mut router, &k0).await, before);
    // The same batch split per shard is served.
    let served = router
        .call(&primary0, &Request::Check(batch(&[&k0, &k0])))
        .await
        .expect("an answer");
    assert!(
        matches!(&served, Response::Checked(r) if r.len() == 2 && r.iter().all(|c| matches!(c, CheckResult::Decision(d) if d.allowed))),
        "{served:?}"
    );

    // The CLI reaches every key through any node (keys of its own: it
    // charges another limit).
    let cli_keys = keys_named("cli", 200);
    let (c0, c1) = (key_of(&router, &cli_keys, 0), key_of(&router, &cli_keys, 1));
    for seed in d.addrs() {
        for key in [c0, c1] {
            let (code, out, err) = tollgate(&[
                "check", "--server", &seed, "--key", key, "--rate", "100/h", "--json",
            ]);
            assert_eq!(code, 0, "check {key} via {seed}: {out}{err}");
            assert!(out.contains("\"allowed\":true"), "{out}");
        }
    }
    let (code, out, err) = tollgate(&[
        "cluster",
        "status",
        "--etcd",
        &d.etcd.endpoints().join(","),
        "--cluster",
        "routing",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["shards"].as_array().unwrap().len(), 2);
    assert_eq!(v["shards"][0]["primary"]["addr"], primary0.as_str());
    assert!(v["shards"][1]["standbys"][0]["lag_ms"].is_u64(), "{v}");
}

/// `remaining` of a PEEK of `key` (charges nothing).
async fn peek(router: &mut Router, key: &str) -> u64 {
    match router
        .send_check(key, Request::Peek(batch(&[key])))
        .await
        .outcome
    {
        Outcome::Decided(d) => d.remaining,
        other => panic!("PEEK {key}: {other:?}"),
    }
}
