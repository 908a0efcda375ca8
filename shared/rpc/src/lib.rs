//! The one place where the chain builds gRPC clients and servers.
//!
//! - [`Dependency`] + [`connect`]: a lazily connecting channel with the three separate timeouts of
//!   R-D1 (connect, idle, and the operation deadline forwarded by [`deadline::client`]), behind
//!   the dependency's bulkhead and circuit breaker.
//! - [`GrpcServer`]: binds, serves one service or several ([`Services`]) on one port with
//!   `grpc.health.v1` (each service SERVING) and reflection, puts every request under the deadline
//!   layer, counts every answer in the chain's metrics and serves until shutdown.
//! - [`health::Command`]: the `healthcheck` subcommand of every service binary.
//! - [`metrics::router`]: `GET /metrics` in Prometheus text, on every port a service serves.

mod client;
pub mod health;
pub mod metrics;
mod server;

pub use client::{Client, Connection, Dependency, connect};
pub use server::{GrpcServer, GrpcService, Role, ServerError, Services, bind, serve_http, shutdown_signal};

mod relay;
pub use relay::{PUSHBACK_HEADER, derive_key, relay};

/// Metadata names the services agree on.
pub mod metadata {
    /// The authenticated client, set by the gateway; scopes idempotency keys and orders.
    pub const CLIENT_ID: &str = "x-client-id";
    /// The idempotency key of a write (1 to 255 visible ASCII characters).
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    pub use crate::relay::PUSHBACK_HEADER as PUSHBACK;
    /// Set to `true` on an answer replayed from an idempotency key's stored response.
    pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
}
