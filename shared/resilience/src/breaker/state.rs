//! The breaker's state machine, free of I/O so that it can be driven by a paused clock.

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;

use super::BreakerSettings;

/// How one call ended, as far as the dependency's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered in time (an answer like NOT_FOUND counts: the neighbour is alive).
    Success,
    /// Answered, but slower than the slow-call threshold.
    Slow,
    /// UNAVAILABLE, DEADLINE_EXCEEDED, an internal error or no answer at all.
    Failure,
    /// Says nothing about the neighbour's health: RESOURCE_EXHAUSTED (it is alive and asks us to
    /// slow down), our own fail-fast for lack of budget, or our caller giving up.
    Ignored,
}

/// Where the breaker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Position {
    Closed,
    Open,
    HalfOpen,
}

impl Position {
    pub fn as_str(self) -> &'static str {
        match self {
            Position::Closed => "closed",
            Position::Open => "open",
            Position::HalfOpen => "half_open",
        }
    }

    /// The position as the breaker-state gauge shows it: 0 closed, 1 half-open, 2 open.
    pub fn gauge_value(self) -> u64 {
        match self {
            Position::Closed => 0,
            Position::HalfOpen => 1,
            Position::Open => 2,
        }
    }
}

#[derive(Debug)]
enum State {
    Closed { window: VecDeque<Outcome> },
    Open { until: Instant },
    HalfOpen { admitted: u32, succeeded: u32 },
}

/// What an admitted call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Normal,
    Probe,
}

/// A state change, for logs and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: Position,
    pub to: Position,
}

#[derive(Debug)]
pub struct Machine {
    settings: BreakerSettings,
    state: State,
}

impl Machine {
    pub fn new(settings: BreakerSettings) -> Self {
        Self { settings, state: State::Closed { window: VecDeque::new() } }
    }

    pub fn position(&self) -> Position {
        match self.state {
            State::Closed { .. } => Position::Closed,
            State::Open { .. } => Position::Open,
            State::HalfOpen { .. } => Position::HalfOpen,
        }
    }

    /// Admits a call, or says how long until the breaker tries again.
    pub fn admit(&mut self, now: Instant) -> (Result<Admission, Duration>, Option<Transition>) {
        let transition = match self.state {
            State::Open { until } if now < until => return (Err(until - now), None),
            State::Open { .. } => self.move_to(State::HalfOpen { admitted: 0, succeeded: 0 }),
            _ => None,
        };
        let admission = match &mut self.state {
            State::HalfOpen { admitted, .. } if *admitted < self.settings.half_open_probes => {
                *admitted += 1;
                Ok(Admission::Probe)
            }
            // Probes are out; their outcome decides. Nothing else goes through meanwhile.
            State::HalfOpen { .. } => Err(Duration::ZERO),
            // Closed (an open breaker was left for half-open above).
            _ => Ok(Admission::Normal),
        };
        (admission, transition)
    }

    /// Records how an admitted call ended.
    pub fn record(&mut self, admission: Admission, outcome: Outcome, now: Instant) -> Option<Transition> {
        let settings = self.settings;
        match (&mut self.state, admission) {
            (State::Closed { window }, Admission::Normal) => {
                if outcome == Outcome::Ignored {
                    return None;
                }
                window.push_back(outcome);
                if window.len() > settings.window_calls as usize {
                    window.pop_front();
                }
                if window.len() < settings.min_calls as usize {
                    return None;
                }
                let share = |kind: Outcome| window.iter().filter(|o| **o == kind).count() as f64 / window.len() as f64;
                let failing = share(Outcome::Failure) >= settings.failure_rate;
                let slow = share(Outcome::Slow) >= settings.slow_call_rate;
                (failing || slow).then(|| self.open(now)).flatten()
            }
            (State::HalfOpen { admitted, succeeded }, Admission::Probe) => match outcome {
                Outcome::Ignored => {
                    // Frees the probe's place without a verdict.
                    *admitted -= 1;
                    None
                }
                Outcome::Failure | Outcome::Slow => self.open(now),
                Outcome::Success => {
                    *succeeded += 1;
                    if *succeeded >= settings.half_open_probes {
                        self.move_to(State::Closed { window: VecDeque::new() })
                    } else {
                        None
                    }
                }
            },
            // A call admitted in an earlier state ended after the breaker moved on: its verdict
            // belongs to a past the breaker has already judged.
            _ => None,
        }
    }

