//! One multiplexed, pipelined connection to a server.
//!
//! ```text
//!  call ──(id, request)──> mpsc ──> writer task ── one write per drained batch ──> socket
//!    │                                                                               │
//!    └─ waits on oneshot <── pending map (id -> oneshot) <── reader task <── decode ─┘
//! ```
//!
//! Invariants:
//! - a call registers its oneshot in the pending map *before* queueing its
//!   request, so an answer can never arrive before its waiter;
//! - every pending entry is removed exactly once: by the reader when the
//!   answer arrives, by the writer when the request cannot be encoded, by the
//!   call itself when its deadline passes or its future is dropped
//!   ([`PendingEntry`] guard), or all at once when the connection closes;
//! - once the connection is closed (`Pending::closed`), no entry can be
//!   added, so no call waits for an answer that cannot come: it fails at
//!   once with [`Error::ConnectionLost`] instead of at its deadline;
//! - either task ending (socket error, EOF, undecodable stream, the
//!   [`Connection`] dropped) stops the other one and closes the pending map.
//!
//! Answers may come in any order; they are matched by request id alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_protocol::{
    decode_response, encode_request, Request, RequestId, Response, Role, ServerLimits,
    FRAME_HEADER_LEN, PROTOCOL_VERSION,
};

use crate::config::ClientConfig;
use crate::error::Error;

/// Request id of HELLO. Calls start at 1; ids wrap after 2^32 requests, long
/// after any earlier holder of an id has been answered or timed out.
const HELLO_ID: RequestId = 0;

/// Most requests coalesced into one write. Bounds the write buffer (and the
/// time the pending map is locked once per batch) while still turning a
/// burst of calls into a handful of syscalls.
const MAX_COALESCED: usize = 256;

/// Spare room kept in the read buffer before each read.
const READ_CHUNK: usize = 16 * 1024;

/// What the handshake told us about the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerInfo {
    /// Protocol version the server speaks.
    pub version: u16,
    pub role: Role,
    /// Replication epoch: the node with the highest epoch is the primary.
    pub epoch: u64,
    /// Replication offset at handshake time (0 when replication is off).
    pub offset: u64,
    /// The server's limits; requests over them are refused locally.
    pub limits: ServerLimits,
}

/// A call's time budget: the instant it ends, and its length for errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub at: Instant,
    pub budget: Duration,
}

impl Deadline {
    pub fn after(budget: Duration) -> Self {
        Self {
            at: Instant::now() + budget,
            budget,
        }
    }

    pub fn exceeded(&self) -> Error {
        Error::Timeout { after: self.budget }
    }
}

type Waiter = oneshot::Sender<Result<Response, Error>>;
type Queued = (RequestId, Request);

/// The calls waiting for an answer on one connection.
struct Pending {
    waiters: HashMap<RequestId, Waiter>,
    /// Set once, when the connection stops; no waiter is added after that.
    closed: bool,
}

/// State the connection's tasks and its calls share.
struct Shared {
    /// The pending map. One short critical section per call (insert), per
    /// answer (remove) and per coalesced write (filter).
    pending: Mutex<Pending>,
}

impl Shared {
    fn register(&self, id: RequestId, waiter: Waiter) -> Result<(), Error> {
        let mut pending = self.pending.lock();
        if pending.closed {
            return Err(Error::ConnectionLost);
        }
        pending.waiters.insert(id, waiter);
        Ok(())
    }

    fn forget(&self, id: RequestId) {
        self.pending.lock().waiters.remove(&id);
    }

    /// Hands `answer` to the call waiting for `id`, if it still waits.
    fn complete(&self, id: RequestId, answer: Result<Response, Error>) {
        let waiter = self.pending.lock().waiters.remove(&id);
        match waiter {
            // The call may have given up between our lookup and this send;
            // then the answer is simply dropped.
            Some(waiter) => drop(waiter.send(answer)),
            None => tracing::trace!(request_id = id, "answer for a call that gave up; dropped"),
        }
    }

    /// Keeps only the requests whose caller still waits: a request whose
    /// deadline passed while it was queued is not sent (nor charged).
    fn retain_waited_for(&self, batch: &mut Vec<Queued>) {
        let pending = self.pending.lock();
        batch.retain(|(id, _)| pending.waiters.contains_key(id));
    }

