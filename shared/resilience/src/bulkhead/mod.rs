//! A bulkhead per recipient: at most `max_concurrent` calls in flight to one dependency.
//!
//! Why reject instead of queueing? A call that waits behind slow ones holds its caller's time and
//! memory while its deadline runs out; under a slow dependency the queue grows until everything
//! behind it is slow too. Rejecting the call above the limit at once keeps the capacity of the
//! rest of the service (other dependencies, reads) untouched and tells the caller immediately.
//! tower's `ConcurrencyLimit` waits instead, so a semaphore's `try_acquire` is used here.

mod layer;

pub use layer::BulkheadLayer;

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use telemetry::{
    attr,
    metrics::{self, Counter, KeyValue},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Status, metadata::MetadataValue};
use tower::{BoxError, Service};

/// Metadata marking an answer given by a full bulkhead; its value names the dependency.
pub use wire::BULKHEAD_FULL as BULKHEAD_FULL_HEADER;

/// The limit was reached: the call was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency}: {limit} calls already in flight (bulkhead full); not calling")]
pub struct BulkheadFull {
    pub dependency: &'static str,
    pub limit: u32,
}

impl From<BulkheadFull> for Status {
    fn from(full: BulkheadFull) -> Self {
        let mut status = Status::unavailable(full.to_string());
        status.metadata_mut().insert(BULKHEAD_FULL_HEADER, MetadataValue::from_static(full.dependency));
        status.metadata_mut().insert(wire::NOT_EXECUTED, MetadataValue::from_static(full.dependency));
        status
    }
}

/// The permits of one dependency, shared by every clone of its service.
#[derive(Debug)]
pub struct Bulkhead {
    dependency: &'static str,
    limit: u32,
    permits: Arc<Semaphore>,
    rejected: AtomicU64,
    rejections: Counter<u64>,
    /// The calling hop and the dependency, labelling the rejections.
    labels: [KeyValue; 2],
}

/// A copy of a bulkhead's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BulkheadStats {
    pub limit: u32,
    pub in_flight: u32,
    pub rejected: u64,
}

impl Bulkhead {
    /// The bulkhead of `hop`'s calls to `dependency`.
    pub fn new(hop: &'static str, dependency: &'static str, limit: u32) -> Arc<Self> {
        Arc::new(Self {
            dependency,
            limit,
            permits: Arc::new(Semaphore::new(limit as usize)),
            rejected: AtomicU64::new(0),
            rejections: metrics::counter(metrics::name::BULKHEAD_REJECTIONS, "Calls a full bulkhead refused"),
            labels: [KeyValue::new(attr::HOP, hop), KeyValue::new(attr::PEER, dependency)],
        })
    }

    pub fn stats(&self) -> BulkheadStats {
        BulkheadStats {
            limit: self.limit,
            in_flight: self.limit - self.permits.available_permits() as u32,
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }
}

/// Limits calls to one dependency with its [`Bulkhead`].
#[derive(Debug, Clone)]
pub struct BulkheadService<S> {
    inner: S,
    bulkhead: Arc<Bulkhead>,
}

impl<S> BulkheadService<S> {
    pub fn new(inner: S, bulkhead: Arc<Bulkhead>) -> Self {
        Self { inner, bulkhead }
    }
}

pin_project! {
    /// Response future of [`BulkheadService`]: holds the permit until the call ends.
    #[project = Projection]
    pub enum ResponseFuture<F, B> {
        Rejected { response: Option<Response<B>> },
        Admitted { #[pin] inner: F, permit: OwnedSemaphorePermit },
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BulkheadService<S>
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

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.bulkhead.permits.clone().try_acquire_owned() {
            Ok(permit) => ResponseFuture::Admitted { inner: self.inner.call(request), permit },
            Err(_) => {
                self.bulkhead.rejected.fetch_add(1, Ordering::Relaxed);
                self.bulkhead.rejections.add(1, &self.bulkhead.labels);
                let full = BulkheadFull { dependency: self.bulkhead.dependency, limit: self.bulkhead.limit };
                tracing::debug!(peer = full.dependency, bulkhead.limit = i64::from(full.limit), "bulkhead rejected a call");
                ResponseFuture::Rejected { response: Some(Status::from(full).into_http()) }
            }
        }
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
            Projection::Admitted { inner, .. } => inner.poll(cx).map_err(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{ServiceExt, service_fn};

    #[tokio::test]
    async fn calls_above_the_limit_are_rejected_at_once_and_counted() {
        let (release, released) = tokio::sync::watch::channel(false);
        let slow = service_fn(move |_: Request<String>| {
            let mut released = released.clone();
            async move {
                released.wait_for(|done| *done).await.expect("sender alive");
                Ok::<_, BoxError>(Response::new("done".to_owned()))
            }
        });
        let bulkhead = Bulkhead::new("payment", "bank-mock", 2);
        let service = BulkheadService::new(slow, bulkhead.clone());
        // Two calls that take both permits and wait: polled once, so that they are in flight.
        let mut first = Box::pin(service.clone().oneshot(Request::new(String::new())));
        let mut second = Box::pin(service.clone().oneshot(Request::new(String::new())));
        for call in [&mut first, &mut second] {
            assert!(futures::FutureExt::now_or_never(call.as_mut()).is_none());
        }
        assert_eq!(bulkhead.stats().in_flight, 2);

        // The third is answered on its first poll: rejected, never queued.
        let rejected = futures::FutureExt::now_or_never(service.clone().oneshot(Request::new(String::new()))).expect("rejected at once").unwrap();
        assert_eq!(rejected.headers()["grpc-status"], "14");
        assert_eq!(rejected.headers()[BULKHEAD_FULL_HEADER], "bank-mock");
        assert_eq!(bulkhead.stats(), BulkheadStats { limit: 2, in_flight: 2, rejected: 1 });

        release.send(true).unwrap();
        let (first, second) =
            tokio::time::timeout(std::time::Duration::from_secs(5), futures::future::join(first, second)).await.expect("released calls end");
        first.unwrap();
        second.unwrap();
        assert_eq!(bulkhead.stats().in_flight, 0, "permits return when calls end");
    }
}
