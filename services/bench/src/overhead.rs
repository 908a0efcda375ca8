//! Comparison 1, overhead: the chain with every layer against the same four hops in bare tonic.
//!
//! Why five chains? The bare chain has no layers and no storage, so "every layer ÷ bare" is
//! the whole price of the design on this path. The chain with its guards idle (breakers and
//! retries off, bulkhead and quota limits out of reach, the same services and storage otherwise)
//! splits that price: what the guards' decisions cost, and what the rest costs (deadline and
//! ledger layers, intake limits, idempotency keys and orders in SQLite). The bare chain with
//! minimal writes (one row per request at orders and at payment, on the same SQLite) is the floor
//! of any durable chain: "every layer ÷ minimal writes" is the price of the reliability
//! bookkeeping alone. The chain with plain-text hops differs from every layer only in mutual TLS
//! between the hops (the bare chains are plain text too): the price of the hops' identities.
//! The chain with adaptive guards turns on the guards that are off by default (the adaptive limit
//! toward the bank, the gateway's queue): what they would cost, or take, where nothing is slow.
//!
//! For each chain: a closed-loop probe finds its ceiling, then open-loop rates from the ceiling
//! down, 10 % of it at a time, find the highest rate it sustains; last, every chain gets the same
//! moderate rate, for latency side by side. All over the gateway's gRPC face, with an instant bank.

use serde::Serialize;
use stack::ChainSettings;
use stack::chain::GATEWAY_GRPC;
use tempfile::TempDir;

use crate::{
    BenchError,
    bare::BareChain,
    chains::{self, ChainStorage},
    clients::GrpcOrders,
    load::{self, DROPPED, LoadPlan, Measurement},
    machine,
    profile::{OverheadProfile, Profile},
};

/// The chain as configured.
pub const EVERY_LAYER: &str = "every layer";
/// The chain with its guards out of the way.
pub const GUARDS_IDLE: &str = "guards idle";
/// The chain as configured, with plain-text gRPC between its hops instead of mutual TLS.
pub const PLAIN_TEXT: &str = "every layer, plain text";
/// The chain as configured, with the adaptive limit toward the bank and the gateway's queue on.
pub const ADAPTIVE: &str = "every layer, adaptive guards";
/// The label of the baseline.
pub const BARE: &str = "bare tonic";
/// The label of the floor of a durable chain.
pub const MINIMAL_WRITES: &str = "minimal writes";

/// One chain measured.
#[derive(Debug, Clone, Serialize)]
pub struct ChainOverhead {
    pub chain: &'static str,
    pub about: &'static str,
    /// Successes per second of the closed-loop probe.
    pub ceiling_per_second: f64,
    /// CPU time of the whole process (the chain and the load generator) per success during the
    /// closed-loop probe, in µs: the load generator's share is the same for every chain, so the
    /// differences between chains are the chains' own.
    pub cpu_us_per_request: Option<f64>,
    /// The highest rate tried that the chain sustained (none if no rate tried was).
    pub max_sustained_per_second: Option<f64>,
    pub steps: Vec<Step>,
    /// At the moderate rate.
    pub moderate: Measurement,
}

/// One rate tried.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    pub offered_per_second: f64,
    pub successes_per_second: f64,
    pub success_rate: f64,
    pub dropped: usize,
    pub p99_ms: Option<f64>,
    pub sustained: bool,
}

/// A layered chain against a baseline: above 1, the layered chain's number is larger.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ratio {
    pub chain: &'static str,
    /// [`BARE`], [`MINIMAL_WRITES`], [`PLAIN_TEXT`] or [`EVERY_LAYER`].
    pub baseline: &'static str,
    pub max_sustained_throughput: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Overhead {
    /// When a rate counts as sustained.
    pub sustained_when: String,
    pub moderate_per_second: f64,
    pub chains: Vec<ChainOverhead>,
    /// Each layered chain divided by the bare one, then by the one with minimal writes. Every
    /// request here is untraced (no spans are made until comparison 7 switches tracing on).
    pub ratios: Vec<Ratio>,
}

/// A chain under test: the real one with some settings, or the bare one, with or without writes.
enum Subject {
    Layered {
        label: &'static str,
        about: &'static str,
        change: fn(&mut ChainSettings),
    },
    Bare,
    MinimalWrites,
}

