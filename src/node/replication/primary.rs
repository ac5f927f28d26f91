//! The primary's side of replication: one task that drains the stripes'
//! change logs, numbers the frames, keeps a backlog, and writes the stream
//! to the attached standby.
//!
//! ```text
//!  every --repl-flush:  for each stripe: drain (changes | whole stripe)
//!                         -> frames, encoded change by change (offset += 1 each)
//!                         -> backlog (bounded) -> standby socket
//!  every --heartbeat:   REPL_HEARTBEAT; drop a standby silent for --repl-timeout
//!  REPLICATE handed over by a connection: resume from the backlog, or a
//!                         full sync (every stripe marked, sent by the next pass)
//! ```
//!
//! Invariants:
//! - one task does every drain, snapshot and write, in order, so the stream
//!   order *is* the order in which states were read under the stripe locks:
//!   a stripe sent whole is followed only by states read after it;
//! - memory is bounded whatever the standby does: the change logs by
//!   `--repl-buffer-cap` per stripe (overflow: the stripe is sent whole),
//!   the backlog by `--repl-backlog` bytes, the frame being built by
//!   [`CHUNK`] plus one record, a stripe being sent by that stripe; a write
//!   that cannot finish within `--repl-timeout` drops the standby;
//! - without a standby the capture goes on only while the last standby
//!   could still resume from the backlog; after that it stops, and the next
//!   standby gets a full sync.

use super::backlog::Backlog;
use super::records::{snapshot_record, table_state};
use crate::node::role::RoleState;
use crate::node::shared::{Core, Handover};
use crate::store::{Drained, LogBuffer};
use crate::tls::Socket;
use bytes::{Bytes, BytesMut};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tollgate_protocol::{
    decode_request, encode_response, ChangesFrame, Record, ReplRequest, ReplResponse, Request,
    RequestId, Response, SnapshotPart,
};

/// A frame is closed once its records pass this many bytes.
pub(crate) const CHUNK: usize = 64 * 1024;

/// The attached standby.
struct Attached {
    reader: ReadHalf<Socket>,
    writer: WriteHalf<Socket>,
    rbuf: BytesMut,
    request_id: RequestId,
    peer: SocketAddr,
    advertise: String,
    last_ack_at: Instant,
}

/// The primary's side of the stream: one per primary term, dropped when
/// the node steps down.
pub(crate) struct Feed {
    core: Arc<Core>,
    replid: u64,
    /// The last offset numbered.
    offset: u64,
    backlog: Backlog,
    standby: Option<Attached>,
    /// The offset the last standby acknowledged (it could resume after it).
    acked: u64,
    capturing: bool,
    /// A full sync is being sent: the next complete pass ends it.
    syncing: bool,
    /// The attached standby has a whole backlog of frames unacknowledged:
    /// nothing more is drained for it until it acknowledges (the stripes'
    /// buffers hold the changes meanwhile, up to their cap).
    held: bool,
    /// A drained log's emptied list, handed to the next stripe drained.
    spare: LogBuffer,
}

impl Feed {
    pub fn new(core: Arc<Core>) -> Self {
        let view = core.role.view();
        let offset = core.role.offset();
        let backlog = Backlog::with_cap(core.settings.repl_backlog);
        Self {
            core,
            replid: view.replid,
            offset,
            backlog,
            standby: None,
            acked: offset,
            capturing: false,
            syncing: false,
            held: false,
            spare: LogBuffer::default(),
        }
    }

    fn node(&self) -> &RoleState {
        &self.core.role
    }

