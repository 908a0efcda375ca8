//! Test harness: the whole chain on free ports with its own database, and request helpers.

use bank_mock::{Faults, Latency};
use proto::gateway::v1::gateway_client::GatewayClient;
use stack::{Chain, ChainSettings};
use tempfile::TempDir;
use tonic::transport::Channel;

pub const API_KEY: &str = "demo-key-1";

/// A running chain that lives as long as the test.
pub struct TestChain {
    pub chain: Chain,
    pub http: reqwest::Client,
    _data: TempDir,
}

impl TestChain {
    /// The default chain, with a fast bank (1 ms) so tests spend their time on what they test.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// The chain after `customize` has changed its settings.
    pub async fn start_with(customize: impl FnOnce(&mut ChainSettings)) -> Self {
        let data = tempfile::tempdir().expect("temporary directory");
        let mut settings = ChainSettings::default().ephemeral().with_data_dir(data.path());
        settings.bank.faults = Faults { latency_ms: Latency { mean: 1.0, stddev: 0.0 }, ..Faults::default() };
        customize(&mut settings);
        let chain = Chain::start(settings).await.expect("chain starts");
        Self { chain, http: reqwest::Client::new(), _data: data }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.chain.addresses.gateway_http)
    }

    /// `POST /v1/orders` with the demo key, the given idempotency key and `body`.
    pub fn post_order(&self, key: &str, body: &serde_json::Value) -> reqwest::RequestBuilder {
        self.http.post(self.url("/v1/orders")).bearer_auth(API_KEY).header("idempotency-key", key).json(body)
    }

    pub fn set_faults(&self, faults: Faults) {
        self.chain.bank().update_faults(|current| *current = faults);
    }

    pub async fn grpc_gateway(&self) -> GatewayClient<Channel> {
        let endpoint = format!("http://{}", self.chain.addresses.gateway_grpc);
        GatewayClient::connect(endpoint).await.expect("gateway gRPC connects")
    }
}

/// The README's example order.
pub fn order_body() -> serde_json::Value {
    serde_json::json!({
        "customer_id": "c-1",
        "items": [{"sku": "sku-1", "quantity": 2}],
        "amount_minor": 1299,
        "currency": "EUR",
    })
}

/// A gRPC request to the gateway with the demo key and an idempotency key.
pub fn grpc_request<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {API_KEY}").parse().expect("ascii"));
    request.metadata_mut().insert("idempotency-key", key.parse().expect("ascii"));
    request
}

/// The README's example order as a gRPC message.
pub fn order_message() -> proto::common::v1::CreateOrderRequest {
    proto::common::v1::CreateOrderRequest {
        customer_id: "c-1".into(),
        items: vec![proto::common::v1::LineItem { sku: "sku-1".into(), quantity: 2 }],
        amount_minor: 1299,
        currency: "EUR".into(),
    }
}
