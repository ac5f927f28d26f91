//! The requests one connection keeps in flight: a fixed set of slots, each
//! holding one request's future, polled by the connection's task only when
//! its own waker fired.
//!
//! What `FuturesUnordered` does, minus its allocation per future: it boxes
//! each pushed future in a task of its own (with batch 1 at 50 x 16, a
//! `malloc` and a `free` of a future of several hundred bytes per check).
//! Here a slot's box is allocated once and a new future is written into it
//! when the previous one is done.
//!
//! Invariants:
//! - a slot is free (`None`) or holds a future not yet finished;
//! - a slot's bit in `ready` is set when its waker fires; a pushed slot's
//!   bit goes in `pushed`, the task's own plain word (so a new future is
//!   polled once even before anything woke it, with no atomic operation on
//!   a word the wakers' threads write);
//! - `next` polls only the slots whose bit it took, so a wakeup costs the
//!   futures it concerns, not the whole pipeline;
//! - `next` registers the task's waker only when it found no bit left,
//!   then looks once more before returning `Pending` (a poll that finds
//!   bits, most of them under load, costs no registration);
//! - a waker wakes the task only when it finds its word empty: a non-empty
//!   word was set since the task last emptied it by a waker that woke the
//!   task then. `next` returns `Pending` only after finding every word
//!   (and `pushed`) empty since it registered, so no bit is left without a
//!   wake coming.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// Which slots were woken, and the task to wake when one is.
struct Ready {
    bits: Vec<AtomicU64>,
    task: AtomicWaker,
}

impl Ready {
    /// Sets `slot`'s bit; true when its word was empty, i.e. when no
    /// earlier bit of the word is still waiting to be taken.
    fn set(&self, slot: usize) -> bool {
        // Release pairs with the Acquire swap in `next`: what the waking
        // side wrote before waking is seen by the poll it causes.
        self.bits[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel) == 0
    }
}

/// The waker of one slot.
struct SlotWaker {
    slot: usize,
    ready: Arc<Ready>,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Only the first bit of a word wakes the task: a later one finds
        // the word non-empty, so the wake of its first bit (or the task
        // itself, for a bit set by `push`) is still to take it. With 16
        // answers per read this saves 15 task wakes of 16.
        if self.ready.set(self.slot) {
            self.ready.task.wake();
        }
    }
}

/// Up to `capacity` futures in flight, answered in any order.
pub struct Pipeline<F> {
    slots: Vec<Pin<Box<Option<F>>>>,
    wakers: Vec<Waker>,
    ready: Arc<Ready>,
    free: Vec<usize>,
    /// Slots pushed and not polled yet (only the task touches these).
    pushed: Vec<u64>,
    /// Bits taken from `ready` and not polled yet, one word at a time.
    taken: (usize, u64),
}

impl<F: Future> Pipeline<F> {
    pub fn new(capacity: usize) -> Self {
        let ready = Arc::new(Ready {
            bits: (0..capacity.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            task: AtomicWaker::new(),
        });
        let wakers = (0..capacity)
            .map(|slot| {
                Waker::from(Arc::new(SlotWaker {
                    slot,
                    ready: Arc::clone(&ready),
                }))
            })
            .collect();
        Self {
            slots: (0..capacity).map(|_| Box::pin(None)).collect(),
            wakers,
            ready,
            free: (0..capacity).rev().collect(),
            pushed: vec![0; capacity.div_ceil(64)],
            taken: (0, 0),
        }
    }

    /// Futures in flight.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    /// Adds a future; it is first polled by the next [`next`](Self::next).
    ///
    /// # Panics
    /// When all `capacity` slots are taken.
    pub fn push(&mut self, future: F) {
        let slot = self.free.pop().expect("a free pipeline slot");
        self.slots[slot].set(Some(future));
        // Taken by the next `next`, which the task itself calls.
        self.pushed[slot / 64] |= 1 << (slot % 64);
    }

    /// The output of the next future to finish; `None` when none is in
    /// flight.
    pub async fn next(&mut self) -> Option<F::Output> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        if self.is_empty() {
            return Poll::Ready(None);
        }
        // Bits already there (most polls under load: a read answers many
        // slots): no registration needed, the task is running anyway.
        if let Some(output) = self.scan() {
            return Poll::Ready(Some(output));
        }
        // None left: registered, then read once more, so a wake after the
        // read finds this task's waker.
        self.ready.task.register(cx.waker());
        match self.scan() {
            Some(output) => Poll::Ready(Some(output)),
            None => Poll::Pending,
        }
    }

    /// Polls the slots whose bits are set until one finishes; `None` once
    /// a whole round of words was found empty, so no bit is left taken and
    /// unpolled.
    fn scan(&mut self) -> Option<F::Output> {
        let words = self.ready.bits.len();
        let mut empty = 0;
        loop {
            let (word, mut bits) = self.taken;
            while bits != 0 {
                let slot = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.taken.1 = bits;
                let mut slot_cx = Context::from_waker(&self.wakers[slot]);
                let Some(future) = self.slots[slot].as_mut().as_pin_mut() else {
                    continue; // a late wake of a slot already answered
                };
                if let Poll::Ready(output) = future.poll(&mut slot_cx) {
                    self.slots[slot].set(None);
                    self.free.push(slot);
                    return Some(output);
                }
            }
            if empty == words {
                return None;
            }
            let next = (word + 1) % words;
            let bits = self.ready.bits[next].swap(0, Ordering::Acquire)
                | std::mem::take(&mut self.pushed[next]);
            empty = if bits == 0 { empty + 1 } else { 0 };
            self.taken = (next, bits);
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    /// One future type for every push.
    async fn answer(i: usize, rx: oneshot::Receiver<u32>) -> (usize, u32) {
        (i, rx.await.unwrap())
    }

    /// Futures answer in the order they are released, slots are reused,
    /// and a future woken again after its slot was refilled is not mixed
    /// up with the new one.
    #[tokio::test]
    async fn answers_in_release_order_and_reuses_slots() {
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..70).map(|_| oneshot::channel::<u32>()).unzip();
        let mut receivers = receivers.into_iter().enumerate();
        let mut pipeline = Pipeline::new(66);
        for _ in 0..66 {
            let (i, rx) = receivers.next().unwrap();
            pipeline.push(answer(i, rx));
        }
        assert_eq!(pipeline.len(), 66);
        let mut senders: Vec<_> = senders.into_iter().map(Some).collect();
        // Release 65, then 3: they come back in that order.
        for i in [65, 3] {
            senders[i].take().unwrap().send(i as u32 * 10).unwrap();
            assert_eq!(pipeline.next().await, Some((i, i as u32 * 10)));
        }
        // Refill the freed slots, release the new ones and an old one.
        for _ in 0..2 {
            let (i, rx) = receivers.next().unwrap();
            pipeline.push(answer(i, rx));
        }
        for i in [67, 0, 66] {
            senders[i].take().unwrap().send(i as u32).unwrap();
        }
        let mut got = vec![];
        for _ in 0..3 {
            got.push(pipeline.next().await.unwrap().0);
        }
        got.sort_unstable();
        assert_eq!(got, vec![0, 66, 67]);
        assert_eq!(pipeline.len(), 63);
        // Dropping the rest drops their futures (and the receivers).
        drop(pipeline);
        assert!(senders[1].take().unwrap().send(1).is_err());
    }
}
