//! One client connection: handshake, then pipelined requests.
//!
//! The loop reads whatever the socket has, answers every complete frame in
//! the buffer, and writes all those answers at once (`write.rs`): responses
//! are coalesced per read, never flushed one by one. The clock is read once
//! per frame, so all checks of a batch see the same `now`. What a read
//! waits on besides the socket (shutdown, shedding, its timeout) is set up
//! once per connection, not once per read, and polled only when the read
//! is not ready (`wait.rs`).
//!
//! Errors are split the way the protocol requires: a frame that is bad but
//! complete gets an ERROR frame with its request id and the connection goes
//! on; a stream that can no longer be framed (oversized or undersized header),
//! a failed handshake or a timeout ends this connection only. No path here
//! touches the store before a request has decoded completely.
//!
//! Roles: every request that touches the counters is first admitted by the
//! node (a standby refuses writes, and PEEK unless it serves stale reads,
//! with NotPrimary naming its primary); a REPLICATE accepted by a primary
//! ends this task and hands the socket, with whatever was read past the
//! REPLICATE, to the node.
//!
//! Privilege: HELLO's token makes the connection a client, or, proving a
//! node secret over the connection's NODE_CHALLENGE, a node or a region
//! peer (`auth.rs`). Node-to-node control (REPLICATE, PROMOTE, HANDOFF, a
//! STATUS that announces a role) from a client or region connection is
//! answered AuthFailed and changes nothing; the connection stays open for
//! what it may do; a region connection may send only USAGE and PING
//! (`control.rs`).
//! TLS, when the port speaks it, is negotiated before the first byte of
//! the protocol, within the handshake timeout.
//!
//! Hostile peers: before HELLO a frame may be no larger than the largest
//! HELLO (`MAX_HELLO_FRAME`); a frame larger than the read buffer's own
//! 16 KiB waits for the shared budget (`budget.rs`) without reading more,
//! and is answered Overloaded if none frees within `--frame-timeout`; a
//! connection shed to make room (`admission.rs`) is answered
//! TooManyConnections; the client name is escaped before it reaches a log
//! line (`crate::log_text`).

mod control;
mod wait;
mod write;

use wait::Woke;
pub(super) use write::{write_out, WriteError};

use crate::engine::{Mode, Privilege, Verb};
use crate::node::{Access, Gate, Handover, Refusal};
use crate::server::admission::Ticket;
use crate::server::budget::ReadBuffer;
use crate::server::conn_metrics::OpenConnection;
use crate::server::handshake::secure;
use crate::server::Shared;
use crate::tls::Socket;
use bytes::BytesMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_protocol::{
    decode_request, encode_response, ErrorCode, Moved, Request, RequestId, Response,
    MAX_HELLO_FRAME, MIN_FRAME_BODY,
};

/// Answers are written out once this much is pending, so a long pipelined
/// burst does not grow the write buffer without bound. The write buffer
/// starts empty: an idle connection holds none.
const FLUSH_AT: usize = 64 * 1024;
/// On drain, a connection quiet this long has nothing more in flight.
const DRAIN_QUIET: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Continue,
    Close,
    /// A REPLICATE was accepted: the socket goes to the replication task.
    HandOver,
}

