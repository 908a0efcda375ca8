use std::time::{Duration, UNIX_EPOCH};

use serde::Serialize;
use storage::{Statement, Tx};

use crate::{OutboxError, new_id};

/// An order was paid.
pub const ORDER_PAID: &str = "order.paid";
/// An order's payment was declined.
pub const ORDER_PAYMENT_DECLINED: &str = "order.payment_declined";
/// One of the client's endpoints was disabled (it answered 410, or failed for too long).
pub const ENDPOINT_DISABLED: &str = "endpoint.disabled";
/// A delivery to one of the client's endpoints ran out of its retry schedule.
pub const ENDPOINT_ATTEMPTS_EXHAUSTED: &str = "endpoint.attempts_exhausted";
/// A test event, sent when the owner asks, to the endpoint asked only.
pub const ENDPOINT_PING: &str = "endpoint.ping";

/// One event type the system emits, as the catalogue shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventType {
    pub name: &'static str,
    pub description: &'static str,
    /// The version of the shape of the event's `data`; it grows when that shape changes.
    pub schema_version: u32,
    /// Whether an endpoint can subscribe to it; a ping goes to the endpoint asked, subscribed or not.
    pub subscribable: bool,
}

/// Every event type the system emits: the one list that the catalogue shows and that endpoints'
/// subscriptions are checked against.
pub const EVENT_TYPES: &[EventType] = &[
    EventType {
        name: ORDER_PAID,
        description: "An order was paid; data: the order.",
        schema_version: 1,
        subscribable: true,
    },
    EventType {
        name: ORDER_PAYMENT_DECLINED,
        description: "An order's payment was declined; data: the order.",
        schema_version: 1,
        subscribable: true,
    },
    EventType {
        name: ENDPOINT_DISABLED,
        description: "One of the client's endpoints was disabled (410 Gone, or failing too long); data: endpoint_id, url, reason.",
        schema_version: 1,
        subscribable: true,
    },
    EventType {
        name: ENDPOINT_ATTEMPTS_EXHAUSTED,
        description: "A delivery to another of the client's endpoints ran out of retries; data: endpoint_id, event_id, event_type.",
        schema_version: 1,
        subscribable: true,
    },
    EventType {
        name: ENDPOINT_PING,
        description: "A test event sent on the owner's request to that endpoint only, subscribed or not; data: endpoint_id.",
        schema_version: 1,
        subscribable: false,
    },
];

/// The event types an endpoint can subscribe to, by name.
pub fn subscribable_event_types() -> impl Iterator<Item = &'static str> {
    EVENT_TYPES
        .iter()
        .filter(|event_type| event_type.subscribable)
        .map(|event_type| event_type.name)
}

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
/// endpoints that subscribe to its type, in `tx`: call it inside the transaction of the state
/// change the event reports (the work of a [`Database::write`](storage::Database::write)).
/// Returns the event id, which is the `webhook-id` of every delivery and every retry; `None`
/// when none of the client's endpoints subscribes to the type, enabled or not: such an event
/// could never be delivered, so it is not kept (a client without webhooks costs its orders one
/// statement that writes nothing).
pub async fn record<D: Serialize>(
    tx: &mut Tx<'_>,
    client_id: &str,
    event: &NewEvent<'_, D>,
    now_ms: i64,
) -> Result<Option<String>, OutboxError> {
    record_for(
        tx,
        client_id,
        event,
        Recipients::Subscribers { except: None },
        now_ms,
    )
    .await
}

