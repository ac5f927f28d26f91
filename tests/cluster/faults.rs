//! A primary's lease deadline under faults: cut off from etcd (a paused or
//! partitioned node: its renewals stop), etcd without quorum, etcd's leader
//! killed.

use std::time::{Duration, Instant};

use tollgate::cluster::{init, Campaign, ClusterError, ClusterView, ShardId};

use crate::etcd::EtcdCluster;
use crate::proxy::Proxy;
use crate::*;

fn elected(c: Campaign) -> u64 {
    match c {
        Campaign::Elected { epoch } => epoch,
        other => panic!("expected to be elected: {other:?}"),
    }
}

/// The safety property of the lease deadline: the old primary stops
/// serving (its deadline) before the new one is elected, on one clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_off_from_etcd_stops_before_anyone_replaces_it() {
    let etcd = EtcdCluster::single().await;
    let to_etcd = Proxy::start(&etcd.endpoint(0)).await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("cutoff");
    init(&e, &k, 1).await.unwrap();
    let view = ClusterView::start(e.clone(), k.clone()).await.unwrap();
    // A talks to etcd through the proxy, B directly.
    let a_settings = settings(vec![to_etcd.addr()]);
    let e_a = tollgate::cluster::Etcd::connect(&a_settings).await.unwrap();
    let a = join_with(&e_a, &k, "127.0.0.1:7001", 0, &a_settings).await;
    let b = join(&e, &k, "127.0.0.1:7002", 0).await;
    let e1 = elected(a.campaign().await.unwrap());
    assert!(matches!(
        b.campaign().await.unwrap(),
        Campaign::Follower { .. }
    ));
    eventually("A renews its lease", || async {
        (a.deadline().renewals() >= 2).then_some(())
    })
    .await;
    assert!(a.deadline().is_valid());

    to_etcd.cut();
    // B campaigns until it wins; A's deadline passes meanwhile.
    let (e2, b_elected_at) = eventually("B takes over", || async {
        match b.campaign().await.unwrap() {
            Campaign::Elected { epoch } => Some((epoch, Instant::now())),
            Campaign::Follower { .. } => None,
        }
    })
    .await;
    assert!(e2 > e1, "a later primary has a later epoch: {e2} > {e1}");
    let a_until = a
        .deadline()
        .valid_until()
        .expect("not known lost while cut off");
    assert!(
        a_until < b_elected_at,
        "A's deadline ({a_until:?}) must pass before B is elected ({b_elected_at:?})"
    );
    assert!(!a.deadline().is_valid());
    within("A's deadline passes", a.deadline().expired()).await;
    let t = within(
        "the view sees B",
        view.wait_for(|t| {
            t.shard(ShardId(0))
                .and_then(|s| s.primary.as_ref())
                .is_some_and(|p| p.epoch == e2)
        }),
    )
    .await;
    assert_eq!(
        t.shard(ShardId(0)).unwrap().primary.as_ref().unwrap().addr,
        "127.0.0.1:7002"
    );

    // Healed: etcd tells A its lease is gone; it can no longer campaign.
    to_etcd.heal();
    eventually("A learns its lease is gone", || async {
        a.deadline().is_lost().then_some(())
    })
    .await;
    assert!(matches!(
        a.campaign().await,
        Err(ClusterError::LeaseLost { .. })
    ));
}

