//! Tracing switched off in a running process: no spans, so no trace context on the answers; on
//! again: traced as before. (Its own test binary: the switch is process-wide.)

use e2e::{TestChain, order_body, otlp::OtlpReceiver};
use telemetry::TelemetrySettings;

#[tokio::test]
async fn tracing_can_be_switched_off_and_on_again() {
    let receiver = OtlpReceiver::start().await;
    let settings = TelemetrySettings { otlp_endpoint: Some(receiver.endpoint()), service_name: None, ..TelemetrySettings::default() };
    let telemetry = telemetry::init("tests", &settings).expect("exporter");
    let test = TestChain::start().await;
    let traceparent = |response: &reqwest::Response| response.headers().get("traceparent").is_some();

    assert!(traceparent(&test.post_order("switch-1", &order_body()).send().await.unwrap()));
    telemetry.set_tracing(false);
    let untraced = test.post_order("switch-2", &order_body()).send().await.unwrap();
    assert_eq!(untraced.status(), 201);
    assert!(!traceparent(&untraced), "no span, no trace context");
    telemetry.set_tracing(true);
    assert!(traceparent(&test.post_order("switch-3", &order_body()).send().await.unwrap()));
    telemetry.shutdown().await;
}
