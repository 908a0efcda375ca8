//! Named scenarios: set the bank's faults, drive a bounded load through the gateway's HTTP API,
//! and report what the chain did.

use std::{
    collections::BTreeMap,
    fmt,
    sync::Arc,
    time::{Duration, Instant},
};

use bank_mock::{BankStats, Faults, Latency};
use deadline::ledger;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::{sync::Mutex, task::JoinSet};

use crate::chain::{Chain, ChainHopStats};

/// One named scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: &'static str,
    pub about: &'static str,
    pub faults: Faults,
    pub requests: usize,
    pub concurrency: usize,
    /// `X-Request-Timeout-Ms` sent by the clients (none: the gateway's default).
    pub timeout_ms: Option<u64>,
}

/// Longest a scenario may run before it stops sending.
const TIME_LIMIT: Duration = Duration::from_secs(120);

pub fn catalogue() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "healthy",
            about: "a healthy bank (20 ± 5 ms): every order is paid; the ledger shows each hop's slice",
            faults: Faults::default(),
            requests: 200,
            concurrency: 8,
            timeout_ms: None,
        },
        Scenario {
            name: "bank-slow",
            about: "the bank takes 1200 ± 400 ms; payment gives it at most 1.5 s, so the slowest calls end in 504",
            faults: Faults { latency_ms: Latency { mean: 1_200.0, stddev: 400.0 }, ..Faults::default() },
            requests: 60,
            concurrency: 12,
            timeout_ms: None,
        },
        Scenario {
            name: "bank-hang",
            about: "every bank call hangs and clients allow 500 ms: every hop stops at its deadline and the client gets 504",
            faults: Faults { hang: true, ..Faults::default() },
            requests: 20,
            concurrency: 10,
            timeout_ms: Some(500),
        },
    ]
}

pub fn find(name: &str) -> Option<Scenario> {
    catalogue().into_iter().find(|scenario| scenario.name == name)
}

/// What one scenario run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: &'static str,
    pub about: &'static str,
    pub requests: usize,
    pub concurrency: usize,
    pub elapsed_ms: f64,
    /// HTTP status → count.
    pub outcomes: BTreeMap<u16, usize>,
    /// Transport failures (no HTTP answer at all).
    pub transport_errors: usize,
    pub latency_ms: Percentiles,
    pub bank: BankStats,
    pub bank_calls_per_request: f64,
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

#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<u16, usize>,
    transport_errors: usize,
    sample: Option<(Option<String>, Option<String>)>,
}

