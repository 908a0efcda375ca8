//! What the sender counts, through the process's global meter (no-ops where none is installed).

use telemetry::metrics::{Counter, Histogram, KeyValue};

/// Names of the sender's instruments, in one place so that dashboards and tests agree.
pub mod name {
    /// Attempts recorded, by `outcome`: `delivered`, `retrying` (it failed and will be tried
    /// again), `undelivered` (it failed and the schedule is spent), `gone` (410).
    pub const DELIVERIES: &str = "webhook.deliveries";
    /// Time from starting an attempt to its answer, or to its failure (ms).
    pub const ATTEMPT_DURATION: &str = "webhook.attempt.duration";
    /// Endpoints this sender disabled (410, or failing for too long).
    pub const ENDPOINTS_DISABLED: &str = "webhook.endpoints.disabled";
    /// Attempts recorded after their lease had run out and another sender took the delivery.
    pub const LEASES_LOST: &str = "webhook.leases.lost";
}

/// The sender's instruments, made once and shared.
#[derive(Debug, Clone)]
pub struct SenderMetrics {
    deliveries: Counter<u64>,
    attempt_duration: Histogram<f64>,
    endpoints_disabled: Counter<u64>,
    leases_lost: Counter<u64>,
}

impl SenderMetrics {
    pub fn new() -> Self {
        use telemetry::metrics::{counter, millisecond_histogram};
        Self {
            deliveries: counter(name::DELIVERIES, "Delivery attempts recorded, by outcome"),
            attempt_duration: millisecond_histogram(
                name::ATTEMPT_DURATION,
                "Time a delivery attempt took",
            ),
            endpoints_disabled: counter(
                name::ENDPOINTS_DISABLED,
                "Endpoints disabled for answering 410 or failing too long",
            ),
            leases_lost: counter(
                name::LEASES_LOST,
                "Attempts whose lease another sender had taken over",
            ),
        }
    }

    pub fn attempt(&self, outcome: &'static str, duration_ms: i64) {
        self.deliveries.add(1, &[KeyValue::new("outcome", outcome)]);
        self.attempt_duration.record(duration_ms as f64, &[]);
    }

    pub fn endpoint_disabled(&self) {
        self.endpoints_disabled.add(1, &[]);
    }

    pub fn lease_lost(&self) {
        self.leases_lost.add(1, &[]);
    }
}

impl Default for SenderMetrics {
    fn default() -> Self {
        Self::new()
    }
}
