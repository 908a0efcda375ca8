//! Test harness: the whole chain on free ports with its own databases (dropped after the test),
//! its logs on the test's output, request helpers, bounded waits, and an OTLP receiver.

pub use otlp_receiver as otlp;
pub use test_support::{ScratchDatabase, eventually, missing};

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bank_mock::{Faults, Latency};
use proto::gateway::v1::gateway_client::GatewayClient;
use rpc::{dev_certs::DevCerts, tls::ServiceTls};
use serde_json::{Value, json};
use stack::chain::{GATEWAY_GRPC, GATEWAY_HTTP};
use stack::{Chain, ChainSettings};
use telemetry::{Telemetry, TelemetrySettings};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tonic::transport::Channel;
use webhook_receiver::{Delivery, PATH, Receiver};
use webhooks::signature::{Secret, Verifier};

pub const API_KEY: &str = "demo-key-1";

/// The test process in telemetry. The tests that export traces install it as `stack up` does,
/// hosting the chain's services ([`init_telemetry`]).
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: "tests",
    version: env!("CARGO_PKG_VERSION"),
};

/// Installs telemetry as `stack up` does: each service of the chain exports under its own name.
pub fn init_telemetry(settings: &TelemetrySettings) -> Telemetry {
    telemetry::init_hosting(SERVICE, &stack::SERVICES, settings).expect("telemetry is installed")
}

/// How long a test waits for something the chain does in the background (a delivery, a trace,
/// a settled create): many times what it takes on a loaded machine, so that only a regression
/// runs out of it.
pub const BACKGROUND: Duration = Duration::from_secs(15);

/// A running chain that lives as long as the test.
pub struct TestChain {
    pub chain: Chain,
    pub http: reqwest::Client,
    // Dropped after the chain, which still uses them until then.
    _databases: Vec<ScratchDatabase>,
    _data: TempDir,
    _logs: Telemetry,
}

/// Where orders and payment keep their data in a test.
#[derive(Debug, Clone)]
pub enum Storage {
    Sqlite,
    /// A PostgreSQL server, by the URL of a database whose user may create databases.
    Postgres(String),
}

impl Storage {
    /// SQLite, and PostgreSQL when `TEST_POSTGRES_URL` is set. Without it the test fails in CI
    /// and elsewhere says loudly that its PostgreSQL half did not run.
    pub fn all() -> Vec<Storage> {
        std::iter::once(Storage::Sqlite)
            .chain(test_support::postgres_admin_url().map(Storage::Postgres))
            .collect()
    }

    pub fn name(&self) -> &'static str {
        match self {
            Storage::Sqlite => "sqlite",
            Storage::Postgres(_) => "postgres",
        }
    }

    /// Points orders and payment at fresh databases of this backend; returns those that must be
    /// dropped after the test.
    async fn configure(&self, settings: &mut ChainSettings) -> Vec<ScratchDatabase> {
        let Storage::Postgres(admin_url) = self else {
            return Vec::new();
        };
        let mut databases = Vec::new();
        for url in [
            &mut settings.orders.database_url,
            &mut settings.payment.database_url,
        ] {
            let database = ScratchDatabase::create(admin_url, "chain").await;
            database.url().clone_into(url);
            databases.push(database);
        }
        databases
    }
}

impl TestChain {
    /// The default chain, with a fast bank (1 ms) so tests spend their time on what they test.
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// The chain after `customize` has changed its settings.
    pub async fn start_with(customize: impl FnOnce(&mut ChainSettings)) -> Self {
        Self::start_on(&Storage::Sqlite, customize).await
    }

    /// The chain with its databases on `backend`.
    pub async fn start_on(backend: &Storage, customize: impl FnOnce(&mut ChainSettings)) -> Self {
        // The chain's logs go to the test's output, which the runner prints when the test fails.
        // A test that installed telemetry of its own keeps it: this one is then inert.
        let logs = telemetry::init(SERVICE, &TelemetrySettings::default())
            .expect("logging without an exporter");
        let data = tempfile::tempdir().expect("temporary directory");
        let mut settings = ChainSettings::default()
            .ephemeral()
            .with_data_dir(data.path());
        let databases = backend.configure(&mut settings).await;
        settings.bank.faults = fast_bank(|_| {});
        customize(&mut settings);
        let chain = Chain::start(settings).await.expect("chain starts");
        Self {
            chain,
            http: reqwest::Client::new(),
            _databases: databases,
            _data: data,
            _logs: logs,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.chain.address(&GATEWAY_HTTP))
    }

    /// `POST /v1/orders` with the demo key, the given idempotency key and `body`.
    pub fn post_order(&self, key: &str, body: &serde_json::Value) -> reqwest::RequestBuilder {
        self.post_as(API_KEY, "/v1/orders", key, body)
    }

