//! The live view of a service's guards: how each stands now, for the operations port.
//!
//! A service lists what guards it ([`Guards`]): its faces' deadline counters and last ledgers,
//! its edge queue, its callers' quotas, and per dependency the breaker, the bulkhead, the latency estimate and, at
//! the edge, the retry policy. [`Guards::view`] copies their state into one document, which the
//! operations port serves as JSON and as a page (see the crate's README).

use std::{sync::Arc, time::SystemTime};

use deadline::{EstimateSnapshot, HopStats, HopStatsSnapshot, LatencyEstimate, RecentAnswer};
use resilience::{
    breaker::{Breaker, BreakerStats},
    bulkhead::{Bulkhead, BulkheadStats},
    queue::{Queue, QueueStats},
    retry::{RetryBalance, RetryPolicy, RetryStatsSnapshot},
};
use serde::Serialize;
use tokio::time::Instant;

/// The guards in front of one dependency.
#[derive(Debug, Clone)]
pub struct DependencyGuards {
    pub name: &'static str,
    pub breaker: Arc<Breaker>,
    pub bulkhead: Arc<Bulkhead>,
    pub latency_estimate: Arc<LatencyEstimate>,
    /// The retry policy of the calls, where the service retries them (the edge only).
    pub retry: Option<RetryPolicy>,
}

impl DependencyGuards {
    /// The same guards, with the calls retried under `retry`.
    pub fn retried_under(self, retry: RetryPolicy) -> Self {
        Self {
            retry: Some(retry),
            ..self
        }
    }
}

/// The quotas a service keeps its callers to (the edge's per-client rate limits).
pub trait CallerQuotas: std::fmt::Debug + Send + Sync {
    /// How each caller's quota stands now.
    fn view(&self) -> Vec<CallerQuotaView>;
}

/// Everything that guards one service.
#[derive(Debug, Clone)]
pub struct Guards {
    service: &'static str,
    faces: Vec<(&'static str, Arc<HopStats>)>,
    queue: Option<Arc<Queue>>,
    caller_quotas: Option<Arc<dyn CallerQuotas>>,
    dependencies: Vec<DependencyGuards>,
}

impl Guards {
    /// `service`'s guards, none listed yet.
    pub fn new(service: &'static str) -> Self {
        Self {
            service,
            faces: Vec::new(),
            queue: None,
            caller_quotas: None,
            dependencies: Vec::new(),
        }
    }

    /// A port the service answers on (`grpc`, `http`), with its deadline counters.
    pub fn face(mut self, name: &'static str, stats: Arc<HopStats>) -> Self {
        self.faces.push((name, stats));
        self
    }

    /// The queue in front of the service's work, if it has one.
    pub fn queue(mut self, queue: Option<Arc<Queue>>) -> Self {
        self.queue = queue;
        self
    }

    /// The quotas the service keeps its callers to.
    pub fn caller_quotas(mut self, quotas: Arc<dyn CallerQuotas>) -> Self {
        self.caller_quotas = Some(quotas);
        self
    }

    /// The guards of one of the service's dependencies.
    pub fn dependency(mut self, guards: DependencyGuards) -> Self {
        self.dependencies.push(guards);
        self
    }

    /// The service they guard.
    pub fn service(&self) -> &'static str {
        self.service
    }

    /// How every guard stands now.
    pub fn view(&self) -> GuardsView {
        let now = Instant::now();
        GuardsView {
            service: self.service,
            at_unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64),
            faces: self
                .faces
                .iter()
                .map(|(name, stats)| FaceView {
                    name,
                    deadlines: stats.snapshot(),
                    recent: stats.recent_answers(),
                })
                .collect(),
            queue: self.queue.as_ref().map(|queue| queue.stats()),
            caller_quotas: self
                .caller_quotas
                .as_ref()
                .map_or_else(Vec::new, |quotas| quotas.view()),
            dependencies: self
                .dependencies
                .iter()
                .map(|guards| DependencyView {
                    name: guards.name,
                    breaker: guards.breaker.stats(),
                    bulkhead: guards.bulkhead.stats(),
                    latency_estimate: guards.latency_estimate.snapshot(now),
                    retry: guards.retry.as_ref().map(|retry| RetryView {
                        counts: retry.stats(),
                        balance: retry.balance(),
                    }),
                })
                .collect(),
        }
    }
}

/// The document of `GET /guards.json`.
#[derive(Debug, Clone, Serialize)]
pub struct GuardsView {
    pub service: &'static str,
    /// When the view was taken, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    pub faces: Vec<FaceView>,
    /// `null` where the service queues nothing.
    pub queue: Option<QueueStats>,
    /// Empty where the service keeps its callers to no quota.
    pub caller_quotas: Vec<CallerQuotaView>,
    pub dependencies: Vec<DependencyView>,
}

/// One caller's quota, as it stands.
#[derive(Debug, Clone, Serialize)]
pub struct CallerQuotaView {
    /// The caller's name (a client id; never its key).
    pub name: String,
    pub per_second: u32,
    pub burst: u32,
    /// Requests refused for being over the quota, since the start.
    pub refused: u64,
}

/// One port the service answers on.
#[derive(Debug, Clone, Serialize)]
pub struct FaceView {
    pub name: &'static str,
    pub deadlines: HopStatsSnapshot,
    /// The last answers, newest first, with their ledgers.
    pub recent: Vec<RecentAnswer>,
}

/// The guards of one dependency, as they stand.
#[derive(Debug, Clone, Serialize)]
pub struct DependencyView {
    pub name: &'static str,
    pub breaker: BreakerStats,
    pub bulkhead: BulkheadStats,
    pub latency_estimate: EstimateSnapshot,
    /// `null` where the calls are not retried.
    pub retry: Option<RetryView>,
}

/// A retry policy's counters and what it would allow now.
#[derive(Debug, Clone, Serialize)]
pub struct RetryView {
    pub counts: RetryStatsSnapshot,
    pub balance: RetryBalance,
}
