//! The future of a one-pair check or peek ([`Client::check`],
//! [`Client::peek`]): the decide pipeline (module `decide`) for one pair,
//! written as one state machine instead of nested async blocks.
//!
//! Why by hand: every `check()` at batch 1 went through four layers of
//! async state (decide, the route, the shard call, the connection call),
//! each polled in turn on every wakeup and each embedding the next, so the
//! caller's future was about 600 bytes moved by value on every check. Here
//! the common path (one shard, connected) is one struct that owns its
//! connection's call ([`OwnedCall`]); the rarer paths keep the shared code
//! behind one box, exactly as boxed as before: leasing
//! ([`Client::leased`]), cluster resends, a shard not connected yet, and a
//! resend after NotPrimary or a lost CHECK2.
//!
//! ```text
//!  Start ── invalid? ──yes──> Rejected (module `validity`)
//!    │ valid
//!  leasing on? ──yes──> Leasing ── spent / leased ──> outcome
//!    │ no                           │ not leased
//!    ├── shard connected ──> Call ──┴──> answer ── resend? ──> Routed
//!    ├── cluster, slot's shard connected ──> ClusterCall ──> answer
//!    │                             not a decision ──> Routed (resume)
//!    └── cluster otherwise / connecting ──> Routed ──> answer
//!                                  answer ──> conclude ──> outcome
//! ```
//!
//! Cluster mode takes the same owned call as one shard when the slot's
//! shard is connected (`Cluster::ready`): routing a check is then a slot
//! hash, a map read through a guard and an index, not a boxed future
//! per check (issue 25). Only an answer other than a decision goes on to
//! the boxed resend rules (`Cluster::resume`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use smallvec::smallvec;
use tokio::time::Instant;
use tollgate_protocol::slot::Slot;
use tollgate_protocol::{CheckResult, CheckTag, IdempotencyKey, Pair};

use super::resend::{self, KeptKey};
use super::route::Route;
use super::{Client, Kept};
use crate::calls::{self, one_result};
use crate::cluster::{Cluster, FirstAttempt, Ready};
use crate::connection::pending::{Answer, BatchKind, Checks, Outgoing};
use crate::connection::{Deadline, OwnedCall};
use crate::error::Error;
use crate::outcome::Outcome;
use crate::shard::Shard;

type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A one-pair check (or peek) in progress.
pub(crate) struct Single<'a> {
    client: &'a Client,
    /// CHECK or PEEK; CHECK2 once a priority made it one.
    kind: BatchKind,
    /// Kept to describe the answer and to fall back on (its key only when
    /// there is a fallback: see [`send`](Self::send)).
    pair: Pair,
    /// Set on the first poll: the check's one clock read (its deadline,
    /// its lease time, its latency).
    started: Option<Instant>,
    /// Cluster mode: the key sent, kept for the resend rules (its limit
    /// and cost stay in `pair`). Here rather than in the step, so it is
    /// written in place: see `KeptKey`.
    kept: KeptKey,
    step: Step<'a>,
}