    /// `POST path` as the client of `api_key`, with an idempotency key and a JSON body.
    pub fn post_as(
        &self,
        api_key: &str,
        path: &str,
        idempotency_key: &str,
        body: &Value,
    ) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .bearer_auth(api_key)
            .header("idempotency-key", idempotency_key)
            .json(body)
    }

    /// `GET path` as the demo client.
    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.get_as(API_KEY, path)
    }

    /// `GET path` as the client of `api_key`.
    pub fn get_as(&self, api_key: &str, path: &str) -> reqwest::RequestBuilder {
        self.http.get(self.url(path)).bearer_auth(api_key)
    }

    pub fn set_faults(&self, faults: Faults) {
        self.chain.bank().update_faults(|current| *current = faults);
    }

    /// The database of the chain's service `hop` (`orders::HOP` or `payment::HOP`), as the
    /// service migrated it. On SQLite this process's writer of the file is the service's own,
    /// shared.
    pub async fn database(&self, hop: &str) -> storage::Database {
        let url = self
            .chain
            .database_url(hop)
            .expect("the service keeps a database");
        storage::Database::open(url, storage::SqliteSettings::default(), |_| Vec::new())
            .await
            .expect("the chain's database")
    }

    /// Rows in one of the chain's tables (`orders` in the orders database, `payments` in payment's).
    pub async fn count_rows(&self, table: &str) -> i64 {
        let hop = if table == "payments" {
            payment::HOP
        } else {
            orders::HOP
        };
        self.database(hop)
            .await
            .fetch_one(&format!("SELECT COUNT(*) FROM {table}"), &[])
            .await
            .expect("count rows")
    }

    /// The Prometheus text a service serves on `/metrics` at `address`, an operations port: plain
    /// HTTP, no certificate.
    pub async fn scrape(&self, address: SocketAddr) -> String {
        let response = self
            .http
            .get(format!("http://{address}/metrics"))
            .send()
            .await
            .expect("/metrics answers");
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        response.text().await.unwrap()
    }

    /// The chain's development certificates.
    pub fn certs(&self) -> &DevCerts {
        self.chain
            .dev_certs()
            .expect("the test chain runs with its development CA")
    }

    /// An HTTPS client that presents the operator's certificate and trusts the chain's CA only.
    pub fn operator_http(&self) -> reqwest::ClientBuilder {
        let certs = self.certs();
        let read =
            |path: std::path::PathBuf| std::fs::read(path).expect("a development certificate file");
        let mut identity = read(certs.cert(rpc::dev_certs::OPERATOR));
        identity.extend(read(certs.key(rpc::dev_certs::OPERATOR)));
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(
                reqwest::Certificate::from_pem(&read(certs.ca())).expect("the CA"),
            )
            .identity(
                reqwest::Identity::from_pem(&identity).expect("the operator's certificate and key"),
            )
    }

    /// A channel to the inner `service` at `address`, presenting the certificate of `caller`
    /// (a service of the chain, or `operator`) as that service's own calls do.
    pub async fn channel_as(&self, caller: &str, service: &str, address: SocketAddr) -> Channel {
        let tls = ServiceTls::load(caller, &self.certs().settings(caller))
            .expect("the caller's certificate");
        rpc::channel(
            &rpc::endpoint(&address.to_string()).expect("an endpoint"),
            service,
            &tls,
        )
    }

    pub async fn grpc_gateway(&self) -> GatewayClient<Channel> {
        let endpoint = format!("http://{}", self.chain.address(&GATEWAY_GRPC));
        GatewayClient::connect(endpoint)
            .await
            .expect("gateway gRPC connects")
    }
}

/// A bank that answers in 1 ms, changed by `change`.
pub fn fast_bank(change: impl FnOnce(&mut Faults)) -> Faults {
    let mut faults = Faults {
        latency_ms: Latency {
            mean: 1.0,
            stddev: 0.0,
        },
        ..Faults::default()
    };
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
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {API_KEY}").parse().expect("ascii"),
    );
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().expect("ascii"));
    request
}

/// The README's example order as a gRPC message.
pub use stack::scenario::order_message;

/// The chain on `backend` after `customize`, with its sender and orders allowing plain http to a
/// receiver on loopback (serve it with [`subscribe`]).
pub async fn chain_with_receiver(
    backend: &Storage,
    customize: impl FnOnce(&mut ChainSettings),
) -> (TestChain, TcpListener) {
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
pub async fn subscribe(
    test: &TestChain,
    listener: TcpListener,
) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    let body = json!({"url": url, "event_types": ["order.paid", "order.payment_declined"]});
    let created = test
        .http
        .post(test.url("/v1/webhooks/endpoints"))
        .bearer_auth(API_KEY)
        .header("idempotency-key", "endpoint")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let secret: Secret = created["secret"].as_str().unwrap().parse().unwrap();
    let processed = Arc::new(Mutex::new(Vec::new()));
    let sink = processed.clone();
    let receiver = Arc::new(Receiver::new(
        Verifier::new(secret),
        3_600,
        move |delivery| sink.lock().unwrap().push(delivery),
    ));
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    (
        created["endpoint"]["endpoint_id"]
            .as_str()
            .unwrap()
            .to_owned(),
        processed,
    )
}

/// The events processed (webhook-id and body), once `count` have been; fails after [`BACKGROUND`].
pub async fn events(processed: &Mutex<Vec<Delivery>>, count: usize) -> Vec<(String, Value)> {
    eventually(
        BACKGROUND,
        &format!("{count} events processed by the receiver"),
        || async { processed.lock().unwrap().len() >= count },
    )
    .await;
    processed
        .lock()
        .unwrap()
        .iter()
        .map(|delivery| {
            (
                delivery.id.clone(),
                serde_json::from_slice(&delivery.body).unwrap(),
            )
        })
        .collect()
}

/// The sum of the samples of `metric` in Prometheus `text` whose labels include every one of
/// `labels`.
pub fn sample(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, ""));
            (name == metric
                && labels
                    .iter()
                    .all(|(key, value)| rest.contains(&format!("{key}=\"{value}\""))))
            .then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Asserts that `response` is a problem+json answer with `status`, and returns the problem.
pub async fn problem(response: reqwest::Response, status: u16) -> Value {
    assert_eq!(response.status(), status, "{response:?}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json",
        "{response:?}"
    );
    let problem: Value = response.json().await.expect("a JSON problem");
    assert_eq!(problem["status"], status, "{problem}");
    problem
}
