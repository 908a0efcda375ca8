use std::{collections::BTreeMap, net::SocketAddr};

use deadline::{ForwardPolicy, InboundPolicy};
use rpc::Dependency;
use serde::{Deserialize, Serialize};

/// Every knob of the gateway; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// HTTP/JSON address.
    pub http_listen: SocketAddr,
    /// gRPC address.
    pub grpc_listen: SocketAddr,
    /// The operation deadline: the default budget and the longest a client may ask for
    /// (`X-Request-Timeout-Ms` or `grpc-timeout`).
    pub deadline: InboundPolicy,
    /// Orders: what is left of the deadline minus a small reserve for the gateway's own reply.
    pub orders: Dependency,
    /// API key → client id. Keys are secrets; client ids scope idempotency keys and orders.
    pub api_keys: BTreeMap<String, String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            deadline: InboundPolicy { default_ms: 2_000, max_ms: 2_000 },
            orders: Dependency {
                endpoint: "http://127.0.0.1:50052".into(),
                deadline: ForwardPolicy { reserve_ms: 20, reserve_max_share: 0.2, cap_ms: None, min_forward_ms: 50 },
                ..Dependency::default()
            },
            api_keys: BTreeMap::from([
                ("demo-key-1".to_owned(), "demo-client-1".to_owned()),
                ("demo-key-2".to_owned(), "demo-client-2".to_owned()),
            ]),
        }
    }
}
