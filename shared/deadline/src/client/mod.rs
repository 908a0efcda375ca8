//! Client side: forward the remaining budget of the hop a call is made under, less its reserve,
//! to one dependency.
//!
//! The layer sits above the channel and reads the caller's [`Hop`] from the call
//! ([`Hop::request`] puts it there). It
//! - plans the slice with the dependency's [`ForwardPolicy`] and fails fast with DEADLINE_EXCEEDED,
//!   without calling, when the slice is below the dependency's minimum, or below what it has
//!   been taking ([`LatencyEstimate`], when given one); marked with
//!   [`wire::DEADLINE_FAILED_FAST`] so that nobody retries it;
//! - sends the slice as `grpc-timeout` (or a shorter one the caller set on the request, which is
//!   kept) and stops waiting when it runs out, answering DEADLINE_EXCEEDED (tonic's channel starts
//!   its own timer from the same header and would answer CANCELLED; that error is relabelled
//!   too). The dependency, whose clock started later, sees the caller leave and drops its work;
//! - names the slice on every DEADLINE_EXCEEDED of a forwarded call ([`wire::DEADLINE_SLICE`]),
//!   so that breakers and the edge's retries judge the expiry by it;
//! - keeps the ledger the dependency returns, so this hop can pass it up;
//! - passes on the edge operation's attempt number (`grpc-previous-rpc-attempts`).
//!
//! A call with no hop but a deadline of its own (a client program's
//! `tonic::Request::set_timeout`) passes through untouched; a call with neither is refused with
//! INTERNAL and a warning that names its method, never sent without a deadline.

mod future;
mod layer;

pub use future::ResponseFuture;
pub use layer::ForwardDeadlineLayer;

use std::{
    sync::Arc,
    task::{Context, Poll},
};

use http::{HeaderValue, Request, Response};
use tokio::time::Instant;
use tonic::{Status, metadata::MetadataValue};
use tower::{BoxError, Service};

use crate::{
    Forward, ForwardPolicy, Hop, LatencyEstimate, Slice, SlowerThanSlice, grpc_timeout,
    hop::Outcome, millis,
};

/// Forwards the deadline to `dependency`; see the module docs.
#[derive(Debug, Clone)]
pub struct ForwardDeadline<S> {
    pub(super) inner: S,
    pub(super) dependency: &'static str,
    pub(super) policy: ForwardPolicy,
    pub(super) estimate: Option<Arc<LatencyEstimate>>,
}

/// A DEADLINE_EXCEEDED answered by `hop` without calling `dependency`, which nobody retries.
fn failed_fast<B: Default>(
    hop: &Hop,
    dependency: &'static str,
    reason: String,
) -> http::Response<B> {
    hop.stats().count(hop.name(), Outcome::FailedFast);
    tracing::debug!(%reason, "failing fast");
    let mut status = Status::deadline_exceeded(reason);
    status.metadata_mut().insert(
        wire::DEADLINE_FAILED_FAST,
        MetadataValue::from_static(hop.name()),
    );
    status
        .metadata_mut()
        .insert(wire::NOT_EXECUTED, MetadataValue::from_static(dependency));
    status.into_http()
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ForwardDeadline<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let Some(hop) = request.extensions().get::<Arc<Hop>>().cloned() else {
            if request.headers().contains_key(wire::GRPC_TIMEOUT) {
                return ResponseFuture::untracked(self.inner.call(request));
            }
            let method = request.uri().path();
            tracing::warn!(
                dependency = self.dependency,
                method,
                "refused a call with no deadline: it was made under no hop (see Hop::request)"
            );
            let status = Status::internal(format!(
                "{method} to {} was refused: it had no deadline to forward",
                self.dependency
            ));
            return ResponseFuture::answered_here(status.into_http());
        };
        let now = Instant::now();
        let remaining = hop.deadline().remaining_at(now);
        let forward = match self.policy.plan_for(hop.name(), self.dependency, remaining) {
            Ok(forward) => forward,
            Err(too_little) => {
                return ResponseFuture::answered_here(failed_fast(
                    &hop,
                    self.dependency,
                    too_little.to_string(),
                ));
            }
        };
        let headers = request.headers_mut();
        // A timeout the caller set on the request (`Request::set_timeout`) is kept when shorter.
        let set_by_caller = headers
            .get(wire::GRPC_TIMEOUT)
            .and_then(|value| grpc_timeout::parse(value.to_str().ok()?).ok());
        let forwarded =
            set_by_caller.map_or(forward.forwarded, |timeout| timeout.min(forward.forwarded));
        if let Some(estimate) = &self.estimate
            && let Err(needed) = estimate.admit(now, forwarded)
        {
            let slower = SlowerThanSlice {
                hop: hop.name().to_owned(),
                dependency: self.dependency.to_owned(),
                estimate: millis(needed),
                percentile: estimate.settings().quantile * 100.0,
                available: millis(forwarded),
            };
            return ResponseFuture::answered_here(failed_fast(
                &hop,
                self.dependency,
                slower.to_string(),
            ));
        }
        hop.record_forward(
            now,
            Forward {
                forwarded,
                ..forward
            },
        );
        let slice = Slice::new(
            forwarded,
            forwarded < remaining.saturating_sub(forward.reserved),
        );
        let timeout = HeaderValue::try_from(grpc_timeout::format(forwarded))
            .expect("grpc-timeout values are ASCII");
        headers.insert(wire::GRPC_TIMEOUT, timeout);
        if hop.previous_attempts() > 0 && !headers.contains_key(wire::PREVIOUS_ATTEMPTS) {
            headers.insert(
                wire::PREVIOUS_ATTEMPTS,
                HeaderValue::from(hop.previous_attempts()),
            );
        }
        ResponseFuture::forwarded(
            self.inner.call(request),
            hop,
            self.dependency,
            slice,
            (now, now + forwarded),
            self.estimate.clone(),
        )
    }
}
