use std::net::SocketAddr;

use deadline::{ForwardPolicy, InboundPolicy};
use idempotency::KeySettings;
use resilience::rate_limit::QuotaSettings;
use rpc::{Dependency, connections::ConnectionLimits, ops::OpsSettings, tls::TlsSettings};
use serde::{Deserialize, Serialize};
use storage::SqliteSettings;

/// Every knob of payment; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// gRPC address.
    pub listen: SocketAddr,
    /// URL of the payment database: `sqlite://…` (created when missing) or `postgres://…`.
    pub database_url: String,
    /// How SQLite is written: when a commit is on disk (`synchronous`: `normal` survives a crash
    /// of the process, `full` a power loss too, at the cost of a sync per commit) and how the one
    /// writer batches commits (`max_batch`, `batch_wait_us`). Unused on PostgreSQL.
    pub sqlite: SqliteSettings,
    /// Expiry of idempotency keys (7 days by default: payments are repeated late) and reaping.
    pub idempotency: KeySettings,
    /// Deadline for calls that carry none, and the longest accepted.
    pub deadline: InboundPolicy,
    /// The bank: at most 1.5 s of the deadline, 300 ms kept for payment's own reply.
    pub bank: Dependency,
    /// This service's certificate, key and CA: mutual TLS with orders, the gateway and the bank.
    pub tls: TlsSettings,
    /// Limits on the connections of each of this service's ports (each port counts its own).
    pub connections: ConnectionLimits,
    /// The operations port: metrics, liveness and readiness in plain HTTP, no business data; and
    /// how long a stop drains before the ports close.
    pub ops: OpsSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50053)),
            database_url: "sqlite://payment.db".into(),
            sqlite: SqliteSettings::default(),
            idempotency: KeySettings {
                ttl_ms: 7 * 24 * 3_600_000,
                ..KeySettings::default()
            },
            deadline: InboundPolicy::default(),
            bank: Dependency {
                endpoint: "http://127.0.0.1:50054".into(),
                service: "bank-mock".into(),
                deadline: ForwardPolicy {
                    reserve_ms: 300,
                    reserve_max_share: 0.2,
                    cap_ms: Some(1_500),
                    min_forward_ms: 20,
                },
                // Slow bank calls may hold at most 20 of payment's calls; the rest are refused at once.
                max_concurrent: 20,
                // The bank's published quota: the excess is refused here, before the call.
                quota: QuotaSettings {
                    per_second: 2_000,
                    burst: 200,
                },
                ..Dependency::default()
            },
            tls: TlsSettings::default(),
            connections: ConnectionLimits::default(),
            ops: OpsSettings::on(SocketAddr::from(([127, 0, 0, 1], 9466))),
        }
    }
}
