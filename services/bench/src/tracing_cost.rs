//! Comparison 7, what tracing costs: the full chain at one request in flight, every span made and
//! exported over OTLP (sampled 100 %), against span making switched off, in alternating rounds
//! in this one process.
//!
//! Why alternate in one process? A tracing subscriber is installed once per process, and two
//! processes would differ in more than tracing (what else the machine runs meanwhile, above all).
//! [`telemetry::Telemetry::set_tracing`] turns span making off and on over the same chain, and the
//! rounds alternate so that drift on the machine falls on both sides. The spans go over loopback
//! to an OTLP receiver in this process, as they would to a collector. It runs last: once
//! installed, telemetry stays for the rest of the process.

use serde::Serialize;
use stack::chain::GATEWAY_HTTP;

use crate::{
    BenchError, Coverage, NotMeasured,
    chains::{self, ChainStorage},
    clients::HttpOrders,
    load::{self, Latencies, LoadPlan, Measurement},
    profile::Profile,
};

/// One side, over all its rounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Side {
    /// The median of the rounds' p50 and p99.
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Successes over the time of all rounds.
    pub per_second: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TracingCost {
    pub rounds: usize,
    pub requests_per_round: usize,
    pub traced: Side,
    pub untraced: Side,
    /// Traced ÷ untraced.
    pub p50_ratio: f64,
    pub throughput_ratio: f64,
    /// Spans the receiver got: evidence that the traced rounds exported.
    pub spans_received: usize,
}

pub async fn measure(profile: &Profile) -> Result<Coverage<TracingCost>, BenchError> {
    let settings = &profile.tracing;
    let receiver = otlp_receiver::OtlpReceiver::start().await;
    // As `stack up` installs it: each service's spans go to the provider of its own.
    let telemetry = telemetry::init_hosting(
        crate::SERVICE,
        &stack::SERVICES,
        &telemetry::TelemetrySettings {
            traces: Some(telemetry::Otlp::grpc(receiver.endpoint())),
            ..telemetry::TelemetrySettings::default()
        },
    )?;
    if !telemetry.exporting() {
        return Ok(Coverage::NotMeasured(NotMeasured {
            reason:
                "telemetry was already installed in this process, so tracing could not be switched"
                    .into(),
        }));
    }
    let running = chains::start(&ChainStorage::Sqlite, chains::with_instant_bank).await?;
    let orders = HttpOrders::new(running.chain.address(&GATEWAY_HTTP), "tracing", None);
    // A round that counts for neither side: connections, SQLite and caches warm up in it.
    let warm_up = LoadPlan::clients(
        "tracing: warm-up",
        1,
        settings.requests_per_round,
        settings.round_time,
        profile.bounds,
    );
    let warming = orders.keyed("tracing-warm-up");
    load::run(&warm_up, move |index| warming.create(index)).await;
    let (mut traced, mut untraced) = (Vec::new(), Vec::new());
    for round in 0..settings.rounds {
        // The order alternates too, so that neither side always follows the other.
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            telemetry.set_tracing(on);
            let label = format!(
                "tracing {}: round {}",
                if on { "on" } else { "off" },
                round + 1
            );
            let plan = LoadPlan::clients(
                label,
                1,
                settings.requests_per_round,
                settings.round_time,
                profile.bounds,
            );
            let orders = orders.keyed(&format!("tracing-{on}-{round}"));
            let measured = load::run(&plan, move |index| orders.create(index)).await;
            if on {
                // Exported before the next round starts, so that its export is not charged to an
                // untraced round.
                telemetry.flush().await;
                traced.push(measured);
            } else {
                untraced.push(measured);
            }
        }
    }
    let spans_received = receiver.span_count();
    telemetry.set_tracing(false);
    running.stop().await?;
    telemetry.shutdown().await;
    let (traced, untraced) = (side(&traced), side(&untraced));
    Ok(Coverage::Measured(TracingCost {
        rounds: settings.rounds,
        requests_per_round: settings.requests_per_round,
        traced,
        untraced,
        p50_ratio: traced.p50_ms / untraced.p50_ms,
        throughput_ratio: traced.per_second / untraced.per_second,
        spans_received,
    }))
}

fn side(rounds: &[Measurement]) -> Side {
    let median = |pick: fn(&Latencies) -> f64| {
        let mut values: Vec<f64> = rounds
            .iter()
            .filter_map(|round| round.latency_ms.as_ref().map(pick))
            .collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let successes: usize = rounds.iter().map(|round| round.successes).sum();
    let elapsed: f64 = rounds.iter().map(|round| round.elapsed_s).sum();
    Side {
        p50_ms: median(|l| l.p50),
        p99_ms: median(|l| l.p99),
        per_second: successes as f64 / elapsed,
    }
}
