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

mod error;
mod future;
mod layer;
mod policy;

pub use error::Refusal;
pub use future::ResponseFuture;
pub use layer::AuthorizeLayer;
pub use policy::{Admitted, Policy};

use std::task::{Context, Poll};

use axum::extract::ConnectInfo;

use crate::{listener::Peer, metadata::CLIENT_ID};

/// The service behind [`AuthorizeLayer`]: checks each request against its [`Policy`].
#[derive(Debug, Clone)]
pub struct Authorize<S> {
    inner: S,
    policy: Policy,
}

impl<S, B, ResBody> tower::Service<http::Request<B>> for Authorize<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let caller = request.extensions().get::<ConnectInfo<Peer>>().and_then(|peer| peer.0.identity.clone());
        match self.policy.decide(caller.as_deref(), request.uri().path()) {
            Ok(admitted) => {
                if !admitted.speaks_for_clients {
                    request.headers_mut().remove(CLIENT_ID);
                }
                ResponseFuture::Admitted { inner: self.inner.call(request) }
            }
            Err(refusal) => {
                tracing::warn!(%refusal, "call refused");
                ResponseFuture::Refused { response: Some(tonic::Status::from(&refusal).into_http()) }
            }
        }
    }
}

#[cfg(test)]
mod tests;
