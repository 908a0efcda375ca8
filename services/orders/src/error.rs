//! The one mapping from orders' failures to gRPC statuses.

use idempotency::KeyError;
use outbox::OutboxError;
use proto::outcome::FailedCreate;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

#[derive(Debug, thiserror::Error)]
pub enum OrdersError {
    #[error("{0} metadata is required")]
    MissingMetadata(&'static str),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("idempotency key already used for a different request; nothing was done")]
    KeyReused,
    #[error("a request with this idempotency key is still in flight; retry later")]
    InFlight,
    #[error("order {0} not found")]
    NotFound(String),
    /// Payment failed; its status is relayed as it is.
    #[error("{}", .0.message())]
    Payment(Status),
    /// A create refused before anything could be charged: no order is left, and nothing will
    /// be charged later (the failure below says why).
    #[error("{}", .0.message())]
    Refused(Status),
    /// A create whose order exists failed before its outcome was known: the order is left for
    /// a repeat with the same key, or the completer, to settle.
    #[error("{cause}")]
    Pending {
        order_id: String,
        cause: Box<OrdersError>,
    },
    #[error("order storage: {0}")]
    Storage(#[from] storage::Error),
    #[error("stored answer is unreadable: {0}")]
    StoredAnswer(#[from] prost::DecodeError),
    #[error("stored order {0} is unreadable: {1}")]
    Corrupt(String, String),
    #[error(transparent)]
    Webhooks(#[from] OutboxError),
    #[error(transparent)]
    NoHop(#[from] deadline::NoHop),
}

impl OrdersError {
    /// This failure of a create whose order `order_id` exists.
    pub fn pending(self, order_id: String) -> Self {
        match self {
            pending @ OrdersError::Pending { .. } => pending,
            cause => OrdersError::Pending {
                order_id,
                cause: Box::new(cause),
            },
        }
    }
}

impl From<KeyError> for OrdersError {
    fn from(error: KeyError) -> Self {
        match error {
            KeyError::InFlight | KeyError::LeaseLost => OrdersError::InFlight,
            KeyError::Mismatch => OrdersError::KeyReused,
            KeyError::Storage(error) => OrdersError::Storage(error),
        }
    }
}

impl From<OrdersError> for Status {
    fn from(error: OrdersError) -> Self {
        let message = format!("{}: {error}", crate::HOP);
        match error {
            OrdersError::MissingMetadata(_) => Status::invalid_argument(message),
            OrdersError::InvalidRequest(ref reason)
            | OrdersError::Webhooks(OutboxError::Invalid(ref reason)) => {
                invalid_field(reason, message)
            }
            OrdersError::KeyReused => Status::failed_precondition(message),
            OrdersError::InFlight => Status::aborted(message),
            OrdersError::NotFound(_) => Status::not_found(message),
            OrdersError::Payment(status) => rpc::relay(&status),
            OrdersError::Refused(status) => {
                FailedCreate::Refused.on(rpc::relay(&status), crate::HOP)
            }
            OrdersError::Pending { order_id, cause } => {
                FailedCreate::Pending { order_id }.on(Status::from(*cause), crate::HOP)
            }
            OrdersError::Webhooks(
                OutboxError::EndpointNotFound(_) | OutboxError::DeliveryNotFound { .. },
            ) => Status::not_found(message),
            OrdersError::Webhooks(OutboxError::Busy(_)) => Status::aborted(message),
            OrdersError::Storage(ref storage)
            | OrdersError::Webhooks(OutboxError::Storage(ref storage))
                if storage.is_unreachable() =>
            {
                tracing::error!(%message, "database unreachable");
                Status::unavailable(format!("{}: database unreachable", crate::HOP))
            }
            OrdersError::Webhooks(OutboxError::Storage(_) | OutboxError::Sealing(_)) => {
                tracing::error!(%message, "storage failure");
                Status::internal(format!("{}: webhook storage failed", crate::HOP))
            }
            OrdersError::Storage(_) | OrdersError::Corrupt(..) | OrdersError::StoredAnswer(_) => {
                tracing::error!(%message, "storage failure");
                Status::internal(format!("{}: order storage failed", crate::HOP))
            }
            OrdersError::NoHop(no_hop) => no_hop.into(),
        }
    }
}

/// `INVALID_ARGUMENT` with a `google.rpc.BadRequest` detail naming the field at fault, so that the
/// gateway can name it in its problem. Every invalid-input message here starts with the field
/// (`url: …`, `limit: …`), as `proto::validate::FieldError` and the outbox's checks write them.
fn invalid_field(reason: &str, message: String) -> Status {
    let field = reason.split_once(": ").map_or("", |(field, _)| field);
    Status::with_error_details(
        Code::InvalidArgument,
        message,
        ErrorDetails::with_bad_request_violation(field, reason),
    )
}
