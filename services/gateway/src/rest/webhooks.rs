//! The webhook routes of the HTTP/JSON face, under `/v1/webhooks/endpoints`.

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, patch, post},
};
use proto::orders::v1::{
    Attempt, CreateEndpointRequest, Delivery, Endpoint, EventType, EventTypeNames, ListDeliveriesRequest, RedeliverRangeRequest, RedeliverRequest,
    RotateSecretRequest, UpdateEndpointRequest,
};
use serde::{Deserialize, Serialize};

use super::extract::{authenticate, idempotency_key, json_body, required};
use crate::{
    api::Api,
    error::{GatewayError, REPLAYED_HEADER},
    webhooks::Keyed,
};

pub fn routes() -> Router<Api> {
    Router::new()
        .route("/v1/webhooks/endpoints", post(create_endpoint).get(list_endpoints))
        .route("/v1/webhooks/endpoints/{endpoint_id}", get(get_endpoint).delete(delete_endpoint))
        .route("/v1/webhooks/endpoints/{endpoint_id}/rotate-secret", post(rotate_secret))
        .route("/v1/webhooks/endpoints/{endpoint_id}/disable", post(disable_endpoint))
        .route("/v1/webhooks/endpoints/{endpoint_id}/enable", post(enable_endpoint))
        .route("/v1/webhooks/endpoints/{endpoint_id}/deliveries", get(list_deliveries))
        .route("/v1/webhooks/endpoints/{endpoint_id}/deliveries/{event_id}/redeliver", post(redeliver))
        .route("/v1/webhooks/endpoints/{endpoint_id}/redeliver", post(redeliver_range))
        .route("/v1/webhooks/endpoints/{endpoint_id}", patch(update_endpoint))
        .route("/v1/webhooks/endpoints/{endpoint_id}/ping", post(ping_endpoint))
        .route("/v1/webhooks/event-types", get(list_event_types))
}

/// `POST /v1/webhooks/endpoints` body; see the orders face's `NewOrder` for why fields are optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewEndpoint {
    url: Option<String>,
    event_types: Option<Vec<String>>,
    max_in_flight: Option<u32>,
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
        Some(zero) if zero == N::default() => Err(GatewayError::field(field, "must be at least 1 (leave it out for the default)")),
        value => Ok(value.unwrap_or_default()),
    }
}

/// `POST …/rotate-secret` body (may be empty).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rotation {
    overlap_ms: Option<u64>,
}

/// `POST …/redeliver` body: RFC 3339 bounds, `from` inclusive, `until` exclusive, and whether
/// delivered events go out again too.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Range {
    from: Option<String>,
    until: Option<String>,
    /// Send the delivered ones again too.
    #[serde(default)]
    include_delivered: bool,
}

#[derive(Debug, Deserialize)]
struct DeliveriesQuery {
    limit: Option<u32>,
    cursor: Option<String>,
    state: Option<String>,
    event_type: Option<String>,
}

#[derive(Debug, Serialize)]
struct EndpointJson {
    endpoint_id: String,
    url: String,
    event_types: Vec<String>,
    enabled: bool,
    disabled_reason: Option<String>,
    failing_since: Option<String>,
    max_in_flight: u32,
    rate_per_sec: u32,
    created_at: String,
    updated_at: String,
}

#[derive(Debug, Serialize)]
struct SecretJson {
    endpoint: Option<EndpointJson>,
    secret: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_secrets_expire_at: Option<String>,
}

#[derive(Debug, Serialize)]
struct DeliveryJson {
    event_id: String,
    event_type: String,
    state: String,
    next_attempt_at: Option<String>,
    created_at: String,
    attempts: Vec<AttemptJson>,
}

#[derive(Debug, Serialize)]
struct AttemptJson {
    attempt: u32,
    started_at: String,
    duration_ms: u64,
    /// `null` when the recipient did not answer.
    status_code: Option<u32>,
    outcome: String,
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
            attempts: delivery.attempts.into_iter().map(AttemptJson::from).collect(),
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
        response.headers_mut().insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    response
}

async fn create_endpoint(State(api): State<Api>, headers: HeaderMap, body: Bytes) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let key = idempotency_key(&headers)?;
    let request = json_body::<NewEndpoint>(&headers, &body)?.into_request()?;
    let created = api.webhooks().create_endpoint(&client, key, request).await?;
    Ok(secret_response(StatusCode::CREATED, created))
}

async fn list_endpoints(State(api): State<Api>, headers: HeaderMap) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let endpoints: Vec<EndpointJson> = api.webhooks().endpoints(&client).await?.endpoints.into_iter().map(EndpointJson::from).collect();
    Ok(Json(serde_json::json!({ "endpoints": endpoints })).into_response())
}

