//! Comparison 2, deadline precision: with every bank call hanging, when does a client get its
//! error, measured from its own deadline, and does any hop go on working after that deadline?
//!
//! The chain is meant to answer a little before the client's deadline (each hop keeps a reserve
//! for its own reply) and to stop all work below at once. Each face runs on a fresh chain, with
//! breakers off so that every request travels down to the hanging bank instead of being refused
//! by an opened breaker.

use serde::Serialize;
use stack::chain::{GATEWAY_GRPC, GATEWAY_HTTP};

use crate::{
    BenchError,
    chains::{self, ChainStorage, Face, HopWork},
    clients::{CLIENT_DEADLINE, GrpcOrders, HttpOrders},
    load::{self, DROPPED, LoadPlan, Measurement, UNFINISHED},
    profile::Profile,
};

/// Answer time minus the deadline, in ms: negative when the answer came before it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Offsets {
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FacePrecision {
    pub face: Face,
    /// From the moment each request was sent (when its deadline started).
    pub offset_ms: Option<Offsets>,
    /// Requests the chain answered (its own error), …
    pub answered_by_chain: usize,
    /// … and those whose client stopped waiting at its deadline first.
    pub client_gave_up: usize,
    /// Each hop's counters: `finished_late` is work completed after its deadline.
    pub hops: Vec<HopWork>,
    /// Bank calls that hung (each one reached the bank), and charges completed late.
    pub bank_hung: u64,
    pub bank_late_completions: u64,
    pub measurement: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeadlinePrecision {
    pub deadline_ms: f64,
    pub faces: Vec<FacePrecision>,
}

pub async fn measure(profile: &Profile) -> Result<DeadlinePrecision, BenchError> {
    let settings = &profile.precision;
    let mut faces = Vec::new();
    for face in [Face::Grpc, Face::Http] {
        let running = chains::start(&ChainStorage::Sqlite, |chain| {
            stack::scenario::without_breakers(chain);
            chain.bank.faults.hang = true;
        })
        .await?;
        let plan = LoadPlan::count(
            format!("deadline precision, {}", face.name()),
            settings.requests,
            settings.per_second,
            profile.bounds,
        );
        let measurement = match face {
            Face::Grpc => {
                let orders = GrpcOrders::new(
                    running.chain.address(&GATEWAY_GRPC),
                    "precision",
                    Some(settings.deadline),
                )?;
                load::run(&plan, move |index| orders.create(index)).await
            }
            Face::Http => {
                let orders = HttpOrders::new(
                    running.chain.address(&GATEWAY_HTTP),
                    "precision",
                    Some(settings.deadline),
                );
                load::run(&plan, move |index| orders.create(index)).await
            }
        };
        // Hops below may still be unwinding when the client has its answer.
        tokio::time::sleep(settings.settle).await;
        let deadline_ms = settings.deadline.as_secs_f64() * 1e3;
        let unanswered = [CLIENT_DEADLINE, DROPPED, UNFINISHED]
            .iter()
            .map(|class| measurement.count(class))
            .sum::<usize>();
        let bank = running.chain.bank().stats();
        faces.push(FacePrecision {
            face,
            offset_ms: measurement.service_ms.map(|service| Offsets {
                min: service.min - deadline_ms,
                p50: service.p50 - deadline_ms,
                p99: service.p99 - deadline_ms,
                max: service.max - deadline_ms,
            }),
            answered_by_chain: measurement.due - unanswered,
            client_gave_up: measurement.count(CLIENT_DEADLINE),
            hops: chains::hops(&running.chain.hop_stats(), face),
            bank_hung: bank.hung,
            bank_late_completions: bank.late_completions,
            measurement,
        });
        running.stop().await?;
    }
    Ok(DeadlinePrecision {
        deadline_ms: settings.deadline.as_secs_f64() * 1e3,
        faces,
    })
}
