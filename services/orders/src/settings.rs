use std::net::SocketAddr;

use deadline::{ForwardPolicy, InboundPolicy};
use idempotency::KeySettings;
use rpc::Dependency;
use resilience::{ChainMode, breaker::BreakerSettings, naive::NaiveSettings};
use serde::{Deserialize, Serialize};

/// Every knob of orders; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// gRPC address.
    pub listen: SocketAddr,
    /// sqlx URL of the order database: `sqlite://…` (the file is created when missing) or
    /// `postgres://…`.
    pub database_url: String,
    /// Expiry of idempotency keys (24 h by default) and how the reaper deletes them.
    pub idempotency: KeySettings,
    /// Deadline for calls that carry none, and the longest accepted.
    pub deadline: InboundPolicy,
    /// Payment: what is left of the deadline minus 200 ms kept for orders' own reply.
    pub payment: Dependency,
    /// `budgeted` (the design) or `naive` (per-hop fixed timeouts and retries, for comparison).
    pub mode: ChainMode,
    /// The naive client's attempts and fixed per-attempt timeout (used in `naive` mode only).
    pub naive: NaiveSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            mode: ChainMode::default(),
            naive: NaiveSettings::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 50052)),
            database_url: "sqlite://orders.db".into(),
            idempotency: KeySettings::default(),
            deadline: InboundPolicy::default(),
            payment: Dependency {
                endpoint: "http://127.0.0.1:50053".into(),
                deadline: ForwardPolicy { reserve_ms: 200, reserve_max_share: 0.2, cap_ms: None, min_forward_ms: 50 },
                // Slowness below is the bank's own, judged by payment's breaker; answers slowed
                // by it must not open this one (which reads share), so only failures count here.
                breaker: BreakerSettings { slow_call_ms: 60_000, ..BreakerSettings::default() },
                ..Dependency::default()
            },
        }
    }
}
