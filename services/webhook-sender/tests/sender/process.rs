//! The binary as operators see it: the health check subcommand and the metrics.

use std::{process::Command, time::Duration};

use outbox::EndpointLimits;
use test_support::eventually;

use crate::harness::{Outbox, Receiver, SenderProcess, wall_ms};

#[tokio::test]
async fn the_binary_answers_its_health_check_and_counts_deliveries_in_metrics() {
    let outbox = Outbox::new().await;
    let receiver = Receiver::answering(204).await;
    outbox
        .endpoint(
            &receiver.url(),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            wall_ms(),
        )
        .await;
    let sender = SenderProcess::spawn(&outbox, &receiver.test_host()).await;
    outbox.paid(wall_ms()).await;
    receiver.wait_for(1).await;

    let health = sender.health.to_string();
    let healthy = || {
        Command::new(env!("CARGO_BIN_EXE_webhook-sender"))
            .arg("healthcheck")
            .env("WEBHOOK_SENDER_LISTEN", &health)
            .status()
            .expect("the health check runs")
            .success()
    };
    eventually(
        Duration::from_secs(10),
        "the health check passes",
        || async { healthy() },
    )
    .await;

    let metrics = reqwest::get(format!("http://{health}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("webhook_deliveries_total{") && metrics.contains("outcome=\"delivered\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("webhook_attempt_duration_milliseconds_bucket"),
        "{metrics}"
    );
}
