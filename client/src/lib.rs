//! Async client for Tollgate, the rate-limit counter server, built to sit
//! on a gateway's request path.
//!
//! A [`Client`] holds one multiplexed, pipelined connection per shard (one
//! server, or a primary and its standby; in cluster mode,
//! [`Client::cluster`], one per shard of the cluster's slot map, each check
//! routed by its key's slot): any number of tasks call it at
//! once, concurrent checks leave as one CHECK frame, answers are matched by
//! request id. Every call has a deadline (5 ms by default, connecting
//! included), and a rate-limit question always gets an [`Outcome`] with
//! **one way to decide**, [`Outcome::is_allowed`]:
//!
//! - the server's [`Decision`] (or tokens leased from it, for hot keys);
//! - [`Outcome::Rejected`] for a request the server refused as invalid
//!   (CrossSlot, KeyTooLong, UnknownRule, ...): never allowed, so a
//!   malicious identifier can never buy a free pass;
//! - when the server cannot decide (down, hung, breaker open): the fail
//!   mode of the call, else of the named rule (from the admin API's rule
//!   table), else of the config (fail-open by default). A fail-open check is
//!   then decided by the local fallback limiter (`limit / gateways`).
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use tollgate_client::{Client, ClientConfig, Limit, Policy, Rate, RuleName};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let client = Client::connect("127.0.0.1:7700", ClientConfig {
//!         admin: Some("127.0.0.1:7701".into()), // the rule table and its fail modes
//!         ..ClientConfig::default()
//!     }).await?;
//!
//!     // Named limits over an untrusted identifier, checked atomically.
//!     let search = Policy::new("search")?
//!         .limit("per-second", Limit::token_bucket(Rate::per_second(100), 200))?
//!         .limit("per-day", Limit::fixed_window("10000/day".parse()?))?;
//!     let outcome = client.check_policy(&search, b"api-key-42", 1).await;
//!     if outcome.is_allowed() {
//!         // serve the request
//!     } else if let Some(d) = outcome.decision() {
//!         println!("429: {} bound, retry in {:?}", d.binding.name, d.retry_after);
//!     } else {
//!         // rejected (400) or undecided and fail-closed (503)
//!     }
//!
//!     // A rule configured on the server; cost 0 takes its default cost.
//!     let login = client.check("rl:{api-key-42}:login", RuleName::from_static("login"), 0).await;
//!     let _ = login.is_allowed(); // fail-closed if the rule says so
//!
//!     // Administrative calls can take a longer deadline.
//!     let rtt = client.with_deadline(Duration::from_secs(1)).ping().await?;
//!     println!("round trip {rtt:?}");
//!     Ok(())
//! }
//! ```
//!
//! # Layout
//!
//! ```text
//!  check() ─> decide: lease? ─> Shard: current connection (lock-free), node breaker
//!                                 │
//!     submit (slot + queue) ──────┴──> writer task: take queue, merge CHECKs, one write ─> socket
//!     Call future <── slot <── driver task: decode a read, deliver under one lock, ◄── socket
//!                              sweep deadlines, probe a suspect connection, feed the breaker
//!  ─> Outcome: Decided | Rejected | Undecided{fail mode} | Fallback (local limiter)
//! ```
//!
//! - [`config`]: [`ClientConfig`] and its named defaults, `validate`;
//! - `handle`: the [`Client`] handle, the decide pipeline, admin calls,
//!   and where checks go (one shard, or the cluster);
//! - `cluster`: cluster mode: the slot map from TOPOLOGY, routing by slot,
//!   batches split per shard, MOVED and TryAgain;
//! - `calls`: requests through one shard: local limit checks, the call,
//!   resends after NotPrimary or a lost CHECK2;
//! - `shard`: connection life cycle, primary rounds; `node`: one node and
//!   its breaker;
//! - `connection`: the multiplexed connection (slots, writer, driver);
//! - `sync`: its locks, atomics and wakeups (loom's under `cfg(tollgate_loom)`);
//! - `breaker`: the per-node circuit breaker;
//! - `fallback`, `lease`, `keymap`: the local limiters and their bounded map;
//! - [`outcome`], [`decision`]: what a check comes to (`undecided`: why
//!   the server could not decide, re-exported by [`outcome`]);
//! - [`key`], [`policy`]: safe keys from untrusted identifiers;
//! - [`rules`]: the rule table from the admin API;
//! - `metrics`: Prometheus metrics on an injected registry;
//! - [`error`]: the typed [`Error`].

mod backoff;
mod breaker;
mod calls;
mod cluster;
pub mod config;
mod connection;
pub mod decision;
pub mod error;
mod fallback;
mod handle;
pub mod key;
mod keymap;
mod lease;
mod metrics;
mod node;
pub mod outcome;
pub mod policy;
pub mod rules;
mod shard;
mod sync;
pub mod tls;
mod undecided;
mod validity;

pub use breaker::BreakerState;
pub use cluster::ClusterStats;
pub use config::{
    BreakerConfig, ClientConfig, ConfigError, FailMode, FallbackConfig, LeaseConfig,
    UnknownFailMode,
};
pub use connection::ServerInfo;
pub use decision::{Binding, Decision, LimitName, Source};
pub use error::Error;
pub use handle::Client;
pub use key::{KeyBuilder, KeyError};
pub use outcome::{Outcome, Rejection, Undecided};
pub use policy::{Policy, PolicyError};
pub use rules::{RuleInfo, RuleTable};

/// The protocol types a caller needs, so a gateway depends on this crate
/// alone. The wire decision is `WireDecision`; [`Decision`] is the client's.
pub use tollgate_protocol::{
    units::{Rate, UnitError},
    Algorithm, Announce, CheckBatch, CheckResult, CheckTag, Decision as WireDecision, ErrorCode,
    IdempotencyKey, LeaseRef, Limit, LimitRef, NodeStatus, Pair, Priority, Role, RuleName,
    ServerLimits,
};
