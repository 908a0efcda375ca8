//! A sender killed between sending a delivery and recording it: the delivery comes again, with
//! the same `webhook-id`, and a receiver that dedupes processes it once.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use outbox::{DeliveryState, EndpointLimits};
use tokio::net::TcpListener;
use webhooks::{
    dedupe::SeenIds,
    signature::{ReceivedHeaders, Verifier, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP},
};

use crate::harness::{Outbox, SenderProcess, eventually, wall_ms};

/// The example receiver's logic (verify, then process each id once), except that it holds its
/// answer to the first delivery it processes, as a receiver does whose reply gets lost.
struct DedupingReceiver {
    verifier: Verifier,
    seen: Mutex<SeenIds>,
    ids: Mutex<Vec<String>>,
    processed: AtomicUsize,
}

async fn receive(State(receiver): State<Arc<DedupingReceiver>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let received = ReceivedHeaders { id: header(WEBHOOK_ID), timestamp: header(WEBHOOK_TIMESTAMP), signature: header(WEBHOOK_SIGNATURE) };
    if receiver.verifier.verify_now(&received, &body).is_err() {
        return StatusCode::UNAUTHORIZED;
    }
    let id = received.id.expect("verified");
    receiver.ids.lock().expect("not poisoned").push(id.to_owned());
    if !receiver.seen.lock().expect("not poisoned").first_time(id, (wall_ms() / 1_000) as u64) {
        return StatusCode::OK;
    }
    if receiver.processed.fetch_add(1, Ordering::SeqCst) == 0 {
        std::future::pending::<()>().await;
    }
    StatusCode::NO_CONTENT
}

#[tokio::test]
async fn a_sender_killed_after_sending_and_before_recording_delivers_again_and_the_receiver_processes_once() {
    let outbox = Outbox::new().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (endpoint_id, secret) = outbox.endpoint(&format!("http://{addr}/hook"), &[outbox::ORDER_PAID], EndpointLimits::default(), wall_ms()).await;
    let receiver = Arc::new(DedupingReceiver {
        verifier: Verifier::new(secret),
        seen: Mutex::new(SeenIds::new(3 * 86_400)),
        ids: Mutex::new(Vec::new()),
        processed: AtomicUsize::new(0),
    });
    let app = Router::new().route("/hook", post(receive)).with_state(receiver.clone());
    tokio::spawn(axum::serve(listener, app).into_future());
    let event_id = outbox.paid(wall_ms()).await;

    let first = SenderProcess::spawn(&outbox.url, &addr.to_string());
    eventually(Duration::from_secs(20), "the first sender's delivery is processed", || async { receiver.processed.load(Ordering::SeqCst) == 1 }).await;
    first.kill();
    let unrecorded = outbox.delivery(&endpoint_id, &event_id).await;
    assert_eq!((unrecorded.state, unrecorded.attempts.len()), (DeliveryState::Pending, 0), "killed before recording");

    let _second = SenderProcess::spawn(&outbox.url, &addr.to_string());
    eventually(Duration::from_secs(20), "the restarted sender records the delivery", || async {
        outbox.delivery(&endpoint_id, &event_id).await.state == DeliveryState::Delivered
    })
    .await;
    let ids = receiver.ids.lock().expect("not poisoned").clone();
    assert_eq!(ids, [event_id.clone(), event_id.clone()], "sent twice, as the same event");
    assert_eq!(receiver.processed.load(Ordering::SeqCst), 1, "processed once");
    let attempts: Vec<i64> = outbox.delivery(&endpoint_id, &event_id).await.attempts.iter().map(|a| a.attempt).collect();
    assert_eq!(attempts, [2], "the second claim is attempt 2; the first was never recorded");
}
