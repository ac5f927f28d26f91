//! The standby's side: follow the primary's stream, apply it, acknowledge,
//! and take over when the primary has been silent too long.
//!
//! ```text
//!  connect -> HELLO (must say primary, epoch >= ours) -> REPLICATE{replid, offset, epoch}
//!     <- REPL_STREAM (full: a full sync follows | resume)
//!     <- REPL_CHANGES: apply each record            (offset += 1)
//!     <- REPL_SNAPSHOT parts: collect, replace the unit's slots at `last`
//!     <- REPL_HEARTBEAT: -> REPL_ACK{offset}; in sync once `syncing` is 0
//!  any error or --repl-timeout of silence: reconnect with backoff and jitter
//! ```
//!
//! Invariants: frames are applied in offset order, a gap or a frame out of
//! place ends the connection (the next one resumes or resyncs); a unit is
//! applied whole or not at all, and the standby's offset only moves past a
//! frame once it is applied; a standby never follows a primary whose epoch
//! is below the one it knows.

use super::state::key_write;
use crate::server::Shared;
use bytes::BytesMut;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_protocol::{
    decode_response, encode_request, ErrorCode, Record, ReplRequest, ReplResponse, Request,
    Response, Role, SnapshotPart, PROTOCOL_VERSION,
};

/// Largest frame a standby accepts from its primary (the server's frame
/// ceiling): a snapshot part is one chunk plus one record, and one record is
/// at most a key and `max_log_entries` timestamps.
const MAX_STREAM_FRAME: u32 = crate::config::MAX_FRAME_CEILING;

/// Request id of the standby's HELLO and REPLICATE.
const HELLO_ID: u32 = 1;
const REPLICATE_ID: u32 = 2;

/// Why a replication connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("nothing from the primary for {0:?}")]
    Silent(Duration),
    #[error("the primary closed the connection")]
    Closed,
    #[error("{addr} is not primary")]
    NotPrimary { addr: String },
    #[error("{addr} is at epoch {theirs}, below ours ({ours}): not following a replaced primary")]
    StaleEpoch {
        addr: String,
        theirs: u64,
        ours: u64,
    },
    #[error("refused: {code}: {message}")]
    Refused { code: ErrorCode, message: String },
    #[error("protocol: {0}")]
    Protocol(String),
}

impl FollowError {
    /// Whether the stream had started (the backoff starts over).
    fn streamed(&self) -> bool {
        matches!(self, Self::Silent(_) | Self::Closed | Self::Io(_))
    }
}

/// Follows the node's primary until the task is dropped (role change).
pub(crate) async fn follow(shared: Arc<Shared>) {
    let mut failures = 0u32;
    let mut rng = Jitter::new();
    loop {
        let Some(primary) = shared.node.view().primary else {
            // Waiting for the start-up probe to name one.
            tokio::time::sleep(shared.config.heartbeat).await;
            continue;
        };
        let result = follow_once(&shared, &primary).await;
        let Err(e) = result else { continue };
        if e.streamed() {
            failures = 0;
        }
        failures = failures.saturating_add(1);
        if failures == 1 {
            tracing::warn!(%primary, error = %e, "replication connection ended");
        } else {
            tracing::debug!(%primary, error = %e, failures, "replication connection failed");
        }
        let base = shared.config.heartbeat;
        let max = shared.config.repl_timeout.max(base);
        let delay = base.saturating_mul(1 << failures.min(6)).min(max);
        tokio::time::sleep(rng.spread(delay)).await;
    }
}

/// Promotes this standby once its primary has been silent for
/// `--failover-after` (if set), provided it has been in sync.
pub(crate) async fn watch_primary(shared: Arc<Shared>) {
    let Some(after) = shared.config.failover_after else {
        return std::future::pending().await;
    };
    let mut tick = tokio::time::interval(
        shared
            .config
            .heartbeat
            .min(after / 4)
            .max(Duration::from_millis(1)),
    );
    loop {
        tick.tick().await;
        let view = shared.node.view();
        if !view.ever_synced {
            continue;
        }
        if let Some(silence) = shared.node.silence() {
            if silence >= after {
                tracing::warn!(
                    primary = view.primary.as_deref().unwrap_or("none"),
                    silence_ms = silence.as_millis() as u64,
                    "no heartbeat from the primary within --failover-after; promoting"
                );
                shared
                    .node
                    .promote("failover: the primary stopped sending heartbeats");
                return;
            }
        }
    }
}

