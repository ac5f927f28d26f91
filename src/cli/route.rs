//! Which node a CLI command should talk to for a key: the primary of the
//! key's slot, read from the TOPOLOGY any node answers (PROTOCOL.md §14),
//! so `tollgate check --server ANY_NODE` works for every key of a
//! cluster. A single node (or a pre-cluster server, which answers TOPOLOGY
//! with UnknownOpcode) serves every key itself.
//!
//! One raw exchange (HELLO, TOPOLOGY) on a connection of its own: the CLI's
//! protocol client does not read slot maps.

use crate::slot::Slot;
use bytes::BytesMut;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tollgate_protocol::{
    decode_response, encode_request, ClusterTopology, ErrorCode, Request, Response,
    DEFAULT_CLIENT_MAX_FRAME, PROTOCOL_VERSION,
};

/// How long to wait between two looks at the map while a slot has no
/// primary or is moving.
const RETRY: Duration = Duration::from_millis(100);

/// Why the owner of a key could not be found.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("cannot reach {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("{addr} answered {what} to TOPOLOGY")]
    Unexpected { addr: String, what: String },
    #[error("slot {slot} has no primary to serve it (moving, or a failover) after {after:?}")]
    Unavailable { slot: u16, after: Duration },
}

/// The address of the primary that serves `key`, asked of `server` (with
/// the client token `auth_token`), waiting (until `deadline`) while its
/// slot has none.
pub async fn owner_of(
    server: &str,
    auth_token: Option<&str>,
    key: &[u8],
    deadline: Instant,
) -> Result<String, RouteError> {
    let slot = Slot::of(key).get();
    let started = Instant::now();
    loop {
        let Some(topology) = topology(server, auth_token, deadline).await? else {
            // Not a cluster-aware server: it serves every key.
            return Ok(server.to_owned());
        };
        let moving = topology.moving.iter().any(|m| m.slots.contains(slot));
        match topology.owner(slot) {
            Some(shard) if !moving && !shard.primary.is_empty() => {
                return Ok(shard.primary.clone())
            }
            _ if Instant::now() + RETRY < deadline => tokio::time::sleep(RETRY).await,
            _ => {
                return Err(RouteError::Unavailable {
                    slot,
                    after: started.elapsed(),
                })
            }
        }
    }
}

/// TOPOLOGY of `server`; None when it does not know the request.
async fn topology(
    server: &str,
    auth_token: Option<&str>,
    deadline: Instant,
) -> Result<Option<ClusterTopology>, RouteError> {
    let unreachable = |reason: String| RouteError::Unreachable {
        addr: server.to_owned(),
        reason,
    };
    let exchange = async {
        let mut socket = TcpStream::connect(server)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut out = BytesMut::new();
        let hello = Request::Hello {
            version: PROTOCOL_VERSION,
            client_name: "tollgate-cli".into(),
            auth_token: auth_token.map(|t| t.as_bytes().to_vec().into()),
        };
        for (id, request) in [(1, &hello), (2, &Request::Topology)] {
            encode_request(id, request, &mut out).map_err(|e| unreachable(e.to_string()))?;
        }
        socket
            .write_all(&out)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut buf = BytesMut::with_capacity(16 * 1024);
        loop {
            match decode_response(&mut buf, DEFAULT_CLIENT_MAX_FRAME) {
                Ok(Some((1, Response::HelloOk { .. }))) => continue,
                Ok(Some((_, Response::Topology(t)))) => return Ok(Some(t)),
                Ok(Some((
                    _,
                    Response::Error {
                        code: ErrorCode::UnknownOpcode,
                        ..
                    },
                ))) => return Ok(None),
                Ok(Some((_, other))) => {
                    return Err(RouteError::Unexpected {
                        addr: server.to_owned(),
                        what: format!("{other:?}"),
                    })
                }
                Ok(None) => {}
                Err(e) => return Err(unreachable(e.to_string())),
            }
            match socket.read_buf(&mut buf).await {
                Ok(0) => return Err(unreachable("the connection closed".into())),
                Ok(_) => {}
                Err(e) => return Err(unreachable(e.to_string())),
            }
        }
    };
    tokio::time::timeout_at(deadline, exchange)
        .await
        .unwrap_or_else(|_| Err(unreachable("no answer in time".into())))
}
