//! The one mapping from payment's failures to gRPC statuses.

use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum PaymentError {
    #[error("idempotency-key metadata: {0}")]
    BadKey(String),
    #[error("{0}")]
    InvalidRequest(String),
    /// The bank failed; its status is relayed with its code and pushback.
    #[error("{}", .0.message())]
    Bank(Status),
}

impl From<PaymentError> for Status {
    fn from(error: PaymentError) -> Self {
        match error {
            PaymentError::BadKey(_) | PaymentError::InvalidRequest(_) => {
                Status::invalid_argument(format!("{}: {error}", crate::HOP))
            }
            PaymentError::Bank(status) => rpc::relay(&status),
        }
    }
}
