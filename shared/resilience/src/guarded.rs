//! The answer of a guard: its refusal at once, or the guarded service's answer.
//!
//! Every guard of the chain (the intake, the bulkhead, the breaker, the quotas, the caller check)
//! either answers a request itself, or lets it through and holds something until the answer: a
//! permit, a place, a verdict to record. A refusal is an answer, never an error, so that callers
//! read it like any other (its status, its pushback). [`Guarded`] is that future, written once;
//! what an admitted request holds says what it does with the answer ([`Held::answered`]), and
//! what it does when the call is abandoned unanswered (its `Drop`).

use std::{
    pin::Pin,
    task::{Context, Poll, ready},
};

use http::Response;
use pin_project_lite::pin_project;

pin_project! {
    /// Response future of a guard: ready at once with its refusal, or the inner service's
    /// answer, shown to what the admitted request held.
    #[project = Projection]
    pub enum Guarded<F, B, H = ()> {
        Refused { response: Option<Response<B>> },
        Admitted { #[pin] inner: F, held: Option<H> },
    }
}

impl<F, B, H> Guarded<F, B, H> {
    /// Answers `response` without calling the inner service.
    pub fn refused(response: Response<B>) -> Self {
        Self::Refused {
            response: Some(response),
        }
    }

    /// The inner service's answer to a request that holds `held` until then.
    pub fn admitted(inner: F, held: H) -> Self {
        Self::Admitted {
            inner,
            held: Some(held),
        }
    }
}

/// What an admitted request holds until its answer.
pub trait Held<B>: Sized {
    /// Sees the answer before it is passed on (to learn from it, or to add headers). What is
    /// held is released when this returns.
    fn answered<E>(self, _answer: &mut Result<Response<B>, E>) {}
}

impl<B> Held<B> for () {}

/// Something held, or nothing (a guard that is turned off).
impl<B, H: Held<B>> Held<B> for Option<H> {
    fn answered<E>(self, answer: &mut Result<Response<B>, E>) {
        if let Some(held) = self {
            held.answered(answer);
        }
    }
}

impl<F, B, E, H> Future for Guarded<F, B, H>
where
    F: Future<Output = Result<Response<B>, E>>,
    H: Held<B>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projection::Refused { response } => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
            Projection::Admitted { inner, held } => {
                let mut answer = ready!(inner.poll(cx));
                if let Some(held) = held.take() {
                    held.answered(&mut answer);
                }
                Poll::Ready(answer)
            }
        }
    }
}
