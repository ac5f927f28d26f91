//! One Envoy connection as tonic reads it, and what bounds its life: its
//! place (a [`Ticket`], shed when quiet while the server is full), its
//! deadlines, and its close after too many refused tokens.
//!
//! ```text
//!  accepted ──(first authorized call within --handshake-timeout)──> serving
//!  serving  ──(no authorized call for --idle-timeout)──> closed
//!  any      ──(shed to make room | MAX_AUTH_FAILURES refused calls)──> closed
//! ```
//!
//! Invariants:
//! - only an authorized call counts as activity: a connection that sends
//!   bytes but no call with a client token (a silent socket, a slow
//!   preface, endless unauthenticated calls) ages as if silent;
//! - "closed" is the end of the read side: tonic (hyper) sees the peer
//!   gone, drops the connection and with it every buffer and the place.

use crate::server::admission::Ticket;
use crate::tls::Socket;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// Refused calls (no token or a wrong one) after which a connection is
/// closed: a client that was given a token gets it right at once; one
/// guessing tokens gets a new TCP (and TLS) handshake per few guesses.
pub(super) const MAX_AUTH_FAILURES: u32 = 3;

/// No authorized call yet.
const NEVER: u64 = u64::MAX;

/// What the connection and its calls share (tonic hands it to each call
/// as the connection's `ConnectInfo`).
pub(super) struct ConnState {
    ticket: Ticket,
    opened: Instant,
    /// Milliseconds after `opened` of the last authorized call, or NEVER.
    last_call: AtomicU64,
    failures: AtomicU32,
    /// Cancelled to close the connection (too many refused calls).
    close: CancellationToken,
}

impl ConnState {
    /// An authorized call arrived: the connection is active.
    pub fn called(&self) {
        self.ticket.touch();
        let ms = self.opened.elapsed().as_millis() as u64;
        self.last_call.store(ms, Ordering::Relaxed);
    }

    /// A call was refused for its token; true when that closes the
    /// connection (the [`MAX_AUTH_FAILURES`]th).
    pub fn refused(&self) -> bool {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= MAX_AUTH_FAILURES {
            self.close.cancel();
        }
        failures == MAX_AUTH_FAILURES
    }

    /// When the connection is closed unless it makes an authorized call.
    fn deadline(&self, handshake: Duration, idle: Duration) -> Instant {
        match self.last_call.load(Ordering::Relaxed) {
            NEVER => self.opened + handshake,
            ms => self.opened + Duration::from_millis(ms) + idle,
        }
    }
}

/// One accepted connection as tonic reads it.
pub(super) struct Conn {
    socket: Socket,
    state: Arc<ConnState>,
    handshake: Duration,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    /// Ready once the connection is shed or closed.
    ended: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Conn {
    /// `handshake`: time for the first authorized call; `idle`: most time
    /// between two.
    pub fn new(socket: Socket, ticket: Ticket, handshake: Duration, idle: Duration) -> Self {
        let shed = ticket.shed().cancelled_owned();
        let close = CancellationToken::new();
        let closed = close.clone();
        let opened = Instant::now();
        Self {
            socket,
            state: Arc::new(ConnState {
                ticket,
                opened,
                last_call: AtomicU64::new(NEVER),
                failures: AtomicU32::new(0),
                close,
            }),
            handshake,
            idle,
            timer: Box::pin(tokio::time::sleep_until(opened + handshake)),
            ended: Box::pin(async move {
                tokio::select! {
                    _ = shed => {}
                    _ = closed.cancelled() => {}
                }
            }),
        }
    }

    /// Ready when a deadline passed; else the timer is set to the next one
    /// (calls move it later, so an expiry re-reads it before closing).
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let deadline = self.state.deadline(self.handshake, self.idle);
            if Instant::now() >= deadline {
                return Poll::Ready(());
            }
            self.timer.as_mut().reset(deadline);
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Arc<ConnState>;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.state.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // End of stream, as if the peer closed: hyper drops the connection.
        if this.ended.as_mut().poll(cx).is_ready() || this.poll_deadline(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.socket).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.socket).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_shutdown(cx)
    }
}
