//! Thin async client for Tollgate, the rate-limit counter server.
//!
//! A [`Client`] holds one multiplexed, pipelined connection to one server:
//! any number of tasks call it at once, their requests are coalesced into
//! few writes, and answers are matched by request id in whatever order they
//! come. Every call has a deadline (5 ms by default, connecting included),
//! and a rate-limit question always gets an [`Outcome`]: the server's
//! [`Decision`], or an [`Undecided`] reason that the caller maps to allow or
//! deny with a [`FailMode`]. **The default is fail-open**: the limiter must
//! never be the reason the API is down.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use tollgate_client::{Algorithm, Client, ClientConfig, FailMode, Limit, Outcome, RuleName};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), tollgate_client::Error> {
//!     // Connect eagerly to get a clear error now (`Client::new` is lazy).
//!     let client = Client::connect("127.0.0.1:7700", ClientConfig::default()).await?;
//!
//!     // A token bucket: 5 per second, bursts of up to 10.
//!     let limit = Limit {
//!         algorithm: Algorithm::TokenBucket,
//!         count: 5,
//!         period_ms: 1000,
//!         burst: 10,
//!     };
//!     let outcome = client.check("rl:{api-key-42}:login", limit, 1).await;
//!     match outcome {
//!         Outcome::Decided(d) => println!("allowed={} remaining={}", d.allowed, d.remaining),
//!         Outcome::Undecided(why) => println!("no decision ({why}); failing open"),
//!     }
//!     if outcome.allowed(FailMode::Open) {
//!         // serve the request
//!     } else {
//!         // answer 429
//!     }
//!
//!     // Or name a rule configured on the server (its rules file); cost 0
//!     // takes the rule's default cost. An unknown name is
//!     // `Undecided(Rejected(UnknownRule))`. A rule's failure mode
//!     // ("open"/"closed", from the admin API's GET /v1/rules) parses as a
//!     // FailMode for `allowed`.
//!     let outcome = client.check("rl:{api-key-42}:search", RuleName::from_static("search"), 0).await;
//!     let mode: FailMode = "closed".parse().expect("a failure mode");
//!     let _ = outcome.allowed(mode);
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
//!  caller ── check() ──> Client ── connection() ─────────┐ (client.rs: lazy connect,
//!                          │                             │  one attempt, backoff)
//!                          ▼                             ▼
//!               register id in pending map     Connection (connection.rs)
//!               queue (id, request) ──mpsc──> writer task: drain queue,
//!                                              encode all, one write ──> socket ──> server
//!               oneshot <── pending map <───── reader task: decode ───── socket <── server
//!                  │
//!                  ▼
//!               Outcome (outcome.rs): Decided(Decision) | Undecided(why)
//! ```
//!
//! - [`config`]: [`ClientConfig`], its named defaults and `validate`;
//! - `client`: [`Client`], deadlines, the reconnect state machine;
//! - `connection`: the multiplexed connection, its tasks and pending map;
//! - [`outcome`]: [`Outcome`], [`Undecided`] and the fail-open/closed mapping;
//! - [`error`]: the typed [`Error`].

mod backoff;
mod client;
pub mod config;
mod connection;
pub mod error;
pub mod outcome;

pub use client::Client;
pub use config::{ClientConfig, ConfigError, FailMode, UnknownFailMode};
pub use connection::ServerInfo;
pub use error::Error;
pub use outcome::{Outcome, Undecided};

/// The protocol types a caller needs, so a gateway depends on this crate
/// alone.
pub use tollgate_protocol::{
    Algorithm, Announce, CheckBatch, CheckResult, Decision, ErrorCode, LeaseRef, Limit, LimitRef,
    NodeStatus, Pair, Role, RuleName, ServerLimits, RETRY_NEVER,
};
