//! The breaker's state machine, free of I/O so that it can be driven by a paused clock.

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;
use tower::util::rng::Rng;

use super::BreakerSettings;

/// How far an open time is spread around its nominal length, either way: replicas whose breakers
/// opened together probe at different times instead of in lockstep.
const OPEN_JITTER: f64 = 0.2;

/// How one call ended, as far as the dependency's health is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered in time (an answer like NOT_FOUND counts: the neighbour is alive).
    Success,
    /// Answered, but slower than the slow-call threshold; or expired after a slice too short to
    /// judge, yet later than that threshold.
    Slow,
    /// UNAVAILABLE, an internal error, no answer at all, or DEADLINE_EXCEEDED after a slice long
    /// enough to judge (or an unnamed one).
    Failure,
    /// Says nothing about the neighbour's health: RESOURCE_EXHAUSTED (it is alive and asks us to
    /// slow down), our own fail-fast for lack of budget, an expiry of a slice too short to judge,
    /// or our caller giving up.
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
    /// The recorded outcomes, oldest first, each with the time it was recorded.
    Closed {
        window: VecDeque<(Instant, Outcome)>,
    },
    Open {
        until: Instant,
    },
    HalfOpen {
        admitted: u32,
        succeeded: u32,
    },
}

/// A breaker's state at one moment, as its live view shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Standing {
    /// Outcomes in the window (closed only) and the shares of failures and of slow calls.
    pub calls: u32,
    pub failure_rate: f64,
    pub slow_call_rate: f64,
    /// While open: how long until probes go through.
    pub probes_in: Option<Duration>,
}

/// An admitted call: the state it was admitted in, so that its outcome is recorded only there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Admission {
    generation: u64,
}

/// A state change, for logs and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Transition {
    pub from: Position,
    pub to: Position,
}

#[derive(Debug)]
pub(super) struct Machine<R> {
    settings: BreakerSettings,
    state: State,
    /// Counts state changes: a call admitted under another generation belongs to a past state.
    generation: u64,
    /// Draws the jitter of open times.
    rng: R,
}

impl<R: Rng> Machine<R> {
    pub(super) fn new(settings: BreakerSettings, rng: R) -> Self {
        Self {
            settings,
            state: State::Closed {
                window: VecDeque::new(),
            },
            generation: 0,
            rng,
        }
    }

    pub(super) fn position(&self) -> Position {
        match self.state {
            State::Closed { .. } => Position::Closed,
            State::Open { .. } => Position::Open,
            State::HalfOpen { .. } => Position::HalfOpen,
        }
    }

    /// The window's make-up at `now` while closed, or the time left open.
    pub(super) fn standing(&self, now: Instant) -> Standing {
        match &self.state {
            State::Closed { window } => {
                window_standing(window, now, Duration::from_millis(self.settings.window_ms))
            }
            State::Open { until } => Standing {
                probes_in: Some(until.saturating_duration_since(now)),
                ..Standing::default()
            },
            State::HalfOpen { .. } => Standing::default(),
        }
    }

    /// Admits a call, or says how long until the breaker tries again.
    pub(super) fn admit(
        &mut self,
        now: Instant,
    ) -> (Result<Admission, Duration>, Option<Transition>) {
        let transition = match self.state {
            State::Open { until } if now < until => return (Err(until - now), None),
            State::Open { .. } => self.move_to(State::HalfOpen {
                admitted: 0,
                succeeded: 0,
            }),
            _ => None,
        };
        let admitted = match &mut self.state {
            State::HalfOpen { admitted, .. } if *admitted < self.settings.half_open_probes => {
                *admitted += 1;
                true
            }
            // Probes are out; their outcome decides. Nothing else goes through meanwhile.
            State::HalfOpen { .. } => false,
            // Closed (an open breaker was left for half-open above).
            _ => true,
        };
        let admission = if admitted {
            Ok(Admission {
                generation: self.generation,
            })
        } else {
            Err(Duration::ZERO)
        };
        (admission, transition)
    }

