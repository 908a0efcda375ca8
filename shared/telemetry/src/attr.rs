//! Names of the attributes on the chain's spans, in one place so that dashboards and tests agree.
//! All durations are milliseconds.
//!
//! The request and call spans follow the OpenTelemetry semantic conventions: the names of HTTP
//! and `server.*` come from `opentelemetry-semantic-conventions`; the `rpc.*` names are those of
//! the RPC conventions that trace UIs and dashboards key on (semantic conventions 1.37; later
//! releases, still experimental for RPC, rename them). The chain's own attributes (`hop`, `peer`,
//! `deadline.*`, `retry.*`, …) have namespaces of their own.

pub use opentelemetry_semantic_conventions::attribute::{
    ERROR_TYPE, HTTP_REQUEST_METHOD, HTTP_RESPONSE_STATUS_CODE, HTTP_ROUTE, SERVER_ADDRESS,
    SERVER_PORT, URL_SCHEME,
};

/// The remote-call system: `grpc`.
pub const RPC_SYSTEM: &str = "rpc.system";
/// The full name of the gRPC service called, e.g. `orders.v1.Orders`.
pub const RPC_SERVICE: &str = "rpc.service";
/// The name of the gRPC method called, e.g. `CreateOrder`.
pub const RPC_METHOD: &str = "rpc.method";
/// The gRPC status code of the answer, an integer (0: OK).
pub const RPC_GRPC_STATUS_CODE: &str = "rpc.grpc.status_code";

/// The hop a server span belongs to (`gateway`, `orders`, `payment`, `bank-mock`).
pub const HOP: &str = "hop";
/// The dependency an outgoing call goes to.
pub const PEER: &str = "peer";
/// The budget the hop received.
pub const DEADLINE_RECEIVED_MS: &str = "deadline.received_ms";
/// Time spent at the hop before it forwarded.
pub const DEADLINE_SPENT_MS: &str = "deadline.spent_ms";
/// What it kept for its own reply.
pub const DEADLINE_RESERVED_MS: &str = "deadline.reserved_ms";
/// The budget it gave the next hop.
pub const DEADLINE_FORWARDED_MS: &str = "deadline.forwarded_ms";
/// What was left when it answered.
pub const DEADLINE_LEFT_MS: &str = "deadline.left_ms";
/// On the event of a call an open breaker answered: the breaker's state (`open`).
pub const BREAKER_STATE: &str = "breaker.state";
/// On the same event: time until the breaker lets a probe through.
pub const BREAKER_RETRY_IN_MS: &str = "breaker.retry_in_ms";
/// On the event of a call a full bulkhead refused: the bulkhead's limit of calls in flight.
pub const BULKHEAD_LIMIT: &str = "bulkhead.limit";
/// On a gateway attempt span and its `retrying` event: the attempt's number (1: the first).
pub const RETRY_ATTEMPT: &str = "retry.attempt";
/// On a `retrying` event: the backoff slept before the next attempt (pushback included).
pub const RETRY_BACKOFF_MS: &str = "retry.backoff_ms";
/// On the `retrying stopped` event: why (`success`, `budget`, `deadline`, `breaker`, …).
pub const RETRY_STOP: &str = "retry.stop";
/// On the `retrying stopped` event: attempts made.
pub const RETRY_ATTEMPTS: &str = "retry.attempts";
/// On the event of an answer made from a fallback: which (`stale_copy`, `stale_rate`, `popular`).
pub const FALLBACK_KIND: &str = "fallback.kind";
/// With a stale copy: its age when it answered.
pub const FALLBACK_AGE_MS: &str = "fallback.age_ms";
/// With a stale exchange rate: when the bank quoted it (RFC 3339).
pub const FALLBACK_AS_OF: &str = "fallback.as_of";
