//! What the gateway does for a client, whichever face (HTTP or gRPC) it came through.

use std::{collections::BTreeMap, sync::Arc};

use proto::{
    common::v1::{CreateOrderRequest, GetOrderRequest, Order, OrderStatus},
    orders::v1::orders_client::OrdersClient,
};
use rpc::{
    Client,
    metadata::{CLIENT_ID, IDEMPOTENCY_KEY},
};
use tonic::Request;

use crate::{error::GatewayError, settings::ApiClient};

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct ClientId(pub String);

#[derive(Debug, Clone)]
pub struct Api {
    orders: OrdersClient<Client>,
    api_keys: Arc<BTreeMap<String, String>>,
}

impl Api {
    pub fn new(orders: Client, clients: Vec<ApiClient>) -> Self {
        let api_keys = clients.into_iter().map(|c| (c.api_key, c.client_id)).collect();
        Self { orders: OrdersClient::new(orders), api_keys: Arc::new(api_keys) }
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
    pub async fn create_order(&self, client: &ClientId, key: &str, order: CreateOrderRequest) -> Result<Order, GatewayError> {
        proto::validate::idempotency_key(key).map_err(|e| GatewayError::field(e.field, e.reason))?;
        proto::validate::create_order(&order).map_err(|e| GatewayError::field(e.field, e.reason))?;
        let mut request = Request::new(order);
        let metadata = request.metadata_mut();
        metadata.insert(CLIENT_ID, metadata_value(&client.0)?);
        metadata.insert(IDEMPOTENCY_KEY, metadata_value(key)?);
        let order = self.orders.clone().create_order(request).await.map_err(|s| GatewayError::Upstream(rpc::relay(&s)))?;
        let order = order.into_inner();
        if order.status() == OrderStatus::PaymentDeclined {
            let reason = order.payment.as_ref().map(|p| p.decline_reason.clone()).unwrap_or_default();
            return Err(GatewayError::PaymentDeclined { order_id: order.order_id, reason });
        }
        Ok(order)
    }

    pub async fn get_order(&self, client: &ClientId, order_id: String) -> Result<Order, GatewayError> {
        if order_id.is_empty() || order_id.len() > proto::validate::MAX_ID_LEN {
            return Err(GatewayError::field("order_id", "must be 1 to 64 characters"));
        }
        let mut request = Request::new(GetOrderRequest { order_id });
        request.metadata_mut().insert(CLIENT_ID, metadata_value(&client.0)?);
        let order = self.orders.clone().get_order(request).await.map_err(|s| GatewayError::Upstream(rpc::relay(&s)))?;
        Ok(order.into_inner())
    }
}

fn metadata_value(value: &str) -> Result<tonic::metadata::AsciiMetadataValue, GatewayError> {
    value.parse().map_err(|_| GatewayError::field("Idempotency-Key", "must be visible ASCII characters"))
}
