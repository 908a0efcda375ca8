//! Retention: events past it are deleted, with their deliveries and attempts, in batches.
//!
//! Why? The outbox, the deliveries and the attempt log grow with every order; without an end they
//! grow for ever. An event is kept for the retention after it was created (its deliveries can be
//! listed and redelivered until then), and longer while any of its deliveries is still being
//! delivered: leased to a sender, or pending at an enabled endpoint. A delivery pending at a
//! disabled endpoint does not keep it: nothing is sending it, and an owner who enables the
//! endpoint after the retention gets only the newer events.

use storage::{Database, Param, Tx};

use crate::OutboxError;

/// Events past retention that nothing still delivers, oldest first: `$1` the cutoff, `$2` how many.
const EXPIRED_EVENTS: &str = "SELECT v.event_id FROM webhook_events v WHERE v.created_at_ms < $1 \
     AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d JOIN webhook_endpoints e ON e.endpoint_id = d.endpoint_id \
       WHERE d.event_id = v.event_id AND (d.claim_token IS NOT NULL OR (d.state = 'pending' AND e.state = 'enabled'))) \
     ORDER BY v.created_at_ms, v.event_id LIMIT $2";

/// Deletes the events created before `now_ms - retention_ms` that nothing still delivers, with
/// their deliveries and attempts, `batch` events per transaction; returns how many events.
pub(crate) async fn reap(
    database: &Database,
    retention_ms: i64,
    batch: u32,
    now_ms: i64,
) -> Result<u64, OutboxError> {
    let batch = batch.max(1);
    let cutoff_ms = now_ms.saturating_sub(retention_ms);
    let mut reaped = 0;
    loop {
        let deleted = database
            .write(async move |tx| {
                let expired: Vec<(String,)> = tx
                    .fetch_all(EXPIRED_EVENTS, &[&cutoff_ms, &i64::from(batch)])
                    .await?;
                let event_ids: Vec<String> =
                    expired.into_iter().map(|(event_id,)| event_id).collect();
                // Attempts, then deliveries, then events: each row before the one it refers to.
                for table in ["webhook_attempts", "webhook_deliveries", "webhook_events"] {
                    delete(tx, table, &event_ids).await?;
                }
                Ok::<_, OutboxError>(event_ids.len())
            })
            .await?;
        reaped += deleted as u64;
        if deleted < batch as usize {
            return Ok(reaped);
        }
    }
}

/// Deletes the rows of `table` that belong to `event_ids`.
async fn delete(tx: &mut Tx<'_>, table: &str, event_ids: &[String]) -> Result<(), OutboxError> {
    if event_ids.is_empty() {
        return Ok(());
    }
    // Only numbered placeholders are built into the text; the ids are bound.
    let placeholders: Vec<String> = (1..=event_ids.len()).map(|n| format!("${n}")).collect();
    let statement = format!(
        "DELETE FROM {table} WHERE event_id IN ({})",
        placeholders.join(", ")
    );
    let params: Vec<&dyn Param> = event_ids
        .iter()
        .map(|event_id| event_id as &dyn Param)
        .collect();
    tx.execute(&statement, &params).await?;
    Ok(())
}
