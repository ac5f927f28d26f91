//! Tollgate through its own client crate, as a gateway would call it.
//!
//! One [`Client`] per connection (each holds one multiplexed TCP
//! connection). A request is one CHECK frame of `batch` independent
//! single-pair checks, sent with [`Client::check_batch`]; `--pipeline`
//! requests are in flight at once on each connection, multiplexed by the
//! client's request ids. Per-call work in the client (a pending-map entry,
//! a oneshot, a queue hop to its writer task, a deadline timer) is part of
//! what is measured: it is what a gateway pays too.

use std::sync::Mutex;

use bytes::BytesMut;
use tollgate_client::{
    Algorithm, CheckBatch, CheckResult, Client, ClientConfig, Limit, Pair, Undecided,
};

use super::{Answer, Connection, RequestShape, Target, TargetError};
use crate::workload::{KeyPicker, KeySpace};

const NAME: &str = "tollgate";

pub struct TollgateTarget {
    addr: String,
    shape: RequestShape,
    /// Filled by the first handshake.
    info: Mutex<Option<String>>,
}

impl TollgateTarget {
    pub fn new(addr: String, shape: RequestShape) -> Self {
        Self {
            addr,
            shape,
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
            ..ClientConfig::default()
        };
        let client = Client::connect(self.addr.clone(), config)
            .await
            .map_err(|e| TargetError::Connect {
                target: NAME,
                addr: self.addr.clone(),
                reason: e.to_string(),
            })?;
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
        Ok(TollgateConn {
            client,
            shape: self.shape,
            limit: Limit {
                algorithm: Algorithm::TokenBucket,
                count: rule.rate.count,
                period_ms: rule.rate.period_ms,
                burst: rule.burst,
            },
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
    limit: Limit,
}

impl Connection for TollgateConn {
    type Request = CheckBatch;

    fn build(&self, picker: &mut KeyPicker) -> CheckBatch {
        const LEN: usize = KeySpace::KEY_LEN;
        let checks = self.shape.batch as usize;
        // All key names of the request in one buffer, each pair a slice of
        // it: one allocation per request, not one per key.
        let mut names = BytesMut::with_capacity(checks * LEN);
        let mut key = [0; LEN];
        for _ in 0..checks {
            self.shape.keys.write_key(picker.next_index(), &mut key);
            names.extend_from_slice(&key);
        }
        let names = names.freeze();
        let mut batch = CheckBatch::with_capacity(checks);
        for i in 0..checks {
            batch.push(Pair {
                key: names.slice(i * LEN..(i + 1) * LEN),
                limit: self.limit.into(),
                cost: self.shape.rule.cost,
            });
        }
        batch
    }

    async fn send(&self, request: CheckBatch) -> Answer {
        let checks = request.len() as u32;
        match self.client.check_batch(request).await {
            Ok(results) => fold(&results),
            Err(e) => Answer::failed(checks, Undecided::from_error(&e).to_string()),
        }
    }
}

/// Counts a CHECKED answer, check by check.
fn fold(results: &[CheckResult]) -> Answer {
    let mut answer = Answer::default();
    for result in results {
        match result {
            CheckResult::Decision(d) if d.allowed => answer.allowed += 1,
            CheckResult::Decision(_) => answer.denied += 1,
            CheckResult::Error(code) => answer.add_error(Undecided::from_code(*code).to_string()),
        }
    }
    answer
}

#[cfg(test)]
mod tests {
    use tollgate_client::{Decision, ErrorCode};

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
