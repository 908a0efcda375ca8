//! The client's webhook subscriptions, kept by orders' `orders.v1.Webhooks` service.
//!
//! Reads, the keyed writes (creating an endpoint, rotating its secret) and updates (which set
//! values, so a repeat changes nothing more) are retried under the edge policy like the order
//! calls; the other writes (disable, enable, delete, redeliver, ping) carry no key, so they are
//! tried once: a retry after a lost answer would queue a redelivery, or a ping, twice.

use std::sync::Arc;

use deadline::Hop;
use proto::orders::v1::{
    CreateEndpointRequest, Endpoint, EndpointRef, EndpointWithSecret, ListDeliveriesRequest,
    ListDeliveriesResponse, ListEndpointsRequest, ListEndpointsResponse, ListEventTypesRequest,
    ListEventTypesResponse, PingResponse, RedeliverRangeRequest, RedeliverRequest,
    RedeliverResponse, RotateSecretRequest, UpdateEndpointRequest, webhooks_client::WebhooksClient,
};
use resilience::retry::{Call, RetryPolicy};
use rpc::Client;
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tower::ServiceExt;
use wire::{CLIENT_ID, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

use crate::{
    edge::{ClientId, Operation, metadata_value, operation},
    error::GatewayError,
};

/// A secret and the endpoint it signs for, and whether orders replayed it from the key's answer.
pub(crate) struct Keyed {
    pub answer: EndpointWithSecret,
    pub replayed: bool,
}

#[derive(Clone)]
pub(crate) struct WebhooksApi {
    webhooks: WebhooksClient<Client>,
    create: Operation<CreateEndpointRequest, EndpointWithSecret>,
    rotate: Operation<RotateSecretRequest, EndpointWithSecret>,
    list: Operation<ListEndpointsRequest, ListEndpointsResponse>,
    get: Operation<EndpointRef, Endpoint>,
    deliveries: Operation<ListDeliveriesRequest, ListDeliveriesResponse>,
    update: Operation<UpdateEndpointRequest, Endpoint>,
    event_types: Operation<ListEventTypesRequest, ListEventTypesResponse>,
}

/// An operation that calls one method of `webhooks` per attempt.
macro_rules! retried {
    ($retry:expr, $webhooks:expr, $method:ident) => {{
        let webhooks = $webhooks.clone();
        operation($retry, move |request| {
            let mut webhooks = webhooks.clone();
            async move { webhooks.$method(request).await }
        })
    }};
}

impl WebhooksApi {
    pub(crate) fn new(orders: Client, retry: &RetryPolicy) -> Self {
        let webhooks = WebhooksClient::new(orders);
        Self {
            create: retried!(retry, webhooks, create_endpoint),
            rotate: retried!(retry, webhooks, rotate_secret),
            list: retried!(retry, webhooks, list_endpoints),
            get: retried!(retry, webhooks, get_endpoint),
            deliveries: retried!(retry, webhooks, list_deliveries),
            update: retried!(retry, webhooks, update_endpoint),
            event_types: retried!(retry, webhooks, list_event_types),
            webhooks,
        }
    }

    pub(crate) async fn create_endpoint(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        key: &str,
        request: CreateEndpointRequest,
    ) -> Result<Keyed, GatewayError> {
        proto::validate::create_endpoint(&request)?;
        Ok(keyed(
            call(&self.create, hop, request, keyed_metadata(client, key)?).await?,
        ))
    }

    pub(crate) async fn rotate_secret(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        key: &str,
        request: RotateSecretRequest,
    ) -> Result<Keyed, GatewayError> {
        proto::validate::id("endpoint_id", &request.endpoint_id)?;
        Ok(keyed(
            call(&self.rotate, hop, request, keyed_metadata(client, key)?).await?,
        ))
    }

    pub(crate) async fn endpoints(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
    ) -> Result<ListEndpointsResponse, GatewayError> {
        Ok(
            call(&self.list, hop, ListEndpointsRequest {}, metadata(client)?)
                .await?
                .into_inner(),
        )
    }

    pub(crate) async fn endpoint(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        endpoint_id: String,
    ) -> Result<Endpoint, GatewayError> {
        proto::validate::id("endpoint_id", &endpoint_id)?;
        Ok(call(
            &self.get,
            hop,
            EndpointRef { endpoint_id },
            metadata(client)?,
        )
        .await?
        .into_inner())
    }

    pub(crate) async fn deliveries(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        request: ListDeliveriesRequest,
    ) -> Result<ListDeliveriesResponse, GatewayError> {
        proto::validate::list_deliveries(&request)?;
        Ok(call(&self.deliveries, hop, request, metadata(client)?)
            .await?
            .into_inner())
    }

    pub(crate) async fn update_endpoint(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        request: UpdateEndpointRequest,
    ) -> Result<Endpoint, GatewayError> {
        proto::validate::update_endpoint(&request)?;
        Ok(call(&self.update, hop, request, metadata(client)?)
            .await?
            .into_inner())
    }

    /// Tried once, like a redelivery: a repeat would send a second ping.
    pub(crate) async fn ping(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        endpoint_id: String,
    ) -> Result<PingResponse, GatewayError> {
        proto::validate::id("endpoint_id", &endpoint_id)?;
        let request = once(hop, client, EndpointRef { endpoint_id })?;
        self.webhooks
            .clone()
            .ping_endpoint(request)
            .await
            .map(Response::into_inner)
            .map_err(upstream)
    }

    pub(crate) async fn event_types(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
    ) -> Result<ListEventTypesResponse, GatewayError> {
        Ok(call(
            &self.event_types,
            hop,
            ListEventTypesRequest {},
            metadata(client)?,
        )
        .await?
        .into_inner())
    }

    pub(crate) async fn set_enabled(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        endpoint_id: String,
        enabled: bool,
    ) -> Result<Endpoint, GatewayError> {
        proto::validate::id("endpoint_id", &endpoint_id)?;
        let request = once(hop, client, EndpointRef { endpoint_id })?;
        let mut webhooks = self.webhooks.clone();
        let answer = if enabled {
            webhooks.enable_endpoint(request).await
        } else {
            webhooks.disable_endpoint(request).await
        };
        answer.map(Response::into_inner).map_err(upstream)
    }

    /// Tried once, like disabling: a repeat after a lost answer finds nothing and says so.
    pub(crate) async fn delete_endpoint(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        endpoint_id: String,
    ) -> Result<(), GatewayError> {
        proto::validate::id("endpoint_id", &endpoint_id)?;
        let request = once(hop, client, EndpointRef { endpoint_id })?;
        self.webhooks
            .clone()
            .delete_endpoint(request)
            .await
            .map(drop)
            .map_err(upstream)
    }

    pub(crate) async fn redeliver(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        request: RedeliverRequest,
    ) -> Result<RedeliverResponse, GatewayError> {
        proto::validate::redeliver(&request)?;
        let request = once(hop, client, request)?;
        self.webhooks
            .clone()
            .redeliver(request)
            .await
            .map(Response::into_inner)
            .map_err(upstream)
    }

    pub(crate) async fn redeliver_range(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        request: RedeliverRangeRequest,
    ) -> Result<RedeliverResponse, GatewayError> {
        proto::validate::redeliver_range(&request)?;
        let request = once(hop, client, request)?;
        self.webhooks
            .clone()
            .redeliver_range(request)
            .await
            .map(Response::into_inner)
            .map_err(upstream)
    }
}

async fn call<M, R>(
    operation: &Operation<M, R>,
    hop: &Arc<Hop>,
    message: M,
    metadata: MetadataMap,
) -> Result<Response<R>, GatewayError> {
    operation
        .clone()
        .oneshot(Call::new(message, metadata, hop.clone()))
        .await
        .map_err(upstream)
}

fn keyed(response: Response<EndpointWithSecret>) -> Keyed {
    let replayed = response
        .metadata()
        .get(IDEMPOTENT_REPLAYED)
        .is_some_and(|value| value == "true");
    Keyed {
        answer: response.into_inner(),
        replayed,
    }
}

/// A request tried once, under the hop's deadline and the client's id.
fn once<M>(hop: &Arc<Hop>, client: &ClientId, message: M) -> Result<Request<M>, GatewayError> {
    let mut request = hop.request(message);
    *request.metadata_mut() = metadata(client)?;
    Ok(request)
}

fn metadata(client: &ClientId) -> Result<MetadataMap, GatewayError> {
    let mut metadata = MetadataMap::new();
    metadata.insert(CLIENT_ID, metadata_value(&client.0)?);
    Ok(metadata)
}

fn keyed_metadata(client: &ClientId, key: &str) -> Result<MetadataMap, GatewayError> {
    proto::validate::idempotency_key(key)?;
    let mut metadata = metadata(client)?;
    metadata.insert(IDEMPOTENCY_KEY, metadata_value(key)?);
    Ok(metadata)
}

fn upstream(status: Status) -> GatewayError {
    GatewayError::Upstream(rpc::relay(&status))
}
