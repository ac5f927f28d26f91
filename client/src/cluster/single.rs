//! One check (a pair or an atomic group) of one slot: the routed attempts
//! (MOVED followed, TryAgain and unreachable shards waited out), and the
//! fast path the handle's one-pair check takes in front of them.
//!
//! ```text
//!  ready(slot): generation, map guard ─ owner[slot] ─> Shard::ready ─┬─ Conn ──> the handle
//!                                                                    │  sends on it itself
//!                                                                    ├─ Failed ─> resume
//!                                                                    └─ Slow ───> single
//!  the handle's answer: a decision ─> done; anything else ─> resume
//!  resume: settle within the shard ─> classify ─> prepare_retry ─> attempts
//! ```
//!
//! Why a fast path: a check routed through `single` was one boxed future
//! (every retry state of the loop below in it) allocated, moved and polled
//! per call, on top of an `Arc` of the whole map taken and dropped per
//! call; a cluster check cost the client ~80% more CPU than a direct one
//! (issue 25). `ready` reads the map through an `arc_swap` guard (no
//! reference count touched) and hands back the slot's live connection, on
//! which the handle makes the same owned call a single-shard client makes.
//! Everything but a decision then goes through `resume`, which continues
//! exactly where `single` would be after its first attempt, so the resend
//! rules of the module header hold on both paths.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{classify, Attempts, Cluster};
use crate::calls;
use crate::connection::pending::{Answer, BatchKind, Checks};
use crate::connection::{Connection, Deadline};
use crate::error::Error;

/// Where a check of a slot can go right now, without waiting.
pub(crate) enum Ready {
    /// The slot's shard is connected and admits the call: send it on
    /// `conn`. `generation` is that of the map the call was routed by.
    Conn {
        generation: u64,
        conn: Arc<Connection>,
    },
    /// The first attempt failed before anything left (no owner, breaker
    /// open): [`Cluster::resume`] with this error decides on a resend.
    Failed { generation: u64, error: Error },
    /// No map yet, or the shard is not connected: [`Cluster::single`].
    Slow,
}

/// The first attempt of a call, made by the handle on [`Ready`]'s answer.
pub(crate) struct FirstAttempt {
    /// The generation of the map it was routed by.
    pub generation: u64,
    /// The connection it went on; none when it failed before leaving.
    pub conn: Option<Arc<Connection>>,
    pub result: Result<Answer, Error>,
}

impl Cluster {
    /// The connection a check of `slot` goes on now, if there is one. No
    /// lock, no allocation, no reference count but the connection's (the
    /// call holds it, as a single-shard client's call does).
    pub(crate) fn ready(&self, slot: u16) -> Ready {
        // Read before the map, as `current_map` does: a refresh between
        // the two reads makes the attempt look older than its map, so a
        // failure refreshes once more rather than skipping a refresh.
        let generation = self.generation.load(Ordering::Acquire);
        let map = self.map.load();
        if map.is_empty() {
            return Ready::Slow;
        }
        match map.shard_of(slot) {
            Ok((_, shard)) => match shard.ready() {
                Some(Ok(conn)) => Ready::Conn { generation, conn },
                // The breaker's refusal, once: `resume` must not ask again
                // (a half-open breaker admits a limited number of probes).
                Some(Err(error)) => Ready::Failed { generation, error },
                None => Ready::Slow,
            },
            Err(error) => Ready::Failed { generation, error },
        }
    }

    /// The rest of a call whose first attempt the handle made (see
    /// [`ready`](Self::ready)): what [`calls::checks`] does after its
    /// exchange (a resend within the shard), then what
    /// [`single`](Self::single) does after an attempt.
    pub(crate) async fn resume(
        &self,
        kind: BatchKind,
        slot: u16,
        checks: Checks,
        first: FirstAttempt,
        deadline: Deadline,
    ) -> Result<Answer, Error> {
        let FirstAttempt {
            generation,
            conn,
            result,
        } = first;
        let result = match conn {
            Some(conn) => {
                self.settle(kind, slot, &checks, &conn, result, deadline)
                    .await
            }
            None => result,
        };
        self.attempts(kind, slot, checks, Some((generation, result)), deadline)
            .await
    }

    /// [`calls::settle`] for an answer on `conn`: after NotPrimary (a
    /// shard of several nodes) or a lost CHECK2, `conn` is dropped and the
    /// checks go once more through the slot's shard.
    async fn settle(
        &self,
        kind: BatchKind,
        slot: u16,
        checks: &Checks,
        conn: &Arc<Connection>,
        first: Result<Answer, Error>,
        deadline: Deadline,
    ) -> Result<Answer, Error> {
        let map = self.map.load_full();
        let Ok((_, shard)) = map.shard_of(slot) else {
            return first;
        };
        match calls::settle(kind, first, calls::retry_copy(shard, kind, checks)) {
            Ok(result) => result,
            Err(again) => {
                // `conn` is the connection of the slot's shard unless a
                // refresh moved the slot since; invalidating by identity
                // on every shard drops it wherever it is (a no-op on the
                // others), and the resend goes to the slot's owner now.
                for other in map.shards.iter().filter_map(|s| s.shard.as_ref()) {
                    other.invalidate(conn);
                }
                calls::resend(shard, kind, again, deadline).await
            }
        }
    }

    /// One check (a pair or an atomic group) of `slot`, routed.
    pub(crate) async fn single(
        &self,
        kind: BatchKind,
        slot: u16,
        checks: Checks,
        deadline: Deadline,
    ) -> Result<Answer, Error> {
        self.attempts(kind, slot, checks, None, deadline).await
    }

    /// Attempts until one is final, within the retry budget, starting
    /// from `first` (an attempt already made, by the map of that
    /// generation) when there is one.
    async fn attempts(
        &self,
        kind: BatchKind,
        slot: u16,
        checks: Checks,
        mut first: Option<(u64, Result<Answer, Error>)>,
        deadline: Deadline,
    ) -> Result<Answer, Error> {
        let mut attempts = Attempts::default();
        loop {
            let (generation, result) = match first.take() {
                Some(made) => made,
                None => {
                    let (generation, map) = self.current_map(deadline).await;
                    let result = match map.shard_of(slot) {
                        Ok((_, shard)) => {
                            calls::checks(shard, kind, checks.clone(), deadline).await
                        }
                        Err(e) => Err(e),
                    };
                    (generation, result)
                }
            };
            let retry = match classify(result) {
                Ok(done) => return done,
                Err(retry) => retry,
            };
            if let Err(done) = self
                .prepare_retry(retry, generation, &mut attempts, deadline)
                .await
            {
                return done;
            }
        }
    }
}
