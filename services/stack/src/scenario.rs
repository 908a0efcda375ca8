//! Named scenarios: set the bank's faults, drive a bounded load through the gateway's HTTP API,
//! and report what the chain did. A scenario may run several chain variants under the same fault
//! (e.g. budgeted against naive) and compare them side by side.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bank_mock::{BankStats, Faults, Latency};
use deadline::ledger;
use hdrhistogram::Histogram;
use resilience::retry::RetryStatsSnapshot;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    chain::{Chain, ChainGuardStats, ChainHopStats, ChainSettings, GATEWAY_HTTP},
    settlement::{self, Settlement},
};

/// How requests are sent.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// A fixed number of clients, each sending its next request when the last is answered.
    Closed { concurrency: usize },
    /// A fixed arrival rate, whatever the answers do (no coordinated omission).
    Open { per_second: u32 },
}

/// What the scenario's clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Traffic {
    /// `POST /v1/orders`, each with its own idempotency key (or one shared key).
    CreateOrders,
    /// `GET /v1/orders/{id}/summary` of one order made before the faults start.
    Summaries,
}

/// One chain configuration a scenario runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Variant {
    pub label: &'static str,
    /// The naive chain (see [`crate::naive`]), whose clients do not tell the gateway their
    /// deadline either: they only give up after it.
    pub naive: bool,
    /// Changes to the chain's settings for this variant, after the scenario's own.
    #[serde(skip)]
    pub settings: fn(&mut ChainSettings),
}

const BUDGETED: Variant = Variant {
    label: "budgeted",
    naive: false,
    settings: as_configured,
};
const NAIVE: Variant = Variant {
    label: "naive",
    naive: true,
    settings: as_configured,
};
const NO_RETRIES: Variant = Variant {
    label: "no retries",
    naive: false,
    settings: |settings| settings.gateway.retry.max_attempts = 1,
};
const LAYERS_OFF: Variant = Variant {
    label: "layers off",
    naive: false,
    settings: without_guards,
};

/// Every guard out of the way: retries and breakers off, bulkhead and quota limits raised far
/// beyond the load (the layers stay; their decisions never refuse), to measure what the guards
/// cost on a healthy chain.
pub fn without_guards(settings: &mut ChainSettings) {
    without_breakers(settings);
    settings.gateway.retry.max_attempts = 1;
    let unlimited = resilience::rate_limit::QuotaSettings::default();
    settings.payment.bank.quota = unlimited;
    for client in &mut settings.gateway.clients {
        client.quota = resilience::rate_limit::QuotaSettings {
            per_second: u32::MAX / 2,
            burst: u32::MAX / 2,
        };
    }
    for dependency in [
        &mut settings.gateway.orders,
        &mut settings.orders.payment,
        &mut settings.payment.bank,
    ] {
        dependency.max_concurrent = u32::MAX / 2;
    }
}

/// One named scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub faults: Faults,
    pub requests: usize,
    pub load: Load,
    /// `X-Request-Timeout-Ms` sent by the clients, who also give up after it (none: the
    /// gateway's default and no client-side limit).
    pub timeout_ms: Option<u64>,
    pub variants: &'static [Variant],
    /// Every request carries the same idempotency key (a storm of duplicates).
    pub one_key: bool,
    /// After the run, send every request again with its key, to measure replays.
    pub replay: bool,
    /// After the run (and before anything is sent again), wait for orders' completer to settle
    /// the creates left half-done, and report the orders before and after.
    pub settle: bool,
    /// Changes to the chain's settings for this scenario.
    pub chain: fn(&mut ChainSettings),
    /// The bank's faults are lifted this long after the start.
    pub heal_after: Option<Duration>,
    /// The API key the clients use.
    pub api_key: &'static str,
    pub traffic: Traffic,
    /// Reads of one order sent beside the load at this rate, timed apart (and before the faults,
    /// as the baseline).
    pub reads_per_second: Option<u32>,
}

impl Scenario {
    /// What a scenario does unless it says otherwise (every catalogue entry names its own name,
    /// story, faults, size and load).
    const DEFAULTS: Scenario = Scenario {
        name: "",
        about: "",
        faults: Faults::HEALTHY,
        requests: 100,
        load: Load::Closed { concurrency: 8 },
        timeout_ms: None,
        variants: &[BUDGETED],
        one_key: false,
        replay: false,
        settle: false,
        chain: as_configured,
        heal_after: None,
        api_key: "demo-key-1",
        traffic: Traffic::CreateOrders,
        reads_per_second: None,
    };
}

/// Leaves the chain's settings as they are.
fn as_configured(_: &mut ChainSettings) {}

