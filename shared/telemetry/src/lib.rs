//! Logs and traces for every service, set up by one call.
//!
//! - Logs: the fmt layer, filtered by `RUST_LOG` (default `info`). The filter applies to the log
//!   output only, so that a quiet log level never silences the spans the trace exporter needs.
//! - Traces: when an OTLP endpoint is configured (`OTEL_EXPORTER_OTLP_ENDPOINT`, or
//!   [`TelemetrySettings::otlp_endpoint`]), spans are exported over OTLP/gRPC in batches, named by
//!   `OTEL_SERVICE_NAME` (or the service's own name). Without one, no exporter exists and nothing
//!   is spent on it.
//! - [`trace`]: W3C trace context carried through gRPC metadata and HTTP headers by one layer on
//!   each side, and a span for every hop's request and every outgoing call.
//! - [`attr`]: the names of the attributes the chain puts on its spans.

pub mod attr;
pub mod trace;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing::Level;
use tracing_subscriber::{EnvFilter, Layer, filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};

/// Where traces go; read from the standard `OTEL_*` variables by [`TelemetrySettings::from_env`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// OTLP/gRPC endpoint, e.g. `http://127.0.0.1:4317`; `None`: no export.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of exported spans.
    pub service_name: Option<String>,
}

impl TelemetrySettings {
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, and
    /// `OTEL_SERVICE_NAME`; `OTEL_SDK_DISABLED=true` turns export off.
    pub fn from_env() -> Self {
        let read = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
        let disabled = read("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"));
        Self {
            otlp_endpoint: if disabled {
                None
            } else {
                read("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| read("OTEL_EXPORTER_OTLP_ENDPOINT"))
            },
            service_name: read("OTEL_SERVICE_NAME"),
        }
    }
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] flushes what is buffered.
#[must_use = "dropping the guard without shutdown loses buffered spans"]
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter: {0}")]
pub struct TelemetryError(String);

/// Installs logging, and trace export when configured. A second call in one process (several
/// services in the local stack) installs nothing and returns an inert guard.
pub fn init(default_service_name: &str, settings: &TelemetrySettings) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt::layer().with_target(false).with_filter(filter);
    let Some(endpoint) = &settings.otlp_endpoint else {
        let _ = tracing_subscriber::registry().with(quiet_transports()).with(logs).try_init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|error| TelemetryError(error.to_string()))?;
    let service_name = settings.service_name.clone().unwrap_or_else(|| default_service_name.to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service_name).build())
        .build();
    let traces = tracing_opentelemetry::layer().with_tracer(provider.tracer("chain"));
    if tracing_subscriber::registry().with(quiet_transports()).with(logs).with(traces).try_init().is_err() {
        // Another service of this process installed telemetry first; its exporter serves all.
        return Ok(Telemetry { provider: None });
    }
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(Telemetry { provider: Some(provider) })
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
    /// Whether this guard owns an exporter (none without an endpoint).
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is buffered now, without blocking the runtime.
    pub async fn flush(&self) {
        if let Some(provider) = self.provider.clone() {
            let _ = tokio::task::spawn_blocking(move || provider.force_flush()).await;
        }
    }

    /// Exports what is buffered and stops the exporter, without blocking the runtime.
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        }
    }
}
