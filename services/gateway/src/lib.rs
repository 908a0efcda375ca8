#![doc = include_str!("../README.md")]

mod api;
mod edge;
mod error;
mod fallback;
mod grpc;
mod rate_limit;
mod rest;
mod settings;
mod webhooks;

pub use settings::{ApiClient, Settings};

use std::{net::SocketAddr, sync::Arc};

use deadline::{HopStats, server::DeadlineLayer};
use proto::{
    bank::v1::bank_client::BankClient, gateway::v1::gateway_server::GatewayServer,
    orders::v1::orders_client::OrdersClient,
    payment::v1::payment_service_client::PaymentServiceClient,
};
use resilience::{
    load_shed::{Intake, LoadShedLayer},
    queue::{Queue, QueueLayer},
    retry::RetryPolicy,
};
use rpc::{GrpcServer, ServerError, guards::Guards, ops::OpsServer};
use telemetry::metrics::RequestMetricsLayer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The hop name in ledgers and errors.
pub const HOP: &str = "gateway";

/// This service in telemetry: the `service.name` and `service.version` of its spans.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: HOP,
    version: env!("CARGO_PKG_VERSION"),
};

pub struct Application {
    grpc: GrpcServer,
    http: TcpListener,
    http_router: axum::Router,
    ops: OpsServer,
    connections: rpc::connections::ConnectionLimits,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, ServerError> {
        let tls = rpc::tls::ServiceTls::load(HOP, &settings.tls)
            .map_err(|error| ServerError::Settings(error.to_string()))?
            .watched();
        let connect = |name: &'static str, dependency: &rpc::Dependency| {
            rpc::connect(HOP, name, dependency, &tls)
                .map_err(|error| ServerError::Settings(format!("{name}: {error}")))
        };
        let (orders, payment, bank) = (
            connect("orders", &settings.orders)?,
            connect("payment", &settings.payment)?,
            connect("bank-mock", &settings.bank)?,
        );
        let recommendations = connect("recommendations", &settings.recommendations)?;
        let retry = RetryPolicy::new(&settings.retry, settings.orders.deadline)
            .map_err(|error| ServerError::Settings(error.to_string()))?;
        let limits = rate_limit::ClientLimits::new(
            &settings.clients,
            settings.unknown_key_quota,
            settings.replicas,
        );
        let guards = Guards::new(HOP)
            .caller_quotas(limits.clone())
            .dependency(orders.guards.retried_under(retry.clone()))
            .dependency(payment.guards)
            .dependency(bank.guards)
            .dependency(recommendations.guards);
        let sources = api::SummarySources {
            payment: PaymentServiceClient::new(payment.client),
            bank: BankClient::new(bank.client),
            recommendations: OrdersClient::new(recommendations.client),
            popular: Arc::new(settings.popular_skus.clone()),
        };
        let api = api::Api::new(
            orders.client,
            settings.clients,
            &retry,
            sources,
            settings.order_cache_capacity,
        );
        // One queue for both faces: their requests share the gateway's workers.
        let queue = settings
            .queue
            .enabled
            .then(|| Queue::new(HOP, settings.queue));
        let mut services =
            rpc::Services::new(GatewayServer::new(grpc::GatewayService::new(api.clone())));
        if let Some(queue) = &queue {
            services = services.queued(queue.clone());
        }
        let grpc = GrpcServer::bind_all(
            HOP,
            rpc::Role::Edge,
            settings.grpc_listen,
            settings.deadline,
            services,
        )
        .await?
        .layer(rate_limit::RateLimitLayer::new(limits.clone()))
        .connection_limits(settings.connections);
        let http_stats = HopStats::new();
        let creates = Intake::with_caller_share(
            "gateway (order creation)",
            settings.max_in_flight_creates,
            settings.max_in_flight_creates_per_client,
        );
        let http_router = rest::router(api, creates)
            .layer(tower::util::option_layer(
                queue.clone().map(QueueLayer::new),
            ))
            .layer(
                DeadlineLayer::new(
                    HOP,
                    rest::HttpDeadline {
                        policy: settings.deadline,
                    },
                    http_stats.clone(),
                )
                .at_edge(),
            )
            .layer(LoadShedLayer::new(Intake::new(
                HOP,
                settings.deadline.max_in_flight,
            )))
            .layer(telemetry::trace::ServerTraceLayer::new(HOP))
            // Outermost but for counting: the quota is checked before anything else happens.
            .layer(rate_limit::RateLimitLayer::new(limits))
            .layer(RequestMetricsLayer::new(HOP, []))
            .layer(axum::middleware::from_fn(rest::problems::problem_answers));
        let http = rpc::bind(settings.http_listen).await?;
        let guards = guards
            .face("grpc", grpc.stats())
            .face("http", http_stats)
            .queue(queue);
        let ops = OpsServer::bind(&settings.ops, guards).await?;
        Ok(Self {
            grpc,
            http,
            http_router,
            ops,
            connections: settings.connections,
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr()
    }

    /// Where metrics, liveness and readiness are served.
    pub fn ops_addr(&self) -> SocketAddr {
        self.ops.local_addr()
    }

    /// Every guard of the gateway, live: what its operations port shows at `/guards.json`.
    pub fn guards(&self) -> Guards {
        self.ops.guards()
    }

    /// Serves both faces until `shutdown` is cancelled and the drain has passed.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let (grpc, http, router, connections) =
            (self.grpc, self.http, self.http_router, self.connections);
        self.ops
            .serve_while(shutdown, |drain| async move {
                let http = rpc::serve_http_with(http, connections, router, drain.closing());
                tokio::try_join!(grpc.serve(drain), http)?;
                Ok(())
            })
            .await
    }
}
