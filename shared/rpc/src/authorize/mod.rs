//! Admits only the callers that the chain's shape allows, by the identity in their certificate.
//!
//! Why certificates and not a shared token: a token that one hop forwards can be replayed by any
//! process that saw it, and every hop would hold the same secret; a certificate proves which
//! service is calling without sending anything that could be reused, so each server can allow a
//! different set of methods to each caller (orders answers the gateway; payment answers orders
//! and the gateway's reads; the bank answers payment and the gateway's rate reads).
//!
//! A request without a certificate is answered UNAUTHENTICATED, one from a service that may not
//! call the method PERMISSION_DENIED, both before any work is done. The client identity in
//! `x-client-id` is removed unless the rule admitting the caller says that it speaks for clients
//! (the gateway, which authenticated the client's API key): no other caller can act as a client.
//! A plain HTTP request (`/metrics`) is refused with HTTP's own 401 or 403, not a gRPC status
//! inside a 200.
//!
//! Refusals are counted (`rpc.server.refused_calls`, by reason, without the path: a path is the
//! caller's to choose) and logged at most once per [`REFUSAL_LOG_INTERVAL`], with how many were
//! not: a caller without a certificate must not be able to fill the logs.

mod error;
mod layer;
mod policy;

pub use error::Refusal;
pub use layer::AuthorizeLayer;
pub use policy::{Admitted, Policy};

use std::{
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use axum::extract::ConnectInfo;
use http::{StatusCode, header};
use resilience::guarded::Guarded;
use telemetry::metrics::{Counter, KeyValue};
use tokio::time::Instant;

use crate::listener::Peer;
use wire::CLIENT_ID;

/// The shortest time between two log lines about refused calls.
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The service behind [`AuthorizeLayer`]: checks each request against its [`Policy`].
#[derive(Debug, Clone)]
pub struct Authorize<S> {
    inner: S,
    policy: Policy,
    refusals: Arc<Refusals>,
}

/// The refused calls of one server: counted, and logged now and then.
#[derive(Debug)]
pub(crate) struct Refusals {
    counter: Counter<u64>,
    /// When a refusal was last logged.
    logged_at: Mutex<Option<Instant>>,
    /// Refusals since then that were not logged.
    unlogged: AtomicU64,
}

impl Refusals {
    pub(crate) fn new() -> Self {
        Self {
            counter: telemetry::metrics::counter(
                "rpc.server.refused_calls",
                "Calls refused for their caller, by reason",
            ),
            logged_at: Mutex::default(),
            unlogged: AtomicU64::new(0),
        }
    }

    fn record(&self, refusal: &Refusal) {
        let reason = match refusal {
            Refusal::NoCertificate => "no_certificate",
            Refusal::NotAllowed { .. } => "not_allowed",
        };
        self.counter.add(1, &[KeyValue::new("reason", reason)]);
        let now = Instant::now();
        let mut logged_at = self
            .logged_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if logged_at.is_some_and(|at| now.duration_since(at) < REFUSAL_LOG_INTERVAL) {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
            return;
        }
        *logged_at = Some(now);
        let unlogged = self.unlogged.swap(0, Ordering::Relaxed);
        tracing::warn!(%refusal, refused_since_last_logged = unlogged, "call refused");
    }
}

impl<S, B, ResBody> tower::Service<http::Request<B>> for Authorize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Guarded<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let caller = request
            .extensions()
            .get::<ConnectInfo<Peer>>()
            .and_then(|peer| peer.0.identity.clone());
        match self.policy.decide(caller.as_deref(), request.uri().path()) {
            Ok(admitted) => {
                if !admitted.speaks_for_clients {
                    request.headers_mut().remove(CLIENT_ID);
                }
                Guarded::admitted(self.inner.call(request), ())
            }
            Err(refusal) => {
                self.refusals.record(&refusal);
                let grpc = request
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .is_some_and(|kind| kind.as_bytes().starts_with(b"application/grpc"));
                let response = if grpc {
                    tonic::Status::from(&refusal).into_http()
                } else {
                    let status = match refusal {
                        Refusal::NoCertificate => StatusCode::UNAUTHORIZED,
                        Refusal::NotAllowed { .. } => StatusCode::FORBIDDEN,
                    };
                    http::Response::builder()
                        .status(status)
                        .body(ResBody::default())
                        .expect("a status and an empty body")
                };
                Guarded::refused(response)
            }
        }
    }
}

#[cfg(test)]
mod tests;
