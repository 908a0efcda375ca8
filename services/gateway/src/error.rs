//! The one mapping of the gateway's failures: to `application/problem+json` over HTTP (RFC 9457)
//! and to a gRPC status. Failures relayed from orders keep their gRPC code, which decides the HTTP
//! status here and nowhere else.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use proto::outcome::FailedCreate;
use serde::Serialize;
use tonic::{Code, Status, metadata::MetadataValue};
use tonic_types::StatusExt;

/// Why an operation failed at or below the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("a valid API key is required: `Authorization: Bearer <api key>`")]
    Unauthenticated,
    #[error("{field}: {reason}")]
    InvalidField { field: String, reason: String },
    #[error("the body is not valid JSON: {0}")]
    MalformedBody(String),
    #[error("the body must be JSON, sent with `Content-Type: application/json`")]
    NotJson,
    #[error("payment declined: {reason}")]
    PaymentDeclined {
        order_id: String,
        reason: String,
        replayed: bool,
    },
    #[error("{}", .0.message())]
    Upstream(Status),
    #[error(transparent)]
    NoHop(#[from] deadline::NoHop),
}

impl GatewayError {
    pub fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidField {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<proto::validate::FieldError> for GatewayError {
    fn from(error: proto::validate::FieldError) -> Self {
        Self::InvalidField {
            field: error.field,
            reason: error.reason,
        }
    }
}

/// An `application/problem+json` body (RFC 9457).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Problem {
    /// Always `about:blank`: the status and title say what happened.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub title: &'static str,
    /// The HTTP status of the answer.
    pub status: u16,
    /// What happened, starting with the hop that failed when the failure is from below.
    pub detail: String,
    /// The request field at fault, for 400s.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub field: Option<String>,
    /// The order whose payment was declined, for 402s; the order whose outcome is pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub order_id: Option<String>,
    /// What a failed create left behind: `refused` (nothing was charged, no order is kept, and
    /// nothing will be charged later), `pending` (the order `order_id` exists and will be
    /// settled: repeat with the same `Idempotency-Key`, read it, or wait for its webhook) or
    /// `unknown` (only a repeat with the same `Idempotency-Key` can tell).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub outcome: Option<Outcome>,
    /// The gRPC code of the failure below the gateway.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub grpc_code: Option<String>,
}

/// A failed create's outcome, as [`Problem::outcome`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Outcome {
    Refused,
    Pending,
    Unknown,
}

impl Outcome {
    /// The outcome a failure names, its order for a pending one, and what the client may do.
    fn of(failed: FailedCreate) -> (Self, Option<String>, String) {
        match failed {
            FailedCreate::Refused => (
                Outcome::Refused,
                None,
                "Nothing was charged and no order was kept, and nothing will be charged later: a retry, with this Idempotency-Key or another, starts afresh.".into(),
            ),
            FailedCreate::Pending { order_id } => {
                let next = format!(
                    "Order {order_id} exists and its payment's outcome is not known yet; it will be settled. Learn the outcome by repeating this request with the same Idempotency-Key, from GET /v1/orders/{order_id}, or from its order.paid or order.payment_declined webhook. A new Idempotency-Key would make a second order."
                );
                (Outcome::Pending, Some(order_id), next)
            }
            FailedCreate::Unknown => (
                Outcome::Unknown,
                None,
                "Whether an order was made is not known. Repeat this request with the same Idempotency-Key to learn it; a new Idempotency-Key could make a second order.".into(),
            ),
        }
    }
}

impl Problem {
    pub(crate) fn new(status: StatusCode, title: &'static str, detail: String) -> Self {
        Self {
            kind: "about:blank",
            title,
            status: status.as_u16(),
            detail,
            field: None,
            order_id: None,
            outcome: None,
            grpc_code: None,
        }
    }

    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string(self).expect("problems serialize")
    }

    /// A complete response with the right content type, for any body type.
    pub(crate) fn into_http<B: From<String>>(self) -> http::Response<B> {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = http::Response::new(B::from(self.to_json()));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}

