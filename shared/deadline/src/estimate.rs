//! What a dependency has been taking: a high quantile of its recent answers' durations, so that
//! a hop does not make a call whose slice is shorter than the dependency needs.
//!
//! Why: a fixed `min_forward_ms` knows nothing of the dependency. When the bank has needed
//! 400 ms for the last minute, a call given 150 ms will almost surely run out; making it holds a
//! bank worker and a connection for an answer nobody will read. Refusing it at once answers the
//! client sooner, and the bank's capacity goes to calls that can still succeed.
//!
//! The estimate is the `quantile` of the durations recorded in the last full window
//! (`window_ms`), read from a pair of histograms that swap each window (tower's hedge keeps its
//! latency the same way). Its guard rails:
//! - **warm-up**: no estimate (so no refusal) until a window has held `min_samples` answers; a
//!   window with fewer keeps the previous estimate, and one with none (an idle dependency) drops
//!   it;
//! - **bounds**: the estimate used is at most `max_ms`, so a slow minute cannot shut a dependency
//!   off for calls with a generous slice, and `min_forward_ms` stays the floor;
//! - **probes**: one call per `probe_interval_ms` is made whatever the estimate, so that the
//!   estimate learns when the dependency has recovered;
//! - **censored answers**: a call that ran out of its slice has taken at least its slice, and is
//!   recorded as that.

use std::{
    sync::{
        Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::millis;

/// How the latency estimate of one dependency is kept and used.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimateSettings {
    /// Refuse calls whose slice is below the estimate (`false`: estimate only, for the view).
    pub fail_fast: bool,
    /// The quantile of recent durations taken as "what the dependency needs".
    pub quantile: f64,
    /// Length of the window whose answers make the estimate.
    pub window_ms: u64,
    /// Answers a window needs before its quantile replaces the estimate.
    pub min_samples: u64,
    /// The largest estimate used: a call with at least this slice is always made.
    pub max_ms: u64,
    /// One call per this interval is made whatever the estimate.
    pub probe_interval_ms: u64,
}

impl Default for EstimateSettings {
    fn default() -> Self {
        Self {
            fail_fast: true,
            quantile: 0.9,
            window_ms: 1_000,
            min_samples: 10,
            max_ms: 1_000,
            probe_interval_ms: 100,
        }
    }
}

/// The call would get less than the dependency has been taking: it is not made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{hop}: {dependency} has needed {estimate:.1} ms (p{percentile} of its recent answers), \
     only {available:.1} ms are left for it; not calling"
)]
pub struct SlowerThanSlice {
    pub hop: String,
    pub dependency: String,
    pub estimate: f64,
    pub percentile: f64,
    pub available: f64,
}

/// A copy of an estimate's state.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct EstimateSnapshot {
    /// Whether a call given less than the estimate is refused.
    pub fail_fast: bool,
    /// The estimate in force (after `max_ms`), if warmed up.
    pub estimate_ms: Option<f64>,
    pub quantile: f64,
    /// Answers in the last full window.
    pub samples: u64,
    /// Calls refused because their slice was below the estimate.
    pub refused: u64,
    /// Calls made below the estimate to keep it honest.
    pub probes: u64,
}

/// The latency estimate of one dependency, shared by every clone of its client.
#[derive(Debug)]
pub struct LatencyEstimate {
    settings: EstimateSettings,
    window: Mutex<Window>,
    refused: AtomicU64,
    probes: AtomicU64,
}

/// Two histograms: `read` holds the last full window, `write` the current one.
#[derive(Debug)]
struct Window {
    read: Histogram<u64>,
    write: Histogram<u64>,
    started: Instant,
    estimate: Option<Duration>,
    last_probe: Option<Instant>,
}

/// Durations are recorded in microseconds, from 1 µs to a minute, to two significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid histogram bounds")
}

