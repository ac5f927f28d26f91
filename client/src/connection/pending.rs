//! The calls of one connection: slots, the outgoing queue, and the future a
//! call waits on.
//!
//! One mutex guards everything here. A call takes it twice (submit, then
//! take its answer); the writer once per pass over the queue; the driver
//! once per socket read (all answers of the read) and once per deadline
//! sweep. Wakers are collected under the lock and woken after it.
//!
//! Invariants:
//! - a slot is addressed by its request id (`generation << 20 | index + 1`,
//!   never 0, the HELLO id); an id whose slot was freed or reused no longer
//!   matches, so a late answer or a stale queue entry is simply dropped;
//! - a waiting slot ends exactly once: answered by the driver, timed out by
//!   the sweep, failed when the connection closes, or freed by its dropped
//!   call; only then can its index be reused;
//! - once `closed`, no slot is added (nor a probe): a call fails at once
//!   with `ConnectionLost` instead of at its deadline;
//! - no timer per call: each waiting slot records its deadline and the
//!   driver sweeps them, armed at the earliest (`armed`); a call with a
//!   deadline before `armed` wakes the driver to re-arm.
//!
//! `Pending::assert_consistent` (pending/consistency.rs) checks these; the
//! loom models (`loom_models.rs`) call it under every interleaving of
//! calls, writer, driver and close.

use std::task::{Poll, Waker};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;
use tollgate_protocol::{CheckResult, Request, RequestId, Response};

use crate::error::Error;

mod checks;
#[cfg(test)]
mod consistency;

pub(crate) use checks::{BatchKind, Checks};

const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Most slots (waiting calls, merged frames and probes) per connection.
pub(crate) const MAX_SLOTS: usize = INDEX_MASK as usize - 1;

/// What a call sends.
#[derive(Debug)]
pub(crate) enum Outgoing {
    Checks { kind: BatchKind, checks: Checks },
    Request(Request),
}

/// What a call gets back.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The result of a one-check call.
    One(CheckResult),
    /// The results of a batch call, in order.
    Results(Vec<CheckResult>),
    /// Any other answer, and an ERROR frame answering a check call.
    Response(Response),
}

/// The answer a slot expects, to cut a CHECKED into.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    One,
    Results(usize),
    Response,
}

impl Shape {
    fn checks(self) -> usize {
        match self {
            Self::One => 1,
            Self::Results(n) => n,
            Self::Response => 0,
        }
    }

    /// The answer of a slot of this shape, from its own results.
    fn answer(self, results: Vec<CheckResult>) -> Result<Answer, Error> {
        match self {
            Self::One if results.len() == 1 => Ok(Answer::One(results[0])),
            Self::Results(n) if results.len() == n => Ok(Answer::Results(results)),
            Self::Response => Ok(Answer::Response(Response::Checked(results))),
            _ => Err(Error::ResultCount {
                expected: self.checks(),
                got: results.len(),
            }),
        }
    }
}

/// A member of a merged CHECK frame: its slot and how many checks it put in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member {
    pub id: RequestId,
    pub shape: Shape,
}

#[derive(Debug)]
enum SlotState {
    Free,
    /// A call waits (its request queued or sent).
    Waiting {
        waker: Option<Waker>,
        deadline: Instant,
        budget: Duration,
        shape: Shape,
        name: &'static str,
    },
    /// Answered (or failed); the call has not taken it yet.
    Done(Result<Answer, Error>),
    /// A merged CHECK frame: its answer is cut among the members. A
    /// vector (one allocation per frame, not per call) rather than an
    /// inline array: every slot is as large as its largest state, and
    /// slots are written and moved several times per call.
    Merged {
        members: Vec<Member>,
        name: &'static str,
    },
    /// A PING the driver sent to a suspect connection.
    Probe {
        deadline: Instant,
    },
}

#[derive(Debug)]
struct Slot {
    id: RequestId,
    state: SlotState,
}

/// Everything behind the connection's mutex.
pub(crate) struct Pending {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Requests for the writer, in submission order.
    pub(crate) queue: Vec<(RequestId, Outgoing)>,
    /// The writer waits for `writer_wake`; the next submit wakes it.
    pub(crate) writer_parked: bool,
    /// When the driver next sweeps deadlines.
    pub(crate) armed: Instant,
    pub(crate) closed: bool,
    /// Calls waiting for an answer.
    waiting: usize,
    /// A probe is in flight.
    pub(crate) probing: bool,
}

/// Wakers to wake once the lock is released.
pub(crate) type Wakers = SmallVec<[Waker; 16]>;

/// What a sweep found.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Swept {
    pub timed_out: u32,
    pub probe_failed: bool,
}

