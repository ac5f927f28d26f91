//! `CLUSTER SLOTS`, `CLUSTER SHARDS`, `CLUSTER INFO`, `CLUSTER MYID` and
//! `CLUSTER KEYSLOT`: the node's slot map, as the binary protocol's
//! TOPOLOGY answers it ([`Shared::topology`](crate::server::Shared)), in
//! Redis Cluster's shapes, so cluster clients (redis-py's RedisCluster)
//! route each key to the node that serves its slot.
//!
//! Addresses: the topology names nodes by their protocol address; a
//! node's RESP front end is that host on this node's RESP port (every node
//! of a deployment runs it on the same port). Node ids are 40 hex digits
//! derived from the protocol address, so every node names a node alike.

use super::context::Ctx;
use super::reply::Reply;
use crate::server::frontend::on_port;
use crate::slot::Slot;
use tollgate_protocol::{ClusterTopology, ShardInfo};

/// A node as CLUSTER answers name it.
struct NodeRef {
    host: String,
    port: u16,
    id: String,
    primary: bool,
}

/// Redis's 40-hex-digit node id, from a node's protocol address: FNV-1a
/// over it, three times with different offsets (stable across nodes and
/// releases, unlike std's hasher).
pub(super) fn node_id(addr: &str) -> String {
    let fnv = |seed: u64| {
        addr.bytes().fold(seed, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    let a = fnv(0xcbf2_9ce4_8422_2325);
    let b = fnv(0x8422_2325_cbf2_9ce4);
    let c = fnv(0x9ce4_8422_2325_cbf2);
    let mut id = format!("{a:016x}{b:016x}{c:016x}");
    id.truncate(40);
    id
}

fn nodes(shard: &ShardInfo, port: u16) -> Vec<NodeRef> {
    let node = |addr: &String, primary: bool| {
        let (host, port) = on_port(addr, port);
        NodeRef {
            host,
            port,
            id: node_id(addr),
            primary,
        }
    };
    let primary = (!shard.primary.is_empty()).then(|| node(&shard.primary, true));
    primary
        .into_iter()
        .chain(shard.standbys.iter().map(|s| node(s, false)))
        .collect()
}

/// CLUSTER SLOTS: per span of slots, its first and last slot, then the
/// primary and each standby as [host, port, id]. A shard without a
/// primary is left out (its slots are not served now).
pub(super) fn slots(topology: &ClusterTopology, port: u16, reply: &mut Reply) {
    let served: Vec<&ShardInfo> = topology
        .shards
        .iter()
        .filter(|s| !s.primary.is_empty())
        .collect();
    let spans: usize = served.iter().map(|s| s.slots.len()).sum();
    reply.array(spans);
    for shard in served {
        let nodes = nodes(shard, port);
        for span in &shard.slots {
            reply.array(2 + nodes.len());
            reply.int(span.first.into());
            reply.int(span.last.into());
            for n in &nodes {
                reply.array(3);
                reply.bulk(n.host.as_bytes());
                reply.int(n.port.into());
                reply.bulk(n.id.as_bytes());
            }
        }
    }
}

/// CLUSTER SHARDS: per shard, its slots (first, last, ...) and its nodes
/// with id, port, ip, endpoint, role, replication offset and health.
pub(super) fn shards(topology: &ClusterTopology, port: u16, offset: u64, reply: &mut Reply) {
    reply.array(topology.shards.len());
    for shard in &topology.shards {
        reply.map(2);
        reply.bulk(b"slots");
        reply.array(2 * shard.slots.len());
        for span in &shard.slots {
            reply.int(span.first.into());
            reply.int(span.last.into());
        }
        reply.bulk(b"nodes");
        let nodes = nodes(shard, port);
        reply.array(nodes.len());
        for n in &nodes {
            reply.map(7);
            reply.entry_str("id", &n.id);
            reply.entry_int("port", n.port.into());
            reply.entry_str("ip", &n.host);
            reply.entry_str("endpoint", &n.host);
            reply.entry_str("role", if n.primary { "master" } else { "replica" });
            reply.entry_int("replication-offset", offset as i64);
            reply.entry_str("health", "online");
        }
    }
}

/// CLUSTER INFO's text.
pub(super) fn info(topology: &ClusterTopology, epoch: u64) -> String {
    let assigned: u32 = topology
        .shards
        .iter()
        .flat_map(|s| &s.slots)
        .map(|r| u32::from(r.last) - u32::from(r.first) + 1)
        .sum();
    let known: usize = topology
        .shards
        .iter()
        .map(|s| usize::from(!s.primary.is_empty()) + s.standbys.len())
        .sum();
    let state = if assigned == u32::from(crate::slot::SLOT_COUNT) {
        "ok"
    } else {
        "fail"
    };
    format!(
        "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:{assigned}\r\n\
         cluster_slots_ok:{assigned}\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
         cluster_known_nodes:{known}\r\ncluster_size:{}\r\ncluster_current_epoch:{epoch}\r\n\
         cluster_my_epoch:{epoch}\r\n",
        topology.shards.len()
    )
}

/// Answers `CLUSTER <sub> ...` (`args` after the name).
pub(super) fn cluster(ctx: &Ctx, args: &[bytes::Bytes], reply: &mut Reply) {
    let sub = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
    let status = ctx.shared.engine.node().status();
    let topology = ctx.shared.topology();
    match (sub.as_str(), args.len()) {
        ("SLOTS", 1) => slots(&topology, ctx.port, reply),
        ("SHARDS", 1) => shards(&topology, ctx.port, status.offset, reply),
        ("INFO", 1) => reply.bulk(info(&topology, status.epoch).as_bytes()),
        ("MYID", 1) => reply.bulk(node_id(&status.addr).as_bytes()),
        ("KEYSLOT", 2) => reply.int(Slot::of(&args[1]).get().into()),
        _ => reply.error(&format!(
            "ERR unknown subcommand or wrong number of arguments for 'CLUSTER {sub}': \
             Tollgate answers CLUSTER SLOTS, SHARDS, INFO, MYID and KEYSLOT"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use tollgate_protocol::SlotSpan;

    fn two_shards() -> ClusterTopology {
        ClusterTopology {
            version: 3,
            shards: vec![
                ShardInfo {
                    id: 0,
                    epoch: 2,
                    primary: "10.0.0.1:7700".into(),
                    standbys: vec!["10.0.0.2:7700".into()],
                    slots: vec![SlotSpan {
                        first: 0,
                        last: 8191,
                    }],
                },
                ShardInfo {
                    id: 1,
                    epoch: 1,
                    primary: "10.0.0.3:7700".into(),
                    standbys: vec![],
                    slots: vec![SlotSpan {
                        first: 8192,
                        last: 16383,
                    }],
                },
            ],
            moving: vec![],
        }
    }

    #[test]
    fn ids_are_stable_40_hex_digits() {
        let id = node_id("10.0.0.1:7700");
        assert_eq!(id.len(), 40);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id, node_id("10.0.0.1:7700"));
        assert_ne!(id, node_id("10.0.0.2:7700"));
    }

    #[test]
    fn slots_name_every_node_on_the_resp_port() {
        let mut buf = BytesMut::new();
        slots(
            &two_shards(),
            6380,
            &mut Reply {
                buf: &mut buf,
                resp3: false,
            },
        );
        let text = String::from_utf8(buf.to_vec()).unwrap();
        assert!(text.starts_with("*2\r\n*4\r\n:0\r\n:8191\r\n*3\r\n$8\r\n10.0.0.1\r\n:6380\r\n"));
        assert!(text.contains("$8\r\n10.0.0.2\r\n:6380\r\n"));
        assert!(text.contains("*3\r\n:8192\r\n:16383\r\n*3\r\n$8\r\n10.0.0.3\r\n:6380\r\n"));
        let info = info(&two_shards(), 2);
        assert!(info.contains("cluster_state:ok\r\n"), "{info}");
        assert!(info.contains("cluster_known_nodes:3\r\n"), "{info}");
        assert!(info.contains("cluster_size:2\r\n"), "{info}");
    }
}
