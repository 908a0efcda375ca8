//! Comparison 9, guards that learn: the bank's latency ramps up under steady load while clients
//! keep their deadlines short, and the chain meets it with fixed guards or with guards that adapt.
//!
//! - Fail fast: fixed minimums (`min_forward_ms` only) against failing fast on each dependency's
//!   observed latency as well.
//! - Concurrency toward the bank: no limit, the fixed bulkhead, the adaptive limit.
//!
//! Each variant is a fresh chain under the same open-loop load and the same ramp; the breakers are
//! off in all of them, so that only the guard compared decides which calls are made.

use std::{sync::Arc, time::Duration};

use bank_mock::{BankState, Latency};
use serde::Serialize;
use stack::{
    ChainSettings,
    chain::{BANK_GRPC, GATEWAY_GRPC},
};
use tokio_util::sync::CancellationToken;

use crate::{
    BenchError,
    chains::{self, ChainStorage},
    clients::{BULKHEAD_FULL, GrpcOrders},
    load::{self, Latencies, LoadPlan, Measurement},
    profile::Profile,
};

/// One variant's run through the ramp.
#[derive(Debug, Clone, Serialize)]
pub struct RampRun {
    pub variant: &'static str,
    pub setup: String,
    pub successes_per_second: f64,
    pub success_rate: f64,
    /// Every answer, from its due time.
    pub latency_ms: Option<Latencies>,
    pub bank_calls: u64,
    /// Bank calls whose caller had given up before the bank answered: work nobody read.
    pub bank_calls_past_deadline: u64,
    /// Creates answered DEADLINE_EXCEEDED by a hop that did not call on (failed fast).
    pub failed_fast: u64,
    pub bulkhead_full: usize,
    pub measurement: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct AdaptiveGuards {
    pub fail_fast: Vec<RampRun>,
    pub concurrency: Vec<RampRun>,
}

/// A variant: its name, what it sets, and how.
struct Variant {
    name: &'static str,
    setup: String,
    change: Box<dyn FnOnce(&mut ChainSettings)>,
}

fn fail_fast_on_estimates(settings: &mut ChainSettings, on: bool) {
    for estimate in [
        &mut settings.gateway.orders.latency_estimate,
        &mut settings.orders.payment.latency_estimate,
        &mut settings.payment.bank.latency_estimate,
    ] {
        estimate.fail_fast = on;
    }
}

pub async fn measure(profile: &Profile) -> Result<AdaptiveGuards, BenchError> {
    let defaults = ChainSettings::default();
    let fixed = defaults.payment.bank.max_concurrent;
    let minimums = format!(
        "min_forward_ms {} / {} / {} at gateway / orders / payment",
        defaults.gateway.orders.deadline.min_forward_ms,
        defaults.orders.payment.deadline.min_forward_ms,
        defaults.payment.bank.deadline.min_forward_ms
    );
    let estimate = defaults.payment.bank.latency_estimate;
    let fail_fast = [
        Variant {
            name: "fixed minimums",
            setup: minimums.clone(),
            change: Box::new(|s| fail_fast_on_estimates(s, false)),
        },
        Variant {
            name: "observed latency",
            setup: format!(
                "{minimums}, and no call below the p{:.0} of the dependency's last {} ms of answers",
                estimate.quantile * 100.0,
                estimate.window_ms
            ),
            change: Box::new(|s| fail_fast_on_estimates(s, true)),
        },
    ];
    let adaptive_ceiling = 100;
    let concurrency = [
        Variant {
            name: "no limit",
            setup: "bank calls in flight unbounded".into(),
            change: Box::new(|s| {
                fail_fast_on_estimates(s, false);
                s.payment.bank.max_concurrent = u32::MAX / 2;
            }),
        },
        Variant {
            name: "fixed bulkhead",
            setup: format!("{fixed} bank calls in flight at most"),
            change: Box::new(|s| fail_fast_on_estimates(s, false)),
        },
        Variant {
            name: "adaptive limit",
            setup: format!(
                "Vegas, between {} and {adaptive_ceiling} bank calls in flight",
                defaults.payment.bank.adaptive_limit.min_limit
            ),
            change: Box::new(move |s| {
                fail_fast_on_estimates(s, false);
                s.payment.bank.max_concurrent = adaptive_ceiling;
                s.payment.bank.adaptive_limit.enabled = true;
            }),
        },
    ];
    let mut runs = AdaptiveGuards {
        fail_fast: Vec::new(),
        concurrency: Vec::new(),
    };
    for variant in fail_fast {
        runs.fail_fast.push(ramp(profile, variant).await?);
    }
    for variant in concurrency {
        runs.concurrency.push(ramp(profile, variant).await?);
    }
    Ok(runs)
}

/// Runs the profile's load through the bank's latency ramp on a fresh chain set up by `variant`.
async fn ramp(profile: &Profile, variant: Variant) -> Result<RampRun, BenchError> {
    let p = &profile.ramp;
    let running = chains::start(&ChainStorage::Sqlite, |chain| {
        stack::scenario::without_breakers(chain);
        chain.bank.faults.latency_ms = Latency {
            mean: p.from_ms,
            stddev: p.from_ms / 10.0,
        };
        (variant.change)(chain);
    })
    .await?;
    let orders = GrpcOrders::new(
        running.chain.address(&GATEWAY_GRPC),
        variant.name,
        Some(p.deadline),
    )?;
    let plan = LoadPlan::rate(
        format!("ramp, {}", variant.name),
        p.per_second,
        p.duration,
        profile.bounds,
    );
    let stop = CancellationToken::new();
    let ramping = tokio::spawn(raise_latency(
        running.chain.bank_state(),
        p.from_ms,
        p.to_ms,
        p.duration,
        stop.clone(),
    ));
    let measurement = load::run(&plan, move |index| orders.create(index)).await;
    stop.cancel();
    let _ = ramping.await;
    let bank = running.chain.hop_stats()[&BANK_GRPC];
    let failed_fast = running
        .chain
        .hop_stats()
        .iter()
        .map(|(_, hop)| hop.failed_fast)
        .sum();
    let run = RampRun {
        variant: variant.name,
        setup: variant.setup,
        successes_per_second: measurement.successes_per_second,
        success_rate: measurement.success_rate,
        latency_ms: measurement.latency_ms,
        bank_calls: running.chain.bank().stats().calls,
        bank_calls_past_deadline: bank.expired + bank.abandoned,
        failed_fast,
        bulkhead_full: measurement.count(BULKHEAD_FULL),
        measurement,
    };
    running.stop().await?;
    Ok(run)
}

/// Moves the bank's mean latency from `from_ms` to `to_ms` in even steps over `over` (a tenth of
/// the mean as its spread), until `stop`.
async fn raise_latency(
    bank: Arc<BankState>,
    from_ms: f64,
    to_ms: f64,
    over: Duration,
    stop: CancellationToken,
) {
    const STEPS: u32 = 40;
    for step in 1..=STEPS {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(over / STEPS) => {}
        }
        let mean = from_ms + (to_ms - from_ms) * f64::from(step) / f64::from(STEPS);
        bank.update_faults(|faults| {
            faults.latency_ms = Latency {
                mean,
                stddev: mean / 10.0,
            }
        });
    }
}
