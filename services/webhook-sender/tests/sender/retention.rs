//! The sender reaps events past retention, under a clock moved by hand, and keeps those still
//! being delivered.

use std::{sync::Arc, time::Duration};

use idempotency::{Clock, ManualClock};
use outbox::{DeliveryQuery, EndpointLimits, ORDER_PAID};
use test_support::eventually;
use webhook_sender::Delay;

use crate::harness::{Answer, CLIENT, Outbox, Receiver, settings, start_sender};

const T0: i64 = 1_900_000_000_000;
const DAY_MS: i64 = 86_400_000;

#[tokio::test]
async fn events_past_retention_are_reaped_and_those_still_being_delivered_are_kept() {
    let outbox = Outbox::new().await;
    let clock = Arc::new(ManualClock::starting_at(T0));
    let receiving = Receiver::answering(204).await;
    let failing = Receiver::start(|_| Answer::Status(500, Vec::new())).await;
    let (received, _) = outbox
        .endpoint(
            &receiving.url(),
            &[ORDER_PAID],
            EndpointLimits::default(),
            T0,
        )
        .await;
    let (retried, _) = outbox
        .endpoint(&failing.url(), &[ORDER_PAID], EndpointLimits::default(), T0)
        .await;
    let settings = webhook_sender::Settings {
        retention_ms: 7 * DAY_MS as u64,
        reap_interval_ms: 10,
        // A schedule longer than the retention: the failing delivery is still pending then.
        schedule: vec![
            Delay(Duration::ZERO),
            Delay(Duration::from_secs(30 * 86_400)),
        ],
        ..settings(&outbox, &[&receiving, &failing])
    };
    let _sender = start_sender(settings, clock.clone()).await;
    let event_id = outbox.paid(clock.now_ms()).await;
    receiving.wait_for(1).await;
    outbox.attempts(&retried, &event_id, 1).await;

    let log = |endpoint: String| {
        let subscriptions = outbox.subscriptions();
        async move {
            subscriptions
                .deliveries(CLIENT, &endpoint, &DeliveryQuery::newest(10))
                .await
                .expect("log")
                .deliveries
                .len()
        }
    };
    clock.advance_ms(8 * DAY_MS);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        (log(received.clone()).await, log(retried.clone()).await),
        (1, 1),
        "a delivery still pending keeps its event"
    );

    outbox
        .subscriptions()
        .set_enabled(CLIENT, &retried, false)
        .await
        .expect("disable");
    eventually(
        Duration::from_secs(5),
        "the event reaped once nothing delivers it",
        || async { log(received.clone()).await == 0 },
    )
    .await;
    assert_eq!(log(retried).await, 0, "its deliveries went with it");
}
