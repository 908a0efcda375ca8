//! What the gateway does for a client, whichever face (HTTP or gRPC) it came through.

use std::{collections::BTreeMap, sync::Arc};

use proto::{
    common::v1::{CreateOrderRequest, GetOrderRequest, Order, OrderStatus},
    orders::v1::orders_client::OrdersClient,
};
use rpc::{
    Client,
    metadata::{CLIENT_ID, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED},
};
use resilience::retry::{Call, RetryPolicy};
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tower::{Layer, ServiceExt, retry::RetryLayer, util::BoxCloneSyncService};
use tracing::Instrument;

use crate::{error::GatewayError, settings::ApiClient};

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct ClientId(pub String);

/// One operation on orders, retried by the edge policy.
type Operation<M> = BoxCloneSyncService<Call<M>, Response<Order>, Status>;

/// An order and whether orders replayed it from the idempotency key's stored answer.
pub struct Created {
    pub order: Order,
    pub replayed: bool,
}

#[derive(Clone)]
pub struct Api {
    create: Operation<CreateOrderRequest>,
    get: Operation<GetOrderRequest>,
    api_keys: Arc<BTreeMap<String, String>>,
}

/// `call` as an operation on orders: each attempt in its own span, the whole under `retry`.
fn operation<M, F, Fut>(retry: &RetryPolicy, call: F) -> Operation<M>
where
    M: Clone + Send + Sync + 'static,
    F: Fn(Request<M>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Order>, Status>> + Send + 'static,
{
    let attempt = tower::service_fn(move |call_once: Call<M>| {
        let span = tracing::info_span!("attempt", retry.attempt = call_once.previous_attempts + 1);
        call(call_once.into_request()).instrument(span)
    });
    BoxCloneSyncService::new(RetryLayer::new(retry.clone()).layer(attempt))
}

impl Api {
    /// Reads and writes on orders, both idempotent (writes carry an idempotency key), so both
    /// are retried under the one `retry` policy (one budget for the dependency).
    pub fn new(orders: Client, clients: Vec<ApiClient>, retry: &RetryPolicy) -> Self {
        let api_keys = clients.into_iter().map(|c| (c.api_key, c.client_id)).collect();
        let orders = OrdersClient::new(orders);
        let create = operation(retry, {
            let orders = orders.clone();
            move |request| {
                let mut orders = orders.clone();
                async move { orders.create_order(request).await }
            }
        });
        let get = operation(retry, move |request| {
            let mut orders = orders.clone();
            async move { orders.get_order(request).await }
        });
        Self { create, get, api_keys: Arc::new(api_keys) }
    }

    /// The client owning `Bearer <api key>`.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<ClientId, GatewayError> {
        authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .and_then(|key| self.api_keys.get(key.trim()))
            .map(|client| ClientId(client.clone()))
            .ok_or(GatewayError::Unauthenticated)
    }

    /// Creates and pays an order. A declined payment is an error carrying the order id.
    pub async fn create_order(&self, client: &ClientId, key: &str, order: CreateOrderRequest) -> Result<Created, GatewayError> {
        proto::validate::idempotency_key(key).map_err(|e| GatewayError::field(e.field, e.reason))?;
        proto::validate::create_order(&order).map_err(|e| GatewayError::field(e.field, e.reason))?;
        let mut metadata = MetadataMap::new();
        metadata.insert(CLIENT_ID, metadata_value(&client.0)?);
        metadata.insert(IDEMPOTENCY_KEY, metadata_value(key)?);
        let response = self.create.clone().oneshot(Call::new(order, metadata)).await.map_err(|s| GatewayError::Upstream(rpc::relay(&s)))?;
        let replayed = response.metadata().get(IDEMPOTENT_REPLAYED).is_some_and(|value| value == "true");
        let order = response.into_inner();
        if order.status() == OrderStatus::PaymentDeclined {
            let reason = order.payment.as_ref().map(|p| p.decline_reason.clone()).unwrap_or_default();
            return Err(GatewayError::PaymentDeclined { order_id: order.order_id, reason, replayed });
        }
        Ok(Created { order, replayed })
    }

    pub async fn get_order(&self, client: &ClientId, order_id: String) -> Result<Order, GatewayError> {
        if order_id.is_empty() || order_id.len() > proto::validate::MAX_ID_LEN {
            return Err(GatewayError::field("order_id", "must be 1 to 64 characters"));
        }
        let mut metadata = MetadataMap::new();
        metadata.insert(CLIENT_ID, metadata_value(&client.0)?);
        let call = Call::new(GetOrderRequest { order_id }, metadata);
        let response = self.get.clone().oneshot(call).await.map_err(|s| GatewayError::Upstream(rpc::relay(&s)))?;
        Ok(response.into_inner())
    }
}

fn metadata_value(value: &str) -> Result<tonic::metadata::AsciiMetadataValue, GatewayError> {
    value.parse().map_err(|_| GatewayError::field("Idempotency-Key", "must be visible ASCII characters"))
}
