//! Range redeliveries: asked for by a client, capped, then run by the sender in batches.
//!
//! Why batches, and not one statement? A range can hold many thousands of deliveries; rewriting
//! them in one transaction holds the database's write lock (on SQLite, the only one) while the
//! orders' own commits wait. So the request only checks the caps and stores the range with a
//! cursor, and the sender resets the deliveries a batch at a time, each batch in a short
//! transaction of its own that moves the cursor with it: a crash loses nothing, and the next batch
//! starts where the last committed one ended.

use storage::{Database, Tx};

use crate::OutboxError;

/// The events of a range redelivery: the client's, created in `[from_ms, until_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryRange {
    pub from_ms: i64,
    pub until_ms: i64,
    /// Whether deliveries already delivered go out again too; by default only those not
    /// delivered (pending, undelivered, or missed while the endpoint was disabled).
    pub include_delivered: bool,
}

/// How much one range redelivery may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedeliveryLimits {
    /// The longest range, in days.
    pub max_days: u32,
    /// The most deliveries one range redelivery sends again.
    pub max_events: u32,
}

impl Default for RedeliveryLimits {
    fn default() -> Self {
        Self {
            max_days: 14,
            max_events: 20_000,
        }
    }
}

const DAY_MS: i64 = 86_400_000;

/// The events of the range that the endpoint subscribes to and that go out again: those with a
/// delivery (not delivered, unless `$5`), and those it has none of but existed for (missed while
/// it was disabled). `$1` endpoint, `$2` client, `$3`/`$4` the bounds as `(created_at_ms,
/// event_id)` keys after `($3, $6)` and up to `($4, $7)`, `$5` include_delivered.
macro_rules! batch_events {
    () => {
        "SELECT e.event_id, e.created_at_ms FROM webhook_events e \
           JOIN webhook_subscriptions s ON s.endpoint_id = $1 AND s.event_type = e.event_type \
           JOIN webhook_endpoints p ON p.endpoint_id = $1 \
           LEFT JOIN webhook_deliveries d ON d.endpoint_id = $1 AND d.event_id = e.event_id \
         WHERE e.client_id = $2 \
           AND (e.created_at_ms > $3 OR (e.created_at_ms = $3 AND e.event_id > $6)) \
           AND (e.created_at_ms < $4 OR (e.created_at_ms = $4 AND e.event_id <= $7)) \
           AND (CASE WHEN d.event_id IS NULL THEN e.created_at_ms >= p.created_at_ms ELSE ($5 OR d.state <> 'delivered') END)"
    };
}

/// Checks `range` against `limits` and stores it for the sender; returns how many deliveries it
/// will send again (counted now; a range with none is not stored). One range at a time per
/// endpoint: another while one runs is [`OutboxError::Busy`].
pub(crate) async fn request(
    database: &Database,
    client_id: &str,
    endpoint_id: &str,
    range: RedeliveryRange,
    limits: RedeliveryLimits,
    now_ms: i64,
) -> Result<u64, OutboxError> {
    if range.until_ms <= range.from_ms {
        return Err(OutboxError::Invalid(
            "until: must be later than from".into(),
        ));
    }
    if range.until_ms - range.from_ms > i64::from(limits.max_days) * DAY_MS {
        return Err(OutboxError::Invalid(format!(
            "until: a range redelivery spans at most {} days; ask for several shorter ranges",
            limits.max_days
        )));
    }
    // Counted up to one past the cap, so that a huge range costs no more than a capped one.
    let count = concat!(
        "SELECT COUNT(*) FROM (",
        batch_events!(),
        " LIMIT $8) counted"
    );
    let (events,): (i64,) = database
        .fetch_one(
            count,
            &[
                &endpoint_id,
                &client_id,
                &range.from_ms,
                &range.until_ms,
                &range.include_delivered,
                &"",
                &"",
                &(i64::from(limits.max_events) + 1),
            ],
        )
        .await?;
    if events > i64::from(limits.max_events) {
        return Err(OutboxError::Invalid(format!(
            "from: the range holds more than {} deliveries to send again; ask for several shorter ranges",
            limits.max_events
        )));
    }
    if events == 0 {
        return Ok(0);
    }
    // One statement: a range still running keeps its row, and the insert changes nothing.
    let (endpoint, client) = (endpoint_id.to_owned(), client_id.to_owned());
    let stored = database
        .write(async move |tx| {
            tx.execute(
                "INSERT INTO webhook_redeliveries (endpoint_id, client_id, until_ms, include_delivered, cursor_created_at_ms, cursor_event_id, \
                   requested_at_ms, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, '', $6, $6) \
                 ON CONFLICT (endpoint_id) DO UPDATE SET client_id = excluded.client_id, until_ms = excluded.until_ms, \
                   include_delivered = excluded.include_delivered, cursor_created_at_ms = excluded.cursor_created_at_ms, \
                   cursor_event_id = '', requested_at_ms = excluded.requested_at_ms, updated_at_ms = excluded.updated_at_ms, finished_at_ms = NULL \
                 WHERE webhook_redeliveries.finished_at_ms IS NOT NULL",
                // The cursor is just before the range: `(from_ms, '')` precedes every event id.
                &[&endpoint, &client, &range.until_ms, &range.include_delivered, &range.from_ms, &now_ms],
            )
            .await
        })
        .await?;
    if stored == 0 {
        return Err(OutboxError::Busy(format!(
            "a range redelivery of endpoint {endpoint_id:?} is still running; ask again when it is done"
        )));
    }
    Ok(u64::try_from(events).unwrap_or(0))
}

