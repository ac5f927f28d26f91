//! The writer task: takes everything queued, merges what can share a
//! frame, and writes it all with one syscall.
//!
//! Automatic coalescing: consecutive CHECK (or PEEK, or REFUND) calls found
//! in the queue together leave as **one** frame whose checks are the calls'
//! checks in order, up to the server's `max_batch` and `max_frame`. A
//! merged frame gets its own slot, which cuts the CHECKED answer back into
//! each call's results. There is no timer and no waiting for company: the
//! writer takes only what is already queued when it runs, so a lone call
//! leaves at once, and under load calls that arrived during the previous
//! write share the next frame.

use std::ops::Range;
use std::pin::pin;
use std::sync::Arc;

use bytes::BytesMut;
use smallvec::SmallVec;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tollgate_protocol::{
    encode_checks, encode_request, EncodeError, Request, RequestId, ServerLimits,
};

use super::call::Shared;
use super::pending::{BatchKind, Checks, Member, Outgoing, Pending, Wakers};
use super::{StopOnExit, READ_CHUNK};
use crate::error::Error;

/// Payload bytes of a CHECK frame besides its checks: opcode, request id
/// and the check count.
const CHECK_FRAME_OVERHEAD: usize = 1 + 4 + 2;

/// A frame planned under the lock, encoded after it.
#[derive(Debug)]
pub(super) enum Frame {
    /// A request as is (and a CHECK2, whose checks carry their tags).
    Request(RequestId, Request),
    /// A CHECK, PEEK or REFUND frame of the calls' checks at `calls` in
    /// the writer's [`Planned::checks`]: encoded from there, with no
    /// batch built first.
    Checks {
        id: RequestId,
        kind: BatchKind,
        count: usize,
        calls: Range<usize>,
    },
}

/// What one writer pass planned: its frames, and the checks they encode.
#[derive(Debug, Default)]
pub(super) struct Planned {
    pub frames: Vec<Frame>,
    pub checks: Vec<Checks>,
}

impl Planned {
    /// Encodes frame `frame` into `buf`; on error `buf` is unchanged.
    fn encode(&self, frame: &Frame, buf: &mut BytesMut) -> Result<(), EncodeError> {
        match frame {
            Frame::Request(id, request) => encode_request(*id, request, buf),
            Frame::Checks {
                id,
                kind,
                count,
                calls,
            } => encode_checks(
                kind.opcode(),
                *id,
                *count,
                self.checks[calls.clone()].iter().flat_map(Checks::groups),
                buf,
            ),
        }
    }

    fn id(frame: &Frame) -> RequestId {
        match frame {
            Frame::Request(id, _) | Frame::Checks { id, .. } => *id,
        }
    }

    fn clear(&mut self) {
        self.frames.clear();
        self.checks.clear();
    }

    /// The frames as requests, as the server decodes them (for the loom
    /// models, which play the server).
    #[cfg(all(test, tollgate_loom))]
    pub(super) fn into_requests(self) -> Vec<(RequestId, Request)> {
        let Self { frames, checks } = self;
        frames
            .into_iter()
            .map(|frame| match frame {
                Frame::Request(id, request) => (id, request),
                Frame::Checks {
                    id,
                    kind,
                    count,
                    calls,
                } => (id, kind.request(count, checks[calls].iter().cloned())),
            })
            .collect()
    }
}

/// A merge in progress: calls of one kind whose checks share a frame, the
/// checks pushed at `start..` of [`Planned::checks`].
struct Merge {
    kind: BatchKind,
    checks: usize,
    body: usize,
    start: usize,
    members: SmallVec<[Member; 8]>,
}

/// Turns the taken queue into frames (under the lock, which merged frames
/// need for their slot). Calls whose caller gave up are dropped here.
fn plan(
    p: &mut Pending,
    taken: &mut Vec<(RequestId, Outgoing)>,
    planned: &mut Planned,
    limits: &ServerLimits,
    wakers: &mut Wakers,
) {
    let max_body = limits.max_frame as usize;
    let mut merge: Option<Merge> = None;
    for (id, outgoing) in taken.drain(..) {
        if !p.wanted(id) {
            continue;
        }
        match outgoing {
            Outgoing::Request(request) => {
                flush(p, merge.take(), planned, wakers);
                planned.frames.push(Frame::Request(id, request));
            }
            Outgoing::Checks { kind, checks } => {
                let (n, len) = (checks.len(), checks.wire_len());
                let body = CHECK_FRAME_OVERHEAD + len;
                if body > max_body {
                    // Refused here, where the size is known exactly: an
                    // oversized frame would make the server close the
                    // connection under every other call.
                    p.complete(
                        id,
                        Err(Error::FrameTooLarge {
                            len: body,
                            max: limits.max_frame,
                        }),
                        wakers,
                    );
                    continue;
                }
                let fits = merge.as_ref().is_some_and(|m| {
                    m.kind == kind
                        && m.checks + n <= usize::from(limits.max_batch)
                        && m.body + len <= max_body
                });
                if !fits {
                    flush(p, merge.take(), planned, wakers);
                    merge = Some(Merge {
                        kind,
                        checks: 0,
                        body: CHECK_FRAME_OVERHEAD,
                        start: planned.checks.len(),
                        members: SmallVec::new(),
                    });
                }
                if let Some(m) = merge.as_mut() {
                    m.checks += n;
                    m.body += len;
                    m.members.push(Member {
                        id,
                        shape: checks.shape(),
                    });
                    planned.checks.push(checks);
                }
            }
        }
    }
    flush(p, merge, planned, wakers);
}

