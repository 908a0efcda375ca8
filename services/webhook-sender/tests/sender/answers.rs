//! What recipients' answers do: 410 disables the endpoint and tells its owner; 429/503 with
//! `Retry-After` are honoured within the configured bounds.

use std::{sync::Arc, time::Duration};

use idempotency::{Clock, ManualClock};
use outbox::{DeliveryState, EndpointLimits};
use webhook_sender::Delay;

use crate::harness::{Answer, CLIENT, Marker, Outbox, Receiver, settings, start_sender, wall_ms};

#[tokio::test]
async fn a_410_disables_the_endpoint_and_its_owner_is_told_at_their_other_endpoints() {
    let outbox = Outbox::new().await;
    let clock = Arc::new(ManualClock::starting_at(wall_ms()));
    let gone = Receiver::answering(410).await;
    let owner = Receiver::answering(204).await;
    let (gone_id, _) = outbox
        .endpoint(
            &gone.url(),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            clock.now_ms(),
        )
        .await;
    outbox
        .endpoint(
            &owner.url(),
            &[outbox::ENDPOINT_DISABLED],
            EndpointLimits::default(),
            clock.now_ms(),
        )
        .await;
    let marker = Marker::subscribe(&outbox, clock.now_ms()).await;
    let _sender = start_sender(
        settings(&outbox, &[&gone, &owner, &marker.receiver]),
        clock.clone(),
    )
    .await;
    let event_id = outbox.paid(clock.now_ms()).await;

    owner.wait_for(1).await;
    let told: serde_json::Value = serde_json::from_slice(&owner.received()[0].body).expect("json");
    assert_eq!(told["type"], outbox::ENDPOINT_DISABLED);
    assert_eq!(told["data"]["endpoint_id"], gone_id.as_str());
    let endpoint = outbox
        .subscriptions()
        .endpoint(CLIENT, &gone_id)
        .await
        .expect("endpoint");
    assert!(!endpoint.enabled);
    assert!(endpoint.disabled_reason.expect("a reason").contains("410"));
    let delivery = outbox.delivery(&gone_id, &event_id).await;
    assert_eq!(
        (delivery.state, delivery.attempts[0].status_code),
        (DeliveryState::Pending, Some(410)),
        "kept in case the owner enables it again"
    );

    // An enabled endpoint would get the delivery again when the schedule says: let that time come.
    let retry_at_ms = delivery
        .next_attempt_at_ms
        .expect("the schedule's next attempt");
    clock.advance_ms(retry_at_ms - clock.now_ms());
    marker.passed(&outbox, clock.now_ms()).await;
    assert_eq!(
        gone.count(),
        1,
        "nothing more is sent to a disabled endpoint"
    );
}

#[tokio::test]
async fn retry_after_is_the_least_wait_clamped_by_the_settings_and_pauses_the_endpoint() {
    let outbox = Outbox::new().await;
    let clock = Arc::new(ManualClock::starting_at(wall_ms()));
    let asks = |retry_after: &'static str| {
        move |_| Answer::Status(429, vec![("retry-after", retry_after.to_owned())])
    };
    let two_seconds = Receiver::start(asks("2")).await;
    let a_day = Receiver::start(asks("86400")).await;
    let unavailable_now =
        Receiver::start(|_| Answer::Status(503, vec![("retry-after", "0".to_owned())])).await;
    let limits = EndpointLimits::default();
    let mut endpoints = Vec::new();
    for receiver in [&two_seconds, &a_day, &unavailable_now] {
        endpoints.push(
            outbox
                .endpoint(
                    &receiver.url(),
                    &[outbox::ORDER_PAID],
                    limits,
                    clock.now_ms(),
                )
                .await
                .0,
        );
    }
    let marker = Marker::subscribe(&outbox, clock.now_ms()).await;
    let settings = webhook_sender::Settings {
        retry_after_min_ms: 1_000,
        retry_after_max_ms: 60_000,
        schedule: [0, 3, 3]
            .map(|secs| Delay(Duration::from_secs(secs)))
            .to_vec(),
        jitter: 0.0,
        ..settings(
            &outbox,
            &[&two_seconds, &a_day, &unavailable_now, &marker.receiver],
        )
    };
    let _sender = start_sender(settings, clock.clone()).await;
    let event_id = outbox.paid(clock.now_ms()).await;

    // 2 s is shorter than the schedule's 3 s: the schedule wins, so a short Retry-After never
    // spends the schedule faster. A day is clamped to 60 s, 0 to 1 s (and then the schedule).
    for (endpoint_id, waits_ms) in endpoints.iter().zip([3_000, 60_000, 3_000]) {
        let delivery = outbox.attempts(endpoint_id, &event_id, 1).await;
        let attempt = &delivery.attempts[0];
        assert_eq!(
            delivery.next_attempt_at_ms,
            Some(attempt.started_at_ms + waits_ms),
            "{:?}",
            attempt.status_code
        );
    }

    // The endpoint pauses for its Retry-After: a new event due meanwhile goes when the pause
    // ends. The 503 endpoint, whose pause (clamped up to 1 s) is over sooner, goes meanwhile;
    // the marker shows that the sender has dispatched what was due 1 ms before the pause ends.
    let paused_at = clock.now_ms();
    let second = outbox.paid(clock.now_ms()).await;
    clock.advance_ms(1_999);
    outbox.attempts(&endpoints[2], &second, 1).await;
    marker.passed(&outbox, clock.now_ms()).await;
    assert_eq!(
        two_seconds.count(),
        1,
        "nothing to the paused endpoint before its Retry-After"
    );
    clock.advance_ms(1);
    let waited = outbox.attempts(&endpoints[0], &second, 1).await;
    assert_eq!(
        waited.attempts[0].started_at_ms,
        paused_at + 2_000,
        "the new event waited for the pause"
    );
}

