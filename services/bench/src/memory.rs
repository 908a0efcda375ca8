//! Comparison 5, memory under a hanging bank: the peak resident memory while many clients wait
//! at once.
//!
//! The one-process stack runs all four services, and this harness runs its load generator in
//! the same process, so the figure is the peak RSS (VmHWM) of the whole chain plus its clients,
//! not of one service. The peak is reset just before each run, so it is that run's own. The chain
//! runs twice: as configured, where bulkheads, intake limits and breakers refuse most of the
//! clients at once, and with those out of the way, so that every client's request is held in the
//! chain until its deadline.

use serde::Serialize;
use stack::ChainSettings;
use stack::chain::GATEWAY_HTTP;

use crate::{
    BenchError, Coverage, NotMeasured,
    chains::{self, ChainStorage},
    clients::HttpOrders,
    load::{self, LoadPlan, Measurement},
    machine,
    profile::Profile,
};

#[derive(Debug, Clone, Serialize)]
pub struct MemoryRun {
    pub chain: &'static str,
    pub about: &'static str,
    /// Whether the peak was reset before the run; if not, it may be an earlier one.
    pub peak_reset: bool,
    /// Just before the clients came.
    pub before: machine::Memory,
    /// When they had all been answered.
    pub after: machine::Memory,
    /// The run's peak above what was resident before it.
    pub peak_growth_kib: u64,
    /// Bank calls that hung: requests held all the way down.
    pub held_at_bank: u64,
    pub measurement: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryUnderHang {
    pub clients: usize,
    pub deadline_ms: f64,
    /// What the figures cover.
    pub scope: &'static str,
    pub runs: Coverage<Vec<MemoryRun>>,
}

const SCOPE: &str = "the whole process: gateway, orders, payment and bank-mock, and the load generator with its clients";

/// One way to configure the chain for the run.
struct Variant {
    label: &'static str,
    about: &'static str,
    change: Box<dyn FnOnce(&mut ChainSettings)>,
}

/// The chain, made to refuse none of `clients` requests.
fn room_for(clients: usize) -> impl FnOnce(&mut ChainSettings) {
    move |chain| {
        stack::scenario::without_guards(chain);
        let room = u32::try_from(clients).unwrap_or(u32::MAX).saturating_mul(2);
        chain.gateway.max_in_flight_creates = room;
        for intake in [
            &mut chain.gateway.deadline,
            &mut chain.orders.deadline,
            &mut chain.payment.deadline,
            &mut chain.bank.deadline,
        ] {
            intake.max_in_flight = intake.max_in_flight.max(room);
        }
    }
}

pub async fn measure(profile: &Profile) -> Result<MemoryUnderHang, BenchError> {
    let settings = &profile.memory;
    let section = |runs| MemoryUnderHang {
        clients: settings.clients,
        deadline_ms: settings.deadline.as_secs_f64() * 1e3,
        scope: SCOPE,
        runs,
    };
    if machine::Memory::now().is_none() {
        return Ok(section(Coverage::NotMeasured(NotMeasured {
            reason: "not measured: /proc/self/status cannot be read here".into(),
        })));
    }
    let variants = [
        Variant {
            label: "as configured",
            about: "every guard and intake limit as configured",
            change: Box::new(|_| {}),
        },
        Variant {
            label: "nothing refused",
            about: "guards out of the way and intake limits above the clients: no client is refused, each waits in the chain until its deadline",
            change: Box::new(room_for(settings.clients)),
        },
    ];
    let mut runs = Vec::new();
    for Variant {
        label,
        about,
        change,
    } in variants
    {
        let running = chains::start(&ChainStorage::Sqlite, |chain| {
            change(chain);
            chain.bank.faults.hang = true;
        })
        .await?;
        let orders = HttpOrders::new(
            running.chain.address(&GATEWAY_HTTP),
            "memory",
            Some(settings.deadline),
        );
        let plan = LoadPlan::count(
            format!("memory, {label}"),
            settings.clients,
            settings.per_second,
            profile.bounds,
        );
        let peak_reset = machine::Memory::reset_peak();
        let before = machine::Memory::now().ok_or(BenchError::MemoryUnreadable)?;
        let measurement = load::run(&plan, move |index| orders.create(index)).await;
        let after = machine::Memory::now().ok_or(BenchError::MemoryUnreadable)?;
        let held_at_bank = running.chain.bank().stats().hung;
        running.stop().await?;
        runs.push(MemoryRun {
            chain: label,
            about,
            peak_reset,
            before,
            after,
            peak_growth_kib: after.peak_rss_kib.saturating_sub(before.rss_kib),
            held_at_bank,
            measurement,
        });
    }
    Ok(section(Coverage::Measured(runs)))
}