/// Who gets an event's deliveries.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Recipients<'a> {
    /// The client's enabled endpoints that subscribe to its type, but `except`.
    Subscribers { except: Option<&'a str> },
    /// This endpoint of the client alone, subscribed or not, enabled or not (a disabled one's
    /// delivery waits, as any other).
    Only(&'a str),
}

/// As [`record`], to `recipients`.
pub(crate) async fn record_for<D: Serialize>(
    tx: &mut Tx<'_>,
    client_id: &str,
    event: &NewEvent<'_, D>,
    recipients: Recipients<'_>,
    now_ms: i64,
) -> Result<Option<String>, OutboxError> {
    let (event_id, [event, deliveries]) = statements(client_id, event, recipients, now_ms, "TRUE")?;
    if tx.execute(event.sql(), &event.params()).await? == 0 {
        return Ok(None);
    }
    tx.execute(deliveries.sql(), &deliveries.params()).await?;
    Ok(Some(event_id))
}

/// [`record`] as two statements, the event and its deliveries, for a unit of work written as
/// statements: they write only `when` holds, a condition they add to their own (such as
/// `idempotency::Effects::WHEN_MOVED` for the effects of a key's phase). When no endpoint
/// subscribes, both write nothing.
pub fn record_statements<D: Serialize>(
    client_id: &str,
    event: &NewEvent<'_, D>,
    now_ms: i64,
    when: &str,
) -> Result<[Statement; 2], OutboxError> {
    Ok(statements(
        client_id,
        event,
        Recipients::Subscribers { except: None },
        now_ms,
        when,
    )?
    .1)
}

/// The event's id, and the statements that insert the event (one row, or none when no
/// recipient subscribes) and its deliveries (one for each enabled recipient), if `when` holds.
fn statements<D: Serialize>(
    client_id: &str,
    event: &NewEvent<'_, D>,
    recipients: Recipients<'_>,
    now_ms: i64,
    when: &str,
) -> Result<(String, [Statement; 2]), OutboxError> {
    let event_id = new_id("msg");
    let occurred =
        humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(now_ms.max(0) as u64));
    let payload = Payload {
        id: &event_id,
        event_type: event.event_type,
        version: event.version,
        timestamp: occurred.to_string(),
        data: event.data,
    };
    let payload = serde_json::to_string(&payload)
        .map_err(|error| OutboxError::Invalid(format!("event data: {error}")))?;
    // `$6` is the one endpoint that is left out (Subscribers) or the only one (Only); `$7` says
    // which. The deliveries' recipients are among the event's, so a delivery never lacks its event.
    let (endpoint, only) = match recipients {
        Recipients::Subscribers { except } => (except, false),
        Recipients::Only(endpoint_id) => (Some(endpoint_id), true),
    };
    let inserted = Statement::new(
        format!(
            "INSERT INTO webhook_events (event_id, client_id, event_type, payload, created_at_ms) \
             SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM webhook_endpoints e \
               WHERE e.client_id = $2 AND (CASE WHEN $7 THEN e.endpoint_id = $6 \
                 ELSE ($6 IS NULL OR e.endpoint_id <> $6) AND EXISTS (SELECT 1 FROM webhook_subscriptions s \
                   WHERE s.endpoint_id = e.endpoint_id AND s.event_type = $3) END)) AND {when}"
        ),
        &[
            &event_id,
            &client_id,
            &event.event_type,
            &payload,
            &now_ms,
            &endpoint,
            &only,
        ],
    );
    let deliveries = Statement::new(
        format!(
            "INSERT INTO webhook_deliveries \
               (endpoint_id, event_id, state, attempts, schedule_step, next_attempt_at_ms, created_at_ms, updated_at_ms) \
             SELECT e.endpoint_id, $1, 'pending', 0, 0, $2, $2, $2 FROM webhook_endpoints e \
             WHERE e.client_id = $3 AND (CASE WHEN $6 THEN e.endpoint_id = $5 \
               ELSE e.state = 'enabled' AND ($5 IS NULL OR e.endpoint_id <> $5) AND EXISTS (SELECT 1 FROM webhook_subscriptions s \
                 WHERE s.endpoint_id = e.endpoint_id AND s.event_type = $4) END) AND {when}"
        ),
        &[
            &event_id,
            &now_ms,
            &client_id,
            &event.event_type,
            &endpoint,
            &only,
        ],
    );
    Ok((event_id, [inserted, deliveries]))
}
