//! An exporter whose collector is unreachable never holds requests up: spans are buffered in a
//! bounded batch and dropped, and the chain serves as before. (Its own test binary: telemetry is
//! installed once per process.)

use std::time::{Duration, Instant};

use e2e::{TestChain, order_body};
use telemetry::TelemetrySettings;

#[tokio::test]
async fn with_the_collector_unreachable_the_chain_keeps_serving() {
    // Nothing listens on port 9 (discard) on loopback here: every export fails.
    let settings = TelemetrySettings { otlp_endpoint: Some("http://127.0.0.1:9".into()), service_name: None, ..TelemetrySettings::default() };
    let exporter = telemetry::init("tests", &settings).expect("an exporter is built lazily");
    assert!(exporter.exporting());
    assert!(
        !telemetry::init("tests", &TelemetrySettings::default()).expect("no exporter").exporting(),
        "without an endpoint no exporter exists"
    );
    let test = TestChain::start().await;
    for n in 0..30 {
        if n == 15 {
            // An export attempt that fails (its error is logged, not raised).
            exporter.flush().await;
        }
        let started = Instant::now();
        let response = test.post_order(&format!("unexported-{n}"), &order_body()).send().await.unwrap();
        assert_eq!(response.status(), 201);
        assert!(started.elapsed() < Duration::from_secs(1), "export failures never block a request");
    }
}

