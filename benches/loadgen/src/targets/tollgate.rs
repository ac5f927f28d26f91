//! Tollgate through its own client crate, as a gateway would call it.
//!
//! One [`Client`] per connection (each holds one multiplexed TCP
//! connection). With `--batch 1` a request is one [`Client::check`], the
//! call a gateway makes per API request; concurrent calls on a connection
//! may leave in one CHECK frame (the client coalesces what is queued at the
//! same moment, with no timer). With a larger `--batch` a request is one
//! CHECK frame of `batch` independent checks, sent with
//! [`Client::check_batch`]. `--pipeline` requests are in flight at once on
//! each connection. Per-call work in the client is part of what is
//! measured: it is what a gateway pays too. The client's local fallback is
//! off, so a failure counts as an error, never as a local decision.
//!
//! `tollgate-cluster=ADDR` uses the client's cluster mode seeded with ADDR
//! (`Client::connect_cluster`): each check is routed by its key's slot, a
//! batch is split per shard. Against a single server (one shard owning
//! every slot) it measures what routing costs in the client.
//!
//! [`Options`] turn on what a feature's price is measured with: checks by
//! a named rule instead of an inline limit (`--rule`, e.g. a global rule),
//! CHECK2 with a priority and an idempotency key per check (`--priority`:
//! the server's dedup then remembers each answer), and TLS (`--tls-ca`).

use std::sync::{Arc, Mutex};

use tollgate_client::error::code_summary;
use tollgate_client::{
    Algorithm, CheckBatch, CheckResult, Client, ClientConfig, Limit, LimitRef, Outcome, Pair,
    Priority, RuleName,
};

use super::{Answer, Connection, RequestShape, Target, TargetError};
use crate::workload::{KeyPicker, KeySpace};

const NAME: &str = "tollgate";

/// How the Tollgate target's checks are sent, beyond the request shape.
#[derive(Clone, Default)]
pub struct Options {
    /// Check by this rule of the server's rules file, not the inline limit.
    pub rule: Option<RuleName>,
    /// Send each check as CHECK2 with this priority (and a fresh
    /// idempotency key), as `Client::with_priority` does.
    pub priority: Option<Priority>,
    /// Speak TLS, trusting this config's roots.
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

pub struct TollgateTarget {
    addr: String,
    /// Through the client's cluster mode.
    cluster: bool,
    shape: RequestShape,
    options: Options,
    /// Filled by the first handshake.
    info: Mutex<Option<String>>,
}

impl TollgateTarget {
    pub fn new(addr: String, shape: RequestShape, cluster: bool, options: Options) -> Self {
        Self {
            addr,
            cluster,
            shape,
            options,
            info: Mutex::new(None),
        }
    }
}

impl Target for TollgateTarget {
    type Conn = TollgateConn;

    fn name(&self) -> &'static str {
        NAME
    }

    async fn connect(&self) -> Result<TollgateConn, TargetError> {
        let config = ClientConfig {
            deadline: self.shape.deadline,
            client_name: "tollgate-bench".to_owned(),
            fallback: None,
            tls: self.options.tls.clone(),
            ..ClientConfig::default()
        };
        let connect_error = |e: tollgate_client::Error| TargetError::Connect {
            target: NAME,
            addr: self.addr.clone(),
            reason: e.to_string(),
        };
        let client = if self.cluster {
            let client = Client::connect_cluster(vec![self.addr.clone()], config)
                .await
                .map_err(connect_error)?;
            // The seed's handshake, for the report and the batch limit.
            client
                .with_deadline(std::time::Duration::from_secs(2))
                .ping()
                .await
                .map_err(connect_error)?;
            client
        } else {
            Client::connect(self.addr.clone(), config)
                .await
                .map_err(connect_error)?
        };
        // `connect` returned Ok, so the handshake happened.
        let info = client.server_info().ok_or_else(|| TargetError::Setup {
            target: NAME,
            addr: self.addr.clone(),
            reason: "no handshake information after connecting".to_owned(),
        })?;
        let max = u32::from(info.limits.max_batch);
        if self.shape.batch > max {
            return Err(TargetError::BatchTooLarge {
                target: NAME,
                batch: self.shape.batch,
                max,
            });
        }
        self.info
            .lock()
            .expect("not poisoned")
            .get_or_insert_with(|| {
                format!(
                    "protocol v{}, {:?}, max_batch {}, max_frame {}",
                    info.version, info.role, info.limits.max_batch, info.limits.max_frame
                )
            });
        let rule = self.shape.rule;
        let limit = match &self.options.rule {
            Some(name) => LimitRef::Rule(name.clone()),
            None => Limit {
                algorithm: Algorithm::TokenBucket,
                count: rule.rate.count,
                period_ms: rule.rate.period_ms,
                burst: rule.burst,
            }
            .into(),
        };
        let client = match self.options.priority {
            Some(priority) => client.with_priority(priority),
            None => client,
        };
        Ok(TollgateConn {
            client,
            shape: self.shape,
            limit,
        })
    }

