#![doc = include_str!("../README.md")]

// The deadline and its ledger.

/// The caller's remaining budget (gRPC's deadline: 1 to 8 digits and a unit).
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// An HTTP client's deadline for the operation, in milliseconds.
pub const REQUEST_TIMEOUT_MS: &str = "x-request-timeout-ms";
/// Each hop's slice of the deadline, travelling back up with the answer.
pub const DEADLINE_LEDGER: &str = "x-deadline-ledger";
/// The slice a call was given, on its DEADLINE_EXCEEDED: `<ms>` (rounded up), and `; capped` when
/// it was less than what the hop had left after its reserve (so that a retry may get it again).
pub const DEADLINE_SLICE: &str = "x-deadline-slice";
/// On a DEADLINE_EXCEEDED answered without calling: the hop that failed fast. A retry would get
/// even less, so the edge does not retry it.
pub const DEADLINE_FAILED_FAST: &str = "x-deadline-failed-fast";
/// How many earlier attempts of the edge operation a call belongs to (gRPC's retry design, A6):
/// set by the gateway on each retry and passed on by every hop, so the bank tells retries apart.
pub const PREVIOUS_ATTEMPTS: &str = "grpc-previous-rpc-attempts";

// The guards.

/// How long to wait before trying again, in ms (gRPC's retry design, A6); negative: do not.
pub const RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
/// On a failure after which the edge stopped retrying (budget, attempts, an open breaker): why.
/// The edge tells its own clients not to retry it: they would multiply what it already limited.
pub const RETRIES_SPENT: &str = "x-retries-spent";
/// On an answer refused by an open circuit breaker: the dependency.
pub const CIRCUIT_OPEN: &str = "x-circuit-open";
/// On an error passed up from a hop below, unchanged. A breaker judges only its dependency's own
/// failures: orders is not broken because the bank is down.
pub const RELAYED: &str = "x-relayed";
/// On an answer refused by a full bulkhead: the dependency.
pub const BULKHEAD_FULL: &str = "x-bulkhead-full";
/// On a failure answered without doing the work: the service that did nothing with the call,
/// because a guard refused to send it there (a breaker, a bulkhead, a quota, too little
/// deadline) or its intake refused it. Passed up with the failure, so that a caller far above
/// knows that nothing happened at or below that service.
pub const NOT_EXECUTED: &str = "x-not-executed";
/// The client's quota state (the IETF RateLimit fields).
pub const RATE_LIMIT: &str = "ratelimit";
/// The client's quota (the IETF RateLimit fields).
pub const RATE_LIMIT_POLICY: &str = "ratelimit-policy";
/// On an answer made from a fallback: which one, and since when its data is current.
pub const FALLBACK: &str = "x-fallback";

// Who is calling, and idempotency.

/// The client the gateway authenticated, trusted only from the gateway.
pub const CLIENT_ID: &str = "x-client-id";
/// The idempotency key of a write (1 to 255 visible ASCII characters).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// `true` on an answer replayed from an idempotency key's stored response.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// bank-mock's admin API token.
pub const ADMIN_TOKEN: &str = "x-admin-token";

// Webhooks (Standard Webhooks).

/// The event's id, the same on every retry.
pub const WEBHOOK_ID: &str = "webhook-id";
/// When the attempt was signed, in seconds since the Unix epoch.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// `v1,<base64 HMAC-SHA256>`, one entry per active secret.
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Every name above.
pub const ALL: &[&str] = &[
    GRPC_TIMEOUT,
    REQUEST_TIMEOUT_MS,
    DEADLINE_LEDGER,
    DEADLINE_SLICE,
    DEADLINE_FAILED_FAST,
    PREVIOUS_ATTEMPTS,
    RETRY_PUSHBACK_MS,
    RETRIES_SPENT,
    CIRCUIT_OPEN,
    RELAYED,
    BULKHEAD_FULL,
    NOT_EXECUTED,
    RATE_LIMIT,
    RATE_LIMIT_POLICY,
    FALLBACK,
    CLIENT_ID,
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
    ADMIN_TOKEN,
    WEBHOOK_ID,
    WEBHOOK_TIMESTAMP,
    WEBHOOK_SIGNATURE,
];
