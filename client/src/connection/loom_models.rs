//! loom models of a connection's calls, writer and driver around the
//! pending-request map.
//!
//! Compiled only under `--cfg tollgate_loom` (scripts/loom.sh), where
//! `crate::sync` hands out loom's mutex and a loom-visible `Notify`, so
//! these drive the real code: a caller is the real [`Call`] future under
//! `loom::future::block_on` (a wakeup that is never sent is a loom
//! deadlock), the writer is [`take`] (waiting on `writer_wake` when told to
//! park), the driver is [`hand_over`], [`sweep_expired`] and
//! [`queue_probe`]. A model thread plays the server: it answers what the
//! writer took. Only the socket I/O is left out. Every model ends with
//! [`Pending::assert_consistent`](super::pending::Pending::assert_consistent).
//!
//! Sweeps run on their own thread although the driver runs them between
//! reads: every interleaving of the real driver is among those explored,
//! and the map must not rely on that ordering anyway (the writer completes
//! slots too).

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use tokio::time::Instant;
use tollgate_protocol::units::Rate;
use tollgate_protocol::{CheckResult, ErrorCode, Limit, Pair, Request, RequestId, Response};

use super::call::{Call, Shared};
use super::driver::{hand_over, queue_probe, sweep_expired};
use super::pending::{Answer, BatchKind, Checks, Outgoing};
use super::writer::{take, Planned, Take};
use crate::error::Error;

/// Long enough that no sweep in a model fires on its own.
const IDLE: Duration = Duration::from_secs(60);
const BUDGET: Duration = Duration::from_millis(5);
const QUEUE: usize = 8;

fn shared() -> Arc<Shared> {
    Arc::new(Shared::new(QUEUE, IDLE))
}

fn ping() -> Outgoing {
    Outgoing::Request(Request::Ping)
}

/// A one-pair CHECK on `key`.
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

/// The server's result for a check on `key`: distinct per key, so a caller
/// can tell its own answer from another's.
fn result_for(key: &[u8]) -> CheckResult {
    CheckResult::Error(match key {
        b"a" => ErrorCode::Malformed,
        b"b" => ErrorCode::UnknownOpcode,
        _ => ErrorCode::Internal,
    })
}

/// What the server answers to `request`: PONG to a PING, a TOPOLOGY marker
/// (an ERROR frame) to TOPOLOGY, each check's own result to a CHECK.
fn answer(request: &Request) -> Response {
    match request {
        Request::Ping => Response::Pong,
        Request::Check(batch) => Response::Checked(
            batch
                .iter()
                .map(|check| result_for(&check[0].key))
                .collect(),
        ),
        other => Response::Error {
            code: ErrorCode::Internal,
            message: format!("{other:?}"),
        },
    }
}

/// Checks the map's invariants mid-run (a model also checks them at its
/// end, when nothing is in flight any more).
fn check_map(shared: &Shared) {
    shared.pending.lock().assert_consistent();
}

/// One writer pass that found something: parks (blocking on
/// `writer_wake`) while the queue is empty. `None` once closed.
fn take_some(shared: &Shared) -> Option<Vec<(RequestId, Request)>> {
    let mut taken = Vec::new();
    let mut planned = Planned::default();
    loop {
        match take(shared, &mut taken, &mut planned, &Default::default()) {
            Take::Closed => return None,
            Take::Park => shared.writer_wake.wait(),
            Take::Frames => {
                check_map(shared);
                return Some(planned.into_requests());
            }
        }
    }
}

/// Polls a future once with a waker nobody waits on: a caller that
/// submits and then gives up.
fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    let mut future = pin!(future);
    future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
}

/// Both futures to completion, polled in turn: two calls of one task.
fn both<A: Future, B: Future>(a: A, b: B) -> impl Future<Output = (A::Output, B::Output)> {
    let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    let (mut done_a, mut done_b) = (None, None);
    std::future::poll_fn(move |cx| {
        if done_a.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                done_a = Some(v);
            }
        }
        if done_b.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                done_b = Some(v);
            }
        }
        match (done_a.take(), done_b.take()) {
            (Some(a), Some(b)) => Poll::Ready((a, b)),
            (a, b) => {
                (done_a, done_b) = (a, b);
                Poll::Pending
            }
        }
    })
}

