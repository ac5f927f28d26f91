//! One multiplexed, pipelined connection to a node.
//!
//! ```text
//!  call ── submit (slot + queue, one lock) ──> writer task: take queue, merge CHECKs,
//!    │                                          encode, one write ──────────────> socket
//!    └─ Call future <── slot Done <── driver task: decode a read's frames, deliver
//!                                      under one lock, wake; sweep deadlines ◄── socket
//! ```
//!
//! Invariants (the slot rules are in [`pending`]):
//! - answers may come in any order; they are matched by request id alone;
//! - either task ending (socket error, EOF, undecodable stream, a suspect
//!   connection that did not answer its probe, the [`Connection`] dropped)
//!   stops the other one and fails every waiting call at once;
//! - a request whose caller gave up (deadline, dropped future) before the
//!   writer took it is not sent, hence not charged;
//! - with [`ClientConfig::tls`] the TLS handshake (the node verified by the
//!   host part of its address) comes before HELLO, within the same
//!   connect timeout; the tasks then work on the TLS stream's halves.
//!
//! The tasks' steps on the shared state (`writer::take`,
//! `driver::hand_over`, `sweep_expired`, `queue_probe`) are plain
//! functions apart from the socket I/O, so the loom models in
//! `loom_models.rs` (`--cfg tollgate_loom`, scripts/loom.sh) drive them and
//! the real `Call` future.

mod call;
mod driver;
#[cfg(all(test, tollgate_loom))]
mod loom_models;
pub(crate) mod pending;
mod writer;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tollgate_protocol::{
    decode_response, encode_request, Request, RequestId, Response, Role, ServerLimits,
    PROTOCOL_VERSION,
};

use crate::config::ClientConfig;
use crate::error::Error;
use crate::node::Node;
use crate::sync::{AtomicBool, Ordering};
use call::{Call, Exchange, Shared};
use pending::{Answer, Outgoing};

/// Request id of HELLO. Slot ids are never 0.
const HELLO_ID: RequestId = 0;

/// Spare room kept in the read buffer before each read.
pub(crate) const READ_CHUNK: usize = 16 * 1024;

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

/// Run by each task however it ends (including its runtime shutting down):
/// stops the sibling task and fails the waiting calls.
pub(crate) struct StopOnExit {
    shared: Arc<Shared>,
    stop: CancellationToken,
    alive: Arc<AtomicBool>,
}

impl Drop for StopOnExit {
    fn drop(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
        self.stop.cancel();
        self.shared.close();
    }
}

/// An open, handshaken connection and the handle its calls go through.
/// Dropping it stops both tasks and closes the socket.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    /// Mirrors "not closed" without the lock, for the call fast path.
    /// Relaxed: a stale `true` only sends a call to a connection that then
    /// fails it with ConnectionLost, as if it had died a moment later.
    alive: Arc<AtomicBool>,
    info: ServerInfo,
    node: Arc<Node>,
    stop: CancellationToken,
    /// Cancels `stop` when the last handle goes, ending both tasks.
    _stop_on_drop: DropGuard,
}

impl Connection {
    /// Connects, handshakes and starts the writer and driver tasks, all
    /// within `config.connect_timeout`.
    pub(crate) async fn open(node: Arc<Node>, config: &ClientConfig) -> Result<Self, Error> {
        match tokio::time::timeout(config.connect_timeout, Self::open_unbounded(&node, config))
            .await
        {
            Ok(Ok(conn)) => Ok(conn.with_node(node)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::ConnectTimeout {
                addr: node.addr.clone(),
                after: config.connect_timeout,
            }),
        }
    }

    fn with_node(mut self, node: Arc<Node>) -> Self {
        self.node = node;
        self
    }

    async fn open_unbounded(node: &Arc<Node>, config: &ClientConfig) -> Result<Self, Error> {
        let addr = node.addr.as_str();
        let connect_error = |e: std::io::Error| Error::Connect {
            addr: addr.to_owned(),
            source: Arc::new(e),
        };
        let mut stream = TcpStream::connect(addr).await.map_err(connect_error)?;
        // Requests are small and latency-bound; the writer already batches,
        // so Nagle's algorithm would only add delay.
        stream.set_nodelay(true).map_err(connect_error)?;
        if let Some(idle) = config.keepalive {
            set_keepalive(&stream, idle).map_err(connect_error)?;
        }

        match &config.tls {
            None => {
                let (info, leftover) = handshake(&mut stream, config).await?;
                let (reader, writer) = stream.into_split();
                Ok(Self::start(node, config, info, leftover, reader, writer))
            }
            Some(tls) => {
                let name = crate::tls::server_name(addr).map_err(connect_error)?;
                let mut stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
                    .connect(name, stream)
                    .await
                    .map_err(connect_error)?;
                let (info, leftover) = handshake(&mut stream, config).await?;
                let (reader, writer) = tokio::io::split(stream);
                Ok(Self::start(node, config, info, leftover, reader, writer))
            }
        }
    }