const SUBJECTS: [Subject; 6] = [
    Subject::Layered {
        label: EVERY_LAYER,
        about: "the chain as configured: deadline, retries under the budget, breakers, bulkheads, rate limit, intake limits; orders and keys in SQLite",
        change: chains::with_instant_bank,
    },
    Subject::Layered {
        label: GUARDS_IDLE,
        about: "the same services and storage, with breakers and retries off and bulkhead and quota limits out of reach",
        change: |settings| {
            chains::with_instant_bank(settings);
            stack::scenario::without_guards(settings);
        },
    },
    Subject::Layered {
        label: PLAIN_TEXT,
        about: "the chain as configured, with its hops talking plain-text gRPC instead of mutual TLS: beside every layer, the price of the hops' identities",
        change: |settings| {
            chains::with_instant_bank(settings);
            settings.plaintext = true;
        },
    },
    Subject::Layered {
        label: ADAPTIVE,
        about: "the chain as configured, with payment's limit toward the bank adapting to its latency and the gateway admitting by queueing time",
        change: |settings| {
            chains::with_instant_bank(settings);
            settings.payment.bank.adaptive_limit.enabled = true;
            settings.gateway.queue.enabled = true;
        },
    },
    Subject::Bare,
    Subject::MinimalWrites,
];

pub async fn measure(profile: &Profile) -> Result<Overhead, BenchError> {
    let settings = &profile.overhead;
    let mut chains = Vec::new();
    for subject in SUBJECTS {
        chains.push(match subject {
            Subject::Layered { label, about, change } => {
                let running = chains::start(&ChainStorage::Sqlite, change).await?;
                let orders = GrpcOrders::new(running.chain.address(&GATEWAY_GRPC), label, None)?;
                let measured = measure_chain(profile, label, about, &orders).await;
                running.stop().await?;
                measured
            }
            Subject::Bare => {
                let bare = BareChain::start().await?;
                let orders = GrpcOrders::new(bare.gateway, BARE, None)?;
                let measured = measure_chain(profile, BARE, "the same four hops and calls in plain tonic: no layers, no storage", &orders).await;
                bare.stop().await?;
                measured
            }
            Subject::MinimalWrites => {
                let data = TempDir::new().map_err(BenchError::Io)?;
                let floor = BareChain::with_minimal_writes(data.path()).await?;
                let orders = GrpcOrders::new(floor.gateway, MINIMAL_WRITES, None)?;
                let about = "the bare hops, with orders and payment each writing one row per request in a transaction of its own, on SQLite as the chain's: the price of writing at all";
                let measured = measure_chain(profile, MINIMAL_WRITES, about, &orders).await;
                floor.stop().await?;
                measured
            }
        });
    }
    let divide = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let p = |chain: &ChainOverhead, pick: fn(&load::Latencies) -> f64| {
        chain.moderate.latency_ms.as_ref().map(pick)
    };
    let layered = || {
        chains
            .iter()
            .filter(|chain| ![BARE, MINIMAL_WRITES].contains(&chain.chain))
    };
    let measured = |label: &str| {
        chains
            .iter()
            .find(|chain| chain.chain == label)
            .expect("every subject is measured")
    };
    let ratio = |chain: &ChainOverhead, base: &ChainOverhead| Ratio {
        chain: chain.chain,
        baseline: base.chain,
        max_sustained_throughput: divide(
            chain.max_sustained_per_second,
            base.max_sustained_per_second,
        ),
        p50: divide(p(chain, |l| l.p50), p(base, |l| l.p50)),
        p99: divide(p(chain, |l| l.p99), p(base, |l| l.p99)),
    };
    let mut ratios: Vec<Ratio> = [BARE, MINIMAL_WRITES]
        .into_iter()
        .flat_map(|baseline| layered().map(move |chain| ratio(chain, measured(baseline))))
        .collect();
    // Mutual TLS against plain text, and the adaptive guards against the fixed, everything else equal.
    ratios.push(ratio(measured(EVERY_LAYER), measured(PLAIN_TEXT)));
    ratios.push(ratio(measured(ADAPTIVE), measured(EVERY_LAYER)));
    Ok(Overhead {
        sustained_when: format!(
            "p99 from the due time within {} ms, at least {} % successes, none dropped",
            settings.sustained_p99.as_millis(),
            settings.sustained_success_rate * 100.0
        ),
        moderate_per_second: settings.moderate_per_second,
        chains,
        ratios,
    })
}