/// The REPLICATE a connection ends with.
struct Replicate {
    request_id: RequestId,
    replid: u64,
    offset: u64,
    advertise: String,
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("no HELLO within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("idle for {0:?}")]
    Idle(Duration),
    #[error("frame not completed within {0:?}")]
    FrameTimeout(Duration),
    #[error("client did not read its answers within {0:?}")]
    WriteTimeout(Duration),
}

/// Why a connection is closed with an ERROR of the server's own (request
/// id 0), rather than for something the client sent.
enum Goodbye {
    /// Shed to make room for a new connection.
    Shed,
    /// A frame waited for buffer memory past the frame timeout.
    Overloaded { frame: usize },
}

struct Connection {
    stream: Socket,
    peer: SocketAddr,
    shared: Arc<Shared>,
    /// This connection's place among those served.
    ticket: Ticket,
    rbuf: ReadBuffer,
    wbuf: BytesMut,
    /// Set by a valid HELLO; before it only HELLO is accepted.
    ready: bool,
    /// What the HELLO proved (a client until then).
    privilege: Privilege,
    /// The region this connection's USAGE speaks for, once one applied.
    usage_region: Option<String>,
    /// Whom this connection's remembered CHECK2 answers belong to (what
    /// its HELLO authenticated with).
    owner: crate::engine::Owner,
    /// The nonce of this connection's NODE_CHALLENGE, which its HELLO must
    /// prove a node secret over.
    challenge: Option<[u8; tollgate_protocol::NONCE_LEN]>,
    client_name: String,
    /// When the partial frame now in `rbuf` started arriving.
    partial_since: Option<Instant>,
    /// What the kernel still holds for the connection behind the last
    /// read: `Some(0)` when the read left room in `rbuf` (it took all there
    /// was), `None` when it filled `rbuf` and no CHECK2 has asked the
    /// kernel since. Part of a CHECK2's backlog: the buffer holds at most
    /// 16 KiB (or one larger frame), so the bytes behind it wait in the
    /// kernel, and without them a backlog could never pass
    /// `--shed-normal-backlog`.
    unread: Option<usize>,
    /// Set with [`Flow::HandOver`].
    replicate: Option<Replicate>,
    /// The server's `abort` and `draining`, as tokens of this connection's
    /// own: checking or waiting on the server-wide tokens takes a lock that
    /// every connection contends for, these a lock of this connection's.
    abort: CancellationToken,
    draining: CancellationToken,
}

pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    ticket: Ticket,
) {
    // Answers must not wait for delayed ACKs (Nagle): gateways pipeline.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "set_nodelay failed");
    }
    shared.metrics.conns.accepted.inc();
    let _open = OpenConnection::new(&shared.metrics.conns.open);
    let opened = Instant::now();
    let Some(stream) = secure(stream, peer, &shared).await else {
        return;
    };
    let abort = shared.lifecycle.abort.child_token();
    let draining = shared.lifecycle.draining.child_token();
    let mut conn = Connection {
        stream,
        peer,
        rbuf: ReadBuffer::new(shared.budget.clone()),
        shared,
        ticket,
        wbuf: BytesMut::new(),
        ready: false,
        privilege: Privilege::Client,
        usage_region: None,
        challenge: None,
        owner: Default::default(),
        client_name: String::new(),
        partial_since: None,
        unread: Some(0),
        replicate: None,
        abort,
        draining,
    };
    tracing::debug!(%peer, tls = conn.stream.is_tls(), "connection opened");
    match conn.run(opened).await {
        Ok(()) => match conn.replicate.take() {
            Some(r) => hand_over(conn, r).await,
            None => tracing::debug!(%peer, client = %conn.client_name, "connection closed"),
        },
        Err(e) => tracing::info!(%peer, client = %conn.client_name, error = %e, "connection ended"),
    }
}

async fn hand_over(mut conn: Connection, r: Replicate) {
    let handover = Handover {
        stream: conn.stream,
        peer: conn.peer,
        // The node's own buffers take over; the budget is given back when
        // `conn.rbuf` drops.
        leftover: std::mem::take(&mut conn.rbuf.buf),
        request_id: r.request_id,
        replid: r.replid,
        offset: r.offset,
        advertise: r.advertise,
    };
    tracing::debug!(peer = %conn.peer, client = %conn.client_name, "replication connection handed over");
    let shared = conn.shared;
    tokio::select! {
        _ = shared.lifecycle.draining.cancelled() => {}
        taken = shared.engine.node().hand_over(handover) => {
            if !taken {
                tracing::debug!(peer = %conn.peer, "replication task gone; connection dropped");
            }
        }
    }
}

