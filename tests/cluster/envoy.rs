//! The Envoy RLS port in cluster mode (issue 23): a call whose
//! descriptor's key another shard owns is refused whole with
//! FAILED_PRECONDITION `MOVED <slot> <host>:<port>`, charging nothing
//! here or anywhere, while the owner's own port counts it.

use std::collections::HashMap;
use std::net::SocketAddr;
use tollgate::slot::Slot;

use crate::etcd::EtcdCluster;
use crate::nodes::*;
use crate::procs::free_addr;
use crate::rls::{call, h2_client, message_of, Answer, FAILED_PRECONDITION, OK};
use crate::router::Router;
use crate::support::http_get;

/// The descriptor value `u<i>` whose key (`edge|user=u<i>`) the node at
/// `owner` serves.
fn user_of(router: &Router, owner: &str) -> String {
    (0..10_000)
        .map(|i| format!("u{i}"))
        .find(|u| router.owner(format!("edge|user={u}").as_bytes()).as_deref() == Some(owner))
        .expect("a key of the shard")
}

async fn should_rate_limit(envoy: SocketAddr, users: &[&str]) -> Answer {
    let send = h2_client(envoy).await.expect("the RLS port answers");
    let descriptors: Vec<(&str, &str)> = users.iter().map(|u| ("user", *u)).collect();
    call(&send, envoy, None, message_of("edge", &descriptors))
        .await
        .expect("an answer")
}

/// The node's Envoy checks so far (allowed and denied).
async fn envoy_checks(admin: &str) -> u64 {
    let text = http_get(admin, "/metrics").await.expect("metrics");
    text.lines()
        .filter(|l| l.starts_with("tollgate_frontend_checks_total{frontend=\"envoy\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rls_call_for_another_shards_key_is_moved_and_counted_nowhere() {
    let mut envoys = Vec::new();
    let d = Deployment::start_each(
        EtcdCluster::single().await,
        "envoy",
        2,
        1,
        &LEASE_FLAGS,
        |_| {
            let addr = free_addr();
            envoys.push(addr.clone());
            vec!["--envoy-rls".into(), addr]
        },
    )
    .await;
    // One node a shard, each its shard's primary, each with its RLS port.
    let envoy: HashMap<String, SocketAddr> = d
        .nodes
        .iter()
        .map(|n| n[0].addr.clone())
        .zip(envoys.iter().map(|a| a.parse().unwrap()))
        .collect();
    let (node0, node1) = (&d.nodes[0][0], &d.nodes[1][0]);
    let mut router = Router::new(vec![node0.addr.clone()]);
    router
        .refresh_until_primaries(&[&node0.addr, &node1.addr], crate::common::PATIENCE)
        .await;
    let u0 = user_of(&router, &node0.addr);
    let u1 = user_of(&router, &node1.addr);
    let slot1 = Slot::of(format!("edge|user={u1}").as_bytes()).get();

    // Shard 1's key at shard 0's port: MOVED naming the owner on this
    // node's RLS port (one machine: each node's port differs, the host is
    // the owner's), and nothing counted.
    let moved = should_rate_limit(envoy[&node0.addr], &[&u1]).await;
    assert_eq!(moved.status, FAILED_PRECONDITION, "{moved:?}");
    let port0 = envoy[&node0.addr].port();
    assert_eq!(moved.message, format!("MOVED {slot1} 127.0.0.1:{port0}"));
    // With a key of its own first: the call is refused whole.
    let mixed = should_rate_limit(envoy[&node0.addr], &[&u0, &u1]).await;
    assert_eq!(mixed.status, FAILED_PRECONDITION, "{mixed:?}");
    assert_eq!(envoy_checks(&node0.admin).await, 0, "counted at shard 0");

    // Each key at its owner: the first charge of each (10 per minute).
    let own0 = should_rate_limit(envoy[&node0.addr], &[&u0]).await;
    assert_eq!((own0.status, own0.remaining()), (OK, vec![9]), "{own0:?}");
    let own1 = should_rate_limit(envoy[&node1.addr], &[&u1]).await;
    assert_eq!((own1.status, own1.remaining()), (OK, vec![9]), "{own1:?}");
}
