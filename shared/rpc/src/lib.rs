#![doc = include_str!("../README.md")]

pub mod authorize;
mod balance;
mod client;
pub mod connections;
mod decode;
pub mod dev_certs;
mod dial;
pub mod guards;
pub mod health;
pub mod listener;
pub mod ops;
mod serve;
mod server;
pub mod tls;

pub use client::{Client, ClientLayers, Connection, Dependency, Outbound, Traced, connect};
pub use dial::{channel, endpoint};
pub use server::{GrpcServer, GrpcService, Role, ServerError, Services, bind, reflection, serve_http, serve_http_with, shutdown_signal};

mod relay;
pub use relay::{PUSHBACK_HEADER, derive_key, not_executed, relay};

/// Metadata names the services agree on.
pub mod metadata {
    pub use crate::relay::PUSHBACK_HEADER as PUSHBACK;
    /// The authenticated client, set by the gateway; scopes idempotency keys and orders.
    pub use wire::CLIENT_ID;
    /// The idempotency key of a write (1 to 255 visible ASCII characters).
    pub use wire::IDEMPOTENCY_KEY;
    /// Set to `true` on an answer replayed from an idempotency key's stored response.
    pub use wire::IDEMPOTENT_REPLAYED;
}
