//! Payment's open circuit, remembered: until the wait payment named ends, a create is refused
//! before orders writes anything (why, and what still replays: the crate's README, "Circuit
//! breaker and bulkhead").

use std::sync::{Mutex, PoisonError};

use resilience::breaker::CircuitOpen;
use tokio::time::Instant;
use tonic::Status;

/// What payment last said about an open circuit below it.
#[derive(Debug, Default)]
pub(crate) struct OpenCircuit {
    /// The open circuit payment named, and when its wait ends on our clock.
    refusing: Mutex<Option<(CircuitOpen, Instant)>>,
}

impl OpenCircuit {
    /// Takes in how payment answered a call.
    pub(crate) fn heard<T>(&self, answer: &Result<T, Status>) {
        let refusing = match answer {
            Ok(_) => None,
            Err(status) => match CircuitOpen::from_status(status) {
                Some(open) => {
                    let until = Instant::now() + open.retry_in;
                    Some((open, until))
                }
                None => return,
            },
        };
        // A plain value: a panic elsewhere cannot leave it half-written.
        *self.refusing.lock().unwrap_or_else(PoisonError::into_inner) = refusing;
    }

    /// Payment's refusal with the wait that is left, while there is one.
    pub(crate) fn refusal(&self) -> Option<Status> {
        let refusing = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
        let (open, until) = refusing.as_ref()?;
        let retry_in = until
            .checked_duration_since(Instant::now())
            .filter(|left| !left.is_zero())?;
        tracing::debug!(
            peer = "payment",
            breaker.state = "open",
            breaker.dependency = %open.dependency,
            breaker.retry_in_ms = retry_in.as_millis() as i64,
            "refused before writing: payment's circuit is open"
        );
        Some(Status::from(CircuitOpen {
            dependency: open.dependency.clone(),
            retry_in,
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn open_for(ms: u64) -> Result<(), Status> {
        Err(Status::from(CircuitOpen {
            dependency: "bank-mock".into(),
            retry_in: Duration::from_millis(ms),
        }))
    }

    fn pushback_ms(status: &Status) -> u64 {
        status
            .metadata()
            .get(wire::RETRY_PUSHBACK_MS)
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_for_the_wait_payment_named_and_no_longer() {
        let circuit = OpenCircuit::default();
        assert!(circuit.refusal().is_none(), "nothing heard yet");
        circuit.heard(&open_for(2_000));
        tokio::time::advance(Duration::from_millis(500)).await;
        let refusal = circuit.refusal().expect("within the wait");
        assert_eq!(
            (refusal.code(), pushback_ms(&refusal)),
            (tonic::Code::Unavailable, 1_500),
            "the wait that is left"
        );
        assert_eq!(
            refusal.metadata().get(wire::CIRCUIT_OPEN).unwrap(),
            "bank-mock"
        );
        assert!(
            refusal.message().starts_with("bank-mock: circuit open"),
            "{}",
            refusal.message()
        );
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert!(
            circuit.refusal().is_none(),
            "the breaker may probe now: payment decides"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_ends_the_refusals_and_another_failure_leaves_the_wait_to_run_out() {
        let circuit = OpenCircuit::default();
        circuit.heard(&open_for(60_000));
        for other in [Err(Status::unavailable("bank-mock: down")), open_for(0)] {
            circuit.heard(&other);
            assert!(
                circuit.refusal().is_some(),
                "still refusing after {other:?}"
            );
        }
        circuit.heard(&Ok(()));
        assert!(
            circuit.refusal().is_none(),
            "payment called the bank and it answered"
        );
    }
}