    /// Serves standbys until dropped (role change, shutdown).
    pub async fn run(mut self, handovers: &mut mpsc::Receiver<Handover>) {
        let config = &self.core.settings;
        let mut flush = tokio::time::interval(config.repl_flush);
        flush.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut heartbeat = tokio::time::interval(config.heartbeat);
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                handover = handovers.recv() => match handover {
                    Some(h) => self.attach(h).await,
                    None => return,
                },
                read = read_some(&mut self.standby) => self.on_read(read),
                _ = heartbeat.tick() => self.heartbeat().await,
                _ = flush.tick() => self.flush().await,
            }
        }
    }

    async fn attach(&mut self, h: Handover) {
        if let Some(old) = self.standby.take() {
            tracing::info!(old = %old.peer, new = %h.peer, "a new standby connection replaces the attached one");
        }
        let (reader, writer) = tokio::io::split(h.stream);
        self.standby = Some(Attached {
            reader,
            writer,
            rbuf: h.leftover,
            request_id: h.request_id,
            peer: h.peer,
            advertise: h.advertise.clone(),
            last_ack_at: Instant::now(),
        });
        let first = self.backlog.first(self.offset);
        let resume = self.capturing
            && h.replid == self.replid
            && h.offset <= self.offset
            && first <= h.offset.saturating_add(1);
        let epoch = self.node().epoch();
        let stats = &self.node().stats;
        stats.replica_connected.store(1, Ordering::Relaxed);
        stats.replica_offset.store(h.offset, Ordering::Relaxed);
        if resume {
            tracing::info!(
                peer = %h.peer, standby = %h.advertise, from = h.offset, to = self.offset,
                "standby attached; resuming from the backlog"
            );
            let start = ReplResponse::Stream {
                replid: self.replid,
                epoch,
                offset: h.offset,
                full: false,
            };
            self.send_response(start).await;
            let frames: Vec<Bytes> = self.backlog.after(h.offset).cloned().collect();
            for frame in frames {
                self.send(frame).await;
            }
            self.acked = h.offset;
        } else {
            tracing::info!(
                peer = %h.peer, standby = %h.advertise, offset = self.offset,
                "standby attached; full sync"
            );
            self.node().stats.full_syncs.fetch_add(1, Ordering::Relaxed);
            // Every stripe is marked: the next pass sends them all, then
            // the changes made since each was read.
            self.core.store.start_capture();
            self.capturing = true;
            self.syncing = true;
            self.acked = self.offset;
            let start = ReplResponse::Stream {
                replid: self.replid,
                epoch,
                offset: self.offset,
                full: true,
            };
            self.send_response(start).await;
        }
        // Acks may have come with the REPLICATE.
        self.on_read(Ok(1));
    }

    fn detach(&mut self, why: &str) {
        if let Some(s) = self.standby.take() {
            tracing::warn!(peer = %s.peer, standby = %s.advertise, reason = why, "standby detached");
            self.node()
                .stats
                .replica_connected
                .store(0, Ordering::Relaxed);
        }
    }

    /// Handles what the standby sent (acks only).
    fn on_read(&mut self, read: std::io::Result<usize>) {
        let Some(standby) = self.standby.as_mut() else {
            return;
        };
        match read {
            Ok(0) => return self.detach("the standby closed the connection"),
            Err(e) => {
                let why = format!("read failed: {e}");
                return self.detach(&why);
            }
            Ok(_) => {}
        }
        let limits = self.core.limits;
        loop {
            match decode_request(&mut standby.rbuf, &limits) {
                Ok(None) => return,
                Ok(Some((_, Request::Repl(ReplRequest::Ack { offset })))) => {
                    standby.last_ack_at = Instant::now();
                    self.acked = offset;
                    self.core
                        .role
                        .stats
                        .replica_offset
                        .store(offset, Ordering::Relaxed);
                }
                Ok(Some(_)) => {
                    return self.detach("a request other than REPL_ACK on the replication stream")
                }
                Err(e) => {
                    let why = format!("undecodable frame from the standby: {e}");
                    return self.detach(&why);
                }
            }
        }
    }

    async fn heartbeat(&mut self) {
        let timeout = self.core.settings.repl_timeout;
        if let Some(s) = &self.standby {
            if s.last_ack_at.elapsed() > timeout {
                let why = format!("no acknowledgement for {timeout:?}");
                return self.detach(&why);
            }
        }
        self.node()
            .stats
            .backlog_bytes
            .store(self.backlog.bytes() as u64, Ordering::Relaxed);
        let beat = ReplResponse::Heartbeat {
            epoch: self.node().epoch(),
            offset: self.offset,
            now: self.core.clock.now(),
            syncing: self.syncing,
        };
        self.send_response(beat).await;
    }

    /// One pass over every stripe: what changed, or whole stripes.
    async fn flush(&mut self) {
        if !self.capturing || self.hold_for_standby() {
            return;
        }
        let store = self.core.store.clone();
        let stripes = store.stripe_count();
        let now = self.core.clock.now();
        // Each change is encoded straight from the log into the frame
        // being built: no owned record, no copy of its key, per change; and
        // the log's list goes back to the next stripe drained.
        let mut frame: Option<ChangesFrame> = None;
        let mut spare = std::mem::take(&mut self.spare);
        for index in 0..stripes {
            match store.drain_stripe_into(index, now, &mut spare) {
                Drained::Nothing => {}
                Drained::Changes(changes) => {
                    for changed in changes.keys() {
                        let building = frame.get_or_insert_with(|| self.changes_frame(now));
                        let pushed = building.push(
                            changed.key,
                            &table_state(changed.bucket),
                            &table_state(changed.other),
                        );
                        if let Err(e) = pushed {
                            self.encoding_failed(&e);
                            return;
                        }
                        if building.len() >= CHUNK {
                            self.emit_changes(frame.take()).await;
                        }
                    }
                    changes.recycle(&mut spare);
                }
                Drained::Whole(entries) => {
                    self.emit_changes(frame.take()).await;
                    self.emit_stripe(index, stripes, &entries).await;
                }
            }
        }
        self.spare = spare;
        self.emit_changes(frame.take()).await;
        self.node().stats.passes.fetch_add(1, Ordering::Relaxed);
        if self.syncing {
            self.syncing = false;
            tracing::info!(offset = self.offset, "full sync sent");
            // Tell the standby now rather than at the next heartbeat.
            self.heartbeat().await;
        }
        self.trim_capture();
    }

    /// Flow control: a standby that leaves a whole backlog of frames
    /// unacknowledged (stuck, or its link backed up) gets nothing more until
    /// it acknowledges; the changes wait in the stripes' buffers, which
    /// overflow into whole-stripe resyncs. So neither the backlog nor the
    /// socket grows, and a standby that stays stuck is dropped after
    /// `--repl-timeout` without acknowledgements.
    fn hold_for_standby(&mut self) -> bool {
        if self.standby.is_none() {
            self.held = false;
            return false;
        }
        let unacked = self.backlog.bytes_after(self.acked, self.offset);
        let full = unacked.is_none_or(|b| b >= self.backlog.cap() as u64);
        if full != self.held {
            self.held = full;
            if full {
                tracing::warn!(
                    acked = self.acked,
                    offset = self.offset,
                    "the standby is a whole backlog behind; holding its changes"
                );
            } else {
                tracing::info!(acked = self.acked, "the standby caught up; streaming again");
            }
        }
        full
    }

    /// Without a standby, keeps capturing only while the last one could
    /// still resume from the backlog.
    fn trim_capture(&mut self) {
        if self.standby.is_some() || !self.capturing {
            return;
        }
        if self.backlog.first(self.offset) > self.acked.saturating_add(1) {
            tracing::info!(
                acked = self.acked,
                "the backlog no longer reaches the last standby's position; \
                 stopping change capture (its next connection is a full sync)"
            );
            self.core.store.stop_capture();
            self.capturing = false;
            self.backlog.clear();
            self.node()
                .stats
                .backlog_resets
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A changes frame to build, addressed to the attached standby, with
    /// room for a chunk and its last record.
    fn changes_frame(&self, sent_at: u64) -> ChangesFrame {
        let id = self.standby.as_ref().map_or(0, |s| s.request_id);
        ChangesFrame::new(id, sent_at, CHUNK + CHUNK / 8)
    }

    /// Numbers, keeps and sends a changes frame, if any was built.
    async fn emit_changes(&mut self, frame: Option<ChangesFrame>) {
        let Some(frame) = frame.filter(|f| !f.is_empty()) else {
            return;
        };
        let offset = self.offset + 1;
        match frame.finish(offset) {
            Ok(frame) => self.emit_encoded(offset, frame).await,
            Err(e) => self.encoding_failed(&e),
        }
    }

    /// Sends stripe `index` (of `stripes`) whole, as one unit of parts.
    async fn emit_stripe(
        &mut self,
        index: usize,
        stripes: usize,
        entries: &[(crate::store::StoredKey, crate::store::Entry)],
    ) {
        // Stripe counts are powers of two up to 16384, so these fit.
        let slot_mod = stripes as u16;
        let slot_rem = index as u16;
        let mut records = Vec::new();
        let mut size = 0;
        let mut iter = entries.iter().peekable();
        while let Some((key, entry)) = iter.next() {
            let record = snapshot_record(key, entry);
            size += record_size(&record);
            records.push(record);
            if size >= CHUNK && iter.peek().is_some() {
                self.emit_part(slot_mod, slot_rem, false, std::mem::take(&mut records))
                    .await;
                size = 0;
            }
        }
        self.emit_part(slot_mod, slot_rem, true, records).await;
    }

    async fn emit_part(&mut self, slot_mod: u16, slot_rem: u16, last: bool, records: Vec<Record>) {
        let offset = self.offset + 1;
        let part = SnapshotPart {
            offset,
            slot_mod,
            slot_rem,
            last,
            records,
        };
        self.emit(offset, ReplResponse::Snapshot(part)).await;
    }

    /// Numbers, keeps and sends one data frame.
    async fn emit(&mut self, offset: u64, frame: ReplResponse) {
        let id = self.standby.as_ref().map_or(0, |s| s.request_id);
        let mut buf = BytesMut::new();
        match encode_response(id, &Response::Repl(frame), &mut buf) {
            Ok(()) => self.emit_encoded(offset, buf.freeze()).await,
            Err(e) => self.encoding_failed(&e),
        }
    }

    /// Keeps and sends frame number `offset`.
    async fn emit_encoded(&mut self, offset: u64, frame: Bytes) {
        self.offset = offset;
        self.core.role.set_offset(offset);
        self.backlog.push(offset, frame.clone());
        self.send(frame).await;
    }

    /// A data frame could not be encoded. Cannot happen with frames bounded
    /// by CHUNK and keys by the key length limit; a standby that missed a
    /// frame would diverge, so it is made to resync.
    fn encoding_failed(&mut self, e: &tollgate_protocol::EncodeError) {
        tracing::error!(error = %e, "cannot encode a replication frame");
        self.backlog.clear();
        self.detach("a frame could not be encoded");
        self.core.store.start_capture();
    }

    async fn send_response(&mut self, response: ReplResponse) {
        let Some(id) = self.standby.as_ref().map(|s| s.request_id) else {
            return;
        };
        let mut buf = BytesMut::new();
        match encode_response(id, &Response::Repl(response), &mut buf) {
            Ok(()) => self.send(buf.freeze()).await,
            Err(e) => tracing::error!(error = %e, "cannot encode a replication message"),
        }
    }

    /// Writes one frame to the standby, if any, within `--repl-timeout`.
    async fn send(&mut self, frame: Bytes) {
        let timeout = self.core.settings.repl_timeout;
        let Some(standby) = self.standby.as_mut() else {
            return;
        };
        let frame = with_request_id(frame, standby.request_id);
        // Flushed: TLS may keep the tail of a write in its buffer.
        let write = async {
            standby.writer.write_all(&frame).await?;
            standby.writer.flush().await
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let why = format!("write failed: {e}");
                self.detach(&why);
            }
            Err(_) => {
                let why = format!("the standby did not read for {timeout:?}");
                self.detach(&why);
            }
        }
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if self.capturing {
            self.core.store.stop_capture();
        }
        self.node()
            .stats
            .replica_connected
            .store(0, Ordering::Relaxed);
    }
}

