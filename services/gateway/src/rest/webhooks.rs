//! The webhook routes of the HTTP/JSON face, under `/v1/webhooks/endpoints`.

use axum::{
    Json,
    body::Bytes,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use proto::orders::v1::{
    Attempt, CreateEndpointRequest, Delivery, Endpoint, EventType, EventTypeNames,
    ListDeliveriesRequest, RedeliverRangeRequest, RedeliverRequest, RotateSecretRequest,
    UpdateEndpointRequest,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::extract::{IdempotencyKey, JsonBody, RequestHop, json_body, required};
use crate::edge::ClientId;
use crate::{
    api::Api,
    error::{GatewayError, Problem},
    webhooks::Keyed,
};

pub(super) fn routes() -> OpenApiRouter<Api> {
    OpenApiRouter::new()
        .routes(routes!(create_endpoint, list_endpoints))
        .routes(routes!(get_endpoint, update_endpoint, delete_endpoint))
        .routes(routes!(rotate_secret))
        .routes(routes!(disable_endpoint))
        .routes(routes!(enable_endpoint))
        .routes(routes!(list_deliveries))
        .routes(routes!(redeliver))
        .routes(routes!(redeliver_range))
        .routes(routes!(ping_endpoint))
        .routes(routes!(list_event_types))
}

/// The endpoint a path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct EndpointPath {
    /// The endpoint's `endpoint_id`.
    #[param(min_length = 1, max_length = 64)]
    endpoint_id: String,
}

/// The event of an endpoint a path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct EventPath {
    /// The endpoint's `endpoint_id`.
    #[param(min_length = 1, max_length = 64)]
    endpoint_id: String,
    /// The event's id.
    #[param(min_length = 1, max_length = 64)]
    event_id: String,
}

/// `POST /v1/webhooks/endpoints` body; see the orders face's `NewOrder` for why fields are optional.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "A webhook endpoint to create.")]
struct NewEndpoint {
    /// An `https` URL (at most 2048 characters) on a public address.
    #[schema(required = true, value_type = String, min_length = 1, max_length = 2048, example = "https://example.com/webhooks")]
    url: Option<String>,
    /// The event types to send, e.g. `order.paid`, `order.payment_declined`.
    #[schema(required = true, value_type = Vec<String>, example = json!(["order.paid"]))]
    event_types: Option<Vec<String>>,
    /// Deliveries in flight at once to this endpoint; left out (or `null`) for the default.
    #[schema(minimum = 1, maximum = 64)]
    max_in_flight: Option<u32>,
    /// Deliveries per second at most; left out (or `null`) for the default.
    #[schema(minimum = 1, maximum = 1000)]
    rate_per_sec: Option<u32>,
}

impl NewEndpoint {
    fn into_request(self) -> Result<CreateEndpointRequest, GatewayError> {
        Ok(CreateEndpointRequest {
            url: required(self.url, "url")?,
            event_types: required(self.event_types, "event_types")?,
            max_in_flight: positive(self.max_in_flight, "max_in_flight")?,
            rate_per_sec: positive(self.rate_per_sec, "rate_per_sec")?,
        })
    }
}

/// An optional number as the wire has it, where 0 means "the default". Over HTTP the default is
/// asked for by leaving the field out, so an explicit 0 is the mistake it looks like.
fn positive<N: Default + PartialEq>(value: Option<N>, field: &str) -> Result<N, GatewayError> {
    match value {
        Some(zero) if zero == N::default() => Err(GatewayError::field(
            field,
            "must be at least 1 (leave it out for the default)",
        )),
        value => Ok(value.unwrap_or_default()),
    }
}

/// `POST …/rotate-secret` body (may be empty).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SecretRotation, description = "How a secret is rotated.")]
struct Rotation {
    /// How long the previous secrets stay valid beside the new one; left out (or `null`) for the default.
    #[schema(minimum = 1)]
    overlap_ms: Option<u64>,
}

