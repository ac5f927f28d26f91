//! The driver task: reads answers, sweeps deadlines, probes a suspect
//! connection, and feeds the node's circuit breaker.
//!
//! - Answers: every frame of a socket read is decoded first, then handed to
//!   its call(s) under one lock, and the callers are woken after it
//!   (batched wakeups: one lock and one pass per read, not per answer).
//! - Deadlines: no timer per call. The driver sleeps until the earliest
//!   deadline (`armed`) and fails the calls past theirs; a read also sweeps
//!   when `armed` has passed. With nothing waiting it re-arms one default
//!   deadline ahead, so calls with the default budget never need to wake it.
//! - Suspect: a sweep that timed a call out sends one PING; if the PING is
//!   not answered within `probe_timeout` the connection is dropped (a hung
//!   server is abandoned; the next call reconnects, to the standby when the
//!   shard has one).
//! - Breaker: the answers and timeouts of each pass are reported to the
//!   node's breaker in one go.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;
use tollgate_protocol::{decode_response, RequestId, Response};

use super::call::Shared;
use super::pending::{Swept, Wakers};
use super::{StopOnExit, READ_CHUNK};
use crate::error::Error;
use crate::node::Node;
use crate::sync::Ordering;

/// What the driver needs besides the socket.
pub(super) struct DriverSettings {
    /// Largest response frame body accepted.
    pub max_frame: u32,
    /// How far ahead to re-arm when nothing waits: the default deadline.
    pub idle_rearm: Duration,
    pub probe_timeout: Duration,
}

/// What handing over one read's answers came to.
#[derive(Debug, Clone, Copy)]
pub(super) struct HandedOver {
    /// Calls answered.
    pub answered: u32,
    /// The probe's PING was answered.
    pub probe_answered: bool,
    /// What the sweep found, when `armed` had passed.
    pub swept: Swept,
    /// When to sweep next.
    pub armed: Instant,
}

/// The driver's step on the shared state after a read: hands every decoded
/// answer to its call(s) under one lock, sweeps when `armed` has passed by
/// `now`, and wakes the callers after unlocking. Leaves `decoded` empty.
pub(super) fn hand_over(
    shared: &Shared,
    decoded: &mut Vec<(RequestId, Result<Response, Error>)>,
    now: Instant,
    idle_rearm: Duration,
) -> HandedOver {
    let mut wakers = Wakers::new();
    let out = {
        let mut p = shared.pending.lock();
        let (mut answered, mut probe_answered) = (0, false);
        for (id, answer) in decoded.drain(..) {
            let (n, probe) = p.deliver(id, answer, &mut wakers);
            answered += n;
            probe_answered |= probe;
        }
        let swept = if p.armed <= now {
            p.sweep(now, idle_rearm, &mut wakers)
        } else {
            Swept::default()
        };
        HandedOver {
            answered,
            probe_answered,
            swept,
            armed: p.armed,
        }
    };
    wakers.into_iter().for_each(std::task::Waker::wake);
    out
}

/// The driver's deadline sweep: times out the calls due by `now`, wakes
/// them after unlocking; returns what it found and when to sweep next.
pub(super) fn sweep_expired(
    shared: &Shared,
    now: Instant,
    idle_rearm: Duration,
) -> (Swept, Instant) {
    let mut wakers = Wakers::new();
    let (swept, armed) = {
        let mut p = shared.pending.lock();
        (p.sweep(now, idle_rearm, &mut wakers), p.armed)
    };
    wakers.into_iter().for_each(std::task::Waker::wake);
    (swept, armed)
}

/// After calls timed out: queues one PING probe due by `deadline` unless
/// one is in flight (or the connection closed), waking a parked writer for
/// it. Returns when to sweep next.
pub(super) fn queue_probe(shared: &Shared, deadline: Instant) -> Instant {
    let (armed, wake_writer) = {
        let mut p = shared.pending.lock();
        let queued = !p.probing && p.probe(deadline);
        (
            p.armed,
            queued && std::mem::replace(&mut p.writer_parked, false),
        )
    };
    if wake_writer {
        shared.writer_wake.notify_one();
    }
    armed
}

