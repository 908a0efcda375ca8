#![doc = include_str!("../README.md")]

pub mod attr;
mod export;
mod json_logs;
mod message;
pub mod metrics;
mod service;
pub mod trace;

pub use export::{Otlp, OtlpProtocol};
pub use service::Service;

use std::io::IsTerminal;

use export::Signal;
use json_logs::JsonLogs;
use opentelemetry::{KeyValue, trace::TracerProvider as _};
use opentelemetry_sdk::{
    Resource,
    metrics::SdkMeterProvider,
    propagation::TraceContextPropagator,
    resource::{
        EnvResourceDetector, ResourceDetector, SdkProvidedResourceDetector,
        TelemetryResourceDetector,
    },
    trace::SdkTracerProvider,
};
use opentelemetry_semantic_conventions::resource;
use service::ServiceTracers;
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
    /// Where spans are exported; `None`: no export.
    pub traces: Option<Otlp>,
    /// Where metrics are pushed; `None`: only `/metrics` serves them.
    pub metrics: Option<Otlp>,
    /// The `service.name` of exported spans and metrics.
    pub service_name: Option<String>,
    /// How log lines are written (`LOG_FORMAT`).
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// `text`: a line a person reads.
    #[default]
    Text,
    /// `json`: a JSON object per line, with the `trace_id` and `span_id` of its span.
    Json,
}

impl TelemetrySettings {
    /// Each signal's export as [`Otlp::from_env`] reads it (`OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// `_PROTOCOL` and `_CERTIFICATE`, each also per signal); metrics only while
    /// `OTEL_METRICS_EXPORTER` names no other exporter than `otlp` (`none`: a collector that keeps
    /// traces only, such as Jaeger). `OTEL_SERVICE_NAME`; `OTEL_SDK_DISABLED=true` turns all
    /// export off. `LOG_FORMAT`: `text` (the default) or `json`.
    pub fn from_env() -> Result<Self, TelemetryError> {
        let read = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|value| !value.trim().is_empty())
        };
        let disabled =
            read("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"));
        let push_metrics = read("OTEL_METRICS_EXPORTER")
            .is_none_or(|exporter| exporter.eq_ignore_ascii_case("otlp"));
        Ok(Self {
            traces: Otlp::from_env(Signal::Traces, &read)?.filter(|_| !disabled),
            metrics: Otlp::from_env(Signal::Metrics, &read)?.filter(|_| !disabled && push_metrics),
            service_name: read("OTEL_SERVICE_NAME"),
            log_format: match read("LOG_FORMAT").as_deref() {
                None | Some("text") => LogFormat::Text,
                Some("json") => LogFormat::Json,
                Some(other) => {
                    return Err(TelemetryError(format!(
                        "LOG_FORMAT {other:?}: must be text or json"
                    )));
                }
            },
        })
    }
}

