//! How big each comparison is: the full profile for the numbers in BENCHMARKS.md, and a smoke
//! profile that makes every comparison with tiny counts, so that CI runs the whole harness in
//! seconds and it cannot rot.

use std::time::Duration;

use serde::Serialize;

use crate::load::Bounds;

/// Every size and rate of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub name: &'static str,
    pub bounds: Bounds,
    pub overhead: OverheadProfile,
    pub precision: PrecisionProfile,
    pub amplification: AmplificationProfile,
    pub fail_fast: FailFastProfile,
    pub ramp: RampProfile,
    pub overload: OverloadProfile,
    pub memory: MemoryProfile,
    pub idempotency: IdempotencyProfile,
    pub tracing: TracingProfile,
    pub statements: StatementsProfile,
}

/// Comparison 8: rounds of creates whose statements are counted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatementsProfile {
    /// Requests of each round.
    pub requests: usize,
    /// Clients of the round with many at once.
    pub clients: usize,
    /// A round stops sending after this long.
    pub time_limit: Duration,
}

/// Comparison 7: rounds of tracing off and on, one request in flight.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TracingProfile {
    pub rounds: usize,
    pub requests_per_round: usize,
    /// A round stops sending after this long.
    pub round_time: Duration,
}

/// 1. Overhead: each chain's ceiling, the highest rate it sustains, and latency at one rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverheadProfile {
    /// Clients of the closed-loop probe that finds a chain's ceiling.
    pub probe_clients: usize,
    pub probe_requests: usize,
    pub probe_time: Duration,
    /// Rates tried at most, from the ceiling down, each 10 % of the ceiling below the last.
    pub steps: usize,
    pub step_time: Duration,
    /// A rate is sustained when its p99 (from the due time) stays within this, …
    pub sustained_p99: Duration,
    /// … at least this share of its requests succeed, and none is dropped.
    pub sustained_success_rate: f64,
    /// The rate at which every chain's latency is compared.
    pub moderate_per_second: f64,
    pub moderate_time: Duration,
}

/// 2. Deadline precision with a hanging bank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrecisionProfile {
    /// The clients' deadline.
    pub deadline: Duration,
    pub requests: usize,
    pub per_second: f64,
    /// How long after the last answer the hops are given to finish unwinding before they are read.
    pub settle: Duration,
}

/// 3. Amplification and waste, budgeted against naive.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AmplificationProfile {
    /// The faults and loads compared, each run for `duration` on each chain.
    pub loads: Vec<AmplificationLoad>,
    pub duration: Duration,
    /// The clients' deadline: they stop waiting then, whatever the chain does.
    pub client_deadline: Duration,
    /// The bank's latency (mean and standard deviation, ms) before it fails or answers.
    pub bank_latency_ms: (f64, f64),
    /// How long after the last client left the bank is watched for work nobody will read.
    pub settle: Duration,
}

/// One fault and load of comparison 3.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct AmplificationLoad {
    /// Share of bank calls answered UNAVAILABLE.
    pub bank_failure_rate: f64,
    pub per_second: f64,
}

/// 4. Fail-fast: answers of an open breaker and of a full bulkhead.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailFastProfile {
    pub requests: usize,
    pub per_second: f64,
    /// The bank's latency while the bulkhead fills.
    pub slow_bank: Duration,
}

/// 9. Guards that learn: the bank's latency ramping under steady load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RampProfile {
    /// The bank's mean latency at the start and at the end of the run (ms).
    pub from_ms: f64,
    pub to_ms: f64,
    pub per_second: f64,
    pub duration: Duration,
    /// The clients' deadline.
    pub deadline: Duration,
}

/// 10. The edge under overload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverloadProfile {
    pub bank_latency_ms: f64,
    /// The closed-loop probe of the chain's capacity.
    pub probe_clients: usize,
    pub probe_time: Duration,
    /// Offered load, as a multiple of that capacity.
    pub overload: f64,
    pub duration: Duration,
    pub deadline: Duration,
}

/// 5. Memory with a hanging bank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryProfile {
    pub clients: usize,
    /// How fast the clients arrive (all of them within `clients / per_second`).
    pub per_second: f64,
    /// The clients' deadline.
    pub deadline: Duration,
}

/// 6. Idempotency: first executions, replays, throughput.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdempotencyProfile {
    pub requests: usize,
    pub per_second: f64,
    /// Closed-loop clients for throughput, and their requests.
    pub throughput_clients: usize,
    pub throughput_requests: usize,
    pub throughput_time_limit: Duration,
}

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

