//! CHECK2 (PROTOCOL.md §5, "CHECK2"): each check by its tag, remembered answers
//! and shedding before the check itself, which is a CHECK's check.
//!
//! ```text
//!  per check: shed by priority and backlog? (neither located nor fetched)
//!    idempotency key remembered within the window -> the remembered
//!      answer, nothing charged (another owner or check: IdempotencyKeyReused)
//!    else shed -> Shed, nothing charged; else evaluated, and remembered
//! ```

use super::{Spots, Verb};
use crate::engine::dedup::{Answered, Owner};
use crate::engine::Engine;
use crate::node::Gate;
use crate::store::Mode;
use bytes::BytesMut;
use tollgate_protocol::{
    encode_checked, CheckResult, CheckTag, EncodeError, ErrorCode, RequestId, TaggedBatch,
};

impl Engine {
    /// Evaluates a CHECK2 and appends the CHECKED answer to `dst`. A check
    /// with an idempotency key the server remembers gets its remembered answer
    /// (before any shedding: answering it costs a lookup); otherwise it is shed
    /// when `backlog` (the connection's unanswered request bytes behind this
    /// frame) is over its priority's bound, or else evaluated as CHECK would.
    pub fn answer_tagged(
        &self,
        id: RequestId,
        batch: &TaggedBatch,
        owner: Owner,
        backlog: usize,
        gate: &Gate<'_>,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        let verb = Verb::Check(Mode::Charge);
        self.in_frame(verb, gate, batch.len(), |evaluation| {
            // Checks the shedder will refuse are neither located nor fetched
            // (whether it refuses one depends on its priority and `backlog`
            // only, both fixed for the frame).
            let shed = |tag: &CheckTag| self.shedder.over(tag.priority, backlog);
            let mut spots = Spots::new();
            batch
                .iter()
                .filter(|(tag, _)| !shed(tag))
                .for_each(|(tag, pairs)| {
                    if !tag.idempotency.is_none() {
                        self.retries.prefetch(tag.idempotency);
                    }
                    evaluation.prefetch(pairs, &mut spots);
                });
            let mut at = 0;
            let results = batch.iter().map(|(tag, pairs)| {
                let shed = shed(&tag);
                let spots = if shed {
                    &[][..]
                } else {
                    at += pairs.len();
                    &spots[at - pairs.len()..at]
                };
                let fresh = || {
                    if shed {
                        self.shedder.count(tag.priority);
                        self.errors.count(ErrorCode::Shed);
                        CheckResult::Error(ErrorCode::Shed)
                    } else {
                        evaluation.check(pairs, spots)
                    }
                };
                if tag.idempotency.is_none() {
                    return fresh();
                }
                let scope = self.retries.scope(owner, pairs);
                let answered = self
                    .retries
                    .once(tag.idempotency, scope, evaluation.now, fresh);
                if answered == Answered::Refused {
                    self.errors.count(ErrorCode::IdempotencyKeyReused);
                }
                answered.result()
            });
            encode_checked(id, results, dst)
        })
    }
}
