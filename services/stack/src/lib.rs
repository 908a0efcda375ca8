#![doc = include_str!("../README.md")]

pub mod chain;
pub mod naive;
pub mod scenario;
pub mod settlement;

pub use chain::{Addresses, Chain, ChainGuardStats, ChainHopStats, ChainSettings};
