//! A secret rotation: both signatures during the overlap, each verifying alone; then only the new.

use std::sync::Arc;

use idempotency::{Clock, ManualClock};
use outbox::EndpointLimits;
use webhooks::signature::VerifyError;

use crate::harness::{CLIENT, Outbox, Receiver, settings, start_sender, wall_ms};

const OVERLAP_MS: i64 = 60_000;

#[tokio::test]
async fn during_the_overlap_both_secrets_sign_and_after_it_only_the_new_one() {
    let outbox = Outbox::new().await;
    let receiver = Receiver::answering(204).await;
    let clock = Arc::new(ManualClock::starting_at(wall_ms()));
    let (endpoint_id, old) = outbox
        .endpoint(
            &receiver.url(),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            clock.now_ms(),
        )
        .await;
    let (subscriptions, rotated, now_ms) =
        (outbox.subscriptions(), endpoint_id.clone(), clock.now_ms());
    let new = outbox
        .database
        .write(async move |tx| {
            subscriptions
                .rotate_secret(tx, CLIENT, &rotated, OVERLAP_MS, now_ms)
                .await
        })
        .await
        .expect("rotate");
    let _sender = start_sender(settings(&outbox, &[&receiver]), clock.clone()).await;

    outbox.paid(clock.now_ms()).await;
    receiver.wait_for(1).await;
    let during = &receiver.received()[0];
    let entries = during
        .header("webhook-signature")
        .expect("signed")
        .split(' ')
        .count();
    assert_eq!(entries, 2, "one v1 entry per active secret");
    during.verify(&old).expect("the old secret verifies alone");
    during.verify(&new).expect("the new secret verifies alone");

    clock.advance_ms(OVERLAP_MS + 1);
    outbox.paid(clock.now_ms()).await;
    receiver.wait_for(2).await;
    let after = &receiver.received()[1];
    assert_eq!(
        after
            .header("webhook-signature")
            .expect("signed")
            .split(' ')
            .count(),
        1
    );
    after.verify(&new).expect("the new secret verifies");
    assert!(
        matches!(
            after.verify(&old),
            Err(VerifyError::NoMatchingSignature { .. })
        ),
        "the old secret no longer signs"
    );
}
