//! orders: owns the orders and pays each new one through payment.
//!
//! A create is keyed by the client's idempotency key: the order row is inserted once per key (a
//! unique index, insert-or-get), and a repeat of a create whose payment did not finish resumes it
//! with the same derived payment key, so the bank still charges at most once.

mod error;
mod settings;
mod store;

pub use settings::Settings;

use std::{net::SocketAddr, sync::Arc, time::SystemTime};

use deadline::HopStats;
use error::OrdersError;
use prost::Message;
use proto::{
    common::v1::{CreateOrderRequest, GetOrderRequest, Order},
    orders::v1::orders_server::{Orders, OrdersServer},
    payment::v1::{PayRequest, payment_service_client::PaymentServiceClient},
};
use rpc::{
    Client, GrpcServer, ServerError,
    metadata::{CLIENT_ID, IDEMPOTENCY_KEY},
};
use sha2::{Digest, Sha256};
use store::{NewOrder, Store};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, metadata::MetadataMap};

/// The hop name in ledgers and errors.
pub const HOP: &str = "orders";

pub struct Application {
    grpc: GrpcServer,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, ServerError> {
        let store = Store::open(&settings.database_url)
            .await
            .map_err(|error| ServerError::Settings(format!("database {}: {error}", settings.database_url)))?;
        let payment = rpc::connect("payment", &settings.payment, settings.mode, settings.naive).map_err(|error| ServerError::Settings(format!("payment: {error}")))?;
        let service = OrdersServer::new(OrderService { store, payment: PaymentServiceClient::new(payment) });
        let grpc = GrpcServer::bind(HOP, settings.listen, settings.deadline, service).await?;
        Ok(Self { grpc })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr()
    }

    pub fn hop_stats(&self) -> Arc<HopStats> {
        self.grpc.stats()
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        self.grpc.serve(shutdown.cancelled_owned()).await
    }
}

#[derive(Debug, Clone)]
struct OrderService {
    store: Store,
    payment: PaymentServiceClient<Client>,
}

fn required<'a>(metadata: &'a MetadataMap, name: &'static str) -> Result<&'a str, OrdersError> {
    metadata
        .get(name)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty())
        .ok_or(OrdersError::MissingMetadata(name))
}

impl OrderService {
    async fn create(&self, client_id: &str, key: &str, request: CreateOrderRequest) -> Result<Order, OrdersError> {
        proto::validate::create_order(&request).map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        proto::validate::idempotency_key(key).map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        let fingerprint = hex::encode(Sha256::digest(request.encode_to_vec()));
        let order_id = format!("ord_{}", uuid::Uuid::now_v7().simple());
        let created_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let row = self
            .store
            .insert_or_get(&NewOrder {
                order_id: &order_id,
                client_id,
                idempotency_key: key,
                fingerprint: &fingerprint,
                customer_id: &request.customer_id,
                items: &request.items,
                amount_minor: request.amount_minor,
                currency: &request.currency,
                created_at: &created_at,
            })
            .await?;
        if row.request_fingerprint != fingerprint {
            return Err(OrdersError::KeyReused(row.order_id));
        }
        if !row.is_pending() {
            return row.into_order();
        }
        let mut pay = Request::new(PayRequest {
            order_id: row.order_id.clone(),
            customer_id: request.customer_id,
            amount_minor: request.amount_minor,
            currency: request.currency,
        });
        let payment_key = rpc::derive_key("payment", client_id, key);
        pay.metadata_mut().insert(IDEMPOTENCY_KEY, payment_key.parse().expect("hex is valid metadata"));
        // One call, no retry: the gateway owns retries, and a repeat of this create resumes here.
        let payment = self.payment.clone().pay(pay).await.map_err(OrdersError::Payment)?.into_inner();
        self.store.record_payment(&row.order_id, &payment).await?.into_order()
    }
}

#[tonic::async_trait]
impl Orders for OrderService {
    async fn create_order(&self, request: Request<CreateOrderRequest>) -> Result<Response<Order>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?.to_owned();
        let key = required(request.metadata(), IDEMPOTENCY_KEY)?.to_owned();
        Ok(Response::new(self.create(&client_id, &key, request.into_inner()).await?))
    }

    async fn get_order(&self, request: Request<GetOrderRequest>) -> Result<Response<Order>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?.to_owned();
        let order = self.store.get(&client_id, &request.get_ref().order_id).await?.into_order()?;
        Ok(Response::new(order))
    }
}
