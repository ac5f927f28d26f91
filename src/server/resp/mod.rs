//! The RESP front end (`--resp ADDR`): Redis's protocol (RESP2, and RESP3
//! after `HELLO 3`) for clients written for Redis, translated into the
//! same store calls as the binary protocol.
//!
//! ```text
//!  accept -> admission (a place of --max-connections, shared with the
//!   protocol port; when full: -ERR max number of clients reached)
//!   -> TLS (the protocol port's)
//!   -> read (buffer.rs: 16 KiB own, a longer unfinished command grows
//!      from --max-connection-memory)
//!   -> parse.rs: complete commands, bounded -> commands.rs: a
//!      batch of them answered in order (auth, node admission, MULTI)
//!        CL.THROTTLE        -> throttle.rs: token bucket via Engine::check_one
//!        INCR/EXPIRE/GET... -> counter.rs -> engine/counter.rs: fixed window
//!                              counters (Store::update)
//!        CLUSTER SLOTS ...  -> cluster.rs: the node's topology
//!   -> reply.rs (RESP2/RESP3) -> one write per batch
//! ```
//!
//! Invariants (the protocol port's, kept here too):
//! - the clock and the rules are read once per batch of commands;
//! - a started command must complete within `--frame-timeout`; an
//!   unauthenticated connection (the server has client tokens) must
//!   authenticate within `--handshake-timeout`; a quiet one is closed
//!   after `--idle-timeout`; replies not read within `--write-timeout`
//!   end the connection;
//! - a malformed stream gets one `-ERR Protocol error` and is closed; a
//!   bad command gets an error reply and the connection goes on; no input
//!   panics;
//! - on shutdown a connection answers what it has read and closes.

mod buffer;
mod cluster;
mod commands;
mod context;
mod counter;
mod multi;
mod parse;
mod reply;
mod table;
mod throttle;

use super::admission::{Admission, Answer};
use super::budget::ReadBuffer;
use super::conn_metrics::OpenConnection;
use super::connection::{write_out, WriteError};
use super::frontend::accept_loop;
use super::handshake::secure_with;
use super::Shared;
use crate::tls::Socket;
use buffer::{CommandBuffer, READ_BUFFER};
use bytes::BytesMut;
use commands::Session;
use context::Ctx;
use parse::{Args, Limits};
use reply::Reply;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use table::names as command_names;

/// Most commands answered before the replies are written out, so a long
/// pipeline does not grow the write buffer without bound.
const MAX_BATCH: usize = 1024;
/// On drain, a connection quiet this long has nothing more in flight.
const DRAIN_QUIET: Duration = Duration::from_millis(50);

/// Connection ids (CLIENT ID, HELLO's `id`), unique per process.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Serves the RESP front end on `listener` until `shutdown`.
pub(super) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    admission: Arc<Admission>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    let port = listener.local_addr().map_or(0, |a| a.port());
    tracing::info!(port, "RESP front end serving");
    let refusals = shared.clone();
    accept_loop(
        listener,
        admission,
        refusals,
        Answer::Resp,
        shutdown,
        |stream, peer, ticket| {
            let shared = shared.clone();
            tracker.spawn(async move {
                let _ticket = ticket;
                connection(stream, peer, shared, port).await;
            });
            std::future::ready(())
        },
    )
    .await;
}

impl From<WriteError> for ConnError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Io(e) => Self::Io(e),
            WriteError::Timeout(t) => Self::WriteTimeout(t),
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("not authenticated within {0:?}")]
    AuthTimeout(Duration),
    #[error("idle for {0:?}")]
    Idle(Duration),
    #[error("command not completed within {0:?}")]
    CommandTimeout(Duration),
    #[error("client did not read its replies within {0:?}")]
    WriteTimeout(Duration),
    #[error("no memory to read {lacking} more bytes of a command (budget {limit} bytes)")]
    NoMemory { lacking: usize, limit: usize },
}

struct Connection {
    stream: Socket,
    peer: SocketAddr,
    shared: Arc<Shared>,
    port: u16,
    rbuf: CommandBuffer,
    wbuf: BytesMut,
    session: Session,
    limits: Limits,
    /// When the partial command now in `rbuf` started arriving.
    partial_since: Option<Instant>,
}

async fn connection(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, port: u16) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "set_nodelay failed");
    }
    shared.metrics.frontends.resp.connections.inc();
    let _open = OpenConnection::new(&shared.metrics.conns.open);
    let opened = Instant::now();
    let Some(stream) = secure_with(stream, peer, &shared, crate::tls::Tls::protocol_acceptor).await
    else {
        return;
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut conn = Connection {
        stream,
        peer,
        port,
        rbuf: CommandBuffer::new(shared.budget.clone()),
        wbuf: BytesMut::with_capacity(READ_BUFFER),
        session: Session::new(&shared, id),
        limits: Limits {
            max_args: shared.frontends.resp_max_args as usize,
            max_arg_len: shared.resp_max_arg_len,
        },
        shared,
        partial_since: None,
    };
    tracing::debug!(%peer, id, "RESP connection opened");
    match conn.run(opened).await {
        Ok(()) => tracing::debug!(%peer, id, "RESP connection closed"),
        Err(e) => tracing::info!(%peer, id, error = %e, "RESP connection ended"),
    }
}

