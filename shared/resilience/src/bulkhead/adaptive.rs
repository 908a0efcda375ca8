//! The bulkhead's adaptive limit: TCP Vegas' rule applied to calls in flight.
//!
//! Why adapt? A fixed limit is right for one latency only. Little's law ties the calls in flight
//! to throughput × latency: when the dependency starts queueing, its latency grows past its
//! no-load latency, and every call admitted beyond what it serves in parallel only waits in its
//! queue. Vegas reads that queue from latency alone: with `limit` calls in flight and an answer
//! taking `rtt` against a no-load `rtt_noload`, about `limit × (1 − rtt_noload / rtt)` of them
//! are queued. A short queue lets the limit grow; a long one (or a call that ran out of time)
//! shrinks it. Netflix's concurrency-limits library (`VegasLimit`) is the model; the thresholds
//! are its defaults, on the logarithm of the limit so that large limits move in larger steps.
//!
//! The no-load latency is the lowest seen since it was last measured afresh, every
//! `remeasure_ms` (as Envoy's adaptive concurrency filter does): a dependency that became slower
//! for good (a new region, a heavier query) is judged against what it takes now, while a slow
//! spell shorter than that shrinks the limit for as long as it lasts. (`VegasLimit` re-measures
//! after a number of answers instead, which at a small limit comes within seconds: the limit grew
//! back while the dependency was still slow.)

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// The adaptive mode of a bulkhead: the limit moves between `min_limit` and the bulkhead's fixed
/// limit (`max_concurrent`), starting at the latter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdaptiveSettings {
    /// Adapt the limit (`false`: the fixed limit).
    pub enabled: bool,
    /// The lowest limit: a dependency is never cut below this many calls in flight.
    pub min_limit: u32,
    /// The no-load latency is measured afresh this often.
    pub remeasure_ms: u64,
}

impl Default for AdaptiveSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            min_limit: 2,
            remeasure_ms: 60_000,
        }
    }
}

/// What one call told the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Sample {
    /// From the call's admission to its answer.
    pub rtt: Duration,
    /// Calls in flight when it was admitted, itself included.
    pub in_flight: u32,
    /// It ran out of time or was refused for load: a sign of overload whatever the latency.
    pub dropped: bool,
}

/// Vegas' state for one dependency.
#[derive(Debug, Clone)]
pub(super) struct Vegas {
    settings: AdaptiveSettings,
    max_limit: u32,
    limit: f64,
    rtt_noload: Option<Duration>,
    measured_at: Option<Instant>,
}

impl Vegas {
    pub(super) fn new(settings: AdaptiveSettings, max_limit: u32) -> Self {
        let max_limit = max_limit.max(settings.min_limit).max(1);
        Self {
            settings,
            max_limit,
            limit: f64::from(max_limit),
            rtt_noload: None,
            measured_at: None,
        }
    }

    pub(super) fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// Takes in one answer, given at `now`, and returns the new limit.
    pub(super) fn on_sample(&mut self, now: Instant, sample: Sample) -> u32 {
        let remeasure = Duration::from_millis(self.settings.remeasure_ms);
        if self.measured_at.is_none_or(|at| now >= at + remeasure) {
            self.measured_at = Some(now);
            self.rtt_noload = None;
        }
        let rtt_noload = match self.rtt_noload {
            Some(noload) if sample.rtt >= noload => noload,
            _ => {
                self.rtt_noload = Some(sample.rtt);
                return self.limit();
            }
        };
        let limit = self.limit;
        let log = limit.log10().max(1.0);
        let new_limit = if sample.dropped {
            limit - log
        } else if f64::from(sample.in_flight) * 2.0 < limit {
            // Too few calls to tell: the limit is not what holds them back.
            return self.limit();
        } else {
            let queued = (limit
                * (1.0 - rtt_noload.as_secs_f64() / sample.rtt.as_secs_f64().max(1e-9)))
            .ceil();
            let (threshold, alpha, beta) = (log, 3.0 * log, 6.0 * log);
            if queued <= threshold {
                limit + beta
            } else if queued < alpha {
                limit + log
            } else if queued > beta {
                limit - log
            } else {
                return self.limit();
            }
        };
        self.limit = new_limit.clamp(
            f64::from(self.settings.min_limit.max(1)),
            f64::from(self.max_limit),
        );
        self.limit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn vegas(max: u32) -> Vegas {
        Vegas::new(
            AdaptiveSettings {
                enabled: true,
                min_limit: 2,
                remeasure_ms: 60_000,
            },
            max,
        )
    }

    /// Feeds `count` answers of `rtt`, each with the limit's worth of calls in flight.
    fn answers(vegas: &mut Vegas, count: usize, rtt: Duration) -> u32 {
        for _ in 0..count {
            let in_flight = vegas.limit();
            vegas.on_sample(
                Instant::now(),
                Sample {
                    rtt,
                    in_flight,
                    dropped: false,
                },
            );
        }
        vegas.limit()
    }

    #[test]
    fn a_slower_dependency_shrinks_the_limit_to_its_floor_and_a_recovered_one_grows_it_back() {
        let mut vegas = vegas(50);
        assert_eq!(
            answers(&mut vegas, 20, MS(20)),
            50,
            "at the no-load latency the limit stays at its ceiling"
        );
        let shrunk = answers(&mut vegas, 5, MS(600));
        assert!(shrunk < 50, "{shrunk}");
        // Vegas keeps a few calls queued (3 to 6 at small limits): the limit settles there.
        let settled = answers(&mut vegas, 100, MS(600));
        assert!((2..=6).contains(&settled), "{settled}");
        assert_eq!(
            answers(&mut vegas, 100, MS(20)),
            50,
            "back up to the ceiling"
        );
    }

    #[test]
    fn a_call_that_ran_out_of_time_shrinks_the_limit_whatever_its_latency() {
        let mut vegas = vegas(20);
        answers(&mut vegas, 5, MS(20));
        let limit = vegas.on_sample(
            Instant::now(),
            Sample {
                rtt: MS(20),
                in_flight: 20,
                dropped: true,
            },
        );
        assert_eq!(limit, 18, "20 − log10(20)");
    }

    #[test]
    fn a_lightly_used_limit_does_not_move() {
        let mut vegas = vegas(40);
        answers(&mut vegas, 5, MS(20));
        for _ in 0..50 {
            vegas.on_sample(
                Instant::now(),
                Sample {
                    rtt: MS(600),
                    in_flight: 3,
                    dropped: false,
                },
            );
        }
        assert_eq!(
            vegas.limit(),
            40,
            "3 calls in flight say nothing about a limit of 40"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_no_load_latency_is_measured_afresh_now_and_then() {
        let mut vegas = Vegas::new(
            AdaptiveSettings {
                enabled: true,
                min_limit: 2,
                remeasure_ms: 60_000,
            },
            10,
        );
        answers(&mut vegas, 3, MS(20));
        assert_eq!(vegas.rtt_noload, Some(MS(20)));
        // A slow spell shrinks the limit for as long as it lasts within the minute.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(answers(&mut vegas, 40, MS(200)) <= 6);
        assert_eq!(vegas.rtt_noload, Some(MS(20)));
        // Slower for good: a minute on, it is the new normal, with no queue.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(answers(&mut vegas, 40, MS(200)), 10);
        assert_eq!(vegas.rtt_noload, Some(MS(200)));
    }
}
