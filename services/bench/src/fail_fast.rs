//! Comparison 4, fail-fast: how long a client waits for the "no" of an open circuit breaker or
//! of a full bulkhead, beside the calls that went through to the bank.
//!
//! Both guards sit in payment's client toward the bank, and both answers travel back up through
//! orders and the gateway, so the time is end to end at the gateway's gRPC face (once the breaker
//! has refused a call, orders gives its answer itself until the wait it named ends). The gateway's
//! retries are off here: each answer is one pass through the chain, not a retry after a backoff.

use std::time::Duration;

use bank_mock::Latency;
use serde::Serialize;
use stack::ChainSettings;
use stack::chain::GATEWAY_GRPC;

use crate::{
    BenchError,
    chains::{self, ChainStorage},
    clients::{BULKHEAD_FULL, CIRCUIT_OPEN, GrpcOrders},
    load::{self, Latencies, LoadPlan, Measurement},
    profile::Profile,
};

/// What one guard's answers cost, beside the calls it let through.
#[derive(Debug, Clone, Serialize)]
pub struct GuardAnswers {
    pub guard: &'static str,
    pub setup: String,
    pub rejected: usize,
    pub rejected_latency_ms: Option<Latencies>,
    /// The calls that reached the bank, and what they got.
    pub passed_class: &'static str,
    pub passed: usize,
    pub passed_latency_ms: Option<Latencies>,
    pub measurement: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailFast {
    pub guards: Vec<GuardAnswers>,
}

/// One guard to fill or open, and how.
struct Case {
    guard: &'static str,
    rejected_class: &'static str,
    passed_class: &'static str,
    setup: String,
    change: Box<dyn FnOnce(&mut ChainSettings)>,
}

pub async fn measure(profile: &Profile) -> Result<FailFast, BenchError> {
    let settings = &profile.fail_fast;
    let slow_ms = settings.slow_bank.as_secs_f64() * 1e3;
    let defaults = ChainSettings::default().payment.bank;
    let cases = [
        Case {
            guard: "open circuit breaker, payment → bank",
            rejected_class: CIRCUIT_OPEN,
            passed_class: "Unavailable",
            setup: format!(
                "every bank call fails; the breaker opens once {} calls have failed and stays open for the run",
                defaults.breaker.min_calls
            ),
            change: Box::new(|chain| {
                chain.bank.faults.error_rate = 1.0;
                // Open for longer than any run takes, so every later call meets it open.
                chain.payment.bank.breaker.open_ms = Duration::from_secs(3_600).as_millis() as u64;
            }),
        },
        Case {
            guard: "full bulkhead, payment → bank",
            rejected_class: BULKHEAD_FULL,
            passed_class: "OK",
            setup: format!(
                "every bank call takes {slow_ms:.0} ms; {} may be in flight (breakers off)",
                defaults.max_concurrent
            ),
            change: Box::new(move |chain| {
                stack::scenario::without_breakers(chain);
                chain.bank.faults.latency_ms = Latency {
                    mean: slow_ms,
                    stddev: 0.0,
                };
            }),
        },
    ];
    let mut guards = Vec::new();
    for case in cases {
        let running = chains::start(&ChainStorage::Sqlite, |chain| {
            chain.gateway.retry.max_attempts = 1;
            (case.change)(chain);
        })
        .await?;
        let orders = GrpcOrders::new(running.chain.address(&GATEWAY_GRPC), "fail-fast", None)?;
        let plan = LoadPlan::count(
            case.guard,
            settings.requests,
            settings.per_second,
            profile.bounds,
        );
        let measurement = load::run(&plan, move |index| orders.create(index)).await;
        running.stop().await?;
        guards.push(GuardAnswers {
            guard: case.guard,
            setup: case.setup,
            rejected: measurement.count(case.rejected_class),
            rejected_latency_ms: measurement.latency(case.rejected_class),
            passed_class: case.passed_class,
            passed: measurement.count(case.passed_class),
            passed_latency_ms: measurement.latency(case.passed_class),
            measurement,
        });
    }
    Ok(FailFast { guards })
}
