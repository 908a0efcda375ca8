use std::time::Duration;

use http::{HeaderMap, HeaderValue, Response};
use tonic::Status;

use super::Protocol;
use crate::{Hop, InboundPolicy, grpc_timeout, millis};

/// gRPC: the budget comes from `grpc-timeout`; the ledger goes into response metadata.
#[derive(Debug, Clone, Copy, Default)]
pub struct Grpc {
    pub policy: InboundPolicy,
}

impl Grpc {
    pub fn new(policy: InboundPolicy) -> Self {
        Self { policy }
    }
}

impl Protocol for Grpc {
    fn requested_budget<B: Default + From<String>>(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<Duration>, Response<B>> {
        let Some(value) = headers.get(wire::GRPC_TIMEOUT) else {
            return Ok(None);
        };
        let text = value
            .to_str()
            .map_err(|_| Status::invalid_argument("grpc-timeout is not ASCII text").into_http())?;
        grpc_timeout::parse(text)
            .map(Some)
            .map_err(|error| Status::invalid_argument(error.to_string()).into_http())
    }

    fn grant(&self, requested: Option<Duration>) -> Duration {
        self.policy.grant(requested)
    }

    fn expired<B: Default + From<String>>(&self, hop: &Hop) -> Response<B> {
        let deadline = hop.deadline();
        Status::deadline_exceeded(format!(
            "{}: deadline exceeded after {} ms of its {} ms budget",
            hop.name(),
            millis(deadline.elapsed_at(tokio::time::Instant::now())),
            millis(deadline.budget()),
        ))
        .into_http()
    }

    fn attach_ledger<B>(&self, ledger: String, response: &mut Response<B>) {
        if let Ok(value) = HeaderValue::try_from(ledger) {
            response.headers_mut().insert(wire::DEADLINE_LEDGER, value);
        }
    }
}