async fn measure_chain(
    profile: &Profile,
    label: &'static str,
    about: &'static str,
    orders: &GrpcOrders,
) -> ChainOverhead {
    let settings = &profile.overhead;
    let probe = LoadPlan::clients(
        format!("{label}: ceiling"),
        settings.probe_clients,
        settings.probe_requests,
        settings.probe_time,
        profile.bounds,
    );
    let cpu_before = machine::process_cpu_time();
    let probe = run(&probe, orders, "probe").await;
    let cpu = machine::process_cpu_time() - cpu_before;
    let cpu_us_per_request =
        (probe.successes > 0).then(|| cpu.as_secs_f64() * 1e6 / probe.successes as f64);
    let ceiling = probe.successes_per_second;
    let (steps, max_sustained) = find_sustained(profile, label, orders, ceiling).await;
    let moderate = LoadPlan::rate(
        format!("{label}: moderate"),
        settings.moderate_per_second,
        settings.moderate_time,
        profile.bounds,
    );
    let moderate = run(&moderate, orders, "moderate").await;
    ChainOverhead {
        chain: label,
        about,
        ceiling_per_second: ceiling,
        cpu_us_per_request,
        max_sustained_per_second: max_sustained,
        steps,
        moderate,
    }
}

/// Tries rates from `ceiling` down until one is sustained.
async fn find_sustained(
    profile: &Profile,
    label: &str,
    orders: &GrpcOrders,
    ceiling: f64,
) -> (Vec<Step>, Option<f64>) {
    let settings = &profile.overhead;
    let mut steps = Vec::new();
    for step in 0..settings.steps {
        let offered = ceiling * (1.0 - 0.1 * step as f64);
        if offered < 1.0 {
            break;
        }
        let plan = LoadPlan::rate(
            format!("{label}: {offered:.0}/s"),
            offered,
            settings.step_time,
            profile.bounds,
        );
        let measured = run(&plan, orders, &format!("step{step}")).await;
        let step = judge(settings, offered, &measured);
        steps.push(step);
        if step.sustained {
            return (steps, Some(offered));
        }
    }
    (steps, None)
}

fn judge(settings: &OverheadProfile, offered: f64, measured: &Measurement) -> Step {
    let p99_ms = measured.latency_ms.map(|latency| latency.p99);
    let dropped = measured.count(DROPPED);
    Step {
        offered_per_second: offered,
        successes_per_second: measured.successes_per_second,
        success_rate: measured.success_rate,
        dropped,
        p99_ms,
        sustained: dropped == 0
            && measured.success_rate >= settings.sustained_success_rate
            && p99_ms.is_some_and(|p99| p99 <= settings.sustained_p99.as_secs_f64() * 1e3),
    }
}

/// One run of `plan` against `orders`, with keys of its own.
async fn run(plan: &LoadPlan, orders: &GrpcOrders, keys: &str) -> Measurement {
    let orders = orders.keyed(keys);
    load::run(plan, move |index| orders.create(index)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Class, Latencies};
    use std::collections::BTreeMap;

    fn measured(success_rate: f64, dropped: usize, p99: f64) -> Measurement {
        let latency = Latencies {
            count: 100,
            min: 1.0,
            mean: 2.0,
            p50: 2.0,
            p90: 3.0,
            p99,
            p999: p99,
            max: p99,
        };
        let mut classes = BTreeMap::new();
        if dropped > 0 {
            classes.insert(
                DROPPED.to_owned(),
                Class {
                    success: false,
                    count: dropped,
                    latency_ms: None,
                },
            );
        }
        let bounds = Profile::smoke().bounds;
        Measurement {
            plan: LoadPlan::rate("test", 100.0, std::time::Duration::from_secs(1), bounds),
            due: 100,
            sent: 100 - dropped,
            successes: (success_rate * 100.0) as usize,
            success_rate,
            elapsed_s: 1.0,
            answers_per_second: 100.0,
            successes_per_second: success_rate * 100.0,
            latency_ms: Some(latency),
            service_ms: Some(latency),
            send_lag_ms: Some(latency),
            classes,
        }
    }

    #[test]
    fn a_rate_is_sustained_only_with_low_latency_few_failures_and_no_drops() {
        let settings = Profile::full().overhead;
        assert!(judge(&settings, 100.0, &measured(1.0, 0, 20.0)).sustained);
        assert!(
            !judge(&settings, 100.0, &measured(1.0, 0, 250.0)).sustained,
            "p99 too high"
        );
        assert!(
            !judge(&settings, 100.0, &measured(0.9, 0, 20.0)).sustained,
            "too many failures"
        );
        assert!(
            !judge(&settings, 100.0, &measured(0.995, 1, 20.0)).sustained,
            "a request dropped"
        );
    }
}
