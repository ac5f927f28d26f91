//! The admin HTTP API: health, rules, usage, throttled keys, replication,
//! cluster, metrics.
//!
//! JSON in and out; every error is `{"error": "..."}` with a fitting status
//! code (unknown paths and methods included). It runs on its own port
//! (`--admin`), never on the protocol's, and reads the server's state
//! without charging anything. See the README's "Admin API" for the shapes.
//!
//! Edits made here (`PUT`, `DELETE`) live in memory: the next reload of the
//! rules file (a change to it, SIGHUP, `POST /v1/rules/reload`) replaces the
//! whole set with the file's content.
//!
//! `GET /` is the status page for people (`status_page.rs`).
//!
//! With `--admin-token` every endpoint but `/healthz` and `/readyz` (and
//! `/metrics` with `--admin-open-metrics`) answers 401 unless the request
//! carries `Authorization: Bearer <token>`; unknown paths too, so the
//! answer tells nothing without the token. `POST /v1/promote` is the
//! operator's promotion (the protocol's PROMOTE is for nodes only).
//! The listener (TLS, HTTP/1, graceful stop) is `admin_listener.rs`.
//!
//! Before the token, `admin_guard.rs` refuses what a browser could be made
//! to send for someone else: an unexpected `Host` (421, DNS rebinding), a
//! state-changing request from another origin (403, CSRF), a body that is
//! not JSON (415).

use super::admin_guard::RequestGuard;
use super::auth::AdminAuth;
use super::Shared;
use crate::engine::{Inspected, Usage};
use crate::node::status;
use crate::rules::{EditError, ReloadError, ReloadSource};
use crate::slot::Slot;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State as AxumState};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prometheus::Registry;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tollgate_protocol::RETRY_NEVER;

/// What the admin API reads: what connections see, and the server's own
/// state.
pub(super) struct AdminState {
    pub shared: Arc<Shared>,
    /// Every metric of the server, for `/metrics`.
    pub registry: Registry,
    /// Set once the server serves (listener and rules in place); read by
    /// `/readyz` together with draining.
    pub serving: AtomicBool,
    /// `--max-log-entries`: usage is computed under the bound checks see.
    pub max_log_entries: u64,
    /// Who may call which endpoint.
    pub auth: AdminAuth,
    /// Which hosts, origins and bodies are refused before the token.
    pub guard: RequestGuard,
    /// `--max-memory`, for the status page (None: no cap).
    pub max_memory: Option<usize>,
    /// `--status-refresh`: how often the status page reloads itself.
    pub status_refresh: std::time::Duration,
}

type AppState = AxumState<Arc<AdminState>>;

pub(super) fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/", get(status_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/rules", get(list_rules))
        .route("/v1/rules/reload", post(reload))
        .route(
            "/v1/rules/{name}",
            get(get_rule).put(put_rule).delete(delete_rule),
        )
        .route("/v1/limits/{key}", get(limits))
        .route("/v1/throttled", get(throttled))
        .route("/v1/replication", get(replication))
        .route("/v1/cluster", get(cluster))
        .route("/v1/promote", post(promote))
        .route("/v1/regions", get(regions))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        // Added last, so it runs first: a refused request never reaches the
        // token check (whose 401 would tell a rebinding page it exists).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard_request,
        ))
        .with_state(state)
}

/// 421, 403 or 415 for a request `admin_guard` refuses.
async fn guard_request(
    AxumState(state): AppState,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let verdict = state
        .guard
        .judge(request.method(), request.uri(), request.headers());
    match verdict {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            // Debug: a page can send these as fast as a browser goes; the
            // counter (tollgate_admin_refused_total) is the signal.
            tracing::debug!(
                method = %request.method(),
                path = %crate::log_text::escape(request.uri().path()),
                reason = %crate::log_text::escape(&refusal.to_string()),
                "admin request refused"
            );
            let body = json!({ "error": refusal.to_string(), "refused": refusal.check() });
            (refusal.status(), Json(body)).into_response()
        }
    }
}

/// 401 for a request the admin token does not cover.
async fn require_token(
    AxumState(state): AppState,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if state.auth.allows(request.uri().path(), given) {
        return next.run(request).await;
    }
    let mut refused = error(
        StatusCode::UNAUTHORIZED,
        "missing or wrong admin token: send `Authorization: Bearer <token>` (--admin-token)",
    );
    refused
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    refused
}

