//! The example receiver of the chain's webhooks, as a library (for tests and for your own
//! receiver) and as the `webhook-receiver` binary (for the demo stack).
//!
//! `POST /webhooks` verifies the delivery's signature and timestamp ([`Verifier`]), processes each
//! `webhook-id` once ([`SeenIds`]) and answers 2xx for every delivery it accepted, a repeat too,
//! so that the sender stops repeating it, and 401 for one it cannot trust.
//!
//! Why does a receiver dedupe? The sender delivers at least once: it repeats a delivery, with the
//! same `webhook-id`, whenever it cannot tell that the last attempt arrived (a timeout, a lost
//! answer, a crash between sending and recording).

use std::{
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use webhooks::{
    dedupe::SeenIds,
    signature::{ReceivedHeaders, Verifier, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP},
};

/// The path deliveries are posted to.
pub const PATH: &str = "/webhooks";

/// A verified delivery, seen for the first time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The `webhook-id`: the event's id.
    pub id: String,
    /// The body as sent: the event as JSON.
    pub body: Bytes,
}

/// What the receiver does with each delivery, once.
type Process = Box<dyn Fn(Delivery) + Send + Sync>;

pub struct Receiver {
    verifier: Verifier,
    seen: Mutex<SeenIds>,
    process: Process,
}

impl Receiver {
    /// A receiver that remembers processed ids for `retention_secs`: longer than the sender goes
    /// on retrying (its default schedule ends about 28 hours after the first attempt).
    pub fn new(verifier: Verifier, retention_secs: u64, process: impl Fn(Delivery) + Send + Sync + 'static) -> Self {
        Self { verifier, seen: Mutex::new(SeenIds::new(retention_secs)), process: Box::new(process) }
    }

    /// `POST /webhooks`.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new().route(PATH, post(receive)).with_state(self)
    }
}

async fn receive(State(receiver): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let received = ReceivedHeaders { id: header(WEBHOOK_ID), timestamp: header(WEBHOOK_TIMESTAMP), signature: header(WEBHOOK_SIGNATURE) };
    if let Err(error) = receiver.verifier.verify_now(&received, &body) {
        return (StatusCode::UNAUTHORIZED, format!("{error}\n"));
    }
    let id = received.id.expect("a verified delivery has an id");
    let now_secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since_epoch| since_epoch.as_secs());
    // The ids are plain values; a panic elsewhere cannot leave them half-written.
    let first_time = receiver.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).first_time(id, now_secs);
    if !first_time {
        return (StatusCode::OK, "already processed\n".into());
    }
    // Processing here cannot fail. A receiver whose processing can fail calls `SeenIds::forget`
    // then and answers 5xx, so that the sender's retry is processed; one that stores its work
    // records the id in the same transaction instead.
    (receiver.process)(Delivery { id: id.to_owned(), body });
    (StatusCode::NO_CONTENT, String::new())
}