impl Connection {
    /// Serves the connection; `opened` is when it was accepted (the
    /// handshake timeout counts from it).
    async fn run(&mut self, opened: Instant) -> Result<(), ConnError> {
        let shared = self.shared.clone();
        // Waits that live as long as the loop: registered once, each read
        // only re-checks them (a wait made per read would add and remove a
        // waiter every time).
        let mut aborted = std::pin::pin!(self.abort.clone().cancelled_owned());
        let mut drained = std::pin::pin!(self.draining.clone().cancelled_owned());
        let mut shed = std::pin::pin!(self.ticket.shed().cancelled_owned());
        // The waker the three waits are registered with (see `wait`).
        let mut registered = None;
        // One timer for the connection's life rather than one per read: the
        // idle deadline moves with every read, but the timer is only moved
        // earlier at once (a frame's deadline); when it fires before the
        // deadline in force, it is set to that deadline and waited on again.
        let (deadline, _) = self.read_deadline(opened);
        let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
        loop {
            if self.answer_buffered().await? != Flow::Continue {
                return self.flush().await;
            }
            self.flush().await?;

            let (deadline, on_timeout) = self.read_deadline(opened);
            if let Err(needed) = self.rbuf.room_to_read() {
                // Read nothing more until the frame has memory: its bytes
                // wait in the kernel.
                tokio::select! {
                    biased;
                    _ = aborted.as_mut() => return Ok(()),
                    _ = drained.as_mut() => return self.drain().await,
                    _ = shed.as_mut() => return self.goodbye(Goodbye::Shed).await,
                    room = ReadBuffer::wait_for(&shared.budget, needed, deadline) => {
                        if !room {
                            let frame = self.rbuf.front_frame();
                            return self.goodbye(Goodbye::Overloaded { frame }).await;
                        }
                    }
                }
                // The waits were polled here, maybe with another waker.
                registered = None;
                continue;
            }
            if deadline < timer.deadline() {
                timer.as_mut().reset(deadline);
            }
            // Until a read completes: `deadline` stays the one computed
            // above, however often the timer fires early.
            loop {
                let woke = {
                    let read = std::pin::pin!(self.stream.read_buf(&mut self.rbuf.buf));
                    let lifecycle = &shared.lifecycle;
                    let stops = [&lifecycle.abort, &lifecycle.draining, self.ticket.shed()];
                    let waits = [aborted.as_mut(), drained.as_mut(), shed.as_mut()];
                    wait::next_read(stops, waits, &mut registered, read, timer.as_mut()).await
                };
                match woke {
                    Woke::Aborted => return Ok(()),
                    Woke::Drained => return self.drain().await,
                    Woke::Shed => return self.goodbye(Goodbye::Shed).await,
                    Woke::Read(read) => {
                        match read {
                            Ok(0) => return Ok(()),
                            Ok(_) => self.ticket.touch(),
                            Err(e) => return Err(e.into()),
                        }
                        self.note_unread();
                        break;
                    }
                    Woke::Timer => {
                        if Instant::now() >= deadline {
                            return Err(on_timeout);
                        }
                        // Fired at an older, earlier deadline.
                        timer.as_mut().reset(deadline);
                    }
                }
            }
        }
    }

    /// After a read: whether the kernel may hold more behind it. A read
    /// takes what the kernel holds up to the buffer's room, so only a full
    /// buffer may have left bytes behind; the kernel is asked (a syscall)
    /// only when a CHECK2 needs its backlog, so other requests never pay.
    fn note_unread(&mut self) {
        let full = self.rbuf.buf.len() == self.rbuf.buf.capacity();
        self.unread = if full { None } else { Some(0) };
    }

    /// Closes with an ERROR of the server's own (request id 0).
    async fn goodbye(&mut self, why: Goodbye) -> Result<(), ConnError> {
        let (code, message) = match why {
            Goodbye::Shed => (ErrorCode::TooManyConnections, self.ticket.shed_message()),
            Goodbye::Overloaded { frame } => (
                ErrorCode::Overloaded,
                format!(
                    "no memory for a {frame}-byte frame within {:?}: --max-connection-memory is in use by other connections",
                    self.shared.network.frame_timeout
                ),
            ),
        };
        tracing::info!(peer = %self.peer, client = %self.client_name, %message, "closing the connection");
        self.error(0, code, &message);
        self.flush().await?;
        let _ = self.stream.shutdown().await;
        Ok(())
    }

