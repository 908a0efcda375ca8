//! W3C trace context through gRPC metadata and HTTP headers, by one layer on each side: the
//! server layer continues the caller's trace in a span for the request (and answers with the
//! trace's `traceparent`); the client layer starts a span for the outgoing call and sends its
//! context along. Handlers never touch trace context.
//!
//! The spans are at DEBUG level: with no exporter installed and a quiet log level, they are never
//! created at all.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use opentelemetry::{
    Context as OtelContext, global,
    propagation::{Extractor, Injector},
};
use pin_project_lite::pin_project;
use tower::{Layer, Service};
use tracing::{Instrument, Span, field::Empty, instrument::Instrumented};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{
    response::{is_grpc, status_code},
    service,
};

/// Reads trace context from headers (gRPC metadata are headers too).
struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// Writes trace context into headers.
struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // An empty `tracestate` says nothing; leaving it out keeps answers clean.
        if value.is_empty() {
            return;
        }
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(key), HeaderValue::try_from(value)) {
            self.0.insert(name, value);
        }
    }
}

fn inject(span: &Span, headers: &mut HeaderMap) {
    if span.is_disabled() {
        return;
    }
    let context = span.context();
    global::get_text_map_propagator(|propagator| propagator.inject_context(&context, &mut HeaderInjector(headers)));
}

/// Makes `span` and everything below it part of `service`, for a service's own work that no
/// request started (a background task), where no server layer names the service: in a process
/// that hosts several services, its spans are then exported under that service's name.
pub fn set_service(span: &Span, service: &'static str) {
    if !span.is_disabled() {
        let _ = span.set_parent(service::context(service));
    }
}

/// Applies [`ServerTrace`] for one hop.
#[derive(Debug, Clone)]
pub struct ServerTraceLayer {
    hop: &'static str,
    /// Where the request's span starts: the hop's service, which the caller's span is added to.
    context: OtelContext,
}

impl ServerTraceLayer {
    pub fn new(hop: &'static str) -> Self {
        Self { hop, context: service::context(hop) }
    }
}

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner, hop: self.hop, context: self.context.clone() }
    }
}

/// Continues the caller's trace in a span for the request; see the module docs.
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
    hop: &'static str,
    context: OtelContext,
}

pin_project! {
    /// Response future of [`ServerTrace`] and [`ClientTrace`]: records the answer's status on
    /// the span (and, on the server, answers with the trace context).
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Instrumented<F>,
        span: Span,
        answer_with_context: bool,
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut result = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &mut result {
            this.span.record(crate::attr::STATUS_CODE, status_code(response));
            if *this.answer_with_context {
                inject(this.span, response.headers_mut());
            }
        }
        Poll::Ready(result)
    }
}

impl<S, B, ResBody> Service<Request<B>> for ServerTrace<S>
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
        // gRPC paths name the method; HTTP paths carry ids, so HTTP spans are named by method.
        let operation = if is_grpc(request.headers()) { request.uri().path() } else { request.method().as_str() };
        let span = tracing::debug_span!(
            "request",
            otel.name = %format!("{} {operation}", self.hop),
            otel.kind = "server",
            hop = self.hop,
            "deadline.received_ms" = Empty,
            "deadline.spent_ms" = Empty,
            "deadline.reserved_ms" = Empty,
            "deadline.forwarded_ms" = Empty,
            "deadline.left_ms" = Empty,
            "rpc.status_code" = Empty,
        );
        // Untraced (no exporter, quiet logs): no context to read, nothing to continue.
        if !span.is_disabled() {
            let headers = HeaderExtractor(request.headers());
            let parent = global::get_text_map_propagator(|propagator| propagator.extract_with_context(&self.context, &headers));
            let _ = span.set_parent(parent);
        }
        let inner = span.in_scope(|| self.inner.call(request)).instrument(span.clone());
        ResponseFuture { inner, span, answer_with_context: true }
    }
}

/// Applies [`ClientTrace`] toward one dependency.
#[derive(Debug, Clone, Copy)]
pub struct ClientTraceLayer {
    peer: &'static str,
}

impl ClientTraceLayer {
    pub fn new(peer: &'static str) -> Self {
        Self { peer }
    }
}

impl<S> Layer<S> for ClientTraceLayer {
    type Service = ClientTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientTrace { inner, peer: self.peer }
    }
}

/// Starts a span for an outgoing call and sends its context along; see the module docs.
#[derive(Debug, Clone)]
pub struct ClientTrace<S> {
    inner: S,
    peer: &'static str,
}

impl<S, B, ResBody> Service<Request<B>> for ClientTrace<S>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let span = tracing::debug_span!(
            "call",
            otel.name = %format!("{} {}", self.peer, request.uri().path()),
            otel.kind = "client",
            peer = self.peer,
            "rpc.status_code" = Empty,
        );
        inject(&span, request.headers_mut());
        let inner = span.in_scope(|| self.inner.call(request)).instrument(span.clone());
        ResponseFuture { inner, span, answer_with_context: false }
    }
}
