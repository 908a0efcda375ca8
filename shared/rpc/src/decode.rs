//! A request whose protobuf does not decode is the caller's mistake: INVALID_ARGUMENT.
//!
//! Why: tonic's codec answers it with INTERNAL (as grpc's status-code guide says of the library's
//! own parse errors), which reads as a bug of ours, is counted among server errors and hides the
//! caller's fault from the caller. Every server maps it here, in one place.

use axum::response::Response;
use tonic::{Code, Status};

/// How prost's `DecodeError` begins its message, which tonic's codec passes on as is.
const DECODE_FAILURE: &str = "failed to decode Protobuf message";

/// Turns tonic's INTERNAL for an undecodable request into INVALID_ARGUMENT, with the same message.
pub(crate) async fn undecodable_is_invalid_argument(mut response: Response) -> Response {
    // A failure before the handler is a trailers-only answer: its status is in the headers.
    let Some(status) = Status::from_header_map(response.headers()) else {
        return response;
    };
    if status.code() == Code::Internal && status.message().starts_with(DECODE_FAILURE) {
        let invalid = Status::invalid_argument(status.message());
        if let Err(error) = invalid.add_header(response.headers_mut()) {
            tracing::warn!(%error, "cannot rewrite an undecodable request's status");
        }
    }
    response
}
