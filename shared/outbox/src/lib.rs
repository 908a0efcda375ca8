#![doc = include_str!("../README.md")]

mod deliveries;
mod error;
mod event;
mod redeliveries;
mod retention;
mod sealed;
mod subscriptions;

pub use deliveries::{
    Attempt, Claim, Deliveries, DeliveryOutcome, DisableRule, DueEndpoint, Finished,
    MAX_ERROR_BYTES, truncated,
};
pub use error::OutboxError;
pub use event::{
    ENDPOINT_ATTEMPTS_EXHAUSTED, ENDPOINT_DISABLED, ENDPOINT_PING, EVENT_TYPES, EventType,
    NewEvent, ORDER_PAID, ORDER_PAYMENT_DECLINED, record, record_statements,
    subscribable_event_types,
};
pub use redeliveries::{RedeliveryLimits, RedeliveryRange};
pub use sealed::{SecretKeys, seal_plaintext_secrets};
pub use subscriptions::{
    AttemptLog, DeliveryLog, DeliveryPage, DeliveryQuery, DeliveryState, Endpoint, EndpointLimits,
    EndpointUpdate, LogCursor, MAX_ENDPOINTS_PER_CLIENT, NewEndpoint, Subscriptions,
};

use storage::{Backend, Migrations};

/// The migrations of the webhook tables for `backend` (kept under their own history), for
/// [`Database::open`](storage::Database::open).
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
