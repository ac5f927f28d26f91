//! Sending requests through one shard: local checks against the server's
//! announced limits, the call, and the retries: after NotPrimary (nothing
//! was charged), and for CHECK2 after a lost connection (the server may
//! have charged it, and answers the same idempotency key from memory
//! instead of charging again). Free functions over the shard, so the
//! client handle, its background tasks (lease refunds) and cluster mode
//! (each part of a batch through its slot's shard) share them.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use tollgate_protocol::{CheckResult, ErrorCode, Pair, Request, Response, ServerLimits};

use crate::connection::pending::{Answer, BatchKind, Checks, Outgoing};
use crate::connection::{response_name, Connection, Deadline};
use crate::error::Error;
use crate::shard::{Shard, Wait};

/// Sends checks of `kind` to `shard` and returns their answer.
///
/// A plain function returning an async block rather than an `async fn`: an
/// `async fn` keeps its arguments twice in its state (captured, then as
/// locals), and every check's future, down to the caller's, embeds and
/// moves that state.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(crate) fn checks(
    shard: &Arc<Shard>,
    kind: BatchKind,
    checks: Checks,
    deadline: Deadline,
) -> impl Future<Output = Result<Answer, Error>> + Send + '_ {
    async move {
        let conn = match shard.ready() {
            Some(ready) => ready?,
            None => Box::pin(shard.connection(Wait::Until(deadline))).await?,
        };
        check_limits(&checks, &conn.info().limits)?;
        let retry = retry_copy(shard, kind, &checks);
        // One await of the exchange, so a call's future holds one
        // exchange's state.
        let answer = conn
            .exchange(Outgoing::Checks { kind, checks }, deadline)
            .await;
        match settle(kind, answer, retry) {
            Ok(answer) => answer,
            Err(checks) => {
                shard.invalidate(&conn);
                // Boxed: a rare path whose state need not weigh on every call.
                Box::pin(resend(shard, kind, checks, deadline)).await
            }
        }
    }
}

/// The copy of `checks` kept to send them again: a shard of several nodes
/// may need to resend after NotPrimary, and a CHECK2 after a lost
/// connection. Cheap (`Bytes` and rule names are reference counted).
pub(crate) fn retry_copy(shard: &Shard, kind: BatchKind, checks: &Checks) -> Option<Checks> {
    (shard.node_count() > 1 || kind == BatchKind::Check2).then(|| checks.clone())
}

/// What an exchange's answer comes to: `Ok` the answer, or `Err` the
/// checks (from `retry`, see [`retry_copy`]) to send once more on a new
/// connection, the one they went through being invalidated by the caller:
/// after NotPrimary (nothing was charged), or a CHECK2 whose connection
/// was lost (the same idempotency key on a new connection: charged at most
/// once).
pub(crate) fn settle(
    kind: BatchKind,
    answer: Result<Answer, Error>,
    retry: Option<Checks>,
) -> Result<Result<Answer, Error>, Checks> {
    // Nothing to resend (one node, no CHECK2): the answer as it is, without
    // moving it through a tuple (the common path, once per check).
    let Some(retry) = retry else {
        return Ok(answer);
    };
    match (answer, Some(retry)) {
        (Err(Error::ConnectionLost | Error::Io(_)), Some(checks)) if kind == BatchKind::Check2 => {
            tracing::info!("connection lost under a CHECK2; sending it again, same key");
            Err(checks)
        }
        (
            Ok(Answer::Response(Response::Error {
                code: ErrorCode::NotPrimary,
                message,
            })),
            Some(checks),
        ) => {
            tracing::info!(%message, "node is not primary; looking for the primary again");
            Err(checks)
        }
        (other, _) => Ok(other),
    }
}

/// Sends checks once more, on a new connection, within the same deadline.
pub(crate) async fn resend(
    shard: &Arc<Shard>,
    kind: BatchKind,
    checks: Checks,
    deadline: Deadline,
) -> Result<Answer, Error> {
    let conn = shard.connection(Wait::Until(deadline)).await?;
    conn.exchange(Outgoing::Checks { kind, checks }, deadline)
        .await
}

/// Sends a request only a primary serves (RESET, RELEASE, ...). For a shard
/// of several nodes an ERROR NotPrimary (nothing was applied) drops the
/// connection and sends the request once more, within the same deadline.
pub(crate) async fn primary(
    shard: &Arc<Shard>,
    conn: Arc<Connection>,
    request: Request,
    deadline: Deadline,
) -> Result<Response, Error> {
    if shard.node_count() < 2 {
        return conn.call(request, deadline).await;
    }
    let answer = conn.call(request.clone(), deadline).await?;
    let Response::Error {
        code: ErrorCode::NotPrimary,
        message,
    } = &answer
    else {
        return Ok(answer);
    };
    tracing::info!(%message, "node is not primary; looking for the primary again");
    shard.invalidate(&conn);
    let conn = shard.connection(Wait::Until(deadline)).await?;
    conn.call(request, deadline).await
}

