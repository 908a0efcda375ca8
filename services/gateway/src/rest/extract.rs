//! Reading an HTTP request: its hop (the deadline), the client its API key names, its
//! idempotency key, its JSON body.
//!
//! Each is an extractor, so a handler names what it needs in its arguments and axum checks them
//! in their order there: the API key (`401`), the idempotency key (`400`), then the body (`415`,
//! `400`), before the handler runs.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Request},
    http::{HeaderMap, request::Parts},
    response::{IntoResponse, Response},
};
use deadline::{Hop, NoHop};
use serde::de::DeserializeOwned;
use utoipa::IntoParams;

use crate::{api::Api, edge::ClientId, error::GatewayError};

/// A field the JSON body must have (the body's fields are optional so that a missing one is
/// reported by name).
pub(super) fn required<T>(value: Option<T>, field: impl Into<String>) -> Result<T, GatewayError> {
    value.ok_or_else(|| GatewayError::field(field, "is required"))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The request's hop, which the deadline layer attached: the handler passes it on with every
/// call it makes, and so its deadline.
pub(super) struct RequestHop(pub Arc<Hop>);

impl<S: Sync> FromRequestParts<S> for RequestHop {
    type Rejection = GatewayError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, GatewayError> {
        let hop = parts.extensions.get::<Arc<Hop>>().ok_or(NoHop)?;
        Ok(RequestHop(hop.clone()))
    }
}

/// The client named by the request's API key.
impl FromRequestParts<Api> for ClientId {
    type Rejection = GatewayError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, GatewayError> {
        api.authenticate(header(&parts.headers, "authorization"))
    }
}

/// The `Idempotency-Key` header of a write that needs one (checked below the faces, by
/// `proto::validate::idempotency_key`).
#[derive(IntoParams)]
#[into_params(names("Idempotency-Key"), parameter_in = Header)]
pub(super) struct IdempotencyKey(
    /// 1 to 255 visible ASCII characters, scoped to the client: repeats of one request carry the same key.
    #[param(min_length = 1, max_length = 255, pattern = r"^[\x21-\x7E]+$")]
    pub String,
);

impl<S: Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = GatewayError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, GatewayError> {
        header(&parts.headers, wire::IDEMPOTENCY_KEY)
            .map(|key| IdempotencyKey(key.to_owned()))
            .ok_or_else(|| {
                GatewayError::field(
                    "Idempotency-Key",
                    "header is required (1 to 255 characters)",
                )
            })
    }
}

/// A JSON body, read as [`json_body`] reads it, within the router's body limit.
pub(super) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let headers = request.headers().clone();
        let body = Bytes::from_request(request, state)
            .await
            .map_err(IntoResponse::into_response)?;
        json_body(&headers, &body)
            .map(JsonBody)
            .map_err(IntoResponse::into_response)
    }
}

/// A JSON body sent as `application/json`, a fault in it reported with the path of the field at
/// fault, and nothing after it but whitespace.
pub(super) fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, GatewayError> {
    // The media type without its parameters (`; charset=utf-8`), compared as RFC 9110 says: case aside.
    let media_type = header(headers, "content-type")
        .map(|value| value.split(';').next().unwrap_or_default().trim());
    if !media_type.is_some_and(|media_type| media_type.eq_ignore_ascii_case("application/json")) {
        return Err(GatewayError::NotJson);
    }
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        if path == "." {
            GatewayError::MalformedBody(error.into_inner().to_string())
        } else {
            GatewayError::field(path, error.into_inner().to_string())
        }
    })?;
    deserializer.end().map_err(|error| {
        GatewayError::MalformedBody(format!("data after the JSON value: {error}"))
    })?;
    Ok(value)
}