/// An operator's promotion: this node becomes primary at
/// `max(every epoch it knows) + 1` (a primary stays as it is).
async fn promote(AxumState(state): AppState) -> Response {
    tracing::info!("promotion requested through the admin API");
    match state.shared.engine.node().promote() {
        Ok((epoch, was_primary)) => Json(json!({
            "role": "primary",
            "epoch": epoch,
            "was_primary": was_primary,
            "addr": state.shared.engine.node().status().addr,
        }))
        .into_response(),
        Err(refusal) => error(StatusCode::CONFLICT, refusal),
    }
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": message.to_string() }))).into_response()
}

/// Role, epoch, offsets and replication counters (what `tollgate status`
/// prints).
async fn replication(AxumState(state): AppState) -> Response {
    Json(status::to_json(&state.shared.engine.node().status())).into_response()
}

/// Cluster mode: this node's place (shard, role, epoch, lease) and the
/// routing table it serves from; 404 outside a cluster.
async fn cluster(AxumState(state): AppState) -> Response {
    match state.shared.engine.node().cluster_json() {
        Some(v) => Json(v).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "this node is not in a cluster (no --etcd)",
        ),
    }
}

/// This node's region, the exchange with each peer region, and whether the
/// ceiling is in force (404 on a node in no region).
/// `GET /v1/regions`: the exchange with each peer, and the global rules as
/// this region holds them (which are capped now).
#[derive(serde::Serialize)]
struct RegionsAnswer {
    #[serde(flatten)]
    status: crate::node::regions::RegionsStatus,
    rules: Vec<crate::engine::GlobalRuleState>,
}

async fn regions(AxumState(state): AppState) -> Response {
    let shared = &state.shared;
    match shared.engine.node().regions() {
        Some(regions) => Json(RegionsAnswer {
            status: regions.status(shared.engine.now()),
            rules: shared.engine.global_rules(),
        })
        .into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "this node is in no region (--region): it has no global limits",
        ),
    }
}

/// The status page (`status_page.rs`).
async fn status_page(AxumState(state): AppState) -> Response {
    let page = super::status_page::render(&state.shared, state.max_memory, state.status_refresh);
    axum::response::Html(page).into_response()
}

async fn healthz() -> Response {
    Json(json!({ "status": "ok" })).into_response()
}

/// Ready once serving (listener bound, rules loaded); not ready once
/// draining, so load balancers stop sending new clients first.
async fn readyz(AxumState(state): AppState) -> Response {
    if state.shared.lifecycle.draining.is_cancelled() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "draining");
    }
    // Acquire: pairs with the Release store once the server serves.
    if !state.serving.load(Ordering::Acquire) {
        return error(StatusCode::SERVICE_UNAVAILABLE, "starting");
    }
    Json(json!({ "status": "ready", "rules": state.shared.engine.rules().current().len() }))
        .into_response()
}

async fn metrics(AxumState(state): AppState) -> Response {
    use prometheus::Encoder;
    let encoder = prometheus::TextEncoder::new();
    let mut out = Vec::new();
    state.shared.engine.node().refresh_metrics();
    state.shared.metrics.throttled_keys.refresh(&state.shared);
    state.shared.metrics.capped_rules.refresh(&state.shared);
    if let Err(e) = encoder.encode(&state.registry.gather(), &mut out) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, e);
    }
    (
        [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
        out,
    )
        .into_response()
}

async fn list_rules(AxumState(state): AppState) -> Response {
    let shared = &state.shared;
    let set = shared.engine.rules().current();
    let rules: Vec<_> = set.sorted().into_iter().map(|r| &r.spec).collect();
    Json(json!({
        "source": shared.engine.rules().path().map(|p| p.display().to_string()),
        "last_reload": shared.engine.rules().status(),
        "rules": rules,
    }))
    .into_response()
}

