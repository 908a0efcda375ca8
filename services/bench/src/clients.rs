//! The gateway as its clients use it: orders created over gRPC or HTTP, each with its own
//! idempotency key, and each answer sorted into a class that says what happened (the code, and
//! which guard answered), so that a section can time one kind of answer apart from the others.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use proto::{common::v1::Order, gateway::v1::gateway_client::GatewayClient};
use tonic::{
    Code, Request, Response, Status,
    transport::{Channel, Endpoint},
};
use wire::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

use crate::{BenchError, load::CallOutcome};

/// The demo client with room for every section's load.
pub const API_KEY: &str = "demo-key-1";

/// A request the client stopped waiting for at its own deadline.
pub const CLIENT_DEADLINE: &str = "no answer by the client's deadline";
/// An answer the gateway replayed from the idempotency key's stored one.
pub const OK_REPLAYED: &str = "OK, replayed";
/// Over gRPC: refused by an open circuit breaker somewhere down the chain.
pub const CIRCUIT_OPEN: &str = "Unavailable: circuit open";
/// Over gRPC: refused by a full bulkhead somewhere down the chain.
pub const BULKHEAD_FULL: &str = "Unavailable: bulkhead full";

/// `text` as part of an idempotency key: visible ASCII, no spaces.
fn key_part(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// `CreateOrder` on a gateway's gRPC face (the chain's, or the bare chain's).
#[derive(Clone)]
pub struct GrpcOrders {
    client: GatewayClient<Channel>,
    keys: Arc<str>,
    deadline: Option<Duration>,
}

impl GrpcOrders {
    /// Request `i` carries the idempotency key `{keys}-{i}` (spaces and the like made `-`), and
    /// `deadline` as `grpc-timeout`
    /// (the client also gives up after it).
    pub fn new(
        gateway: SocketAddr,
        keys: &str,
        deadline: Option<Duration>,
    ) -> Result<Self, BenchError> {
        let channel = Endpoint::try_from(format!("http://{gateway}"))?
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self {
            client: GatewayClient::new(channel),
            keys: key_part(keys).into(),
            deadline,
        })
    }

    /// The same client (and connection), its keys further prefixed by `keys`.
    pub fn keyed(&self, keys: &str) -> Self {
        Self {
            keys: format!("{}-{}", self.keys, key_part(keys)).into(),
            ..self.clone()
        }
    }

    pub fn create(&self, index: usize) -> impl Future<Output = CallOutcome> + Send + use<> {
        let mut client = self.client.clone();
        let mut request = Request::new(stack::scenario::order_message());
        let metadata = request.metadata_mut();
        metadata.insert(
            "authorization",
            format!("Bearer {API_KEY}").parse().expect("ascii"),
        );
        metadata.insert(
            IDEMPOTENCY_KEY,
            format!("{}-{index}", self.keys).parse().expect("ascii"),
        );
        if let Some(deadline) = self.deadline {
            request.set_timeout(deadline);
        }
        async move { grpc_outcome(client.create_order(request).await) }
    }
}

fn grpc_outcome(result: Result<Response<Order>, Status>) -> CallOutcome {
    match result {
        Ok(response) if response.metadata().contains_key(IDEMPOTENT_REPLAYED) => {
            CallOutcome::success(OK_REPLAYED)
        }
        Ok(_) => CallOutcome::success("OK"),
        Err(status) if status.metadata().contains_key(wire::CIRCUIT_OPEN) => {
            CallOutcome::failure(CIRCUIT_OPEN)
        }
        Err(status) if status.metadata().contains_key(wire::BULKHEAD_FULL) => {
            CallOutcome::failure(BULKHEAD_FULL)
        }
        // tonic's own timer for `grpc-timeout` ends the call this way on the client's side.
        Err(status)
            if status.code() == Code::Cancelled
                && status.message() == tonic::TimeoutExpired(()).to_string() =>
        {
            CallOutcome::failure(CLIENT_DEADLINE)
        }
        Err(status) => CallOutcome::failure(format!("{:?}", status.code())),
    }
}

/// `POST /v1/orders` on the gateway's HTTP face.
#[derive(Clone)]
pub struct HttpOrders {
    client: reqwest::Client,
    url: Arc<str>,
    body: Arc<str>,
    keys: Arc<str>,
    deadline: Option<Duration>,
    /// Whether `deadline` is sent, or only kept by giving up after it.
    tell_deadline: bool,
}

