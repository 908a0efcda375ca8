//! What became of a scenario's orders: counted in orders' database while its completer settles
//! the creates that were left half-done, for the scenarios that show it.

use std::time::{Duration, Instant};

use idempotency::{Database, DatabaseError, on_driver};
use serde::Serialize;

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
    async fn read(database: &Database) -> Result<Self, sqlx::Error> {
        let by_status: Vec<(String, i64)> =
            on_driver!(database.reader(), |executor| sqlx::query_as("SELECT status, COUNT(*) FROM orders GROUP BY status")
                .fetch_all(executor)
                .await?);
        let mut counts = Self::default();
        for (status, count) in by_status {
            let count = count as u64;
            match status.as_str() {
                "paid" => counts.paid = count,
                "payment_declined" => counts.declined = count,
                _ => counts.pending += count,
            }
        }
        counts.without_key = on_driver!(database.reader(), |executor| sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM orders o WHERE NOT EXISTS \
             (SELECT 1 FROM idempotency_keys k WHERE k.scope = o.client_id AND k.resource_id = o.order_id)",
        )
        .fetch_one(executor)
        .await?) as u64;
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
    Open(#[from] DatabaseError),
    #[error("counting orders: {0}")]
    Read(#[from] sqlx::Error),
}

/// Counts the chain's orders now, then again every 200 ms until none is pending or `limit` has
/// passed.
pub async fn watch(chain: &Chain, limit: Duration) -> Result<Settlement, WatchError> {
    let database = Database::connect(chain.database_url(orders::HOP).expect("orders keeps a database")).await?;
    let started = Instant::now();
    let before = OrderCounts::read(&database).await?;
    let mut after = before;
    while after.pending > 0 && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
        after = OrderCounts::read(&database).await?;
        eprintln!("  pending orders: {} ({:.1} s)", after.pending, started.elapsed().as_secs_f64());
    }
    Ok(Settlement { before, after, elapsed_ms: started.elapsed().as_secs_f64() * 1e3 })
}
