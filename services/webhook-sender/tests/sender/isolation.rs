//! A hanging recipient fills only its own permits: a healthy one beside it gets every delivery at
//! once.

use std::{collections::HashMap, sync::Arc, time::Duration};

use idempotency::SystemClock;
use outbox::EndpointLimits;
use test_support::eventually;

use crate::harness::{
    Answer, Outbox, Receiver, commit_to_receipt, settings, start_sender, wall_ms,
};

const EVENTS: usize = 200;

#[tokio::test]
async fn a_hanging_recipient_never_delays_a_healthy_one_and_never_gets_more_than_its_limit() {
    let outbox = Outbox::new().await;
    let hanging = Receiver::start(|_| Answer::Hang).await;
    let healthy = Receiver::answering(204).await;
    let hanging_limits = EndpointLimits {
        max_in_flight: 2,
        rate_per_sec: 1_000,
    };
    let healthy_limits = EndpointLimits {
        max_in_flight: 8,
        rate_per_sec: 1_000,
    };
    outbox
        .endpoint(
            &hanging.url(),
            &[outbox::ORDER_PAID],
            hanging_limits,
            wall_ms(),
        )
        .await;
    outbox
        .endpoint(
            &healthy.url(),
            &[outbox::ORDER_PAID],
            healthy_limits,
            wall_ms(),
        )
        .await;
    let settings = webhook_sender::Settings {
        request_timeout_ms: 1_000,
        connect_timeout_ms: 500,
        ..settings(&outbox, &[&hanging, &healthy])
    };
    let _sender = start_sender(settings, Arc::new(SystemClock)).await;

    let mut committed_at = HashMap::new();
    for _ in 0..EVENTS {
        let at = wall_ms();
        committed_at.insert(outbox.paid(at).await, at);
    }
    eventually(
        Duration::from_secs(30),
        "every event reaches the healthy recipient",
        || async { healthy.count() >= EVENTS },
    )
    .await;

    let latencies = commit_to_receipt(&healthy, &committed_at);
    let percentile = |p| latencies.percentile(p);
    println!(
        "healthy recipient beside a hanging one: {} deliveries, commit→receipt p50 {} ms, p99 {} ms, max {} ms; the hanging one held at most {} at once and got {}",
        latencies.0.len(),
        percentile(0.5),
        percentile(0.99),
        percentile(1.0),
        hanging.most_in_flight(),
        hanging.count(),
    );
    assert!(
        percentile(1.0) < 3_000,
        "a healthy delivery waited {} ms",
        percentile(1.0)
    );

    // Timed-out attempts give their permits back, and the next ones go out, still two at a time.
    eventually(
        Duration::from_secs(10),
        "the hanging recipient's next deliveries after the timeouts",
        || async { hanging.count() >= 4 },
    )
    .await;
    assert_eq!(
        hanging.most_in_flight(),
        2,
        "the hanging recipient holds exactly its limit, never more"
    );
}