/// A snapshot unit being collected.
struct Unit {
    slot_mod: u16,
    slot_rem: u16,
    records: Vec<Record>,
}

struct Stream {
    socket: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    timeout: Duration,
}

impl Stream {
    async fn send(&mut self, request: &Request, id: u32) -> Result<(), FollowError> {
        self.wbuf.clear();
        encode_request(id, request, &mut self.wbuf)
            .map_err(|e| FollowError::Protocol(e.to_string()))?;
        match tokio::time::timeout(self.timeout, self.socket.write_all(&self.wbuf)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(FollowError::Silent(self.timeout)),
        }
    }

    /// The next frame, within the timeout.
    async fn next(&mut self) -> Result<Response, FollowError> {
        loop {
            match decode_response(&mut self.rbuf, MAX_STREAM_FRAME) {
                Ok(Some((_, response))) => return Ok(response),
                Ok(None) => {}
                Err(e) => return Err(FollowError::Protocol(e.to_string())),
            }
            if self.rbuf.capacity() - self.rbuf.len() < 16 * 1024 {
                self.rbuf.reserve(64 * 1024);
            }
            match tokio::time::timeout(self.timeout, self.socket.read_buf(&mut self.rbuf)).await {
                Ok(Ok(0)) => return Err(FollowError::Closed),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => return Err(FollowError::Silent(self.timeout)),
            }
        }
    }
}

