//! What the tests share: an orders database with the webhook tables, receivers on loopback, a
//! marker recipient that shows when the sender has caught up, and a sender running in this
//! process or as the binary.

use std::{
    collections::HashMap,
    io::{self, BufRead, BufReader},
    net::{IpAddr, SocketAddr},
    process::{Child, ChildStdout, Command, Stdio},
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
use idempotency::{Clock, SystemClock};
use outbox::{
    DeliveryLog, DeliveryQuery, EndpointLimits, NewEndpoint, NewEvent, ORDER_PAID,
    ORDER_PAYMENT_DECLINED, SecretKeys, Subscriptions,
};
use storage::Database;
use test_support::eventually;
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, DropGuard};
use webhook_sender::{Application, Settings};
use webhooks::{
    signature::{ReceivedHeaders, Secret, Verifier, VerifyError},
    ssrf::Resolve,
};

pub(crate) const CLIENT: &str = "demo-client-1";

/// The wall-clock time now, in ms since the epoch.
pub(crate) fn wall_ms() -> i64 {
    SystemClock.now_ms()
}

/// The orders database, in a temporary directory, and the key that seals its secrets.
pub(crate) struct Outbox {
    pub database: Database,
    pub url: String,
    pub keys: SecretKeys,
    _dir: tempfile::TempDir,
}

impl Outbox {
    pub(crate) async fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("orders.db").display());
        let database = Database::open(&url, unsynced(), |backend| {
            vec![outbox::migrations(backend)]
        })
        .await
        .expect("database");
        Self {
            database,
            url,
            keys: SecretKeys::generate("test"),
            _dir: dir,
        }
    }

    /// An endpoint of [`CLIENT`] at `url` for `event_types`, and its secret.
    pub(crate) async fn endpoint(
        &self,
        url: &str,
        event_types: &[&str],
        limits: EndpointLimits,
        now_ms: i64,
    ) -> (String, Secret) {
        self.client_endpoint(CLIENT, url, event_types, limits, now_ms)
            .await
    }

    /// An endpoint of `client` at `url` for `event_types`, and its secret.
    pub(crate) async fn client_endpoint(
        &self,
        client: &str,
        url: &str,
        event_types: &[&str],
        limits: EndpointLimits,
        now_ms: i64,
    ) -> (String, Secret) {
        let new = NewEndpoint {
            url: url.into(),
            event_types: event_types.iter().map(|t| t.to_string()).collect(),
            limits,
        };
        let (subscriptions, client) = (self.subscriptions(), client.to_owned());
        let (endpoint, secret) = self
            .database
            .write(async move |tx| {
                subscriptions
                    .create_endpoint(tx, &client, &new, now_ms)
                    .await
            })
            .await
            .expect("endpoint");
        (endpoint.endpoint_id, secret)
    }

    /// Commits an `order.paid` event of [`CLIENT`] at `now_ms`; returns its id.
    pub(crate) async fn paid(&self, now_ms: i64) -> String {
        self.record(CLIENT, ORDER_PAID, now_ms).await
    }

    /// Commits an `order.paid` event of `client` at `now_ms`; returns its id.
    pub(crate) async fn client_paid(&self, client: &str, now_ms: i64) -> String {
        self.record(client, ORDER_PAID, now_ms).await
    }

    /// Commits `events` `order.paid` events of `client`, one every `pace`; returns when each
    /// commit returned (wall-clock ms), by event id.
    ///
    /// When it returned, not when it began: a commit here waits for its turn on the SQLite file's
    /// one writer, which it shares with the sender in this process, and under a sender writing
    /// hundreds of attempts a second that wait is the test's, not the sender's.
    pub(crate) async fn paced_commits(
        &self,
        client: &str,
        events: usize,
        pace: Duration,
    ) -> HashMap<String, i64> {
        let mut committed_at = HashMap::new();
        for _ in 0..events {
            let event_id = self.client_paid(client, wall_ms()).await;
            committed_at.insert(event_id, wall_ms());
            tokio::time::sleep(pace).await;
        }
        committed_at
    }

    /// Commits an event of `event_type` at `now_ms`; returns its id.
    async fn record(&self, client: &str, event_type: &'static str, now_ms: i64) -> String {
        let client = client.to_owned();
        self.database
            .write(async move |tx| {
                let data = serde_json::json!({"order_id": "ord_1"});
                let event = NewEvent {
                    event_type,
                    version: 1,
                    data: &data,
                };
                outbox::record(tx, &client, &event, now_ms).await
            })
            .await
            .expect("record")
            .expect("an endpoint subscribes")
    }

    pub(crate) fn subscriptions(&self) -> Subscriptions {
        Subscriptions::new(self.database.clone(), self.keys.clone())
    }

    /// The endpoint's delivery of `event_id`, with its attempts.
    pub(crate) async fn delivery(&self, endpoint_id: &str, event_id: &str) -> DeliveryLog {
        let log = self
            .subscriptions()
            .deliveries(CLIENT, endpoint_id, &DeliveryQuery::newest(1_000))
            .await
            .expect("delivery log")
            .deliveries;
        log.into_iter()
            .find(|delivery| delivery.event_id == event_id)
            .expect("the delivery exists")
    }

    /// Waits until the endpoint's delivery of `event_id` has `attempts` attempts recorded.
    pub(crate) async fn attempts(
        &self,
        endpoint_id: &str,
        event_id: &str,
        attempts: usize,
    ) -> DeliveryLog {
        // The log reads a delivery and its attempts in one snapshot: the delivery found is the one
        // its last attempt left.
        eventually(
            Duration::from_secs(10),
            &format!("{attempts} attempts of {event_id}"),
            || async {
                let delivery = self.delivery(endpoint_id, event_id).await;
                (delivery.attempts.len() >= attempts).then_some(delivery)
            },
        )
        .await
    }
}

