//! What became of a scenario's orders: counted in orders' database while its completer settles
//! the creates that were left half-done, for the scenarios that show it.

use std::time::{Duration, Instant};

use serde::Serialize;
use storage::{Database, SqliteSettings};

use crate::Chain;

/// Orders by status, and how many of them have lost their idempotency key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OrderCounts {
    pub paid: u64,
    pub declined: u64,
    /// Orders whose payment is unsettled (charged or not, with no answer recorded).
    pub pending: u64,
    /// Orders with no idempotency key naming them: a repeat of their create would pay afresh.
    pub without_key: u64,
}

impl OrderCounts {
    async fn read(database: &Database) -> Result<Self, storage::Error> {
        let by_status: Vec<(String, i64)> = database
            .fetch_all("SELECT status, COUNT(*) FROM orders GROUP BY status", &[])
            .await?;
        let mut counts = Self::default();
        for (status, count) in by_status {
            let count = count as u64;
            match status.as_str() {
                "paid" => counts.paid = count,
                "payment_declined" => counts.declined = count,
                _ => counts.pending += count,
            }
        }
        let without_key: i64 = database
            .fetch_one(
                "SELECT COUNT(*) FROM orders o WHERE NOT EXISTS \
                 (SELECT 1 FROM idempotency_keys k WHERE k.scope = o.client_id AND k.resource_id = o.order_id)",
                &[],
            )
            .await?;
        counts.without_key = without_key as u64;
        Ok(counts)
    }
}

/// The orders when the clients left, and once the completer had settled them (or `limit` passed).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Settlement {
    pub before: OrderCounts,
    pub after: OrderCounts,
    /// From the first count to the last.
    pub elapsed_ms: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("opening orders' database: {0}")]
    Open(storage::Error),
    #[error("counting orders: {0}")]
    Read(#[from] storage::Error),
}

/// Counts the chain's orders now, then again every 200 ms until none is pending or `limit` has
/// passed.
pub async fn watch(chain: &Chain, limit: Duration) -> Result<Settlement, WatchError> {
    // Orders' database, migrated by orders: nothing to apply. On SQLite the file's writer is
    // orders' own, in this process, and the counts run on readers beside it.
    let url = chain
        .database_url(orders::HOP)
        .expect("orders keeps a database");
    let database = Database::open(url, SqliteSettings::default(), |_| Vec::new())
        .await
        .map_err(WatchError::Open)?;
    let started = Instant::now();
    let before = OrderCounts::read(&database).await?;
    let mut after = before;
    while after.pending > 0 && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = OrderCounts::read(&database).await?;
        eprintln!(
            "  pending orders: {} ({:.1} s)",
            after.pending,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(Settlement {
        before,
        after,
        elapsed_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}
