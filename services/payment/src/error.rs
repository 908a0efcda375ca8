//! The one mapping from payment's failures to gRPC statuses.

use idempotency::KeyError;
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
    #[error("a payment with this idempotency key is still in flight; retry later")]
    InFlight,
    #[error("idempotency key already used for a different payment; nothing was charged")]
    KeyReused,
    #[error("payment storage: {0}")]
    Storage(#[from] storage::Error),
    #[error("stored answer is unreadable: {0}")]
    StoredAnswer(#[from] prost::DecodeError),
}

impl From<KeyError> for PaymentError {
    fn from(error: KeyError) -> Self {
        match error {
            KeyError::InFlight | KeyError::LeaseLost => PaymentError::InFlight,
            KeyError::Mismatch => PaymentError::KeyReused,
            KeyError::Storage(error) => PaymentError::Storage(error),
        }
    }
}

impl From<PaymentError> for Status {
    fn from(error: PaymentError) -> Self {
        match error {
            PaymentError::BadKey(_) | PaymentError::InvalidRequest(_) => {
                Status::invalid_argument(format!("{}: {error}", crate::HOP))
            }
            PaymentError::Bank(status) => rpc::relay(&status),
            PaymentError::InFlight => Status::aborted(format!("{}: {error}", crate::HOP)),
            PaymentError::KeyReused => {
                Status::failed_precondition(format!("{}: {error}", crate::HOP))
            }
            PaymentError::Storage(ref storage) if storage.is_unreachable() => {
                tracing::error!(%error, "database unreachable");
                Status::unavailable(format!("{}: database unreachable", crate::HOP))
            }
            PaymentError::Storage(_) | PaymentError::StoredAnswer(_) => {
                tracing::error!(%error, "storage failure");
                Status::internal(format!("{}: payment storage failed", crate::HOP))
            }
        }
    }
}