    /// Starts the writer and driver tasks on a handshaken stream's halves.
    fn start<R, W>(
        node: &Arc<Node>,
        config: &ClientConfig,
        info: ServerInfo,
        leftover: BytesMut,
        reader: R,
        writer: W,
    ) -> Self
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        tracing::debug!(
            addr = node.addr.as_str(),
            version = info.version,
            epoch = info.epoch,
            role = ?info.role,
            tls = config.tls.is_some(),
            "connected"
        );
        let shared = Arc::new(Shared::new(config.max_queued, config.deadline));
        let stop = CancellationToken::new();
        let alive = Arc::new(AtomicBool::new(true));
        let exit = || StopOnExit {
            shared: Arc::clone(&shared),
            stop: stop.clone(),
            alive: Arc::clone(&alive),
        };
        tokio::spawn(writer::write_loop(
            writer,
            Arc::clone(&shared),
            exit(),
            info.limits,
        ));
        tokio::spawn(driver::drive(
            reader,
            leftover,
            Arc::clone(&shared),
            exit(),
            Arc::clone(node),
            driver::DriverSettings {
                max_frame: config.max_frame,
                idle_rearm: config.deadline,
                probe_timeout: config.probe_timeout,
            },
        ));
        Self {
            shared,
            alive,
            info,
            node: Arc::clone(node),
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
        }
    }

    pub(crate) fn info(&self) -> &ServerInfo {
        &self.info
    }

    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// False once either task has stopped; the next call then reconnects.
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.shared.in_flight()
    }

    /// Whether the server answered anything on this connection besides
    /// the handshake: a connection that closes before that is no proof
    /// the node serves (see `Shard`, reconnecting).
    pub(crate) fn answered(&self) -> bool {
        self.shared.answered.load(Ordering::Relaxed)
    }

    /// Stops both tasks now; waiting calls fail with `ConnectionLost`.
    pub(crate) fn shut_down(&self) {
        self.alive.store(false, Ordering::Relaxed);
        self.stop.cancel();
        self.shared.close();
    }

    /// Sends `outgoing` and waits for its answer until `deadline`. No timer:
    /// the driver's sweep ends the call at its deadline.
    pub(crate) fn exchange(&self, outgoing: Outgoing, deadline: Deadline) -> Call<'_> {
        Call::new(&self.shared, outgoing, deadline.at, deadline.budget)
    }

    /// Like [`exchange`](Self::exchange), on a handle the returned future
    /// keeps: no borrow, so it can be a field of a caller's future.
    pub(crate) fn exchange_owned(
        self: Arc<Self>,
        outgoing: Outgoing,
        deadline: Deadline,
    ) -> OwnedCall {
        OwnedCall {
            exchange: Exchange::new(outgoing, deadline.at, deadline.budget),
            conn: self,
        }
    }

    /// Sends a plain request and returns the response.
    pub(crate) async fn call(
        &self,
        request: Request,
        deadline: Deadline,
    ) -> Result<Response, Error> {
        match self.exchange(Outgoing::Request(request), deadline).await? {
            Answer::Response(r) => Ok(r),
            Answer::One(_) | Answer::Results(_) => Err(Error::UnexpectedResponse {
                request: "request",
                got: "CHECKED",
            }),
        }
    }
}

/// A call in flight that holds its connection (see [`Exchange`]).
pub(crate) struct OwnedCall {
    conn: Arc<Connection>,
    exchange: Exchange,
}

impl OwnedCall {
    pub(crate) fn conn(&self) -> &Arc<Connection> {
        &self.conn
    }

    /// Polls the call (it is `Unpin`: no pinning needed by its holder).
    pub(crate) fn poll_answer(&mut self, cx: &mut Context<'_>) -> Poll<Result<Answer, Error>> {
        self.exchange.poll(&self.conn.shared, cx)
    }
}

impl Drop for OwnedCall {
    fn drop(&mut self) {
        self.exchange.release(&self.conn.shared);
    }
}

fn set_keepalive(stream: &TcpStream, idle: Duration) -> std::io::Result<()> {
    let keepalive = socket2::TcpKeepalive::new().with_time(idle);
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    let keepalive = keepalive.with_interval(idle / 3).with_retries(3);
    socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)
}

/// Sends HELLO and reads its answer. Returns what the server told us and
/// any bytes read past the answer (they belong to the driver task).
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
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
    stream.flush().await?;
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
        } if version == PROTOCOL_VERSION => {
            usable(&limits)?;
            let info = ServerInfo {
                version,
                role,
                epoch,
                offset,
                limits,
            };
            Ok((info, buf))
        }
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

/// Body of the smallest CHECK: one check of one inline pair with a 1-byte
/// key (opcode, request id, count, pair count, key length, key, limit kind,
/// three u64, cost).
const SMALLEST_CHECK_BODY: u32 = 1 + 4 + 2 + 1 + 2 + 1 + 1 + 24 + 4;

/// Refuses a HELLO_OK whose limits let no check through (a batch, a group
/// or a key of at most 0, a frame smaller than the smallest CHECK): no
/// server serves with them (the reference server refuses to start so), and
/// obeyed they would make the client refuse every check locally as
/// invalid, a 400 on every route, kept after the server is gone since the
/// announced limits are. The attempt fails instead, and checks are
/// undecided (fail mode, fallback) like against any broken server.
fn usable(limits: &ServerLimits) -> Result<(), Error> {
    let zero = [
        ("max_batch", u32::from(limits.max_batch)),
        ("max_group", u32::from(limits.max_group)),
        ("max_key_len", u32::from(limits.max_key_len)),
    ];
    let unusable = zero
        .into_iter()
        .find(|(_, v)| *v == 0)
        .or((limits.max_frame < SMALLEST_CHECK_BODY).then_some(("max_frame", limits.max_frame)));
    match unusable {
        None => Ok(()),
        Some((field, value)) => Err(Error::Protocol(Arc::new(
            tollgate_protocol::DecodeError::InvalidValue {
                request_id: HELLO_ID,
                opcode: tollgate_protocol::opcode::HELLO_OK,
                field,
                value: value.into(),
            },
        ))),
    }
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
        Response::UsageOk(_) => "USAGE_OK",
        Response::Challenge { .. } => "CHALLENGE",
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
