#![doc = include_str!("../README.md")]

pub mod breaker;
pub mod bulkhead;
pub mod guarded;
pub mod load_shed;
pub mod queue;
pub mod rate_limit;
pub mod retry;
pub mod shares;
