//! CoDel's rule for a request queue, as Facebook's Wangle applies it to servers.
//!
//! A queue that fills in a burst and drains again is doing its job; a queue that never drains (a
//! standing queue) only adds delay. CoDel tells them apart by the *least* queueing delay seen over
//! an interval: if even the luckiest request of the last `interval` waited more than `target`,
//! the queue is standing and the server is overloaded. While overloaded, a request that has waited
//! more than twice `target` is shed rather than served; otherwise requests wait up to what their
//! deadline allows.

use std::time::Duration;

use tokio::time::Instant;

/// The overload detector of one queue.
#[derive(Debug, Clone)]
pub(super) struct Codel {
    target: Duration,
    interval: Duration,
    /// The least delay seen in the current interval.
    least: Option<Duration>,
    interval_ends: Instant,
    overloaded: bool,
}

impl Codel {
    pub(super) fn new(now: Instant, target: Duration, interval: Duration) -> Self {
        Self {
            target,
            interval,
            least: None,
            interval_ends: now + interval,
            overloaded: false,
        }
    }

    pub(super) fn overloaded(&self) -> bool {
        self.overloaded
    }

    /// Takes in the queueing delay of a request leaving the queue at `now` (zero for one that
    /// did not wait), and says whether to shed it.
    pub(super) fn shed(&mut self, now: Instant, delay: Duration) -> bool {
        if now >= self.interval_ends {
            // An interval with no request at all leaves nothing queued: not overloaded.
            self.overloaded = self.least.is_some_and(|least| least > self.target);
            self.interval_ends = now + self.interval;
            self.least = None;
        }
        self.least = Some(self.least.map_or(delay, |least| least.min(delay)));
        self.overloaded && delay > 2 * self.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[tokio::test(start_paused = true)]
    async fn a_burst_that_drains_is_not_overload() {
        let start = Instant::now();
        let mut codel = Codel::new(start, MS(5), MS(100));
        // Long waits, but one request in the interval got through at once.
        for delay in [MS(40), MS(0), MS(60)] {
            assert!(!codel.shed(start + MS(50), delay));
        }
        assert!(
            !codel.shed(start + MS(100), MS(60)),
            "the interval's least delay was 0"
        );
        assert!(!codel.overloaded());
    }

    #[tokio::test(start_paused = true)]
    async fn a_standing_queue_sheds_the_requests_that_waited_past_twice_the_target() {
        let start = Instant::now();
        let mut codel = Codel::new(start, MS(5), MS(100));
        for delay in [MS(20), MS(30), MS(25)] {
            assert!(
                !codel.shed(start + MS(50), delay),
                "not yet known to be overloaded"
            );
        }
        // The interval ends: even the luckiest waited 20 ms, above the 5 ms target.
        assert!(codel.shed(start + MS(100), MS(11)));
        assert!(codel.overloaded());
        assert!(
            !codel.shed(start + MS(120), MS(10)),
            "within twice the target it is served"
        );
        // The next interval: the queue drained (a request got in at once), overload ends.
        assert!(!codel.shed(start + MS(150), MS(0)));
        assert!(!codel.shed(start + MS(200), MS(50)));
        assert!(!codel.overloaded());
    }
}