impl HttpOrders {
    /// Request `i` carries the idempotency key `{keys}-{i}` (spaces and the like made `-`), and
    /// `deadline` as `X-Request-Timeout-Ms` (the client also gives up after it).
    pub fn new(gateway: SocketAddr, keys: &str, deadline: Option<Duration>) -> Self {
        Self {
            client: reqwest::Client::builder()
                .tcp_nodelay(true)
                .build()
                .expect("a client with no TLS to set up"),
            url: format!("http://{gateway}/v1/orders").into(),
            body: stack::scenario::order_json().to_string().into(),
            keys: key_part(keys).into(),
            deadline,
            tell_deadline: true,
        }
    }

    /// The same client, giving up after its deadline without sending it, as the naive chain's
    /// clients do.
    pub fn deadline_untold(self) -> Self {
        Self {
            tell_deadline: false,
            ..self
        }
    }

    /// The same client (and connections), its keys further prefixed by `keys`.
    pub fn keyed(&self, keys: &str) -> Self {
        Self {
            keys: format!("{}-{}", self.keys, key_part(keys)).into(),
            ..self.clone()
        }
    }

    pub fn create(&self, index: usize) -> impl Future<Output = CallOutcome> + Send + use<> {
        let mut request = self
            .client
            .post(&*self.url)
            .bearer_auth(API_KEY)
            .header(IDEMPOTENCY_KEY, format!("{}-{index}", self.keys))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body.to_string());
        if let Some(deadline) = self.deadline {
            request = request.timeout(deadline);
            if self.tell_deadline {
                request =
                    request.header(wire::REQUEST_TIMEOUT_MS, deadline.as_millis().to_string());
            }
        }
        async move {
            let response = match request.send().await {
                Ok(response) => response,
                Err(error) => return http_failure(&error),
            };
            let status = response.status();
            let replayed = response.headers().contains_key(IDEMPOTENT_REPLAYED);
            // The body is part of the answer, and reading it lets the connection be reused.
            if let Err(error) = response.bytes().await {
                return http_failure(&error);
            }
            let class = format!(
                "{} {}{}",
                status.as_u16(),
                status.canonical_reason().unwrap_or(""),
                if replayed { ", replayed" } else { "" }
            );
            if status.is_success() {
                CallOutcome::success(class)
            } else {
                CallOutcome::failure(class)
            }
        }
    }
}

fn http_failure(error: &reqwest::Error) -> CallOutcome {
    if error.is_timeout() {
        CallOutcome::failure(CLIENT_DEADLINE)
    } else {
        CallOutcome::failure("no answer: connection failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    #[test]
    fn keys_are_visible_ascii_without_spaces() {
        assert_eq!(key_part("every layer: 90 %"), "every-layer--90--");
    }

    #[test]
    fn grpc_answers_are_classed_by_the_guard_that_gave_them() {
        let mut open = Status::unavailable("bank-mock: circuit open");
        open.metadata_mut()
            .insert(wire::CIRCUIT_OPEN, MetadataValue::from_static("bank-mock"));
        let mut full = Status::unavailable("bank-mock: bulkhead full");
        full.metadata_mut()
            .insert(wire::BULKHEAD_FULL, MetadataValue::from_static("bank-mock"));
        assert_eq!(grpc_outcome(Err(open)), CallOutcome::failure(CIRCUIT_OPEN));
        assert_eq!(grpc_outcome(Err(full)), CallOutcome::failure(BULKHEAD_FULL));
        assert_eq!(
            grpc_outcome(Err(Status::cancelled("Timeout expired"))),
            CallOutcome::failure(CLIENT_DEADLINE)
        );
        assert_eq!(
            grpc_outcome(Err(Status::deadline_exceeded("payment"))),
            CallOutcome::failure("DeadlineExceeded")
        );
        let mut replayed = Response::new(Order::default());
        replayed
            .metadata_mut()
            .insert(IDEMPOTENT_REPLAYED, MetadataValue::from_static("true"));
        assert_eq!(
            grpc_outcome(Ok(replayed)),
            CallOutcome::success(OK_REPLAYED)
        );
        assert_eq!(
            grpc_outcome(Ok(Response::new(Order::default()))),
            CallOutcome::success("OK")
        );
    }
}