    /// Records how an admitted call ended.
    pub(super) fn record(
        &mut self,
        admission: Admission,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        // A call admitted before the breaker moved on: its verdict belongs to a past the breaker
        // has already judged (and a probe of an earlier half-open must not free a place now).
        if admission.generation != self.generation {
            return None;
        }
        let settings = self.settings;
        match &mut self.state {
            State::Closed { window } => {
                if outcome == Outcome::Ignored {
                    return None;
                }
                window.push_back((now, outcome));
                if window.len() > settings.window_calls as usize {
                    window.pop_front();
                }
                // Old outcomes leave too: a failure an hour ago says nothing about the neighbour now.
                let max_age = Duration::from_millis(settings.window_ms);
                while window
                    .front()
                    .is_some_and(|(at, _)| now.duration_since(*at) > max_age)
                {
                    window.pop_front();
                }
                if window.len() < settings.min_calls as usize {
                    return None;
                }
                let standing = window_standing(window, now, max_age);
                let failing = standing.failure_rate >= settings.failure_rate;
                let slow = standing.slow_call_rate >= settings.slow_call_rate;
                (failing || slow).then(|| self.open(now)).flatten()
            }
            State::HalfOpen {
                admitted,
                succeeded,
            } => match outcome {
                Outcome::Ignored => {
                    // Frees the probe's place without a verdict.
                    *admitted -= 1;
                    None
                }
                Outcome::Failure | Outcome::Slow => self.open(now),
                Outcome::Success => {
                    *succeeded += 1;
                    if *succeeded >= settings.half_open_probes {
                        self.move_to(State::Closed {
                            window: VecDeque::new(),
                        })
                    } else {
                        None
                    }
                }
            },
            // Nothing is admitted while open: the generation of an admission is never an open one.
            State::Open { .. } => None,
        }
    }

    fn open(&mut self, now: Instant) -> Option<Transition> {
        let until = now + self.open_time();
        self.move_to(State::Open { until })
    }

    /// `open_ms`, spread by ±[`OPEN_JITTER`] at random. The same after a failed probe, however
    /// long the outage: an open time that grew with it would keep a recovered dependency cut off
    /// for as long, and a probe every `open_ms` is no load for a dependency that is down.
    fn open_time(&mut self) -> Duration {
        let spread = 1.0 + OPEN_JITTER * (2.0 * self.rng.next_f64() - 1.0);
        Duration::from_secs_f64(self.settings.open_ms as f64 * spread / 1_000.0)
    }

    fn move_to(&mut self, state: State) -> Option<Transition> {
        let from = self.position();
        self.state = state;
        self.generation += 1;
        Some(Transition {
            from,
            to: self.position(),
        })
    }
}

