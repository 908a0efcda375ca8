//! Resilience of the chain's calls.
//!
//! - [`breaker`]: a circuit breaker per dependency: stop calling a neighbour that keeps failing,
//!   probe it after a pause.
//! - [`bulkhead`]: a concurrency limit per dependency that rejects at once instead of queueing.
//! - [`load_shed`]: bounded intake for servers: refuse at once beyond the limit, never queue.
//! - [`rate_limit`]: quotas with governor: per client at the edge, and a caller's self-limit.
//! - [`retry`]: the gateway's retry policy: transient failures only, a 10 % retry budget with a
//!   floor rate, gRPC's retry throttling on top (no retries while most attempts fail), exponential
//!   backoff with jitter, pushback obeyed, and never a retry the deadline cannot hold.

pub mod breaker;
pub mod bulkhead;
pub mod load_shed;
pub mod rate_limit;
pub mod retry;
pub mod shares;

pub use deadline::PREVIOUS_ATTEMPTS_HEADER;

