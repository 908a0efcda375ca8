//! Reading an HTTP request: the client its API key names, its idempotency key, its JSON body.

use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use utoipa::IntoParams;

use crate::{api::Api, edge::ClientId, error::GatewayError};

/// A field the JSON body must have (the body's fields are optional so that a missing one is
/// reported by name).
pub fn required<T>(value: Option<T>, field: impl Into<String>) -> Result<T, GatewayError> {
    value.ok_or_else(|| GatewayError::field(field, "is required"))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The client named by the request's API key.
pub fn authenticate(api: &Api, headers: &HeaderMap) -> Result<ClientId, GatewayError> {
    api.authenticate(header(headers, "authorization"))
}

/// The `Idempotency-Key` header of a write that needs one (checked below the faces, by
/// `proto::validate::idempotency_key`).
#[derive(IntoParams)]
#[into_params(names("Idempotency-Key"), parameter_in = Header)]
pub struct IdempotencyKey<'a>(
    /// 1 to 255 visible ASCII characters, scoped to the client: repeats of one request carry the same key.
    #[param(min_length = 1, max_length = 255, pattern = r"^[\x21-\x7E]+$")]
    pub &'a str,
);

/// The `Idempotency-Key` header of a write that needs one.
pub fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey<'_>, GatewayError> {
    header(headers, wire::IDEMPOTENCY_KEY)
        .map(IdempotencyKey)
        .ok_or_else(|| GatewayError::field("Idempotency-Key", "header is required (1 to 255 characters)"))
}

/// A JSON body sent as `application/json`, a fault in it reported with the path of the field at
/// fault, and nothing after it but whitespace.
pub fn json_body<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, GatewayError> {
    // The media type without its parameters (`; charset=utf-8`), compared as RFC 9110 says: case aside.
    let media_type = header(headers, "content-type").map(|value| value.split(';').next().unwrap_or_default().trim());
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
    deserializer.end().map_err(|error| GatewayError::MalformedBody(format!("data after the JSON value: {error}")))?;
    Ok(value)
}