    /// The next read must complete by this instant; which timeout applies
    /// depends on where the connection stands.
    fn read_deadline(&mut self, opened: Instant) -> (Instant, ConnError) {
        let c = &self.shared.network;
        if !self.ready {
            let t = c.handshake_timeout;
            return (opened + t, ConnError::HandshakeTimeout(t));
        }
        if self.rbuf.buf.is_empty() {
            self.partial_since = None;
            let t = c.idle_timeout;
            return (Instant::now() + t, ConnError::Idle(t));
        }
        // A started frame must finish within frame_timeout from its first
        // byte, however slowly it trickles in.
        let since = *self.partial_since.get_or_insert_with(Instant::now);
        let t = c.frame_timeout;
        (since + t, ConnError::FrameTimeout(t))
    }

    /// Answers every complete frame in the read buffer.
    async fn answer_buffered(&mut self) -> Result<Flow, ConnError> {
        loop {
            // Before HELLO, no frame larger than a HELLO can be.
            let mut limits = self.shared.limits;
            if !self.ready {
                limits.max_frame = limits.max_frame.min(MAX_HELLO_FRAME);
            }
            // Only whole frames (or headers to refuse) reach the decoder, so
            // it never reserves memory for a frame on the peer's say-so.
            if !self.rbuf.decodable(MIN_FRAME_BODY, limits.max_frame) {
                return Ok(Flow::Continue);
            }
            let flow = match decode_request(&mut self.rbuf.buf, &limits) {
                Ok(None) => return Ok(Flow::Continue),
                Ok(Some((id, request))) => {
                    // A whole frame was consumed: a partial one starts afresh.
                    self.partial_since = None;
                    self.handle(id, request)
                }
                Err(e) => {
                    self.partial_since = None;
                    tracing::debug!(peer = %self.peer, error = %e, "bad frame");
                    let id = e.request_id().unwrap_or(0);
                    self.error(id, e.code(), &e.to_string());
                    // Before a valid HELLO nothing about this peer is trusted
                    // (wrong version, not our protocol at all): close.
                    if e.is_fatal() || !self.ready {
                        Flow::Close
                    } else {
                        Flow::Continue
                    }
                }
            };
            if flow != Flow::Continue {
                return Ok(flow);
            }
            if self.wbuf.len() >= FLUSH_AT {
                self.flush().await?;
            }
        }
    }

    fn handle(&mut self, id: RequestId, request: Request) -> Flow {
        if !self.ready {
            return self.handshake(id, request);
        }
        if self.privilege == Privilege::Region && !Self::region_may(&request) {
            let msg = "a region connection (region secret) may send only USAGE and PING";
            self.error(id, ErrorCode::AuthFailed, msg);
            return Flow::Continue;
        }
        let shared = &*self.shared;
        // The node admits the access, then its gate screens the request's
        // slots (cluster mode: MOVED, TryAgain; PROTOCOL.md §14).
        let gate = match access_of(&request).map(|a| shared.engine.node().admit(a)) {
            None => Gate::All,
            Some(Ok(gate)) => gate,
            Some(Err(refusal)) => {
                self.refuse(id, &refusal);
                return Flow::Continue;
            }
        };
        if let Err(refusal) = gate.screen(&request) {
            self.refuse(id, &refusal);
            return Flow::Continue;
        }
        let encoded = match request {
            Request::Hello { .. } | Request::NodeChallenge => {
                self.error(
                    id,
                    ErrorCode::Malformed,
                    "HELLO was already sent on this connection",
                );
                Ok(())
            }
            Request::Ping => encode_response(id, &Response::Pong, &mut self.wbuf),
            Request::Repl(repl) => return self.replication(id, repl),
            // Outside a cluster: one shard owning every slot (PROTOCOL.md §14).
            Request::Topology => encode_response(
                id,
                &Response::Topology(shared.engine.node().topology()),
                &mut self.wbuf,
            ),
            Request::Check(batch) => {
                shared
                    .engine
                    .answer(id, &batch, Verb::Check(Mode::Charge), &gate, &mut self.wbuf)
            }
            Request::Peek(batch) => {
                shared
                    .engine
                    .answer(id, &batch, Verb::Check(Mode::Peek), &gate, &mut self.wbuf)
            }
            Request::Check2(batch) => {
                // Backlog for shedding: the request bytes received behind
                // this frame, in the buffer and in the kernel.
                let unread = *self.unread.get_or_insert_with(|| self.stream.unread());
                let backlog = self.rbuf.buf.len().saturating_add(unread);
                (shared.engine).answer_tagged(
                    id,
                    &batch,
                    self.owner,
                    backlog,
                    &gate,
                    &mut self.wbuf,
                )
            }
            Request::Reset(keys) => {
                let removed = shared.engine.reset(&keys);
                encode_response(id, &Response::ResetDone(removed), &mut self.wbuf)
            }
            Request::Refund(batch) => {
                shared
                    .engine
                    .answer(id, &batch, Verb::Refund, &gate, &mut self.wbuf)
            }
            Request::Release(leases) => shared.engine.release(id, &leases, &mut self.wbuf),
            Request::Usage(report) => return self.usage(id, &report),
        };
        // Unreachable with batches bounded by max_batch; answered, not panicked.
        if let Err(e) = encoded {
            tracing::error!(peer = %self.peer, error = %e, "cannot encode an answer");
            self.error(id, ErrorCode::Internal, &e.to_string());
        }
        Flow::Continue
    }

