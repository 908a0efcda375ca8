//! An exporter whose collector fails every export never holds requests up: spans are buffered in
//! a bounded batch and dropped, and the chain serves as before. (Telemetry is installed once per
//! process: the test needs a process of its own, as the runner gives every test.)

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use e2e::{TestChain, order_body};
use telemetry::{Otlp, TelemetrySettings};
use tokio::net::TcpListener;

/// A collector that accepts each connection and closes it at once: every export fails. Returns
/// its endpoint and the number of connections the exporter made to it.
async fn failing_collector() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        while let Ok((connection, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            drop(connection);
        }
    });
    (endpoint, connections)
}

#[tokio::test]
async fn with_the_collector_failing_every_export_the_chain_keeps_serving() {
    let (endpoint, connections) = failing_collector().await;
    let settings = TelemetrySettings {
        traces: Some(Otlp::grpc(endpoint)),
        ..TelemetrySettings::default()
    };
    let exporter = e2e::init_telemetry(&settings);
    assert!(exporter.exporting());
    assert!(
        !telemetry::init(e2e::SERVICE, &TelemetrySettings::default())
            .expect("no exporter")
            .exporting(),
        "without an endpoint no exporter exists"
    );
    let test = TestChain::start().await;
    for n in 0..30 {
        if n == 15 {
            // An export attempt that fails (its error is logged, not raised).
            exporter.flush().await;
            assert!(
                connections.load(Ordering::Relaxed) >= 1,
                "the exporter tried the collector"
            );
        }
        let started = Instant::now();
        let response = test
            .post_order(&format!("unexported-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "export failures never block a request"
        );
    }
}
