//! The rule table: each named rule's limit and failure mode, fetched from
//! the server's admin API (`GET /v1/rules`, docs/ADMIN.md) and
//! refreshed every `rules_refresh`.
//!
//! It is what lets "fail-closed for login, fail-open for search" work
//! without code: an undecided check naming `login` takes the rule's
//! `failure-mode`, and the local fallback and the rate-limit headers know
//! the rule's numbers. The last table fetched stays in force while the
//! admin API is unreachable (seed 002: "rules default to the last known
//! good copy"); before the first fetch rules are known by name only.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio::net::TcpStream;
use tollgate_protocol::units::{parse_millis, Rate};
use tollgate_protocol::{Algorithm, Limit};

use crate::config::FailMode;
use crate::error::Error;

/// Largest rule table body read (the server holds at most 1024 rules).
const MAX_RULES_BODY: usize = 4 << 20;

/// What the client knows of one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInfo {
    pub limit: Limit,
    /// What an undecided check of this rule means.
    pub failure_mode: FailMode,
    pub default_cost: u32,
    pub shadow: bool,
}

/// The rules as last fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleTable {
    rules: HashMap<String, RuleInfo>,
}

impl RuleTable {
    pub fn get(&self, name: &str) -> Option<&RuleInfo> {
        self.rules.get(name)
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.rules.keys().map(String::as_str)
    }

    /// Reads the admin API's `GET /v1/rules` body.
    pub fn from_json(body: &[u8]) -> Result<Self, String> {
        #[derive(Deserialize)]
        struct Listing {
            rules: Vec<Spec>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "kebab-case")]
        struct Spec {
            name: String,
            #[serde(default = "token_bucket")]
            algorithm: String,
            rate: String,
            burst: Option<u64>,
            window: Option<String>,
            #[serde(default = "one")]
            default_cost: u32,
            #[serde(default)]
            failure_mode: Option<String>,
            #[serde(default)]
            shadow: bool,
        }
        fn token_bucket() -> String {
            "token-bucket".into()
        }
        fn one() -> u32 {
            1
        }
        let listing: Listing = serde_json::from_slice(body).map_err(|e| e.to_string())?;
        let mut rules = HashMap::with_capacity(listing.rules.len());
        for spec in listing.rules {
            let fail = |reason: String| format!("rule {:?}: {reason}", spec.name);
            let algorithm = Algorithm::from_name(&spec.algorithm)
                .ok_or_else(|| fail(format!("unknown algorithm {:?}", spec.algorithm)))?;
            let rate: Rate = spec.rate.parse().map_err(|e| fail(format!("{e}")))?;
            let window = spec
                .window
                .as_deref()
                .map(parse_millis)
                .transpose()
                .map_err(|e| fail(e.to_string()))?;
            let limit = Limit::from_rule_fields(algorithm, rate, spec.burst, window)
                .map_err(|e| fail(e.to_string()))?;
            let failure_mode = match spec.failure_mode.as_deref() {
                None => FailMode::Open,
                Some(m) => m.parse().map_err(|e| fail(format!("{e}")))?,
            };
            rules.insert(
                spec.name.clone(),
                RuleInfo {
                    limit,
                    failure_mode,
                    default_cost: spec.default_cost,
                    shadow: spec.shadow,
                },
            );
        }
        Ok(Self { rules })
    }
}

/// Fetches the rule table from the admin API at `addr` (`host:port`).
pub(crate) async fn fetch(addr: &str, timeout: Duration) -> Result<RuleTable, Error> {
    let fail = |reason: String| Error::Rules {
        addr: addr.to_owned(),
        reason,
    };
    let body = tokio::time::timeout(timeout, get(addr, "/v1/rules"))
        .await
        .map_err(|_| fail(format!("no answer within {timeout:?}")))?
        .map_err(fail)?;
    RuleTable::from_json(&body).map_err(fail)
}

/// One HTTP/1 GET on its own connection; the body of a 200.
async fn get(addr: &str, path: &str) -> Result<Bytes, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, addr)
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = http_body_util::Limited::new(response.into_body(), MAX_RULES_BODY)
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    driver.abort();
    if !status.is_success() {
        return Err(format!("HTTP {status}"));
    }
    Ok(body)
}

/// The shared, swappable table.
pub(crate) type SharedTable = arc_swap::ArcSwap<RuleTable>;

/// Refreshes `table` from `addr` every `every` until `stop`.
pub(crate) async fn refresh_loop(
    addr: String,
    table: Arc<SharedTable>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut failing = false;
    loop {
        match fetch(&addr, crate::config::DEFAULT_RULES_TIMEOUT.min(every)).await {
            Ok(fresh) => {
                if failing {
                    tracing::info!(%addr, rules = fresh.len(), "rule table fetched again");
                }
                failing = false;
                table.store(Arc::new(fresh));
            }
            Err(error) => {
                // Once per outage; the last good table stays in force.
                if !failing {
                    tracing::warn!(%error, "cannot refresh the rule table; keeping the last one");
                }
                failing = true;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_admin_api_listing() {
        let body = br#"{"source":null,"last_reload":null,"rules":[
            {"name":"login","algorithm":"sliding-window","rate":"10/min","default-cost":1,"failure-mode":"closed","shadow":false},
            {"name":"search","rate":"100/s","burst":200,"default-cost":2,"failure-mode":"open","shadow":true},
            {"name":"day","algorithm":"fixed-window","rate":"1000/day","window":"12h","default-cost":1,"failure-mode":"open","shadow":false}
        ]}"#;
        let table = RuleTable::from_json(body).unwrap();
        assert_eq!(table.len(), 3);
        let login = table.get("login").unwrap();
        assert_eq!(login.failure_mode, FailMode::Closed);
        assert_eq!(login.limit, Limit::sliding_window(Rate::per_minute(10)));
        let search = table.get("search").unwrap();
        assert_eq!(
            search.limit,
            Limit::token_bucket(Rate::per_second(100), 200)
        );
        assert_eq!((search.default_cost, search.shadow), (2, true));
        assert_eq!(
            table.get("day").unwrap().limit,
            Limit::fixed_window(Rate {
                count: 500,
                period_ms: 43_200_000
            })
        );
        assert!(RuleTable::from_json(
            br#"{"rules":[{"name":"x","algorithm":"nope","rate":"1/s"}]}"#
        )
        .is_err());
    }
}
