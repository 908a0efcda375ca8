//! The whole chain in one process, and the named scenarios that exercise it.

pub mod chain;
pub mod naive;
pub mod scenario;
pub mod settlement;

pub use chain::{Addresses, Chain, ChainGuardStats, ChainHopStats, ChainSettings};
