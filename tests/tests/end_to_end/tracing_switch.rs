//! Tracing switched off in a running process: no spans exported, so no trace context on the
//! answers; on again: traced and exported as before. (The switch is process-wide: the test needs a
//! process of its own, as the runner gives every test.)

use e2e::{BACKGROUND, TestChain, eventually, order_body, otlp::OtlpReceiver};
use telemetry::{Otlp, TelemetrySettings};

/// The trace id an answer names in its `traceparent`, if it has one.
fn trace_id(response: &reqwest::Response) -> Option<String> {
    let traceparent = response.headers().get("traceparent")?.to_str().ok()?;
    traceparent.split('-').nth(1).map(str::to_owned)
}

#[tokio::test]
async fn tracing_can_be_switched_off_and_on_again() {
    let receiver = OtlpReceiver::start().await;
    let settings = TelemetrySettings {
        traces: Some(Otlp::grpc(receiver.endpoint())),
        ..TelemetrySettings::default()
    };
    let telemetry = e2e::init_telemetry(&settings);
    let test = TestChain::start().await;
    let exported = |trace_id: String| {
        let (receiver, telemetry) = (&receiver, &telemetry);
        async move {
            eventually(BACKGROUND, "the trace exported", || async {
                telemetry.flush().await;
                !receiver.trace(&trace_id).is_empty()
            })
            .await;
        }
    };

    let traced = test
        .post_order("switch-1", &order_body())
        .send()
        .await
        .unwrap();
    exported(trace_id(&traced).expect("traced")).await;
    telemetry.flush().await;
    let spans_before = receiver.span_count();

    telemetry.set_tracing(false);
    let untraced = test
        .post_order("switch-2", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(untraced.status(), 201);
    assert_eq!(trace_id(&untraced), None, "no span, no trace context");
    // A flush exports whatever is buffered: had the request made spans, they would be here now.
    telemetry.flush().await;
    assert_eq!(
        receiver.span_count(),
        spans_before,
        "nothing exported while tracing is off"
    );

    telemetry.set_tracing(true);
    let traced_again = test
        .post_order("switch-3", &order_body())
        .send()
        .await
        .unwrap();
    exported(trace_id(&traced_again).expect("traced again")).await;
    telemetry.shutdown().await;
}
