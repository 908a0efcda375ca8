//! Counts every request a server answers, by answer code, and times it: in the chain's own
//! metrics, by hop, and in the OpenTelemetry standard duration of its kind (gRPC or HTTP).
//!
//! Labels come from a fixed set: a gRPC method the server does not serve is `_OTHER` (as the
//! OpenTelemetry conventions have it), an HTTP request its route or none. Labelled with the raw
//! path, any caller could make a new series per request, until `/metrics` grew by megabytes and
//! real series fell into the exporter's overflow.

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use axum::extract::MatchedPath;
use http::{Request, Response};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram},
};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower::{Layer, Service};

use super::{name, rpc_attributes};
use crate::{
    attr,
    message::{grpc_method, http_method, is_grpc, status_code, url_scheme},
};

/// The `rpc.service` and `rpc.method` of a method a server does not serve.
const OTHER: &str = "_OTHER";

/// Applies [`RequestMetrics`] for one hop.
#[derive(Debug, Clone)]
pub struct RequestMetricsLayer {
    hop: &'static str,
    /// The paths of the gRPC methods the server serves (`/orders.v1.Orders/CreateOrder`).
    grpc_methods: Arc<HashSet<String>>,
    requests: Counter<u64>,
    duration: Histogram<f64>,
    rpc_duration: Histogram<f64>,
    http_duration: Histogram<f64>,
}

impl RequestMetricsLayer {
    /// For a server that serves the gRPC methods at `grpc_methods` (their paths,
    /// `/orders.v1.Orders/CreateOrder`), and HTTP routes.
    pub fn new(hop: &'static str, grpc_methods: impl IntoIterator<Item = String>) -> Self {
        Self {
            hop,
            grpc_methods: Arc::new(grpc_methods.into_iter().collect()),
            requests: super::counter(name::REQUESTS, "Requests answered, by hop and answer code"),
            duration: super::millisecond_histogram(
                name::REQUEST_DURATION,
                "Time to answer a request",
            ),
            rpc_duration: super::second_histogram(
                name::RPC_SERVER_CALL_DURATION,
                "Duration of the gRPC calls a server answered",
            ),
            http_duration: super::second_histogram(
                name::HTTP_SERVER_REQUEST_DURATION,
                "Duration of the HTTP requests a server answered",
            ),
        }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// Counts and times a server's answers; see the module docs.
#[derive(Debug, Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    layer: RequestMetricsLayer,
}

/// What the standard duration of a request is labelled with, as far as the request tells.
enum Received {
    Grpc {
        service: String,
        method: String,
    },
    Http {
        method: &'static str,
        route: Option<MatchedPath>,
        scheme: &'static str,
    },
}

pin_project! {
    /// Response future of [`RequestMetrics`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        layer: RequestMetricsLayer,
        received: Option<Received>,
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
        if let (Ok(response), Some(received)) = (&result, this.received.take()) {
            let elapsed = this.started.elapsed();
            let code = status_code(response);
            let hop = KeyValue::new("hop", this.layer.hop);
            this.layer
                .requests
                .add(1, &[hop.clone(), KeyValue::new("code", code)]);
            this.layer
                .duration
                .record(elapsed.as_secs_f64() * 1_000.0, &[hop]);
            match received {
                Received::Grpc { service, method } => {
                    let [system, service, method] = rpc_attributes(service, method);
                    let code = KeyValue::new(attr::RPC_GRPC_STATUS_CODE, code);
                    this.layer
                        .rpc_duration
                        .record(elapsed.as_secs_f64(), &[system, service, method, code]);
                }
                Received::Http {
                    method,
                    route,
                    scheme,
                } => {
                    let mut attributes = vec![
                        KeyValue::new(attr::HTTP_REQUEST_METHOD, method),
                        KeyValue::new(attr::HTTP_RESPONSE_STATUS_CODE, code),
                        KeyValue::new(attr::URL_SCHEME, scheme),
                    ];
                    attributes.extend(
                        route.map(|route| {
                            KeyValue::new(attr::HTTP_ROUTE, route.as_str().to_owned())
                        }),
                    );
                    this.layer
                        .http_duration
                        .record(elapsed.as_secs_f64(), &attributes);
                }
            }
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
        let received = if is_grpc(request.headers()) {
            let path = request.uri().path();
            let (service, method) = if self.layer.grpc_methods.contains(path) {
                grpc_method(path)
            } else {
                (OTHER, OTHER)
            };
            Received::Grpc {
                service: service.to_owned(),
                method: method.to_owned(),
            }
        } else {
            let route = request.extensions().get::<MatchedPath>().cloned();
            Received::Http {
                method: http_method(request.method()),
                route,
                scheme: url_scheme(request.uri()),
            }
        };
        ResponseFuture {
            inner: self.inner.call(request),
            layer: self.layer.clone(),
            received: Some(received),
            started: Instant::now(),
        }
    }
}
