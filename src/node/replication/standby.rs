//! The standby's side: follow the primary's stream, apply it, acknowledge.
//! (Taking over when the primary falls silent is the role source's call:
//! the follower only records when it last heard from the primary.)
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

use super::handoff::hand_off;
use super::records::key_write;
use crate::node::role::RoleState;
use crate::node::shared::Core;
use bytes::BytesMut;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate_protocol::{
    decode_response, encode_request, ChangeBatch, ErrorCode, Record, ReplRequest, ReplResponse,
    Request, Response, Role, SnapshotPart, PROTOCOL_VERSION,
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

    /// The other end closed or reset an established connection.
    fn closed_by_peer(&self) -> bool {
        matches!(self, Self::Closed | Self::Io(_))
    }
}

/// Follows the node's primary until the task is dropped (role change).
pub(crate) async fn follow(core: &Core) {
    let settings = &core.settings;
    let mut failures = 0u32;
    loop {
        let Some(primary) = core.role.view().primary else {
            // Waiting for the role source to name one.
            tokio::time::sleep(settings.heartbeat).await;
            continue;
        };
        let result = follow_once(core, &primary).await;
        let Err(e) = result else { continue };
        if e.streamed() {
            failures = 0;
        }
        if e.closed_by_peer() {
            // The primary's end closed or reset the stream: that is the
            // last word heard from it, not a silence. (A standby resumed
            // after a pause can find its stream reset, with the frames
            // that waited in it discarded by the reset: it must try its
            // primary again before the watchdog may call it silent.)
            core.role.heard();
        }
        failures = failures.saturating_add(1);
        if failures == 1 {
            tracing::warn!(%primary, error = %e, "replication connection ended");
        } else {
            tracing::debug!(%primary, error = %e, failures, "replication connection failed");
        }
        let base = settings.heartbeat;
        let max = settings.repl_timeout.max(base);
        let delay = base.saturating_mul(1 << failures.min(6)).min(max);
        tokio::time::sleep(jitter(delay)).await;
    }
}

/// One replication connection: handshake, stream start, then frames until
/// something ends it.
async fn follow_once(core: &Core, primary: &str) -> Result<(), FollowError> {
    let settings = &core.settings;
    let mut stream = Stream::connect(primary, settings.repl_timeout).await?;
    let max_frame = hello(core, &mut stream, primary).await?;
    if core.role.owes_handoff() {
        // Our copy may hold charges the primary never saw: merged there
        // first, so the full sync below hands none of them back.
        let done = hand_off(core, &mut stream, max_frame, |_| true).await?;
        core.role.handed_off();
        tracing::info!(%primary, sent = done.sent, merged = done.merged, too_large = done.too_large, "handed our states to the primary");
    }
    let next = replicate(core, &mut stream, primary).await?;
    // From here a silence of `--failover-after` ends the stream, so the
    // role source's watchdog sees it; until then frames may be waiting in
    // the socket (this node was paused), and they are read first.
    stream.timeout = settings
        .repl_timeout
        .min(settings.failover_after.unwrap_or(settings.repl_timeout));
    let _streaming = Streaming::on(&core.role);
    let mut applier = Applier {
        core,
        primary,
        expected: next,
        unit: None,
    };
    loop {
        let response = stream.next().await?;
        core.role.heard();
        if let Some(ack) = applier.apply(response)? {
            stream.send(&ack, REPLICATE_ID).await?;
        }
    }
}

/// Marks the follower as streaming for as long as it lives.
struct Streaming<'a>(&'a RoleState);

impl<'a> Streaming<'a> {
    fn on(node: &'a RoleState) -> Self {
        node.set_streaming(true);
        Self(node)
    }
}

impl Drop for Streaming<'_> {
    fn drop(&mut self) {
        self.0.set_streaming(false);
    }
}