impl Pending {
    pub(crate) fn new(armed: Instant) -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            queue: Vec::new(),
            writer_parked: false,
            armed,
            closed: false,
            waiting: 0,
            probing: false,
        }
    }

    fn alloc(&mut self, state: SlotState) -> Option<RequestId> {
        let index = match self.free.pop() {
            Some(i) => i as usize,
            None if self.slots.len() < MAX_SLOTS => {
                self.slots.push(Slot {
                    id: 0,
                    state: SlotState::Free,
                });
                self.slots.len() - 1
            }
            None => return None,
        };
        let slot = &mut self.slots[index];
        let generation = (slot.id >> INDEX_BITS).wrapping_add(1);
        slot.id = (generation << INDEX_BITS) | (index as u32 + 1);
        slot.state = state;
        Some(slot.id)
    }

    fn slot_mut(&mut self, id: RequestId) -> Option<&mut Slot> {
        let index = (id & INDEX_MASK).checked_sub(1)? as usize;
        self.slots.get_mut(index).filter(|s| s.id == id)
    }

    /// Frees the slot of a call that gave up (its future was dropped).
    pub(crate) fn release(&mut self, id: RequestId) {
        let Some(slot) = self.slot_mut(id) else {
            return;
        };
        let was_waiting = matches!(slot.state, SlotState::Waiting { .. });
        slot.state = SlotState::Free;
        if was_waiting {
            self.waiting -= 1;
        }
        self.free.push((id & INDEX_MASK) - 1);
    }

    /// A waiting slot for a new call due by `deadline`; `None` when full.
    pub(crate) fn wait(
        &mut self,
        waker: Waker,
        deadline: Instant,
        budget: Duration,
        shape: Shape,
        name: &'static str,
    ) -> Option<RequestId> {
        let id = self.alloc(SlotState::Waiting {
            waker: Some(waker),
            deadline,
            budget,
            shape,
            name,
        })?;
        self.waiting += 1;
        Some(id)
    }

    /// The answer of call `id` when it is done (freeing its slot); else
    /// keeps `waker` to wake it.
    pub(crate) fn poll_answer(
        &mut self,
        id: RequestId,
        waker: &Waker,
    ) -> Poll<Result<Answer, Error>> {
        let Some(slot) = self.slot_mut(id) else {
            return Poll::Ready(Err(Error::ConnectionLost));
        };
        match &mut slot.state {
            SlotState::Waiting { waker: kept, .. } => {
                if !kept.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    *kept = Some(waker.clone());
                }
                Poll::Pending
            }
            SlotState::Done(_) => {
                let SlotState::Done(result) = std::mem::replace(&mut slot.state, SlotState::Free)
                else {
                    return Poll::Ready(Err(Error::ConnectionLost));
                };
                self.free.push((id & INDEX_MASK) - 1);
                Poll::Ready(result)
            }
            _ => Poll::Ready(Err(Error::ConnectionLost)),
        }
    }

    /// Whether a queued request still has a caller (or is a probe).
    pub(crate) fn wanted(&mut self, id: RequestId) -> bool {
        self.slot_mut(id)
            .is_some_and(|s| matches!(s.state, SlotState::Waiting { .. } | SlotState::Probe { .. }))
    }

    /// A slot for a merged frame of `members`.
    pub(crate) fn merged(&mut self, members: Vec<Member>, name: &'static str) -> Option<RequestId> {
        self.alloc(SlotState::Merged { members, name })
    }

    /// Queues a PING probe due by `deadline`; false when closed (the
    /// driver queues it after its sweep, under another lock, so a close
    /// can come in between) or full.
    pub(crate) fn probe(&mut self, deadline: Instant) -> bool {
        if self.closed {
            return false;
        }
        let Some(id) = self.alloc(SlotState::Probe { deadline }) else {
            return false;
        };
        self.queue.push((id, Outgoing::Request(Request::Ping)));
        self.probing = true;
        self.armed = self.armed.min(deadline);
        true
    }

    /// Ends the waiting slot `id` with `result`; returns its waker.
    pub(crate) fn complete(
        &mut self,
        id: RequestId,
        result: Result<Answer, Error>,
        wakers: &mut Wakers,
    ) -> bool {
        let Some(slot) = self.slot_mut(id) else {
            return false;
        };
        // Matched in place: only the waker leaves the old state, which is
        // not moved out and back (once per answered call).
        let SlotState::Waiting { waker, .. } = &mut slot.state else {
            return false;
        };
        let waker = waker.take();
        slot.state = SlotState::Done(result);
        self.waiting -= 1;
        if let Some(waker) = waker {
            wakers.push(waker);
        }
        true
    }

    /// Hands the answer of frame `id` to its call(s). Returns the number of
    /// calls answered and whether it was the probe's.
    pub(crate) fn deliver(
        &mut self,
        id: RequestId,
        answer: Result<Response, Error>,
        wakers: &mut Wakers,
    ) -> (u32, bool) {
        let Some(slot) = self.slot_mut(id) else {
            tracing::trace!(request_id = id, "answer for a call that gave up; dropped");
            return (0, false);
        };
        match &slot.state {
            SlotState::Waiting { shape, name, .. } => {
                let result = answer.and_then(|r| cut(*shape, name, r));
                (u32::from(self.complete(id, result, wakers)), false)
            }
            SlotState::Merged { .. } => {
                let SlotState::Merged { members, name } =
                    std::mem::replace(&mut slot.state, SlotState::Free)
                else {
                    return (0, false);
                };
                self.free.push((id & INDEX_MASK) - 1);
                (self.deliver_merged(&members, name, answer, wakers), false)
            }
            SlotState::Probe { .. } => {
                self.release(id);
                self.probing = false;
                (0, true)
            }
            SlotState::Free | SlotState::Done(_) => (0, false),
        }
    }

    fn deliver_merged(
        &mut self,
        members: &[Member],
        name: &'static str,
        answer: Result<Response, Error>,
        wakers: &mut Wakers,
    ) -> u32 {
        let mut answered = 0;
        match answer {
            Ok(Response::Checked(results)) => {
                let expected: usize = members.iter().map(|m| m.shape.checks()).sum();
                if results.len() != expected {
                    for m in members {
                        let e = Error::ResultCount {
                            expected,
                            got: results.len(),
                        };
                        answered += u32::from(self.complete(m.id, Err(e), wakers));
                    }
                    return answered;
                }
                let mut results = results.into_iter();
                for m in members {
                    let result = match m.shape {
                        // A one-check call takes its result as is: no vector
                        // per call (an allocation per check at batch 1).
                        Shape::One => match results.next() {
                            Some(one) => Ok(Answer::One(one)),
                            None => Shape::One.answer(Vec::new()),
                        },
                        shape => shape.answer(results.by_ref().take(shape.checks()).collect()),
                    };
                    answered += u32::from(self.complete(m.id, result, wakers));
                }
            }
            other => {
                for m in members {
                    let result = match &other {
                        Ok(r) => cut(m.shape, name, r.clone()),
                        Err(e) => Err(e.clone()),
                    };
                    answered += u32::from(self.complete(m.id, result, wakers));
                }
            }
        }
        answered
    }

    /// Times out the waiting slots past their deadline and re-arms at the
    /// earliest remaining one (or `idle_rearm` from now).
    pub(crate) fn sweep(
        &mut self,
        now: Instant,
        idle_rearm: Duration,
        wakers: &mut Wakers,
    ) -> Swept {
        let mut swept = Swept::default();
        let mut next = now + idle_rearm;
        for index in 0..self.slots.len() {
            let slot = &mut self.slots[index];
            match &mut slot.state {
                SlotState::Waiting {
                    deadline,
                    budget,
                    waker,
                    ..
                } => {
                    if *deadline <= now {
                        wakers.extend(waker.take());
                        slot.state = SlotState::Done(Err(Error::Timeout { after: *budget }));
                        self.waiting -= 1;
                        swept.timed_out += 1;
                    } else {
                        next = next.min(*deadline);
                    }
                }
                SlotState::Probe { deadline } => {
                    if *deadline <= now {
                        swept.probe_failed = true;
                    } else {
                        next = next.min(*deadline);
                    }
                }
                _ => {}
            }
        }
        self.armed = next;
        swept
    }

    /// Closes: no new slot, every waiting call fails with `ConnectionLost`.
    pub(crate) fn close(&mut self, wakers: &mut Wakers) {
        self.closed = true;
        self.queue.clear();
        for slot in &mut self.slots {
            match &mut slot.state {
                SlotState::Waiting { waker, .. } => {
                    wakers.extend(waker.take());
                    slot.state = SlotState::Done(Err(Error::ConnectionLost));
                }
                SlotState::Merged { .. } | SlotState::Probe { .. } => slot.state = SlotState::Free,
                _ => {}
            }
        }
        self.waiting = 0;
        self.probing = false;
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting
    }
}

/// Cuts a response into the answer a slot of `shape` expects.
fn cut(shape: Shape, name: &'static str, response: Response) -> Result<Answer, Error> {
    match (shape, response) {
        (Shape::Response, r) => Ok(Answer::Response(r)),
        (_, Response::Checked(results)) => shape.answer(results),
        (_, r @ (Response::Error { .. } | Response::Moved(_))) => Ok(Answer::Response(r)),
        (_, other) => Err(Error::UnexpectedResponse {
            request: name,
            got: crate::connection::response_name(&other),
        }),
    }
}
