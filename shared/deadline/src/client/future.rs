use std::{
    error::Error as StdError,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderValue, Response};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};
use tonic::{Code, Status, TimeoutExpired};
use tower::BoxError;

use crate::{Hop, LatencyEstimate, Slice, millis};

const GRPC_STATUS: &str = "grpc-status";

pin_project! {
    /// Response future of [`super::ForwardDeadline`].
    #[project = Projection]
    pub enum ResponseFuture<F, B> {
        /// Answered without calling: failed fast, or refused.
        AnsweredHere { response: Option<Response<B>> },
        Untracked { #[pin] inner: F },
        Forwarded {
            #[pin]
            inner: F,
            #[pin]
            expiry: Sleep,
            hop: Arc<Hop>,
            dependency: &'static str,
            slice: Slice,
            sent_at: Instant,
            estimate: Option<Arc<LatencyEstimate>>,
        },
    }
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn answered_here(response: Response<B>) -> Self {
        Self::AnsweredHere {
            response: Some(response),
        }
    }

    pub(super) fn untracked(inner: F) -> Self {
        Self::Untracked { inner }
    }

    /// A call sent at `sent_at` whose caller gives up at `gives_up_at`; its answer's time goes
    /// into `estimate`.
    pub(super) fn forwarded(
        inner: F,
        hop: Arc<Hop>,
        dependency: &'static str,
        slice: Slice,
        (sent_at, gives_up_at): (Instant, Instant),
        estimate: Option<Arc<LatencyEstimate>>,
    ) -> Self {
        Self::Forwarded {
            inner,
            expiry: sleep_until(gives_up_at),
            hop,
            dependency,
            slice,
            sent_at,
            estimate,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Default,
{
    type Output = Result<Response<B>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projection::AnsweredHere { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            Projection::Untracked { inner } => inner.poll(cx).map_err(Into::into),
            Projection::Forwarded {
                inner,
                expiry,
                hop,
                dependency,
                slice,
                sent_at,
                estimate,
            } => {
                // An answer's time, or for a call that ran out, its slice: it took at least that.
                let estimate = estimate.as_deref();
                let record = |took: Duration| {
                    if let Some(estimate) = estimate {
                        estimate.record(Instant::now(), took);
                    }
                };
                let out_of_time = |hop: &Hop| {
                    record(slice.given);
                    let mut response = Status::deadline_exceeded(format!(
                        "{}: {dependency} did not answer within the {} ms it was given",
                        hop.name(),
                        millis(slice.given),
                    ))
                    .into_http();
                    response
                        .headers_mut()
                        .insert(wire::DEADLINE_SLICE, slice.header_value());
                    response
                };
                match inner.poll(cx) {
                    Poll::Ready(Ok(mut response)) => {
                        if let Some(ledger) = response
                            .headers()
                            .get(wire::DEADLINE_LEDGER)
                            .and_then(|v| v.to_str().ok())
                        {
                            hop.record_downstream(ledger.to_owned());
                        }
                        // Read the clock: a timer not yet polled or fired does not report elapsed.
                        if Instant::now() >= expiry.deadline() {
                            relabel_cancelled_as_deadline(&mut response);
                        }
                        if has_code(&response, Code::DeadlineExceeded) {
                            response
                                .headers_mut()
                                .insert(wire::DEADLINE_SLICE, slice.header_value());
                            record(slice.given);
                        } else if !response.headers().contains_key(GRPC_STATUS)
                            || has_code(&response, Code::Ok)
                        {
                            record(sent_at.elapsed());
                        }
                        Poll::Ready(Ok(response))
                    }
                    Poll::Ready(Err(error)) => {
                        let error = error.into();
                        if is_caused_by::<TimeoutExpired>(error.as_ref()) {
                            Poll::Ready(Ok(out_of_time(hop)))
                        } else {
                            Poll::Ready(Err(error))
                        }
                    }
                    Poll::Pending => {
                        if expiry.poll(cx).is_pending() {
                            return Poll::Pending;
                        }
                        Poll::Ready(Ok(out_of_time(hop)))
                    }
                }
            }
        }
    }
}

/// A peer whose own timer fired reports CANCELLED; past our deadline that means DEADLINE_EXCEEDED.
fn relabel_cancelled_as_deadline<B>(response: &mut Response<B>) {
    if has_code(response, Code::Cancelled) {
        let deadline = HeaderValue::from((Code::DeadlineExceeded as i32) as u16);
        response.headers_mut().insert(GRPC_STATUS, deadline);
    }
}

/// Whether a (trailers-only) answer carries `code`.
fn has_code<B>(response: &Response<B>, code: Code) -> bool {
    response
        .headers()
        .get(GRPC_STATUS)
        .and_then(|status| status.to_str().ok()?.parse::<i32>().ok())
        == Some(code as i32)
}

/// Whether `error` or any of its sources is an `E`.
fn is_caused_by<E: StdError + 'static>(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if error.is::<E>() {
            return true;
        }
        current = error.source();
    }
    false
}
