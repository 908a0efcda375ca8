//! Counts every request a server answers, by answer code, and times it.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{Request, Response};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::name;
use crate::response::status_code;

/// Applies [`RequestMetrics`] for one hop.
#[derive(Debug, Clone)]
pub struct RequestMetricsLayer {
    hop: &'static str,
    requests: Counter<u64>,
    duration: Histogram<f64>,
}

impl RequestMetricsLayer {
    pub fn new(hop: &'static str) -> Self {
        Self {
            hop,
            requests: super::counter(name::REQUESTS, "Requests answered, by hop and answer code"),
            duration: super::millisecond_histogram(name::REQUEST_DURATION, "Time to answer a request"),
        }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics { inner, layer: self.clone() }
    }
}

/// Counts and times a server's answers; see the module docs.
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    layer: RequestMetricsLayer,
}

pin_project! {
    /// Response future of [`RequestMetrics`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        layer: RequestMetricsLayer,
        started: Instant,
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &result {
            let hop = KeyValue::new("hop", this.layer.hop);
            this.layer.requests.add(1, &[hop.clone(), KeyValue::new("code", status_code(response))]);
            this.layer.duration.record(this.started.elapsed().as_secs_f64() * 1_000.0, &[hop]);
        }
        Poll::Ready(result)
    }
}

impl<S, B, ResBody> Service<Request<B>> for RequestMetrics<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        ResponseFuture { inner: self.inner.call(request), layer: self.layer.clone(), started: Instant::now() }
    }
}
