//! The gRPC face: `gateway.v1.Gateway`, the same operations as HTTP.

use deadline::Hop;
use proto::{
    common::v1::{CreateOrderRequest, GetOrderRequest, Order},
    gateway::v1::gateway_server::Gateway,
};
use tonic::{Request, Response, Status};
use wire::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

use crate::{api::Api, error::GatewayError};

#[derive(Clone)]
pub(crate) struct GatewayService {
    api: Api,
}

impl GatewayService {
    pub(crate) fn new(api: Api) -> Self {
        Self { api }
    }
}

fn text<'a, T>(request: &'a Request<T>, name: &str) -> Option<&'a str> {
    request
        .metadata()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn create_order(
        &self,
        request: Request<CreateOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let client = self.api.authenticate(text(&request, "authorization"))?;
        let key = text(&request, IDEMPOTENCY_KEY)
            .ok_or_else(|| {
                GatewayError::field(
                    IDEMPOTENCY_KEY,
                    "metadata is required (1 to 255 characters)",
                )
            })?
            .to_owned();
        let hop = Hop::of(&request)?;
        let created = self
            .api
            .create_order(&hop, &client, &key, request.into_inner())
            .await?;
        let mut response = Response::new(created.order);
        if created.replayed {
            response
                .metadata_mut()
                .insert(IDEMPOTENT_REPLAYED, "true".parse().expect("ascii"));
        }
        Ok(response)
    }

    async fn get_order(
        &self,
        request: Request<GetOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let client = self.api.authenticate(text(&request, "authorization"))?;
        let hop = Hop::of(&request)?;
        let read = self
            .api
            .get_order(&hop, &client, request.into_inner().order_id)
            .await?;
        let mut response = Response::new(read.order);
        if let Some(since) = read.stale_since {
            let as_of = humantime::format_rfc3339_millis(since).to_string();
            response.metadata_mut().insert(
                wire::FALLBACK,
                format!("stale-copy; as-of={as_of}").parse().expect("ascii"),
            );
        }
        Ok(response)
    }
}
