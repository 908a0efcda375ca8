use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

/// How long an attempt of one operation usually takes: an exponentially weighted moving average
/// of observed attempts, so a retry is only started when the deadline can hold one more.
#[derive(Debug)]
pub(crate) struct AttemptTime {
    micros: AtomicU64,
}

/// Weight of the newest observation.
const ALPHA: f64 = 0.2;

impl AttemptTime {
    pub(crate) fn new(initial: Duration) -> Self {
        Self {
            micros: AtomicU64::new(initial.as_micros() as u64),
        }
    }

    pub(crate) fn expected(&self) -> Duration {
        Duration::from_micros(self.micros.load(Ordering::Relaxed))
    }

    pub(crate) fn observe(&self, took: Duration) {
        let took = took.as_micros() as f64;
        // A lost update under contention only skips one sample of a moving average.
        let _ = self
            .micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
                Some((current as f64 * (1.0 - ALPHA) + took * ALPHA) as u64)
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_moves_toward_what_is_observed() {
        let time = AttemptTime::new(Duration::from_millis(100));
        for _ in 0..50 {
            time.observe(Duration::from_millis(20));
        }
        let expected = time.expected();
        assert!(
            expected > Duration::from_millis(19) && expected < Duration::from_millis(21),
            "{expected:?}"
        );
    }
}