async fn get_endpoint(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let endpoint = api.webhooks().endpoint(&client, endpoint_id).await?;
    Ok(Json(EndpointJson::from(endpoint)).into_response())
}

async fn delete_endpoint(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>) -> Result<StatusCode, GatewayError> {
    let client = authenticate(&api, &headers)?;
    api.webhooks().delete_endpoint(&client, endpoint_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn rotate_secret(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>, body: Bytes) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let key = idempotency_key(&headers)?;
    let rotation = if body.is_empty() { Rotation::default() } else { json_body(&headers, &body)? };
    let overlap_ms = positive(rotation.overlap_ms, "overlap_ms")?;
    let rotated = api.webhooks().rotate_secret(&client, key, RotateSecretRequest { endpoint_id, overlap_ms }).await?;
    Ok(secret_response(StatusCode::OK, rotated))
}

async fn disable_endpoint(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    Ok(Json(EndpointJson::from(api.webhooks().set_enabled(&client, endpoint_id, false).await?)).into_response())
}

async fn enable_endpoint(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    Ok(Json(EndpointJson::from(api.webhooks().set_enabled(&client, endpoint_id, true).await?)).into_response())
}

async fn list_deliveries(
    State(api): State<Api>,
    headers: HeaderMap,
    Path(endpoint_id): Path<String>,
    query: Result<Query<DeliveriesQuery>, QueryRejection>,
) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let Query(query) = query.map_err(|rejection| GatewayError::field("limit", rejection.body_text()))?;
    let request = ListDeliveriesRequest {
        endpoint_id,
        limit: positive(query.limit, "limit")?,
        cursor: query.cursor.unwrap_or_default(),
        state: query.state.unwrap_or_default(),
        event_type: query.event_type.unwrap_or_default(),
    };
    let page = api.webhooks().deliveries(&client, request).await?;
    let deliveries: Vec<DeliveryJson> = page.deliveries.into_iter().map(DeliveryJson::from).collect();
    let mut body = serde_json::json!({ "deliveries": deliveries });
    if !page.next_cursor.is_empty() {
        body["next_cursor"] = page.next_cursor.into();
    }
    Ok(Json(body).into_response())
}

async fn redeliver(
    State(api): State<Api>,
    headers: HeaderMap,
    Path((endpoint_id, event_id)): Path<(String, String)>,
) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let queued = api.webhooks().redeliver(&client, RedeliverRequest { endpoint_id, event_id }).await?.queued;
    Ok((StatusCode::ACCEPTED, Json(serde_json::json!({ "queued": queued }))).into_response())
}

async fn redeliver_range(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>, body: Bytes) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let range: Range = json_body(&headers, &body)?;
    let request = RedeliverRangeRequest {
        endpoint_id,
        from: required(range.from, "from")?,
        until: required(range.until, "until")?,
        include_delivered: range.include_delivered,
    };
    let queued = api.webhooks().redeliver_range(&client, request).await?.queued;
    Ok((StatusCode::ACCEPTED, Json(serde_json::json!({ "queued": queued }))).into_response())
}

/// `PATCH /v1/webhooks/endpoints/{endpoint_id}` body: only the fields present change (`null` is
/// absent); the rules are those of a new endpoint.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EndpointChanges {
    url: Option<String>,
    /// In place of the endpoint's event types.
    event_types: Option<Vec<String>>,
    max_in_flight: Option<u32>,
    rate_per_sec: Option<u32>,
}

#[derive(Debug, Serialize)]
struct EventTypeJson {
    name: String,
    description: String,
    schema_version: u32,
    subscribable: bool,
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

async fn update_endpoint(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>, body: Bytes) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let changes: EndpointChanges = json_body(&headers, &body)?;
    let request = UpdateEndpointRequest {
        endpoint_id,
        url: changes.url,
        event_types: changes.event_types.map(|names| EventTypeNames { names }),
        max_in_flight: changes.max_in_flight,
        rate_per_sec: changes.rate_per_sec,
    };
    Ok(Json(EndpointJson::from(api.webhooks().update_endpoint(&client, request).await?)).into_response())
}

/// `202` with the ping's event id: it is queued, and delivered as any event is.
async fn ping_endpoint(State(api): State<Api>, headers: HeaderMap, Path(endpoint_id): Path<String>) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let event_id = api.webhooks().ping(&client, endpoint_id).await?.event_id;
    Ok((StatusCode::ACCEPTED, Json(serde_json::json!({ "event_id": event_id }))).into_response())
}

async fn list_event_types(State(api): State<Api>, headers: HeaderMap) -> Result<Response, GatewayError> {
    let client = authenticate(&api, &headers)?;
    let event_types: Vec<EventTypeJson> = api.webhooks().event_types(&client).await?.event_types.into_iter().map(EventTypeJson::from).collect();
    Ok(Json(serde_json::json!({ "event_types": event_types })).into_response())
}
