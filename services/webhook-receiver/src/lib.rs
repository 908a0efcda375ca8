#![doc = include_str!("../README.md")]

use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex, MutexGuard},
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
    dedupe::{Seen, SeenIds},
    signature::{ReceivedHeaders, Verifier, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP},
};

/// The path deliveries are posted to.
pub const PATH: &str = "/webhooks";

/// The most ids [`Receiver::new`] remembers: at the default retention of 3 days, about 4
/// deliveries a second on average; a few hundred bytes each.
pub const DEFAULT_MAX_IDS: NonZeroUsize = NonZeroUsize::new(1_000_000).expect("not zero");

/// A verified delivery, seen for the first time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The `webhook-id`: the event's id.
    pub id: String,
    /// The body as sent: the event as JSON.
    pub body: Bytes,
}

/// What the receiver does with each delivery, once.
type Process = Arc<dyn Fn(Delivery) + Send + Sync>;

pub struct Receiver {
    verifier: Verifier,
    seen: Mutex<SeenIds>,
    process: Process,
}

impl Receiver {
    /// A receiver that remembers processed ids for `retention_secs` (longer than the sender goes
    /// on retrying: its default schedule ends about 28 hours after the first attempt), at most
    /// [`DEFAULT_MAX_IDS`] of them.
    pub fn new(
        verifier: Verifier,
        retention_secs: u64,
        process: impl Fn(Delivery) + Send + Sync + 'static,
    ) -> Self {
        Self::with_seen_ids(
            verifier,
            SeenIds::new(retention_secs, DEFAULT_MAX_IDS),
            process,
        )
    }

    /// A receiver that remembers ids in `seen`.
    ///
    /// `process` runs on tokio's blocking pool, so it may block. When it panics, the id is
    /// forgotten and the delivery answered 500, so that the sender's retry is processed.
    pub fn with_seen_ids(
        verifier: Verifier,
        seen: SeenIds,
        process: impl Fn(Delivery) + Send + Sync + 'static,
    ) -> Self {
        Self {
            verifier,
            seen: Mutex::new(seen),
            process: Arc::new(process),
        }
    }

    /// `POST /webhooks`.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new().route(PATH, post(receive)).with_state(self)
    }

    fn seen(&self) -> MutexGuard<'_, SeenIds> {
        // The ids are plain values; a panic elsewhere cannot leave them half-written.
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

async fn receive(
    State(receiver): State<Arc<Receiver>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let received = ReceivedHeaders {
        id: header(WEBHOOK_ID),
        timestamp: header(WEBHOOK_TIMESTAMP),
        signature: header(WEBHOOK_SIGNATURE),
    };
    if let Err(error) = receiver.verifier.verify_now(&received, &body) {
        return (StatusCode::UNAUTHORIZED, format!("{error}\n"));
    }
    let id = received
        .id
        .expect("a verified delivery has an id")
        .to_owned();
    let now_secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since_epoch| since_epoch.as_secs());
    match receiver.seen().begin(&id, now_secs) {
        Seen::Processed => return (StatusCode::OK, "already processed\n".into()),
        Seen::InProgress => {
            return (
                StatusCode::CONFLICT,
                "being processed; try again later\n".into(),
            );
        }
        Seen::New => {}
    }
    // In a task of its own: if the sender hangs up first, the outcome is still recorded, and the
    // id does not stay in progress for ever.
    let outcome = tokio::spawn(async move {
        let process = receiver.process.clone();
        let delivery = Delivery {
            id: id.clone(),
            body,
        };
        let processed = tokio::task::spawn_blocking(move || process(delivery))
            .await
            .is_ok();
        let mut seen = receiver.seen();
        if processed {
            seen.processed(&id)
        } else {
            seen.forget(&id)
        }
        processed
    });
    match outcome.await {
        Ok(true) => (StatusCode::NO_CONTENT, String::new()),
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "processing failed; it will be processed when sent again\n".into(),
        ),
    }
}