impl LatencyEstimate {
    pub fn new(settings: EstimateSettings) -> Self {
        let window = Window {
            read: histogram(),
            write: histogram(),
            started: Instant::now(),
            estimate: None,
            last_probe: None,
        };
        Self {
            settings,
            window: Mutex::new(window),
            refused: AtomicU64::new(0),
            probes: AtomicU64::new(0),
        }
    }

    pub fn settings(&self) -> &EstimateSettings {
        &self.settings
    }

    /// Records that a call answered after `took` (or ran out of a slice of `took`).
    pub fn record(&self, now: Instant, took: Duration) {
        let mut window = self.lock(now);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        window.write.saturating_record(micros.max(1));
    }

    /// Whether a call given `slice` at `now` may be made: refused when the slice is below the
    /// estimate, unless it is the window's probe. The error carries the estimate.
    pub fn admit(&self, now: Instant, slice: Duration) -> Result<(), Duration> {
        if !self.settings.fail_fast {
            return Ok(());
        }
        let mut window = self.lock(now);
        let Some(estimate) = window.estimate else {
            return Ok(());
        };
        let estimate = estimate.min(Duration::from_millis(self.settings.max_ms));
        if slice >= estimate {
            return Ok(());
        }
        let probe_due = window.last_probe.is_none_or(|last| {
            now >= last + Duration::from_millis(self.settings.probe_interval_ms)
        });
        if probe_due {
            window.last_probe = Some(now);
            self.probes.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(estimate)
    }

    pub fn snapshot(&self, now: Instant) -> EstimateSnapshot {
        let window = self.lock(now);
        EstimateSnapshot {
            fail_fast: self.settings.fail_fast,
            estimate_ms: window
                .estimate
                .map(|estimate| millis(estimate.min(Duration::from_millis(self.settings.max_ms)))),
            quantile: self.settings.quantile,
            samples: window.read.len(),
            refused: self.refused.load(Ordering::Relaxed),
            probes: self.probes.load(Ordering::Relaxed),
        }
    }

    /// The window, moved on to `now`'s.
    fn lock(&self, now: Instant) -> MutexGuard<'_, Window> {
        // The window holds counts only; a panic elsewhere cannot leave it inconsistent.
        let mut window = self
            .window
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let length = Duration::from_millis(self.settings.window_ms.max(1));
        let elapsed = now.saturating_duration_since(window.started);
        if elapsed >= length {
            let window = &mut *window;
            if elapsed >= 2 * length {
                // Nothing was recorded in the last full window.
                window.read.reset();
            } else {
                std::mem::swap(&mut window.read, &mut window.write);
            }
            window.write.reset();
            window.started = now;
            window.estimate = match window.read.len() {
                0 => None,
                samples if samples < self.settings.min_samples => window.estimate,
                _ => Some(Duration::from_micros(
                    window.read.value_at_quantile(self.settings.quantile),
                )),
            };
        }
        window
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn settings() -> EstimateSettings {
        EstimateSettings {
            window_ms: 1_000,
            min_samples: 10,
            max_ms: 1_000,
            probe_interval_ms: 100,
            ..EstimateSettings::default()
        }
    }

    /// Records `count` answers of `took`, then lets the window end.
    async fn window_of(estimate: &LatencyEstimate, count: u64, took: Duration) {
        for _ in 0..count {
            estimate.record(Instant::now(), took);
        }
        advance(MS(1_000)).await;
    }

    fn estimate_ms(estimate: &LatencyEstimate) -> Option<f64> {
        estimate.snapshot(Instant::now()).estimate_ms
    }

    #[tokio::test(start_paused = true)]
    async fn no_estimate_and_no_refusal_until_a_window_has_enough_answers() {
        let estimate = LatencyEstimate::new(settings());
        window_of(&estimate, 9, MS(400)).await;
        assert_eq!(estimate_ms(&estimate), None, "9 answers are not enough");
        assert_eq!(estimate.admit(Instant::now(), MS(50)), Ok(()));

        window_of(&estimate, 10, MS(400)).await;
        assert!((398.0..=402.0).contains(&estimate_ms(&estimate).unwrap()));
    }

    #[tokio::test(start_paused = true)]
    async fn the_estimate_is_the_quantile_of_the_last_full_window() {
        let estimate = LatencyEstimate::new(settings());
        // 80 fast answers and 20 slow ones: the 90th percentile is a slow one.
        for took in std::iter::repeat_n(MS(20), 80).chain(std::iter::repeat_n(MS(300), 20)) {
            estimate.record(Instant::now(), took);
        }
        assert_eq!(
            estimate_ms(&estimate),
            None,
            "the current window does not count yet"
        );
        advance(MS(1_000)).await;
        let p90 = estimate_ms(&estimate).unwrap();
        assert!((298.0..=302.0).contains(&p90), "{p90}");

        // The dependency gets fast again: the next window replaces the estimate.
        window_of(&estimate, 50, MS(20)).await;
        let p90 = estimate_ms(&estimate).unwrap();
        assert!((19.8..=20.2).contains(&p90), "{p90}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slice_below_the_estimate_is_refused_except_one_probe_per_interval() {
        let estimate = LatencyEstimate::new(settings());
        window_of(&estimate, 20, MS(400)).await;
        let now = Instant::now();
        assert_eq!(
            estimate.admit(now, MS(450)),
            Ok(()),
            "a slice above the estimate"
        );
        assert_eq!(
            estimate.admit(now, MS(150)),
            Ok(()),
            "the first slice below it is the probe"
        );
        let refused = estimate.admit(now, MS(150)).unwrap_err();
        assert!((MS(398)..=MS(402)).contains(&refused));
        advance(MS(99)).await;
        assert!(
            estimate.admit(Instant::now(), MS(150)).is_err(),
            "within the probe interval"
        );
        advance(MS(1)).await;
        assert_eq!(
            estimate.admit(Instant::now(), MS(150)),
            Ok(()),
            "the next probe"
        );
        let snapshot = estimate.snapshot(Instant::now());
        assert_eq!(
            (snapshot.refused, snapshot.probes, snapshot.samples),
            (2, 2, 20)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_window_cannot_raise_the_bar_above_the_bound() {
        let estimate = LatencyEstimate::new(EstimateSettings {
            max_ms: 500,
            ..settings()
        });
        window_of(&estimate, 20, MS(5_000)).await;
        assert_eq!(estimate_ms(&estimate), Some(500.0));
        let now = Instant::now();
        assert_eq!(
            estimate.admit(now, MS(500)),
            Ok(()),
            "a slice of the bound is always given its chance"
        );
        estimate.admit(now, MS(10)).expect("probe");
        assert_eq!(estimate.admit(now, MS(499)), Err(MS(500)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_thin_window_keeps_the_estimate_and_an_empty_one_drops_it() {
        let estimate = LatencyEstimate::new(settings());
        window_of(&estimate, 20, MS(400)).await;
        // Only probes got through: too few to replace the estimate, which stays.
        window_of(&estimate, 3, MS(20)).await;
        assert!(estimate_ms(&estimate).unwrap() > 390.0);
        // Then nothing at all for two windows: an idle dependency starts afresh.
        advance(MS(2_000)).await;
        assert_eq!(estimate_ms(&estimate), None);
        assert_eq!(estimate.admit(Instant::now(), MS(50)), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn turned_off_it_still_estimates_but_never_refuses() {
        let estimate = LatencyEstimate::new(EstimateSettings {
            fail_fast: false,
            ..settings()
        });
        window_of(&estimate, 20, MS(400)).await;
        assert!(estimate_ms(&estimate).is_some());
        for _ in 0..5 {
            assert_eq!(estimate.admit(Instant::now(), MS(10)), Ok(()));
        }
    }
}