impl Connection {
    async fn run(&mut self, opened: Instant) -> Result<(), ConnError> {
        loop {
            let more = self.answer_buffered()?;
            self.flush().await?;
            if !more {
                return Ok(());
            }
            let (deadline, on_timeout) = self.read_deadline(opened);
            let shared = self.shared.clone();
            if let Err(lacking) = self.rbuf.room_to_read() {
                if !self.wait_for_memory(lacking, deadline).await? {
                    return Ok(());
                }
                continue;
            }
            tokio::select! {
                biased;
                _ = shared.lifecycle.abort.cancelled() => return Ok(()),
                _ = shared.lifecycle.draining.cancelled() => return self.drain().await,
                read = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf.buf)) => {
                    match read {
                        Ok(Ok(0)) => return Ok(()),
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(e.into()),
                        Err(_) => return Err(on_timeout),
                    }
                }
            }
        }
    }

    /// The next read must complete by this instant; which timeout applies
    /// depends on where the connection stands.
    fn read_deadline(&mut self, opened: Instant) -> (Instant, ConnError) {
        let c = &self.shared.network;
        if !self.session.authenticated {
            let t = c.handshake_timeout;
            return (opened + t, ConnError::AuthTimeout(t));
        }
        if self.rbuf.buf.is_empty() {
            self.partial_since = None;
            let t = c.idle_timeout;
            return (Instant::now() + t, ConnError::Idle(t));
        }
        let since = *self.partial_since.get_or_insert_with(Instant::now);
        let t = c.frame_timeout;
        (since + t, ConnError::CommandTimeout(t))
    }

    /// Answers the complete commands in the read buffer, a batch at a
    /// time; false when the connection must close (QUIT, a malformed
    /// stream), after its replies are written.
    fn answer_buffered(&mut self) -> Result<bool, ConnError> {
        loop {
            let mut batch: Vec<Args> = Vec::new();
            let mut broken = None;
            while batch.len() < MAX_BATCH {
                match parse::parse(&mut self.rbuf.buf, &self.limits) {
                    Ok(Some(args)) => {
                        self.partial_since = None;
                        batch.push(args);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        broken = Some(e);
                        break;
                    }
                }
            }
            if !batch.is_empty() {
                let rules = self.shared.engine.rules().current();
                let ctx = Ctx {
                    shared: &self.shared,
                    rules: &rules,
                    now: self.shared.engine.now(),
                    port: self.port,
                };
                self.session.run(&ctx, &batch, &mut self.wbuf);
            }
            if self.session.quit {
                return Ok(false);
            }
            if let Some(e) = broken {
                tracing::debug!(peer = %self.peer, error = %e, "malformed RESP stream");
                let mut reply = Reply {
                    buf: &mut self.wbuf,
                    resp3: self.session.resp3,
                };
                reply.error(&format!("ERR {e}"));
                self.rbuf.clear();
                return Ok(false);
            }
            if batch.len() < MAX_BATCH {
                return Ok(true);
            }
        }
    }

    /// An unfinished command needs `lacking` more bytes of the connection
    /// memory budget. A connection that holds none waits (reading nothing,
    /// so TCP holds the client back) until they are free; one that already
    /// holds some (its read buffer or its queued MULTI), or whose command's
    /// deadline passes first, is answered an error and closed, giving back
    /// what it holds: a connection never waits while holding budget, so
    /// connections cannot hold the budget waiting for each other.
    /// Ok(false): the server shuts down (a half-received command cannot be
    /// answered: close).
    async fn wait_for_memory(
        &mut self,
        lacking: usize,
        deadline: Instant,
    ) -> Result<bool, ConnError> {
        if self.rbuf.holds_budget() || self.session.holds_budget() {
            return self.no_memory(lacking).await;
        }
        let shared = self.shared.clone();
        tokio::select! {
            biased;
            _ = shared.lifecycle.abort.cancelled() => Ok(false),
            _ = shared.lifecycle.draining.cancelled() => Ok(false),
            freed = ReadBuffer::wait_for(&shared.budget, lacking, deadline) => {
                if freed {
                    return Ok(true);
                }
                self.no_memory(lacking).await
            }
        }
    }

    /// Refuses the unfinished command for want of memory and ends the
    /// connection.
    async fn no_memory(&mut self, lacking: usize) -> Result<bool, ConnError> {
        let limit = self.rbuf.budget_limit();
        let mut reply = Reply {
            buf: &mut self.wbuf,
            resp3: self.session.resp3,
        };
        reply.error(&format!(
            "ERR no memory to read the rest of this command: the connections' memory budget \
             (max-connection-memory, {limit} bytes) has not {lacking} bytes free; closing"
        ));
        self.rbuf.clear();
        self.flush().await?;
        Err(ConnError::NoMemory { lacking, limit })
    }

    async fn flush(&mut self) -> Result<(), ConnError> {
        if write_out(
            &mut self.stream,
            &self.wbuf,
            &self.shared,
            (&self.shared.lifecycle.abort, || {
                self.shared.lifecycle.abort.cancelled()
            }),
        )
        .await?
        {
            self.wbuf.clear();
        }
        Ok(())
    }

    /// Shutdown: answer what the client already sent, then close once it
    /// has been quiet for [`DRAIN_QUIET`] (or when the grace period ends).
    async fn drain(&mut self) -> Result<(), ConnError> {
        let shared = self.shared.clone();
        loop {
            let more = self.answer_buffered()?;
            self.flush().await?;
            if !more {
                return Ok(());
            }
            if self.rbuf.room_to_read().is_err() {
                // No memory for the rest of a long command: end here.
                break;
            }
            tokio::select! {
                biased;
                _ = shared.lifecycle.abort.cancelled() => return Ok(()),
                read = tokio::time::timeout(DRAIN_QUIET, self.stream.read_buf(&mut self.rbuf.buf)) => {
                    match read {
                        Ok(Ok(0)) | Err(_) => break,
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => return Err(e.into()),
                    }
                }
            }
        }
        let _ = self.stream.shutdown().await;
        Ok(())
    }
}
