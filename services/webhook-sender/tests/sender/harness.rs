//! What the tests share: an orders database with the webhook tables, receivers on loopback, a
//! sender running in this process or as the binary, and a bounded wait for a condition.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, HeaderName, StatusCode},
    response::{IntoResponse, Response},
    routing::post,
};
use idempotency::{Clock, Database, SystemClock};
use outbox::{DeliveryLog, EndpointLimits, NewEndpoint, NewEvent, ORDER_PAID, Subscriptions};
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};
use webhook_sender::{Application, Settings};
use webhooks::{signature::Secret, ssrf::Resolve};

pub const CLIENT: &str = "demo-client-1";

/// The wall-clock time now, in ms since the epoch.
pub fn wall_ms() -> i64 {
    SystemClock.now_ms()
}

/// Waits until `condition` holds, checking every 10 ms for at most `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !condition().await {
        assert!(tokio::time::Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The orders database, in a temporary directory.
pub struct Outbox {
    pub database: Database,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Outbox {
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("orders.db").display());
        let database = Database::connect(&url).await.expect("database");
        outbox::migrate(&database).await.expect("webhook tables");
        Self { database, url, _dir: dir }
    }

    /// An endpoint of [`CLIENT`] at `url` for `event_types`, and its secret.
    pub async fn endpoint(&self, url: &str, event_types: &[&str], limits: EndpointLimits, now_ms: i64) -> (String, Secret) {
        let new = NewEndpoint { url: url.into(), event_types: event_types.iter().map(|t| t.to_string()).collect(), limits };
        let mut connection = self.database.pool().acquire().await.expect("connection");
        let (endpoint, secret) = Subscriptions::create_endpoint(&mut connection, CLIENT, &new, now_ms).await.expect("endpoint");
        (endpoint.endpoint_id, secret)
    }

    /// Commits an `order.paid` event at `now_ms`; returns its id.
    pub async fn paid(&self, now_ms: i64) -> String {
        let mut transaction = self.database.pool().begin().await.expect("transaction");
        let data = serde_json::json!({"order_id": "ord_1"});
        let event = NewEvent { event_type: ORDER_PAID, version: 1, data: &data };
        let id = outbox::record(&mut transaction, CLIENT, &event, now_ms).await.expect("record").expect("an endpoint subscribes");
        transaction.commit().await.expect("commit");
        id
    }

    pub fn subscriptions(&self) -> Subscriptions {
        Subscriptions::new(self.database.clone())
    }

    /// The endpoint's delivery of `event_id`, with its attempts.
    pub async fn delivery(&self, endpoint_id: &str, event_id: &str) -> DeliveryLog {
        let log = self.subscriptions().deliveries(CLIENT, endpoint_id, 1_000).await.expect("delivery log");
        log.into_iter().find(|delivery| delivery.event_id == event_id).expect("the delivery exists")
    }

    /// Waits until the endpoint's delivery of `event_id` has `attempts` attempts recorded.
    pub async fn attempts(&self, endpoint_id: &str, event_id: &str, attempts: usize) -> DeliveryLog {
        eventually(Duration::from_secs(10), &format!("{attempts} attempts of {event_id}"), || async {
            self.delivery(endpoint_id, event_id).await.attempts.len() >= attempts
        })
        .await;
        self.delivery(endpoint_id, event_id).await
    }
}

