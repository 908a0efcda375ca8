#![doc = include_str!("../README.md")]

pub mod attr;
pub mod metrics;
mod response;
pub mod trace;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, metrics::SdkMeterProvider, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::{
    EnvFilter, Layer,
    filter::{LevelFilter, Targets},
    layer::SubscriberExt,
    reload,
    util::SubscriberInitExt,
};

/// Where traces and metrics go; read from the standard `OTEL_*` variables by
/// [`TelemetrySettings::from_env`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// OTLP/gRPC endpoint of the traces, e.g. `http://127.0.0.1:4317`; `None`: no export.
    pub otlp_endpoint: Option<String>,
    /// OTLP/gRPC endpoint the metrics are pushed to; `None`: only `/metrics` serves them.
    pub otlp_metrics_endpoint: Option<String>,
    /// The `service.name` of exported spans and metrics.
    pub service_name: Option<String>,
}

impl TelemetrySettings {
    /// Traces: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`. Metrics:
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, unless
    /// `OTEL_METRICS_EXPORTER` names another exporter than `otlp` (`none`: a collector that keeps
    /// traces only, such as Jaeger). `OTEL_SERVICE_NAME`; `OTEL_SDK_DISABLED=true` turns all
    /// export off.
    pub fn from_env() -> Self {
        let read = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        let disabled = read("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"));
        let push_metrics = read("OTEL_METRICS_EXPORTER").is_none_or(|exporter| exporter.eq_ignore_ascii_case("otlp"));
        let endpoint = |signal: &str| read(signal).or_else(|| read("OTEL_EXPORTER_OTLP_ENDPOINT")).filter(|_| !disabled);
        Self {
            otlp_endpoint: endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            otlp_metrics_endpoint: endpoint("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").filter(|_| push_metrics),
            service_name: read("OTEL_SERVICE_NAME"),
        }
    }
}

/// Keeps the exporters alive; [`Telemetry::shutdown`] flushes what is buffered.
#[must_use = "dropping the guard without shutdown loses buffered spans"]
#[derive(Debug)]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
    meters: Option<SdkMeterProvider>,
    exporting: bool,
    trace_switch: Option<TraceSwitch>,
}

/// Turns the span layer on or off in a running process.
struct TraceSwitch(Box<dyn Fn(bool) + Send + Sync>);

impl std::fmt::Debug for TraceSwitch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("TraceSwitch")
    }
}

#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter: {0}")]
pub struct TelemetryError(String);

/// Installs logging and metrics, and OTLP export of traces and metrics when configured. A second
/// call in one process (several services in the local stack) installs nothing and returns an
/// inert guard: the first installation serves all. Call it before building the services: an
/// instrument made before it counts into nothing.
pub fn init(default_service_name: &str, settings: &TelemetrySettings) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_target(false).with_filter(filter);
    let service_name = settings.service_name.clone().unwrap_or_else(|| default_service_name.to_owned());
    let resource = Resource::builder().with_service_name(service_name).build();
    let endpoint = settings.otlp_endpoint.as_deref();
    let traces = endpoint.map(|endpoint| trace_provider(endpoint, resource.clone())).transpose()?;
    let (switch, switch_handle) = reload::Layer::new(LevelFilter::TRACE);
    let spans = traces.as_ref().map(|provider| tracing_opentelemetry::layer().with_tracer(provider.tracer("chain")).with_filter(switch));
    if tracing_subscriber::registry().with(quiet_transports()).with(logs).with(spans).try_init().is_err() {
        return Ok(Telemetry { traces: None, meters: None, exporting: false, trace_switch: None });
    }
    let trace_switch = traces.is_some().then(|| {
        TraceSwitch(Box::new(move |on: bool| {
            let _ = switch_handle.reload(if on { LevelFilter::TRACE } else { LevelFilter::OFF });
        }))
    });
    if traces.is_some() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    }
    let meters = metrics::install(resource, settings.otlp_metrics_endpoint.as_deref())?;
    let exporting = endpoint.is_some() || settings.otlp_metrics_endpoint.is_some();
    Ok(Telemetry { traces, meters: Some(meters), exporting, trace_switch })
}

fn trace_provider(endpoint: &str, resource: Resource) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|error| TelemetryError(error.to_string()))?;
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// Switches the transport crates' own spans and events below WARN off for every layer (not just
/// hides them from the exporter): hidden, they would still be the current span while our
/// handlers run, and our spans would lose their parent and start traces of their own.
fn quiet_transports() -> Targets {
    Targets::new()
        .with_default(Level::TRACE)
        .with_targets(["h2", "hyper", "hyper_util", "tonic", "tower", "sqlx", "reqwest"].map(|target| (target, Level::WARN)))
}

impl Telemetry {
    /// Whether this guard owns OTLP exporters (none without an endpoint).
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    /// Stops (or resumes) making spans, as if no exporter were installed: what tracing costs is
    /// then measured in one process, on and off. Metrics go on either way.
    pub fn set_tracing(&self, on: bool) {
        if let Some(TraceSwitch(switch)) = &self.trace_switch {
            switch(on);
        }
    }

    /// Exports what is buffered now, without blocking the runtime.
    pub async fn flush(&self) {
        let (traces, meters) = (self.traces.clone(), self.meters.clone());
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(provider) = traces {
                let _ = provider.force_flush();
            }
            if let Some(provider) = meters {
                let _ = provider.force_flush();
            }
        })
        .await;
    }

    /// Exports what is buffered and stops the exporters, without blocking the runtime.
    pub async fn shutdown(self) {
        let (traces, meters) = (self.traces, self.meters);
        let _ = tokio::task::spawn_blocking(move || {
            if let Some(provider) = traces {
                let _ = provider.shutdown();
            }
            if let Some(provider) = meters {
                let _ = provider.shutdown();
            }
        })
        .await;
    }
}
