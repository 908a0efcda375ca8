//! One client with every endpoint saturated and a range redelivery of 10,000 events running
//! cannot hold up another client's deliveries: the sender's places are shared fairly, and the
//! range is queued in short batches.

use std::{sync::Arc, time::Duration};

use idempotency::SystemClock;
use outbox::{EndpointLimits, ORDER_PAID, RedeliveryLimits, RedeliveryRange};
use test_support::eventually;

use crate::harness::{
    Answer, Outbox, Receiver, commit_to_receipt, settings, start_sender, wall_ms,
};

const BUSY_CLIENT: &str = "client-with-saturated-endpoints";
const OTHER_CLIENT: &str = "client-b";
/// The busy client's endpoints (the most a client may have), all hanging.
const BUSY_ENDPOINTS: usize = 20;
/// Events redelivered to one of them by one range redelivery.
const RANGE_EVENTS: usize = 10_000;
/// Events due at every busy endpoint.
const BUSY_EVENTS: usize = 50;
/// The other client's events, one every [`PACE`].
const OTHER_EVENTS: usize = 100;
const PACE: Duration = Duration::from_millis(50);
/// The highest commit → receipt p99 the other client may see.
const P99_BOUND_MS: i64 = 500;

/// Commits `events` `order.paid` events of `client` in one transaction.
async fn commit_events(outbox: &Outbox, client: &str, events: usize) {
    let client = client.to_owned();
    outbox
        .database
        .write(async move |tx| {
            let data = serde_json::json!({"order_id": "ord_1"});
            for _ in 0..events {
                let event = outbox::NewEvent {
                    event_type: ORDER_PAID,
                    version: 1,
                    data: &data,
                };
                outbox::record(tx, &client, &event, wall_ms())
                    .await?
                    .expect("an endpoint subscribes");
            }
            Ok::<_, outbox::OutboxError>(())
        })
        .await
        .expect("record");
}

async fn count(outbox: &Outbox, statement: &'static str) -> i64 {
    let (n,): (i64,) = outbox
        .database
        .fetch_one(statement, &[])
        .await
        .expect("count");
    n
}

#[tokio::test]
async fn a_client_with_saturated_endpoints_and_a_range_redelivery_does_not_delay_another() {
    let outbox = Outbox::new().await;
    let hanging = Receiver::start(|_| Answer::Hang).await;
    let healthy = Receiver::answering(204).await;
    let most = EndpointLimits::MAX;

    // The endpoint of the range redelivery first, with its events already delivered.
    let range_from_ms = wall_ms();
    let (range_endpoint, _) = outbox
        .client_endpoint(
            BUSY_CLIENT,
            &hanging.url(),
            &[ORDER_PAID],
            most,
            range_from_ms,
        )
        .await;
    commit_events(&outbox, BUSY_CLIENT, RANGE_EVENTS).await;
    outbox
        .database
        .write(async |tx| {
            tx.execute("UPDATE webhook_deliveries SET state = 'delivered'", &[])
                .await
        })
        .await
        .expect("mark delivered");
    let range_until_ms = wall_ms() + 1;
    for _ in 1..BUSY_ENDPOINTS {
        outbox
            .client_endpoint(
                BUSY_CLIENT,
                &hanging.url(),
                &[ORDER_PAID],
                most,
                range_until_ms,
            )
            .await;
    }
    commit_events(&outbox, BUSY_CLIENT, BUSY_EVENTS).await;
    outbox
        .client_endpoint(OTHER_CLIENT, &healthy.url(), &[ORDER_PAID], most, wall_ms())
        .await;

    let settings = webhook_sender::Settings {
        request_timeout_ms: 1_000,
        connect_timeout_ms: 500,
        ..settings(&outbox, &[&hanging, &healthy])
    };
    let max_in_flight = settings.max_in_flight;
    let _sender = start_sender(settings, Arc::new(SystemClock)).await;
    eventually(
        Duration::from_secs(10),
        "the busy client's endpoints saturated",
        || async { hanging.most_in_flight() * 2 >= max_in_flight },
    )
    .await;

    let range = RedeliveryRange {
        from_ms: range_from_ms,
        until_ms: range_until_ms,
        include_delivered: true,
    };
    let queued = outbox
        .subscriptions()
        .redeliver_range(
            BUSY_CLIENT,
            &range_endpoint,
            range,
            RedeliveryLimits::default(),
            wall_ms(),
        )
        .await
        .expect("range");
    assert_eq!(queued, RANGE_EVENTS as u64);
    let committed_at = outbox.paced_commits(OTHER_CLIENT, OTHER_EVENTS, PACE).await;
    eventually(
        Duration::from_secs(10),
        "every event of the other client arrives",
        || async { healthy.count() >= OTHER_EVENTS },
    )
    .await;
    let running = "SELECT COUNT(*) FROM webhook_redeliveries WHERE finished_at_ms IS NULL";
    eventually(
        Duration::from_secs(10),
        "the range redelivery is done",
        || async { count(&outbox, running).await == 0 },
    )
    .await;
    let pending_again = count(
        &outbox,
        "SELECT COUNT(*) FROM webhook_deliveries WHERE state = 'pending'",
    )
    .await;

    let latencies = commit_to_receipt(&healthy, &committed_at);
    println!(
        "{} deliveries of {OTHER_CLIENT} beside {BUSY_ENDPOINTS} hanging endpoints of {BUSY_CLIENT} and its range redelivery of {RANGE_EVENTS} events: \
         commit→receipt p50 {} ms, p99 {} ms, max {} ms (p99 bound {P99_BOUND_MS} ms); the busy client held at most {} of the sender's {max_in_flight} places",
        latencies.0.len(),
        latencies.percentile(0.5),
        latencies.percentile(0.99),
        latencies.percentile(1.0),
        hanging.most_in_flight(),
    );
    assert!(
        pending_again >= RANGE_EVENTS as i64,
        "the range's deliveries are pending again: {pending_again}"
    );
    assert!(
        hanging.most_in_flight() <= max_in_flight / 2,
        "a client alone holds at most half the places"
    );
    assert!(
        latencies.percentile(0.99) < P99_BOUND_MS,
        "commit→receipt p99 of {OTHER_CLIENT}: {} ms",
        latencies.percentile(0.99)
    );
}
