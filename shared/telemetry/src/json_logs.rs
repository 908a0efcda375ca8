//! Log lines as JSON objects (`LOG_FORMAT=json`), each with the `trace_id` and `span_id` of the
//! span it was logged in, so that a log backend links a line to its trace.
//!
//! Why not tracing-subscriber's own JSON format: it knows the spans' fields, not the OpenTelemetry
//! ids the trace layer gives them.

use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::{Event, Subscriber, dispatcher::WeakDispatch, field::Field};
use tracing_subscriber::{
    fmt::{
        FmtContext, FormatEvent, FormatFields,
        format::Writer,
        time::{FormatTime, SystemTime},
    },
    registry::LookupSpan,
};

/// The JSON format: `timestamp`, `level`, `message`, the event's other fields, and the ids of its
/// trace and span when it was logged inside a traced span.
#[derive(Clone, Default)]
pub(crate) struct JsonLogs {
    /// The subscriber this format writes for, set once it is installed: the trace layer keeps
    /// the ids, and it must be asked directly (inside an event, `tracing` answers every lookup of
    /// the current dispatcher with none, so that a subscriber cannot recurse into itself).
    pub(crate) dispatch: Arc<OnceLock<WeakDispatch>>,
}

impl<S, N> FormatEvent<S, N> for JsonLogs
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let mut line = Map::new();
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), event.metadata().level().as_str().into());
        event.record(&mut Fields(&mut line));
        line.insert("target".into(), event.metadata().target().into());
        let context = ctx
            .lookup_current()
            .zip(self.dispatch.get().and_then(WeakDispatch::upgrade))
            .and_then(|(span, dispatch)| {
                tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)
            });
        if let Some(context) = context {
            let span = context.span();
            let ids = span.span_context();
            if ids.is_valid() {
                line.insert("trace_id".into(), ids.trace_id().to_string().into());
                line.insert("span_id".into(), ids.span_id().to_string().into());
            }
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Records an event's fields into a JSON object, numbers and booleans as such.
struct Fields<'a>(&'a mut Map<String, Value>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io,
        sync::{Mutex, PoisonError},
    };

    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing::Dispatch;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    /// The lines written, shared with the test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_logged_in_a_traced_span_names_its_trace_and_span() {
        let (lines, format) = (Lines::default(), JsonLogs::default());
        let provider = SdkTracerProvider::builder().build();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .event_format(format.clone())
                    .with_writer(move || writer.clone()),
            )
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let dispatch = Dispatch::new(subscriber);
        format.dispatch.set(dispatch.downgrade()).ok();
        let ids = tracing::dispatcher::with_default(&dispatch, || {
            tracing::info!("outside any span");
            let span = tracing::info_span!("request");
            let _entered = span.enter();
            tracing::warn!(answer = 42, retried = true, "inside");
            let context = span.context();
            let ids = context.span().span_context().clone();
            (ids.trace_id().to_string(), ids.span_id().to_string())
        });
        let written = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = written
            .lines()
            .map(|line| serde_json::from_str(line).expect("each line a JSON object"))
            .collect();
        assert_eq!(lines.len(), 2, "{written}");
        assert_eq!(
            (lines[0]["message"].as_str(), lines[0].get("trace_id")),
            (Some("outside any span"), None)
        );
        let inside = &lines[1];
        assert_eq!(
            (inside["level"].as_str(), inside["message"].as_str()),
            (Some("WARN"), Some("inside"))
        );
        assert_eq!(
            (inside["answer"].as_i64(), inside["retried"].as_bool()),
            (Some(42), Some(true))
        );
        assert_eq!(
            (inside["trace_id"].as_str(), inside["span_id"].as_str()),
            (Some(ids.0.as_str()), Some(ids.1.as_str()))
        );
        assert!(
            inside["timestamp"]
                .as_str()
                .is_some_and(|timestamp| timestamp.ends_with('Z')),
            "{inside}"
        );
    }
}