/// One delivery as a receiver got it.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at_ms: i64,
}

impl Received {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// Checks the delivery's signature with `secret` alone, at the time it was signed.
    pub(crate) fn verify(&self, secret: &Secret) -> Result<(), VerifyError> {
        let headers = ReceivedHeaders {
            id: self.header("webhook-id"),
            timestamp: self.header("webhook-timestamp"),
            signature: self.header("webhook-signature"),
        };
        let now_secs = self
            .header("webhook-timestamp")
            .and_then(|t| t.parse().ok())
            .expect("a timestamp");
        Verifier::new(secret.clone()).verify(&headers, &self.body, now_secs)
    }
}

/// Commit → receipt times of what `receiver` got, in ms, sorted; `committed_at_ms` by event id.
pub(crate) fn commit_to_receipt(
    receiver: &Receiver,
    committed_at_ms: &HashMap<String, i64>,
) -> Latencies {
    let mut ms: Vec<i64> = receiver
        .received()
        .iter()
        .map(|delivery| {
            delivery.at_ms - committed_at_ms[delivery.header("webhook-id").expect("webhook-id")]
        })
        .collect();
    ms.sort_unstable();
    Latencies(ms)
}

/// Latencies in ms, sorted.
pub(crate) struct Latencies(pub Vec<i64>);

impl Latencies {
    /// The `p` quantile (0.0..=1.0), nearest rank.
    pub(crate) fn percentile(&self, p: f64) -> i64 {
        self.0[((self.0.len() - 1) as f64 * p).round() as usize]
    }
}

