//! The one mapping from bank-mock's failures to gRPC statuses and admin HTTP answers.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use tonic::{Status, metadata::MetadataValue};

use crate::faults::PatchError;

/// Why a charge was not made (or its reply not delivered).
#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error("idempotency-key metadata is required: {0}")]
    MissingKey(String),
    #[error("{field}: {reason}")]
    InvalidRequest { field: &'static str, reason: String },
    #[error("idempotency key was used for another charge ({0}); nothing was charged")]
    KeyReused(String),
    #[error("unavailable (injected error)")]
    Unavailable,
    #[error("slow down; retry in {pushback_ms} ms (injected)")]
    ResourceExhausted { pushback_ms: i64 },
    #[error("the caller's deadline passed before the charge; nothing was charged")]
    DeadlinePassed,
    #[error("charge {charge_id} committed but the reply was lost (injected)")]
    ReplyLost { charge_id: String },
}

impl From<ChargeError> for Status {
    fn from(error: ChargeError) -> Self {
        let message = format!("{}: {error}", crate::HOP);
        match error {
            ChargeError::MissingKey(_) | ChargeError::InvalidRequest { .. } => {
                Status::invalid_argument(message)
            }
            ChargeError::KeyReused(_) => Status::failed_precondition(message),
            ChargeError::DeadlinePassed => Status::deadline_exceeded(message),
            ChargeError::Unavailable | ChargeError::ReplyLost { .. } => {
                Status::unavailable(message)
            }
            ChargeError::ResourceExhausted { pushback_ms } => {
                let mut status = Status::resource_exhausted(message);
                status
                    .metadata_mut()
                    .insert(wire::RETRY_PUSHBACK_MS, MetadataValue::from(pushback_ms));
                status
            }
        }
    }
}

/// A failed admin request, answered as `application/problem+json`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error("X-Admin-Token is missing or wrong")]
    Unauthorized,
    #[error(transparent)]
    Faults(#[from] PatchError),
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let (status, title, field) = match &self {
            AdminError::Unauthorized => (StatusCode::UNAUTHORIZED, "Unauthorized", None),
            AdminError::Faults(PatchError::Invalid(fault)) => (
                StatusCode::BAD_REQUEST,
                "Invalid faults",
                Some(fault.field.to_owned()),
            ),
            AdminError::Faults(PatchError::Malformed { field, .. }) => {
                (StatusCode::BAD_REQUEST, "Invalid faults", field.clone())
            }
        };
        let mut body = serde_json::json!({
            "type": "about:blank",
            "title": title,
            "status": status.as_u16(),
            "detail": self.to_string(),
        });
        if let Some(field) = field {
            body["field"] = field.into();
        }
        let mut response = (status, Json(body)).into_response();
        response.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}
