use std::net::SocketAddr;

use deadline::{ForwardPolicy, InboundPolicy};
use idempotency::KeySettings;
use storage::SqliteSettings;

use crate::CompleterSettings;
use outbox::{EndpointLimits, RedeliveryLimits, SecretKeys};
use resilience::breaker::BreakerSettings;
use rpc::{Dependency, connections::ConnectionLimits, ops::OpsSettings, tls::TlsSettings};
use serde::{Deserialize, Serialize};

/// Every knob of orders; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// gRPC address.
    pub listen: SocketAddr,
    /// URL of the order database: `sqlite://…` (the file is created when missing) or
    /// `postgres://…`.
    pub database_url: String,
    /// How SQLite is written: when a commit is on disk (`synchronous`: `normal` survives a crash
    /// of the process, `full` a power loss too, at the cost of a sync per commit) and how the one
    /// writer batches commits (`max_batch`, `batch_wait_us`). Unused on PostgreSQL.
    pub sqlite: SqliteSettings,
    /// Expiry of idempotency keys (24 h by default) and how the reaper deletes them. Must be at
    /// least `deadline.max_ms + completer.window_ms`.
    pub idempotency: KeySettings,
    /// How creates left half-done are settled.
    pub completer: CompleterSettings,
    /// Deadline for calls that carry none, and the longest accepted.
    pub deadline: InboundPolicy,
    /// Payment: what is left of the deadline minus 200 ms kept for orders' own reply.
    pub payment: Dependency,
    /// This service's certificate, key and CA: mutual TLS with the gateway and payment.
    pub tls: TlsSettings,
    /// Limits on the connections of each of this service's ports (each port counts its own).
    pub connections: ConnectionLimits,
    /// The webhook subscription API.
    pub webhooks: WebhookSettings,
    /// The operations port: metrics, liveness and readiness in plain HTTP, no business data; and
    /// how long a stop drains before the ports close.
    pub ops: OpsSettings,
}

/// How orders' `Webhooks` service creates endpoints and rotates their secrets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// How long the previous secrets keep signing after a rotation that names no overlap.
    pub rotation_overlap_ms: u64,
    /// `host:port` receivers accepted over plain http and exempt from the SSRF deny list: for
    /// tests and local demos only, since such a receiver is what the deny list exists to refuse.
    pub test_hosts: Vec<String>,
    /// Deliveries in flight at once to an endpoint created without its own limit.
    pub default_max_in_flight: u32,
    /// Deliveries started per second to an endpoint created without its own limit.
    pub default_rate_per_sec: u32,
    /// The longest range one range redelivery may ask for, in days.
    pub redelivery_max_days: u32,
    /// The most deliveries one range redelivery may send again.
    pub redelivery_max_events: u32,
    /// The keys that seal endpoint secrets at rest, `"<key id>:<base64 of 32 bytes>"`, the first
    /// sealing new ones; required (the sender needs the same keys to open them).
    pub secret_keys: SecretKeys,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        let limits = EndpointLimits::default();
        let redelivery = RedeliveryLimits::default();
        Self {
            rotation_overlap_ms: 24 * 60 * 60 * 1000,
            test_hosts: Vec::new(),
            default_max_in_flight: limits.max_in_flight,
            default_rate_per_sec: limits.rate_per_sec,
            redelivery_max_days: redelivery.max_days,
            redelivery_max_events: redelivery.max_events,
            secret_keys: SecretKeys::default(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50052)),
            database_url: "sqlite://orders.db".into(),
            sqlite: SqliteSettings::default(),
            idempotency: KeySettings::default(),
            completer: CompleterSettings::default(),
            deadline: InboundPolicy::default(),
            payment: Dependency {
                endpoint: "http://127.0.0.1:50053".into(),
                service: "payment".into(),
                deadline: ForwardPolicy {
                    reserve_ms: 200,
                    reserve_max_share: 0.2,
                    cap_ms: None,
                    min_forward_ms: 50,
                },
                // Slowness below is the bank's own, judged by payment's breaker; answers slowed
                // by it must not open this one (which reads share), so only failures count here.
                breaker: BreakerSettings {
                    slow_call_ms: 60_000,
                    ..BreakerSettings::default()
                },
                ..Dependency::default()
            },
            webhooks: WebhookSettings::default(),
            tls: TlsSettings::default(),
            connections: ConnectionLimits::default(),
            ops: OpsSettings::on(SocketAddr::from(([127, 0, 0, 1], 9465))),
        }
    }
}