/// Runs `scenario` against `chain`, printing progress to stderr.
pub async fn run(chain: &Chain, scenario: &Scenario) -> Report {
    chain.bank().reset();
    chain.bank().update_faults(|faults| *faults = scenario.faults.clone());
    let url = format!("http://{}/v1/orders", chain.addresses.gateway_http);
    let client = reqwest::Client::new();
    let latencies = Arc::new(std::sync::Mutex::new(Histogram::<u64>::new(3).expect("valid precision")));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let run_id = std::process::id() as u128 * 1_000_000_000 + started.elapsed().as_nanos();

    let mut workers = JoinSet::new();
    for _ in 0..scenario.concurrency {
        let (client, url, latencies, tally, next) = (client.clone(), url.clone(), latencies.clone(), tally.clone(), next.clone());
        let (total, timeout_ms, name) = (scenario.requests, scenario.timeout_ms, scenario.name);
        workers.spawn(async move {
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if index >= total || started.elapsed() > TIME_LIMIT {
                    break;
                }
                let mut request = client
                    .post(&url)
                    .bearer_auth("demo-key-1")
                    .header("idempotency-key", format!("{name}-{run_id}-{index}"))
                    .json(&serde_json::json!({
                        "customer_id": "c-1",
                        "items": [{"sku": "sku-1", "quantity": 2}],
                        "amount_minor": 1299,
                        "currency": "EUR",
                    }));
                if let Some(ms) = timeout_ms {
                    request = request.header(gateway::TIMEOUT_HEADER, ms);
                }
                let sent = Instant::now();
                let response = request.send().await;
                let micros = sent.elapsed().as_micros() as u64;
                latencies.lock().expect("histogram lock").record(micros.max(1)).expect("in range");
                let mut tally = tally.lock().await;
                match response {
                    Ok(response) => {
                        *tally.outcomes.entry(response.status().as_u16()).or_default() += 1;
                        if tally.sample.is_none() {
                            let header = |name: &str| {
                                response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
                            };
                            tally.sample = Some((header(deadline::LEDGER_HEADER), header("server-timing")));
                        }
                    }
                    Err(_) => tally.transport_errors += 1,
                }
                let done = index + 1;
                if done % (total / 10).max(1) == 0 || done == total {
                    eprintln!("  [{name}] {done:>5}/{total} sent, {:.1} s", started.elapsed().as_secs_f64());
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}

    let elapsed = started.elapsed();
    let tally = std::mem::take(&mut *tally.lock().await);
    let histogram = latencies.lock().expect("histogram lock").clone();
    let completed = tally.outcomes.values().sum::<usize>() + tally.transport_errors;
    let bank = chain.bank().stats();
    let (sample_ledger, sample_server_timing) = tally.sample.unwrap_or_default();
    Report {
        scenario: scenario.name,
        about: scenario.about,
        requests: completed,
        concurrency: scenario.concurrency,
        elapsed_ms: elapsed.as_secs_f64() * 1e3,
        outcomes: tally.outcomes,
        transport_errors: tally.transport_errors,
        latency_ms: Percentiles {
            min: histogram.min() as f64 / 1e3,
            p50: histogram.value_at_quantile(0.50) as f64 / 1e3,
            p99: histogram.value_at_quantile(0.99) as f64 / 1e3,
            max: histogram.max() as f64 / 1e3,
        },
        bank,
        bank_calls_per_request: bank.calls as f64 / completed.max(1) as f64,
        hops: chain.hop_stats(),
        sample_ledger,
        sample_server_timing,
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "\nScenario {}: {}", self.scenario, self.about)?;
        writeln!(f, "  requests     {} in {:.2} s ({} concurrent)", self.requests, self.elapsed_ms / 1e3, self.concurrency)?;
        let outcomes: Vec<String> = self
            .outcomes
            .iter()
            .map(|(status, count)| {
                let reason = reqwest::StatusCode::from_u16(*status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
                format!("{status} {reason}: {count}")
            })
            .chain((self.transport_errors > 0).then(|| format!("no answer: {}", self.transport_errors)))
            .collect();
        writeln!(f, "  outcomes     {}", outcomes.join(", "))?;
        let l = self.latency_ms;
        writeln!(f, "  latency      min {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms", l.min, l.p50, l.p99, l.max)?;
        let b = self.bank;
        writeln!(
            f,
            "  bank         {} calls ({:.2} per request), {} charges, {} hung, {} completed after their deadline",
            b.calls, self.bank_calls_per_request, b.charges, b.hung, b.late_completions
        )?;
        writeln!(f, "  deadlines    requests / expired at the hop / finished late / abandoned / failed fast")?;
        let h = self.hops;
        for (hop, s) in [
            ("gateway", h.gateway_http),
            ("orders", h.orders),
            ("payment", h.payment),
            ("bank-mock", h.bank),
        ] {
            writeln!(f, "    {hop:<10} {} / {} / {} / {} / {}", s.requests, s.expired, s.finished_late, s.abandoned, s.failed_fast)?;
        }
        if let Some(text) = &self.sample_ledger {
            writeln!(f, "  ledger of the first answer (ms)")?;
            writeln!(f, "    {:<10} {:>9} {:>8} {:>9} {:>10} {:>8}", "hop", "received", "spent", "reserved", "forwarded", "left")?;
            match ledger::parse(text) {
                Ok(entries) => {
                    for e in entries {
                        let ms = |d: Duration| d.as_secs_f64() * 1e3;
                        writeln!(
                            f,
                            "    {:<10} {:>9.1} {:>8.1} {:>9.1} {:>10.1} {:>8.1}",
                            e.hop, ms(e.received), ms(e.spent), ms(e.reserved), ms(e.forwarded), ms(e.left)
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
