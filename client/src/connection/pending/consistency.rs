//! The slot map's invariants as one checker, for tests and the loom models
//! (`connection/loom_models.rs`): they call it after every interleaving,
//! so a broken rule in [`Pending`] fails there, not in production.

use std::collections::HashSet;

use super::{Pending, SlotState, INDEX_MASK};

impl Pending {
    /// Panics, naming the rule, when the map breaks one of its invariants:
    /// - each slot's id addresses its own index and is never 0 (HELLO's);
    /// - the free list holds distinct indexes of free slots only (a slot
    ///   freed twice would be handed to two calls), and, while open, every
    ///   free slot (none leaks);
    /// - `waiting` counts the waiting slots, `probing` the probe's;
    /// - the queue never holds an id twice (a request written twice);
    /// - while open, the sweep is armed no later than any waiting deadline
    ///   (else a call would outlive its deadline);
    /// - once closed: nothing queued, nothing waiting, no frame or probe.
    pub(crate) fn assert_consistent(&self) {
        let mut free = HashSet::new();
        for &index in &self.free {
            assert!(free.insert(index), "slot {index} is on the free list twice");
            let slot = self.slots.get(index as usize).unwrap_or_else(|| {
                panic!("free index {index} past the {} slots", self.slots.len())
            });
            assert!(
                matches!(slot.state, SlotState::Free),
                "slot {index} is on the free list but {:?}",
                slot.state
            );
        }
        let (mut waiting, mut probes, mut busy) = (0, 0, 0);
        for (index, slot) in self.slots.iter().enumerate() {
            assert_ne!(slot.id, 0, "slot {index} has HELLO's id");
            assert_eq!(
                (slot.id & INDEX_MASK) as usize,
                index + 1,
                "slot {index} has id {:#x}, another index's",
                slot.id
            );
            match &slot.state {
                SlotState::Free => assert!(
                    self.closed || free.contains(&(index as u32)),
                    "slot {index} is free but not on the free list (leaked)"
                ),
                SlotState::Waiting { deadline, .. } => {
                    waiting += 1;
                    assert!(
                        self.closed || self.armed <= *deadline,
                        "slot {index} is due before the sweep is armed"
                    );
                }
                SlotState::Probe { .. } => probes += 1,
                SlotState::Merged { .. } => busy += 1,
                SlotState::Done(_) => {}
            }
        }
        assert_eq!(
            self.waiting, waiting,
            "`waiting` miscounts the waiting slots"
        );
        assert!(probes <= 1, "{probes} probes in flight");
        assert_eq!(
            self.probing,
            probes == 1,
            "`probing` disagrees with the slots"
        );
        let mut queued = HashSet::new();
        for (id, _) in &self.queue {
            assert!(queued.insert(*id), "request {id:#x} is queued twice");
        }
        if self.closed {
            assert!(
                self.queue.is_empty(),
                "closed with {} queued",
                self.queue.len()
            );
            assert_eq!(waiting + probes + busy, 0, "closed with slots in flight");
        }
    }

    /// Slots not free: calls waiting or not yet taken, merged frames, the
    /// probe.
    pub(crate) fn slots_in_use(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s.state, SlotState::Free))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use std::task::Waker;
    use std::time::Duration;

    use tokio::time::Instant;
    use tollgate_protocol::{Request, Response};

    use super::super::{Answer, Outgoing, Pending, Shape, Wakers, INDEX_MASK};
    use crate::error::Error;

    const BUDGET: Duration = Duration::from_millis(5);

    /// A waiting call with its request queued, as `Shared::submit` leaves it.
    fn submit(p: &mut Pending, deadline: Instant) -> u32 {
        let id = p
            .wait(
                Waker::noop().clone(),
                deadline,
                BUDGET,
                Shape::Response,
                "PING",
            )
            .expect("room");
        p.queue.push((id, Outgoing::Request(Request::Ping)));
        p.armed = p.armed.min(deadline);
        id
    }

    /// Each step of a slot's life keeps the map consistent: answered,
    /// timed out, given up, reused with a new id (the old answer then finds
    /// nothing), and closed.
    #[test]
    fn every_step_keeps_the_map_consistent() {
        let now = Instant::now();
        let mut p = Pending::new(now + Duration::from_secs(60));
        let mut wakers = Wakers::new();

        let answered = submit(&mut p, now + BUDGET);
        let timed_out = submit(&mut p, now + BUDGET);
        p.queue.clear();
        p.assert_consistent();
        assert_eq!(
            p.deliver(answered, Ok(Response::Pong), &mut wakers),
            (1, false)
        );
        let swept = p.sweep(now + BUDGET, Duration::from_secs(60), &mut wakers);
        assert_eq!(swept.timed_out, 1);
        p.assert_consistent();
        assert!(matches!(
            p.poll_answer(answered, Waker::noop()),
            std::task::Poll::Ready(Ok(Answer::Response(Response::Pong)))
        ));
        assert!(matches!(
            p.poll_answer(timed_out, Waker::noop()),
            std::task::Poll::Ready(Err(Error::Timeout { .. }))
        ));
        p.assert_consistent();
        assert_eq!(p.slots_in_use(), 0);

        let gave_up = submit(&mut p, now + BUDGET);
        p.release(gave_up);
        p.assert_consistent();
        let reused = submit(&mut p, now + BUDGET);
        assert_eq!(
            reused & INDEX_MASK,
            gave_up & INDEX_MASK,
            "the freed index is reused"
        );
        assert_ne!(reused, gave_up, "under a new id");
        assert_eq!(
            p.deliver(gave_up, Ok(Response::Pong), &mut wakers),
            (0, false)
        );
        p.assert_consistent();

        p.close(&mut wakers);
        p.assert_consistent();
        assert!(matches!(
            p.poll_answer(reused, Waker::noop()),
            std::task::Poll::Ready(Err(Error::ConnectionLost))
        ));
        p.assert_consistent();
        assert_eq!(p.slots_in_use(), 0);
    }

    /// Regression: the driver queues its probe after a sweep, under a
    /// second lock; a close in between (the writer failing, `shut_down`)
    /// must not see a probe slot and a queued PING appear on a closed map.
    #[test]
    fn no_probe_after_close() {
        let now = Instant::now();
        let mut p = Pending::new(now);
        p.close(&mut Wakers::new());
        assert!(!p.probe(now + BUDGET), "a probe queued on a closed map");
        assert!(!p.probing);
        p.assert_consistent();
    }

    /// The checker catches a slot freed twice: two calls would share it.
    #[test]
    #[should_panic(expected = "on the free list twice")]
    fn checker_catches_a_double_free() {
        let now = Instant::now();
        let mut p = Pending::new(now + BUDGET);
        let id = submit(&mut p, now + BUDGET);
        p.queue.clear();
        p.release(id);
        p.free.push((id & INDEX_MASK) - 1);
        p.assert_consistent();
    }
}
