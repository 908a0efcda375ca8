//! The one place where the chain builds gRPC clients and servers.
//!
//! - [`Dependency`] + [`connect`]: a lazily connecting channel with the three separate timeouts of
//!   R-D1 (connect, idle, and the operation deadline forwarded by [`deadline::client`]).
//! - [`GrpcServer`]: binds, adds `grpc.health.v1` and reflection, puts every request under the
//!   deadline layer and serves until shutdown.

mod client;
mod server;

pub use client::{Client, Dependency, connect};
pub use server::{GrpcServer, ServerError, bind, serve_http, shutdown_signal};

mod relay;
pub use relay::{PUSHBACK_HEADER, derive_key, relay};
