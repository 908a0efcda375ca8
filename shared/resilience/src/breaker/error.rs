use std::time::Duration;

use tonic::{Status, metadata::MetadataValue};

use super::CIRCUIT_OPEN_HEADER;
use crate::retry::PUSHBACK_HEADER;

/// The breaker is open: the call was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency}: circuit open after repeated failures; not calling (next try in {} ms)", retry_in.as_millis())]
pub struct CircuitOpen {
    pub dependency: &'static str,
    /// Until the breaker lets probes through.
    pub retry_in: Duration,
}

impl From<CircuitOpen> for Status {
    fn from(open: CircuitOpen) -> Self {
        let mut status = Status::unavailable(open.to_string());
        let metadata = status.metadata_mut();
        metadata.insert(CIRCUIT_OPEN_HEADER, MetadataValue::from_static(open.dependency));
        metadata.insert(PUSHBACK_HEADER, MetadataValue::from(open.retry_in.as_millis() as u64));
        status
    }
}