/// Emits a merge as one frame: the call's own id when it is alone, a
/// merged slot otherwise. The merge's checks are the last ones planned.
fn flush(p: &mut Pending, merge: Option<Merge>, planned: &mut Planned, wakers: &mut Wakers) {
    let Some(merge) = merge else {
        return;
    };
    let calls = merge.start..planned.checks.len();
    let id = match merge.members[..] {
        [only] => only.id,
        _ => {
            let Some(frame_id) = p.merged(merge.members.to_vec(), merge.kind.name()) else {
                for m in &merge.members {
                    p.complete(m.id, Err(Error::Overloaded { queued: 0 }), wakers);
                }
                planned.checks.truncate(merge.start);
                return;
            };
            frame_id
        }
    };
    let frame = match merge.kind {
        // Tagged checks: built as a CHECK2 request (the rare kind).
        BatchKind::Check2 => Frame::Request(
            id,
            merge
                .kind
                .request(merge.checks, planned.checks.drain(calls)),
        ),
        kind => Frame::Checks {
            id,
            kind,
            count: merge.checks,
            calls,
        },
    };
    planned.frames.push(frame);
}

/// What one pass of the writer found under the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Take {
    /// The connection is closed: the writer stops.
    Closed,
    /// Nothing queued: the writer is marked parked and waits for
    /// `writer_wake` (the next submit clears the mark and notifies).
    Park,
    /// `planned` holds what to encode and write.
    Frames,
}

/// The writer's step on the shared state: takes the whole queue under the
/// lock, plans it into `planned` (merged CHECKs, abandoned calls dropped),
/// then wakes the calls failed on the way (too large, no slot) after
/// unlocking. `taken` is scratch space, left empty.
pub(super) fn take(
    shared: &Shared,
    taken: &mut Vec<(RequestId, Outgoing)>,
    planned: &mut Planned,
    limits: &ServerLimits,
) -> Take {
    let mut wakers = Wakers::new();
    {
        let mut p = shared.pending.lock();
        if p.closed {
            return Take::Closed;
        }
        if p.queue.is_empty() {
            p.writer_parked = true;
            return Take::Park;
        }
        std::mem::swap(&mut p.queue, taken);
        plan(&mut p, taken, planned, limits, &mut wakers);
    }
    wakers.into_iter().for_each(std::task::Waker::wake);
    Take::Frames
}

/// Fails the call(s) of frame `id`, which could not be encoded.
pub(super) fn fail_frame(shared: &Shared, id: RequestId, error: Error) {
    let mut wakers = Wakers::new();
    shared.pending.lock().deliver(id, Err(error), &mut wakers);
    wakers.into_iter().for_each(std::task::Waker::wake);
}