/// HELLO: the node asked must be a primary at an epoch no lower than ours.
/// Returns the largest frame it accepts.
async fn hello(core: &Core, stream: &mut Stream, primary: &str) -> Result<u32, FollowError> {
    let node = &core.role;
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: format!("tollgate-standby {}", node.advertise()),
        auth_token: core.auth_token.clone().map(Into::into),
    };
    stream.send(&hello, HELLO_ID).await?;
    match stream.next().await? {
        Response::HelloOk {
            role,
            epoch,
            limits,
            ..
        } => {
            node.heard_of_epoch(epoch);
            if role != Role::Primary {
                return Err(FollowError::NotPrimary {
                    addr: primary.to_owned(),
                });
            }
            not_stale(node, primary, epoch)?;
            Ok(limits.max_frame)
        }
        Response::Error { code, message } => Err(FollowError::Refused { code, message }),
        other => Err(FollowError::Protocol(format!(
            "{other:?} in answer to HELLO"
        ))),
    }
}

/// REPLICATE from where our copy stands; the answer starts the stream (a
/// resume, or a full sync). Returns the first offset due.
async fn replicate(core: &Core, stream: &mut Stream, primary: &str) -> Result<u64, FollowError> {
    let node = &core.role;
    let view = node.view();
    let replicate = Request::Repl(ReplRequest::Replicate {
        replid: view.replid,
        offset: node.offset(),
        epoch: node.epoch(),
        advertise: node.advertise(),
    });
    stream.send(&replicate, REPLICATE_ID).await?;
    match stream.next().await? {
        Response::Repl(ReplResponse::Stream {
            replid,
            epoch,
            offset,
            full,
        }) => {
            not_stale(node, primary, epoch)?;
            node.stream_started(replid, epoch, full.then_some(offset));
            node.heard();
            if full {
                node.stats.full_syncs.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%primary, epoch, offset, "full sync from the primary");
            } else {
                tracing::info!(%primary, epoch, offset, "resuming the primary's stream");
            }
            Ok(offset + 1)
        }
        Response::Error { code, message } => Err(FollowError::Refused { code, message }),
        other => Err(FollowError::Protocol(format!(
            "{other:?} in answer to REPLICATE"
        ))),
    }
}

/// A primary below the epoch we know has been replaced: never followed.
fn not_stale(node: &RoleState, primary: &str, epoch: u64) -> Result<(), FollowError> {
    if epoch < node.epoch() {
        return Err(FollowError::StaleEpoch {
            addr: primary.to_owned(),
            theirs: epoch,
            ours: node.epoch(),
        });
    }
    Ok(())
}

/// Applies the stream's frames in offset order.
struct Applier<'a> {
    core: &'a Core,
    primary: &'a str,
    /// The offset the next data frame must carry.
    expected: u64,
    /// The snapshot unit being collected, if a part of one has come.
    unit: Option<Unit>,
}

