/// Why a webhook operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("no webhook endpoint {0:?} for this client")]
    EndpointNotFound(String),
    #[error("no delivery of event {event_id:?} to endpoint {endpoint_id:?}")]
    DeliveryNotFound {
        endpoint_id: String,
        event_id: String,
    },
    #[error("invalid webhook endpoint: {0}")]
    Invalid(String),
    /// The request is fine but conflicts with work still running; asking again later succeeds.
    #[error("{0}")]
    Busy(String),
    /// An endpoint secret could not be sealed or opened with the configured keys.
    #[error("endpoint secret: {0}")]
    Sealing(String),
    #[error("webhook store: {0}")]
    Storage(#[from] storage::Error),
}