    /// Closes the map and fails every waiting call at once (dropping a
    /// waiter wakes its call with `ConnectionLost`). Idempotent.
    fn close(&self) {
        let waiters = {
            let mut pending = self.pending.lock();
            pending.closed = true;
            std::mem::take(&mut pending.waiters)
        };
        // Dropped outside the lock: waking callers need not wait for it.
        drop(waiters);
    }

    fn is_closed(&self) -> bool {
        self.pending.lock().closed
    }

    fn in_flight(&self) -> usize {
        self.pending.lock().waiters.len()
    }
}

/// Removes a call's pending entry when the call ends in any way (answer,
/// deadline, dropped future), so a late answer finds nothing and nothing
/// leaks. Removing an entry the reader already took is a no-op.
struct PendingEntry<'a> {
    shared: &'a Shared,
    id: RequestId,
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        self.shared.forget(self.id);
    }
}

/// Run by each task however it ends (including its runtime shutting down):
/// stops the sibling task and fails the waiting calls.
struct StopOnExit {
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for StopOnExit {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared.close();
    }
}

/// An open, handshaken connection and the handle its calls go through.
/// Dropping it stops both tasks and closes the socket.
pub(crate) struct Connection {
    /// Requests for the writer task.
    requests: mpsc::Sender<Queued>,
    shared: Arc<Shared>,
    /// Relaxed is enough: ids only need to be unique, which the atomic
    /// read-modify-write guarantees under any ordering.
    next_id: AtomicU32,
    info: ServerInfo,
    stop: CancellationToken,
    /// Cancels `stop` when the last handle goes, ending both tasks.
    _stop_on_drop: DropGuard,
}

impl Connection {
    /// Connects, handshakes and starts the reader and writer tasks, all
    /// within `config.connect_timeout`.
    pub(crate) async fn open(addr: &str, config: &ClientConfig) -> Result<Self, Error> {
        config.validate()?;
        match tokio::time::timeout(config.connect_timeout, Self::open_unbounded(addr, config)).await
        {
            Ok(result) => result,
            Err(_) => Err(Error::ConnectTimeout {
                addr: addr.to_owned(),
                after: config.connect_timeout,
            }),
        }
    }

    /// Opens every address at once (each within `config.connect_timeout`)
    /// and keeps the node that says it is primary with the highest epoch
    /// (the first in `addrs` on a tie); the other connections are closed.
    /// Returns it with its index in `addrs`.
    pub(crate) async fn open_primary(
        addrs: &[String],
        config: &ClientConfig,
    ) -> Result<(Self, usize), Error> {
        config.validate()?;
        let mut attempts = tokio::task::JoinSet::new();
        for (index, addr) in addrs.iter().enumerate() {
            let (addr, config) = (addr.clone(), config.clone());
            attempts.spawn(async move { (index, Self::open(&addr, &config).await) });
        }
        let mut best: Option<(Self, usize)> = None;
        let mut standbys = 0;
        let mut last_error = None;
        while let Some(joined) = attempts.join_next().await {
            let Ok((index, result)) = joined else {
                continue;
            };
            match result {
                Ok(conn) if conn.info.role == Role::Primary => {
                    let better = best.as_ref().is_none_or(|(b, i)| {
                        (conn.info.epoch, std::cmp::Reverse(index))
                            > (b.info.epoch, std::cmp::Reverse(*i))
                    });
                    if better {
                        best = Some((conn, index));
                    }
                }
                Ok(_) => standbys += 1,
                Err(e) => last_error = Some(Arc::new(e)),
            }
        }
        if let Some((conn, index)) = best {
            tracing::debug!(addr = %addrs[index], epoch = conn.info.epoch, "primary found");
            return Ok((conn, index));
        }
        Err(Error::NoPrimary {
            tried: addrs.len(),
            standbys,
            last_error,
        })
    }

