//! Handing states over: a node that served as primary and now follows
//! another primary sends it every live state it holds (HANDOFF), and that
//! primary merges them key by key, keeping the copy with less quota left
//! (`Store::merge`). Only then does the node ask to replicate, so the full
//! sync that replaces its copy cannot hand back a charge it admitted.
//!
//! ```text
//!  stepped-down node                          primary
//!  HELLO  ───────────────────────────────────>
//!  HANDOFF{epoch, records} (one stripe's states at a time,
//!          frames below the primary's max_frame) ──>  merge each key
//!                     <──────────────────────────── HANDED_OFF{merged}
//!  ... every stripe ...
//!  REPLICATE ─────────────────────────────────> (full sync: merged copy)
//! ```
//!
//! The same message carries a slot's states to its new shard during a
//! slot move (cluster mode), with the same merge on arrival.

use super::primary::{record_size, CHUNK};
use super::records::snapshot_record;
use crate::node::link::{unexpected, Link, LinkError};
use crate::node::shared::Core;
use crate::slot::Slot;
use tollgate_protocol::{Record, ReplRequest, ReplResponse, Request, Response};

/// Room a HANDOFF frame's header and counts take besides its records.
const FRAME_OVERHEAD: usize = 64;

/// What a handoff sent.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandedOff {
    /// Records sent (one per live state).
    pub sent: u64,
    /// Of them, how many changed a state on the receiver.
    pub merged: u64,
    /// Records too large for one of the receiver's frames (a sliding log
    /// longer than its `max_frame` allows): not sent, logged.
    pub too_large: u64,
}

/// Sends every live state of the slots `wanted` selects over `link`
/// (open: HELLO said), a stripe at a time, and waits for each frame's
/// answer; `max_frame` is the receiver's.
pub(crate) async fn hand_off(
    core: &Core,
    link: &mut Link,
    max_frame: u32,
    wanted: impl Fn(Slot) -> bool,
) -> Result<HandedOff, LinkError> {
    let store = &core.store;
    let epoch = core.role.epoch();
    let budget = usize::try_from(max_frame)
        .unwrap_or(usize::MAX)
        .saturating_sub(FRAME_OVERHEAD)
        .min(CHUNK);
    let mut done = HandedOff::default();
    let mut batch: Vec<Record> = Vec::new();
    let mut size = 0;
    for index in 0..store.stripe_count() {
        let now = core.clock.now();
        for (key, entry) in store.live_states(index, now, &wanted) {
            let record = snapshot_record(&key, &entry);
            let len = record_size(&record);
            if len > budget {
                done.too_large += 1;
                tracing::warn!(key = %String::from_utf8_lossy(key.as_bytes()), bytes = len, max_frame, "a state too large for the receiver's frames is not handed over");
                continue;
            }
            if size + len > budget {
                send(link, epoch, std::mem::take(&mut batch), &mut done).await?;
                size = 0;
            }
            size += len;
            batch.push(record);
        }
    }
    if !batch.is_empty() {
        send(link, epoch, batch, &mut done).await?;
    }
    Ok(done)
}

async fn send(
    link: &mut Link,
    epoch: u64,
    records: Vec<Record>,
    done: &mut HandedOff,
) -> Result<(), LinkError> {
    let n = records.len() as u64;
    let request = Request::Repl(ReplRequest::Handoff { epoch, records });
    match link.call(&request).await? {
        Response::Repl(ReplResponse::HandedOff { merged }) => {
            done.sent += n;
            done.merged += u64::from(merged);
            Ok(())
        }
        other => Err(unexpected("HANDOFF", &other)),
    }
}

/// A slot move's copy (cluster mode): connects to `target`, which must
/// answer HELLO as a primary, and hands it every live state of the slots
/// `wanted` selects. Epochs are not compared: the target is another
/// shard's primary.
#[cfg(feature = "cluster")]
pub(crate) async fn hand_slots(
    core: &Core,
    target: &str,
    wanted: impl Fn(Slot) -> bool,
) -> Result<HandedOff, LinkError> {
    let timeout = core.settings.repl_timeout;
    let (mut link, hello) = Link::open(core, target, "tollgate-move", timeout).await?;
    if hello.role != tollgate_protocol::Role::Primary {
        return Err(LinkError::Protocol(format!(
            "{target} is not primary: it cannot take moving slots"
        )));
    }
    hand_off(core, &mut link, hello.max_frame, wanted).await
}
