//! An example API gateway: an axum app whose routes are rate-limited by
//! Tollgate through `tollgate-tower`, in a few lines instead of the
//! hundreds a gateway would otherwise write.
//!
//! - `GET /api/search`: per `x-api-key`, two limits checked atomically:
//!   10 per second (bursts of 10) and 1000 per day;
//! - `POST /login`: per client IP, the server's `login` rule (its numbers
//!   and its failure mode come from the server's rule table: a rule with
//!   `failure-mode: closed` answers 503 while the limiter is unreachable);
//! - `GET /health`: not limited.

use axum::routing::{get, post};
use axum::Router;
use tollgate_client::{Client, Limit, Policy, PolicyError, Rate, RuleName};
use tollgate_tower::{KeyExtractor, RateLimitLayer, Route};

/// The search policy: 10/s bursts of 10, and 1000 a day, per API key.
pub fn search_policy() -> Result<Policy, PolicyError> {
    Policy::new("search")?
        .limit("per-second", Limit::token_bucket(Rate::per_second(10), 10))?
        .limit("per-day", Limit::fixed_window(Rate::per_day(1000)))
}

/// The login policy: the server's `login` rule, per client IP.
pub fn login_policy() -> Result<Policy, PolicyError> {
    Policy::new("login")?.limit("login", RuleName::from_static("login"))
}

/// The gateway's routes, limited through `client`.
pub fn app(client: Client) -> Result<Router, Box<dyn std::error::Error + Send + Sync>> {
    let layer = RateLimitLayer::new(client)
        .route(Route::get(
            "/api/search",
            KeyExtractor::header("x-api-key")?,
            search_policy()?,
        ))
        .route(Route::post("/login", KeyExtractor::Ip, login_policy()?));
    Ok(Router::new()
        .route("/api/search", get(|| async { "search results\n" }))
        .route("/login", post(|| async { "welcome\n" }))
        .route("/health", get(|| async { "ok\n" }))
        .layer(layer))
}
