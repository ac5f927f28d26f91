//! A batch in cluster mode: its checks split per shard (one CHECK each,
//! sent at once on this task), the answers put back in the batch's order;
//! the checks that may be resent (MOVED, TryAgain, an unreachable shard)
//! go again, by the map refreshed for them, within the call's deadline.

use std::sync::Arc;

use tollgate_protocol::{CheckBatch, CheckResult, ErrorCode, Moved, Pair};

use super::map::SlotMap;
use super::{classify, group_slot, Attempts, Cluster, Retry, Todo};
use crate::calls;
use crate::connection::pending::{Answer, BatchKind, Checks};
use crate::connection::Deadline;
use crate::error::Error;
use crate::shard::Shard;

impl Cluster {
    /// A batch: split per shard, sent at once, merged in order; the checks
    /// that may be resent are, by the map refreshed for them.
    pub(super) async fn batch(
        &self,
        kind: BatchKind,
        batch: CheckBatch,
        deadline: Deadline,
    ) -> Result<Vec<CheckResult>, Error> {
        let checks: Vec<&[Pair]> = batch.iter().collect();
        let mut results: Vec<Option<CheckResult>> = vec![None; checks.len()];
        let mut todo: Vec<Todo> = Vec::with_capacity(checks.len());
        for (index, check) in checks.iter().enumerate() {
            match group_slot(check) {
                Some(slot) => todo.push((index, slot)),
                None => results[index] = Some(CheckResult::Error(ErrorCode::CrossSlot)),
            }
        }
        let mut attempts = Attempts::default();
        while !todo.is_empty() {
            let (generation, map) = self.current_map(deadline).await;
            let mut round = Round::default();
            let parts = round.split(&todo, &map);
            let sent = parts.iter().map(|(shard, members)| {
                let mut part = CheckBatch::default();
                for &(index, _) in members {
                    part.push_check(checks[index].iter().cloned());
                }
                calls::checks(shard, kind, Checks::Batch(part), deadline)
            });
            let answers = join_all(sent).await;
            for ((_, members), answer) in parts.iter().zip(answers) {
                if let Some(done) = round.merge(members, answer, &mut results) {
                    return done.and_then(|a| calls::results(a, kind.name()));
                }
            }
            let (again, Some(why)) = round.resend() else {
                break;
            };
            if let Err(done) = self
                .prepare_retry(why, generation, &mut attempts, deadline)
                .await
            {
                // Checks answered TryAgain keep that answer; a whole-request
                // failure fails the call.
                if results.iter().all(Option::is_some) {
                    break;
                }
                return done.and_then(|a| calls::results(a, kind.name()));
            }
            todo = again;
        }
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or(CheckResult::Error(ErrorCode::TryAgain)))
            .collect())
    }
}

/// One round of a batch: what it leaves to send again, and why.
#[derive(Default)]
struct Round {
    again: Vec<Todo>,
    moved: Option<Moved>,
    failure: Option<Result<Answer, Error>>,
    try_again: bool,
}

impl Round {
    /// The checks to send, grouped by the shard that owns their slot in
    /// `map`; a slot without an owner is kept to send again.
    fn split(&mut self, todo: &[Todo], map: &SlotMap) -> Vec<(Arc<Shard>, Vec<Todo>)> {
        let mut parts: Vec<(Arc<Shard>, Vec<Todo>)> = Vec::new();
        for &(index, slot) in todo {
            match map.shard_of(slot) {
                Ok((_, shard)) => match parts.iter_mut().find(|(s, _)| Arc::ptr_eq(s, shard)) {
                    Some((_, members)) => members.push((index, slot)),
                    None => parts.push((Arc::clone(shard), vec![(index, slot)])),
                },
                Err(e) => {
                    self.again.push((index, slot));
                    self.failure.get_or_insert(Err(e));
                }
            }
        }
        parts
    }

    /// Puts one shard's answer to its `members` into `results`, keeping
    /// what may be resent; `Some` ends the call with that answer (one the
    /// batch cannot be made of, or an error no resend helps).
    fn merge(
        &mut self,
        members: &[Todo],
        answer: Result<Answer, Error>,
        results: &mut [Option<CheckResult>],
    ) -> Option<Result<Answer, Error>> {
        match classify(answer) {
            Ok(Ok(Answer::Results(got))) if got.len() == members.len() => {
                for (&(index, slot), result) in members.iter().zip(got) {
                    if result == CheckResult::Error(ErrorCode::TryAgain) {
                        self.again.push((index, slot));
                        self.try_again = true;
                    }
                    results[index] = Some(result);
                }
                None
            }
            Ok(done) => Some(done),
            Err(why) => {
                self.again.extend(members.iter().copied());
                match why {
                    Retry::Moved(m) => {
                        self.moved.get_or_insert(m);
                    }
                    Retry::Later(answer) => {
                        self.failure.get_or_insert(answer);
                    }
                }
                None
            }
        }
    }

    /// The checks to send again (in the batch's order) and why: a MOVED
    /// first (the map is stale), then a whole-request failure, then checks
    /// answered TryAgain (which keep that answer if the call ends). No
    /// reason: nothing to send again.
    fn resend(self) -> (Vec<Todo>, Option<Retry>) {
        let why = match (self.moved, self.failure) {
            (Some(m), _) => Some(Retry::Moved(m)),
            (None, Some(answer)) => Some(Retry::Later(answer)),
            (None, None) if self.try_again => Some(Retry::Later(Ok(Answer::One(
                CheckResult::Error(ErrorCode::TryAgain),
            )))),
            (None, None) => None,
        };
        let mut again = self.again;
        again.sort_unstable();
        (again, why)
    }
}

/// Runs the futures at once on this task; their outputs in order.
async fn join_all<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.map(|f| Some(Box::pin(f))).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (slot, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if let Some(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(o) => {
                        *output = Some(o);
                        *slot = None;
                    }
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn join_all_keeps_the_order() {
        let delays = [30u64, 0, 10];
        let out = join_all(delays.iter().map(|&ms| async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            ms
        }))
        .await;
        assert_eq!(out, vec![30, 0, 10]);
    }
}