impl Applier<'_> {
    /// Applies one frame; a heartbeat is answered with the returned ack.
    fn apply(&mut self, response: Response) -> Result<Option<Request>, FollowError> {
        match response {
            Response::Repl(ReplResponse::Changes(batch)) => self.changes(batch).map(|()| None),
            Response::Repl(ReplResponse::Snapshot(part)) => self.snapshot(part).map(|()| None),
            Response::Repl(ReplResponse::Heartbeat {
                epoch,
                offset,
                now,
                syncing,
            }) => self.heartbeat(epoch, offset, now, syncing).map(Some),
            Response::Error { code, message } => Err(FollowError::Refused { code, message }),
            other => Err(FollowError::Protocol(format!(
                "unexpected {other:?} on the stream"
            ))),
        }
    }

    fn changes(&mut self, batch: ChangeBatch) -> Result<(), FollowError> {
        check_offset(batch.offset, &mut self.expected)?;
        if self.unit.is_some() {
            return Err(FollowError::Protocol(
                "changes inside a snapshot unit".into(),
            ));
        }
        for record in &batch.records {
            self.core.store.apply(&key_write(record));
        }
        let node = &self.core.role;
        node.set_offset(batch.offset);
        node.stats
            .complete_as_of
            .fetch_max(batch.sent_at, Ordering::Relaxed);
        Ok(())
    }

    /// Collects a unit's parts; at its `last` part, replaces the unit's
    /// slots by its records, whole.
    fn snapshot(&mut self, part: SnapshotPart) -> Result<(), FollowError> {
        check_offset(part.offset, &mut self.expected)?;
        let SnapshotPart {
            offset,
            slot_mod,
            slot_rem,
            last,
            records,
        } = part;
        let current = self.unit.get_or_insert_with(|| Unit {
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
        if !last {
            return Ok(());
        }
        let done = self.unit.take().expect("just inserted");
        let writes: Vec<_> = done.records.iter().map(key_write).collect();
        let skipped = self
            .core
            .store
            .replace_slots(done.slot_mod, done.slot_rem, &writes);
        if skipped > 0 {
            return Err(FollowError::Protocol(format!(
                "{skipped} snapshot records outside their slots"
            )));
        }
        self.core.role.set_offset(offset);
        Ok(())
    }

    /// Notes how far the primary is; the copy is in sync once it holds
    /// every frame and the primary is not sending a full sync. The answer
    /// is the ack to send.
    fn heartbeat(
        &mut self,
        epoch: u64,
        offset: u64,
        now: u64,
        syncing: bool,
    ) -> Result<Request, FollowError> {
        let node = &self.core.role;
        not_stale(node, self.primary, epoch)?;
        node.stats.primary_offset.store(offset, Ordering::Relaxed);
        if self.unit.is_none() && node.offset() >= offset {
            node.stats.complete_as_of.fetch_max(now, Ordering::Relaxed);
            if !syncing {
                node.mark_synced();
            }
        }
        Ok(Request::Repl(ReplRequest::Ack {
            offset: node.offset(),
        }))
    }
}

/// A snapshot unit being collected.
struct Unit {
    slot_mod: u16,
    slot_rem: u16,
    records: Vec<Record>,
}

/// The replication connection, with its buffers and its silence timeout.
pub(crate) struct Stream {
    socket: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    timeout: Duration,
}

impl Stream {
    pub(crate) async fn connect(primary: &str, timeout: Duration) -> Result<Self, FollowError> {
        let socket = match tokio::time::timeout(timeout, TcpStream::connect(primary)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(FollowError::Connect(e)),
            Err(_) => return Err(FollowError::Silent(timeout)),
        };
        socket.set_nodelay(true)?;
        Ok(Self {
            socket,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::new(),
            timeout,
        })
    }

    pub(crate) async fn send(&mut self, request: &Request, id: u32) -> Result<(), FollowError> {
        self.wbuf.clear();
        encode_request(id, request, &mut self.wbuf)
            .map_err(|e| FollowError::Protocol(e.to_string()))?;
        match tokio::time::timeout(self.timeout, self.socket.write_all(&self.wbuf)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(FollowError::Silent(self.timeout)),
        }
    }

    /// The next frame, within the timeout. Whatever the socket already
    /// holds is read before the timeout is looked at (tokio's `timeout`
    /// polls the read first), so a node resumed after a pause reads what
    /// came meanwhile instead of calling its primary silent.
    pub(crate) async fn next(&mut self) -> Result<Response, FollowError> {
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
                // The runtime may fire the timer before it has seen the
                // socket become readable (a process resumed after SIGSTOP
                // finds both due at once): ask the kernel itself.
                Err(_) if self.bytes_waiting() => {}
                Err(_) => return Err(FollowError::Silent(self.timeout)),
            }
        }
    }

    /// Whether the kernel holds received bytes not read yet (or the end of
    /// the stream), asked without blocking.
    fn bytes_waiting(&self) -> bool {
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        match socket2::SockRef::from(&self.socket).peek(&mut probe) {
            Ok(_) => true,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
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

/// Spreads a reconnect delay over `[d/2, d]` so two standbys (or a standby
/// and the clients) do not retry in lockstep.
fn jitter(d: Duration) -> Duration {
    let half = d / 2;
    let spread = (d - half).as_nanos().min(u128::from(u64::MAX)) as u64;
    half + Duration::from_nanos(fastrand::u64(0..=spread))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_half_and_whole() {
        for ms in [0, 1, 7, 100, 3000] {
            let d = Duration::from_millis(ms);
            for _ in 0..100 {
                let j = jitter(d);
                assert!(j >= d / 2 && j <= d, "{j:?} for {d:?}");
            }
        }
    }
}
