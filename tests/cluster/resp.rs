//! The RESP front end of cluster nodes: a command on a key whose slot
//! another shard owns answers `-MOVED slot host:port` (the owner's host on
//! the RESP port, as CLUSTER SLOTS names it) and counts nothing here; in
//! a MULTI it is refused when queued and EXEC answers EXECABORT. A
//! standby sends its own shard's keys to its primary alike.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::slot::Slot;

use crate::etcd::EtcdCluster;
use crate::nodes::*;
use crate::procs::free_addr;
use crate::router::Router;
use crate::*;

/// Sends `words` as one RESP command and reads `lines` reply lines.
async fn call(stream: &mut TcpStream, words: &[&str], lines: usize) -> Vec<String> {
    let mut out = format!("*{}\r\n", words.len());
    for w in words {
        out.push_str(&format!("${}\r\n{w}\r\n", w.len()));
    }
    stream.write_all(out.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    within("a RESP reply", async {
        while got.iter().filter(|&&b| b == b'\n').count() < lines {
            let mut buf = [0u8; 1024];
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    String::from_utf8(got)
        .unwrap()
        .split_terminator("\r\n")
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_shard_is_moved_and_not_counted() {
    let mut d = Deployment::start(EtcdCluster::single().await, "resp-moved", 2, 0).await;
    // Shard 0: a primary and a standby (started second); shard 1: one.
    let resp: Vec<String> = (0..3).map(|_| free_addr()).collect();
    for (shard, addr) in [(0u16, &resp[0]), (1, &resp[1])] {
        let node = d.spawn(shard, &["--resp", addr]);
        d.nodes.push(vec![node]);
    }
    d.settled().await;
    let standby = d.spawn(0, &["--resp", &resp[2]]);
    d.nodes[0].push(standby);
    d.settled().await;
    let mut router = Router::new(vec![d.nodes[0][0].addr.clone()]);
    router
        .refresh_until_primaries(
            &[&d.nodes[0][0].addr, &d.nodes[1][0].addr],
            crate::common::PATIENCE,
        )
        .await;
    let map = router.map().unwrap().clone();
    let keys = keys_named("resp", 100);
    let of_shard = |shard: u16| {
        keys.iter()
            .find(|k| map.owner(Slot::of(k.as_bytes()).get()).map(|s| s.id) == Some(shard))
            .expect("a key of the shard")
            .clone()
    };
    let (k0, k1) = (of_shard(0), of_shard(1));
    let slot1 = Slot::of(k1.as_bytes()).get();
    // Every node runs its RESP front end on the same port in a deployment:
    // the owner's host, this node's RESP port.
    let port0 = resp[0].rsplit_once(':').unwrap().1;
    let moved = format!("-MOVED {slot1} 127.0.0.1:{port0}");

    let mut c = within("connect", TcpStream::connect(&resp[0]))
        .await
        .unwrap();
    for words in [
        &["CL.THROTTLE", &k1, "4", "5", "60"][..],
        &["INCR", &k1],
        &["INCRBY", &k1, "3"],
        &["EXPIRE", &k1, "60"],
        &["GET", &k1],
        &["DEL", &k0, &k1],
    ] {
        assert_eq!(call(&mut c, words, 1).await, [moved.as_str()], "{words:?}");
    }
    // Its own key is counted here.
    assert_eq!(call(&mut c, &["INCR", &k0], 1).await, [":1"]);
    // In a MULTI: refused when queued, as Redis Cluster does.
    assert_eq!(call(&mut c, &["MULTI"], 1).await, ["+OK"]);
    assert_eq!(call(&mut c, &["INCR", &k0], 1).await, ["+QUEUED"]);
    assert_eq!(call(&mut c, &["INCR", &k1], 1).await, [moved.as_str()]);
    assert_eq!(
        call(&mut c, &["EXEC"], 1).await,
        ["-EXECABORT Transaction discarded because of previous errors."]
    );

    // Nothing of the foreign key was stored on shard 0's node; its owner
    // counts it from 1.
    let admin0 = d.nodes[0][0].admin.clone();
    let path = format!("/v1/limits/{}", k1.replace('{', "%7B").replace('}', "%7D"));
    let limits = http_get(&admin0, &path)
        .await
        .expect("the admin API answers");
    assert!(limits.contains("\"states\":[]"), "{limits}");
    let mut owner = within("connect", TcpStream::connect(&resp[1]))
        .await
        .unwrap();
    assert_eq!(call(&mut owner, &["INCR", &k1], 1).await, [":1"]);
    assert_eq!(call(&mut c, &["GET", &k0], 2).await, ["$1", "1"]);

    // Shard 0's standby sends its own shard's keys to its primary too,
    // and counts nothing.
    assert_eq!(d.primary(0).await.addr, d.nodes[0][0].addr);
    let slot0 = Slot::of(k0.as_bytes()).get();
    let port2 = resp[2].rsplit_once(':').unwrap().1;
    let mut s = within("connect", TcpStream::connect(&resp[2]))
        .await
        .unwrap();
    let to_primary = format!("-MOVED {slot0} 127.0.0.1:{port2}");
    assert_eq!(call(&mut s, &["INCR", &k0], 1).await, [to_primary.as_str()]);
    assert_eq!(call(&mut c, &["GET", &k0], 2).await, ["$1", "1"]);
}
