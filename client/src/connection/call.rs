//! The state a connection's calls, writer and driver share, and the future
//! a call waits on: it submits on its first poll (one lock: slot, queue,
//! maybe a wakeup of the parked writer and of the deadline sweep) and takes
//! its answer on a later one (one lock). No timer, no channel per call.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tollgate_protocol::{Request, RequestId};

use super::pending::{Answer, Outgoing, Pending, Shape, Wakers};
use crate::error::Error;
use crate::sync::{AtomicBool, Mutex, Notify};

/// The state a connection's calls, writer and driver share.
pub(crate) struct Shared {
    pub(crate) pending: Mutex<Pending>,
    /// Wakes the parked writer.
    pub(crate) writer_wake: Notify,
    /// Wakes the driver to re-arm its deadline sweep.
    pub(crate) sweep_wake: Notify,
    /// Most requests waiting for the writer.
    pub(crate) max_queued: usize,
    /// The server has answered something on this connection (a call or a
    /// probe; the handshake does not count). Set by the driver.
    pub(crate) answered: AtomicBool,
}

impl Shared {
    pub(crate) fn new(max_queued: usize, idle_rearm: Duration) -> Self {
        Self {
            pending: Mutex::new(Pending::new(Instant::now() + idle_rearm)),
            writer_wake: Notify::new(),
            sweep_wake: Notify::new(),
            max_queued,
            answered: AtomicBool::new(false),
        }
    }

    /// Queues `outgoing` for a call due by `deadline`.
    fn submit(
        &self,
        outgoing: Outgoing,
        deadline: Instant,
        budget: Duration,
        waker: Waker,
    ) -> Result<RequestId, Error> {
        let (shape, name) = match &outgoing {
            Outgoing::Checks { kind, checks } => (checks.shape(), kind.name()),
            Outgoing::Request(r) => (Shape::Response, request_name(r)),
        };
        let (id, wake_writer, wake_sweep) = {
            let mut p = self.pending.lock();
            if p.closed {
                return Err(Error::ConnectionLost);
            }
            if p.queue.len() >= self.max_queued {
                return Err(Error::Overloaded {
                    queued: p.queue.len(),
                });
            }
            let queued = p.queue.len();
            let id = p
                .wait(waker, deadline, budget, shape, name)
                .ok_or(Error::Overloaded { queued })?;
            p.queue.push((id, outgoing));
            let wake_writer = std::mem::replace(&mut p.writer_parked, false);
            let wake_sweep = deadline < p.armed;
            if wake_sweep {
                p.armed = deadline;
            }
            (id, wake_writer, wake_sweep)
        };
        if wake_writer {
            self.writer_wake.notify_one();
        }
        if wake_sweep {
            self.sweep_wake.notify_one();
        }
        Ok(id)
    }

    /// Closes the map and fails every waiting call. Idempotent.
    pub(crate) fn close(&self) {
        let mut wakers = Wakers::new();
        self.pending.lock().close(&mut wakers);
        wakers.into_iter().for_each(Waker::wake);
        // A parked writer must see `closed` and stop.
        self.writer_wake.notify_one();
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.pending.lock().waiting()
    }
}

/// The name of a request, for errors.
pub(crate) fn request_name(request: &Request) -> &'static str {
    match request {
        Request::Hello { .. } => "HELLO",
        Request::Ping => "PING",
        Request::Check(_) => "CHECK",
        Request::Check2(_) => "CHECK2",
        Request::Peek(_) => "PEEK",
        Request::Reset(_) => "RESET",
        Request::Refund(_) => "REFUND",
        Request::Release(_) => "RELEASE",
        Request::Repl(_) => "REPL",
        Request::Topology => "TOPOLOGY",
        Request::Usage(_) => "USAGE",
        Request::NodeChallenge => "NODE_CHALLENGE",
    }
}

/// A call in flight, without the connection it goes through: submits on
/// its first poll, then waits for its slot. Whoever holds it passes the
/// connection's [`Shared`] to every poll and to [`release`](Self::release)
/// when it is dropped unanswered: [`Call`] borrows the connection,
/// [`OwnedCall`](super::OwnedCall) holds it (a future with no borrow, so a
/// check's future can own its connection without a layer of its own).
pub(crate) struct Exchange {
    state: CallState,
}

enum CallState {
    Start {
        outgoing: Outgoing,
        deadline: Instant,
        budget: Duration,
    },
    Waiting(RequestId),
    Finished,
}

impl Exchange {
    pub(crate) fn new(outgoing: Outgoing, deadline: Instant, budget: Duration) -> Self {
        Self {
            state: CallState::Start {
                outgoing,
                deadline,
                budget,
            },
        }
    }

    /// Submits on the first poll, then takes the answer once it is there.
    pub(crate) fn poll(
        &mut self,
        shared: &Shared,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Answer, Error>> {
        // The waiting poll (every call's second one) neither moves nor
        // rewrites the state: only the first poll takes the request out.
        if let CallState::Waiting(id) = self.state {
            let polled = shared.pending.lock().poll_answer(id, cx.waker());
            if polled.is_ready() {
                self.state = CallState::Finished;
            }
            return polled;
        }
        match std::mem::replace(&mut self.state, CallState::Finished) {
            CallState::Start {
                outgoing,
                deadline,
                budget,
            } => match shared.submit(outgoing, deadline, budget, cx.waker().clone()) {
                Ok(id) => {
                    self.state = CallState::Waiting(id);
                    Poll::Pending
                }
                Err(e) => Poll::Ready(Err(e)),
            },
            CallState::Waiting(_) | CallState::Finished => Poll::Ready(Err(Error::ConnectionLost)),
        }
    }

    /// For a call dropped before its answer: frees its slot, so a queued
    /// request is then not sent and a late answer finds nothing.
    pub(crate) fn release(&mut self, shared: &Shared) {
        if let CallState::Waiting(id) = self.state {
            self.state = CallState::Finished;
            shared.pending.lock().release(id);
        }
    }
}

/// A call in flight on a borrowed connection.
pub(crate) struct Call<'a> {
    shared: &'a Shared,
    exchange: Exchange,
}

impl<'a> Call<'a> {
    pub(crate) fn new(
        shared: &'a Shared,
        outgoing: Outgoing,
        deadline: Instant,
        budget: Duration,
    ) -> Self {
        Self {
            shared,
            exchange: Exchange::new(outgoing, deadline, budget),
        }
    }
}

impl Future for Call<'_> {
    type Output = Result<Answer, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        this.exchange.poll(this.shared, cx)
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        self.exchange.release(self.shared);
    }
}
