//! Server side: give each request a deadline, hand the handler its [`Hop`] with the request,
//! enforce the deadline and return the ledger with the answer.
//!
//! Why not the transport's own timeout? tonic's server enforces `grpc-timeout` too, but it answers
//! CANCELLED, drops the request without a ledger and sits outside every user layer. Serving through
//! this layer instead gives the caller DEADLINE_EXCEEDED (or HTTP 504) with the slices that explain it.

mod future;
mod grpc;
mod layer;

pub use future::ResponseFuture;
pub use grpc::Grpc;
pub use layer::DeadlineLayer;

use std::{sync::Arc, task::Context, task::Poll, time::Duration};

use http::{HeaderMap, Request, Response};
use tokio::time::Instant;
use tower::Service;

use crate::{Deadline, Hop, HopStats};

/// What differs between the protocols a hop can be served over (gRPC, HTTP/JSON).
pub trait Protocol: Clone + Send + Sync + 'static {
    /// Reads the budget the caller asked for, or answers why the request is rejected.
    fn requested_budget<B: Default + From<String>>(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<Duration>, Response<B>>;

    /// The budget granted for what was requested.
    fn grant(&self, requested: Option<Duration>) -> Duration;

    /// The answer when the deadline passes before the handler answers.
    fn expired<B: Default + From<String>>(&self, hop: &Hop) -> Response<B>;

    /// Adds the ledger (and anything derived from it) to an answer.
    fn attach_ledger<B>(&self, ledger: String, response: &mut Response<B>);
}

/// Wraps a service with deadline handling for `protocol`, as hop `name`.
#[derive(Debug, Clone)]
pub struct DeadlineService<S, P> {
    inner: S,
    name: &'static str,
    protocol: P,
    stats: Arc<HopStats>,
    at_edge: bool,
}

impl<S, P> DeadlineService<S, P> {
    pub fn new(inner: S, name: &'static str, protocol: P, stats: Arc<HopStats>) -> Self {
        Self {
            inner,
            name,
            protocol,
            stats,
            at_edge: false,
        }
    }

    /// At the edge every request starts a new operation: a client cannot mark its own request as
    /// a retry (`grpc-previous-rpc-attempts` is ignored there).
    pub fn at_edge(mut self) -> Self {
        self.at_edge = true;
        self
    }
}

impl<S, P, ReqBody, ResBody> Service<Request<ReqBody>> for DeadlineService<S, P>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    P: Protocol,
    ResBody: Default + From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, P, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let received_at = Instant::now();
        self.stats.count_request();
        let requested = match self.protocol.requested_budget(request.headers()) {
            Ok(requested) => requested,
            Err(rejection) => return ResponseFuture::rejected(rejection),
        };
        let deadline = Deadline::after(received_at, self.protocol.grant(requested));
        let previous_attempts = request
            .headers()
            .get(wire::PREVIOUS_ATTEMPTS)
            .filter(|_| !self.at_edge)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse().ok())
            .unwrap_or(0);
        let hop = Arc::new(
            Hop::new(self.name, deadline, self.stats.clone())
                .with_previous_attempts(previous_attempts),
        );
        // The handler gets the hop (and so the deadline) with the request, and passes it on
        // with its calls.
        request.extensions_mut().insert(hop.clone());
        ResponseFuture::running(self.inner.call(request), hop, self.protocol.clone())
    }
}