    /// The node would not serve this request here and now: MOVED to the
    /// slot's owner, or an ERROR saying why.
    fn refuse(&mut self, id: RequestId, refusal: &Refusal) {
        if let Refusal::Moved {
            slot,
            addr,
            version,
        } = refusal
        {
            let moved = Moved {
                slot: *slot,
                version: *version,
                addr: addr.clone(),
            };
            return self.respond(id, &Response::Moved(moved));
        }
        self.error(id, refusal.code(), &refusal.to_string());
    }

    fn error(&mut self, id: RequestId, code: ErrorCode, message: &str) {
        self.shared.engine.errors().count(code);
        let response = Response::Error {
            code,
            message: message.to_owned(),
        };
        self.respond(id, &response);
    }

    /// Encodes a fixed-size answer; these cannot exceed their wire fields.
    fn respond(&mut self, id: RequestId, response: &Response) {
        if let Err(e) = encode_response(id, response, &mut self.wbuf) {
            tracing::error!(peer = %self.peer, error = %e, "cannot encode an answer");
        }
    }

    async fn flush(&mut self) -> Result<(), ConnError> {
        if write_out(
            &mut self.stream,
            &self.wbuf,
            &self.shared,
            (&self.shared.lifecycle.abort, || self.abort.cancelled()),
        )
        .await?
        {
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Shutdown: answer what the client already sent (including what is
    /// still on the wire), tell it the server is going away, close. Reading
    /// stops once the client has been quiet for [`DRAIN_QUIET`]; a client that
    /// keeps sending is cut off when the grace period ends (`abort`).
    async fn drain(&mut self) -> Result<(), ConnError> {
        let abort = self.abort.clone();
        loop {
            if self.answer_buffered().await? != Flow::Continue {
                return self.flush().await;
            }
            self.flush().await?;
            // A frame still waiting for memory is not answered.
            if self.rbuf.room_to_read().is_err() {
                break;
            }
            tokio::select! {
                biased;
                _ = abort.cancelled() => return Ok(()),
                read = tokio::time::timeout(DRAIN_QUIET, self.stream.read_buf(&mut self.rbuf.buf)) => {
                    match read {
                        Ok(Ok(0)) | Err(_) => break,
                        Ok(Ok(_)) => self.note_unread(),
                        Ok(Err(e)) => return Err(e.into()),
                    }
                }
            }
        }
        self.error(0, ErrorCode::ShuttingDown, "server is shutting down");
        self.flush().await?;
        let _ = self.stream.shutdown().await;
        Ok(())
    }
}

impl From<WriteError> for ConnError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Io(e) => Self::Io(e),
            WriteError::Timeout(t) => Self::WriteTimeout(t),
        }
    }
}

/// What a request asks of the node: to write (a charge, a refund, a
/// release, a reset), to read (a peek), or nothing it admits (handshake,
/// control, node requests).
fn access_of(request: &Request) -> Option<Access> {
    match request {
        Request::Check(_)
        | Request::Check2(_)
        | Request::Refund(_)
        | Request::Release(_)
        | Request::Reset(_) => Some(Access::Write),
        Request::Peek(_) => Some(Access::Read),
        _ => None,
    }
}
