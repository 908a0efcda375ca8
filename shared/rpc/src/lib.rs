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

pub use client::{Client, Connection, Dependency, connect};
pub use dial::{channel, endpoint};
pub use server::{
    GrpcServer, GrpcService, Role, ServerError, Services, bind, reflection, serve_http,
    serve_http_with, shutdown_signal,
};

mod relay;
pub use relay::{derive_key, not_executed, relay};
