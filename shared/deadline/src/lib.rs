#![doc = include_str!("../README.md")]

mod budget;
pub mod client;
mod estimate;
pub mod grpc_timeout;
mod hop;
pub mod ledger;
pub mod server;
mod slice;

pub use budget::{Forward, ForwardPolicy, InboundPolicy, TooLittleBudget};
pub use estimate::{EstimateSettings, EstimateSnapshot, LatencyEstimate, SlowerThanSlice};
pub use hop::{Hop, HopStats, HopStatsSnapshot, NoHop, RecentAnswer};
pub use slice::Slice;

use std::time::Duration;
use tokio::time::Instant;

/// A point in time after which nobody will read the answer, plus the budget it was made from.
///
/// Stored as an absolute instant so that "remaining" is always computed from the clock, never
/// decremented by hand (time spent in queues and awaits is counted whether or not code notices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    started_at: Instant,
    expires_at: Instant,
}

impl Deadline {
    /// A deadline `budget` from `now`.
    pub fn after(now: Instant, budget: Duration) -> Self {
        Self {
            started_at: now,
            expires_at: now + budget,
        }
    }

    /// The budget this deadline was created with.
    pub fn budget(&self) -> Duration {
        self.expires_at - self.started_at
    }

    pub fn started_at(&self) -> Instant {
        self.started_at
    }

    pub fn expires_at(&self) -> Instant {
        self.expires_at
    }

    /// What is left at `now`; zero once expired.
    pub fn remaining_at(&self, now: Instant) -> Duration {
        self.expires_at.saturating_duration_since(now)
    }

    pub fn remaining(&self) -> Duration {
        self.remaining_at(Instant::now())
    }

    pub fn elapsed_at(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started_at)
    }

    pub fn is_expired_at(&self, now: Instant) -> bool {
        now >= self.expires_at
    }
}

/// Milliseconds with microsecond precision, the unit of every human-facing budget figure.
pub(crate) fn millis(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1_000.0
}