/// Keeps the exporters alive; [`Telemetry::shutdown`] flushes what is buffered.
#[must_use = "dropping the guard without shutdown loses buffered spans"]
#[derive(Debug)]
pub struct Telemetry {
    /// The process's tracer provider, then one per hosted service (none without an endpoint).
    traces: Vec<SdkTracerProvider>,
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
#[error("telemetry: {0}")]
pub struct TelemetryError(pub(crate) String);

/// The log filter when `RUST_LOG` is not set.
const DEFAULT_LOG_FILTER: &str =
    "info,opentelemetry=warn,opentelemetry_sdk=warn,opentelemetry_otlp=warn";

/// Installs logging and metrics, and OTLP export of traces and metrics when configured, for a
/// process that is one `service`. A second call in one process installs nothing and returns an
/// inert guard: the first installation serves all. Call it before building the services: an
/// instrument made before it counts into nothing.
pub fn init(service: Service, settings: &TelemetrySettings) -> Result<Telemetry, TelemetryError> {
    init_hosting(service, &[], settings)
}

/// [`init`] for a process that hosts several `services` (the local stack): the spans of each are
/// exported under its own name, those that belong to none under the `process`'s (see
/// [`trace::set_service`]). Metrics are the process's.
pub fn init_hosting(
    process: Service,
    services: &[Service],
    settings: &TelemetrySettings,
) -> Result<Telemetry, TelemetryError> {
    // OpenTelemetry's own INFO lines (a provider set, an exporter built) say nothing a user acts on,
    // and would be the first lines a service prints.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let json = JsonLogs::default();
    let (text_logs, json_logs) = match settings.log_format {
        // Colours only for a person at a terminal: logs piped to a file or a collector stay plain.
        LogFormat::Text => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .with_ansi(std::io::stdout().is_terminal())
                    .with_filter(filter),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .event_format(json.clone())
                    .with_filter(filter),
            ),
        ),
    };
    let process_resource = service_resource(
        process,
        settings.service_name.as_deref().unwrap_or(process.name),
    );
    let mut traces = Vec::new();
    let mut tracers = None;
    if let Some(otlp) = &settings.traces {
        let process_provider = trace_provider(otlp, process_resource.clone())?;
        let mut hosted = Vec::with_capacity(services.len());
        for service in services {
            let provider = trace_provider(otlp, service_resource(*service, service.name))?;
            hosted.push((service.name, provider.tracer(TRACER)));
            traces.push(provider);
        }
        tracers = Some(ServiceTracers::new(process_provider.tracer(TRACER), hosted));
        traces.insert(0, process_provider);
    }
    let (switch, switch_handle) = reload::Layer::new(LevelFilter::TRACE);
    let spans = tracers.map(|tracers| {
        tracing_opentelemetry::layer()
            .with_tracer(tracers)
            .with_filter(switch)
    });
    if tracing_subscriber::registry()
        .with(quiet_transports())
        .with(text_logs)
        .with(json_logs)
        .with(spans)
        .try_init()
        .is_err()
    {
        return Ok(Telemetry {
            traces: Vec::new(),
            meters: None,
            exporting: false,
            trace_switch: None,
        });
    }
    tracing::dispatcher::get_default(|installed| json.dispatch.set(installed.downgrade())).ok();
    let trace_switch = (!traces.is_empty()).then(|| {
        TraceSwitch(Box::new(move |on: bool| {
            let _ = switch_handle.reload(if on {
                LevelFilter::TRACE
            } else {
                LevelFilter::OFF
            });
        }))
    });
    if !traces.is_empty() {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    }
    let meters = metrics::install(process_resource, settings.metrics.as_ref())?;
    let exporting = settings.traces.is_some() || settings.metrics.is_some();
    Ok(Telemetry {
        traces,
        meters: Some(meters),
        exporting,
        trace_switch,
    })
}

/// The name of the chain's tracers (the instrumentation scope of its spans).
const TRACER: &str = "chain";

/// What a service's spans and metrics say of it: its name and version, the chain it belongs to,
/// which running copy it is, and the deployment environment; the last three are defaults that
/// `OTEL_RESOURCE_ATTRIBUTES` overrides (a pod passes its name as `service.instance.id`).
fn service_resource(service: Service, name: &str) -> Resource {
    let detectors: [Box<dyn ResourceDetector>; 3] = [
        Box::new(SdkProvidedResourceDetector),
        Box::new(TelemetryResourceDetector),
        Box::new(EnvResourceDetector::new()),
    ];
    Resource::builder_empty()
        .with_attribute(KeyValue::new(
            resource::SERVICE_NAMESPACE,
            SERVICE_NAMESPACE,
        ))
        // Replicas of one service are told apart: a new id per process unless told otherwise.
        .with_attribute(KeyValue::new(
            resource::SERVICE_INSTANCE_ID,
            uuid::Uuid::now_v7().to_string(),
        ))
        .with_attribute(KeyValue::new(
            resource::DEPLOYMENT_ENVIRONMENT_NAME,
            DEFAULT_ENVIRONMENT,
        ))
        .with_detectors(&detectors)
        .with_service_name(name.to_owned())
        .with_attribute(KeyValue::new(resource::SERVICE_VERSION, service.version))
        .build()
}

/// The `service.namespace` of every service of the chain, unless told otherwise.
pub const SERVICE_NAMESPACE: &str = "chain";

/// The `deployment.environment.name` of a process not told otherwise.
pub const DEFAULT_ENVIRONMENT: &str = "dev";

fn trace_provider(otlp: &Otlp, resource: Resource) -> Result<SdkTracerProvider, TelemetryError> {
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(otlp.span_exporter()?)
        .with_resource(resource)
        .build())
}

/// Switches the transport crates' own spans and events below WARN off for every layer (not just
/// hides them from the exporter): hidden, they would still be the current span while our
/// handlers run, and our spans would lose their parent and start traces of their own.
fn quiet_transports() -> Targets {
    Targets::new().with_default(Level::TRACE).with_targets(
        [
            "h2",
            "hyper",
            "hyper_util",
            "tonic",
            "tower",
            "sqlx",
            "storage",
            "reqwest",
        ]
        .map(|target| (target, Level::WARN)),
    )
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
            for provider in traces {
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
            for provider in traces {
                let _ = provider.shutdown();
            }
            if let Some(provider) = meters {
                let _ = provider.shutdown();
            }
        })
        .await;
    }
}
