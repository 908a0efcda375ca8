#![doc = include_str!("../README.md")]

mod admin;
mod bank;
mod callers;
mod error;
mod faults;
mod settings;

pub use bank::{BankState, BankStats};
pub use faults::{Faults, Latency};
pub use settings::Settings;

use std::{net::SocketAddr, sync::Arc};

use proto::bank::v1::bank_server::BankServer;
use rpc::{GrpcServer, ServerError, guards::Guards, ops::OpsServer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The hop name in ledgers and errors.
pub const HOP: &str = "bank-mock";

/// This service in telemetry: the `service.name` and `service.version` of its spans.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: HOP,
    version: env!("CARGO_PKG_VERSION"),
};

/// A bound bank-mock, ready to serve.
pub struct Application {
    grpc: GrpcServer,
    ops: OpsServer,
    admin: TcpListener,
    admin_token: Arc<str>,
    state: Arc<BankState>,
    connections: rpc::connections::ConnectionLimits,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, ServerError> {
        settings
            .faults
            .validate()
            .map_err(|error| ServerError::Settings(format!("faults.{error}")))?;
        let state = BankState::new(settings.faults);
        let service = BankServer::new(bank::BankService::new(state.clone()));
        let tls = rpc::tls::ServiceTls::load(HOP, &settings.tls)
            .map_err(|error| ServerError::Settings(error.to_string()))?
            .watched();
        let grpc = GrpcServer::bind(
            HOP,
            rpc::Role::Inner {
                tls,
                callers: callers::policy(),
            },
            settings.listen,
            settings.deadline,
            service,
        )
        .await?
        .connection_limits(settings.connections);
        let ops =
            OpsServer::bind(&settings.ops, Guards::new(HOP).face("grpc", grpc.stats())).await?;
        let admin = rpc::bind(settings.admin_listen).await?;
        let admin_token = settings.admin_token.unwrap_or_else(random_token).into();
        Ok(Self {
            grpc,
            ops,
            admin,
            admin_token,
            state,
            connections: settings.connections,
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr()
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Where metrics, liveness and readiness are served.
    pub fn ops_addr(&self) -> SocketAddr {
        self.ops.local_addr()
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The bank's state, for in-process fault control and counters.
    pub fn state(&self) -> Arc<BankState> {
        self.state.clone()
    }

    /// Every guard of the service, live: what its operations port shows at `/guards.json`.
    pub fn guards(&self) -> Guards {
        self.ops.guards()
    }

    /// Serves gRPC and admin until `shutdown` is cancelled.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let admin = admin::router(self.state, self.grpc.stats(), self.admin_token);
        let (grpc, admin_listener, connections) = (self.grpc, self.admin, self.connections);
        self.ops
            .serve_while(shutdown, |drain| async move {
                let admin =
                    rpc::serve_http_with(admin_listener, connections, admin, drain.closing());
                tokio::try_join!(grpc.serve(drain), admin)?;
                Ok(())
            })
            .await
    }
}

fn random_token() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}