#[tokio::test]
async fn a_pause_outlasts_the_endpoints_worker_and_the_sender_itself() {
    let outbox = Outbox::new().await;
    let clock = Arc::new(ManualClock::starting_at(wall_ms()));
    let paused = Receiver::start(|n| {
        if n == 0 {
            Answer::Status(429, vec![("retry-after", "30".to_owned())])
        } else {
            Answer::Status(204, Vec::new())
        }
    })
    .await;
    let (endpoint_id, _) = outbox
        .endpoint(
            &paused.url(),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            clock.now_ms(),
        )
        .await;
    let marker = Marker::subscribe(&outbox, clock.now_ms()).await;
    let settings = webhook_sender::Settings {
        jitter: 0.0,
        ..settings(&outbox, &[&paused, &marker.receiver])
    };
    let sender = start_sender(settings.clone(), clock.clone()).await;
    let first = outbox.paid(clock.now_ms()).await;
    let asked_at = outbox.attempts(&endpoint_id, &first, 1).await.attempts[0].started_at_ms;

    // Real time, with the sender's clock standing still: long enough for the endpoint's worker
    // (50 polls of 10 ms without work) to leave, taking whatever it kept in memory.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = outbox.paid(clock.now_ms()).await;
    marker.passed(&outbox, clock.now_ms()).await;
    assert_eq!(paused.count(), 1, "the pause outlasts the worker");

    drop(sender);
    let _restarted = start_sender(settings, clock.clone()).await;
    clock.advance_ms(asked_at + 29_999 - clock.now_ms());
    marker.passed(&outbox, clock.now_ms()).await;
    assert_eq!(paused.count(), 1, "a restarted sender honours the pause");

    clock.advance_ms(1);
    let resumed = outbox.attempts(&endpoint_id, &second, 1).await;
    assert_eq!(
        resumed.attempts[0].started_at_ms,
        asked_at + 30_000,
        "the new event went when the pause ended"
    );
}

#[tokio::test]
async fn a_delivery_out_of_attempts_is_told_to_the_owners_other_endpoints_signed_with_their_sealed_secret()
 {
    let outbox = Outbox::new().await;
    let clock = Arc::new(ManualClock::starting_at(wall_ms()));
    let failing = Receiver::answering(500).await;
    let owner = Receiver::answering(204).await;
    let (failing_id, _) = outbox
        .endpoint(
            &failing.url(),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            clock.now_ms(),
        )
        .await;
    let (owner_id, owner_secret) = outbox
        .endpoint(
            &owner.url(),
            &[outbox::ENDPOINT_ATTEMPTS_EXHAUSTED],
            EndpointLimits::default(),
            clock.now_ms(),
        )
        .await;
    // One attempt in all: its failure spends the schedule.
    let settings = webhook_sender::Settings {
        schedule: vec![Delay(Duration::ZERO)],
        ..settings(&outbox, &[&failing, &owner])
    };
    let _sender = start_sender(settings, clock.clone()).await;
    let event_id = outbox.paid(clock.now_ms()).await;

    owner.wait_for(1).await;
    let told = &owner.received()[0];
    let body: serde_json::Value = serde_json::from_slice(&told.body).expect("json");
    assert_eq!(body["type"], outbox::ENDPOINT_ATTEMPTS_EXHAUSTED);
    assert_eq!(
        body["data"],
        serde_json::json!({"endpoint_id": failing_id, "event_id": event_id, "event_type": outbox::ORDER_PAID})
    );
    assert_eq!(
        outbox.delivery(&failing_id, &event_id).await.state,
        DeliveryState::Undelivered
    );
    told.verify(&owner_secret)
        .expect("signed with the owner's secret");

    // The secret signs although the database holds it sealed.
    let stored: Vec<(String,)> = outbox
        .database
        .fetch_all(
            "SELECT secret FROM webhook_secrets WHERE endpoint_id = $1",
            &[&owner_id],
        )
        .await
        .expect("the secret's row");
    let bare = owner_secret.to_string();
    assert!(
        stored[0].0.starts_with("sealed1:test:")
            && !stored[0].0.contains(bare.trim_start_matches("whsec_")),
        "{stored:?}"
    );
}
