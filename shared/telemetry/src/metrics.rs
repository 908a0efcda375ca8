//! The chain's metrics: OpenTelemetry instruments, read in Prometheus text on `/metrics` and, given
//! an OTLP endpoint, pushed over OTLP as well.
//!
//! Components count what they do through the process's global meter ([`meter`]), the idiomatic
//! OpenTelemetry way: a component needs no handle passed down to it, and where no meter provider
//! is installed (unit tests) its instruments are no-ops. [`install`] (called by [`crate::init`])
//! puts in a provider whose Prometheus reader is pull-only: no task and no export until someone
//! asks for `/metrics`. The series of servers and guards are labelled with their hop (and the
//! dependency), so the one-process stack, whose four services share one provider, still tells
//! them apart; retries and fallbacks happen at the gateway alone.
//!
//! The names are in [`name`]; the Prometheus form replaces dots with underscores, adds the unit
//! (`_milliseconds`) and ends counters in `_total`.

mod calls;
mod requests;

pub use calls::{CallMetrics, CallMetricsLayer};
pub use opentelemetry::{
    KeyValue,
    metrics::{Counter, Gauge, Histogram, Meter},
};
pub use requests::{RequestMetrics, RequestMetricsLayer};

use std::sync::OnceLock;

use opentelemetry_sdk::{
    Resource,
    metrics::{PeriodicReader, SdkMeterProvider},
};

use crate::{Otlp, TelemetryError};

/// Names of the chain's instruments, in one place so that dashboards and tests agree.
pub mod name {
    /// Requests a server answered, by hop and answer code (gRPC status, or HTTP status at the
    /// gateway's HTTP face, where 429 and 5xx are then told apart).
    pub const REQUESTS: &str = "chain.requests";
    /// Time from receiving a request to answering it, by hop (ms).
    pub const REQUEST_DURATION: &str = "chain.request.duration";
    /// Budget left when a hop answered (0 when its deadline passed), by hop (ms): the slack the
    /// deadline had; a hop whose slack sits near zero is the one that runs out first.
    pub const DEADLINE_SLACK: &str = "chain.deadline.slack";
    /// Requests that ran into their deadline, by hop and `outcome`: `expired` (answered
    /// DEADLINE_EXCEEDED), `finished_late`, `abandoned` (the caller went away), `failed_fast` (a
    /// downstream call not made for want of budget).
    pub const DEADLINE_OUTCOMES: &str = "chain.deadline.outcomes";
    /// Attempts beyond the first: the gateway's retries of calls to orders, the only retries in
    /// the chain (the per-hop retries of the stack's comparison chain are not counted here).
    pub const RETRIES: &str = "chain.retry.retries";
    /// Why operations stopped being retried, by `reason` (`budget`: the retry budget was
    /// exhausted).
    pub const RETRY_STOPS: &str = "chain.retry.stops";
    /// A breaker's position, by calling `hop` and `peer` (the dependency): 0 closed, 1 half-open,
    /// 2 open.
    pub const BREAKER_STATE: &str = "chain.breaker.state";
    /// Breaker state changes, by `hop`, `peer` and the position entered (`to`).
    pub const BREAKER_TRANSITIONS: &str = "chain.breaker.transitions";
    /// Calls an open breaker answered without calling, by `hop` and `peer`.
    pub const BREAKER_REJECTIONS: &str = "chain.breaker.rejections";
    /// Calls a full bulkhead refused, by `hop` and `peer`.
    pub const BULKHEAD_REJECTIONS: &str = "chain.bulkhead.rejections";
    /// Requests refused for a quota, by `scope` (`client`: a client over its quota at the edge,
    /// answered 429; `dependency`: a call `hop` held back to keep a dependency's quota) and
    /// `name` (the client or the dependency).
    pub const RATE_LIMIT_REJECTIONS: &str = "chain.rate_limit.rejections";
    /// Requests a server refused because it was working on as many as it takes, by intake.
    pub const LOAD_SHED_REJECTIONS: &str = "chain.load_shed.rejections";
    /// Answers made from a fallback, by `kind` (`stale_copy`, `stale_rate`, `popular`).
    pub const FALLBACKS: &str = "chain.fallbacks";