/// How a receiver answers its `n`th delivery (from 0).
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Status(u16, Vec<(&'static str, String)>),
    /// Never answers; the sender's request timeout ends the wait.
    Hang,
}

/// A webhook receiver on 127.0.0.1 that records what it gets and how many it holds at once.
#[derive(Clone)]
pub(crate) struct Receiver {
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
    pub(crate) async fn start(answer: impl Fn(usize) -> Answer + Send + Sync + 'static) -> Self {
        let state = Arc::new(ReceiverState {
            answer: Box::new(answer),
            received: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            most_in_flight: AtomicUsize::new(0),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let app = Router::new()
            .route("/hook", post(receive))
            .with_state(state.clone());
        let stop = CancellationToken::new();
        tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(stop.clone().cancelled_owned())
                .into_future(),
        );
        Self {
            addr,
            state,
            _stop: Arc::new(stop.drop_guard()),
        }
    }

    /// Answers every delivery with `status`.
    pub(crate) async fn answering(status: u16) -> Self {
        Self::start(move |_| Answer::Status(status, Vec::new())).await
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    pub(crate) fn test_host(&self) -> String {
        self.addr.to_string()
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.state.received.lock().expect("not poisoned").clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.state.received.lock().expect("not poisoned").len()
    }

    /// The most deliveries it was holding at once.
    pub(crate) fn most_in_flight(&self) -> usize {
        self.state.most_in_flight.load(Ordering::SeqCst)
    }

    pub(crate) async fn wait_for(&self, deliveries: usize) {
        eventually(
            Duration::from_secs(10),
            &format!("{deliveries} deliveries at {}", self.addr),
            || async { self.count() >= deliveries },
        )
        .await;
    }
}

/// A recipient of marker events (`order.payment_declined`, which no other endpoint of these tests
/// subscribes to). A marker's delivery shows that the sender has had its chance to send what was
/// due before it, so that a check that something was not sent means something.
pub(crate) struct Marker {
    pub receiver: Receiver,
}

impl Marker {
    pub(crate) async fn subscribe(outbox: &Outbox, now_ms: i64) -> Self {
        let receiver = Receiver::answering(204).await;
        outbox
            .endpoint(
                &receiver.url(),
                &[ORDER_PAYMENT_DECLINED],
                EndpointLimits::default(),
                now_ms,
            )
            .await;
        Self { receiver }
    }

    /// Returns once the sender has dispatched what was due at `now_ms` (sender clock): two markers
    /// committed then, the second after the first arrived. The first may go out in the same poll
    /// as what fell due with it and overtake it; the second is only seen by a later poll.
    pub(crate) async fn passed(&self, outbox: &Outbox, now_ms: i64) {
        for _ in 0..2 {
            let delivered = self.receiver.count() + 1;
            outbox.record(CLIENT, ORDER_PAYMENT_DECLINED, now_ms).await;
            self.receiver.wait_for(delivered).await;
        }
    }
}

/// Counts a delivery in flight until its handler ends, answered or dropped by a disconnect.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    let _in_flight = InFlight(&state.in_flight);
    state.most_in_flight.fetch_max(now, Ordering::SeqCst);
    let n = {
        let mut received = state.received.lock().expect("not poisoned");
        received.push(Received {
            headers,
            body,
            at_ms: wall_ms(),
        });
        received.len() - 1
    };
    match (state.answer)(n) {
        Answer::Status(status, headers) => {
            let mut response = StatusCode::from_u16(status)
                .expect("a status")
                .into_response();
            for (name, value) in headers {
                response.headers_mut().insert(
                    HeaderName::from_static(name),
                    value.parse().expect("header value"),
                );
            }
            response
        }
        Answer::Hang => std::future::pending().await,
    }
}

/// A TCP listener that only counts the connections made to it: a place no delivery may reach.
pub(crate) struct Forbidden {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl Forbidden {
    pub(crate) async fn listen(ip: [u8; 4]) -> Self {
        let listener = TcpListener::bind((IpAddr::from(ip), 0))
            .await
            .expect("bind on loopback");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            // Counted before the connection is closed, so before a sender that dialled it can
            // record its attempt.
            while let Ok((connection, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(connection);
            }
        });
        Self { addr, connections }
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Names that resolve to what a test says, and nothing else.
#[derive(Debug, Clone, Default)]
pub(crate) struct FixedResolver(pub HashMap<String, Vec<IpAddr>>);

impl Resolve for FixedResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.0
            .get(host)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such name {host}")))
    }
}

/// Settings for a sender on `outbox` that may reach `receivers` over plain http, polling often.
/// SQLite commits synced only at checkpoints: these tests measure how the sender schedules its
/// work, not how fast the disk syncs (a sync per commit, the default, on a loaded machine once
/// kept a writer waiting past the 5 s a writer is waited for).
fn unsynced() -> storage::SqliteSettings {
    storage::SqliteSettings {
        synchronous: storage::Synchronous::Normal,
        ..Default::default()
    }
}

pub(crate) fn settings(outbox: &Outbox, receivers: &[&Receiver]) -> Settings {
    Settings {
        database_url: outbox.url.clone(),
        sqlite: unsynced(),
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        poll_interval_ms: 10,
        test_hosts: receivers
            .iter()
            .map(|receiver| receiver.test_host())
            .collect(),
        secret_keys: outbox.keys.clone(),
        ..Settings::default()
    }
}

/// A sender running in this test until it is dropped.
pub(crate) struct RunningSender {
    _stop: DropGuard,
}

/// A sender with its clock, looking names up as `settings.dns` says.
pub(crate) async fn start_sender(settings: Settings, clock: Arc<dyn Clock>) -> RunningSender {
    run(Application::build_with_clock(settings, clock)
        .await
        .expect("sender"))
}

/// A sender with its clock, whose names resolve through `resolver`.
pub(crate) async fn start_sender_resolving<R: Resolve + Send + Sync + 'static>(
    settings: Settings,
    clock: Arc<dyn Clock>,
    resolver: R,
) -> RunningSender {
    run(Application::build_with(settings, clock, resolver)
        .await
        .expect("sender"))
}

fn run<R: Resolve + Send + Sync + 'static>(app: Application<R>) -> RunningSender {
    let stop = CancellationToken::new();
    tokio::spawn(app.run_until_stopped(stop.clone()));
    RunningSender {
        _stop: stop.drop_guard(),
    }
}

