//! Names of the attributes on the chain's spans, in one place so that dashboards and tests agree.
//! All durations are milliseconds.

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
/// The gRPC status code of the answer (HTTP answers: the HTTP status).
pub const STATUS_CODE: &str = "rpc.status_code";