/// `POST …/redeliver` body: RFC 3339 bounds, `from` inclusive, `until` exclusive, and whether
/// delivered events go out again too.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RedeliveryRange, description = "The events to deliver again: those created in `[from, until)`.")]
struct Range {
    /// RFC 3339 in UTC, inclusive.
    #[schema(required = true, value_type = String, format = DateTime)]
    from: Option<String>,
    /// RFC 3339 in UTC, exclusive.
    #[schema(required = true, value_type = String, format = DateTime)]
    until: Option<String>,
    /// Send the delivered ones again too.
    #[serde(default)]
    include_delivered: bool,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DeliveriesQuery {
    /// Deliveries per page (default 50).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
    /// `pending`, `delivered` or `undelivered`.
    state: Option<String>,
    /// Only events of this type.
    event_type: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Endpoint)]
struct EndpointJson {
    endpoint_id: String,
    url: String,
    event_types: Vec<String>,
    enabled: bool,
    /// Why it is disabled; `null` when it is enabled.
    #[schema(required = true)]
    disabled_reason: Option<String>,
    /// Since when its deliveries have failed without a success (RFC 3339); `null` unless they do.
    #[schema(required = true)]
    failing_since: Option<String>,
    max_in_flight: u32,
    rate_per_sec: u32,
    created_at: String,
    /// When it last changed (RFC 3339).
    updated_at: String,
}

/// An endpoint's signing secret, shown on creation and rotation only.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = EndpointSecret)]
struct SecretJson {
    #[schema(required = true)]
    endpoint: Option<EndpointJson>,
    /// `whsec_` and the secret in base64.
    secret: String,
    /// When the secrets it replaces stop being valid (rotation only).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    previous_secrets_expire_at: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Endpoints)]
struct EndpointsJson {
    /// Oldest first.
    endpoints: Vec<EndpointJson>,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Delivery)]
struct DeliveryJson {
    event_id: String,
    event_type: String,
    /// `pending`, `delivered` or `undelivered`.
    state: String,
    #[schema(required = true)]
    next_attempt_at: Option<String>,
    created_at: String,
    attempts: Vec<AttemptJson>,
}

/// A page of deliveries, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Deliveries)]
struct DeliveriesJson {
    deliveries: Vec<DeliveryJson>,
    /// The next page's `cursor`; only when another page follows.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    next_cursor: Option<String>,
}

/// How many deliveries were queued again.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Queued)]
struct QueuedJson {
    queued: u64,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Attempt)]
struct AttemptJson {
    attempt: u32,
    started_at: String,
    duration_ms: u64,
    /// `null` when the recipient did not answer.
    #[schema(required = true)]
    status_code: Option<u32>,
    outcome: String,
    #[schema(required = true)]
    error: Option<String>,
}