/// Turns every circuit breaker off, so that a scenario shows what the retry budget does alone.
pub fn without_breakers(settings: &mut ChainSettings) {
    settings.gateway.orders.breaker.enabled = false;
    settings.orders.payment.breaker.enabled = false;
    settings.payment.bank.breaker.enabled = false;
}

/// Longest a scenario run may send before it stops.
const TIME_LIMIT: Duration = Duration::from_secs(120);
/// How long after the last answer the bank is watched for work nobody will read.
const SETTLE: Duration = Duration::from_secs(2);
/// The longest a scenario waits for the completer to settle its orders.
const SETTLEMENT_LIMIT: Duration = Duration::from_secs(60);

/// Breakers out of the way (every lost reply is a failure to them), and a completer that resumes
/// a stranded create 1 s after it was left instead of 10 s, so that the run shows it.
fn quick_completer(settings: &mut ChainSettings) {
    without_breakers(settings);
    settings.orders.completer.grace_ms = 1_000;
    settings.orders.completer.interval_ms = 200;
}

fn latency(mean: f64, stddev: f64) -> Latency {
    Latency { mean, stddev }
}

pub fn catalogue() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "healthy",
            about: "a healthy bank (20 ± 5 ms): every order is paid; the ledger shows each hop's slice",
            faults: Faults::default(),
            requests: 200,
            load: Load::Closed { concurrency: 8 },
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "bank-slow",
            about: "the bank takes 1200 ± 400 ms; payment gives it at most 1.5 s, so the slowest calls end in 504",
            faults: Faults {
                latency_ms: latency(1_200.0, 400.0),
                ..Faults::default()
            },
            requests: 60,
            load: Load::Closed { concurrency: 12 },
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "bank-hang",
            about: "every bank call hangs and clients allow 500 ms: every hop stops at its deadline and the client gets 504",
            faults: Faults {
                hang: true,
                ..Faults::default()
            },
            requests: 20,
            load: Load::Closed { concurrency: 10 },
            timeout_ms: Some(500),
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "bank-flaky",
            about: "30 % of bank calls fail UNAVAILABLE: edge retries win back failed orders, within the 10 % budget",
            faults: Faults {
                error_rate: 0.3,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 500,
            load: Load::Open { per_second: 100 },
            variants: &[NO_RETRIES, BUDGETED],
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "bank-down",
            about: "every bank call fails UNAVAILABLE at 200 requests/s: the retry throttle stops the retries and bank calls per request stay near 1; the naive chain makes 27",
            faults: Faults {
                error_rate: 1.0,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 2_000,
            load: Load::Open { per_second: 200 },
            variants: &[BUDGETED, NAIVE],
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "bank-throttled",
            about: "half the bank calls answer RESOURCE_EXHAUSTED with a 200 ms pushback: the gateway waits exactly that long",
            faults: Faults {
                resource_exhausted_rate: 0.5,
                pushback_ms: 200,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 200,
            load: Load::Open { per_second: 50 },
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "naive-vs-budgeted",
            about: "the bank is down (UNAVAILABLE after 60 ± 10 ms) and clients allow 1 s: the naive chain multiplies bank calls (3 attempts at each of 3 levels) and answers after its clients have given up",
            faults: Faults {
                error_rate: 1.0,
                latency_ms: latency(60.0, 10.0),
                ..Faults::default()
            },
            requests: 200,
            load: Load::Open { per_second: 40 },
            timeout_ms: Some(1_000),
            variants: &[BUDGETED, NAIVE],
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "lost-reply",
            about: "the bank charges, then loses every reply: the gateway's retries (within the budget) and then the clients' own retries with the same keys get the orders paid, one charge each",
            faults: Faults {
                drop_reply_rate: 1.0,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 100,
            load: Load::Closed { concurrency: 4 },
            replay: true,
            chain: without_breakers,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "stranded-charges",
            about: "the bank charges and loses every reply, and the gateway retries only within its budget: the orders it gives up on stay charged but pending until orders' completer settles each with the same keys, one charge each, and the clients' repeats get the settled answers",
            faults: Faults {
                drop_reply_rate: 1.0,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 200,
            load: Load::Open { per_second: 40 },
            replay: true,
            settle: true,
            chain: quick_completer,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "create-answers",
            about: "the bank fails every call for 3 s, then recovers: each failed create says how it stands, refused before the bank (no order, never charged) or pending (its order named, and paid once the bank is back, by orders' completer); the bank charges each paid order once",
            faults: Faults {
                error_rate: 1.0,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 300,
            load: Load::Open { per_second: 60 },
            settle: true,
            chain: |settings| {
                settings.orders.completer.grace_ms = 1_000;
                settings.orders.completer.interval_ms = 200;
            },
            heal_after: Some(Duration::from_secs(3)),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "duplicate-storm",
            about: "50 clients send the same request with one idempotency key at once: one executes, the others get its answer or 409",
            faults: Faults {
                latency_ms: latency(50.0, 5.0),
                ..Faults::default()
            },
            requests: 50,
            load: Load::Closed { concurrency: 50 },
            one_key: true,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "idempotent-throughput",
            about: "an instant bank and 16 clients: paid orders per second through four hops with idempotent writes, then the cost of replaying them",
            faults: Faults {
                latency_ms: latency(0.0, 0.0),
                ..Faults::default()
            },
            requests: 3_000,
            load: Load::Closed { concurrency: 16 },
            replay: true,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "bank-down-breaker",
            about: "the bank fails every call for 3 s, then recovers: payment's breaker opens, answers at once without calling, probes and closes",
            faults: Faults {
                error_rate: 1.0,
                latency_ms: latency(5.0, 1.0),
                ..Faults::default()
            },
            requests: 500,
            load: Load::Open { per_second: 100 },
            heal_after: Some(Duration::from_secs(3)),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "slow-bank-bulkhead",
            about: "the bank takes 1 s per call (breakers off): payment holds at most 20 such calls and refuses the rest at once, while reads of orders keep their latency",
            faults: Faults {
                latency_ms: latency(1_000.0, 50.0),
                ..Faults::default()
            },
            requests: 300,
            load: Load::Open { per_second: 60 },
            chain: without_breakers,
            reads_per_second: Some(50),
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "client-over-quota",
            about: "demo-key-2 (5 requests/s, burst 10) sends 20/s: the excess gets 429 with Retry-After and RateLimit headers, cheaply, before any work",
            faults: Faults::default(),
            requests: 100,
            load: Load::Open { per_second: 20 },
            api_key: "demo-key-2",
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "summary-partial",
            about: "order summaries while the bank fails and recommendations have no budget: the last rate and popular items stand in, the rest is shown",
            faults: Faults {
                error_rate: 1.0,
                ..Faults::default()
            },
            requests: 200,
            load: Load::Open { per_second: 50 },
            chain: |settings| settings.gateway.recommendations.deadline.cap_ms = Some(1),
            traffic: Traffic::Summaries,
            ..Scenario::DEFAULTS
        },
        Scenario {
            name: "layers-cost",
            about: "a healthy chain with an instant bank, with every guard and with them out of the way: what the layers cost per request",
            faults: Faults {
                latency_ms: latency(0.0, 0.0),
                ..Faults::default()
            },
            requests: 2_000,
            load: Load::Closed { concurrency: 1 },
            variants: &[BUDGETED, LAYERS_OFF],
            ..Scenario::DEFAULTS
        },
    ]
}

pub fn find(name: &str) -> Option<Scenario> {
    catalogue()
        .into_iter()
        .find(|scenario| scenario.name == name)
}

impl Scenario {
    /// The same scenario with a different number of requests and load.
    pub fn with_load(mut self, requests: usize, load: Load) -> Self {
        self.requests = requests;
        self.load = load;
        self
    }

    /// The same scenario with only the variant labelled `label` (none if it has no such variant).
    pub fn only(mut self, label: &str) -> Self {
        self.variants = match self
            .variants
            .iter()
            .position(|variant| variant.label == label)
        {
            Some(index) => &self.variants[index..=index],
            None => &[],
        };
        self
    }
}

/// What one run of one variant measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: &'static str,
    pub about: &'static str,
    pub variant: &'static str,
    pub load: Load,
    pub requests: usize,
    pub elapsed_ms: f64,
    /// HTTP status → count.
    pub outcomes: BTreeMap<u16, usize>,
    /// Failed creates by what their answer says they left behind: `refused` (nothing charged,
    /// then or later), `pending` (the order named, settled later) or `unknown`.
    pub unsettled: BTreeMap<String, usize>,
    /// Requests with no HTTP answer (the client gave up or the connection failed).
    pub no_answer: usize,
    pub success_rate: f64,
    pub latency_ms: Percentiles,
    /// Answered requests per second over the run.
    pub requests_per_second: f64,
    /// The same requests sent again with their keys (replays, or resumptions of unfinished
    /// ones), when measured: their latency and HTTP status → count.
    pub replay_latency_ms: Option<Percentiles>,
    pub replay_outcomes: Option<BTreeMap<u16, usize>>,
    /// The orders when the clients left and once the completer had settled them, when watched.
    pub settlement: Option<Settlement>,
    pub bank: BankStats,
    /// Bank calls (every attempt that reached it) per user request, before anything was sent again.
    pub bank_calls_per_request: f64,
    /// Bank calls that arrived after every client had its answer or had given up.
    pub bank_calls_after_clients_left: u64,
    pub retry: RetryStatsSnapshot,
    /// Answers made from a fallback (marked `X-Fallback`).
    pub fallback_answers: usize,
    /// Requests the gateway refused for being over their client's quota.
    pub rate_limited: u64,
    /// Reads of one order beside the load, and the same reads before the faults.
    pub read_latency_ms: Option<Percentiles>,
    pub baseline_read_latency_ms: Option<Percentiles>,
    pub guards: ChainGuardStats,
    pub hops: ChainHopStats,
    /// `X-Deadline-Ledger` and `Server-Timing` of the first answer.
    pub sample_ledger: Option<String>,
    pub sample_server_timing: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(histogram: &Histogram<u64>) -> Self {
        Self {
            min: histogram.min() as f64 / 1e3,
            p50: histogram.value_at_quantile(0.50) as f64 / 1e3,
            p99: histogram.value_at_quantile(0.99) as f64 / 1e3,
            max: histogram.max() as f64 / 1e3,
        }
    }
}

/// Where a sender's requests go.
enum Target {
    Create(String),
    Get(String),
}

/// The order every scenario creates: the README's example.
pub fn order_json() -> serde_json::Value {
    serde_json::json!({
        "customer_id": "c-1",
        "items": [{"sku": "sku-1", "quantity": 2}],
        "amount_minor": 1299,
        "currency": "EUR",
    })
}

/// The same order as a gRPC message.
pub fn order_message() -> proto::common::v1::CreateOrderRequest {
    proto::common::v1::CreateOrderRequest {
        customer_id: "c-1".into(),
        items: vec![proto::common::v1::LineItem {
            sku: "sku-1".into(),
            quantity: 2,
        }],
        amount_minor: 1299,
        currency: "EUR".into(),
    }
}

#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<u16, usize>,
    /// Failed creates by the outcome their problem names (`refused`, `pending`, `unknown`).
    unsettled: BTreeMap<String, usize>,
    /// Answers marked `X-Fallback`.
    fallbacks: usize,
    no_answer: usize,
    sample: Option<(Option<String>, Option<String>)>,
}

/// Everything one request needs, shared by the senders.
struct Sender {
    client: reqwest::Client,
    /// What each request does: a POST to this URL, or a GET of it.
    url: String,
    get: bool,
    api_key: &'static str,
    name: &'static str,
    run_id: u128,
    timeout_ms: Option<u64>,
    /// Whether the client sends its deadline (`X-Request-Timeout-Ms`) or only gives up after it.
    tell_deadline: bool,
    one_key: bool,
    total: usize,
    started: Instant,
    latencies: Mutex<Histogram<u64>>,
    tally: Mutex<Tally>,
    done: AtomicUsize,
}

impl Sender {
    fn new(
        scenario: &Scenario,
        target: Target,
        tell_deadline: bool,
        run_id: u128,
        started: Instant,
    ) -> Arc<Self> {
        let (url, get) = match target {
            Target::Create(url) => (url, false),
            Target::Get(url) => (url, true),
        };
        Arc::new(Self {
            client: reqwest::Client::new(),
            url,
            get,
            api_key: scenario.api_key,
            name: scenario.name,
            run_id,
            timeout_ms: scenario.timeout_ms,
            tell_deadline,
            one_key: scenario.one_key,
            total: scenario.requests,
            started,
            latencies: Mutex::new(histogram()),
            tally: Mutex::default(),
            done: AtomicUsize::new(0),
        })
    }

    async fn send(&self, index: usize) {
        let mut request = if self.get {
            self.client.get(&self.url).bearer_auth(self.api_key)
        } else {
            self.client
                .post(&self.url)
                .bearer_auth(self.api_key)
                .header(
                    wire::IDEMPOTENCY_KEY,
                    format!(
                        "{}-{}-{}",
                        self.name,
                        self.run_id,
                        if self.one_key { 0 } else { index }
                    ),
                )
                .json(&order_json())
        };
        if let Some(ms) = self.timeout_ms {
            // The client gives up after its deadline, as a real one would, and asks for it.
            request = request.timeout(Duration::from_millis(ms));
            if self.tell_deadline {
                request = request.header(wire::REQUEST_TIMEOUT_MS, ms);
            }
        }
        let sent = Instant::now();
        let response = request.send().await;
        let micros = sent.elapsed().as_micros() as u64;
        self.latencies
            .lock()
            .expect("histogram lock")
            .saturating_record(micros.max(1));
        match response {
            Ok(response) => {
                let status = response.status();
                let fallback = response.headers().contains_key(wire::FALLBACK);
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let sample = (header(wire::DEADLINE_LEDGER), header("server-timing"));
                // What a failed create left behind, as its problem says.
                let unsettled = if !self.get
                    && (status.is_server_error()
                        || status == reqwest::StatusCode::TOO_MANY_REQUESTS)
                {
                    let problem: Option<serde_json::Value> = response.json().await.ok();
                    problem.and_then(|problem| problem["outcome"].as_str().map(str::to_owned))
                } else {
                    None
                };
                let mut tally = self.tally.lock().expect("tally lock");
                *tally.outcomes.entry(status.as_u16()).or_default() += 1;
                if let Some(outcome) = unsettled {
                    *tally.unsettled.entry(outcome).or_default() += 1;
                }
                if fallback {
                    tally.fallbacks += 1;
                }
                tally.sample.get_or_insert(sample);
            }
            Err(_) => self.tally.lock().expect("tally lock").no_answer += 1,
        }
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if done.is_multiple_of((self.total / 10).max(1)) || done == self.total {
            eprintln!(
                "  [{}] {done:>5}/{} answered, {:.1} s",
                self.name,
                self.total,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 1 h at 3 significant digits; longer waits are recorded as 1 h.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

/// Creates one order with the bank healthy and returns its id.
async fn seed_order(base: &str, api_key: &str) -> String {
    let client = reqwest::Client::new();
    let key = format!("seed-{}", std::process::id());
    let answer: Option<serde_json::Value> = async {
        let response = client
            .post(format!("{base}/v1/orders"))
            .bearer_auth(api_key)
            .header(wire::IDEMPOTENCY_KEY, key)
            .json(&order_json())
            .send()
            .await
            .ok()?;
        response.json().await.ok()
    }
    .await;
    let id = answer
        .and_then(|order| order["order_id"].as_str().map(str::to_owned))
        .expect("the seed order is created");
    // A first summary while everything is healthy, so that fallbacks have something to fall back on.
    let _ = client
        .get(format!("{base}/v1/orders/{id}/summary"))
        .bearer_auth(api_key)
        .send()
        .await;
    id
}

/// Reads `url` `count` times one after another: the latency of reads with nothing else going on.
async fn time_reads(url: &str, api_key: &str, count: usize) -> Percentiles {
    let client = reqwest::Client::new();
    let mut latencies = histogram();
    for _ in 0..count {
        let sent = Instant::now();
        let _ = client.get(url).bearer_auth(api_key).send().await;
        latencies.saturating_record(sent.elapsed().as_micros().max(1) as u64);
    }
    Percentiles::of(&latencies)
}

/// Reads `url` at `per_second` until `stop`, and returns the reads' latency.
async fn read_until(
    url: &str,
    api_key: &str,
    per_second: u32,
    stop: CancellationToken,
) -> Percentiles {
    let client = reqwest::Client::new();
    let latencies = Arc::new(Mutex::new(histogram()));
    let mut reads = JoinSet::new();
    let mut ticks = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticks.tick() => {
                let (client, url, latencies) = (client.clone(), url.to_owned(), latencies.clone());
                let api_key = api_key.to_owned();
                reads.spawn(async move {
                    let sent = Instant::now();
                    let _ = client.get(&url).bearer_auth(api_key).send().await;
                    latencies.lock().expect("histogram lock").saturating_record(sent.elapsed().as_micros().max(1) as u64);
                });
            }
        }
    }
    while reads.join_next().await.is_some() {}
    let latencies = latencies.lock().expect("histogram lock");
    Percentiles::of(&latencies)
}

/// Sends the scenario's requests through `sender` with its load, and waits for every answer.
async fn drive(sender: Arc<Sender>, scenario: &Scenario) {
    let started = sender.started;
    let mut requests = JoinSet::new();
    match scenario.load {
        Load::Closed { concurrency } => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..concurrency {
                let (sender, next) = (sender.clone(), next.clone());
                requests.spawn(async move {
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        if index >= sender.total || started.elapsed() > TIME_LIMIT {
                            break;
                        }
                        sender.send(index).await;
                    }
                });
            }
        }
        Load::Open { per_second } => {
            let mut ticks = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for index in 0..scenario.requests {
                ticks.tick().await;
                if started.elapsed() > TIME_LIMIT {
                    break;
                }
                let sender = sender.clone();
                requests.spawn(async move { sender.send(index).await });
            }
        }
    }
    while requests.join_next().await.is_some() {}
}

/// Runs `scenario` once against a running `chain` (whatever variant it was started as).
pub async fn run(chain: &Chain, scenario: &Scenario, variant: &'static str) -> ScenarioReport {
    chain.bank().reset();
    let base = format!("http://{}", chain.address(&GATEWAY_HTTP));
    // One order made while the bank is healthy, for scenarios that read it.
    let seeded = if scenario.traffic == Traffic::Summaries || scenario.reads_per_second.is_some() {
        Some(seed_order(&base, scenario.api_key).await)
    } else {
        None
    };
    let baseline_reads = match (&seeded, scenario.reads_per_second) {
        (Some(id), Some(_)) => {
            Some(time_reads(&format!("{base}/v1/orders/{id}"), scenario.api_key, 100).await)
        }
        _ => None,
    };
    chain
        .bank()
        .update_faults(|faults| *faults = scenario.faults.clone());
    let retry_before = chain.retry_stats();
    let rate_limited_before = chain.rate_limited();
    let started = Instant::now();
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let target = |get_summary: bool| match (&seeded, get_summary) {
        (Some(id), true) => Target::Get(format!("{base}/v1/orders/{id}/summary")),
        _ => Target::Create(format!("{base}/v1/orders")),
    };
    let summaries = scenario.traffic == Traffic::Summaries;
    let tell_deadline = !chain.naive();
    let sender = Sender::new(scenario, target(summaries), tell_deadline, run_id, started);
    let healing = scenario.heal_after.map(|after| {
        let bank = chain.bank_state();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            eprintln!("  the bank's faults are lifted");
            bank.update_faults(|faults| {
                *faults = Faults {
                    latency_ms: faults.latency_ms,
                    ..Faults::default()
                }
            });
        })
    });
    let reading = CancellationToken::new();
    let reads = match (&seeded, scenario.reads_per_second) {
        (Some(id), Some(per_second)) => {
            let (url, api_key, stop) = (
                format!("{base}/v1/orders/{id}"),
                scenario.api_key,
                reading.clone(),
            );
            Some(tokio::spawn(async move {
                read_until(&url, api_key, per_second, stop).await
            }))
        }
        _ => None,
    };
    drive(sender.clone(), scenario).await;
    if let Some(healing) = healing {
        healing.abort();
    }
    reading.cancel();
    let read_latency_ms = match reads {
        Some(reads) => Some(reads.await.expect("the reader does not panic")),
        None => None,
    };
    let elapsed = started.elapsed();

    let calls_when_clients_left = chain.bank().stats().calls;
    let settlement = if scenario.settle {
        eprintln!(
            "  [{}] waiting for orders' completer to settle the pending orders",
            scenario.name
        );
        settlement::watch(chain, SETTLEMENT_LIMIT)
            .await
            .inspect_err(|error| eprintln!("  the orders could not be counted: {error}"))
            .ok()
    } else {
        None
    };
    tokio::time::sleep(SETTLE).await;
    let bank_calls = chain.bank().stats().calls;
    let bank_calls_after_clients_left = bank_calls - calls_when_clients_left;

    let (replay_latency_ms, replay_outcomes) = if scenario.replay {
        eprintln!(
            "  [{}] sending every request again with its key",
            scenario.name
        );
        let replays = Sender::new(
            scenario,
            target(summaries),
            tell_deadline,
            run_id,
            Instant::now(),
        );
        drive(replays.clone(), scenario).await;
        let histogram = replays.latencies.lock().expect("histogram lock").clone();
        let mut tally = std::mem::take(&mut *replays.tally.lock().expect("tally lock"));
        if tally.no_answer > 0 {
            // Status 0 stands for "no HTTP answer" among the replays' outcomes.
            tally.outcomes.insert(0, tally.no_answer);
        }
        (Some(Percentiles::of(&histogram)), Some(tally.outcomes))
    } else {
        (None, None)
    };

    // Read after the replays, with the other counters: a replay that reached the bank shows.
    let bank = chain.bank().stats();
    let tally = std::mem::take(&mut *sender.tally.lock().expect("tally lock"));
    let histogram = sender.latencies.lock().expect("histogram lock").clone();
    let completed = tally.outcomes.values().sum::<usize>() + tally.no_answer;
    let succeeded: usize = tally
        .outcomes
        .iter()
        .filter(|(status, _)| (200..300).contains(*status))
        .map(|(_, count)| count)
        .sum();
    let retry_after = chain.retry_stats();
    let (sample_ledger, sample_server_timing) = tally.sample.unwrap_or_default();
    ScenarioReport {
        scenario: scenario.name,
        about: scenario.about,
        variant,
        load: scenario.load,
        requests: completed,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        outcomes: tally.outcomes,
        unsettled: tally.unsettled,
        no_answer: tally.no_answer,
        success_rate: succeeded as f64 / completed.max(1) as f64,
        latency_ms: Percentiles::of(&histogram),
        replay_latency_ms,
        replay_outcomes,
        settlement,
        requests_per_second: completed as f64 / elapsed.as_secs_f64().max(1e-9),
        bank,
        bank_calls_per_request: bank_calls as f64 / completed.max(1) as f64,
        bank_calls_after_clients_left,
        retry: retry_after.since(&retry_before),
        fallback_answers: tally.fallbacks,
        rate_limited: chain.rate_limited() - rate_limited_before,
        read_latency_ms,
        baseline_read_latency_ms: baseline_reads,
        guards: chain.guard_stats(),
        hops: chain.hop_stats(),
        sample_ledger,
        sample_server_timing,
    }
}

