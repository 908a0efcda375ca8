//! What both faces and both APIs stand on: who the client is, an operation on orders under the
//! edge's retry policy, metadata values, and the mark of an answer made from a fallback.

use std::future::Future;

use proto::common::v1::Order;
use resilience::retry::{Call, RetryPolicy};
use tonic::{Request, Response, Status};
use tower::{Layer, retry::RetryLayer, util::BoxCloneSyncService};
use tracing::Instrument;

use crate::error::GatewayError;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub(crate) struct ClientId(pub String);

/// One operation on orders, retried by the edge policy.
pub(crate) type Operation<M, R = Order> = BoxCloneSyncService<Call<M>, Response<R>, Status>;

/// `call` as an operation on orders: each attempt in its own span, the whole under `retry`, with
/// its own estimate of an attempt's time.
pub(crate) fn operation<M, R, F, Fut>(retry: &RetryPolicy, call: F) -> Operation<M, R>
where
    M: Clone + Send + Sync + 'static,
    R: Send + 'static,
    F: Fn(Request<M>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<R>, Status>> + Send + 'static,
{
    let attempt = tower::service_fn(move |call_once: Call<M>| {
        // i64: exported as a number (unsigned fields are exported as text).
        let span = tracing::info_span!(
            "attempt",
            retry.attempt = i64::from(call_once.previous_attempts) + 1
        );
        call(call_once.into_request()).instrument(span)
    });
    BoxCloneSyncService::new(RetryLayer::new(retry.for_operation()).layer(attempt))
}

pub(crate) fn metadata_value(
    value: &str,
) -> Result<tonic::metadata::AsciiMetadataValue, GatewayError> {
    value
        .parse()
        .map_err(|_| GatewayError::field("Idempotency-Key", "must be visible ASCII characters"))
}