/// Checks the map and that no slot is left in use.
fn assert_settled(shared: &Shared) {
    let p = shared.pending.lock();
    p.assert_consistent();
    assert_eq!(p.waiting(), 0, "a call still waits");
    assert_eq!(p.slots_in_use(), 0, "a slot was never freed");
}

/// A call's answer races its deadline: exactly one of them ends the call,
/// the caller sees that one, and its slot is freed once.
#[test]
fn answer_races_deadline() {
    loom::model(|| {
        let shared = shared();
        let start = Instant::now();
        let deadline = start + BUDGET;

        let s = Arc::clone(&shared);
        let caller = thread::spawn(move || block_on(Call::new(&s, ping(), deadline, BUDGET)));
        let s = Arc::clone(&shared);
        let driver = thread::spawn(move || {
            let frames = take_some(&s).expect("open");
            let mut decoded: Vec<_> = frames.iter().map(|(id, r)| (*id, Ok(answer(r)))).collect();
            hand_over(&s, &mut decoded, start, IDLE).answered
        });
        let s = Arc::clone(&shared);
        let sweeper = thread::spawn(move || {
            check_map(&s);
            sweep_expired(&s, deadline, IDLE).0.timed_out
        });

        let result = caller.join().expect("caller");
        let (answered, timed_out) = (
            driver.join().expect("driver"),
            sweeper.join().expect("sweeper"),
        );
        assert_eq!(
            answered + timed_out,
            1,
            "answered {answered}, timed out {timed_out}"
        );
        match result {
            Ok(Answer::Response(Response::Pong)) => assert_eq!(answered, 1),
            Err(Error::Timeout { after }) => {
                assert_eq!((timed_out, after), (1, BUDGET));
            }
            other => panic!("the call ended with {other:?}"),
        }
        assert_settled(&shared);
    });
}

/// Closing races two calls being submitted and the writer: every caller
/// ends with ConnectionLost (none hangs, none is queued after the close),
/// and the writer stops.
#[test]
fn close_races_inserts() {
    loom::model(|| {
        let shared = shared();
        let deadline = Instant::now() + IDLE;
        let callers: Vec<_> = (0..2)
            .map(|_| {
                let s = Arc::clone(&shared);
                thread::spawn(move || block_on(Call::new(&s, ping(), deadline, IDLE)))
            })
            .collect();
        let s = Arc::clone(&shared);
        let writer = thread::spawn(move || while take_some(&s).is_some() {});

        shared.close();
        for caller in callers {
            match caller.join().expect("caller") {
                Err(Error::ConnectionLost) => {}
                other => panic!("a call on a closed connection ended with {other:?}"),
            }
        }
        writer.join().expect("writer");
        assert_settled(&shared);
    });
}