impl Profile {
    /// The numbers of BENCHMARKS.md: a few minutes on two cores.
    pub fn full() -> Self {
        Self {
            name: "full",
            bounds: Bounds {
                max_in_flight: 2_000,
                drain: ms(10_000),
            },
            overhead: OverheadProfile {
                probe_clients: 32,
                probe_requests: 200_000,
                probe_time: ms(3_000),
                steps: 8,
                step_time: ms(3_000),
                sustained_p99: ms(100),
                sustained_success_rate: 0.99,
                moderate_per_second: 200.0,
                moderate_time: ms(10_000),
            },
            precision: PrecisionProfile {
                deadline: ms(500),
                requests: 200,
                per_second: 50.0,
                settle: ms(1_000),
            },
            amplification: AmplificationProfile {
                // A minute-long outage at a moderate and a high rate, and partial failure.
                loads: vec![
                    AmplificationLoad {
                        bank_failure_rate: 1.0,
                        per_second: 40.0,
                    },
                    AmplificationLoad {
                        bank_failure_rate: 1.0,
                        per_second: 200.0,
                    },
                    AmplificationLoad {
                        bank_failure_rate: 0.3,
                        per_second: 40.0,
                    },
                ],
                duration: ms(60_000),
                client_deadline: ms(1_000),
                bank_latency_ms: (60.0, 10.0),
                settle: ms(2_000),
            },
            fail_fast: FailFastProfile {
                requests: 200,
                per_second: 100.0,
                slow_bank: ms(1_000),
            },
            ramp: RampProfile {
                from_ms: 20.0,
                to_ms: 600.0,
                per_second: 120.0,
                duration: ms(20_000),
                deadline: ms(500),
            },
            overload: OverloadProfile {
                bank_latency_ms: 20.0,
                probe_clients: 64,
                probe_time: ms(3_000),
                overload: 2.0,
                duration: ms(10_000),
                deadline: ms(500),
            },
            memory: MemoryProfile {
                clients: 1_000,
                per_second: 2_000.0,
                deadline: ms(2_000),
            },
            idempotency: IdempotencyProfile {
                requests: 500,
                per_second: 100.0,
                throughput_clients: 16,
                throughput_requests: 3_000,
                throughput_time_limit: ms(30_000),
            },
            tracing: TracingProfile {
                rounds: 4,
                requests_per_round: 1_000,
                round_time: ms(15_000),
            },
            statements: StatementsProfile {
                requests: 500,
                clients: 16,
                time_limit: ms(30_000),
            },
        }
    }

    /// Every comparison with tiny counts: seconds, for CI.
    pub fn smoke() -> Self {
        Self {
            name: "smoke",
            bounds: Bounds {
                max_in_flight: 500,
                drain: ms(5_000),
            },
            overhead: OverheadProfile {
                probe_clients: 4,
                probe_requests: 2_000,
                probe_time: ms(300),
                steps: 2,
                step_time: ms(300),
                sustained_p99: ms(100),
                sustained_success_rate: 0.99,
                moderate_per_second: 50.0,
                moderate_time: ms(400),
            },
            precision: PrecisionProfile {
                deadline: ms(150),
                requests: 6,
                per_second: 50.0,
                settle: ms(200),
            },
            amplification: AmplificationProfile {
                loads: vec![
                    AmplificationLoad {
                        bank_failure_rate: 1.0,
                        per_second: 30.0,
                    },
                    AmplificationLoad {
                        bank_failure_rate: 0.3,
                        per_second: 30.0,
                    },
                ],
                duration: ms(200),
                client_deadline: ms(300),
                bank_latency_ms: (5.0, 1.0),
                settle: ms(300),
            },
            fail_fast: FailFastProfile {
                requests: 40,
                per_second: 200.0,
                slow_bank: ms(300),
            },
            ramp: RampProfile {
                from_ms: 5.0,
                to_ms: 150.0,
                per_second: 50.0,
                duration: ms(600),
                deadline: ms(150),
            },
            overload: OverloadProfile {
                bank_latency_ms: 5.0,
                probe_clients: 4,
                probe_time: ms(300),
                overload: 2.0,
                duration: ms(400),
                deadline: ms(300),
            },
            memory: MemoryProfile {
                clients: 50,
                per_second: 500.0,
                deadline: ms(200),
            },
            idempotency: IdempotencyProfile {
                requests: 10,
                per_second: 50.0,
                throughput_clients: 4,
                throughput_requests: 20,
                throughput_time_limit: ms(5_000),
            },
            tracing: TracingProfile {
                rounds: 2,
                requests_per_round: 20,
                round_time: ms(3_000),
            },
            statements: StatementsProfile {
                requests: 20,
                clients: 4,
                time_limit: ms(5_000),
            },
        }
    }
}
