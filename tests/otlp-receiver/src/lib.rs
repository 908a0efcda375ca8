//! A real OTLP receiver of traces and metrics, keeping what it is sent, so that tests see the
//! spans and metrics the services export exactly as a collector would: in-process on a free port
//! for the end-to-end tests (OTLP/gRPC, in plain text or over TLS, or OTLP/HTTP with protobuf
//! bodies), and as its own program (`otlp-receiver`) in the compose test stack, where no collector
//! image can be had.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{StatusCode, header},
    routing::post,
};
use opentelemetry_proto::tonic::{
    collector::{
        metrics::v1::{
            ExportMetricsServiceRequest, ExportMetricsServiceResponse,
            metrics_service_server::{MetricsService, MetricsServiceServer},
        },
        trace::v1::{
            ExportTraceServiceRequest, ExportTraceServiceResponse,
            trace_service_server::{TraceService, TraceServiceServer},
        },
    },
    common::v1::{AnyValue, KeyValue, any_value::Value},
    metrics::v1::Metric,
    resource::v1::Resource,
    trace::v1::Span,
};
use prost::Message;
use tokio::net::TcpListener;
use tonic::{
    Request, Response, Status,
    transport::{Identity, ServerTlsConfig},
};

/// A span with the resource it came with: the service that exported it.
pub type ExportedSpan = (Arc<Resource>, Span);

/// The receiver and everything it has received.
#[derive(Clone)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    received: Collector,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ExportedSpan>>>,
    metrics: Arc<Mutex<Vec<Metric>>>,
    /// Print a line per span received (the compose stack's receiver, read from its log).
    echo: bool,
}

impl Collector {
    fn keep_spans(&self, request: ExportTraceServiceRequest) {
        for exported in request.resource_spans {
            let resource = Arc::new(exported.resource.unwrap_or_default());
            let spans: Vec<Span> = exported
                .scope_spans
                .into_iter()
                .flat_map(|s| s.spans)
                .collect();
            if self.echo {
                let service = service_name(&resource);
                for span in &spans {
                    println!(
                        "span trace_id={} service={service} name={:?}",
                        hex::encode(&span.trace_id),
                        span.name
                    );
                }
            }
            self.spans
                .lock()
                .expect("spans lock")
                .extend(spans.into_iter().map(|span| (resource.clone(), span)));
        }
    }

    fn keep_metrics(&self, request: ExportMetricsServiceRequest) {
        let metrics = request
            .resource_metrics
            .into_iter()
            .flat_map(|r| r.scope_metrics)
            .flat_map(|s| s.metrics);
        self.metrics.lock().expect("metrics lock").extend(metrics);
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.keep_spans(request.into_inner());
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.keep_metrics(request.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse {
            partial_success: None,
        }))
    }
}

/// An OTLP/HTTP export: the body decoded as `M`, kept by `keep`; 400 for a body that is not one.
fn http_export<M: Message + Default>(
    body: &[u8],
    keep: impl FnOnce(M),
) -> (StatusCode, [(header::HeaderName, &'static str); 1]) {
    let content_type = [(header::CONTENT_TYPE, "application/x-protobuf")];
    match M::decode(body) {
        Ok(message) => {
            keep(message);
            (StatusCode::OK, content_type)
        }
        Err(_) => (StatusCode::BAD_REQUEST, content_type),
    }
}

impl OtlpReceiver {
    /// A receiver on a free loopback port, keeping what it is sent.
    pub async fn start() -> Self {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), false)
            .await
            .expect("a free loopback port")
    }

    /// A receiver on `addr`, also printing a line per span when `echo` is set.
    pub async fn start_on(addr: SocketAddr, echo: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let received = Collector {
            echo,
            ..Collector::default()
        };
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(received.clone()))
                .add_service(MetricsServiceServer::new(received.clone()))
                .serve_with_incoming(incoming),
        );
        Ok(Self { addr, received })
    }

    /// A receiver on a free loopback port speaking OTLP/gRPC over TLS, with the certificate and
    /// key in `cert_pem` and `key_pem`.
    pub async fn start_tls(cert_pem: &[u8], key_pem: &[u8]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let addr = listener.local_addr().expect("bound");
        let received = Collector::default();
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
        let mut server = tonic::transport::Server::builder()
            .tls_config(tls)
            .expect("a TLS configuration");
        tokio::spawn(
            server
                .add_service(TraceServiceServer::new(received.clone()))
                .add_service(MetricsServiceServer::new(received.clone()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Self { addr, received }
    }

    /// A receiver on a free loopback port speaking OTLP/HTTP with protobuf bodies
    /// (`POST /v1/traces`, `POST /v1/metrics`).
    pub async fn start_http() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let addr = listener.local_addr().expect("bound");
        let received = Collector::default();
        let app = Router::new()
            .route(
                "/v1/traces",
                post(
                    |State(collector): State<Collector>, body: Bytes| async move {
                        http_export(&body, |request| collector.keep_spans(request))
                    },
                ),
            )
            .route(
                "/v1/metrics",
                post(
                    |State(collector): State<Collector>, body: Bytes| async move {
                        http_export(&body, |request| collector.keep_metrics(request))
                    },
                ),
            )
            .with_state(received.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, received }
    }

    /// Its address, as `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The spans received so far of the trace `trace_id` (32 hex digits).
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        self.trace_by_resource(trace_id)
            .into_iter()
            .map(|(_, span)| span)
            .collect()
    }

    /// [`OtlpReceiver::trace`], each span with the resource it was exported with.
    pub fn trace_by_resource(&self, trace_id: &str) -> Vec<ExportedSpan> {
        let id = hex::decode(trace_id).expect("a hex trace id");
        self.received
            .spans
            .lock()
            .expect("spans lock")
            .iter()
            .filter(|(_, span)| span.trace_id == id)
            .cloned()
            .collect()
    }

    /// Spans received so far, of every trace.
    pub fn span_count(&self) -> usize {
        self.received.spans.lock().expect("spans lock").len()
    }

    /// The names of the metrics received so far.
    pub fn metric_names(&self) -> Vec<String> {
        self.received
            .metrics
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|metric| metric.name.clone())
            .collect()
    }
}

/// A span's attribute, as text or number.
pub fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    find(&span.attributes, key)
}

fn find<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v: &AnyValue| v.value.as_ref())
}

fn text(value: &Value) -> Option<&str> {
    match value {
        Value::StringValue(text) => Some(text),
        _ => None,
    }
}

pub fn text_attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    attribute(span, key).and_then(text)
}

/// A resource's attribute as text, such as `service.version`.
pub fn resource_text<'a>(resource: &'a Resource, key: &str) -> Option<&'a str> {
    find(&resource.attributes, key).and_then(text)
}

/// The `service.name` a resource names, or nothing.
pub fn service_name(resource: &Resource) -> &str {
    resource_text(resource, "service.name").unwrap_or_default()
}

pub fn number_attribute(span: &Span, key: &str) -> Option<f64> {
    match attribute(span, key)? {
        Value::DoubleValue(number) => Some(*number),
        Value::IntValue(number) => Some(*number as f64),
        _ => None,
    }
}