async fn follow_once(shared: &Arc<Shared>, primary: &str) -> Result<(), FollowError> {
    let config = &shared.config;
    let node = &shared.node;
    let timeout = config.repl_timeout;
    let socket = match tokio::time::timeout(timeout, TcpStream::connect(primary)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(FollowError::Connect(e)),
        Err(_) => return Err(FollowError::Silent(timeout)),
    };
    socket.set_nodelay(true)?;
    let mut stream = Stream {
        socket,
        rbuf: BytesMut::with_capacity(64 * 1024),
        wbuf: BytesMut::new(),
        timeout,
    };
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: format!("tollgate-standby {}", node.advertise()),
        auth_token: config.auth_token.clone().map(Into::into),
    };
    stream.send(&hello, HELLO_ID).await?;
    match stream.next().await? {
        Response::HelloOk { role, epoch, .. } => {
            node.heard_of_epoch(epoch);
            if role != Role::Primary {
                return Err(FollowError::NotPrimary {
                    addr: primary.to_owned(),
                });
            }
            if epoch < node.epoch() {
                return Err(FollowError::StaleEpoch {
                    addr: primary.to_owned(),
                    theirs: epoch,
                    ours: node.epoch(),
                });
            }
        }
        Response::Error { code, message } => return Err(FollowError::Refused { code, message }),
        other => {
            return Err(FollowError::Protocol(format!(
                "{other:?} in answer to HELLO"
            )))
        }
    }
    let view = node.view();
    let replicate = Request::Repl(ReplRequest::Replicate {
        replid: view.replid,
        offset: node.offset(),
        epoch: node.epoch(),
        advertise: node.advertise(),
    });
    stream.send(&replicate, REPLICATE_ID).await?;

    // The answer: REPL_STREAM or an ERROR.
    let mut expected = match stream.next().await? {
        Response::Repl(ReplResponse::Stream {
            replid,
            epoch,
            offset,
            full,
        }) => {
            if epoch < node.epoch() {
                return Err(FollowError::StaleEpoch {
                    addr: primary.to_owned(),
                    theirs: epoch,
                    ours: node.epoch(),
                });
            }
            node.stream_started(replid, epoch, full.then_some(offset));
            node.heard();
            if full {
                node.stats.full_syncs.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%primary, epoch, offset, "full sync from the primary");
            } else {
                tracing::info!(%primary, epoch, offset, "resuming the primary's stream");
            }
            offset + 1
        }
        Response::Error { code, message } => return Err(FollowError::Refused { code, message }),
        other => {
            return Err(FollowError::Protocol(format!(
                "{other:?} in answer to REPLICATE"
            )))
        }
    };

    let store = &shared.store;
    let stats = &node.stats;
    let mut unit: Option<Unit> = None;
    loop {
        let response = stream.next().await?;
        node.heard();
        match response {
            Response::Repl(ReplResponse::Changes(batch)) => {
                check_offset(batch.offset, &mut expected)?;
                if unit.is_some() {
                    return Err(FollowError::Protocol(
                        "changes inside a snapshot unit".into(),
                    ));
                }
                for record in &batch.records {
                    store.apply(&key_write(record));
                }
                node.set_offset(batch.offset);
                stats
                    .complete_as_of
                    .fetch_max(batch.sent_at, Ordering::Relaxed);
            }
            Response::Repl(ReplResponse::Snapshot(part)) => {
                check_offset(part.offset, &mut expected)?;
                let SnapshotPart {
                    offset,
                    slot_mod,
                    slot_rem,
                    last,
                    records,
                } = part;
                let current = unit.get_or_insert_with(|| Unit {
                    slot_mod,
                    slot_rem,
                    records: Vec::new(),
                });
                if (current.slot_mod, current.slot_rem) != (slot_mod, slot_rem) {
                    return Err(FollowError::Protocol(
                        "a snapshot unit interrupted by another".into(),
                    ));
                }
                current.records.extend(records);
                if last {
                    let done = unit.take().expect("just inserted");
                    let writes: Vec<_> = done.records.iter().map(key_write).collect();
                    let skipped = store.replace_slots(done.slot_mod, done.slot_rem, &writes);
                    if skipped > 0 {
                        return Err(FollowError::Protocol(format!(
                            "{skipped} snapshot records outside their slots"
                        )));
                    }
                    node.set_offset(offset);
                }
            }
            Response::Repl(ReplResponse::Heartbeat {
                epoch,
                offset,
                now,
                syncing,
            }) => {
                if epoch < node.epoch() {
                    return Err(FollowError::StaleEpoch {
                        addr: primary.to_owned(),
                        theirs: epoch,
                        ours: node.epoch(),
                    });
                }
                stats.primary_offset.store(offset, Ordering::Relaxed);
                if unit.is_none() && node.offset() >= offset {
                    stats.complete_as_of.fetch_max(now, Ordering::Relaxed);
                    if !syncing {
                        node.mark_synced();
                    }
                }
                let ack = Request::Repl(ReplRequest::Ack {
                    offset: node.offset(),
                });
                stream.send(&ack, REPLICATE_ID).await?;
            }
            Response::Error { code, message } => {
                return Err(FollowError::Refused { code, message })
            }
            other => {
                return Err(FollowError::Protocol(format!(
                    "unexpected {other:?} on the stream"
                )))
            }
        }
    }
}

fn check_offset(offset: u64, expected: &mut u64) -> Result<(), FollowError> {
    if offset != *expected {
        return Err(FollowError::Protocol(format!(
            "frame {offset} where {expected} was due"
        )));
    }
    *expected += 1;
    Ok(())
}

/// Spreads reconnect delays over `[d/2, d]` so two standbys (or a standby
/// and the clients) do not retry in lockstep.
struct Jitter(u64);

impl Jitter {
    fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
        Self(seed | 1)
    }

    fn spread(&mut self, d: Duration) -> Duration {
        // xorshift64
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let half = d / 2;
        let spread = (d - half).as_nanos() as u64;
        half + Duration::from_nanos(if spread == 0 { 0 } else { self.0 % spread })
    }
}