/// The sender binary on a port of its own choosing (port 0), killed with SIGKILL when dropped.
pub(crate) struct SenderProcess {
    child: KilledOnDrop,
    /// Where it serves its health check and metrics, as its log reported.
    pub health: SocketAddr,
}

struct KilledOnDrop(Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What the sender's log said by the time it was serving: its address, or, when the log ended
/// first, everything the log said.
type Startup = Result<SocketAddr, String>;

impl SenderProcess {
    /// Starts the binary on `outbox` and waits until its log says where it serves.
    pub(crate) async fn spawn(outbox: &Outbox, test_host: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_webhook-sender"))
            .env("WEBHOOK_SENDER_DATABASE_URL", &outbox.url)
            .env(
                "WEBHOOK_SENDER_SECRET_KEYS",
                serde_json::to_string(&outbox.keys).expect("keys serialize"),
            )
            .env("WEBHOOK_SENDER_LISTEN", "127.0.0.1:0")
            .env("WEBHOOK_SENDER_POLL_INTERVAL_MS", "20")
            .env("WEBHOOK_SENDER_REQUEST_TIMEOUT_MS", "2000")
            // As short as the settings allow (the timeout + 5 s to record), so that the restarted
            // sender takes the dead one's delivery over soon.
            .env("WEBHOOK_SENDER_LEASE_MS", "7000")
            // The line with the bound address is logged at info, and read as plain text.
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .args(["--set", &format!("test_hosts=[\"{test_host}\"]")])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the sender binary starts");
        let log = child.stdout.take().expect("stdout is piped");
        let child = KilledOnDrop(child);
        let startup = Arc::new(Mutex::new(None));
        std::thread::spawn({
            let startup = startup.clone();
            move || read_log(log, &startup)
        });
        let started = eventually(
            Duration::from_secs(20),
            "the sender logs where it serves",
            || async { startup.lock().expect("not poisoned").take() },
        )
        .await;
        let health = started
            .unwrap_or_else(|log| panic!("the sender stopped before it served; its log:\n{log}"));
        Self { child, health }
    }

    /// SIGKILL: no chance to record anything.
    pub(crate) fn kill(mut self) {
        self.child.0.kill().expect("SIGKILL");
        self.child.0.wait().expect("reaped");
    }
}

/// Hands over what the sender's log says by the time it serves, then reads the rest, so that the
/// sender never blocks on a full pipe.
fn read_log(log: ChildStdout, startup: &Mutex<Option<Startup>>) {
    let mut lines = BufReader::new(log).lines().map_while(Result::ok);
    let mut before = String::new();
    for line in lines.by_ref() {
        if let Some(health) = serving_address(&line) {
            *startup.lock().expect("not poisoned") = Some(Ok(health));
            lines.for_each(drop);
            return;
        }
        before.push_str(&line);
        before.push('\n');
    }
    *startup.lock().expect("not poisoned") = Some(Err(before));
}

/// The address in the line the binary logs once it is bound: `… webhook-sender delivering
/// health=127.0.0.1:PORT`.
fn serving_address(line: &str) -> Option<SocketAddr> {
    if !line.contains("webhook-sender delivering") {
        return None;
    }
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("health="))?
        .parse()
        .ok()
}
