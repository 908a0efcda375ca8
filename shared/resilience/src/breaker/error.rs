use std::{borrow::Cow, time::Duration};

use tonic::{Status, metadata::MetadataValue};

use crate::retry::{Pushback, pushback};

/// The breaker is open: the call was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency}: circuit open after repeated failures; not calling (next try in {} ms)", self.retry_in_ms())]
pub struct CircuitOpen {
    pub dependency: Cow<'static, str>,
    /// Until the breaker lets probes through.
    pub retry_in: Duration,
}

impl CircuitOpen {
    /// [`Self::retry_in`] in whole milliseconds, rounded up: a caller who waits this long finds
    /// the breaker ready to probe, not still open for the fraction that truncation dropped.
    pub fn retry_in_ms(&self) -> u64 {
        self.retry_in.as_nanos().div_ceil(1_000_000) as u64
    }

    /// What an open breaker's answer says, read back from the status a dependency sent: `None`
    /// unless it is marked with [`wire::CIRCUIT_OPEN`] and names a wait (a breaker whose probes
    /// are out names none: it may let the next call through).
    pub fn from_status(status: &Status) -> Option<Self> {
        let dependency = status.metadata().get(wire::CIRCUIT_OPEN)?.to_str().ok()?;
        match pushback(status) {
            Pushback::Wait(retry_in) if !retry_in.is_zero() => Some(Self {
                dependency: dependency.to_owned().into(),
                retry_in,
            }),
            _ => None,
        }
    }
}

impl From<CircuitOpen> for Status {
    fn from(open: CircuitOpen) -> Self {
        let mut status = Status::unavailable(open.to_string());
        let metadata = status.metadata_mut();
        // A name read back by `from_status` was a valid value already; a static one is ours.
        if let Ok(dependency) = MetadataValue::try_from(open.dependency.as_ref()) {
            metadata.insert(wire::CIRCUIT_OPEN, dependency.clone());
            metadata.insert(wire::NOT_EXECUTED, dependency);
        }
        metadata.insert(
            wire::RETRY_PUSHBACK_MS,
            MetadataValue::from(open.retry_in_ms()),
        );
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_named_is_rounded_up_to_the_millisecond() {
        let status = Status::from(CircuitOpen {
            dependency: "bank-mock".into(),
            retry_in: Duration::from_micros(4_321_001),
        });
        assert_eq!(
            status.metadata().get(wire::RETRY_PUSHBACK_MS).unwrap(),
            "4322"
        );
        assert!(
            status.message().ends_with("(next try in 4322 ms)"),
            "{}",
            status.message()
        );
        let exact = Status::from(CircuitOpen {
            dependency: "bank-mock".into(),
            retry_in: Duration::from_millis(5),
        });
        assert_eq!(exact.metadata().get(wire::RETRY_PUSHBACK_MS).unwrap(), "5");
    }

    #[test]
    fn an_answer_reads_back_only_when_it_is_an_open_circuit_with_a_wait() {
        let open = CircuitOpen {
            dependency: "bank-mock".into(),
            retry_in: Duration::from_millis(1_500),
        };
        assert_eq!(
            CircuitOpen::from_status(&Status::from(open.clone())),
            Some(open)
        );
        let probes_out = Status::from(CircuitOpen {
            dependency: "bank-mock".into(),
            retry_in: Duration::ZERO,
        });
        assert_eq!(
            CircuitOpen::from_status(&probes_out),
            None,
            "probes are out: the next call may go through"
        );
        let mut unmarked = Status::unavailable("bank-mock: down");
        unmarked
            .metadata_mut()
            .insert(wire::RETRY_PUSHBACK_MS, MetadataValue::from(1_500));
        assert_eq!(
            CircuitOpen::from_status(&unmarked),
            None,
            "a plain failure with a pushback is no open circuit"
        );
    }
}