async fn get_rule(
    AxumState(state): AppState,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let shared = &state.shared;
    let name = match name {
        Ok(Path(n)) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    match shared.engine.rules().current().get(name.as_bytes()) {
        Some(rule) => Json(&rule.spec).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no rule named {name:?}")),
    }
}

/// The most a rule's body may hold: a rule is a few fields, and every
/// byte of a body is held until it has all arrived.
const MAX_RULE_BODY: usize = 64 << 10;

/// A request's body, whole within `patience` (the bound its head had) and
/// `MAX_RULE_BODY`: a body sent slowly or not at all would otherwise hold
/// its connection and what arrived of it for good. 408, 413 or 400 (as
/// `{"error"}`) when it does not come.
async fn whole_body(
    request: axum::extract::Request,
    patience: Duration,
) -> Result<Bytes, Response> {
    let read = axum::body::to_bytes(request.into_body(), MAX_RULE_BODY);
    match tokio::time::timeout(patience, read).await {
        Err(_) => Err(error(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {patience:?}"),
        )),
        Ok(Ok(body)) => Ok(body),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            Err(if too_large {
                error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a rule's body is at most {MAX_RULE_BODY} bytes"),
                )
            } else {
                error(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                )
            })
        }
    }
}

async fn put_rule(
    AxumState(state): AppState,
    name: Result<Path<String>, PathRejection>,
    request: axum::extract::Request,
) -> Response {
    let shared = &state.shared;
    let name = match name {
        Ok(Path(n)) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let body = match whole_body(request, shared.network.handshake_timeout).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    match shared.engine.rules().put(&name, &body).await {
        Ok((created, rule)) => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (status, Json(&rule.spec)).into_response()
        }
        Err(EditError::Invalid(e)) => {
            let mut body = json!({ "error": e.to_string(), "reason": e.reason });
            if let (Some(line), Some(column)) = (e.line, e.column) {
                body["line"] = json!(line);
                body["column"] = json!(column);
            }
            (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
        }
        Err(e @ EditError::TooMany) => error(StatusCode::CONFLICT, e),
    }
}

async fn delete_rule(
    AxumState(state): AppState,
    name: Result<Path<String>, PathRejection>,
) -> Response {
    let shared = &state.shared;
    let name = match name {
        Ok(Path(n)) => n,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if shared.engine.rules().delete(&name).await {
        Json(json!({ "deleted": name })).into_response()
    } else {
        error(StatusCode::NOT_FOUND, format!("no rule named {name:?}"))
    }
}

async fn reload(AxumState(state): AppState) -> Response {
    let shared = &state.shared;
    match shared.engine.rules().reload(ReloadSource::AdminApi).await {
        Ok(n) => Json(json!({
            "status": "reloaded",
            "rules": n,
            "source": shared.engine.rules().path().map(|p| p.display().to_string()),
        }))
        .into_response(),
        Err(e @ ReloadError::NoFile) => error(StatusCode::CONFLICT, e),
        Err(e) => {
            let mut body = json!({
                "error": e.to_string(),
                "rules_in_force": shared.engine.rules().current().len(),
            });
            if let ReloadError::Invalid { path, error } = &e {
                body["file"] = json!(path);
                body["line"] = json!(error.line);
                body["column"] = json!(error.column);
                body["reason"] = json!(error.reason);
            }
            (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
        }
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsQuery {
    /// Show the usage under this rule only.
    rule: Option<String>,
}

/// The usage of one key under every rule of its state's algorithm (or the
/// one `?rule=` names), computed from the stored state without charging.
async fn limits(
    AxumState(state): AppState,
    uri: Uri,
    query: Result<Query<LimitsQuery>, QueryRejection>,
) -> Response {
    let shared = &state.shared;
    // Keys are bytes: the path segment is percent-decoded by hand, since
    // `Path<String>` refuses a key that is not UTF-8.
    let encoded = uri.path().strip_prefix(LIMITS_PREFIX).unwrap_or_default();
    let key: Vec<u8> = percent_encoding::percent_decode_str(encoded).collect();
    let only = match query {
        Ok(Query(q)) => q.rule,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let max_key_len = shared.limits.max_key_len;
    if key.is_empty() || key.len() > usize::from(max_key_len) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("keys are 1 to {max_key_len} bytes"),
        );
    }
    let rules = shared.engine.rules().current();
    if let Some(name) = &only {
        if rules.get(name.as_bytes()).is_none() {
            return error(StatusCode::NOT_FOUND, format!("no rule named {name:?}"));
        }
    }
    let now = shared.engine.now();
    let (entries, usage) =
        shared
            .engine
            .inspect(&key, &rules, only.as_deref(), state.max_log_entries, now);
    let usage: Vec<Value> = usage
        .iter()
        .map(|Usage { rule, decision: d }| {
            json!({
                "rule": rule.name(),
                "shadow": rule.shadow(),
                "limit": d.limit,
                "remaining": d.remaining,
                "used": d.limit.saturating_sub(d.remaining),
                "reset_after_ms": d.reset_after_ms,
                "retry_after_ms": if d.allowed { Some(0) }
                    else if d.retry_after_ms == RETRY_NEVER { None }
                    else { Some(d.retry_after_ms) },
            })
        })
        .collect();
    let state_json = |e: &Inspected| {
        json!({
            "algorithm": e.algorithm.name(),
            "expires_in_ms": e.expires_at.saturating_sub(now).div_ceil(crate::clock::NANOS_PER_MS),
        })
    };
    // `state` is the first (the token bucket when there is one), `states`
    // all of them.
    let state = entries.first().map_or(Value::Null, state_json);
    let states: Vec<Value> = entries.iter().map(state_json).collect();
    let mut body = json!({
        "key": String::from_utf8_lossy(&key),
        "slot": Slot::of(&key).get(),
        "state": state,
        "states": states,
        "usage": usage,
    });
    if let Some(hex) = key_hex(&key) {
        body["key_hex"] = json!(hex);
    }
    Json(body).into_response()
}

/// The route of `limits`, whose rest is the percent-encoded key.
const LIMITS_PREFIX: &str = "/v1/limits/";

/// A key that is not UTF-8 in hex (its JSON `key` is then lossy).
fn key_hex(key: &[u8]) -> Option<String> {
    std::str::from_utf8(key)
        .is_err()
        .then(|| key.iter().map(|b| format!("{b:02x}")).collect())
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TopQuery {
    top: Option<usize>,
}

async fn throttled(
    AxumState(state): AppState,
    query: Result<Query<TopQuery>, QueryRejection>,
) -> Response {
    let shared = &state.shared;
    let top = match query {
        Ok(Query(q)) => q.top.unwrap_or(10),
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let sketch = shared.engine.throttled();
    let keys: Vec<Value> = sketch
        .top(top.min(sketch.capacity()), shared.engine.now())
        .into_iter()
        .map(|t| {
            let mut v = json!({
                "key": String::from_utf8_lossy(&t.key),
                "denied": t.denied,
                "error": t.error,
            });
            if let Some(hex) = key_hex(&t.key) {
                v["key_hex"] = json!(hex);
            }
            v
        })
        .collect();
    Json(json!({
        "window_ms": sketch.window() / crate::clock::NANOS_PER_MS,
        "capacity": sketch.capacity(),
        "keys": keys,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::config::ServerConfig;
    use crate::server::Server;

    async fn body(r: Response) -> Value {
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn readyz_follows_serving_then_draining() {
        let config = ServerConfig::with_listen("127.0.0.1:0".parse().unwrap());
        let server = Server::with_clock(config, Arc::new(ManualClock::new(0))).unwrap();
        let shared = Arc::new(AdminState {
            shared: server.shared.clone(),
            registry: Registry::new(),
            serving: AtomicBool::new(false),
            max_log_entries: 1000,
            auth: AdminAuth::new(&Default::default()),
            guard: RequestGuard::new(None, &Registry::new()).unwrap(),
            max_memory: None,
            status_refresh: std::time::Duration::from_secs(5),
        });

        let r = readyz(AxumState(shared.clone())).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body(r).await["error"], "starting");

        shared.serving.store(true, Ordering::Release);
        assert_eq!(
            readyz(AxumState(shared.clone())).await.status(),
            StatusCode::OK
        );

        shared.shared.lifecycle.draining.cancel();
        let r = readyz(AxumState(shared.clone())).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body(r).await["error"], "draining");
        // Health is not readiness: the process is still up.
        assert_eq!(healthz().await.status(), StatusCode::OK);
    }
}
