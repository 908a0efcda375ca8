//! Which service a span belongs to. A process that hosts several services (`stack up`) exports
//! each one's spans under its own `service.name`, as if each ran alone: one tracer provider per
//! service, each with its own resource, and one tracer in front of them ([`ServiceTracers`]) that
//! sends each span to its service's provider.
//!
//! Why the OpenTelemetry context? A span's service has to reach every span below it: the server
//! span of a request names its hop, and the request's client spans, its `attempt` spans and
//! whatever else is made inside it are children of that span. The context a span starts in is
//! the one thing a child gets from its parent, in this task or another, so the service's name
//! rides in it from the span that starts the service's part of a trace down to the last of its
//! descendants. Trace context is not affected: only `traceparent` crosses the wire, never this.

use opentelemetry::{
    Context,
    trace::{SpanBuilder, Tracer},
};
use opentelemetry_sdk::trace::SdkTracer;

/// A service as its telemetry names it: the `service.name` and `service.version` of its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Service {
    pub name: &'static str,
    pub version: &'static str,
}

/// The service that a context's spans belong to.
#[derive(Debug, Clone, Copy)]
struct InService(&'static str);

/// An empty context of `service`: the parent from which a span starts that service's part of a
/// trace (the server layer adds the caller's span to it, when there is one).
pub(crate) fn context(service: &'static str) -> Context {
    Context::new().with_value(InService(service))
}

/// The tracer of the process: each span goes to the tracer of the service named in the context
/// it starts in, or to the process's own tracer when that names none (or one the process does not
/// host: a service run alone exports everything as itself).
#[derive(Debug)]
pub(crate) struct ServiceTracers {
    process: SdkTracer,
    services: Vec<(&'static str, SdkTracer)>,
}

impl ServiceTracers {
    pub(crate) fn new(process: SdkTracer, services: Vec<(&'static str, SdkTracer)>) -> Self {
        Self { process, services }
    }

    fn tracer(&self, parent: &Context) -> &SdkTracer {
        let service = parent
            .get::<InService>()
            .and_then(|InService(name)| self.services.iter().find(|(service, _)| service == name));
        service.map_or(&self.process, |(_, tracer)| tracer)
    }
}

impl Tracer for ServiceTracers {
    type Span = opentelemetry_sdk::trace::Span;

    fn build_with_context(&self, builder: SpanBuilder, parent_cx: &Context) -> Self::Span {
        self.tracer(parent_cx)
            .build_with_context(builder, parent_cx)
    }
}
