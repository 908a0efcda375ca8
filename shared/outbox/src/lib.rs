//! The webhook tables of the service that owns the events: recipients, the outbox, deliveries and
//! attempts.
//!
//! Why an outbox in the service's own database? An event must go out if and only if the state
//! change it reports happened. Sending from the request handler loses the event when the process
//! dies after the commit, and announces a change that a rollback then undoes. So the event and one
//! delivery row per subscribed recipient are inserted by [`record`] inside the transaction of the
//! change itself, and a separate sender delivers them later, as often as it takes.
//!
//! - [`Subscriptions`]: the recipients' side of the API (create an endpoint with its `whsec_`
//!   secret, rotate the secret with an overlap, disable and enable, the delivery log with every
//!   attempt, redelivery of one event or a time range).
//! - [`Deliveries`]: the sender's side. [`Deliveries::claim`] takes one due delivery of one
//!   endpoint under a lease (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one writer, so
//!   one UPDATE statement is enough), so several senders never attempt the same delivery at once;
//!   [`Deliveries::finish`] records the attempt and what comes next, but only while the lease is
//!   still the caller's. A sender that dies between sending and recording leaves a lease that runs
//!   out, and the delivery is attempted again with the same `webhook-id`: at least once, never
//!   lost, which is why receivers dedupe.

mod deliveries;
mod error;
mod event;
mod redeliveries;
mod retention;
mod subscriptions;

pub use deliveries::{Attempt, Claim, Deliveries, DisableRule, DueEndpoint, Finished, MAX_ERROR_BYTES, Outcome, truncated};
pub use error::OutboxError;
pub use event::{ENDPOINT_DISABLED, EVENT_TYPES, NewEvent, ORDER_PAID, ORDER_PAYMENT_DECLINED, record};
pub use redeliveries::{RedeliveryLimits, RedeliveryRange};
pub use subscriptions::{AttemptLog, DeliveryLog, DeliveryPage, DeliveryQuery, DeliveryState, LogCursor, Endpoint, EndpointLimits, MAX_ENDPOINTS_PER_CLIENT, NewEndpoint, Subscriptions};

use idempotency::{Backend, Migrations};

/// The migrations of the webhook tables for `backend` (kept under their own history), for
/// [`Database::open`](idempotency::Database::open).
pub fn migrations(backend: Backend) -> Migrations {
    let migrations = match backend {
        Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
        Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
    };
    ("webhooks", migrations)
}

/// A new identifier: `prefix` and a time-ordered UUID.
fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}
