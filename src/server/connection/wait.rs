//! Waiting for a connection's next read, and for what may stop it first:
//! the server aborting or draining, the connection being shed, the read
//! timer.
//!
//! The stops are honoured before a read, as a biased select would, but
//! checked by their flags (`server::stop`: no lock), not by polling their
//! waits. The waits are polled (registered with their tokens, under the
//! tokens' locks) only when the connection is about to sleep and they are
//! not registered yet for the task's waker: a registered wait stays
//! registered until it is dropped, and a stop raises its flag before it
//! wakes the waits, so the woken task finds the flag raised. Polled on
//! every sleep, the waits cost three lock round trips per read under load
//! (a connection drains its socket at each read, so it sleeps after each).

use crate::server::stop::Stop;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Poll, Waker};
use tokio::time::Sleep;
use tokio_util::sync::WaitForCancellationFutureOwned;

/// What ended the wait for a read: a stop (in the order they are
/// honoured), the read, or the read timer.
pub(super) enum Woke {
    Aborted,
    Drained,
    Shed,
    Read(std::io::Result<usize>),
    Timer,
}

impl Woke {
    /// The stops, in the order of [`next_read`]'s tokens and waits.
    const STOPS: [Woke; 3] = [Woke::Aborted, Woke::Drained, Woke::Shed];
}

/// The first of: a stop (`stops`: the abort, draining and shed stops, and
/// `waits`: a wait on each, made once per connection; `registered`: the
/// waker they were last polled with, kept across calls), the `read`, the
/// `timer`. A stop wins over a ready read, a read over the timer.
pub(super) async fn next_read(
    stops: [&Stop; 3],
    mut waits: [Pin<&mut WaitForCancellationFutureOwned>; 3],
    registered: &mut Option<Waker>,
    mut read: Pin<&mut impl Future<Output = std::io::Result<usize>>>,
    mut timer: Pin<&mut Sleep>,
) -> Woke {
    poll_fn(|cx| {
        // A raised stop is what its wait would answer; its flag is one
        // load (see `Stop`), the wait a poll under the token's lock.
        for (token, woke) in stops.iter().zip(Woke::STOPS) {
            if token.is_cancelled() {
                return Poll::Ready(woke);
            }
        }
        if let Poll::Ready(read) = read.as_mut().poll(cx) {
            return Poll::Ready(Woke::Read(read));
        }
        // About to sleep: every stop must be able to wake the connection,
        // which it can once its wait is registered with this waker.
        if !registered.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            for (wait, woke) in waits.iter_mut().zip(Woke::STOPS) {
                if wait.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(woke);
                }
            }
            *registered = Some(cx.waker().clone());
        }
        timer.as_mut().poll(cx).map(|()| Woke::Timer)
    })
    .await
}
