//! The naive design, kept to be measured against: every hop waits a fixed time per attempt,
//! ignores the caller's deadline, and tries three times with no budget and no jitter.
//!
//! Chained over three levels this turns one failing user attempt into 3³ = 27 calls to the bottom
//! of the chain, and keeps inner hops working long after the client has given up. Do not copy
//! it: it exists so that the scenarios and the benchmarks can show what the budgeted design
//! saves. The services never name it: the stack turns their guards off in their settings
//! ([`unguarded`]) and puts a [`RetryingProxy`] in front of each hop on an order's way.

mod layer;
mod proxy;

pub use layer::NaiveRetryLayer;
pub use proxy::RetryingProxy;

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use serde::{Deserialize, Serialize};
use tonic::{Code, Status, body::Body};
use tower::{BoxError, Service, ServiceExt};

/// Whether the chain is built the naive way, and how its clients retry.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NaiveSettings {
    /// Every hop's calls go through [`NaiveRetry`] instead of the guards, and the gateway's own
    /// retries are off (the proxy in front of orders retries instead).
    pub enabled: bool,
    /// Attempts per call at every hop.
    pub attempts: u32,
    /// Fixed time each attempt may take, whatever the caller's deadline.
    pub attempt_timeout_ms: u64,
}

impl Default for NaiveSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            attempts: 3,
            attempt_timeout_ms: 2_000,
        }
    }
}

/// A dependency's settings as the naive design has them: no breaker, no bulkhead, no quota and
/// no failing fast on its observed latency. The deadline is still forwarded (the proxy in front
/// of the dependency drops it).
pub fn unguarded(dependency: &mut rpc::Dependency) {
    dependency.breaker.enabled = false;
    dependency.max_concurrent = u32::MAX / 2;
    dependency.adaptive_limit.enabled = false;
    dependency.quota = resilience::rate_limit::QuotaSettings::default();
    dependency.latency_estimate.fail_fast = false;
}

/// Retries a gRPC call at the HTTP level: the body is buffered once and resent.
#[derive(Debug, Clone)]
pub struct NaiveRetry<S> {
    inner: S,
    settings: NaiveSettings,
}

impl<S> NaiveRetry<S> {
    pub fn new(inner: S, settings: NaiveSettings) -> Self {
        Self { inner, settings }
    }
}

/// A trailers-only answer with a transient gRPC code (how unary failures arrive).
fn is_transient_failure(response: &Response<Body>) -> bool {
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<i32>().ok())
        .map(Code::from_i32);
    matches!(code, Some(Code::Unavailable | Code::DeadlineExceeded))
}

impl<S> Service<Request<Body>> for NaiveRetry<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // Keep the readied service for the first attempt; clones serve the retries.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let settings = self.settings;
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body: Bytes = body.collect().await?.to_bytes();
            let timeout = Duration::from_millis(settings.attempt_timeout_ms);
            let mut last = Err::<Response<Body>, BoxError>("no attempt made".into());
            for attempt in 0..settings.attempts.max(1) {
                let mut request = Request::builder()
                    .method(parts.method.clone())
                    .uri(parts.uri.clone())
                    .version(parts.version)
                    .body(Body::new(Full::new(body.clone())))?;
                *request.headers_mut() = parts.headers.clone();
                // No deadline travels: each hop applies its own fixed timeout.
                request.headers_mut().remove(wire::GRPC_TIMEOUT);
                request
                    .headers_mut()
                    .insert(wire::PREVIOUS_ATTEMPTS, HeaderValue::from(attempt));
                let service = if attempt == 0 {
                    &mut inner
                } else {
                    inner.ready().await.map_err(Into::into)?
                };
                last = match tokio::time::timeout(timeout, service.call(request)).await {
                    Ok(Ok(response)) if !is_transient_failure(&response) => return Ok(response),
                    Ok(Ok(response)) => Ok(response),
                    Ok(Err(error)) => Err(error.into()),
                    Err(_) => Ok(Status::deadline_exceeded(format!(
                        "naive: no answer within the fixed {} ms",
                        settings.attempt_timeout_ms
                    ))
                    .into_http()),
                };
            }
            last
        })
    }
}