/// HTTP status and title for a gRPC code from below.
fn http_status(code: Code) -> (StatusCode, &'static str) {
    match code {
        Code::InvalidArgument | Code::OutOfRange => (StatusCode::BAD_REQUEST, "Invalid request"),
        Code::Unauthenticated => (StatusCode::UNAUTHORIZED, "Unauthenticated"),
        Code::PermissionDenied => (StatusCode::FORBIDDEN, "Forbidden"),
        Code::NotFound => (StatusCode::NOT_FOUND, "Not found"),
        Code::AlreadyExists | Code::Aborted => (StatusCode::CONFLICT, "Conflict"),
        Code::FailedPrecondition => (StatusCode::UNPROCESSABLE_ENTITY, "Idempotency key reused"),
        Code::ResourceExhausted => (StatusCode::TOO_MANY_REQUESTS, "Too many requests"),
        Code::DeadlineExceeded => (StatusCode::GATEWAY_TIMEOUT, "Deadline exceeded"),
        Code::Unavailable | Code::Cancelled => {
            (StatusCode::SERVICE_UNAVAILABLE, "Dependency unavailable")
        }
        _ => (StatusCode::BAD_GATEWAY, "Dependency failed"),
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let detail = self.to_string();
        let mut retry_after = None;
        let replayed = matches!(self, GatewayError::PaymentDeclined { replayed: true, .. });
        let problem = match self {
            GatewayError::Unauthenticated => {
                Problem::new(StatusCode::UNAUTHORIZED, "Unauthenticated", detail)
            }
            GatewayError::InvalidField { field, .. } => Problem {
                field: Some(field),
                ..Problem::new(StatusCode::BAD_REQUEST, "Invalid request", detail)
            },
            GatewayError::MalformedBody(_) => {
                Problem::new(StatusCode::BAD_REQUEST, "Malformed body", detail)
            }
            GatewayError::NotJson => Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported media type",
                detail,
            ),
            GatewayError::PaymentDeclined { order_id, .. } => Problem {
                order_id: Some(order_id),
                ..Problem::new(StatusCode::PAYMENT_REQUIRED, "Payment declined", detail)
            },
            GatewayError::NoHop(_) => {
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "Internal error", detail)
            }
            GatewayError::Upstream(status) => {
                let (http, title) = http_status(status.code());
                retry_after = pushback_seconds(&status);
                // The field at fault, when the hop below named it in a google.rpc.BadRequest.
                let field = status
                    .get_details_bad_request()
                    .and_then(|bad| bad.field_violations.into_iter().next())
                    .map(|violation| violation.field);
                let grpc_code = Some(format!("{:?}", status.code()));
                match FailedCreate::of(&status).map(Outcome::of) {
                    Some((outcome, order_id, next)) => {
                        let detail = format!("{detail}. {next}");
                        Problem {
                            field,
                            order_id,
                            outcome: Some(outcome),
                            grpc_code,
                            ..Problem::new(http, title, detail)
                        }
                    }
                    None => Problem {
                        field,
                        grpc_code,
                        ..Problem::new(http, title, detail)
                    },
                }
            }
        };
        let unauthenticated = problem.status == StatusCode::UNAUTHORIZED.as_u16();
        let mut response: Response = problem.into_http();
        if unauthenticated {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if replayed {
            response
                .headers_mut()
                .insert(wire::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        if let Some(seconds) = retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A pushback from below, in whole seconds rounded up, for `Retry-After`.
fn pushback_seconds(status: &Status) -> Option<u64> {
    let millis: u64 = status
        .metadata()
        .get(wire::RETRY_PUSHBACK_MS)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(millis.div_ceil(1_000).max(1))
}

impl From<GatewayError> for Status {
    fn from(error: GatewayError) -> Self {
        match error {
            GatewayError::Upstream(mut status) => {
                // The gateway retried as far as its budget, attempts or an open breaker allowed:
                // a client retrying on top would only multiply that, so it is told not to.
                if status.metadata_mut().remove(wire::RETRIES_SPENT).is_some() {
                    status
                        .metadata_mut()
                        .insert(wire::RETRY_PUSHBACK_MS, MetadataValue::from_static("-1"));
                }
                status
            }
            GatewayError::Unauthenticated => Status::unauthenticated(error.to_string()),
            GatewayError::InvalidField { .. }
            | GatewayError::MalformedBody(_)
            | GatewayError::NotJson => Status::invalid_argument(error.to_string()),
            GatewayError::PaymentDeclined { .. } => Status::failed_precondition(error.to_string()),
            GatewayError::NoHop(no_hop) => no_hop.into(),
        }
    }
}
