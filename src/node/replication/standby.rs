//! The standby's side: follow the primary's stream, apply it, acknowledge.
//! (Taking over when the primary falls silent is the role source's call:
//! the follower only records when it last heard from the primary.)
//!
//! ```text
//!  connect (TLS when configured) -> HELLO with the cluster secret
//!     (the answer must say primary, epoch >= ours) -> REPLICATE{replid, offset, epoch}
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
use super::records::into_key_write;
use crate::node::link::{unexpected, Link, LinkError};
use crate::node::refusal::EpochError;
use crate::node::role::RoleState;
use crate::node::shared::Core;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tollgate_protocol::{
    ChangeBatch, ErrorCode, Record, ReplRequest, ReplResponse, Request, Response, Role,
    SnapshotPart,
};

/// Request id of the standby's REPLICATE, carried by every frame of the
/// stream.
const REPLICATE_ID: u32 = 2;

/// Why a replication connection ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("{} is not primary", crate::log_text::Escaped(.addr))]
    NotPrimary { addr: String },
    #[error(
        "{} is at epoch {theirs}, below ours ({ours}): not following a replaced primary",
        crate::log_text::Escaped(.addr)
    )]
    StaleEpoch {
        addr: String,
        theirs: u64,
        ours: u64,
    },
    #[error("{}: {error}", crate::log_text::Escaped(.addr))]
    Epoch { addr: String, error: EpochError },
    #[error("refused: {code}: {}", crate::log_text::Escaped(.message))]
    Refused { code: ErrorCode, message: String },
    #[error("protocol: {0}")]
    Protocol(String),
}

impl FollowError {
    /// Whether the stream had started (the backoff starts over).
    fn streamed(&self) -> bool {
        matches!(
            self,
            Self::Link(LinkError::Silent(_) | LinkError::Closed | LinkError::Io(_))
        )
    }

    /// The other end closed or reset an established connection.
    fn closed_by_peer(&self) -> bool {
        matches!(self, Self::Link(LinkError::Closed | LinkError::Io(_)))
    }

    fn epoch(addr: &str, error: EpochError) -> Self {
        Self::Epoch {
            addr: addr.to_owned(),
            error,
        }
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
            // The primary's address may be one a peer announced.
            let primary = crate::log_text::Escaped(&primary);
            tracing::warn!(%primary, error = %e, "replication connection ended");
        } else {
            let primary = crate::log_text::Escaped(&primary);
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
    let timeout = core.settings.repl_timeout;
    let (mut link, hello) = Link::open(core, primary, "tollgate-standby", timeout).await?;
    // The node asked must be a primary at an epoch no lower than ours.
    let node = &core.role;
    node.heard_of_epoch(hello.epoch)
        .map_err(|e| FollowError::epoch(primary, e))?;
    if hello.role != Role::Primary {
        return Err(FollowError::NotPrimary {
            addr: primary.to_owned(),
        });
    }
    not_stale(node, primary, hello.epoch)?;
    if node.owes_handoff() {
        // Our copy may hold charges the primary never saw: merged there
        // first, so the full sync below hands none of them back.
        let done = hand_off(core, &mut link, hello.max_frame, |_| true).await?;
        node.handed_off();
        tracing::info!(%primary, sent = done.sent, merged = done.merged, too_large = done.too_large, "handed our states to the primary");
    }
    let next = replicate(core, &mut link, primary).await?;
    // From here a silence of `--failover-after` ends the stream, so the
    // role source's watchdog sees it; until then frames may be waiting in
    // the socket (this node was paused), and they are read first.
    let settings = &core.settings;
    link.set_timeout(
        settings
            .repl_timeout
            .min(settings.failover_after.unwrap_or(settings.repl_timeout)),
    );
    let _streaming = Streaming::on(node);
    let mut applier = Applier {
        core,
        primary,
        expected: next,
        unit: None,
    };
    loop {
        let (_, response) = link.next().await?;
        core.role.heard();
        if let Some(ack) = applier.apply(response)? {
            link.send(REPLICATE_ID, &ack).await?;
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

/// REPLICATE from where our copy stands; the answer starts the stream (a
/// resume, or a full sync). Returns the first offset due.
async fn replicate(core: &Core, link: &mut Link, primary: &str) -> Result<u64, FollowError> {
    let node = &core.role;
    let view = node.view();
    let replicate = Request::Repl(ReplRequest::Replicate {
        replid: view.replid,
        offset: node.offset(),
        epoch: node.epoch(),
        advertise: node.advertise(),
    });
    link.send(REPLICATE_ID, &replicate).await?;
    match link.next().await?.1 {
        Response::Repl(ReplResponse::Stream {
            replid,
            epoch,
            offset,
            full,
        }) => {
            not_stale(node, primary, epoch)?;
            let first = offset
                .checked_add(1)
                .ok_or_else(|| FollowError::Protocol(format!("a stream at offset {offset}")))?;
            node.stream_started(replid, epoch, full.then_some(offset))
                .map_err(|e| FollowError::epoch(primary, e))?;
            node.heard();
            if full {
                node.stats.full_syncs.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%primary, epoch, offset, "full sync from the primary");
            } else {
                tracing::info!(%primary, epoch, offset, "resuming the primary's stream");
            }
            Ok(first)
        }
        Response::Error { code, message } => Err(FollowError::Refused { code, message }),
        other => Err(unexpected("REPLICATE", &other).into()),
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
        let writes: Vec<_> = batch.records.into_iter().map(into_key_write).collect();
        self.core.store.apply_all(&writes);
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
        let writes: Vec<_> = done.records.into_iter().map(into_key_write).collect();
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

fn check_offset(offset: u64, expected: &mut u64) -> Result<(), FollowError> {
    if offset != *expected {
        return Err(FollowError::Protocol(format!(
            "frame {offset} where {expected} was due"
        )));
    }
    *expected = offset
        .checked_add(1)
        .ok_or_else(|| FollowError::Protocol(format!("no frame can follow offset {offset}")))?;
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
