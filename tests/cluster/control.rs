//! `cluster init` and `status`, topology changes from a stale version,
//! the watch-fed routing table, elections and their epochs.

use tollgate::cluster::{
    abort_move, begin_move, complete_move, init, load_topology, status, Campaign, ClusterError,
    ClusterView, Fence, Member, NodeRecord, Route, ShardId, SlotRange, TopologyError, Unavailable,
};

use crate::etcd::EtcdCluster;
use crate::*;

fn elected(c: Campaign) -> u64 {
    match c {
        Campaign::Elected { epoch } => epoch,
        other => panic!("expected to be elected: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_creates_a_cluster_once_and_status_lists_shards_primaries_and_standbys() {
    let etcd = EtcdCluster::single().await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("prod");
    assert!(matches!(
        status(&e, &k).await,
        Err(ClusterError::NoCluster { .. })
    ));
    let missing = Member::join(
        e.clone(),
        k.clone(),
        NodeRecord {
            addr: "127.0.0.1:7001".into(),
            shard: ShardId(0),
            admin: None,
        },
        &settings(etcd.endpoints()),
    )
    .await;
    assert!(matches!(missing, Err(ClusterError::NoCluster { .. })));

    let (topology, version) = init(&e, &k, 3).await.unwrap();
    assert_eq!(topology.shards.len(), 3);
    assert!(version > 0);
    match init(&e, &k, 5).await {
        Err(ClusterError::ClusterExists {
            cluster,
            version: v,
        }) => {
            assert_eq!((cluster.as_str(), v), ("prod", version))
        }
        other => panic!("a second init must be refused: {other:?}"),
    }
    assert_eq!(load_topology(&e, &k).await.unwrap(), (topology, version));
    // Another name is another cluster.
    init(&e, &keys("staging"), 1).await.unwrap();

    let a = join(&e, &k, "127.0.0.1:7001", 0).await;
    let b = join(&e, &k, "127.0.0.1:7002", 0).await;
    let c = join(&e, &k, "127.0.0.1:7011", 1).await;
    let epoch = elected(a.campaign().await.unwrap());
    assert_eq!(elected(a.campaign().await.unwrap()), epoch, "idempotent");
    match b.campaign().await.unwrap() {
        Campaign::Follower { primary, epoch: e } => {
            assert_eq!((primary.addr.as_str(), e), ("127.0.0.1:7001", epoch))
        }
        other => panic!("{other:?}"),
    }
    let on_shard_2 = Member::join(
        e.clone(),
        k.clone(),
        NodeRecord {
            addr: "127.0.0.1:7099".into(),
            shard: ShardId(3),
            admin: None,
        },
        &settings(etcd.endpoints()),
    )
    .await;
    assert!(matches!(
        on_shard_2,
        Err(ClusterError::NoSuchShard { shards: 3, .. })
    ));

    let s = status(&e, &k).await.unwrap();
    assert_eq!(s.version, version);
    let s0 = &s.shards[0];
    let primary = s0.primary.as_ref().expect("shard 0 has a primary");
    assert_eq!(
        (primary.addr.as_str(), primary.epoch),
        ("127.0.0.1:7001", epoch)
    );
    assert_eq!(s0.standbys.len(), 1);
    assert_eq!(s0.standbys[0].addr, "127.0.0.1:7002");
    assert!(s.shards[1].primary.is_none());
    assert_eq!(s.shards[1].standbys[0].addr, "127.0.0.1:7011");
    assert!(s.shards[2].primary.is_none() && s.shards[2].standbys.is_empty());
    let text = s.to_string();
    assert!(text.contains("cluster prod: 3 shards"), "{text}");
    assert!(text.contains("0-5461"), "{text}");
    assert!(text.contains(&epoch.to_string()), "{text}");
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["shards"][0]["slots"], serde_json::json!([[0, 5461]]));
    assert_eq!(json["shards"][0]["primary"]["epoch"], epoch);
    drop((a, b, c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_changes_from_a_stale_version_or_a_fenced_epoch_write_nothing() {
    let etcd = EtcdCluster::single().await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("moves");
    let (_, v1) = init(&e, &k, 2).await.unwrap();
    let first = SlotRange::new(0, 99).unwrap();
    let v2 = begin_move(&e, &k, first, ShardId(1), v1).await.unwrap();
    assert!(v2 > v1);
    // A second change computed from v1 is refused: nothing written.
    let second = SlotRange::new(200, 299).unwrap();
    match begin_move(&e, &k, second, ShardId(1), v1).await {
        Err(ClusterError::TopologyChanged { expected, current }) => {
            assert_eq!((expected, current), (v1, v2))
        }
        other => panic!("a stale change must be refused: {other:?}"),
    }
    let (t, v) = load_topology(&e, &k).await.unwrap();
    assert_eq!(v, v2);
    assert_eq!(t.moving.len(), 1);
    assert!(matches!(
        complete_move(&e, &k, first, v1, None).await,
        Err(ClusterError::TopologyChanged { .. })
    ));
    // Moves the topology cannot hold are refused before anything is sent.
    assert!(matches!(
        begin_move(&e, &k, SlotRange::new(50, 60).unwrap(), ShardId(1), v2).await,
        Err(ClusterError::Topology(TopologyError::MoveOverlap { .. }))
    ));
    assert!(matches!(
        abort_move(&e, &k, second, v2).await,
        Err(ClusterError::Topology(TopologyError::NoSuchMove { .. }))
    ));

    // The flip fenced by the source shard's epoch: refused for a stale
    // epoch, done for the current one.
    let a = join(&e, &k, "127.0.0.1:7001", 0).await;
    let epoch = elected(a.campaign().await.unwrap());
    match complete_move(
        &e,
        &k,
        first,
        v2,
        Some(Fence {
            shard: ShardId(0),
            epoch: epoch - 1,
        }),
    )
    .await
    {
        Err(ClusterError::Fenced {
            shard,
            epoch: stale,
            current,
        }) => assert_eq!((shard, stale, current), (ShardId(0), epoch - 1, epoch)),
        other => panic!("a fenced flip must be refused: {other:?}"),
    }
    let fence = Fence {
        shard: ShardId(0),
        epoch,
    };
    let v3 = complete_move(&e, &k, first, v2, Some(fence)).await.unwrap();
    let (t, v) = load_topology(&e, &k).await.unwrap();
    assert_eq!(v, v3);
    assert!(t.moving.is_empty());
    assert_eq!(t.owner_of(50), Some(ShardId(1)));
    assert_eq!(t.owner_of(100), Some(ShardId(0)));
    // Begin and abort: ownership unchanged, version moved on.
    let v4 = begin_move(&e, &k, second, ShardId(1), v3).await.unwrap();
    let v5 = abort_move(&e, &k, second, v4).await.unwrap();
    let (after, v) = load_topology(&e, &k).await.unwrap();
    assert_eq!((after, v), (t, v5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_keeps_the_routing_table_current() {
    let etcd = EtcdCluster::single().await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("watched");
    let view = ClusterView::start(e.clone(), k.clone()).await.unwrap();
    assert!(!view.table().has_topology());
    let (_, v1) = init(&e, &k, 2).await.unwrap();
    let t = within("the topology", view.wait_for(|t| t.version() == v1)).await;
    assert_eq!(t.owner(0).unwrap().id, ShardId(0));
    assert_eq!(
        t.route(0, None, "x"),
        Route::TryAgain(Unavailable::NoPrimary(ShardId(0)))
    );

    let a_addr = "127.0.0.1:7001";
    let a = join(&e, &k, a_addr, 0).await;
    let epoch = elected(a.campaign().await.unwrap());
    let b = join(&e, &k, "127.0.0.1:7002", 0).await;
    let t = within(
        "primary and standby",
        view.wait_for(|t| {
            let s = t.shard(ShardId(0)).unwrap();
            s.primary.is_some() && s.standbys.len() == 1
        }),
    )
    .await;
    assert_eq!(
        t.shard(ShardId(0)).unwrap().primary.as_ref().unwrap().epoch,
        epoch
    );
    assert_eq!(t.route(7, Some(ShardId(0)), a_addr), Route::Local);
    assert_eq!(
        t.route(7, None, "127.0.0.1:7002"),
        Route::Moved {
            slot: 7,
            addr: a_addr,
            version: v1
        }
    );
    assert_eq!(
        view.tables().load().revision(),
        t.revision(),
        "the check path's handle sees the same table"
    );

    let range = SlotRange::new(0, 9).unwrap();
    let v2 = begin_move(&e, &k, range, ShardId(1), v1).await.unwrap();
    let t = within("the move", view.wait_for(|t| t.version() == v2)).await;
    assert!(matches!(
        t.route(7, Some(ShardId(0)), a_addr),
        Route::TryAgain(Unavailable::Moving(m)) if m.slots == range
    ));
    let v3 = complete_move(&e, &k, range, v2, None).await.unwrap();
    let t = within("the flip", view.wait_for(|t| t.version() == v3)).await;
    assert_eq!(t.owner(7).unwrap().id, ShardId(1));
    assert_eq!(
        t.route(7, Some(ShardId(0)), a_addr),
        Route::TryAgain(Unavailable::NoPrimary(ShardId(1)))
    );

    b.leave().await.unwrap();
    within(
        "the standby leaves",
        view.wait_for(|t| t.shard(ShardId(0)).unwrap().standbys.is_empty()),
    )
    .await;
    a.leave().await.unwrap();
    let t = within(
        "the primary leaves",
        view.wait_for(|t| t.shard(ShardId(0)).unwrap().primary.is_none()),
    )
    .await;
    assert!(t.revision() > v3);
    assert!(view.in_sync());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_grow_with_every_primary_and_a_restarted_node_is_not_its_old_self() {
    let etcd = EtcdCluster::single().await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("epochs");
    init(&e, &k, 1).await.unwrap();
    let a = join(&e, &k, "127.0.0.1:7001", 0).await;
    let b = join(&e, &k, "127.0.0.1:7002", 0).await;
    let e1 = elected(a.campaign().await.unwrap());
    // A graceful hand-over: the next campaign wins at once, later epoch.
    assert!(
        !a.resign(e1 - 1).await.unwrap(),
        "only the current epoch resigns"
    );
    assert!(a.resign(e1).await.unwrap());
    let e2 = elected(b.campaign().await.unwrap());
    assert!(e2 > e1);
    assert!(matches!(
        a.campaign().await.unwrap(),
        Campaign::Follower { epoch, .. } if epoch == e2
    ));

    // B crashes (no revoke) and restarts at the same address with a new
    // lease: until the old lease expires, the key is its old self's.
    let b_lease = b.deadline().lease_id();
    drop(b);
    let b2 = join(&e, &k, "127.0.0.1:7002", 0).await;
    match b2.campaign().await.unwrap() {
        Campaign::Follower { primary, epoch } => {
            assert_eq!(primary.lease, b_lease);
            assert_eq!(epoch, e2);
        }
        other => panic!("a new lease is not the old primary: {other:?}"),
    }
    // Once etcd expires the old lease, a campaign wins at a later epoch.
    let e3 = eventually("the old lease expires and a campaign wins", || async {
        match a.campaign().await.unwrap() {
            Campaign::Elected { epoch } => Some(epoch),
            Campaign::Follower { .. } => None,
        }
    })
    .await;
    assert!(e3 > e2);
    drop(b2);
}
