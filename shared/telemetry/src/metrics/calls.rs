//! Times every gRPC call a client makes, in the OpenTelemetry standard duration
//! `rpc.client.call.duration`.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::{Request, Response, Uri};
use opentelemetry::{KeyValue, metrics::Histogram};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::{name, rpc_attributes};
use crate::{
    attr,
    message::{grpc_method, server_address, status_code},
};

/// Applies [`CallMetrics`] to the calls to one dependency.
#[derive(Debug, Clone)]
pub struct CallMetricsLayer {
    address: Arc<str>,
    port: u16,
    duration: Histogram<f64>,
}

impl CallMetricsLayer {
    /// Calls dialled at `uri` (its host and port label them as `server.address` and
    /// `server.port`).
    pub fn new(uri: &Uri) -> Self {
        let (address, port) = server_address(uri);
        Self {
            address,
            port,
            duration: super::second_histogram(
                name::RPC_CLIENT_CALL_DURATION,
                "Duration of the gRPC calls a client made",
            ),
        }
    }
}

impl<S> Layer<S> for CallMetricsLayer {
    type Service = CallMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CallMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// Times a client's calls; see the module docs.
#[derive(Debug, Clone)]
pub struct CallMetrics<S> {
    inner: S,
    layer: CallMetricsLayer,
}

pin_project! {
    /// Response future of [`CallMetrics`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        layer: CallMetricsLayer,
        method: Option<(String, String)>,
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
        if let Some((service, method)) = this.method.take() {
            let [system, service, method] = rpc_attributes(service, method);
            // A call that got no answer has no status: what failed is the transport.
            let outcome = match &result {
                Ok(response) => KeyValue::new(attr::RPC_GRPC_STATUS_CODE, status_code(response)),
                Err(_) => KeyValue::new(attr::ERROR_TYPE, "transport"),
            };
            let address = KeyValue::new(attr::SERVER_ADDRESS, this.layer.address.clone());
            let port = KeyValue::new(attr::SERVER_PORT, i64::from(this.layer.port));
            this.layer.duration.record(
                this.started.elapsed().as_secs_f64(),
                &[system, service, method, outcome, address, port],
            );
        }
        Poll::Ready(result)
    }
}

impl<S, B, ResBody> Service<Request<B>> for CallMetrics<S>
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
        let (service, method) = grpc_method(request.uri().path());
        let method = Some((service.to_owned(), method.to_owned()));
        ResponseFuture {
            inner: self.inner.call(request),
            layer: self.layer.clone(),
            method,
            started: Instant::now(),
        }
    }
}