/// One delivery as a receiver got it.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at_ms: i64,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// How a receiver answers its `n`th delivery (from 0).
#[derive(Debug, Clone)]
pub enum Answer {
    Status(u16, Vec<(&'static str, String)>),
    /// Never answers; the sender's request timeout ends the wait.
    Hang,
}

/// A webhook receiver on 127.0.0.1 that records what it gets and how many it holds at once.
#[derive(Clone)]
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
    _stop: Arc<DropGuard>,
}

struct ReceiverState {
    answer: Box<dyn Fn(usize) -> Answer + Send + Sync>,
    received: Mutex<Vec<Received>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

impl Receiver {
    pub async fn start(answer: impl Fn(usize) -> Answer + Send + Sync + 'static) -> Self {
        let state = Arc::new(ReceiverState {
            answer: Box::new(answer),
            received: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let app = Router::new().route("/hook", post(receive)).with_state(state.clone());
        let stop = CancellationToken::new();
        tokio::spawn(axum::serve(listener, app).with_graceful_shutdown(stop.clone().cancelled_owned()).into_future());
        Self { addr, state, _stop: Arc::new(stop.drop_guard()) }
    }

    /// Answers every delivery with `status`.
    pub async fn answering(status: u16) -> Self {
        Self::start(move |_| Answer::Status(status, Vec::new())).await
    }

    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub fn test_host(&self) -> String {
        self.addr.to_string()
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().expect("not poisoned").clone()
    }

    pub fn count(&self) -> usize {
        self.state.received.lock().expect("not poisoned").len()
    }

    /// The most deliveries it was holding at once.
    pub fn most_in_flight(&self) -> usize {
        self.state.most_in_flight.load(Ordering::SeqCst)
    }

    pub async fn wait_for(&self, deliveries: usize) {
        eventually(Duration::from_secs(10), &format!("{deliveries} deliveries at {}", self.addr), || async { self.count() >= deliveries }).await;
    }
}

/// Counts a delivery in flight until its handler ends, answered or dropped by a disconnect.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn receive(State(state): State<Arc<ReceiverState>>, headers: HeaderMap, body: Bytes) -> Response {
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _in_flight = InFlight(&state.in_flight);
    state.most_in_flight.fetch_max(now, Ordering::SeqCst);
    let n = {
        let mut received = state.received.lock().expect("not poisoned");
        received.push(Received { headers, body, at_ms: wall_ms() });
        received.len() - 1
    };
    match (state.answer)(n) {
        Answer::Status(status, headers) => {
            let mut response = StatusCode::from_u16(status).expect("a status").into_response();
            for (name, value) in headers {
                response.headers_mut().insert(HeaderName::from_static(name), value.parse().expect("header value"));
            }
            response
        }
        Answer::Hang => std::future::pending().await,
    }
}

/// A TCP listener that only counts the connections made to it: a place no delivery may reach.
pub struct Forbidden {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Forbidden {
    pub async fn listen(ip: [u8; 4]) -> Self {
        let listener = TcpListener::bind((IpAddr::from(ip), 0)).await.expect("bind on loopback");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while listener.accept().await.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        Self { addr, connections }
    }

    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Names that resolve to what a test says, and nothing else.
#[derive(Debug, Clone, Default)]
pub struct FixedResolver(pub HashMap<String, Vec<IpAddr>>);

impl Resolve for FixedResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.0.get(host).cloned().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such name {host}")))
    }
}

/// Settings for a sender on `outbox` that may reach `receivers` over plain http, polling often.
pub fn settings(outbox: &Outbox, receivers: &[&Receiver]) -> Settings {
    Settings {
        database_url: outbox.url.clone(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        poll_interval_ms: 10,
        test_hosts: receivers.iter().map(|receiver| receiver.test_host()).collect(),
        ..Settings::default()
    }
}

/// A sender running in this test until it is dropped.
pub struct RunningSender {
    _stop: DropGuard,
}

pub async fn start_sender<R: Resolve + Send + Sync + 'static>(settings: Settings, clock: Arc<dyn Clock>, resolver: R) -> RunningSender {
    let app = Application::build_with(settings, clock, resolver).await.expect("sender");
    let stop = CancellationToken::new();
    tokio::spawn(app.run_until_stopped(stop.clone()));
    RunningSender { _stop: stop.drop_guard() }
}

/// The sender binary, killed with SIGKILL when dropped.
pub struct SenderProcess(Child);

impl SenderProcess {
    pub fn spawn(database_url: &str, test_host: &str) -> Self {
        Self::spawn_on(database_url, test_host, "127.0.0.1:0")
    }

    pub fn spawn_on(database_url: &str, test_host: &str, listen: &str) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_webhook-sender"))
            .env("WEBHOOK_SENDER_DATABASE_URL", database_url)
            .env("WEBHOOK_SENDER_LISTEN", listen)
            .env("WEBHOOK_SENDER_POLL_INTERVAL_MS", "20")
            .env("WEBHOOK_SENDER_REQUEST_TIMEOUT_MS", "2000")
            // As short as the settings allow (the timeout + 5 s to record), so that the restarted
            // sender takes the dead one's delivery over soon.
            .env("WEBHOOK_SENDER_LEASE_MS", "7000")
            .args(["--set", &format!("test_hosts=[\"{test_host}\"]")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the sender binary starts");
        Self(child)
    }

    /// SIGKILL: no chance to record anything.
    pub fn kill(mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
    }
}

impl Drop for SenderProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