/// A member's campaign, asked again until etcd answers it: `None` once the
/// member knows its lease is lost (a node then joins again with a new
/// lease). Gives up with the last error.
async fn answered_campaign(m: &tollgate::cluster::Member) -> Option<Campaign> {
    let mut last = None;
    let answer = tokio::time::timeout(PATIENCE, async {
        loop {
            match m.campaign().await {
                Ok(c) => return Some(c),
                Err(ClusterError::LeaseLost { .. }) => return None,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    answer.unwrap_or_else(|_| panic!("no campaign answered in {PATIENCE:?}; last error: {last:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_the_deadline_passes_and_the_cluster_recovers_when_quorum_returns() {
    let mut etcd = EtcdCluster::three().await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("quorum");
    init(&e, &k, 1).await.unwrap();
    let view = ClusterView::start(e.clone(), k.clone()).await.unwrap();
    let a = join(&e, &k, "127.0.0.1:7001", 0).await;
    let b = join(&e, &k, "127.0.0.1:7002", 0).await;
    let e1 = elected(a.campaign().await.unwrap());
    eventually("A renews its lease", || async {
        (a.deadline().renewals() >= 2).then_some(())
    })
    .await;

    // Two of three members stop: no quorum, no renewal, no election.
    etcd.pause(1);
    etcd.pause(2);
    within("A's deadline passes", a.deadline().expired()).await;
    assert!(!a.deadline().is_valid(), "A must know it may not serve");
    assert!(matches!(
        b.campaign().await,
        Err(ClusterError::Timeout { .. } | ClusterError::Etcd { .. })
    ));
    eventually("the view knows it may be stale", || async {
        (!view.in_sync()).then_some(())
    })
    .await;

    etcd.resume(1);
    etcd.resume(2);
    etcd.wait_for_leader().await;
    // etcd's new leader extends every lease it still has, so A's usually
    // survives and is renewed; if the old leader's revocation was
    // committed instead, A learns it lost the lease and a new member wins.
    let renewed = eventually("A's lease is renewed or known lost", || async {
        if a.deadline().is_lost() {
            Some(false)
        } else {
            a.deadline().is_valid().then_some(true)
        }
    })
    .await;
    eprintln!(
        "quorum back: A's lease was {}",
        if renewed {
            "kept and renewed"
        } else {
            "revoked"
        }
    );
    if renewed {
        // The lease's keep-alive stream may be back while a new request
        // still times out (seen for campaigns and joins in the first
        // seconds after quorum returns), so requests are asked again until
        // they answer, as a node's periodic campaign would be.
        assert_eq!(
            answered_campaign(&a).await,
            Some(Campaign::Elected { epoch: e1 })
        );
        // B's lease runs on its own: the old leader's revocation of it may
        // have been committed although A's was not. Either way a member
        // of the shard that campaigns now (B, or B joined again with a new
        // lease, as a node does) follows A at its epoch.
        let follower = match answered_campaign(&b).await {
            Some(campaign) => campaign,
            None => {
                let again = join_when_etcd_answers(&e, &k, "127.0.0.1:7002", 0).await;
                answered_campaign(&again).await.expect("a fresh lease")
            }
        };
        assert!(
            matches!(follower, Campaign::Follower { epoch, .. } if epoch == e1),
            "{follower:?}"
        );
    } else {
        let c = join_when_etcd_answers(&e, &k, "127.0.0.1:7003", 0).await;
        let e2 = eventually("a new member takes over", || async {
            match c.campaign().await {
                Ok(Campaign::Elected { epoch }) => Some(epoch),
                other => {
                    eprintln!("C's campaign: {other:?}");
                    None
                }
            }
        })
        .await;
        assert!(e2 > e1);
    }
    eventually("the view is in sync again", || async {
        view.in_sync().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_etcd_leader_keeps_the_primary_its_epoch_and_the_watch() {
    let mut etcd = EtcdCluster::three().await;
    let e = connect(etcd.endpoints()).await;
    let k = keys("leader");
    init(&e, &k, 1).await.unwrap();
    let view = ClusterView::start(e.clone(), k.clone()).await.unwrap();
    let a = join(&e, &k, "127.0.0.1:7001", 0).await;
    let b = join(&e, &k, "127.0.0.1:7002", 0).await;
    let e1 = elected(a.campaign().await.unwrap());

    let leader = etcd.wait_for_leader().await;
    let before = a.deadline().renewals();
    etcd.kill(leader);
    let next = etcd.wait_for_leader().await;
    assert_ne!(next, leader);
    eventually("A renews through the new leader", || async {
        (a.deadline().renewals() >= before + 3 && a.deadline().is_valid()).then_some(())
    })
    .await;
    // etcd's new leader kept the lease: same primary, same epoch.
    assert_eq!(a.campaign().await.unwrap(), Campaign::Elected { epoch: e1 });
    assert!(matches!(
        b.campaign().await.unwrap(),
        Campaign::Follower { epoch, .. } if epoch == e1
    ));
    // The watch follows changes made after the kill.
    let c = join(&e, &k, "127.0.0.1:7003", 0).await;
    let t = within(
        "the view sees the new standby",
        view.wait_for(|t| t.shard(ShardId(0)).unwrap().standbys.len() == 2),
    )
    .await;
    assert_eq!(
        t.shard(ShardId(0)).unwrap().primary.as_ref().unwrap().epoch,
        e1
    );
    // The killed member comes back and the cluster goes on.
    etcd.restart(leader);
    etcd.wait_for_leader().await;
    c.leave().await.unwrap();
    within(
        "the view sees it leave",
        view.wait_for(|t| t.shard(ShardId(0)).unwrap().standbys.len() == 1),
    )
    .await;
}
