//! The door of every call: its client token, checked on the request's
//! headers before tonic reads a byte of its body (a tonic interceptor).
//!
//! Invariants:
//! - a call without a client token (`authorization: Bearer TOKEN`, when
//!   the server has tokens) is answered UNAUTHENTICATED from its headers:
//!   its body is never decoded, so an unauthenticated client cannot make
//!   the server buffer a message;
//! - every refused call is counted in
//!   `tollgate_auth_failures_total{port="envoy"}`, and the
//!   [`MAX_AUTH_FAILURES`]th on one connection closes it;
//! - an authorized call marks its connection active (idle deadline,
//!   shedding);
//! - an authorized call takes `--envoy-max-message` bytes (what tonic may
//!   buffer of its body) from the connection memory budget
//!   (`--max-connection-memory`, shared with the protocol and RESP ports)
//!   before its body is read, and gives them back when the call ends;
//!   when the budget lacks them the call is answered RESOURCE_EXHAUSTED
//!   unread, as a protocol frame that finds no memory is answered
//!   Overloaded.

use super::conn::{ConnState, MAX_AUTH_FAILURES};
use crate::server::budget::Held;
use crate::server::Shared;
use std::sync::Arc;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// The interceptor in front of the rate limit service.
#[derive(Clone)]
pub(super) struct Gate {
    shared: Arc<Shared>,
    /// Bytes a call may make tonic buffer (`--envoy-max-message`).
    max_message: usize,
}

impl Gate {
    pub fn new(shared: Arc<Shared>, max_message: usize) -> Self {
        Self {
            shared,
            max_message,
        }
    }
}

/// A call's share of the connection memory budget, carried in its
/// request's extensions (which must be `Clone`, hence the `Arc`) so it is
/// given back when tonic drops the call, however it ends.
#[derive(Clone)]
struct CallMemory(#[allow(dead_code)] Arc<Held>);

impl Interceptor for Gate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let conn = request.extensions().get::<Arc<ConnState>>().cloned();
        match authorize(&self.shared, request.metadata()) {
            Ok(()) => {
                if let Some(conn) = conn {
                    conn.called();
                }
                let mut held = Held::new(self.shared.budget.clone());
                if !held.grow(self.max_message) {
                    self.shared.metrics.frontends.envoy.errors.inc();
                    return Err(Status::resource_exhausted(format!(
                        "no connection memory for a call: {} bytes of --max-connection-memory \
                         ({} bytes) are in use; try again",
                        held.used(),
                        held.limit()
                    )));
                }
                request.extensions_mut().insert(CallMemory(Arc::new(held)));
                Ok(request)
            }
            Err(status) => {
                let failures = &self.shared.metrics.frontends.auth_failures;
                failures.with_label_values(&["envoy"]).inc();
                if conn.is_some_and(|c| c.refused()) {
                    tracing::debug!(
                        refused = MAX_AUTH_FAILURES,
                        "Envoy connection closed after refused tokens"
                    );
                }
                Err(status)
            }
        }
    }
}

/// Client tokens as `authorization: Bearer TOKEN` metadata (any call
/// passes when the server has none).
fn authorize(shared: &Shared, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
    if shared.auth.hello(b"").is_some() {
        return Ok(());
    }
    let token = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Status::unauthenticated("authorization: Bearer TOKEN is required"))?;
    match shared.auth.hello(token.trim().as_bytes()) {
        Some(_) => Ok(()),
        None => Err(Status::unauthenticated("the token is not a client token")),
    }
}
