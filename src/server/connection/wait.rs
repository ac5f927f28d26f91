//! Waiting for a connection's next read, and for what may stop it first:
//! the server aborting or draining, the connection being shed, the read
//! timer.
//!
//! The stops are honoured before a read, as a biased select would, but
//! checked by their tokens' flags first: a read that is ready is taken
//! without polling the stops' waits. Those are polled (registered with
//! their notifiers, under the notifiers' locks) only when the connection
//! is about to sleep, which under load is not once per read.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::Poll;
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

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

/// The first of: a stop (`stops`: the abort, draining and shed tokens, and
/// `waits`: a wait on each, made once per connection), the `read`, the
/// `timer`. A stop wins over a ready read, a read over the timer.
pub(super) async fn next_read(
    stops: [&CancellationToken; 3],
    mut waits: [Pin<&mut WaitForCancellationFutureOwned>; 3],
    mut read: Pin<&mut impl Future<Output = std::io::Result<usize>>>,
    mut timer: Pin<&mut Sleep>,
) -> Woke {
    poll_fn(|cx| {
        // A cancelled token is what its wait would answer; its flag is
        // cheaper to read than the wait is to poll.
        for (token, woke) in stops.iter().zip(Woke::STOPS) {
            if token.is_cancelled() {
                return Poll::Ready(woke);
            }
        }
        if let Poll::Ready(read) = read.as_mut().poll(cx) {
            return Poll::Ready(Woke::Read(read));
        }
        // About to sleep: every stop must be able to wake the connection.
        for (wait, woke) in waits.iter_mut().zip(Woke::STOPS) {
            if wait.as_mut().poll(cx).is_ready() {
                return Poll::Ready(woke);
            }
        }
        timer.as_mut().poll(cx).map(|()| Woke::Timer)
    })
    .await
}
