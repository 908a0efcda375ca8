//! What the server layers read off an answer.

use http::{HeaderMap, Response};

pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers.get("content-type").is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status of a gRPC answer (0 when it travels in the trailers: a success), or the HTTP
/// status of any other answer.
pub(crate) fn status_code<B>(response: &Response<B>) -> i64 {
    if !is_grpc(response.headers()) {
        return i64::from(response.status().as_u16());
    }
    response.headers().get("grpc-status").and_then(|value| value.to_str().ok()).and_then(|text| text.parse().ok()).unwrap_or(0)
}
