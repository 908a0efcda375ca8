use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep, sleep_until};

use super::Protocol;
use telemetry::attr;

use crate::{Hop, hop::Outcome, millis};

pin_project! {
    #[project = StateProjection]
    enum State<F, B> {
        Rejected { response: Option<Response<B>> },
        Running {
            #[pin]
            inner: F,
            #[pin]
            expiry: Sleep,
            hop: Arc<Hop>,
        },
    }
}

pin_project! {
    /// Response future of [`super::DeadlineService`]: the handler raced against the deadline.
    pub struct ResponseFuture<F, P, B> {
        #[pin]
        state: State<F, B>,
        protocol: Option<P>,
        answered: bool,
    }

    impl<F, P, B> PinnedDrop for ResponseFuture<F, P, B> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped unanswered: the caller went away and its work stops here with the future.
            if let (false, StateProjection::Running { hop, .. }) = (this.answered, this.project().state.project()) {
                hop.stats().count(hop.name(), Outcome::Abandoned);
            }
        }
    }
}

impl<F, P, B> ResponseFuture<F, P, B> {
    pub(super) fn rejected(response: Response<B>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
            protocol: None,
            answered: false,
        }
    }

    pub(super) fn running(inner: F, hop: Arc<Hop>, protocol: P) -> Self {
        let expiry = sleep_until(hop.deadline().expires_at());
        Self {
            state: State::Running { inner, expiry, hop },
            protocol: Some(protocol),
            answered: false,
        }
    }
}

impl<F, P, B, E> Future for ResponseFuture<F, P, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    P: Protocol,
    B: Default + From<String>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (inner, expiry, hop) = match this.state.project() {
            StateProjection::Rejected { response } => {
                *this.answered = true;
                return Poll::Ready(Ok(response.take().expect("polled after completion")));
            }
            StateProjection::Running { inner, expiry, hop } => (inner, expiry, hop),
        };
        let protocol = this
            .protocol
            .as_ref()
            .expect("running futures keep their protocol");
        // The handler is polled first: an answer completed in the same instant the deadline passes
        // is returned (the work is done; dropping it helps nobody) and counted as finished late.
        let result = match inner.poll(cx) {
            Poll::Ready(result) => {
                let now = Instant::now();
                let late = hop.deadline().is_expired_at(now);
                if late {
                    hop.stats().count(hop.name(), Outcome::FinishedLate);
                }
                record_slice(hop, now);
                result.map(|mut response| {
                    let ledger = hop.ledger_at(now);
                    hop.stats()
                        .remember(if late { "finished_late" } else { "in_time" }, &ledger);
                    protocol.attach_ledger(ledger, &mut response);
                    response
                })
            }
            Poll::Pending => {
                if expiry.poll(cx).is_pending() {
                    return Poll::Pending;
                }
                hop.stats().count(hop.name(), Outcome::Expired);
                tracing::debug!(hop = hop.name(), budget_ms = ?hop.deadline().budget(), "deadline exceeded");
                let now = Instant::now();
                record_slice(hop, now);
                let mut response = protocol.expired(hop);
                let ledger = hop.ledger_at(now);
                hop.stats().remember("expired", &ledger);
                protocol.attach_ledger(ledger, &mut response);
                Ok(response)
            }
        };
        *this.answered = true;
        Poll::Ready(result)
    }
}

/// The budget left in the hop's metrics, and its slice as attributes of the current span (the
/// request's, when traced).
fn record_slice(hop: &Hop, now: Instant) {
    hop.stats()
        .record_slack(hop.name(), hop.deadline().remaining_at(now));
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    let entry = hop.entry_at(now);
    span.record(attr::DEADLINE_RECEIVED_MS, millis(entry.received));
    span.record(attr::DEADLINE_SPENT_MS, millis(entry.spent));
    span.record(attr::DEADLINE_RESERVED_MS, millis(entry.reserved));
    span.record(attr::DEADLINE_FORWARDED_MS, millis(entry.forwarded));
    span.record(attr::DEADLINE_LEFT_MS, millis(entry.left));
}
