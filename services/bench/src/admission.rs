//! Comparison 10, the edge under overload: requests arrive at twice what the chain can serve,
//! and the gateway admits them by count only, or by queueing time (its queue, see
//! `resilience::queue`).
//!
//! The chain's capacity is measured first (closed loop, as in comparison 1, with the bank's
//! latency of this comparison); each variant then gets twice that, open loop, on a fresh chain.
//! A request is admitted when the gateway did not refuse or shed it; the question is whether
//! what it admits still meets its deadline. The guards below the edge (bulkheads, breakers,
//! quotas, retries) are out of the way, so that the edge's intake alone decides.

use bank_mock::Latency;
use serde::Serialize;
use stack::{ChainSettings, chain::GATEWAY_GRPC};

use crate::{
    BenchError,
    chains::{self, ChainStorage},
    clients::GrpcOrders,
    load::{self, Latencies, LoadPlan, Measurement},
    profile::Profile,
};

/// What one intake made of the overload.
#[derive(Debug, Clone, Serialize)]
pub struct OverloadRun {
    pub intake: &'static str,
    pub setup: String,
    pub successes_per_second: f64,
    /// Requests the gateway did not refuse or shed.
    pub admitted: usize,
    /// Of those, the share answered with success within the deadline.
    pub admitted_in_time: f64,
    /// Successes, from their due time.
    pub admitted_latency_ms: Option<Latencies>,
    pub refused: usize,
    pub measurement: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct EdgeOverload {
    /// Successes per second of the closed-loop probe.
    pub capacity_per_second: f64,
    pub offered_per_second: f64,
    pub runs: Vec<OverloadRun>,
}

/// The classes of a refusal at the gateway's intake or queue, over gRPC.
const REFUSED: &str = "ResourceExhausted";

fn with_bank(settings: &mut ChainSettings, latency_ms: f64) {
    chains::with_instant_bank(settings);
    stack::scenario::without_guards(settings);
    settings.bank.faults.latency_ms = Latency {
        mean: latency_ms,
        stddev: latency_ms / 10.0,
    };
}

pub async fn measure(profile: &Profile) -> Result<EdgeOverload, BenchError> {
    let p = &profile.overload;
    let running = chains::start(&ChainStorage::Sqlite, |s| with_bank(s, p.bank_latency_ms)).await?;
    let orders = GrpcOrders::new(
        running.chain.address(&GATEWAY_GRPC),
        "capacity",
        Some(p.deadline),
    )?;
    let probe = LoadPlan::clients(
        "overload: capacity",
        p.probe_clients,
        1_000_000,
        p.probe_time,
        profile.bounds,
    );
    let capacity = load::run(&probe, move |index| orders.create(index))
        .await
        .successes_per_second;
    running.stop().await?;

    let offered = capacity * p.overload;
    let queue = ChainSettings::default().gateway.queue;
    let variants: [(&'static str, String, bool); 2] = [
        (
            "count only",
            format!(
                "{} requests in progress at most, the rest refused",
                ChainSettings::default().gateway.deadline.max_in_flight
            ),
            false,
        ),
        (
            "queueing time",
            format!(
                "{} workers; a queue whose luckiest request of {} ms waited over {} ms sheds",
                queue.workers, queue.interval_ms, queue.target_ms
            ),
            true,
        ),
    ];
    let mut runs = Vec::new();
    for (intake, setup, queued) in variants {
        let running = chains::start(&ChainStorage::Sqlite, |s| {
            with_bank(s, p.bank_latency_ms);
            s.gateway.queue.enabled = queued;
        })
        .await?;
        let orders = GrpcOrders::new(
            running.chain.address(&GATEWAY_GRPC),
            intake,
            Some(p.deadline),
        )?;
        let plan = LoadPlan::rate(
            format!("overload, {intake}"),
            offered,
            p.duration,
            profile.bounds,
        );
        let measurement = load::run(&plan, move |index| orders.create(index)).await;
        running.stop().await?;
        let refused = measurement.count(REFUSED);
        let admitted = measurement.sent - refused;
        let in_time = measurement.successes;
        runs.push(OverloadRun {
            intake,
            setup,
            successes_per_second: measurement.successes_per_second,
            admitted,
            admitted_in_time: if admitted == 0 {
                0.0
            } else {
                in_time as f64 / admitted as f64
            },
            admitted_latency_ms: measurement.latency("OK"),
            refused,
            measurement,
        });
    }
    Ok(EdgeOverload {
        capacity_per_second: capacity,
        offered_per_second: offered,
        runs,
    })
}