    async fn open_unbounded(addr: &str, config: &ClientConfig) -> Result<Self, Error> {
        let connect_error = |e: std::io::Error| Error::Connect {
            addr: addr.to_owned(),
            source: Arc::new(e),
        };
        let mut stream = TcpStream::connect(addr).await.map_err(connect_error)?;
        // Requests are small and latency-bound; the writer already batches,
        // so Nagle's algorithm would only add delay.
        stream.set_nodelay(true).map_err(connect_error)?;

        let (info, leftover) = handshake(&mut stream, config).await?;
        tracing::debug!(
            addr,
            version = info.version,
            epoch = info.epoch,
            role = ?info.role,
            "connected"
        );

        let (reader, writer) = stream.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                waiters: HashMap::new(),
                closed: false,
            }),
        });
        let stop = CancellationToken::new();
        let (requests, queue) = mpsc::channel(config.max_queued);
        tokio::spawn(write_loop(
            writer,
            queue,
            StopOnExit {
                shared: Arc::clone(&shared),
                stop: stop.clone(),
            },
            info.limits.max_frame,
        ));
        tokio::spawn(read_loop(
            reader,
            leftover,
            StopOnExit {
                shared: Arc::clone(&shared),
                stop: stop.clone(),
            },
            config.max_frame,
        ));
        Ok(Self {
            requests,
            shared,
            next_id: AtomicU32::new(HELLO_ID + 1),
            info,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        })
    }

    pub(crate) fn info(&self) -> &ServerInfo {
        &self.info
    }

    /// False once either task has stopped; the next call then reconnects.
    pub(crate) fn is_alive(&self) -> bool {
        !self.shared.is_closed()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    /// Stops both tasks now; waiting calls fail with `ConnectionLost`.
    pub(crate) fn shut_down(&self) {
        self.stop.cancel();
        self.shared.close();
    }

    /// Sends `request` and waits for its answer until `deadline`.
    pub(crate) async fn call(
        &self,
        request: Request,
        deadline: Deadline,
    ) -> Result<Response, Error> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, answer) = oneshot::channel();
        self.shared.register(id, waiter)?;
        let _entry = PendingEntry {
            shared: &self.shared,
            id,
        };
        let exchange = async {
            // A full queue waits for room, within the deadline.
            self.requests
                .send((id, request))
                .await
                .map_err(|_| Error::ConnectionLost)?;
            // The sender is dropped unanswered only when the connection closes.
            answer.await.map_err(|_| Error::ConnectionLost)?
        };
        match tokio::time::timeout_at(deadline.at, exchange).await {
            Ok(result) => result,
            Err(_) => Err(deadline.exceeded()),
        }
    }
}

/// Sends HELLO and reads its answer. Returns what the server told us and
/// any bytes read past the answer (they belong to the reader task).
async fn handshake(
    stream: &mut TcpStream,
    config: &ClientConfig,
) -> Result<(ServerInfo, BytesMut), Error> {
    let hello = Request::Hello {
        version: PROTOCOL_VERSION,
        client_name: config.client_name.clone(),
        auth_token: config.auth_token.clone().map(Into::into),
    };
    let mut buf = BytesMut::with_capacity(64);
    encode_request(HELLO_ID, &hello, &mut buf)?;
    stream.write_all(&buf).await?;
    buf.clear();

    // HELLO is the only request in flight, so the first frame answers it
    // whatever id it carries.
    let response = loop {
        if let Some((_, response)) = decode_response(&mut buf, config.max_frame)? {
            break response;
        }
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(Error::Io(Arc::new(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "server closed the connection during the handshake",
            ))));
        }
    };
    match response {
        Response::HelloOk {
            version,
            role,
            epoch,
            offset,
            limits,
        } if version == PROTOCOL_VERSION => Ok((
            ServerInfo {
                version,
                role,
                epoch,
                offset,
                limits,
            },
            buf,
        )),
        Response::HelloOk { version, .. } => Err(Error::Handshake {
            code: tollgate_protocol::ErrorCode::UnsupportedVersion,
            message: format!(
                "server answered with protocol version {version}, this client speaks {PROTOCOL_VERSION}"
            ),
        }),
        Response::Error { code, message } => Err(Error::Handshake { code, message }),
        other => Err(Error::UnexpectedResponse {
            request: "HELLO",
            got: response_name(&other),
        }),
    }
}