/// A call gives up (its future dropped) while the writer may be taking its
/// request; the next call reuses its slot. A request given up before the
/// writer took it is not sent; the first call's answer, arriving late,
/// never reaches the second call, whose answer wakes the task that awaits
/// it, not the one that first polled it.
#[test]
fn reused_id_never_gets_an_old_answer() {
    loom::model(|| {
        let shared = shared();
        let start = Instant::now();
        let deadline = start + IDLE;

        let gave_up = Arc::new(AtomicBool::new(false));

        let (s, flag) = (Arc::clone(&shared), Arc::clone(&gave_up));
        let caller = thread::spawn(move || {
            let first = Call::new(&s, ping(), deadline, IDLE);
            assert!(poll_once(first).is_pending(), "submitted, not answered");
            flag.store(true, SeqCst);
            // Submitted from one task, awaited from another (a select!
            // that moved on): the answer must wake the second one.
            let mut second = pin!(Call::new(
                &s,
                Outgoing::Request(Request::Topology),
                deadline,
                IDLE,
            ));
            match poll_once(second.as_mut()) {
                Poll::Pending => block_on(second),
                Poll::Ready(ended) => ended,
            }
        });
        let s = Arc::clone(&shared);
        let server = thread::spawn(move || {
            // Holds the PING's answer until the TOPOLOGY is sent, then
            // answers both, the stale one first.
            let mut late = None;
            loop {
                // Seen set: the first call was dropped before this take.
                let dropped = gave_up.load(SeqCst);
                for (id, request) in take_some(&s).expect("open") {
                    assert!(
                        !(dropped && request == Request::Ping),
                        "a request given up before the take was sent"
                    );
                    if request == Request::Topology {
                        let mut decoded: Vec<_> = late.into_iter().collect();
                        decoded.push((id, Ok(answer(&request))));
                        return hand_over(&s, &mut decoded, start, IDLE).answered;
                    }
                    late = Some((id, Ok(answer(&request))));
                }
            }
        });

        match caller.join().expect("caller") {
            Ok(Answer::Response(Response::Error { message, .. })) => {
                assert_eq!(message, "Topology");
            }
            other => panic!("the second call got {other:?}"),
        }
        assert_eq!(
            server.join().expect("server"),
            1,
            "only the live call is answered"
        );
        assert_settled(&shared);
    });
}

/// Two callers race the writer's take: each request is written exactly
/// once (alone or merged into one frame) and each caller gets its own
/// result back.
#[test]
fn callers_race_the_writer() {
    loom::model(|| {
        let shared = shared();
        let start = Instant::now();
        let deadline = start + IDLE;
        let callers: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|key| {
                let s = Arc::clone(&shared);
                thread::spawn(move || (key, block_on(Call::new(&s, check(key), deadline, IDLE))))
            })
            .collect();
        let s = Arc::clone(&shared);
        let server = thread::spawn(move || {
            let mut written = Vec::new();
            while written.len() < 2 {
                let frames = take_some(&s).expect("open");
                let mut decoded = Vec::new();
                for (id, request) in &frames {
                    let Request::Check(batch) = request else {
                        panic!("wrote {request:?}");
                    };
                    written.extend(batch.iter().map(|c| c[0].key.clone()));
                    decoded.push((*id, Ok(answer(request))));
                }
                hand_over(&s, &mut decoded, start, IDLE);
            }
            written
        });

        for caller in callers {
            let (key, result) = caller.join().expect("caller");
            match result {
                Ok(Answer::One(r)) => assert_eq!(r, result_for(key.as_bytes()), "{key}"),
                other => panic!("the call on {key} got {other:?}"),
            }
        }
        let mut written = server.join().expect("server");
        written.sort();
        assert_eq!(written, ["a", "b"], "each check written exactly once");
        assert_settled(&shared);
    });
}

/// Two checks of one task, merged into one frame when the writer finds
/// both queued, race the first one's deadline: that call sees its result
/// or its timeout, never both; the other gets its own result; each is
/// answered or timed out exactly once.
#[test]
fn merged_answer_races_a_deadline() {
    loom::model(|| {
        let shared = shared();
        let start = Instant::now();
        let (soon, late) = (start + BUDGET, start + IDLE);

        let s = Arc::clone(&shared);
        let caller = thread::spawn(move || {
            block_on(both(
                Call::new(&s, check("a"), soon, BUDGET),
                Call::new(&s, check("b"), late, IDLE),
            ))
        });
        // Answers whatever is written until the connection closes (a call
        // timed out before the take is not written at all).
        let s = Arc::clone(&shared);
        let server = thread::spawn(move || {
            let mut answered = 0;
            while let Some(frames) = take_some(&s) {
                let mut decoded: Vec<_> =
                    frames.iter().map(|(id, r)| (*id, Ok(answer(r)))).collect();
                answered += hand_over(&s, &mut decoded, start, IDLE).answered;
            }
            answered
        });
        let s = Arc::clone(&shared);
        let sweeper = thread::spawn(move || {
            check_map(&s);
            sweep_expired(&s, soon, IDLE).0.timed_out
        });

        let (a, b) = caller.join().expect("caller");
        let timed_out = sweeper.join().expect("sweeper");
        shared.close();
        let answered = server.join().expect("server");
        assert_eq!(
            answered + timed_out,
            2,
            "answered {answered}, timed out {timed_out}"
        );
        match b {
            Ok(Answer::One(r)) => assert_eq!(r, result_for(b"b")),
            other => panic!("the call on b got {other:?}"),
        }
        match a {
            Ok(Answer::One(r)) => assert_eq!((r, timed_out), (result_for(b"a"), 0)),
            Err(Error::Timeout { .. }) => assert_eq!(timed_out, 1),
            other => panic!("the call on a got {other:?}"),
        }
        assert_settled(&shared);
    });
}