/// The results of a batch answer, or the error it stands for.
pub(crate) fn results(answer: Answer, name: &'static str) -> Result<Vec<CheckResult>, Error> {
    match answer {
        Answer::Results(results) => Ok(results),
        Answer::One(result) => Ok(vec![result]),
        Answer::Response(Response::Error { code, message }) => Err(Error::Server { code, message }),
        Answer::Response(other) => Err(Error::UnexpectedResponse {
            request: name,
            got: response_name(&other),
        }),
    }
}

/// The result of a one-check call's answer, or why there is none.
pub(crate) fn one_result(
    kind: BatchKind,
    answer: Result<Answer, Error>,
) -> Result<CheckResult, Error> {
    match answer? {
        Answer::One(result) => Ok(result),
        Answer::Results(mut r) if r.len() == 1 => Ok(r.remove(0)),
        other => results(other, kind.name()).and_then(|r| {
            Err(Error::ResultCount {
                expected: 1,
                got: r.len(),
            })
        }),
    }
}

/// Refuses locally what the server would refuse, using the limits it
/// announced: no round trip for a request that cannot succeed.
pub(crate) fn check_limits(checks: &Checks, limits: &ServerLimits) -> Result<(), Error> {
    match checks {
        Checks::One(p) => check_key(&p.key, limits),
        Checks::Group(g) | Checks::Tagged(_, g) => check_group(0, g, limits),
        Checks::Batch(batch) => {
            if batch.len() > usize::from(limits.max_batch) {
                return Err(Error::BatchTooLarge {
                    checks: batch.len(),
                    max: limits.max_batch,
                });
            }
            batch
                .iter()
                .enumerate()
                .try_for_each(|(i, c)| check_group(i, c, limits))
        }
    }
}

/// Check `index`'s pairs within the server's group and key limits.
pub(crate) fn check_group(
    index: usize,
    pairs: &[Pair],
    limits: &ServerLimits,
) -> Result<(), Error> {
    if pairs.is_empty() {
        return Err(Error::EmptyGroup { check: index });
    }
    if pairs.len() > usize::from(limits.max_group) {
        return Err(Error::GroupTooLarge {
            check: index,
            pairs: pairs.len(),
            max: limits.max_group,
        });
    }
    pairs.iter().try_for_each(|p| check_key(&p.key, limits))
}

pub(crate) fn check_key(key: &[u8], limits: &ServerLimits) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::EmptyKey);
    }
    if key.len() > usize::from(limits.max_key_len) {
        return Err(Error::KeyTooLong {
            len: key.len(),
            max: limits.max_key_len,
        });
    }
    Ok(())
}

/// Keys (RESET) or leases (RELEASE) within the server's batch and key limits.
pub(crate) fn check_keys<'a>(
    keys: impl ExactSizeIterator<Item = &'a Bytes>,
    limits: &ServerLimits,
) -> Result<(), Error> {
    if keys.len() > usize::from(limits.max_batch) {
        return Err(Error::BatchTooLarge {
            checks: keys.len(),
            max: limits.max_batch,
        });
    }
    keys.into_iter().try_for_each(|k| check_key(k, limits))
}

#[cfg(test)]
mod tests {
    use tollgate_protocol::units::Rate;
    use tollgate_protocol::{CheckBatch, Limit};

    use super::*;

    fn pair(key: &'static [u8]) -> Pair {
        Pair::inline(
            Bytes::from_static(key),
            Limit::token_bucket(Rate::per_second(5), 10),
            1,
        )
    }

    fn limits() -> ServerLimits {
        ServerLimits {
            max_frame: 4096,
            max_batch: 2,
            max_group: 2,
            max_key_len: 4,
        }
    }

    #[test]
    fn local_limits_carry_the_numbers() {
        let mut batch = CheckBatch::default();
        for _ in 0..3 {
            batch.push(pair(b"k"));
        }
        assert!(matches!(
            check_limits(&Checks::Batch(batch), &limits()),
            Err(Error::BatchTooLarge { checks: 3, max: 2 })
        ));
        let mut batch = CheckBatch::default();
        batch.push(pair(b"k"));
        batch.push_check([pair(b"a"), pair(b"b"), pair(b"c")]);
        assert!(matches!(
            check_limits(&Checks::Batch(batch), &limits()),
            Err(Error::GroupTooLarge {
                check: 1,
                pairs: 3,
                max: 2
            })
        ));
        assert!(matches!(
            check_limits(&Checks::One(pair(b"toolong")), &limits()),
            Err(Error::KeyTooLong { len: 7, max: 4 })
        ));
        assert!(matches!(
            check_limits(&Checks::Group(Vec::new()), &limits()),
            Err(Error::EmptyGroup { check: 0 })
        ));
        assert!(matches!(
            check_limits(&Checks::One(pair(b"")), &limits()),
            Err(Error::EmptyKey)
        ));
        assert!(check_limits(&Checks::Group(vec![pair(b"a"), pair(b"four")]), &limits()).is_ok());
    }
}