/// The writer task. Generic over the sink so a test can count its writes.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut socket: W,
    shared: Arc<Shared>,
    exit: StopOnExit,
    limits: ServerLimits,
) {
    let mut taken: Vec<(RequestId, Outgoing)> = Vec::new();
    let mut planned = Planned::default();
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    // Made once, not per pass: each one made and dropped registers and
    // unregisters a waiter under a lock (per frame, at batch 1 about 3% of
    // a client's CPU with the driver's). A wakeup the writer receives
    // while busy only makes its next park return at once.
    let stop = exit.stop.clone();
    let mut cancelled = pin!(stop.cancelled());
    let mut wake = pin!(shared.writer_wake.notified());
    loop {
        match take(&shared, &mut taken, &mut planned, &limits) {
            Take::Closed => break,
            // A submit after the unlock stores a permit or wakes `wake`:
            // not missed.
            Take::Park => tokio::select! {
                biased;
                () = &mut cancelled => break,
                () = &mut wake => {
                    wake.set(shared.writer_wake.notified());
                    continue;
                }
            },
            Take::Frames => {}
        }
        for frame in &planned.frames {
            if let Err(e) = planned.encode(frame, &mut buf) {
                fail_frame(&shared, Planned::id(frame), Error::from(e));
            }
        }
        planned.clear();
        if buf.is_empty() {
            continue;
        }
        let written = tokio::select! {
            biased;
            () = &mut cancelled => break,
            // The flush is a no-op on TCP; under TLS it sends what the
            // session still holds.
            written = async { socket.write_all(&buf).await?; socket.flush().await } => written,
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

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::{decode_request, Limit, Pair, Request, ServerLimits};

    use super::*;
    use crate::connection::pending::Shape;
    use crate::sync::AtomicBool;

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

    fn check(key: &'static str) -> Outgoing {
        Outgoing::Checks {
            kind: BatchKind::Check,
            checks: Checks::One(Pair::inline(
                Bytes::from_static(key.as_bytes()),
                Limit::token_bucket(Rate::per_second(5), 10),
                1,
            )),
        }
    }

    /// Queues `outgoing` as a call waiting for an answer.
    fn queue(shared: &Shared, outgoing: Outgoing) -> RequestId {
        let shape = match &outgoing {
            Outgoing::Checks { checks, .. } => checks.shape(),
            Outgoing::Request(_) => Shape::Response,
        };
        let mut p = shared.pending.lock();
        let deadline = Instant::now() + Duration::from_secs(60);
        let id = p
            .wait(
                Waker::noop().clone(),
                deadline,
                Duration::from_secs(60),
                shape,
                "CHECK",
            )
            .expect("room");
        p.queue.push((id, outgoing));
        id
    }

    /// Calls queued while the writer is busy (here: not yet started) go
    /// out in one write: the CHECKs merged into one frame, the PING on its
    /// own; calls whose caller gave up are not sent at all, and a call too
    /// large for the server's frame fails alone.
    #[tokio::test]
    async fn queued_calls_leave_in_one_write_checks_merged_abandoned_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client_side = TcpStream::connect(listener.local_addr().expect("addr"))
            .await
            .expect("connect");
        let (mut server_side, _) = listener.accept().await.expect("accept");
        let (_read_half, write_half) = client_side.into_split();

        let shared = Arc::new(Shared::new(64, Duration::from_secs(60)));
        let mut sent = Vec::new();
        for i in 0..10 {
            let id = queue(&shared, check(if i % 2 == 0 { "even" } else { "odd" }));
            // Every fifth caller gave up before the writer ran.
            if i % 5 == 4 {
                shared.pending.lock().release(id);
            } else {
                sent.push(id);
            }
        }
        let big = Outgoing::Checks {
            kind: BatchKind::Check,
            checks: Checks::One(Pair::inline(
                Bytes::from(vec![b'k'; 500]),
                Limit::token_bucket(Rate::per_second(5), 10),
                1,
            )),
        };
        let big_id = queue(&shared, big);
        let ping = queue(&shared, Outgoing::Request(Request::Ping));

        let writes = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let limits = ServerLimits {
            max_frame: 400,
            ..ServerLimits::default()
        };
        let writer = tokio::spawn(write_loop(
            CountingWriter {
                inner: write_half,
                writes: Arc::clone(&writes),
            },
            Arc::clone(&shared),
            StopOnExit {
                shared: Arc::clone(&shared),
                stop: stop.clone(),
                alive: Arc::new(AtomicBool::new(true)),
            },
            limits,
        ));

        let mut buf = bytes::BytesMut::with_capacity(4096);
        let mut frames = Vec::new();
        while frames.len() < 2 {
            assert_ne!(server_side.read_buf(&mut buf).await.expect("read"), 0);
            while let Some(frame) =
                decode_request(&mut buf, &ServerLimits::default()).expect("valid")
            {
                frames.push(frame);
            }
        }
        // The 8 wanted checks in one CHECK frame (a merged slot's id), then
        // the PING with its own id.
        let Request::Check(batch) = &frames[0].1 else {
            panic!("first frame: {:?}", frames[0]);
        };
        assert_eq!(batch.len(), sent.len());
        assert!(
            !sent.contains(&frames[0].0),
            "a merged frame has its own id"
        );
        assert_eq!(frames[1], (ping, Request::Ping));
        assert_eq!(writes.load(Ordering::SeqCst), 1, "one write for the lot");
        // The oversized call failed alone, with the numbers.
        let (big, waiting) = {
            let mut p = shared.pending.lock();
            (p.poll_answer(big_id, Waker::noop()), p.waiting())
        };
        match big {
            Poll::Ready(Err(Error::FrameTooLarge { len, max: 400 })) => {
                assert_eq!(len, 7 + 1 + 2 + 500 + 25 + 4);
            }
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        assert_eq!(waiting, sent.len() + 1, "the others still wait");
        stop.cancel();
        writer.await.expect("writer task");
    }
}
