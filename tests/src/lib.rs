//! Test harness: the whole chain on free ports with its own database, request helpers, and an
//! OTLP receiver.

pub use otlp_receiver as otlp;

use std::{
    io::Write,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bank_mock::{Faults, Latency};
use sqlx::{Connection, Executor};
use proto::gateway::v1::gateway_client::GatewayClient;
use stack::{Chain, ChainSettings};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use webhook_receiver::{Delivery, PATH, Receiver};
use webhooks::signature::{Secret, Verifier};

pub const API_KEY: &str = "demo-key-1";

/// A running chain that lives as long as the test.
pub struct TestChain {
    pub chain: Chain,
    pub http: reqwest::Client,
    _data: TempDir,
}

/// Where orders and payment keep their data in a test.
#[derive(Debug, Clone)]
pub enum Backend {
    Sqlite,
    /// A PostgreSQL server, by the URL of a database whose user may create databases.
    Postgres(String),
}

impl Backend {
    /// SQLite, and PostgreSQL when `TEST_POSTGRES_URL` is set (CI sets it). Without it the test
    /// says loudly that its PostgreSQL half did not run.
    pub fn all() -> Vec<Backend> {
        match std::env::var("TEST_POSTGRES_URL") {
            Ok(url) => vec![Backend::Sqlite, Backend::Postgres(url)],
            Err(_) => {
                // Written past the test harness's capture, so that the skip shows when tests pass.
                let _ = writeln!(std::io::stderr(), "SKIPPED: TEST_POSTGRES_URL is not set; the PostgreSQL half of this test did not run");
                vec![Backend::Sqlite]
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Points orders and payment at fresh databases of this backend.
    async fn configure(&self, settings: &mut ChainSettings) {
        let Backend::Postgres(admin_url) = self else { return };
        let mut admin = sqlx::PgConnection::connect(admin_url).await.expect("TEST_POSTGRES_URL is reachable");
        let base = admin_url.rsplit_once('/').expect("a URL with a database").0;
        for url in [&mut settings.orders.database_url, &mut settings.payment.database_url] {
            let name = format!("chain_{}", uuid::Uuid::now_v7().simple());
            admin.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await.expect("create a scratch database");
            *url = format!("{base}/{name}");
        }
    }
}

impl TestChain {
    /// The default chain, with a fast bank (1 ms) so tests spend their time on what they test.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// The chain after `customize` has changed its settings.
    pub async fn start_with(customize: impl FnOnce(&mut ChainSettings)) -> Self {
        Self::start_on(&Backend::Sqlite, customize).await
    }

    /// The chain with its databases on `backend`.
    pub async fn start_on(backend: &Backend, customize: impl FnOnce(&mut ChainSettings)) -> Self {
        let data = tempfile::tempdir().expect("temporary directory");
        let mut settings = ChainSettings::default().ephemeral().with_data_dir(data.path());
        backend.configure(&mut settings).await;
        settings.bank.faults = fast_bank(|_| {});
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

    /// Rows in one of the chain's tables (`orders` in the orders database, `payments` in payment's).
    pub async fn count_rows(&self, table: &str) -> i64 {
        let url = if table == "payments" { &self.chain.database_urls.1 } else { &self.chain.database_urls.0 };
        let database = idempotency::Database::connect(url).await.expect("the chain's database");
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
            .fetch_one(database.pool())
            .await
            .expect("count rows")
    }

    pub async fn grpc_gateway(&self) -> GatewayClient<Channel> {
        let endpoint = format!("http://{}", self.chain.addresses.gateway_grpc);
        GatewayClient::connect(endpoint).await.expect("gateway gRPC connects")
    }
}

/// A bank that answers in 1 ms, changed by `change`.
pub fn fast_bank(change: impl FnOnce(&mut Faults)) -> Faults {
    let mut faults = Faults { latency_ms: Latency { mean: 1.0, stddev: 0.0 }, ..Faults::default() };
    change(&mut faults);
    faults
}

/// Payment's guards toward the bank made quick to trip: one call in flight at most, and a breaker
/// that opens after 5 failed calls and stays open for the rest of the test.
pub fn touchy_bank_guards(settings: &mut ChainSettings) {
    let bank = &mut settings.payment.bank;
    bank.max_concurrent = 1;
    bank.breaker.window_calls = 10;
    bank.breaker.min_calls = 5;
    bank.breaker.open_ms = 60_000;
}

/// The README's example order.
pub use stack::scenario::order_json as order_body;

/// A gRPC request to the gateway with the demo key and an idempotency key.
pub fn grpc_request<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {API_KEY}").parse().expect("ascii"));
    request.metadata_mut().insert("idempotency-key", key.parse().expect("ascii"));
    request
}

/// The README's example order as a gRPC message.
pub use stack::scenario::order_message;

/// The chain on `backend` after `customize`, with its sender and orders allowing plain http to a
/// receiver on loopback (serve it with [`subscribe`]).
pub async fn chain_with_receiver(backend: &Backend, customize: impl FnOnce(&mut ChainSettings)) -> (TestChain, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let receiver = listener.local_addr().unwrap().to_string();
    let test = TestChain::start_on(backend, |settings| {
        settings.orders.webhooks.test_hosts = vec![receiver.clone()];
        settings.webhook_sender.test_hosts = vec![receiver];
        customize(settings);
    })
    .await;
    (test, listener)
}

/// Creates an endpoint of the demo client for `listener`, subscribed to the orders' outcomes,
/// and serves the example receiver there with its secret; returns the endpoint's id and what the
/// receiver has processed.
pub async fn subscribe(test: &TestChain, listener: TcpListener) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    let body = json!({"url": url, "event_types": ["order.paid", "order.payment_declined"]});
    let created = test.http.post(test.url("/v1/webhooks/endpoints")).bearer_auth(API_KEY).header("idempotency-key", "endpoint").json(&body).send().await.unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let secret: Secret = created["secret"].as_str().unwrap().parse().unwrap();
    let processed = Arc::new(Mutex::new(Vec::new()));
    let sink = processed.clone();
    let receiver = Arc::new(Receiver::new(Verifier::new(secret), 3_600, move |delivery| sink.lock().unwrap().push(delivery)));
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    (created["endpoint"]["endpoint_id"].as_str().unwrap().to_owned(), processed)
}

/// The events processed so far (webhook-id and body), once `count` have been or after 15 s.
pub async fn events(processed: &Mutex<Vec<Delivery>>, count: usize) -> Vec<(String, Value)> {
    let started = Instant::now();
    while processed.lock().unwrap().len() < count && started.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    processed.lock().unwrap().iter().map(|delivery| (delivery.id.clone(), serde_json::from_slice(&delivery.body).unwrap())).collect()
}
