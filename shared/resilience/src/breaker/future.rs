use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tonic::Code;
use tower::BoxError;

use super::{Breaker, Outcome, state::Admission};

pin_project! {
    /// Response future of [`super::BreakerService`]: records the call's outcome when it ends.
    #[project = Projection]
    pub enum ResponseFuture<F, B> {
        Rejected { response: Option<Response<B>> },
        Admitted {
            #[pin]
            inner: F,
            verdict: Option<Verdict>,
        },
    }

    impl<F, B> PinnedDrop for ResponseFuture<F, B> {
        fn drop(this: Pin<&mut Self>) {
            // Abandoned by our caller before the answer: nothing learned about the dependency.
            if let Projection::Admitted { verdict: Some(verdict), .. } = this.project() {
                verdict.breaker.record(verdict.admission, Outcome::Ignored);
            }
        }
    }
}

/// What is needed to record the call's outcome, once.
pub struct Verdict {
    breaker: Arc<Breaker>,
    admission: Admission,
    started: Instant,
}

impl<F, B> ResponseFuture<F, B> {
    pub(super) fn rejected(response: Response<B>) -> Self {
        Self::Rejected { response: Some(response) }
    }

    pub(super) fn admitted(inner: F, breaker: Arc<Breaker>, admission: Admission) -> Self {
        Self::Admitted { inner, verdict: Some(Verdict { breaker, admission, started: Instant::now() }) }
    }
}

/// The outcome of an answer, from its gRPC status (unary failures arrive as trailers-only
/// answers, with the status in the headers).
fn classify<B>(response: &Response<B>) -> Outcome {
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<i32>().ok())
        .map_or(Code::Ok, Code::from_i32);
    if code != Code::Ok && response.headers().contains_key(super::RELAYED_HEADER) {
        return Outcome::Ignored;
    }
    match code {
        Code::ResourceExhausted => Outcome::Ignored,
        Code::DeadlineExceeded if response.headers().contains_key(deadline::FAILED_FAST_HEADER) => Outcome::Ignored,
        Code::Unavailable | Code::DeadlineExceeded | Code::Internal | Code::Unknown | Code::DataLoss => Outcome::Failure,
        _ => Outcome::Success,
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<B>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projection::Rejected { response } => Poll::Ready(Ok(response.take().expect("polled after completion"))),
            Projection::Admitted { inner, verdict } => {
                let result = match inner.poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(result) => result.map_err(Into::into),
                };
                if let Some(Verdict { breaker, admission, started }) = verdict.take() {
                    let outcome = match &result {
                        Ok(response) => match classify(response) {
                            Outcome::Success if started.elapsed() > breaker.slow_call => Outcome::Slow,
                            outcome => outcome,
                        },
                        Err(_) => Outcome::Failure,
                    };
                    breaker.record(admission, outcome);
                }
                Poll::Ready(result)
            }
        }
    }
}
