use std::time::Duration;

use tonic::{Status, metadata::MetadataValue};

use super::CIRCUIT_OPEN_HEADER;
use crate::retry::PUSHBACK_HEADER;

/// The breaker is open: the call was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency}: circuit open after repeated failures; not calling (next try in {} ms)", self.retry_in_ms())]
pub struct CircuitOpen {
    pub dependency: &'static str,
    /// Until the breaker lets probes through.
    pub retry_in: Duration,
}

impl CircuitOpen {
    /// [`Self::retry_in`] in whole milliseconds, rounded up: a caller who waits this long finds
    /// the breaker ready to probe, not still open for the fraction that truncation dropped.
    pub fn retry_in_ms(&self) -> u64 {
        self.retry_in.as_nanos().div_ceil(1_000_000) as u64
    }
}

impl From<CircuitOpen> for Status {
    fn from(open: CircuitOpen) -> Self {
        let mut status = Status::unavailable(open.to_string());
        let metadata = status.metadata_mut();
        metadata.insert(CIRCUIT_OPEN_HEADER, MetadataValue::from_static(open.dependency));
        metadata.insert(PUSHBACK_HEADER, MetadataValue::from(open.retry_in_ms()));
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_named_is_rounded_up_to_the_millisecond() {
        let status = Status::from(CircuitOpen { dependency: "bank-mock", retry_in: Duration::from_micros(4_321_001) });
        assert_eq!(status.metadata().get(PUSHBACK_HEADER).unwrap(), "4322");
        assert!(status.message().ends_with("(next try in 4322 ms)"), "{}", status.message());
        let exact = Status::from(CircuitOpen { dependency: "bank-mock", retry_in: Duration::from_millis(5) });
        assert_eq!(exact.metadata().get(PUSHBACK_HEADER).unwrap(), "5");
    }
}
