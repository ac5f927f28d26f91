//! Fetching the slot map: TOPOLOGY asked of any node (PROTOCOL.md §14).
//!
//! Asked in this order, the first answer wins: the node a MOVED named (it
//! serves the slot, so it knows the newest map), the live connections of
//! the map's shards (no new connection in the common case), then the seeds
//! and every node the map names, each over a single-node connection of its
//! own ("probe" shards, kept so a seed is not re-dialled on every refresh).
//! A node that does not know TOPOLOGY (a server older than cluster mode)
//! serves every slot: it stands for a one-shard map of itself; so does a
//! node outside a cluster (version 0), under the address it was asked at.

use std::sync::Arc;

use tollgate_protocol::{ClusterTopology, ErrorCode, Request, Response, ShardInfo, SlotSpan};

use super::Cluster;
use crate::connection::{Connection, Deadline};
use crate::error::Error;
use crate::shard::{Shard, Wait};

impl Cluster {
    /// TOPOLOGY from the first node that answers it.
    pub(super) async fn fetch(
        &self,
        prefer: Option<&str>,
        deadline: Deadline,
    ) -> Result<ClusterTopology, Error> {
        let mut tried = 0;
        let mut last_error = None;
        if let Some(addr) = prefer {
            tried += 1;
            match self.ask_probe(addr, deadline).await {
                Ok(t) => return Ok(t),
                Err(e) => last_error = Some(Arc::new(e)),
            }
        }
        let map = self.map.load_full();
        for shard in map.shards.iter().filter_map(|s| s.shard.as_ref()) {
            let Some(Ok(conn)) = shard.ready() else {
                continue;
            };
            tried += 1;
            match ask(&conn, deadline).await {
                Ok(t) => return Ok(t),
                Err(e) => last_error = Some(Arc::new(e)),
            }
        }
        let mut addrs: Vec<String> = self.seeds.clone();
        for addr in map.addrs() {
            if !addrs.iter().any(|a| a == addr) && Some(addr) != prefer {
                addrs.push(addr.to_owned());
            }
        }
        for addr in &addrs {
            if deadline.at <= tokio::time::Instant::now() {
                break;
            }
            tried += 1;
            match self.ask_probe(addr, deadline).await {
                Ok(t) => return Ok(t),
                Err(e) => last_error = Some(Arc::new(e)),
            }
        }
        Err(Error::NoTopology { tried, last_error })
    }

    /// TOPOLOGY over the probe connection to `addr`.
    async fn ask_probe(&self, addr: &str, deadline: Deadline) -> Result<ClusterTopology, Error> {
        let shard = {
            let mut probes = self.probes.lock();
            let shard = probes.entry(addr.to_owned()).or_insert_with(|| {
                Arc::new(Shard::new(
                    vec![addr.to_owned()],
                    self.config.clone(),
                    self.metrics.clone(),
                ))
            });
            Arc::clone(shard)
        };
        let conn = shard.connection(Wait::Until(deadline)).await?;
        ask(&conn, deadline).await
    }
}

/// TOPOLOGY over `conn`.
async fn ask(conn: &Arc<Connection>, deadline: Deadline) -> Result<ClusterTopology, Error> {
    match conn.call(Request::Topology, deadline).await? {
        Response::Topology(t) if t.version == 0 => Ok(outside_cluster(t, &conn.node().addr)),
        Response::Topology(t) => Ok(t),
        Response::Error {
            code: ErrorCode::UnknownOpcode,
            ..
        } => Ok(single_node(&conn.node().addr)),
        Response::Error { code, message } => Err(Error::Server { code, message }),
        other => Err(Error::UnexpectedResponse {
            request: "TOPOLOGY",
            got: crate::connection::response_name(&other),
        }),
    }
}

/// The map of a node outside a cluster (version 0), with the address it was
/// reached at first: the address it reports for itself (its listen
/// address, maybe `0.0.0.0`) may not be one this client can reach. The
/// shard's primary round still picks whichever node says it is primary.
fn outside_cluster(mut topology: ClusterTopology, asked: &str) -> ClusterTopology {
    for shard in &mut topology.shards {
        let reported = std::mem::replace(&mut shard.primary, asked.to_owned());
        if !reported.is_empty() && reported != asked {
            shard.standbys.insert(0, reported);
        }
        shard.standbys.retain(|s| s != asked);
    }
    topology
}

/// The map a server without cluster mode stands for: itself, every slot.
fn single_node(addr: &str) -> ClusterTopology {
    ClusterTopology {
        version: 0,
        shards: vec![ShardInfo {
            id: 0,
            epoch: 0,
            primary: addr.to_owned(),
            standbys: Vec::new(),
            slots: vec![SlotSpan::ALL],
        }],
        moving: Vec::new(),
    }
}
