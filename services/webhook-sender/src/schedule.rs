//! When a failed delivery is tried again.
//!
//! Why a fixed schedule and not exponential backoff? Recipients fail for minutes (a deploy) or for
//! hours (an outage); a schedule that spreads about a day over a few attempts (Svix's: immediately,
//! 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h) covers both without hammering anyone, and the owner
//! can read it. Jitter keeps the deliveries that failed together from coming back together.

use std::time::Duration;

use rand::Rng;

/// The delays of one round of attempts, the first attempt's included.
#[derive(Debug, Clone, PartialEq)]
pub struct RetrySchedule {
    delays: Vec<Duration>,
    jitter: f64,
}

impl RetrySchedule {
    /// `jitter` in [0, 1): each delay is multiplied by a random factor in [1 − jitter, 1 + jitter].
    pub fn new(delays: Vec<Duration>, jitter: f64) -> Self {
        Self { delays, jitter }
    }

    /// The delay before the next attempt, after `failures` failed attempts in this round; `None`
    /// when the schedule is spent.
    pub fn delay_after(&self, failures: i64, rng: &mut impl Rng) -> Option<Duration> {
        let delay = *self.delays.get(usize::try_from(failures).ok()?)?;
        let factor = rng.random_range(1.0 - self.jitter..=1.0 + self.jitter);
        Some(delay.mul_f64(factor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_moves_one_step_along_within_the_jitter() {
        let schedule = RetrySchedule::new(
            vec![
                Duration::ZERO,
                Duration::from_secs(5),
                Duration::from_secs(300),
            ],
            0.1,
        );
        let mut rng = rand::rng();
        for _ in 0..1_000 {
            let after_one = schedule.delay_after(1, &mut rng).expect("second attempt");
            assert!(
                (Duration::from_millis(4_500)..=Duration::from_millis(5_500)).contains(&after_one),
                "{after_one:?}"
            );
            let after_two = schedule.delay_after(2, &mut rng).expect("third attempt");
            assert!(
                (Duration::from_secs(270)..=Duration::from_secs(330)).contains(&after_two),
                "{after_two:?}"
            );
        }
        assert_eq!(
            schedule.delay_after(3, &mut rng),
            None,
            "spent after three attempts"
        );
    }

    #[test]
    fn without_jitter_the_delays_are_exact() {
        let schedule = RetrySchedule::new(vec![Duration::ZERO, Duration::from_secs(5)], 0.0);
        assert_eq!(
            schedule.delay_after(1, &mut rand::rng()),
            Some(Duration::from_secs(5))
        );
    }
}