    /// The OpenTelemetry standard duration of the HTTP requests a server answered (s), by
    /// `http.request.method`, `http.route`, `http.response.status_code` and `url.scheme`.
    pub use opentelemetry_semantic_conventions::metric::HTTP_SERVER_REQUEST_DURATION;
    /// The OpenTelemetry standard duration of the gRPC calls a server answered (s), by
    /// `rpc.system`, `rpc.service`, `rpc.method` and `rpc.grpc.status_code`.
    pub const RPC_SERVER_CALL_DURATION: &str = "rpc.server.call.duration";
    /// The OpenTelemetry standard duration of the gRPC calls a client made (s), by the same and
    /// `server.address` and `server.port`.
    pub const RPC_CLIENT_CALL_DURATION: &str = "rpc.client.call.duration";
}

/// Histogram bounds for milliseconds: fine below 10 ms, where a healthy chain answers, and up to
/// the longest deadline.
const MILLISECOND_BOUNDS: [f64; 15] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1_000.0, 2_000.0, 5_000.0, 10_000.0,
    30_000.0,
];

/// Histogram bounds for seconds, as the semantic conventions advise for the standard durations.
const SECOND_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

static REGISTRY: OnceLock<prometheus::Registry> = OnceLock::new();

/// The meter every component of the chain counts through.
pub fn meter() -> Meter {
    opentelemetry::global::meter("chain")
}

/// A histogram of milliseconds named `name`.
pub fn millisecond_histogram(name: &'static str, description: &'static str) -> Histogram<f64> {
    meter()
        .f64_histogram(name)
        .with_unit("ms")
        .with_description(description)
        .with_boundaries(MILLISECOND_BOUNDS.to_vec())
        .build()
}

/// A histogram of seconds named `name`: a standard duration.
pub fn second_histogram(name: &'static str, description: &'static str) -> Histogram<f64> {
    meter()
        .f64_histogram(name)
        .with_unit("s")
        .with_description(description)
        .with_boundaries(SECOND_BOUNDS.to_vec())
        .build()
}

/// The `rpc.*` attributes of a gRPC call's standard duration, but its status.
fn rpc_attributes(service: String, method: String) -> [KeyValue; 3] {
    [
        KeyValue::new(crate::attr::RPC_SYSTEM, "grpc"),
        KeyValue::new(crate::attr::RPC_SERVICE, service),
        KeyValue::new(crate::attr::RPC_METHOD, method),
    ]
}

/// A counter named `name`.
pub fn counter(name: &'static str, description: &'static str) -> Counter<u64> {
    meter()
        .u64_counter(name)
        .with_description(description)
        .build()
}

/// Installs the global meter provider: Prometheus always, OTLP pushed every
/// `OTEL_METRIC_EXPORT_INTERVAL` ms (default 60 s) when `otlp` is given.
pub(crate) fn install(
    resource: Resource,
    otlp: Option<&Otlp>,
) -> Result<SdkMeterProvider, TelemetryError> {
    let registry = REGISTRY.get_or_init(prometheus::Registry::new).clone();
    let prometheus = opentelemetry_prometheus::exporter()
        .with_registry(registry)
        .scope_info_enabled(false)
        .build()
        .map_err(|error| TelemetryError(error.to_string()))?;
    let mut provider = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(prometheus);
    if let Some(otlp) = otlp {
        provider = provider.with_reader(PeriodicReader::builder(otlp.metric_exporter()?).build());
    }
    let provider = provider.build();
    opentelemetry::global::set_meter_provider(provider.clone());
    Ok(provider)
}

/// The metrics in Prometheus text format (empty before [`crate::init`]).
pub fn render() -> String {
    let Some(registry) = REGISTRY.get() else {
        return String::new();
    };
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap_or_else(|error| format!("# metrics cannot be encoded: {error}\n"))
}

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