/// Empty strings on the wire are absent values: `null` in JSON, never `""`.
fn present(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

impl From<Endpoint> for EndpointJson {
    fn from(endpoint: Endpoint) -> Self {
        Self {
            endpoint_id: endpoint.endpoint_id,
            url: endpoint.url,
            event_types: endpoint.event_types,
            enabled: endpoint.enabled,
            disabled_reason: present(endpoint.disabled_reason),
            failing_since: present(endpoint.failing_since),
            max_in_flight: endpoint.max_in_flight,
            rate_per_sec: endpoint.rate_per_sec,
            created_at: endpoint.created_at,
            updated_at: endpoint.updated_at,
        }
    }
}

impl From<Delivery> for DeliveryJson {
    fn from(delivery: Delivery) -> Self {
        Self {
            event_id: delivery.event_id,
            event_type: delivery.event_type,
            state: delivery.state,
            next_attempt_at: present(delivery.next_attempt_at),
            created_at: delivery.created_at,
            attempts: delivery
                .attempts
                .into_iter()
                .map(AttemptJson::from)
                .collect(),
        }
    }
}

impl From<Attempt> for AttemptJson {
    fn from(attempt: Attempt) -> Self {
        Self {
            attempt: attempt.attempt,
            started_at: attempt.started_at,
            duration_ms: attempt.duration_ms,
            status_code: (attempt.status_code != 0).then_some(attempt.status_code),
            outcome: attempt.outcome,
            error: present(attempt.error),
        }
    }
}

/// A secret as shown once, with `Idempotent-Replayed` when it is the key's stored answer.
fn secret_response(status: StatusCode, keyed: Keyed) -> Response {
    let answer = keyed.answer;
    let body = SecretJson {
        endpoint: answer.endpoint.map(EndpointJson::from),
        secret: answer.secret,
        previous_secrets_expire_at: present(answer.previous_secrets_expire_at),
    };
    let mut response = (status, Json(body)).into_response();
    if keyed.replayed {
        response
            .headers_mut()
            .insert(wire::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// Subscribes an `https` URL to event types; the answer shows the signing secret, once.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints",
    tag = "webhooks",
    params(IdempotencyKey),
    request_body = NewEndpoint,
    responses(
        (status = 201, description = "The endpoint and its secret; a repeat with the same key and body gets the same answer again.",
            body = SecretJson, headers(("Idempotent-Replayed" = String, description = "`true` on a repeat's stored answer."))),
    ),
)]
async fn create_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    IdempotencyKey(key): IdempotencyKey,
    JsonBody(endpoint): JsonBody<NewEndpoint>,
) -> Result<Response, GatewayError> {
    let request = endpoint.into_request()?;
    let created = api
        .webhooks()
        .create_endpoint(&hop, &client, &key, request)
        .await?;
    Ok(secret_response(StatusCode::CREATED, created))
}

/// The client's endpoints.
#[utoipa::path(get, path = "/v1/webhooks/endpoints", tag = "webhooks", responses((status = 200, description = "Every endpoint of the client.", body = EndpointsJson)))]
async fn list_endpoints(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
) -> Result<Response, GatewayError> {
    let endpoints = api
        .webhooks()
        .endpoints(&hop, &client)
        .await?
        .endpoints
        .into_iter()
        .map(EndpointJson::from)
        .collect();
    Ok(Json(EndpointsJson { endpoints }).into_response())
}

/// One endpoint.
#[utoipa::path(
    get,
    path = "/v1/webhooks/endpoints/{endpoint_id}",
    tag = "webhooks",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint.", body = EndpointJson), (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json")),
)]
async fn get_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
) -> Result<Response, GatewayError> {
    let endpoint = api.webhooks().endpoint(&hop, &client, endpoint_id).await?;
    Ok(Json(EndpointJson::from(endpoint)).into_response())
}

/// Deletes an endpoint with its secrets and deliveries; nothing more is sent to it.
#[utoipa::path(
    delete,
    path = "/v1/webhooks/endpoints/{endpoint_id}",
    tag = "webhooks",
    params(EndpointPath),
    responses((status = 204, description = "Deleted."), (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json")),
)]
async fn delete_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
) -> Result<StatusCode, GatewayError> {
    api.webhooks()
        .delete_endpoint(&hop, &client, endpoint_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A new signing secret; the previous ones stay valid for `overlap_ms`.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints/{endpoint_id}/rotate-secret",
    tag = "webhooks",
    params(EndpointPath, IdempotencyKey),
    request_body(content = Option<Rotation>, description = "No body, or `null`, for the defaults."),
    responses(
        (status = 200, description = "The endpoint and its new secret; a repeat with the same key and body gets the same answer again.",
            body = SecretJson, headers(("Idempotent-Replayed" = String, description = "`true` on a repeat's stored answer."))),
        (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn rotate_secret(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    IdempotencyKey(key): IdempotencyKey,
    headers: HeaderMap,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
    body: Bytes,
) -> Result<Response, GatewayError> {
    // No body, or `null`, asks for the defaults.
    let rotation: Option<Rotation> = if body.is_empty() {
        None
    } else {
        json_body(&headers, &body)?
    };
    let rotation = rotation.unwrap_or_default();
    let overlap_ms = positive(rotation.overlap_ms, "overlap_ms")?;
    let rotated = api
        .webhooks()
        .rotate_secret(
            &hop,
            &client,
            &key,
            RotateSecretRequest {
                endpoint_id,
                overlap_ms,
            },
        )
        .await?;
    Ok(secret_response(StatusCode::OK, rotated))
}

/// Stops deliveries to an endpoint until it is enabled again.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints/{endpoint_id}/disable",
    tag = "webhooks",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint, disabled.", body = EndpointJson), (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json")),
)]
async fn disable_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
) -> Result<Response, GatewayError> {
    Ok(Json(EndpointJson::from(
        api.webhooks()
            .set_enabled(&hop, &client, endpoint_id, false)
            .await?,
    ))
    .into_response())
}

