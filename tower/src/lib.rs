//! A tower [`Layer`](tower_layer::Layer) that rate-limits HTTP requests
//! with Tollgate, for axum and hyper services.
//!
//! Each [`Route`] matches a method and a path (exact, or a prefix ending in
//! `*`), takes the caller's identifier with a [`KeyExtractor`] (a header,
//! the peer IP, the path), and checks a [`Policy`] for it: named limits
//! checked as one atomic group. The first matching route decides; requests
//! no route matches pass untouched.
//!
//! | outcome | answer |
//! |---|---|
//! | allowed (by the server, a lease or the local fallback) | the inner service's response, with the rate-limit headers |
//! | denied (by the server or the local fallback) | `429 Too Many Requests`, `Retry-After`, the rate-limit headers |
//! | no identifier (header missing or empty) | `400 Bad Request` |
//! | rejected as invalid (e.g. a key the server refuses) | `400 Bad Request` |
//! | undecided, fail-open, and no fallback decision (`fallback: None`, or a rule whose numbers the client lacks) | the inner service's response, no rate-limit headers |
//! | undecided, fail-closed | `503 Service Unavailable`, `Retry-After: 1` |
//!
//! So no identifier can buy a free pass: an identifier is made safe by the
//! policy's [`KeyBuilder`](tollgate_client::KeyBuilder) (braces escaped,
//! long ones hashed), and anything still invalid is a 400, never a pass.
//!
//! Headers (see [`headers`]): `X-RateLimit-Limit`, `X-RateLimit-Remaining`,
//! `X-RateLimit-Reset` (seconds until the binding limit frees quota), and
//! the IETF fields `RateLimit-Policy: "per-second";q=200;w=2,
//! "per-day";q=10000;w=86400` (every limit of the policy) and
//! `RateLimit: "per-day";r=0;t=3600` (the binding limit).
//!
//! ```no_run
//! use axum::{routing::get, Router};
//! use tollgate_client::{Client, ClientConfig, Limit, Policy, Rate};
//! use tollgate_tower::{KeyExtractor, RateLimitLayer, Route};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("127.0.0.1:7700", ClientConfig::default())?;
//! let search = Policy::new("search")?
//!     .limit("per-second", Limit::token_bucket(Rate::per_second(10), 10))?;
//! let layer = RateLimitLayer::new(client)
//!     .route(Route::get("/api/search", KeyExtractor::header("x-api-key")?, search));
//! let app: Router = Router::new()
//!     .route("/api/search", get(|| async { "results" }))
//!     .layer(layer);
//! # Ok(()) }
//! ```

pub mod headers;
mod route;
mod service;

pub use route::{ExtractFn, KeyExtractor, KeyExtractorError, Route};
pub use service::{RateLimit, RateLimitLayer};
pub use tollgate_client::Policy;

/// The README's Rust examples, compiled as doctests (`cargo test -p
/// tollgate-tower --doc`) so that they keep up with the APIs.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

/// The Rust examples of the replication guide (a client given both nodes
/// of a pair), compiled as doctests like the README's.
#[cfg(doctest)]
#[doc = include_str!("../../docs/REPLICATION.md")]
pub struct ReplicationExamples;

/// The client guide's Rust examples (the client's and this crate's),
/// compiled as doctests like the README's.
#[cfg(doctest)]
#[doc = include_str!("../../docs/CLIENT.md")]
pub struct ClientExamples;
