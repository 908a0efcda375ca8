use std::{
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;

pin_project! {
    /// The answer of [`super::Authorize`]: the refusal at once, or the service's answer.
    #[project = Projected]
    pub enum ResponseFuture<F, B> {
        Refused { response: Option<http::Response<B>> },
        Admitted { #[pin] inner: F },
    }
}

impl<F, B, E> Future for ResponseFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projected::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            Projected::Admitted { inner } => inner.poll(cx),
        }
    }
}
