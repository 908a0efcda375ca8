use std::net::SocketAddr;

use deadline::{ForwardPolicy, InboundPolicy};
use resilience::{
    breaker::BreakerSettings, queue::QueueSettings, rate_limit::QuotaSettings, retry::RetrySettings,
};
use rpc::{Dependency, connections::ConnectionLimits, ops::OpsSettings, tls::TlsSettings};
use serde::{Deserialize, Serialize};

/// Every knob of the gateway; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// HTTP/JSON address.
    pub http_listen: SocketAddr,
    /// gRPC address.
    pub grpc_listen: SocketAddr,
    /// The operations port: metrics, liveness and readiness in plain HTTP, off the public faces,
    /// so that a scrape needs no API key and the series (client ids among them) stay inside; and
    /// how long a stop drains before the ports close.
    pub ops: OpsSettings,
    /// The operation deadline: the default budget and the longest a client may ask for
    /// (`X-Request-Timeout-Ms` or `grpc-timeout`).
    pub deadline: InboundPolicy,
    /// The queue in front of both faces' handlers: admission by queueing time (off: by count).
    pub queue: QueueSettings,
    /// Orders: what is left of the deadline minus a small reserve for the gateway's own reply.
    pub orders: Dependency,
    /// Payment, read for order summaries (at most 300 ms of the deadline).
    pub payment: Dependency,
    /// The bank, read for exchange rates in order summaries (at most 300 ms).
    pub bank: Dependency,
    /// Where personal recommendations come from (orders; at most 200 ms).
    pub recommendations: Dependency,
    /// Shown when personal recommendations cannot be had.
    pub popular_skus: Vec<String>,
    /// Order creations in progress at most (they are the long operations, waiting on the bank);
    /// beyond it they are refused at once, and reads keep the rest of `deadline.max_in_flight`.
    pub max_in_flight_creates: u32,
    /// Of those, the most one client may have in progress: a client whose creations are slow
    /// (a slow body, a slow bank for its orders) cannot take every place from the others.
    pub max_in_flight_creates_per_client: u32,
    /// Orders kept as the last known copy, for reads while orders is unreachable.
    pub order_cache_capacity: usize,
    /// Retries of calls to orders: the only retries in the chain.
    pub retry: RetrySettings,
    /// The clients allowed in. A list, so that configuring it replaces the demo clients.
    pub clients: Vec<ApiClient>,
    /// The quota all requests with a missing or unknown API key share.
    pub unknown_key_quota: QuotaSettings,
    /// How many gateways serve the same clients. Each enforces every quota (the clients' and
    /// `unknown_key_quota`) divided by this, rounded up, so that together they hold a client to
    /// its quota whichever gateway its requests reach. 0 is taken as 1.
    pub replicas: u32,
    /// The gateway's certificate, key and CA, presented to orders, payment and the bank. The
    /// public faces stay plain: clients prove who they are with API keys.
    pub tls: TlsSettings,
    /// Limits on the connections of each of the gateway's ports (each port counts its own, so a
    /// flood of the public faces leaves the metrics port alone).
    pub connections: ConnectionLimits,
}

/// One client: its secret API key, the id that scopes its idempotency keys and orders, and its
/// quota of requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiClient {
    pub api_key: String,
    pub client_id: String,
    #[serde(default = "ApiClient::default_quota")]
    pub quota: QuotaSettings,
}

impl ApiClient {
    fn default_quota() -> QuotaSettings {
        QuotaSettings {
            per_second: 100,
            burst: 200,
        }
    }
}

/// A source of one part of an order summary: a short, capped slice of the deadline, so that a
/// slow part is given up on while the others are shown.
fn summary_source(endpoint: &str, service: &str, cap_ms: u64) -> Dependency {
    Dependency {
        endpoint: endpoint.into(),
        service: service.into(),
        deadline: ForwardPolicy {
            reserve_ms: 20,
            reserve_max_share: 0.2,
            cap_ms: Some(cap_ms),
            min_forward_ms: 20,
        },
        // The cap is the gateway's own choice, not a client's: a call given all of it and still
        // unanswered is the source's fault, although the cap is below the usual judged slice.
        breaker: BreakerSettings {
            slow_call_ms: 60_000,
            min_judged_slice_ms: cap_ms,
            ..BreakerSettings::default()
        },
        ..Dependency::default()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            ops: OpsSettings::on(SocketAddr::from(([127, 0, 0, 1], 9464))),
            deadline: InboundPolicy::default(),
            orders: Dependency {
                endpoint: "http://127.0.0.1:50052".into(),
                service: "orders".into(),
                deadline: ForwardPolicy {
                    reserve_ms: 20,
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
            payment: summary_source("http://127.0.0.1:50053", "payment", 300),
            bank: summary_source("http://127.0.0.1:50054", "bank-mock", 300),
            recommendations: summary_source("http://127.0.0.1:50052", "orders", 200),
            popular_skus: vec!["sku-1".into(), "sku-7".into(), "sku-42".into()],
            queue: QueueSettings::default(),
            max_in_flight_creates: 500,
            max_in_flight_creates_per_client: 250,
            order_cache_capacity: 10_000,
            retry: RetrySettings::default(),
            clients: vec![
                // The demo client the scenarios drive, with room for their loads.
                ApiClient {
                    api_key: "demo-key-1".into(),
                    client_id: "demo-client-1".into(),
                    quota: QuotaSettings {
                        per_second: 5_000,
                        burst: 1_000,
                    },
                },
                // A small quota, to see 429 and the RateLimit headers by hand.
                ApiClient {
                    api_key: "demo-key-2".into(),
                    client_id: "demo-client-2".into(),
                    quota: QuotaSettings {
                        per_second: 5,
                        burst: 10,
                    },
                },
            ],
            unknown_key_quota: QuotaSettings {
                per_second: 20,
                burst: 20,
            },
            replicas: 1,
            tls: TlsSettings::default(),
            connections: ConnectionLimits::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_clients_replace_the_demo_clients() {
        let args = settings::SettingsArgs {
            config: None,
            overrides: vec![
                r#"clients=[{api_key = "team-a-secret", client_id = "team-a"}]"#.into(),
            ],
        };
        let loaded: Settings = settings::load("GATEWAY_TEST", &args).unwrap();
        let expected = ApiClient {
            api_key: "team-a-secret".into(),
            client_id: "team-a".into(),
            quota: ApiClient::default_quota(),
        };
        assert_eq!(loaded.clients, [expected]);
    }
}