/// Resumes deliveries to an endpoint.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints/{endpoint_id}/enable",
    tag = "webhooks",
    params(EndpointPath),
    responses((status = 200, description = "The endpoint, enabled.", body = EndpointJson), (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json")),
)]
async fn enable_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
) -> Result<Response, GatewayError> {
    Ok(Json(EndpointJson::from(
        api.webhooks()
            .set_enabled(&hop, &client, endpoint_id, true)
            .await?,
    ))
    .into_response())
}

/// The endpoint's deliveries with their attempts, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/webhooks/endpoints/{endpoint_id}/deliveries",
    tag = "webhooks",
    params(EndpointPath, DeliveriesQuery),
    responses((status = 200, description = "A page of deliveries.", body = DeliveriesJson), (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json")),
)]
async fn list_deliveries(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
    query: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Result<Response, GatewayError> {
    let Query(query) =
        query.map_err(|rejection| GatewayError::field("limit", rejection.body_text()))?;
    let request = ListDeliveriesRequest {
        endpoint_id,
        limit: positive(query.limit, "limit")?,
        cursor: query.cursor.unwrap_or_default(),
        state: query.state.unwrap_or_default(),
        event_type: query.event_type.unwrap_or_default(),
    };
    let page = api.webhooks().deliveries(&hop, &client, request).await?;
    let deliveries = page
        .deliveries
        .into_iter()
        .map(DeliveryJson::from)
        .collect();
    Ok(Json(DeliveriesJson {
        deliveries,
        next_cursor: present(page.next_cursor),
    })
    .into_response())
}

/// Queues one event for delivery again.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints/{endpoint_id}/deliveries/{event_id}/redeliver",
    tag = "webhooks",
    params(EventPath),
    responses(
        (status = 202, description = "Queued.", body = QueuedJson),
        (status = 404, description = "No such endpoint for this client, or no such event for it.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn redeliver(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EventPath {
        endpoint_id,
        event_id,
    }): Path<EventPath>,
) -> Result<Response, GatewayError> {
    let queued = api
        .webhooks()
        .redeliver(
            &hop,
            &client,
            RedeliverRequest {
                endpoint_id,
                event_id,
            },
        )
        .await?
        .queued;
    Ok((StatusCode::ACCEPTED, Json(QueuedJson { queued })).into_response())
}

