use std::time::{Duration, UNIX_EPOCH};

use idempotency::{Transaction, on_driver};
use serde::Serialize;

use crate::{OutboxError, new_id};

/// An order was paid.
pub const ORDER_PAID: &str = "order.paid";
/// An order's payment was declined.
pub const ORDER_PAYMENT_DECLINED: &str = "order.payment_declined";
/// One of the client's endpoints was disabled (it answered 410, or failed for too long).
pub const ENDPOINT_DISABLED: &str = "endpoint.disabled";
/// Every event type an endpoint can subscribe to.
pub const EVENT_TYPES: &[&str] = &[ORDER_PAID, ORDER_PAYMENT_DECLINED, ENDPOINT_DISABLED];

/// An event to put in the outbox.
#[derive(Debug, Clone)]
pub struct NewEvent<'a, D> {
    /// One of [`EVENT_TYPES`].
    pub event_type: &'static str,
    /// The version of the subject's state that the event reports. Deliveries are not ordered
    /// (a retry can overtake a later event), so a receiver keeps the highest version it has seen.
    pub version: i64,
    /// What happened, under `"data"` in the body, serialized as it is (a struct keeps its fields'
    /// order, so an order reads as the API shows it).
    pub data: &'a D,
}

/// The body of every delivery of an event.
#[derive(Serialize)]
struct Payload<'a, D> {
    id: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    version: i64,
    timestamp: String,
    data: &'a D,
}

/// Inserts `event` for `client_id` and one pending delivery for each of the client's enabled
/// endpoints that subscribe to its type, in `transaction`: call it inside the transaction of the
/// state change the event reports. Returns the event id, which is the `webhook-id` of every
/// delivery and every retry; `None` when none of the client's endpoints subscribes to the type,
/// enabled or not: such an event could never be delivered, so it is not kept (a client without
/// webhooks costs its orders one statement that writes nothing).
pub async fn record<D: Serialize>(
    transaction: &mut Transaction,
    client_id: &str,
    event: &NewEvent<'_, D>,
    now_ms: i64,
) -> Result<Option<String>, OutboxError> {
    let event_id = new_id("msg");
    let occurred = humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(now_ms.max(0) as u64));
    let payload = Payload { id: &event_id, event_type: event.event_type, version: event.version, timestamp: occurred.to_string(), data: event.data };
    let payload = serde_json::to_string(&payload).map_err(|error| OutboxError::Invalid(format!("event data: {error}")))?;
    let inserted = on_driver!(&mut *transaction, |executor| sqlx::query(
        "INSERT INTO webhook_events (event_id, client_id, event_type, payload, created_at_ms) \
         SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM webhook_endpoints e \
           JOIN webhook_subscriptions s ON s.endpoint_id = e.endpoint_id WHERE e.client_id = $2 AND s.event_type = $3)",
    )
    .bind(&event_id)
    .bind(client_id)
    .bind(event.event_type)
    .bind(payload)
    .bind(now_ms)
    .execute(executor)
    .await?
    .rows_affected());
    if inserted == 0 {
        return Ok(None);
    }
    on_driver!(transaction, |executor| {
        sqlx::query(
            "INSERT INTO webhook_deliveries \
           (endpoint_id, event_id, state, attempts, schedule_step, next_attempt_at_ms, created_at_ms, updated_at_ms) \
         SELECT e.endpoint_id, $1, 'pending', 0, 0, $2, $2, $2 \
         FROM webhook_endpoints e JOIN webhook_subscriptions s ON s.endpoint_id = e.endpoint_id \
         WHERE e.client_id = $3 AND e.state = 'enabled' AND s.event_type = $4",
        )
        .bind(&event_id)
        .bind(now_ms)
        .bind(client_id)
        .bind(event.event_type)
        .execute(executor)
        .await?;
    });
    Ok(Some(event_id))
}
