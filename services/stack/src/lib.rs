#![doc = include_str!("../README.md")]

pub mod chain;
pub mod naive;
pub mod scenario;
pub mod settlement;

pub use chain::{Addresses, Chain, ChainGuardStats, ChainHopStats, ChainSettings, SERVICES};

/// The `stack` process in telemetry: the name of what belongs to none of its services.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: "stack",
    version: env!("CARGO_PKG_VERSION"),
};