enum Step<'a> {
    Start,
    /// The lease path (opt-in): `None` when the key is not leased.
    Leasing(Boxed<'a, Option<Outcome>>),
    /// On `shard`'s connection; `retry` is the copy kept to resend.
    Call {
        shard: &'a Arc<Shard>,
        call: OwnedCall,
        retry: Option<Checks>,
    },
    /// Cluster mode, on the connection of the slot's shard (see
    /// [`Cluster::ready`]); the checks are sent again, if the resend rules
    /// say so, from `Single::kept`, `tag` and `Single::pair`;
    /// `generation` is that of the map the call was routed by.
    ClusterCall {
        cluster: &'a Cluster,
        call: OwnedCall,
        slot: u16,
        generation: u64,
        tag: Option<CheckTag>,
    },
    /// Through the shared code (cluster resends, connecting, resend).
    Routed(Boxed<'a, Result<Answer, Error>>),
    Done,
}

impl<'a> Single<'a> {
    pub(crate) fn new(client: &'a Client, kind: BatchKind, pair: Pair) -> Self {
        Self {
            client,
            kind,
            pair,
            started: None,
            kept: KeptKey::None,
            step: Step::Start,
        }
    }

    fn deadline(&self, started: Instant) -> Deadline {
        Deadline {
            at: started + self.client.deadline,
            budget: self.client.deadline,
        }
    }

    /// Sends the pair: on the shard's connection when it is up, else
    /// through the shared code. Writes the next step in place (not
    /// returned by value: a step is a few hundred bytes, moved once per
    /// check otherwise).
    fn send(&mut self, started: Instant, tag: Option<CheckTag>) -> Result<(), Error> {
        let (client, kind) = (self.client, self.kind);
        let deadline = self.deadline(started);
        // The kept pair needs its key only for the local fallback (which
        // decides on the key when the server cannot); without one the key
        // goes with the call, and the pair keeps its limit for describing
        // the answer. No second reference to the key, taken and dropped
        // on different threads, per check.
        let pair = match client.inner.fallback {
            Some(_) => self.pair.clone(),
            None => Pair {
                key: std::mem::take(&mut self.pair.key),
                limit: self.pair.limit.clone(),
                cost: self.pair.cost,
            },
        };
        let checks = match tag {
            Some(tag) => Checks::Tagged(tag, vec![pair]),
            None => Checks::One(pair),
        };
        self.step = match &client.inner.route {
            Route::Shard(shard) => match shard.ready() {
                Some(Ok(conn)) => {
                    calls::check_limits(&checks, &conn.info().limits)?;
                    let retry = calls::retry_copy(shard, kind, &checks);
                    let call = conn.exchange_owned(Outgoing::Checks { kind, checks }, deadline);
                    Step::Call { shard, call, retry }
                }
                Some(Err(e)) => return Err(e),
                None => Step::Routed(Box::pin(calls::checks(shard, kind, checks, deadline))),
            },
            Route::Cluster(cluster) => {
                // A one-pair check's slot is its key's (a CHECK2's too: a
                // tagged check of one pair).
                let slot = Slot::of(checks_key(&checks)).get();
                match cluster.ready(slot) {
                    Ready::Conn { generation, conn } => {
                        calls::check_limits(&checks, &conn.info().limits)?;
                        // Not a clone of the checks: see `resend`.
                        self.kept.keep(checks_key(&checks));
                        let call = conn.exchange_owned(Outgoing::Checks { kind, checks }, deadline);
                        Step::ClusterCall {
                            cluster,
                            call,
                            slot,
                            generation,
                            tag,
                        }
                    }
                    Ready::Failed { generation, error } => Step::Routed(Box::pin(cluster.resume(
                        kind,
                        slot,
                        checks,
                        FirstAttempt {
                            generation,
                            conn: None,
                            result: Err(error),
                        },
                        deadline,
                    ))),
                    Ready::Slow => {
                        Step::Routed(Box::pin(cluster.single(kind, slot, checks, deadline)))
                    }
                }
            }
        };
        Ok(())
    }

    /// The outcome of the server's answer (or of its absence).
    fn finish(&mut self, answer: Result<Answer, Error>) -> Outcome {
        self.step = Step::Done;
        let pairs = std::slice::from_ref(&self.pair);
        let outcome = match answer {
            // The common answer, described at once: what `conclude` does
            // with it, without first moving it through `one_result`.
            Ok(Answer::One(CheckResult::Decision(d))) => {
                Outcome::Decided(self.client.describe(&d, pairs, None))
            }
            answer => self
                .client
                .conclude(self.kind, one_result(self.kind, answer), pairs, None),
        };
        self.observe(&outcome);
        outcome
    }

    fn observe(&self, outcome: &Outcome) {
        if let Some(started) = self.started {
            self.client.observe(outcome, started);
        }
    }
}

impl<'a> Future for Single<'a> {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        // Every field is `Unpin`: the boxes hold the only pinned state.
        let this = self.get_mut();
        loop {
            let started = *this.started.get_or_insert_with(Instant::now);
            let sent = match &mut this.step {
                Step::Start => {
                    let client = this.client;
                    client.start_background();
                    // Before anything else (module `validity`): an invalid
                    // pair is rejected whether or not the server can be
                    // reached, never leased or left to the fallback.
                    if let Err(e) = client.validate(std::slice::from_ref(&this.pair)) {
                        return Poll::Ready(this.finish(Err(e)));
                    }
                    // A priority makes a CHECK a CHECK2, under a key of its
                    // own that a resend after a lost connection reuses.
                    let tag = match (this.kind, client.priority) {
                        (BatchKind::Check, Some(priority)) => {
                            this.kind = BatchKind::Check2;
                            let key = IdempotencyKey::from_u128(fastrand::u128(1..));
                            Some(CheckTag::new(key, priority))
                        }
                        _ => None,
                    };
                    if client.inner.leases.is_some() && this.kind == BatchKind::Check {
                        let (pairs, deadline): (Kept, _) =
                            (smallvec![this.pair.clone()], this.deadline(started));
                        this.step = Step::Leasing(Box::pin(async move {
                            client.leased(&pairs, None, started, deadline).await
                        }));
                        continue;
                    }
                    this.send(started, tag)
                }
                Step::Leasing(leasing) => match ready!(leasing.as_mut().poll(cx)) {
                    Some(outcome) => {
                        this.step = Step::Done;
                        this.observe(&outcome);
                        return Poll::Ready(outcome);
                    }
                    None => this.send(started, None),
                },
                Step::Call { shard, call, retry } => {
                    let answer = ready!(call.poll_answer(cx));
                    match calls::settle(this.kind, answer, retry.take()) {
                        Ok(answer) => return Poll::Ready(this.finish(answer)),
                        Err(checks) => {
                            let shard: &'a Arc<Shard> = shard;
                            shard.invalidate(call.conn());
                            let deadline = this.deadline(started);
                            this.step = Step::Routed(Box::pin(calls::resend(
                                shard, this.kind, checks, deadline,
                            )));
                            Ok(())
                        }
                    }
                }
                Step::ClusterCall { call, .. } => {
                    let answer = ready!(call.poll_answer(cx));
                    // A decision is final; anything else may be resent
                    // (MOVED, TryAgain, NotPrimary, a lost CHECK2), by the
                    // rules `Cluster::resume` shares with the routed path.
                    if let Ok(Answer::One(CheckResult::Decision(_))) = answer {
                        return Poll::Ready(this.finish(answer));
                    }
                    let Step::ClusterCall {
                        cluster,
                        call,
                        slot,
                        generation,
                        tag,
                    } = std::mem::replace(&mut this.step, Step::Done)
                    else {
                        unreachable!("matched above");
                    };
                    let conn = Arc::clone(call.conn());
                    drop(call);
                    let deadline = this.deadline(started);
                    let key = this.kept.take().expect("kept when the call was sent");
                    this.step = Step::Routed(Box::pin(cluster.resume(
                        this.kind,
                        slot,
                        resend::checks(key, tag, &this.pair),
                        FirstAttempt {
                            generation,
                            conn: Some(conn),
                            result: answer,
                        },
                        deadline,
                    )));
                    Ok(())
                }
                Step::Routed(routed) => {
                    let answer = ready!(routed.as_mut().poll(cx));
                    return Poll::Ready(this.finish(answer));
                }
                Step::Done => panic!("a check's future polled after it completed"),
            };
            if let Err(e) = sent {
                return Poll::Ready(this.finish(Err(e)));
            }
        }
    }
}

/// The key of a one-pair check (plain or tagged); empty for any other
/// shape, which a one-pair check never has.
fn checks_key(checks: &Checks) -> &Bytes {
    static EMPTY: Bytes = Bytes::new();
    match checks {
        Checks::One(pair) => &pair.key,
        Checks::Tagged(_, pairs) | Checks::Group(pairs) => pairs.first().map_or(&EMPTY, |p| &p.key),
        Checks::Batch(_) => &EMPTY,
    }
}