/// The writer task: waits for one request, then drains whatever else is
/// queued and sends the lot with one write. No flush per request: under load
/// many calls share a syscall and a TCP segment.
///
/// Generic over the sink so a test can count the writes it makes.
async fn write_loop<W: AsyncWrite + Unpin>(
    mut socket: W,
    mut queue: mpsc::Receiver<Queued>,
    exit: StopOnExit,
    max_frame: u32,
) {
    let mut batch: Vec<Queued> = Vec::new();
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        let first = tokio::select! {
            biased;
            () = exit.stop.cancelled() => break,
            next = queue.recv() => match next {
                Some(request) => request,
                // Every handle dropped: nothing more to send.
                None => break,
            },
        };
        batch.push(first);
        while batch.len() < MAX_COALESCED {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        exit.shared.retain_waited_for(&mut batch);
        for (id, request) in batch.drain(..) {
            let start = buf.len();
            if let Err(e) = encode_request(id, &request, &mut buf) {
                exit.shared.complete(id, Err(e.into()));
                continue;
            }
            // Checked here, where the size is known exactly: an oversized
            // frame would make the server close the connection under every
            // other call.
            let body = buf.len() - start - FRAME_HEADER_LEN;
            if body > max_frame as usize {
                buf.truncate(start);
                exit.shared.complete(
                    id,
                    Err(Error::FrameTooLarge {
                        len: body,
                        max: max_frame,
                    }),
                );
            }
        }
        if buf.is_empty() {
            continue;
        }
        let written = tokio::select! {
            biased;
            () = exit.stop.cancelled() => break,
            written = socket.write_all(&buf) => written,
        };
        if let Err(e) = written {
            tracing::debug!(error = %e, "write failed; closing the connection");
            break;
        }
        buf.clear();
        // One huge batch must not pin its buffer for the connection's life.
        if buf.capacity() > 64 * READ_CHUNK {
            buf = BytesMut::with_capacity(READ_CHUNK);
        }
    }
    // Dropping `exit` fails the waiting calls; dropping the write half then
    // shuts down our side of the socket.
    drop(exit);
}

/// The reader task: decodes answers as they come and hands each to its call.
async fn read_loop(mut socket: OwnedReadHalf, mut buf: BytesMut, exit: StopOnExit, max_frame: u32) {
    'read: loop {
        loop {
            match decode_response(&mut buf, max_frame) {
                Ok(Some((id, response))) => exit.shared.complete(id, Ok(response)),
                Ok(None) => break,
                Err(e) if e.is_fatal() => {
                    tracing::warn!(error = %e, "undecodable response stream; closing the connection");
                    break 'read;
                }
                // The bad frame was consumed whole; only its call fails.
                Err(e) => match e.request_id() {
                    Some(id) => exit.shared.complete(id, Err(e.into())),
                    None => tracing::warn!(error = %e, "undecodable response"),
                },
            }
        }
        if buf.capacity() - buf.len() < READ_CHUNK / 4 {
            buf.reserve(READ_CHUNK);
        }
        let read = tokio::select! {
            biased;
            () = exit.stop.cancelled() => break,
            read = socket.read_buf(&mut buf) => read,
        };
        match read {
            Ok(0) => {
                tracing::debug!(buffered = buf.len(), "server closed the connection");
                break;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "read failed; closing the connection");
                break;
            }
        }
    }
    drop(exit);
}