/// The sweep times a call out while its answer arrives late: the caller
/// sees one ending, a late answer is dropped, and the probe the timeout
/// queues is sent and answered, leaving nothing in flight.
#[test]
fn sweep_races_late_answer() {
    loom::model(|| {
        let shared = shared();
        let start = Instant::now();
        let deadline = start + BUDGET;

        let s = Arc::clone(&shared);
        let caller = thread::spawn(move || block_on(Call::new(&s, ping(), deadline, BUDGET)));
        let s = Arc::clone(&shared);
        let server = thread::spawn(move || {
            let frames = take_some(&s).expect("open");
            let mut decoded: Vec<_> = frames.iter().map(|(id, r)| (*id, Ok(answer(r)))).collect();
            hand_over(&s, &mut decoded, deadline, IDLE)
        });
        let s = Arc::clone(&shared);
        let sweeper = thread::spawn(move || {
            check_map(&s);
            let (swept, _) = sweep_expired(&s, deadline, IDLE);
            if swept.timed_out > 0 {
                queue_probe(&s, deadline + BUDGET);
            }
            swept.timed_out
        });

        let result = caller.join().expect("caller");
        let pass = server.join().expect("server");
        let timed_out = sweeper.join().expect("sweeper");
        // The server's pass delivers before it sweeps, so its own sweep
        // never times out the call it just answered.
        assert_eq!(pass.swept.timed_out, 0);
        assert_eq!(pass.answered + timed_out, 1);
        assert!(matches!(
            (&result, timed_out),
            (Ok(Answer::Response(Response::Pong)), 0) | (Err(Error::Timeout { .. }), 1)
        ));
        // The probe, unless the server already took and answered it.
        if shared.pending.lock().probing {
            let frames = take_some(&shared).expect("open");
            assert!(matches!(frames[..], [(_, Request::Ping)]), "{frames:?}");
            let mut decoded = vec![(frames[0].0, Ok(Response::Pong))];
            assert!(hand_over(&shared, &mut decoded, start, IDLE).probe_answered);
        } else {
            assert_eq!(
                pass.probe_answered,
                timed_out == 1,
                "the probe went unanswered"
            );
        }
        assert_settled(&shared);
    });
}

/// Closing races the sweep that times a call out and queues a probe: once
/// closed, no probe is added to the map or the queue.
#[test]
fn close_races_probe() {
    loom::model(|| {
        let shared = shared();
        let deadline = Instant::now() + BUDGET;
        let mut call = Box::pin(Call::new(&shared, ping(), deadline, BUDGET));
        assert!(poll_once(call.as_mut()).is_pending());

        let s = Arc::clone(&shared);
        let sweeper = thread::spawn(move || {
            check_map(&s);
            if sweep_expired(&s, deadline, IDLE).0.timed_out > 0 {
                queue_probe(&s, deadline + BUDGET);
            }
        });
        shared.close();
        sweeper.join().expect("sweeper");

        let ended = poll_once(call.as_mut());
        // Dropped before any assertion: a failed one poisons the lock the
        // drop would take.
        drop(call);
        assert!(
            matches!(
                ended,
                Poll::Ready(Err(Error::Timeout { .. } | Error::ConnectionLost))
            ),
            "the call ended with {ended:?}"
        );
        assert_settled(&shared);
    });
}
