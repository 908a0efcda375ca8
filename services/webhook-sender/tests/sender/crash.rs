//! A sender killed between sending a delivery and recording it: the delivery comes again, with
//! the same `webhook-id`, and the example receiver processes it once.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    extract::{Request, State},
    middleware::{self, Next},
    response::Response,
};
use outbox::{DeliveryState, EndpointLimits};
use test_support::eventually;
use tokio::net::TcpListener;
use webhook_receiver::Receiver;
use webhooks::signature::{Verifier, WEBHOOK_ID};

use crate::harness::{Outbox, SenderProcess, wall_ms};

/// The `webhook-id` of every delivery that arrived, processed or not.
#[derive(Default)]
struct Arrivals {
    ids: Mutex<Vec<String>>,
    answered: AtomicUsize,
}

/// In front of the example receiver: lets it verify and process each delivery, then holds the
/// first answer forever, as when the sender dies before it reads the answer.
async fn hold_the_first_answer(
    State(arrivals): State<Arc<Arrivals>>,
    request: Request,
    next: Next,
) -> Response {
    let id = request
        .headers()
        .get(WEBHOOK_ID)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    arrivals.ids.lock().expect("not poisoned").push(id);
    let response = next.run(request).await;
    if arrivals.answered.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
    response
}

#[tokio::test]
async fn a_sender_killed_after_sending_and_before_recording_delivers_again_and_the_receiver_processes_once()
 {
    let outbox = Outbox::new().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (endpoint_id, secret) = outbox
        .endpoint(
            &format!("http://{addr}{}", webhook_receiver::PATH),
            &[outbox::ORDER_PAID],
            EndpointLimits::default(),
            wall_ms(),
        )
        .await;
    let processed = Arc::new(Mutex::new(Vec::new()));
    let sink = processed.clone();
    let receiver = Arc::new(Receiver::new(
        Verifier::new(secret),
        3 * 86_400,
        move |delivery| sink.lock().expect("not poisoned").push(delivery.id),
    ));
    let arrivals = Arc::new(Arrivals::default());
    let app = receiver.router().layer(middleware::from_fn_with_state(
        arrivals.clone(),
        hold_the_first_answer,
    ));
    tokio::spawn(axum::serve(listener, app).into_future());
    let event_id = outbox.paid(wall_ms()).await;

    let first = SenderProcess::spawn(&outbox, &addr.to_string()).await;
    eventually(
        Duration::from_secs(20),
        "the first sender's delivery is processed",
        || async { processed.lock().expect("not poisoned").len() == 1 },
    )
    .await;
    first.kill();
    let unrecorded = outbox.delivery(&endpoint_id, &event_id).await;
    assert_eq!(
        (unrecorded.state, unrecorded.attempts.len()),
        (DeliveryState::Pending, 0),
        "killed before recording"
    );

    let _second = SenderProcess::spawn(&outbox, &addr.to_string()).await;
    eventually(
        Duration::from_secs(20),
        "the restarted sender records the delivery",
        || async {
            outbox.delivery(&endpoint_id, &event_id).await.state == DeliveryState::Delivered
        },
    )
    .await;
    let ids = arrivals.ids.lock().expect("not poisoned").clone();
    assert_eq!(
        ids,
        [event_id.clone(), event_id.clone()],
        "sent twice, as the same event"
    );
    assert_eq!(
        *processed.lock().expect("not poisoned"),
        std::slice::from_ref(&event_id),
        "the example receiver processed it once"
    );
    let attempts: Vec<i64> = outbox
        .delivery(&endpoint_id, &event_id)
        .await
        .attempts
        .iter()
        .map(|a| a.attempt)
        .collect();
    assert_eq!(
        attempts,
        [2],
        "the second claim is attempt 2; the first was never recorded"
    );
}