pub(super) async fn drive<R: AsyncRead + Unpin>(
    mut socket: R,
    mut buf: BytesMut,
    shared: Arc<Shared>,
    exit: StopOnExit,
    node: Arc<Node>,
    settings: DriverSettings,
) {
    let mut armed = shared.pending.lock().armed;
    let sleep = tokio::time::sleep_until(armed);
    tokio::pin!(sleep);
    let mut decoded: Vec<(RequestId, Result<Response, Error>)> = Vec::new();
    // Made once, not per pass (see the writer): registering and
    // unregistering a waiter per read costs a lock each.
    let stop = exit.stop.clone();
    let mut cancelled = pin!(stop.cancelled());
    let mut sweep_wake = pin!(shared.sweep_wake.notified());
    let mut proven = false;
    'drive: loop {
        let mut answered = 0u32;
        let mut swept = Swept::default();
        let mut probe_answered = false;
        tokio::select! {
            biased;
            () = &mut cancelled => break,
            read = socket.read_buf(&mut buf) => {
                if read_ended(read, &node, buf.len()) {
                    break;
                }
                let fatal = decode_all(&mut buf, settings.max_frame, &mut decoded, &node);
                let pass = hand_over(&shared, &mut decoded, Instant::now(), settings.idle_rearm);
                (answered, probe_answered, swept, armed) =
                    (pass.answered, pass.probe_answered, pass.swept, pass.armed);
                if fatal {
                    break 'drive;
                }
                if buf.capacity() - buf.len() < READ_CHUNK / 4 {
                    buf.reserve(READ_CHUNK);
                }
            }
            () = &mut sleep => {
                (swept, armed) = sweep_expired(&shared, Instant::now(), settings.idle_rearm);
            }
            () = &mut sweep_wake => {
                sweep_wake.set(shared.sweep_wake.notified());
                armed = shared.pending.lock().armed;
            }
        }
        if probe_answered {
            tracing::debug!(addr = %node.addr, "suspect connection answered its probe");
        }
        if (answered > 0 || probe_answered) && !proven {
            proven = true;
            shared.answered.store(true, Ordering::Relaxed);
        }
        node.record(answered + u32::from(probe_answered), swept.timed_out);
        if swept.probe_failed {
            tracing::warn!(
                addr = %node.addr,
                probe_timeout = ?settings.probe_timeout,
                "connection let calls time out and did not answer a probe; dropping it"
            );
            break;
        }
        if swept.timed_out > 0 {
            armed = queue_probe(&shared, Instant::now() + settings.probe_timeout);
        }
        if sleep.deadline() != armed {
            sleep.as_mut().reset(armed);
        }
    }
    // Calls still waiting on a connection that died count as one failure
    // of the node (not one per call: they all saw the same event).
    if !exit.stop.is_cancelled() && shared.in_flight() > 0 {
        node.record(0, 1);
    }
    drop(exit);
}

/// Decodes every whole frame read so far into `decoded`. True when the
/// stream cannot be decoded any further (the connection must close); a bad
/// frame that was consumed whole only fails its call.
#[inline]
fn decode_all(
    buf: &mut BytesMut,
    max_frame: u32,
    decoded: &mut Vec<(RequestId, Result<Response, Error>)>,
    node: &Node,
) -> bool {
    loop {
        match decode_response(buf, max_frame) {
            Ok(Some((id, response))) => decoded.push((id, Ok(response))),
            Ok(None) => return false,
            Err(e) if e.is_fatal() => {
                tracing::warn!(addr = %node.addr, error = %e, "undecodable response stream; closing the connection");
                return true;
            }
            // The bad frame was consumed whole; only its call fails.
            Err(e) => match e.request_id() {
                Some(id) => decoded.push((id, Err(e.into()))),
                None => tracing::warn!(error = %e, "undecodable response"),
            },
        }
    }
}

/// Whether a read ended the connection: the server closed it, or the read
/// failed.
#[inline]
fn read_ended(read: std::io::Result<usize>, node: &Node, buffered: usize) -> bool {
    match read {
        Ok(0) => {
            tracing::debug!(addr = %node.addr, buffered, "server closed the connection");
            true
        }
        Ok(_) => false,
        Err(e) => {
            tracing::debug!(addr = %node.addr, error = %e, "read failed; closing the connection");
            true
        }
    }
}
