//! The retry schedule, followed under a clock the test moves: about a day of retries in moments.

use std::sync::Arc;

use idempotency::{Clock, ManualClock};
use outbox::{DeliveryState, EndpointLimits};

use crate::harness::{Answer, CLIENT, Marker, Outbox, Receiver, settings, start_sender};

const T0: i64 = 1_800_000_000_000;

#[tokio::test]
async fn retries_follow_the_schedule_within_jitter_then_stop_and_a_redelivery_keeps_the_id() {
    let outbox = Outbox::new().await;
    // Fails every attempt of the first round; the redelivery (the ninth) succeeds.
    let receiver =
        Receiver::start(|n| Answer::Status(if n < 8 { 500 } else { 204 }, Vec::new())).await;
    let (endpoint_id, _) = outbox
        .endpoint(
            &receiver.url(),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            T0,
        )
        .await;
    let event_id = outbox.paid(T0).await;
    let marker = Marker::subscribe(&outbox, T0).await;
    let clock = Arc::new(ManualClock::starting_at(T0));
    let settings = settings(&outbox, &[&receiver, &marker.receiver]);
    let (schedule, jitter) = (settings.schedule.clone(), settings.jitter);
    // Failing for a day would disable the endpoint before the schedule (about 28 h) is spent.
    let _sender = start_sender(
        webhook_sender::Settings {
            disable_after_ms: 7 * 86_400_000,
            ..settings
        },
        clock.clone(),
    )
    .await;

    for (attempt, delay) in schedule.iter().enumerate().skip(1) {
        let delivery = outbox.attempts(&endpoint_id, &event_id, attempt).await;
        let last = delivery.attempts.last().expect("an attempt");
        assert_eq!(last.status_code, Some(500));
        let waited = delivery.next_attempt_at_ms.expect("pending") - last.started_at_ms;
        let nominal = delay.0.as_millis() as f64;
        let (low, high) = (
            (nominal * (1.0 - jitter)).floor() as i64,
            (nominal * (1.0 + jitter)).ceil() as i64,
        );
        assert!(
            (low..=high).contains(&waited),
            "attempt {attempt}: waited {waited} ms, the schedule says {delay} ± {jitter}"
        );
        // Nothing happens before that time; at it, the next attempt goes out.
        marker.passed(&outbox, clock.now_ms()).await;
        assert_eq!(receiver.count(), attempt, "no attempt before its time");
        clock.advance_ms(delivery.next_attempt_at_ms.expect("pending") - clock.now_ms());
    }

    let delivery = outbox
        .attempts(&endpoint_id, &event_id, schedule.len())
        .await;
    assert_eq!(
        delivery.state,
        DeliveryState::Undelivered,
        "the schedule is spent"
    );
    assert_eq!(
        delivery
            .attempts
            .iter()
            .map(|a| a.attempt)
            .collect::<Vec<_>>(),
        (1..=8).collect::<Vec<_>>(),
        "every attempt is logged"
    );
    assert_eq!(receiver.count(), 8);

    outbox
        .subscriptions()
        .redeliver(CLIENT, &endpoint_id, &event_id, clock.now_ms())
        .await
        .expect("redeliver");
    receiver.wait_for(9).await;
    let ids: Vec<_> = receiver
        .received()
        .iter()
        .map(|r| r.header("webhook-id").expect("webhook-id").to_owned())
        .collect();
    assert!(
        ids.iter().all(|id| *id == event_id),
        "one webhook-id across retries and the redelivery: {ids:?}"
    );
    let delivered = outbox.attempts(&endpoint_id, &event_id, 9).await;
    assert_eq!(delivered.state, DeliveryState::Delivered);
}
