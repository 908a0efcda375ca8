use rpc::ServerError;

use crate::InvalidSetting;

/// Why the sender could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    #[error(transparent)]
    Settings(#[from] InvalidSetting),
    // The URL is not repeated: it may carry a password.
    #[error("database: {0}")]
    Database(#[from] storage::Error),
    /// Sealing the secrets stored in plain text by an older version failed at start.
    #[error("sealing stored secrets: {0}")]
    Sealing(#[from] outbox::OutboxError),
    #[error("HTTP client: {0}")]
    Client(reqwest::Error),
    #[error("resolver: {0}")]
    Resolver(hickory_resolver::net::NetError),
    #[error(transparent)]
    Server(#[from] ServerError),
}
