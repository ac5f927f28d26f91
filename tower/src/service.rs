//! The layer and its service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tollgate_client::{Client, Outcome};
use tower_layer::Layer;
use tower_service::Service;

use crate::headers;
use crate::route::Route;

/// Applies [`Route`]s to the services it wraps (see the crate docs).
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Shared,
}

#[derive(Clone)]
struct Shared {
    client: Client,
    routes: Vec<Route>,
}

impl RateLimitLayer {
    /// A layer checking through `client`, with no route yet.
    pub fn new(client: Client) -> Self {
        Self {
            shared: Shared {
                client,
                routes: Vec::new(),
            },
        }
    }

    /// Adds a route; routes are tried in the order they were added.
    pub fn route(mut self, route: Route) -> Self {
        self.shared.routes.push(route);
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            shared: Arc::new(self.shared.clone()),
        }
    }
}

/// The rate-limiting service.
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

fn plain<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the one `poll_ready` readied is taken.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let Some(route) = shared.routes.iter().find(|r| r.matches(&request)) else {
                return inner.call(request).await;
            };
            let Some(identifier) = route.key.extract(&request) else {
                return Ok(plain(
                    StatusCode::BAD_REQUEST,
                    format!("missing rate-limit identifier ({:?})\n", route.key),
                ));
            };
            let outcome = shared
                .client
                .check_policy(&route.policy, &identifier, route.cost)
                .await;
            match &outcome {
                Outcome::Decided(d) | Outcome::Fallback { decision: d, .. } if d.allowed => {
                    let mut response = inner.call(request).await?;
                    headers::insert(response.headers_mut(), d, &route.policy);
                    Ok(response)
                }
                Outcome::Decided(d) | Outcome::Fallback { decision: d, .. } => {
                    let mut response = plain(
                        StatusCode::TOO_MANY_REQUESTS,
                        format!("rate limit {} exceeded\n", d.binding.name),
                    );
                    headers::insert(response.headers_mut(), d, &route.policy);
                    Ok(response)
                }
                Outcome::Rejected(r) => {
                    tracing::debug!(rejection = %r, "rate-limit check rejected");
                    Ok(plain(
                        StatusCode::BAD_REQUEST,
                        format!("invalid rate-limit identifier: {}\n", r.code.name()),
                    ))
                }
                Outcome::Undecided { .. } if outcome.is_allowed() => inner.call(request).await,
                Outcome::Undecided { why, .. } => {
                    let mut response = plain(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("rate limiter unavailable ({why}); failing closed\n"),
                    );
                    response
                        .headers_mut()
                        .insert(http::header::RETRY_AFTER, http::HeaderValue::from(1u32));
                    Ok(response)
                }
            }
        })
    }
}
