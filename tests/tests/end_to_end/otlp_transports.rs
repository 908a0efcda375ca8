//! OTLP export over the transports the `OTEL_EXPORTER_OTLP_*` variables choose (how they are read
//! is the telemetry crate's unit tests'), each to a receiver the test starts: gRPC over TLS to an
//! `https://` endpoint whose certificate a CA file vouches for, and `http/protobuf`. An order's
//! spans and the chain's metrics arrive at each. (Telemetry is installed once per process: each
//! test needs a process of its own, as the runner gives every test.)

use e2e::{BACKGROUND, TestChain, eventually, order_body, otlp::OtlpReceiver};
use telemetry::{Otlp, OtlpProtocol, Telemetry, TelemetrySettings};
use test_support::test_ca::TestCa;

/// Spans and metrics both to `otlp`.
fn both_to(otlp: Otlp) -> TelemetrySettings {
    TelemetrySettings {
        traces: Some(otlp.clone()),
        metrics: Some(otlp),
        ..TelemetrySettings::default()
    }
}

/// An order through the chain, and its spans and the chain's metrics at `receiver`.
async fn an_order_is_exported(receiver: &OtlpReceiver, telemetry: &Telemetry) {
    let test = TestChain::start().await;
    let response = test
        .post_order("exported", &order_body())
        .send()
        .await
        .expect("the gateway answers");
    assert_eq!(response.status(), 201);
    let traceparent = response.headers()["traceparent"]
        .to_str()
        .expect("ASCII")
        .to_owned();
    let trace_id = traceparent
        .split('-')
        .nth(1)
        .expect("a trace id")
        .to_owned();
    eventually(
        BACKGROUND,
        "the order's spans and the metrics received",
        || async {
            telemetry.flush().await;
            receiver.trace(&trace_id).len() >= 4 && !receiver.metric_names().is_empty()
        },
    )
    .await;
}

#[tokio::test]
async fn spans_and_metrics_reach_an_https_endpoint_over_grpc_with_tls() {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().expect("a directory");
    let (cert, key, ca_file) = (
        dir.path().join("receiver.pem"),
        dir.path().join("receiver.key"),
        dir.path().join("ca.pem"),
    );
    ca.issue("localhost", &cert, &key);
    std::fs::write(&ca_file, ca.pem()).expect("the CA written");
    let receiver = OtlpReceiver::start_tls(
        &std::fs::read(&cert).unwrap(),
        &std::fs::read(&key).unwrap(),
    )
    .await;
    let otlp = Otlp {
        endpoint: format!("https://localhost:{}", receiver.port()),
        protocol: OtlpProtocol::Grpc,
        ca_file: Some(ca_file),
    };
    let settings = both_to(otlp);
    let telemetry = e2e::init_telemetry(&settings);
    an_order_is_exported(&receiver, &telemetry).await;
}

#[tokio::test]
async fn spans_and_metrics_reach_an_http_protobuf_endpoint() {
    let receiver = OtlpReceiver::start_http().await;
    let settings = TelemetrySettings {
        traces: Some(Otlp {
            endpoint: format!("{}/v1/traces", receiver.endpoint()),
            protocol: OtlpProtocol::HttpProtobuf,
            ca_file: None,
        }),
        metrics: Some(Otlp {
            endpoint: format!("{}/v1/metrics", receiver.endpoint()),
            protocol: OtlpProtocol::HttpProtobuf,
            ca_file: None,
        }),
        ..TelemetrySettings::default()
    };
    let telemetry = e2e::init_telemetry(&settings);
    an_order_is_exported(&receiver, &telemetry).await;
}
