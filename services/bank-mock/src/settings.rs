use std::net::SocketAddr;

use deadline::InboundPolicy;
use rpc::{connections::ConnectionLimits, ops::OpsSettings, tls::TlsSettings};
use serde::{Deserialize, Serialize};

use crate::faults::Faults;

/// Every knob of bank-mock; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// gRPC address of the bank.
    pub listen: SocketAddr,
    /// Admin HTTP address; keep it off public interfaces.
    pub admin_listen: SocketAddr,
    /// Token required in `X-Admin-Token`; a random one is made at start when unset.
    pub admin_token: Option<String>,
    /// Deadline for calls that carry none, and the longest accepted.
    pub deadline: InboundPolicy,
    /// Faults active at start and after `POST /admin/reset`.
    pub faults: Faults,
    /// This service's certificate, key and CA: mutual TLS with payment and the gateway.
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
            listen: SocketAddr::from(([127, 0, 0, 1], 50054)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 8099)),
            admin_token: None,
            deadline: InboundPolicy::default(),
            faults: Faults::default(),
            tls: TlsSettings::default(),
            connections: ConnectionLimits::default(),
            ops: OpsSettings::on(SocketAddr::from(([127, 0, 0, 1], 9467))),
        }
    }
}