/// Runs every variant of `scenario` on a fresh chain built from `settings`.
pub async fn run_variants(
    scenario: &Scenario,
    settings: &ChainSettings,
) -> Result<Vec<ScenarioReport>, rpc::ServerError> {
    let mut reports = Vec::new();
    for variant in scenario.variants {
        let data = tempfile::tempdir().map_err(rpc::ServerError::Serve)?;
        let mut settings = settings.clone().ephemeral().with_data_dir(data.path());
        (scenario.chain)(&mut settings);
        settings.naive.enabled = variant.naive;
        (variant.settings)(&mut settings);
        let chain = Chain::start(settings).await?;
        eprintln!(
            "Scenario {} ({}): {} requests, {}",
            scenario.name,
            variant.label,
            scenario.requests,
            describe(scenario.load)
        );
        reports.push(run(&chain, scenario, variant.label).await);
        chain.stop().await?;
    }
    Ok(reports)
}

/// `201 Created: 30, 503 Service Unavailable: 70, no answer: 2`.
fn describe_outcomes(outcomes: &BTreeMap<u16, usize>, no_answer: usize) -> String {
    outcomes
        .iter()
        .map(|(status, count)| {
            if *status == 0 {
                return format!("no answer: {count}");
            }
            let reason = reqwest::StatusCode::from_u16(*status)
                .ok()
                .and_then(|s| s.canonical_reason())
                .unwrap_or("");
            format!("{status} {reason}: {count}")
        })
        .chain((no_answer > 0).then(|| format!("no answer: {no_answer}")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe(load: Load) -> String {
    match load {
        Load::Closed { concurrency } => format!("{concurrency} concurrent"),
        Load::Open { per_second } => format!("{per_second} per second"),
    }
}

/// The variants of one scenario side by side.
pub struct Comparison<'a>(pub &'a [ScenarioReport]);

impl fmt::Display for Comparison<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reports = self.0;
        let Some(first) = reports.first() else {
            return Ok(());
        };
        writeln!(f, "\nSide by side: {}", first.scenario)?;
        write!(f, "  {:<34}", "")?;
        for report in reports {
            write!(f, "{:>14}", report.variant)?;
        }
        writeln!(f)?;
        type Row = (&'static str, fn(&ScenarioReport) -> String);
        let rows: [Row; 7] = [
            ("success rate", |r| {
                format!("{:.1} %", r.success_rate * 100.0)
            }),
            ("bank calls per user request", |r| {
                format!("{:.2}", r.bank_calls_per_request)
            }),
            ("retries at the gateway", |r| r.retry.retries.to_string()),
            ("bank calls after clients left", |r| {
                r.bank_calls_after_clients_left.to_string()
            }),
            ("work finished after its deadline", |r| {
                r.hops
                    .iter()
                    .map(|(_, counters)| counters.finished_late)
                    .sum::<u64>()
                    .to_string()
            }),
            ("p99 latency", |r| format!("{:.1} ms", r.latency_ms.p99)),
            ("no answer (client gave up)", |r| r.no_answer.to_string()),
        ];
        for (label, value) in rows {
            write!(f, "  {label:<34}")?;
            for report in reports {
                write!(f, "{:>14}", value(report))?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

impl fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\nScenario {} ({}): {}",
            self.scenario, self.variant, self.about
        )?;
        writeln!(
            f,
            "  requests     {} in {:.2} s ({}): {:.0} per second",
            self.requests,
            self.elapsed_ms / 1e3,
            describe(self.load),
            self.requests_per_second
        )?;
        writeln!(
            f,
            "  outcomes     {} (success {:.1} %)",
            describe_outcomes(&self.outcomes, self.no_answer),
            self.success_rate * 100.0
        )?;
        if !self.unsettled.is_empty() {
            let count = |outcome: &str| self.unsettled.get(outcome).copied().unwrap_or_default();
            writeln!(
                f,
                "  failed       creates refused before the bank (no order, never charged): {}; pending (order named, settled later): {}; unknown: {}",
                count("refused"),
                count("pending"),
                count("unknown")
            )?;
        }
        let l = self.latency_ms;
        writeln!(
            f,
            "  latency      min {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            l.min, l.p50, l.p99, l.max
        )?;
        if let (Some(r), Some(outcomes)) = (self.replay_latency_ms, &self.replay_outcomes) {
            writeln!(
                f,
                "  sent again   {} with the same keys: min {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
                describe_outcomes(outcomes, 0),
                r.min,
                r.p50,
                r.p99,
                r.max
            )?;
        }
        if let Some(Settlement {
            before,
            after,
            elapsed_ms,
        }) = self.settlement
        {
            writeln!(
                f,
                "  settlement   when the clients left: {} paid, {} declined, {} pending; {:.1} s later: {} paid, {} declined, {} pending; \
                 {} bank charges for {} paid and declined orders; orders without their key: {}",
                before.paid,
                before.declined,
                before.pending,
                elapsed_ms / 1e3,
                after.paid,
                after.declined,
                after.pending,
                self.bank.charges,
                after.paid + after.declined,
                after.without_key
            )?;
        }
        let b = self.bank;
        writeln!(
            f,
            "  bank         {} calls ({:.2} per request, {} marked as retries), {} charges, {} hung, {} completed after their deadline, {} after clients left",
            b.calls,
            self.bank_calls_per_request,
            b.retried_calls,
            b.charges,
            b.hung,
            b.late_completions,
            self.bank_calls_after_clients_left
        )?;
        let r = self.retry;
        writeln!(
            f,
            "  retries      {} for {} requests ({:.1} %); stopped by success {}, non-retryable {}, attempts {}, budget {}, deadline {}, pushback {}, breaker {}",
            r.retries,
            r.requests,
            r.retries as f64 * 100.0 / r.requests.max(1) as f64,
            r.stopped_success,
            r.stopped_non_retryable,
            r.stopped_attempts,
            r.stopped_budget,
            r.stopped_deadline,
            r.stopped_pushback,
            r.stopped_breaker
        )?;
        if self.fallback_answers > 0 {
            writeln!(
                f,
                "  fallbacks    {} answers made from a fallback (X-Fallback)",
                self.fallback_answers
            )?;
        }
        if self.rate_limited > 0 {
            writeln!(
                f,
                "  rate limit   {} requests refused over the client's quota",
                self.rate_limited
            )?;
        }
        if let (Some(reads), Some(baseline)) = (self.read_latency_ms, self.baseline_read_latency_ms)
        {
            writeln!(
                f,
                "  reads        of one order beside the load: p50 {:.1} ms, p99 {:.1} ms (before the faults: p50 {:.1} ms, p99 {:.1} ms)",
                reads.p50, reads.p99, baseline.p50, baseline.p99
            )?;
        }
        let g = &self.guards;
        for (name, b) in g.breakers() {
            if b.opened + b.rejected > 0 {
                writeln!(
                    f,
                    "  breaker      {name}: now {:?}; opened {}, half-opened {}, closed {}; {} calls answered at once",
                    b.position, b.opened, b.half_opened, b.closed, b.rejected
                )?;
            }
        }
        if g.bank_bulkhead.rejected > 0 {
            writeln!(
                f,
                "  bulkhead     payment → bank: {} calls rejected at the limit of {}",
                g.bank_bulkhead.rejected, g.bank_bulkhead.limit
            )?;
        }
        writeln!(
            f,
            "  deadlines    requests / expired at the hop / finished late / abandoned / failed fast"
        )?;
        for (listener, s) in self.hops.iter() {
            writeln!(
                f,
                "    {:<16} {} / {} / {} / {} / {}",
                listener.label, s.requests, s.expired, s.finished_late, s.abandoned, s.failed_fast
            )?;
        }
        if let Some(text) = &self.sample_ledger {
            writeln!(f, "  ledger of the first answer (ms)")?;
            writeln!(
                f,
                "    {:<10} {:>9} {:>8} {:>9} {:>10} {:>8}",
                "hop", "received", "spent", "reserved", "forwarded", "left"
            )?;
            match ledger::parse(text) {
                Ok(entries) => {
                    for e in entries {
                        let ms = |d: Duration| d.as_secs_f64() * 1e3;
                        writeln!(
                            f,
                            "    {:<10} {:>9.1} {:>8.1} {:>9.1} {:>10.1} {:>8.1}",
                            e.hop,
                            ms(e.received),
                            ms(e.spent),
                            ms(e.reserved),
                            ms(e.forwarded),
                            ms(e.left)
                        )?;
                    }
                }
                Err(error) => writeln!(f, "    {error}")?,
            }
        }
        if let Some(timing) = &self.sample_server_timing {
            writeln!(f, "  Server-Timing: {timing}")?;
        }
        Ok(())
    }
}
