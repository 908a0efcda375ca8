//! The one mapping from orders' failures to gRPC statuses.

use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum OrdersError {
    #[error("{0} metadata is required")]
    MissingMetadata(&'static str),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("idempotency key already used for a different request (order {0}); nothing was done")]
    KeyReused(String),
    #[error("order {0} not found")]
    NotFound(String),
    /// Payment failed; its status is relayed as it is.
    #[error("{}", .0.message())]
    Payment(Status),
    #[error("order storage: {0}")]
    Storage(#[from] sqlx::Error),
    #[error("stored order {0} is unreadable: {1}")]
    Corrupt(String, String),
}

impl From<OrdersError> for Status {
    fn from(error: OrdersError) -> Self {
        let message = format!("{}: {error}", crate::HOP);
        match error {
            OrdersError::MissingMetadata(_) | OrdersError::InvalidRequest(_) => Status::invalid_argument(message),
            OrdersError::KeyReused(_) => Status::failed_precondition(message),
            OrdersError::NotFound(_) => Status::not_found(message),
            OrdersError::Payment(status) => rpc::relay(&status),
            OrdersError::Storage(_) | OrdersError::Corrupt(..) => {
                tracing::error!(%message, "storage failure");
                Status::internal(format!("{}: order storage failed", crate::HOP))
            }
        }
    }
}