    fn server_info(&self) -> String {
        self.info
            .lock()
            .expect("not poisoned")
            .clone()
            .unwrap_or_default()
    }
}

pub struct TollgateConn {
    client: Client,
    shape: RequestShape,
    limit: LimitRef,
}

/// A request: one check (a gateway's call per API request), or a batch.
pub enum Request {
    One(Pair),
    Batch(CheckBatch),
}

impl Connection for TollgateConn {
    type Request = Request;

    fn build(&self, picker: &mut KeyPicker) -> Request {
        const LEN: usize = KeySpace::KEY_LEN;
        let checks = self.shape.batch as usize;
        // All key names of the request in one shared buffer, each pair a
        // slice of it: no allocation per key, nor per request.
        let names = picker.next_keys(&self.shape.keys, checks);
        let pair = |key| Pair {
            key,
            limit: self.limit.clone(),
            cost: self.shape.rule.cost,
        };
        if checks == 1 {
            return Request::One(pair(names));
        }
        let mut batch = CheckBatch::with_capacity(checks);
        for i in 0..checks {
            batch.push(pair(names.slice(i * LEN..(i + 1) * LEN)));
        }
        Request::Batch(batch)
    }

    async fn send(&self, request: Request) -> Answer {
        match request {
            Request::One(pair) => count(&self.client.check(pair.key, pair.limit, pair.cost).await),
            Request::Batch(batch) => {
                let checks = batch.len() as u32;
                // Boxed (one allocation per batch, not per check): the
                // batch call's state is larger than a single check's, and
                // every request's future, batch 1 included, is as large as
                // the larger of the two and moved into its pipeline slot.
                match Box::pin(self.client.check_batch(batch)).await {
                    Ok(results) => fold(&results),
                    Err(e) => Answer::failed(checks, e.summary()),
                }
            }
        }
    }
}

/// Counts one check's outcome.
fn count(outcome: &Outcome) -> Answer {
    let mut answer = Answer::default();
    match outcome {
        Outcome::Decided(d) if d.allowed => answer.allowed += 1,
        Outcome::Decided(_) => answer.denied += 1,
        Outcome::Rejected(r) => answer.add_error(format!("request rejected: {}", r.code)),
        Outcome::Undecided { why, .. } | Outcome::Fallback { why, .. } => {
            answer.add_error(why.to_string())
        }
    }
    answer
}

/// Counts a CHECKED answer, check by check.
fn fold(results: &[CheckResult]) -> Answer {
    let mut answer = Answer::default();
    for result in results {
        match result {
            CheckResult::Decision(d) if d.allowed => answer.allowed += 1,
            CheckResult::Decision(_) => answer.denied += 1,
            CheckResult::Error(code) => answer.add_error(code_summary(*code)),
        }
    }
    answer
}

#[cfg(test)]
mod tests {
    use tollgate_client::{ErrorCode, WireDecision as Decision};

    use super::*;

    #[test]
    fn checked_answers_are_counted_check_by_check() {
        let decision = |allowed| {
            CheckResult::Decision(Decision {
                allowed,
                shadow_denied: false,
                pair: 0,
                limit: 100,
                remaining: 5,
                reset_after_ms: 1,
                retry_after_ms: 0,
                lease: None,
            })
        };
        let a = fold(&[
            decision(true),
            decision(false),
            CheckResult::Error(ErrorCode::InvalidLimit),
            decision(true),
        ]);
        assert_eq!((a.allowed, a.denied, a.errors), (2, 1, 1));
        assert_eq!(
            a.error.as_deref(),
            Some("request rejected: invalid limit or cost")
        );
    }
}
