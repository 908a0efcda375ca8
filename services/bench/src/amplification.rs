//! Comparison 3, amplification and waste: the budgeted chain against the naive one while the
//! bank fails every call for a minute, at a moderate and at a high rate, and while it fails 30 %
//! of them.
//!
//! The naive chain retries three times at every hop with fixed timeouts and no budget, so a
//! failing bank sees up to 27 calls per user request, and work goes on after the clients have
//! given up. The budgeted chain retries at the gateway only, within 10 % of requests plus a floor,
//! and its throttle stops retries once failures outnumber successes. Its breakers are off here,
//! so that what is measured is the retry policy alone (an open breaker would stop the bank calls
//! by itself). Clients use the HTTP face and give up at their deadline.

use bank_mock::Latency;
use resilience::retry::RetryStatsSnapshot;
use serde::Serialize;
use stack::chain::GATEWAY_HTTP;

use crate::{
    BenchError,
    chains::{self, ChainStorage, Face, HopWork},
    clients::{CLIENT_DEADLINE, HttpOrders},
    load::{self, LoadPlan, Measurement},
    profile::Profile,
};

#[derive(Debug, Clone, Serialize)]
pub struct AmplificationRun {
    /// Share of bank calls answered UNAVAILABLE.
    pub bank_failure_rate: f64,
    pub per_second: f64,
    pub chain: &'static str,
    /// Every call that reached the bank, until the chain had settled, per user request.
    pub bank_calls_per_request: f64,
    pub bank_calls: u64,
    pub success_rate: f64,
    /// From the due time, over every answer the client waited for.
    pub p99_ms: Option<f64>,
    /// Requests whose client stopped waiting at its deadline.
    pub clients_gave_up: usize,
    /// Bank calls made after the last client had its answer or had given up.
    pub bank_calls_after_clients_left: u64,
    /// Work that completed after its deadline, summed over the hops.
    pub finished_late: u64,
    pub hops: Vec<HopWork>,
    /// The gateway's retry counters (the naive chain's retries are in its hops, not here).
    pub gateway_retries: RetryStatsSnapshot,
    pub measurement: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct Amplification {
    pub client_deadline_ms: f64,
    pub bank_latency_ms: Latency,
    pub runs: Vec<AmplificationRun>,
}

pub async fn measure(profile: &Profile) -> Result<Amplification, BenchError> {
    let settings = &profile.amplification;
    let (mean, stddev) = settings.bank_latency_ms;
    let latency = Latency { mean, stddev };
    let mut runs = Vec::new();
    for load in &settings.loads {
        let failure_rate = load.bank_failure_rate;
        for (label, naive) in [("budgeted", false), ("naive", true)] {
            let running = chains::start(&ChainStorage::Sqlite, |chain| {
                stack::scenario::without_breakers(chain);
                chain.naive.enabled = naive;
                chain.bank.faults.error_rate = failure_rate;
                chain.bank.faults.latency_ms = latency;
            })
            .await?;
            let orders = HttpOrders::new(
                running.chain.address(&GATEWAY_HTTP),
                label,
                Some(settings.client_deadline),
            );
            let orders = if naive {
                orders.deadline_untold()
            } else {
                orders
            };
            let requests = (settings.duration.as_secs_f64() * load.per_second).round() as usize;
            let plan = LoadPlan::count(
                format!(
                    "{label} chain, bank failing {:.0} %, {}/s",
                    failure_rate * 100.0,
                    load.per_second
                ),
                requests,
                load.per_second,
                profile.bounds,
            );
            let measurement = load::run(&plan, move |index| orders.create(index)).await;
            let bank_calls_after_clients_left = running.bank_calls_during(settings.settle).await;
            let bank = running.chain.bank().stats();
            let hops = chains::hops(&running.chain.hop_stats(), Face::Http);
            runs.push(AmplificationRun {
                bank_failure_rate: failure_rate,
                per_second: load.per_second,
                chain: label,
                bank_calls_per_request: bank.calls as f64 / measurement.due.max(1) as f64,
                bank_calls: bank.calls,
                success_rate: measurement.success_rate,
                p99_ms: measurement.latency_ms.map(|latency| latency.p99),
                clients_gave_up: measurement.count(CLIENT_DEADLINE),
                bank_calls_after_clients_left,
                finished_late: hops.iter().map(|hop| hop.stats.finished_late).sum(),
                hops,
                gateway_retries: running.chain.retry_stats(),
                measurement,
            });
            running.stop().await?;
        }
    }
    Ok(Amplification {
        client_deadline_ms: settings.client_deadline.as_secs_f64() * 1e3,
        bank_latency_ms: latency,
        runs,
    })
}