/// Names a response for [`Error::UnexpectedResponse`].
pub(crate) fn response_name(response: &Response) -> &'static str {
    match response {
        Response::HelloOk { .. } => "HELLO_OK",
        Response::Pong => "PONG",
        Response::Checked(_) => "CHECKED",
        Response::ResetDone(_) => "RESET_DONE",
        Response::Released(_) => "RELEASED",
        Response::Error { .. } => "ERROR",
        Response::Topology(_) => "TOPOLOGY_OK",
        Response::Moved(_) => "MOVED",
        Response::Repl(repl) => match repl {
            tollgate_protocol::ReplResponse::Stream { .. } => "REPL_STREAM",
            tollgate_protocol::ReplResponse::Snapshot(_) => "REPL_SNAPSHOT",
            tollgate_protocol::ReplResponse::Changes(_) => "REPL_CHANGES",
            tollgate_protocol::ReplResponse::Heartbeat { .. } => "REPL_HEARTBEAT",
            tollgate_protocol::ReplResponse::Status(_) => "STATUS_OK",
            tollgate_protocol::ReplResponse::Promoted { .. } => "PROMOTED",
            tollgate_protocol::ReplResponse::HandedOff { .. } => "HANDED_OFF",
        },
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll};

    use tokio::net::TcpListener;
    use tollgate_protocol::{decode_request, DEFAULT_CLIENT_MAX_FRAME};

    use super::*;

    /// A real socket's write half that counts the writes made on it.
    struct CountingWriter<W> {
        inner: W,
        writes: Arc<AtomicUsize>,
    }

    impl<W: AsyncWrite + Unpin> AsyncWrite for CountingWriter<W> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
            if let Poll::Ready(Ok(_)) = polled {
                self.writes.fetch_add(1, Ordering::SeqCst);
            }
            polled
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    /// Requests queued while the writer is busy (here: not yet started) go
    /// out in exactly one write, and those whose caller gave up are not
    /// sent at all. Structural: a writer that wrote per request would make
    /// one write per frame, whatever the kernel then merges.
    #[tokio::test]
    async fn queued_requests_go_out_in_one_write_without_abandoned_ones() {
        const QUEUED: u32 = 20;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client_side = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut server_side, _) = listener.accept().await.expect("accept");
        let (_read_half, write_half) = client_side.into_split();

        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                waiters: HashMap::new(),
                closed: false,
            }),
        });
        let (requests, queue) = mpsc::channel(64);
        let mut answers = Vec::new();
        for id in 1..=QUEUED {
            // Every fifth caller has given up (its entry is gone).
            if id % 5 != 0 {
                let (waiter, answer) = oneshot::channel();
                shared.register(id, waiter).expect("open");
                answers.push(answer);
            }
            requests.try_send((id, Request::Ping)).expect("room");
        }

        let writes = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let writer = tokio::spawn(write_loop(
            CountingWriter {
                inner: write_half,
                writes: Arc::clone(&writes),
            },
            queue,
            StopOnExit {
                shared: Arc::clone(&shared),
                stop: stop.clone(),
            },
            DEFAULT_CLIENT_MAX_FRAME,
        ));

        let expected: Vec<RequestId> = (1..=QUEUED).filter(|id| id % 5 != 0).collect();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut frames_per_read = Vec::new();
        let mut received = Vec::new();
        while received.len() < expected.len() {
            let n = server_side.read_buf(&mut buf).await.expect("read");
            assert_ne!(n, 0, "writer closed early");
            let before = received.len();
            while let Some((id, request)) =
                decode_request(&mut buf, &ServerLimits::default()).expect("valid frame")
            {
                assert_eq!(request, Request::Ping);
                received.push(id);
            }
            frames_per_read.push(received.len() - before);
        }
        assert_eq!(received, expected);
        assert_eq!(
            writes.load(Ordering::SeqCst),
            1,
            "frames per read: {frames_per_read:?}"
        );
        assert!(
            frames_per_read[0] > 1,
            "frames per read: {frames_per_read:?}"
        );

        stop.cancel();
        writer.await.expect("writer task");
        // The writer's exit closed the pending map: waiting calls were failed.
        assert!(shared.is_closed());
        for answer in answers {
            assert!(answer.await.is_err(), "a waiter outlived the connection");
        }
    }

    /// A request too large for the server's frame limit fails its own call
    /// and is not written; the others go out.
    #[tokio::test]
    async fn oversized_frame_fails_only_its_call() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client_side = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut server_side, _) = listener.accept().await.expect("accept");
        let (_read_half, write_half) = client_side.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                waiters: HashMap::new(),
                closed: false,
            }),
        });
        let (requests, queue) = mpsc::channel(8);
        let (big_waiter, big_answer) = oneshot::channel();
        shared.register(1, big_waiter).expect("open");
        let (ping_waiter, _ping_answer) = oneshot::channel();
        shared.register(2, ping_waiter).expect("open");
        let big = Request::Reset(vec![bytes::Bytes::from(vec![b'k'; 100])]);
        requests.try_send((1, big)).expect("room");
        requests.try_send((2, Request::Ping)).expect("room");
        let stop = CancellationToken::new();
        tokio::spawn(write_loop(
            write_half,
            queue,
            StopOnExit {
                shared: Arc::clone(&shared),
                stop: stop.clone(),
            },
            64,
        ));

        match big_answer.await.expect("answered") {
            Err(Error::FrameTooLarge { len, max: 64 }) => assert_eq!(len, 5 + 2 + 2 + 100),
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        let mut buf = BytesMut::new();
        let first = loop {
            if let Some(request) =
                decode_request(&mut buf, &ServerLimits::default()).expect("valid frame")
            {
                break request;
            }
            server_side.read_buf(&mut buf).await.expect("read");
        };
        assert_eq!(first, (2, Request::Ping));
        stop.cancel();
    }
}
