//! W3C trace context through gRPC metadata and HTTP headers, by one layer on each side: the
//! server layer continues the caller's trace in a span for the request (and answers with the
//! trace's `traceparent`); the client layer starts a span for the outgoing call and sends its
//! context along. Handlers never touch trace context.
//!
//! The spans follow the OpenTelemetry semantic conventions (see [`crate::attr`]): their kind,
//! their `rpc.*`, `http.*` and `server.*` attributes, and an error status when they failed.
//!
//! The spans are at DEBUG level: with no exporter installed and a quiet log level, they are never
//! created at all.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use axum::extract::MatchedPath;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, Uri};
use opentelemetry::{
    Context as OtelContext, global,
    propagation::{Extractor, Injector},
};
use pin_project_lite::pin_project;
use tower::{Layer, Service};
use tracing::{Instrument, Span, field::Empty, instrument::Instrumented};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{
    attr,
    message::{
        grpc_method, http_method, is_grpc, is_server_error, server_address, status_code, url_scheme,
    },
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
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut HeaderInjector(headers))
    });
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
        Self {
            hop,
            context: service::context(hop),
        }
    }
}

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace {
            inner,
            hop: self.hop,
            context: self.context.clone(),
        }
    }
}

/// Continues the caller's trace in a span for the request; see the module docs.
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
    hop: &'static str,
    context: OtelContext,
}

/// What a span records of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A gRPC server's: its status, an error for the codes that are the server's fault; the trace
    /// context goes back with it.
    GrpcServer,
    /// An HTTP server's: its status, an error for a 5xx; the trace context goes back with it.
    HttpServer,
    /// A client's: the status it got, an error for any but OK, for no answer at all, and for a
    /// call given up before its answer (its deadline passed).
    GrpcClient,
}

pin_project! {
    /// Response future of [`ServerTrace`] and [`ClientTrace`]: records the answer's status on
    /// the span (and, on the server, answers with the trace context).
    pub struct ResponseFuture<F> {
        #[pin]
        inner: Instrumented<F>,
        span: Span,
        answer: Answer,
        answered: bool,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            // A call dropped unanswered was given up by its caller: it failed. A server whose
            // caller went away did not fail, and its span keeps no status.
            if !this.answered && this.answer == Answer::GrpcClient {
                this.span.record("otel.status_code", "error");
            }
        }
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
        *this.answered = true;
        let failed = match (&mut result, *this.answer) {
            (Err(_), _) => true,
            (Ok(response), Answer::HttpServer) => {
                let status = response.status().as_u16();
                this.span
                    .record(attr::HTTP_RESPONSE_STATUS_CODE, i64::from(status));
                status >= 500
            }
            (Ok(response), Answer::GrpcServer) => {
                let code = status_code(response);
                this.span.record(attr::RPC_GRPC_STATUS_CODE, code);
                is_server_error(code)
            }
            (Ok(response), Answer::GrpcClient) => {
                let code = status_code(response);
                this.span.record(attr::RPC_GRPC_STATUS_CODE, code);
                code != 0
            }
        };
        if failed {
            this.span.record("otel.status_code", "error");
        }
        if let (Ok(response), Answer::GrpcServer | Answer::HttpServer) = (&mut result, *this.answer)
        {
            inject(this.span, response.headers_mut());
        }
        Poll::Ready(result)
    }
}

/// The span of a request a hop serves: the fields of every server span, and those of its
/// protocol.
macro_rules! request_span {
    ($hop:expr, $name:expr, $($protocol:tt)*) => {
        tracing::debug_span!(
            "request",
            otel.name = $name,
            otel.kind = "server",
            otel.status_code = Empty,
            hop = $hop,
            $($protocol)*,
            "deadline.received_ms" = Empty,
            "deadline.spent_ms" = Empty,
            "deadline.reserved_ms" = Empty,
            "deadline.forwarded_ms" = Empty,
            "deadline.left_ms" = Empty,
        )
    };
}

/// The name of an HTTP server span: the method and, when a route matched, its template
/// (`POST /v1/orders`, `GET /v1/orders/{order_id}`); never the path, which carries ids.
struct HttpSpanName<'a> {
    method: &'static str,
    route: Option<&'a str>,
}

impl std::fmt::Display for HttpSpanName<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.route {
            Some(route) => write!(formatter, "{} {route}", self.method),
            None => formatter.write_str(self.method),
        }
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
        let (span, answer) = if is_grpc(request.headers()) {
            let path = request.uri().path();
            let (service, method) = grpc_method(path);
            let name = path.strip_prefix('/').unwrap_or(path);
            let span = request_span!(
                self.hop,
                name,
                "rpc.system" = "grpc",
                "rpc.service" = service,
                "rpc.method" = method,
                "rpc.grpc.status_code" = Empty
            );
            (span, Answer::GrpcServer)
        } else {
            let method = http_method(request.method());
            let route = request
                .extensions()
                .get::<MatchedPath>()
                .map(MatchedPath::as_str);
            let name = tracing::field::display(HttpSpanName { method, route });
            let span = request_span!(
                self.hop,
                name,
                "http.request.method" = method,
                "http.route" = route,
                "url.scheme" = url_scheme(request.uri()),
                "http.response.status_code" = Empty
            );
            (span, Answer::HttpServer)
        };
        // Untraced (no exporter, quiet logs): no context to read, nothing to continue.
        if !span.is_disabled() {
            let headers = HeaderExtractor(request.headers());
            let parent = global::get_text_map_propagator(|propagator| {
                propagator.extract_with_context(&self.context, &headers)
            });
            let _ = span.set_parent(parent);
        }
        let inner = span
            .in_scope(|| self.inner.call(request))
            .instrument(span.clone());
        ResponseFuture {
            inner,
            span,
            answer,
            answered: false,
        }
    }
}

/// Applies [`ClientTrace`] toward one dependency.
#[derive(Debug, Clone)]
pub struct ClientTraceLayer {
    peer: &'static str,
    address: Arc<str>,
    port: u16,
}

impl ClientTraceLayer {
    /// Calls to `peer`, dialled at `uri` (its host and port are the spans' `server.address` and
    /// `server.port`).
    pub fn new(peer: &'static str, uri: &Uri) -> Self {
        let (address, port) = server_address(uri);
        Self {
            peer,
            address,
            port,
        }
    }
}

impl<S> Layer<S> for ClientTraceLayer {
    type Service = ClientTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientTrace {
            inner,
            layer: self.clone(),
        }
    }
}

/// Starts a span for an outgoing call and sends its context along; see the module docs.
#[derive(Debug, Clone)]
pub struct ClientTrace<S> {
    inner: S,
    layer: ClientTraceLayer,
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
        let path = request.uri().path();
        let (service, method) = grpc_method(path);
        let span = tracing::debug_span!(
            "call",
            otel.name = path.strip_prefix('/').unwrap_or(path),
            otel.kind = "client",
            otel.status_code = Empty,
            peer = self.layer.peer,
            "rpc.system" = "grpc",
            "rpc.service" = service,
            "rpc.method" = method,
            "server.address" = &*self.layer.address,
            "server.port" = i64::from(self.layer.port),
            "rpc.grpc.status_code" = Empty,
        );
        inject(&span, request.headers_mut());
        let inner = span
            .in_scope(|| self.inner.call(request))
            .instrument(span.clone());
        ResponseFuture {
            inner,
            span,
            answer: Answer::GrpcClient,
            answered: false,
        }
    }
}
