use std::net::SocketAddr;

use deadline::{ForwardPolicy, InboundPolicy};
use rpc::Dependency;
use serde::{Deserialize, Serialize};

/// Every knob of orders; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// gRPC address.
    pub listen: SocketAddr,
    /// sqlx URL of the order database; the file is created when missing.
    pub database_url: String,
    /// Deadline for calls that carry none, and the longest accepted.
    pub deadline: InboundPolicy,
    /// Payment: what is left of the deadline minus 200 ms kept for orders' own reply.
    pub payment: Dependency,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50052)),
            database_url: "sqlite://orders.db".into(),
            deadline: InboundPolicy::default(),
            payment: Dependency {
                endpoint: "http://127.0.0.1:50053".into(),
                deadline: ForwardPolicy { reserve_ms: 200, reserve_max_share: 0.2, cap_ms: None, min_forward_ms: 50 },
                ..Dependency::default()
            },
        }
    }
}