/// The outcomes of `window` no older than `max_age` at `now`, and their shares.
fn window_standing(
    window: &VecDeque<(Instant, Outcome)>,
    now: Instant,
    max_age: Duration,
) -> Standing {
    let (mut calls, mut failures, mut slow) = (0u32, 0u32, 0u32);
    for (_, outcome) in window
        .iter()
        .filter(|(at, _)| now.duration_since(*at) <= max_age)
    {
        calls += 1;
        failures += u32::from(*outcome == Outcome::Failure);
        slow += u32::from(*outcome == Outcome::Slow);
    }
    let share = |count: u32| {
        if calls == 0 {
            0.0
        } else {
            f64::from(count) / f64::from(calls)
        }
    };
    Standing {
        calls,
        failure_rate: share(failures),
        slow_call_rate: share(slow),
        probes_in: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::util::rng::HasherRng;

    /// A draw fixed by the test: `next_f64` gives `self.0` (in [0, 1)).
    struct Draw(f64);

    impl Rng for Draw {
        fn next_u64(&mut self) -> u64 {
            // The inverse of `Rng::next_f64`, which keeps the top 53 bits.
            ((self.0 * (1u64 << 53) as f64) as u64) << 11
        }
    }

    /// The middle of the jitter: every open time is its nominal length.
    const NO_SPREAD: f64 = 0.5;

    fn settings() -> BreakerSettings {
        BreakerSettings {
            enabled: true,
            window_calls: 10,
            window_ms: 30_000,
            min_calls: 5,
            failure_rate: 0.5,
            slow_call_ms: 1_000,
            min_judged_slice_ms: 1_000,
            slow_call_rate: 0.8,
            open_ms: 5_000,
            half_open_probes: 2,
        }
    }

    fn machine(settings: BreakerSettings) -> Machine<Draw> {
        Machine::new(settings, Draw(NO_SPREAD))
    }

    fn call<R: Rng>(
        machine: &mut Machine<R>,
        outcome: Outcome,
        now: Instant,
    ) -> Option<Transition> {
        let (admission, _) = machine.admit(now);
        machine.record(admission.expect("admitted"), outcome, now)
    }

    /// Opens `machine` with failures at `now`.
    fn open<R: Rng>(machine: &mut Machine<R>, now: Instant) {
        while machine.position() == Position::Closed {
            call(machine, Outcome::Failure, now);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn its_standing_shows_the_window_while_closed_and_the_wait_while_open() {
        let mut machine = machine(settings());
        let start = Instant::now();
        call(&mut machine, Outcome::Slow, start);
        call(
            &mut machine,
            Outcome::Failure,
            start + Duration::from_secs(20),
        );
        for _ in 0..2 {
            call(
                &mut machine,
                Outcome::Success,
                start + Duration::from_secs(20),
            );
        }
        let now = start + Duration::from_secs(31);
        let standing = Standing {
            calls: 3,
            failure_rate: 1.0 / 3.0,
            slow_call_rate: 0.0,
            probes_in: None,
        };
        assert_eq!(
            machine.standing(now),
            standing,
            "the slow call has left the 30 s window"
        );

        open(&mut machine, now);
        let later = now + Duration::from_millis(1_500);
        assert_eq!(
            machine.standing(later),
            Standing {
                probes_in: Some(Duration::from_millis(3_500)),
                ..Standing::default()
            }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn opens_at_the_failure_rate_once_enough_calls_are_seen() {
        let mut machine = machine(settings());
        let now = Instant::now();
        for _ in 0..4 {
            assert_eq!(
                call(&mut machine, Outcome::Failure, now),
                None,
                "fewer than min_calls never open it"
            );
        }
        let opened = call(&mut machine, Outcome::Failure, now);
        assert_eq!(
            opened,
            Some(Transition {
                from: Position::Closed,
                to: Position::Open
            })
        );
        assert_eq!(machine.admit(now).0, Err(Duration::from_millis(5_000)));
    }

    #[tokio::test(start_paused = true)]
    async fn stays_closed_below_the_rate_and_ignores_what_says_nothing_about_health() {
        let mut machine = machine(settings());
        let now = Instant::now();
        for outcome in [
            Outcome::Success,
            Outcome::Failure,
            Outcome::Success,
            Outcome::Failure,
            Outcome::Success,
            Outcome::Success,
        ] {
            assert_eq!(call(&mut machine, outcome, now), None);
        }
        for _ in 0..100 {
            assert_eq!(
                call(&mut machine, Outcome::Ignored, now),
                None,
                "RESOURCE_EXHAUSTED never opens it"
            );
        }
        assert_eq!(machine.position(), Position::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_calls_open_it_too() {
        let mut machine = machine(settings());
        let now = Instant::now();
        for _ in 0..4 {
            call(&mut machine, Outcome::Slow, now);
        }
        assert_eq!(
            call(&mut machine, Outcome::Slow, now).map(|t| t.to),
            Some(Position::Open)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_older_than_window_ms_leave_the_window() {
        let start = Instant::now();
        let four_failures = || {
            let mut machine = machine(settings());
            for _ in 0..4 {
                call(&mut machine, Outcome::Failure, start);
            }
            machine
        };
        // 30 s later the four still count (not older than the window): a fifth failure opens it.
        let mut recent = four_failures();
        let at_the_edge = start + Duration::from_millis(30_000);
        assert_eq!(
            call(&mut recent, Outcome::Failure, at_the_edge).map(|t| t.to),
            Some(Position::Open)
        );

        // A millisecond later they have left: a fifth failure is alone, below min_calls.
        let mut aged = four_failures();
        let past = start + Duration::from_millis(30_001);
        for _ in 0..4 {
            assert_eq!(
                call(&mut aged, Outcome::Failure, past),
                None,
                "only the recent failures count"
            );
        }
        assert_eq!(
            call(&mut aged, Outcome::Failure, past).map(|t| t.to),
            Some(Position::Open)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_lets_a_few_probes_through_and_closes_when_they_succeed() {
        let mut machine = machine(settings());
        let start = Instant::now();
        open(&mut machine, start);
        let later = start + Duration::from_millis(5_000);
        let (first, moved) = machine.admit(later);
        assert_eq!(moved.map(|t| t.to), Some(Position::HalfOpen));
        let (second, _) = machine.admit(later);
        assert_eq!(
            machine.admit(later).0,
            Err(Duration::ZERO),
            "only two probes at a time"
        );
        assert_eq!(
            machine.record(first.unwrap(), Outcome::Success, later),
            None
        );
        let closed = machine.record(second.unwrap(), Outcome::Success, later);
        assert_eq!(
            closed,
            Some(Transition {
                from: Position::HalfOpen,
                to: Position::Closed
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_probe_opens_it_again() {
        let mut machine = machine(settings());
        let start = Instant::now();
        open(&mut machine, start);
        let later = start + Duration::from_millis(5_000);
        let (probe, _) = machine.admit(later);
        let reopened = machine.record(probe.unwrap(), Outcome::Failure, later);
        assert_eq!(
            reopened,
            Some(Transition {
                from: Position::HalfOpen,
                to: Position::Open
            })
        );
        assert_eq!(
            machine.admit(later).0,
            Err(Duration::from_millis(5_000)),
            "as long as the first time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_outage_of_any_length_the_next_probe_is_one_open_time_away() {
        let mut machine = machine(settings());
        let mut now = Instant::now();
        open(&mut machine, now);
        // An hour of failed probes, one every open time.
        let outage_ends = now + Duration::from_secs(3_600);
        while now < outage_ends {
            let Err(open_for) = machine.admit(now).0 else {
                panic!("open")
            };
            assert_eq!(
                open_for,
                Duration::from_millis(5_000),
                "never longer for a longer outage"
            );
            now += open_for;
            call(&mut machine, Outcome::Failure, now);
        }
        // The dependency is back: the probe after the open time in progress closes the breaker.
        let Err(open_for) = machine.admit(now).0 else {
            panic!("open")
        };
        now += open_for;
        for _ in 0..2 {
            call(&mut machine, Outcome::Success, now);
        }
        assert_eq!(
            machine.position(),
            Position::Closed,
            "{:?} after the recovery",
            open_for
        );
    }

    #[tokio::test(start_paused = true)]
    async fn open_times_are_spread_by_a_fifth_either_way() {
        fn open_for(rng: impl Rng) -> Duration {
            let mut machine = Machine::new(settings(), rng);
            let now = Instant::now();
            open(&mut machine, now);
            machine.admit(now).0.expect_err("open")
        }
        for (draw, expected_ms) in [
            (0.0, 4_000.0),
            (0.25, 4_500.0),
            (0.75, 5_500.0),
            (1.0 - f64::EPSILON, 6_000.0),
        ] {
            let millis = open_for(Draw(draw)).as_secs_f64() * 1_000.0;
            assert!(
                (millis - expected_ms).abs() < 0.001,
                "draw {draw}: {millis} ms, not {expected_ms}"
            );
        }
        let drawn: Vec<Duration> = (0..50).map(|_| open_for(HasherRng::default())).collect();
        assert!(
            drawn
                .iter()
                .all(|d| (Duration::from_millis(4_000)..Duration::from_millis(6_000)).contains(d)),
            "{drawn:?}"
        );
        let (shortest, longest) = (drawn.iter().min().unwrap(), drawn.iter().max().unwrap());
        assert!(
            longest.saturating_sub(*shortest) > Duration::from_millis(500),
            "breakers opened together part: {drawn:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_admitted_before_a_state_change_is_not_recorded_after_it() {
        let mut machine = machine(settings());
        let start = Instant::now();
        let (before, _) = machine.admit(start);
        open(&mut machine, start);
        let later = start + Duration::from_millis(5_000);
        for _ in 0..2 {
            call(&mut machine, Outcome::Success, later);
        }
        assert_eq!(
            machine.position(),
            Position::Closed,
            "opened and closed again while the call was out"
        );

        assert_eq!(
            machine.record(before.unwrap(), Outcome::Failure, later),
            None
        );
        for _ in 0..4 {
            assert_eq!(
                call(&mut machine, Outcome::Failure, later),
                None,
                "four fresh failures are below min_calls: the old one is not in the window"
            );
        }
        assert_eq!(
            call(&mut machine, Outcome::Failure, later).map(|t| t.to),
            Some(Position::Open)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_of_an_earlier_half_open_neither_frees_a_place_nor_closes_it() {
        let mut machine = machine(settings());
        let mut now = Instant::now();
        open(&mut machine, now);
        now += Duration::from_millis(5_000);
        let (failing, _) = machine.admit(now);
        let (late, _) = machine.admit(now);
        machine.record(failing.unwrap(), Outcome::Failure, now);
        now += Duration::from_millis(10_000);
        let (probe, moved) = machine.admit(now);
        assert_eq!(moved.map(|t| t.to), Some(Position::HalfOpen));
        assert!(
            machine.admit(now).0.is_ok(),
            "the second probe of this half-open"
        );

        assert_eq!(machine.record(late.unwrap(), Outcome::Ignored, now), None);
        assert_eq!(
            machine.admit(now).0,
            Err(Duration::ZERO),
            "the late probe did not free a place of this half-open"
        );
        assert_eq!(machine.record(late.unwrap(), Outcome::Success, now), None);
        assert_eq!(
            machine.record(probe.unwrap(), Outcome::Success, now),
            None,
            "one success of this half-open is not two"
        );
        assert_eq!(machine.position(), Position::HalfOpen);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ignored_probe_frees_its_place() {
        let mut machine = machine(BreakerSettings {
            half_open_probes: 1,
            ..settings()
        });
        let start = Instant::now();
        open(&mut machine, start);
        let later = start + Duration::from_millis(5_000);
        let (probe, _) = machine.admit(later);
        assert_eq!(machine.admit(later).0, Err(Duration::ZERO));
        machine.record(probe.unwrap(), Outcome::Ignored, later);
        assert!(machine.admit(later).0.is_ok(), "another probe goes through");
    }
}
