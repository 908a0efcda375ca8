use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use telemetry::metrics::{self, Counter, KeyValue};

/// Why an operation stopped being retried: its last attempt's outcome is what the client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The attempt succeeded.
    Success,
    /// A failure that another attempt would repeat.
    NonRetryable,
    /// The configured number of attempts is used up.
    Attempts,
    /// The retry budget refused: its share of requests and its floor are spent, or the throttle
    /// is closed because most recent attempts failed.
    Budget,
    /// What is left of the deadline cannot hold the wait plus another attempt.
    Deadline,
    /// The server said not to retry, or to wait longer than the deadline allows.
    Pushback,
    /// A circuit breaker on the way is open: a retry would be refused the same way.
    Breaker,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Success => "success",
            StopReason::NonRetryable => "non_retryable",
            StopReason::Attempts => "attempts",
            StopReason::Budget => "budget",
            StopReason::Deadline => "deadline",
            StopReason::Pushback => "pushback",
            StopReason::Breaker => "breaker",
        }
    }
}

/// Counters of one retry policy, kept for reports and counted in the chain's metrics as well.
#[derive(Debug)]
pub struct RetryStats {
    requests: AtomicU64,
    retries: AtomicU64,
    stops: [AtomicU64; 7],
    retried: Counter<u64>,
    stopped: Counter<u64>,
}

/// A copy of [`RetryStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetryStatsSnapshot {
    /// Operations started (first attempts).
    pub requests: u64,
    /// Attempts beyond the first.
    pub retries: u64,
    pub stopped_success: u64,
    pub stopped_non_retryable: u64,
    pub stopped_attempts: u64,
    /// Retries refused by the budget or its throttle.
    pub stopped_budget: u64,
    pub stopped_deadline: u64,
    pub stopped_pushback: u64,
    pub stopped_breaker: u64,
}

impl RetryStatsSnapshot {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            requests: self.requests - earlier.requests,
            retries: self.retries - earlier.retries,
            stopped_success: self.stopped_success - earlier.stopped_success,
            stopped_non_retryable: self.stopped_non_retryable - earlier.stopped_non_retryable,
            stopped_attempts: self.stopped_attempts - earlier.stopped_attempts,
            stopped_budget: self.stopped_budget - earlier.stopped_budget,
            stopped_deadline: self.stopped_deadline - earlier.stopped_deadline,
            stopped_pushback: self.stopped_pushback - earlier.stopped_pushback,
            stopped_breaker: self.stopped_breaker - earlier.stopped_breaker,
        }
    }
}

impl RetryStats {
    pub(crate) fn new() -> Self {
        Self {
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            stops: Default::default(),
            retried: metrics::counter(metrics::name::RETRIES, "Attempts beyond the first"),
            stopped: metrics::counter(
                metrics::name::RETRY_STOPS,
                "Why operations stopped being retried",
            ),
        }
    }

    pub(crate) fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn retry(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
        self.retried.add(1, &[]);
    }

    pub(crate) fn stop(&self, reason: StopReason) {
        self.stops[reason as usize].fetch_add(1, Ordering::Relaxed);
        self.stopped
            .add(1, &[KeyValue::new("reason", reason.as_str())]);
    }

    pub fn snapshot(&self) -> RetryStatsSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let stop = |reason: StopReason| read(&self.stops[reason as usize]);
        RetryStatsSnapshot {
            requests: read(&self.requests),
            retries: read(&self.retries),
            stopped_success: stop(StopReason::Success),
            stopped_non_retryable: stop(StopReason::NonRetryable),
            stopped_attempts: stop(StopReason::Attempts),
            stopped_budget: stop(StopReason::Budget),
            stopped_deadline: stop(StopReason::Deadline),
            stopped_pushback: stop(StopReason::Pushback),
            stopped_breaker: stop(StopReason::Breaker),
        }
    }
}