    fn open(&mut self, now: Instant) -> Option<Transition> {
        let until = now + std::time::Duration::from_millis(self.settings.open_ms);
        self.move_to(State::Open { until })
    }

    fn move_to(&mut self, state: State) -> Option<Transition> {
        let from = self.position();
        self.state = state;
        Some(Transition { from, to: self.position() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            enabled: true,
            window_calls: 10,
            min_calls: 5,
            failure_rate: 0.5,
            slow_call_ms: 1_000,
            slow_call_rate: 0.8,
            open_ms: 5_000,
            half_open_probes: 2,
        }
    }

    fn call(machine: &mut Machine, outcome: Outcome, now: Instant) -> Option<Transition> {
        let (admission, _) = machine.admit(now);
        machine.record(admission.expect("admitted"), outcome, now)
    }

    #[tokio::test(start_paused = true)]
    async fn opens_at_the_failure_rate_once_enough_calls_are_seen() {
        let mut machine = Machine::new(settings());
        let now = Instant::now();
        for _ in 0..4 {
            assert_eq!(call(&mut machine, Outcome::Failure, now), None, "fewer than min_calls never open it");
        }
        let opened = call(&mut machine, Outcome::Failure, now);
        assert_eq!(opened, Some(Transition { from: Position::Closed, to: Position::Open }));
        assert_eq!(machine.admit(now).0, Err(Duration::from_millis(5_000)));
    }

    #[tokio::test(start_paused = true)]
    async fn stays_closed_below_the_rate_and_ignores_what_says_nothing_about_health() {
        let mut machine = Machine::new(settings());
        let now = Instant::now();
        for outcome in [Outcome::Success, Outcome::Failure, Outcome::Success, Outcome::Failure, Outcome::Success, Outcome::Success] {
            assert_eq!(call(&mut machine, outcome, now), None);
        }
        for _ in 0..100 {
            assert_eq!(call(&mut machine, Outcome::Ignored, now), None, "RESOURCE_EXHAUSTED never opens it");
        }
        assert_eq!(machine.position(), Position::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_open_it_too() {
        let mut machine = Machine::new(settings());
        let now = Instant::now();
        for _ in 0..4 {
            call(&mut machine, Outcome::Slow, now);
        }
        assert_eq!(call(&mut machine, Outcome::Slow, now).map(|t| t.to), Some(Position::Open));
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_lets_a_few_probes_through_and_closes_when_they_succeed() {
        let mut machine = Machine::new(settings());
        let start = Instant::now();
        for _ in 0..5 {
            call(&mut machine, Outcome::Failure, start);
        }
        let later = start + Duration::from_millis(5_000);
        let (first, moved) = machine.admit(later);
        assert_eq!((first, moved.map(|t| t.to)), (Ok(Admission::Probe), Some(Position::HalfOpen)));
        let (second, _) = machine.admit(later);
        assert_eq!(second, Ok(Admission::Probe));
        assert_eq!(machine.admit(later).0, Err(Duration::ZERO), "only two probes at a time");
        assert_eq!(machine.record(Admission::Probe, Outcome::Success, later), None);
        let closed = machine.record(Admission::Probe, Outcome::Success, later);
        assert_eq!(closed, Some(Transition { from: Position::HalfOpen, to: Position::Closed }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_probe_opens_it_again() {
        let mut machine = Machine::new(settings());
        let start = Instant::now();
        for _ in 0..5 {
            call(&mut machine, Outcome::Failure, start);
        }
        let later = start + Duration::from_millis(5_000);
        let (probe, _) = machine.admit(later);
        let reopened = machine.record(probe.unwrap(), Outcome::Failure, later);
        assert_eq!(reopened, Some(Transition { from: Position::HalfOpen, to: Position::Open }));
        assert_eq!(machine.admit(later).0, Err(Duration::from_millis(5_000)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_ignored_probe_frees_its_place() {
        let mut machine = Machine::new(BreakerSettings { half_open_probes: 1, ..settings() });
        let start = Instant::now();
        for _ in 0..5 {
            call(&mut machine, Outcome::Failure, start);
        }
        let later = start + Duration::from_millis(5_000);
        let (probe, _) = machine.admit(later);
        assert_eq!(machine.admit(later).0, Err(Duration::ZERO));
        machine.record(probe.unwrap(), Outcome::Ignored, later);
        assert_eq!(machine.admit(later).0, Ok(Admission::Probe));
    }
}