/// Queues again, in the background, the endpoint's events created in a time range.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints/{endpoint_id}/redeliver",
    tag = "webhooks",
    params(EndpointPath),
    request_body = Range,
    responses(
        (status = 202, description = "The events counted, to be queued in the background.", body = QueuedJson),
        (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The endpoint's last range is still being queued.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn redeliver_range(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
    JsonBody(range): JsonBody<Range>,
) -> Result<Response, GatewayError> {
    let request = RedeliverRangeRequest {
        endpoint_id,
        from: required(range.from, "from")?,
        until: required(range.until, "until")?,
        include_delivered: range.include_delivered,
    };
    let queued = api
        .webhooks()
        .redeliver_range(&hop, &client, request)
        .await?
        .queued;
    Ok((StatusCode::ACCEPTED, Json(QueuedJson { queued })).into_response())
}

/// `PATCH /v1/webhooks/endpoints/{endpoint_id}` body: only the fields present change (`null` is
/// absent); the rules are those of a new endpoint.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = EndpointChanges, description = "What to change of an endpoint: only the fields present change, by the rules of a new endpoint.")]
struct EndpointChanges {
    /// An `https` URL (at most 2048 characters) on a public address; vetted as on creation.
    #[schema(
        min_length = 1,
        max_length = 2048,
        example = "https://example.com/webhooks"
    )]
    url: Option<String>,
    /// In place of the endpoint's event types.
    event_types: Option<Vec<String>>,
    /// Deliveries in flight at once to this endpoint.
    #[schema(minimum = 1, maximum = 64)]
    max_in_flight: Option<u32>,
    /// Deliveries per second at most.
    #[schema(minimum = 1, maximum = 1000)]
    rate_per_sec: Option<u32>,
}

/// An event type the system sends.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = EventType)]
struct EventTypeJson {
    /// E.g. `order.paid`.
    name: String,
    description: String,
    /// The version of its `data`'s shape.
    schema_version: u32,
    /// Whether an endpoint may subscribe to it (a ping goes to its endpoint whatever it subscribes to).
    subscribable: bool,
}

/// Every event type the system sends.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = EventTypes)]
struct EventTypesJson {
    event_types: Vec<EventTypeJson>,
}

/// The event a ping queued.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Ping)]
struct PingJson {
    /// The event's id, its `webhook-id` when it is delivered.
    event_id: String,
}

impl From<EventType> for EventTypeJson {
    fn from(event_type: EventType) -> Self {
        Self {
            name: event_type.name,
            description: event_type.description,
            schema_version: event_type.schema_version,
            subscribable: event_type.subscribable,
        }
    }
}

/// Changes an endpoint's URL, event types or limits.
#[utoipa::path(
    patch,
    path = "/v1/webhooks/endpoints/{endpoint_id}",
    tag = "webhooks",
    params(EndpointPath),
    request_body = EndpointChanges,
    responses(
        (status = 200, description = "The endpoint as it now stands.", body = EndpointJson),
        (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn update_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
    JsonBody(changes): JsonBody<EndpointChanges>,
) -> Result<Response, GatewayError> {
    let request = UpdateEndpointRequest {
        endpoint_id,
        url: changes.url,
        event_types: changes.event_types.map(|names| EventTypeNames { names }),
        max_in_flight: changes.max_in_flight,
        rate_per_sec: changes.rate_per_sec,
    };
    Ok(Json(EndpointJson::from(
        api.webhooks()
            .update_endpoint(&hop, &client, request)
            .await?,
    ))
    .into_response())
}

/// Queues an `endpoint.ping` event for this endpoint alone, delivered as any event is.
#[utoipa::path(
    post,
    path = "/v1/webhooks/endpoints/{endpoint_id}/ping",
    tag = "webhooks",
    params(EndpointPath),
    responses(
        (status = 202, description = "The ping's event, queued.", body = PingJson),
        (status = 404, description = "No such endpoint for this client.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn ping_endpoint(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(EndpointPath { endpoint_id }): Path<EndpointPath>,
) -> Result<Response, GatewayError> {
    let event_id = api
        .webhooks()
        .ping(&hop, &client, endpoint_id)
        .await?
        .event_id;
    Ok((StatusCode::ACCEPTED, Json(PingJson { event_id })).into_response())
}

/// The event types the system sends, with the version of each one's data.
#[utoipa::path(get, path = "/v1/webhooks/event-types", tag = "webhooks", responses((status = 200, description = "Every event type.", body = EventTypesJson)))]
async fn list_event_types(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
) -> Result<Response, GatewayError> {
    let event_types = api
        .webhooks()
        .event_types(&hop, &client)
        .await?
        .event_types
        .into_iter()
        .map(EventTypeJson::from)
        .collect();
    Ok(Json(EventTypesJson { event_types }).into_response())
}
