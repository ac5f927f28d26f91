//! A STATUS announce to a cluster node (PROTOCOL.md §15, "Epochs out of
//! range"): etcd decides the roles, yet an announce of an impossible epoch
//! is answered ERROR Malformed, as in a pair, and changes nothing.

use tollgate_protocol::{Announce, ErrorCode, ReplResponse, Response, Role};

use crate::etcd::EtcdCluster;
use crate::nodes::*;
use crate::procs::{announce_as_node, status};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announce_of_an_impossible_epoch_is_refused_in_cluster_mode() {
    let d = Deployment::start(EtcdCluster::single().await, "announce", 1, 1).await;
    let primary = d.primary(0).await.addr.clone();
    let before = status(&primary).await.expect("the primary answers");
    let absurd = Announce {
        role: Role::Primary,
        epoch: u64::MAX,
        addr: "127.0.0.1:1".into(),
    };
    match announce_as_node(&primary, absurd).await {
        Response::Error { code, .. } => assert_eq!(code, ErrorCode::Malformed),
        other => panic!("an epoch of 2^64 - 1 must be refused: {other:?}"),
    }
    let after = status(&primary).await.expect("the primary answers");
    assert_eq!(
        (after.role, after.epoch),
        (Role::Primary, before.epoch),
        "{after:?}"
    );
    // A believable announce is still answered, and changes no role.
    let standby = Announce {
        role: Role::Standby,
        epoch: before.epoch,
        addr: "127.0.0.1:1".into(),
    };
    match announce_as_node(&primary, standby).await {
        Response::Repl(ReplResponse::Status(s)) => assert_eq!(s.role, Role::Primary),
        other => panic!("a believable announce: {other:?}"),
    }
}