impl Settings {
    /// Refuses settings under which a key could stop protecting its create: the key must outlive
    /// the longest request and the completer's window, so that a create the completer settles
    /// late can still be replayed to the client who repeats it.
    pub fn check(&self) -> Result<(), String> {
        self.completer.check()?;
        let longest =
            std::time::Duration::from_millis(self.deadline.max_ms + self.completer.window_ms);
        self.idempotency
            .require_ttl(longest, "a key must outlive the longest request (deadline.max_ms) plus the completer's window (completer.window_ms)")
            .map_err(|error| error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_test_hosts_are_a_list_and_empty_by_default() {
        assert!(
            Settings::default().webhooks.test_hosts.is_empty(),
            "production refuses plain http and private addresses"
        );
        let args = settings::SettingsArgs {
            config: None,
            overrides: vec![r#"webhooks.test_hosts=["127.0.0.1:9000", "[::1]:9001"]"#.into()],
        };
        let loaded: Settings = settings::load("ORDERS_TEST", &args).unwrap();
        assert_eq!(loaded.webhooks.test_hosts, ["127.0.0.1:9000", "[::1]:9001"]);
        assert_eq!(loaded.webhooks.rotation_overlap_ms, 86_400_000);
    }

    #[test]
    fn sqlite_settings_are_read_and_a_batch_of_none_is_refused() {
        let args = |overrides: &[&str]| settings::SettingsArgs {
            config: None,
            overrides: overrides.iter().map(|o| o.to_string()).collect(),
        };
        let loaded: Settings = settings::load(
            "ORDERS_TEST",
            &args(&["sqlite.synchronous=\"full\"", "sqlite.max_batch=8"]),
        )
        .unwrap();
        assert_eq!(loaded.sqlite.synchronous, storage::Synchronous::Full);
        assert_eq!(loaded.sqlite.max_batch.get(), 8);
        assert_eq!(
            loaded.sqlite.batch_wait_us, 0,
            "unset keys keep their defaults"
        );
        let zero =
            settings::load::<Settings>("ORDERS_TEST", &args(&["sqlite.max_batch=0"])).unwrap_err();
        assert!(zero.to_string().contains("max_batch"), "{zero}");
        let unknown =
            settings::load::<Settings>("ORDERS_TEST", &args(&["sqlite.batch=8"])).unwrap_err();
        assert!(unknown.to_string().contains("batch"), "{unknown}");
    }

    #[test]
    fn settings_that_would_let_a_key_stop_protecting_its_create_are_refused() {
        assert_eq!(Settings::default().check(), Ok(()));
        let mut settings = Settings::default();
        settings.completer.window_ms = settings.completer.payment_key_ttl_ms;
        assert!(
            settings
                .check()
                .unwrap_err()
                .contains("completer.window_ms"),
            "a window payment's keys do not cover"
        );
        let mut settings = Settings::default();
        settings.idempotency.ttl_ms = settings.completer.window_ms + settings.deadline.max_ms - 1;
        assert!(
            settings.check().unwrap_err().contains("idempotency.ttl_ms"),
            "a key that expires within the completer's window"
        );
        settings.idempotency.ttl_ms += 1;
        assert_eq!(settings.check(), Ok(()));
        let mut settings = Settings::default();
        settings.completer.grace_ms = settings.completer.window_ms;
        assert!(settings.check().unwrap_err().contains("completer.grace_ms"));
    }
}