storage::row! {
    #[derive(Debug)]
    struct Running {
        endpoint_id: String,
        client_id: String,
        until_ms: i64,
        include_delivered: bool,
        cursor_created_at_ms: i64,
        cursor_event_id: String,
    }
}

/// Runs the next batch of at most `batch` deliveries of the running range redelivery whose turn
/// is oldest, in one transaction; returns how many deliveries it queued, `None` when no range
/// redelivery is running.
pub(crate) async fn next_batch(
    database: &Database,
    batch: u32,
    now_ms: i64,
) -> Result<Option<u64>, OutboxError> {
    database
        .write(async move |tx| {
            let running: Option<Running> = tx
                .fetch_optional(
                    "SELECT endpoint_id, client_id, until_ms, include_delivered, cursor_created_at_ms, cursor_event_id FROM webhook_redeliveries \
                     WHERE finished_at_ms IS NULL ORDER BY updated_at_ms, endpoint_id LIMIT 1",
                    &[],
                )
                .await?;
            let Some(running) = running else {
                return Ok(None);
            };
            // The batch ends at its last event, or at the range's end when fewer are left.
            let last_of_batch = concat!(batch_events!(), " ORDER BY e.created_at_ms, e.event_id LIMIT 1 OFFSET $8");
            let last: Option<(String, i64)> = tx
                .fetch_optional(
                    last_of_batch,
                    &[
                        &running.endpoint_id,
                        &running.client_id,
                        &running.cursor_created_at_ms,
                        &running.until_ms,
                        &running.include_delivered,
                        &running.cursor_event_id,
                        &"",
                        &(i64::from(batch.max(1)) - 1),
                    ],
                )
                .await?;
            // `(until_ms, "")` is no event's key: up to it is every event before until_ms.
            let (end_ms, end_event_id) = match &last {
                Some((event_id, created_at_ms)) => (*created_at_ms, event_id.as_str()),
                None => (running.until_ms, ""),
            };
            let finished_at_ms = last.is_none().then_some(now_ms);
            // The cursor moves first, on the condition that it is where this batch started: a
            // sender running the same batch at once changes nothing, and this one gives its batch
            // up.
            let moved = tx
                .execute(
                    "UPDATE webhook_redeliveries SET cursor_created_at_ms = $1, cursor_event_id = $2, updated_at_ms = $3, finished_at_ms = $4 \
                     WHERE endpoint_id = $5 AND cursor_created_at_ms = $6 AND cursor_event_id = $7",
                    &[
                        &end_ms,
                        &end_event_id,
                        &now_ms,
                        &finished_at_ms,
                        &running.endpoint_id,
                        &running.cursor_created_at_ms,
                        &running.cursor_event_id,
                    ],
                )
                .await?;
            if moved == 0 {
                return Ok(Some(0));
            }
            Ok(Some(queue(tx, &running, end_ms, end_event_id, now_ms).await?))
        })
        .await
}

/// Makes the batch's deliveries pending again, due now, at a new round of the schedule, and
/// inserts those the endpoint missed.
async fn queue(
    tx: &mut Tx<'_>,
    running: &Running,
    end_ms: i64,
    end_event_id: &str,
    now_ms: i64,
) -> Result<u64, OutboxError> {
    let again = concat!(
        "UPDATE webhook_deliveries SET state = 'pending', schedule_step = 0, next_attempt_at_ms = $8, updated_at_ms = $8, \
           claim_token = NULL, claimed_until_ms = NULL \
         WHERE endpoint_id = $1 AND event_id IN (SELECT event_id FROM (",
        batch_events!(),
        ") batch)"
    );
    let missed = concat!(
        "INSERT INTO webhook_deliveries (endpoint_id, event_id, state, attempts, schedule_step, next_attempt_at_ms, created_at_ms, updated_at_ms) \
         SELECT $1, event_id, 'pending', 0, 0, $8, $8, $8 FROM (",
        batch_events!(),
        // SQLite reads `ON` after a bare FROM as a join's; a WHERE ends the SELECT first.
        ") batch WHERE TRUE \
         ON CONFLICT (endpoint_id, event_id) DO NOTHING"
    );
    let mut queued = 0;
    for statement in [again, missed] {
        queued += tx
            .execute(
                statement,
                &[
                    &running.endpoint_id,
                    &running.client_id,
                    &running.cursor_created_at_ms,
                    &end_ms,
                    &running.include_delivered,
                    &running.cursor_event_id,
                    &end_event_id,
                    &now_ms,
                ],
            )
            .await?;
    }
    Ok(queued)
}