/// Reads from the standby, or waits forever when there is none.
async fn read_some(standby: &mut Option<Attached>) -> std::io::Result<usize> {
    match standby {
        Some(s) => {
            if s.rbuf.capacity() - s.rbuf.len() < 64 {
                s.rbuf.reserve(1024);
            }
            s.reader.read_buf(&mut s.rbuf).await
        }
        None => std::future::pending().await,
    }
}

/// A frame kept in the backlog carries the request id of the stream it was
/// first sent on; another stream gets a copy with its own.
fn with_request_id(frame: Bytes, id: RequestId) -> Bytes {
    let at = 5..9;
    if frame.len() < 9 || frame[at.clone()] == id.to_be_bytes() {
        return frame;
    }
    let mut copy = BytesMut::from(&frame[..]);
    copy[at].copy_from_slice(&id.to_be_bytes());
    copy.freeze()
}

/// About how many bytes a record takes on the wire.
pub(super) fn record_size(record: &Record) -> usize {
    use tollgate_protocol::{StateValue, TableState};
    let table = |t: &TableState| match t {
        TableState::Present(e) => {
            1 + 9
                + match &e.state {
                    StateValue::SlidingLog { entries } => 4 + 8 * entries.len(),
                    StateValue::Concurrency { leases, .. } => 12 + 24 * leases.len(),
                    _ => 24,
                }
        }
        _ => 1,
    };
    2 + record.key.len() + table(&record.token_bucket) + table(&record.other)
}
