//! A real OTLP/gRPC trace receiver on a free port, keeping what it is sent, so that tests see the
//! spans the services export exactly as a collector would.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, any_value::Value},
    trace::v1::Span,
};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

/// The receiver and everything it has received.
#[derive(Clone)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

#[derive(Clone)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(&self, request: Request<ExportTraceServiceRequest>) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let spans = request.into_inner().resource_spans.into_iter().flat_map(|r| r.scope_spans).flat_map(|s| s.spans);
        self.spans.lock().expect("spans lock").extend(spans);
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

impl OtlpReceiver {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("bound");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let service = TraceServiceServer::new(Collector { spans: spans.clone() });
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming));
        Self { addr, spans }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans received so far of the trace `trace_id` (32 hex digits).
    pub fn trace(&self, trace_id: &str) -> Vec<Span> {
        let id = hex::decode(trace_id).expect("a hex trace id");
        self.spans.lock().expect("spans lock").iter().filter(|span| span.trace_id == id).cloned().collect()
    }
}

/// A span's attribute, as text or number.
pub fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes.iter().find(|kv| kv.key == key).and_then(|kv| kv.value.as_ref()).and_then(|v: &AnyValue| v.value.as_ref())
}

pub fn text_attribute<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attribute(span, key)? {
        Value::StringValue(text) => Some(text),
        _ => None,
    }
}

pub fn number_attribute(span: &Span, key: &str) -> Option<f64> {
    match attribute(span, key)? {
        Value::DoubleValue(number) => Some(*number),
        Value::IntValue(number) => Some(*number as f64),
        _ => None,
    }
}
